//! The policy kept in PostgreSQL (shared by machines) against the policy kept in its embedded
//! SQLite file, side by side in one run: a check that spends nothing (the look at the store's
//! generation that keeps every machine's policy current, and the decision), and a check that
//! spends a quota use (the look, the decision, and one compare-and-swap of the counter). The
//! server is the one named by `ENVIRONMENT_TEST_POSTGRES`; without one the PostgreSQL rows are
//! skipped with the reason (under `CI=true` that fails).
//!
//! `cargo bench -p environment-benches --bench policy_stores`
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use environment_core::{AccessRequest, Action, ActorId, Context, Key, ManualClock, Resource};
use environment_policy::Policy;
use environment_postgres::{PgPolicyStore, PgStoreConfig};

const RULES: &str = r#"
[[rule]]
id = "writes-src"
effect = "permit"
principal = "kind:agent"
actions = ["write"]
resource = { path = "src/**" }

[[rule]]
id = "posts"
effect = "permit"
principal = "kind:agent"
actions = ["execute"]
resource = { endpoint = "https://api.example.com/posts" }
quota = { count = 4000000000, window_secs = 31536000 }
"#;

fn ask(action: Action, resource: Resource) -> AccessRequest {
    AccessRequest {
        actor: ActorId::new("agent:bench").unwrap(),
        action,
        resource,
        context: Context::default(),
    }
}

fn rows(c: &mut Criterion, name: &str, policy: &Policy) {
    policy.load_rules(RULES).unwrap();
    let write = ask(Action::Write, Resource::Key(Key::fs("src/a.rs").unwrap()));
    let post = ask(
        Action::Execute,
        Resource::Service("https://api.example.com/posts".into()),
    );
    assert!(policy.check(&post).is_allowed());
    let mut g = c.benchmark_group("policy store");
    g.bench_function(format!("check, nothing spent, {name}"), |b| {
        b.iter(|| black_box(policy.check(black_box(&write)).is_allowed()))
    });
    g.bench_function(format!("check spending a quota use, {name}"), |b| {
        b.iter(|| assert!(policy.check(black_box(&post)).is_allowed()))
    });
    g.finish();
}

fn policy_stores(c: &mut Criterion) {
    let clock = Arc::new(ManualClock::new(1_000_000));
    let dir = tempfile::tempdir().unwrap();
    let embedded = Policy::open(&dir.path().join("policy.db"), clock.clone()).unwrap();
    rows(c, "embedded", &embedded);
    let Some(server) = environment_benches::postgres_schema("bench_policy") else {
        return;
    };
    let store = PgPolicyStore::open(server, PgStoreConfig::default()).unwrap();
    let shared = Policy::with_store(Box::new(store), clock).unwrap();
    rows(c, "postgres", &shared);
}

criterion_group!(benches, policy_stores);
criterion_main!(benches);
