//! The log kept in PostgreSQL (shared by machines) against the log kept in the environment's
//! own database (the embedded SQLite store), side by side in one run: acts one at a time, and
//! from 8 concurrent tasks through the async trait, each on a view of 1,000 files. The server
//! is the one named by `ENVIRONMENT_TEST_POSTGRES`; without one the PostgreSQL rows are skipped
//! with the reason (under `CI=true` that fails).
//!
//! `cargo bench -p environment-benches --bench log_stores`
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use environment_core::{
    ActRequest, ActorId, Environment, Intent, Key, LocalEnvironment, Options, Value,
};
use environment_postgres::{PgEffectStore, PgLogStore, PgStoreConfig};

fn actor() -> ActorId {
    ActorId::new("agent:bench").unwrap()
}

fn rows(c: &mut Criterion, name: &str, env: &LocalEnvironment) {
    let mut populate = ActRequest::new(actor(), Intent::edit("populate"));
    for i in 0..1000 {
        populate = populate.put(
            Key::fs(format!("src/d{}/f{i}.rs", i % 40)).unwrap(),
            Value::file(format!("{i:032x}")),
        );
    }
    env.act_blocking(populate).unwrap();
    let mut g = c.benchmark_group("log");
    g.throughput(Throughput::Elements(1));
    let key = Key::fs("src/small.rs").unwrap();
    let n = AtomicU64::new(0);
    g.bench_function(format!("act one at a time, {name}"), |b| {
        b.iter(|| {
            env.act_blocking(environment_benches::edit(
                &key,
                n.fetch_add(1, Ordering::Relaxed),
            ))
            .unwrap()
        })
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let shared: Arc<dyn Environment> = Arc::new(env.clone());
    g.bench_function(format!("act from 8 tasks, {name}"), |b| {
        b.iter_custom(|iters| environment_benches::act_from_8_tasks(&rt, &shared, iters))
    });
    g.finish();
}

fn log_stores(c: &mut Criterion) {
    let home = tempfile::tempdir().unwrap();
    let embedded = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    rows(c, "embedded", &embedded);
    let Some(server) = environment_benches::postgres_schema("bench_log") else {
        return;
    };
    let config = PgStoreConfig::default();
    let home = tempfile::tempdir().unwrap();
    let options = Options {
        log_store: Some(PgLogStore::opener_on(server.clone(), &config)),
        effects: Some(Arc::new(PgEffectStore::open(server, config).unwrap())),
        ..Options::default()
    };
    let shared = LocalEnvironment::open(home.path(), options).unwrap();
    rows(c, "postgres", &shared);
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(std::time::Duration::from_secs(3)).warm_up_time(std::time::Duration::from_secs(1));
    targets = log_stores
}
criterion_main!(benches);
