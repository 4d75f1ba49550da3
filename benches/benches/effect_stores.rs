//! The effect log kept in PostgreSQL (shared by machines) against the log kept in the
//! environment's own database, side by side in one run: an effect begun and completed (two
//! durable writes, each decided on the state it read), and a retry that finds it done. The
//! server is the one named by `ENVIRONMENT_TEST_POSTGRES`; without one the PostgreSQL rows
//! are skipped with the reason (under `CI=true` that fails).
//!
//! `cargo bench -p environment-benches --bench effect_stores`
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use environment_core::{ActorId, BeginOutcome, LocalEnvironment, Options};
use environment_postgres::{PgEffectStore, PgStoreConfig};

fn rows(c: &mut Criterion, name: &str, env: &LocalEnvironment) {
    let agent = ActorId::new("agent:deployer").unwrap();
    let mut g = c.benchmark_group("effect log");
    let mut n = 0u64;
    g.bench_function(format!("begin and complete, {name}"), |b| {
        b.iter(|| {
            n += 1;
            let key = format!("deploy-{name}-{n}");
            let BeginOutcome::New(r) = env.effect_begin(&agent, &key, "deploy", b"v").unwrap()
            else {
                panic!("a new key")
            };
            env.effect_complete(&agent, r.id, b"ok").unwrap();
        })
    });
    let key = format!("deploy-{name}-done");
    if let BeginOutcome::New(r) = env.effect_begin(&agent, &key, "deploy", b"v").unwrap() {
        env.effect_complete(&agent, r.id, b"ok").unwrap();
    }
    g.bench_function(format!("a retry finds it done, {name}"), |b| {
        b.iter(|| {
            let found = env.effect_begin(&agent, &key, "deploy", b"v").unwrap();
            assert!(matches!(found, BeginOutcome::AlreadyDone(_)));
        })
    });
    g.finish();
}

fn effect_stores(c: &mut Criterion) {
    let home = tempfile::tempdir().unwrap();
    let embedded = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    rows(c, "embedded", &embedded);
    let Some(server) = environment_benches::postgres_schema("bench_effects") else {
        return;
    };
    let store = PgEffectStore::open(server, PgStoreConfig::default()).unwrap();
    let home = tempfile::tempdir().unwrap();
    let options = Options {
        effects: Some(Arc::new(store)),
        ..Options::default()
    };
    let shared = LocalEnvironment::open(home.path(), options).unwrap();
    rows(c, "postgres", &shared);
}

criterion_group!(benches, effect_stores);
criterion_main!(benches);
