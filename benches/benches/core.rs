//! environment-core: act throughput (sequential and 8 concurrent tasks), commit cost in views of
//! 1,000 and 100,000 keys, diff cost by size of difference, and reads at old versions.
//!
//! `cargo bench -p environment-benches --bench core`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use environment_core::{
    ActRequest, ActorId, Environment, Intent, Key, LocalEnvironment, OpId, Options, Value,
};

/// A path shaped like the reference workspace: up to 8 levels, ~14 files per directory.
fn path(i: usize) -> String {
    let dir = i / 14;
    let mut p = String::new();
    let mut d = dir;
    let depth = 1 + dir % 7;
    for level in 0..depth {
        p.push_str(&format!("d{}/", d % (8 + level)));
        d /= 8 + level;
    }
    format!("{p}dir{dir}/file{i}.rs")
}

fn actor() -> ActorId {
    ActorId::new("agent:bench").unwrap()
}

/// An environment whose main head holds `n` keys.
fn populated(n: usize) -> (tempfile::TempDir, LocalEnvironment, OpId) {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let mut r = ActRequest::new(actor(), Intent::edit("populate"));
    for i in 0..n {
        r = r.put(Key::fs(path(i)).unwrap(), Value::file(format!("{i:032x}")));
    }
    let v = env.act_blocking(r).unwrap().version;
    (home, env, v)
}

fn act_one(env: &LocalEnvironment, key: &Key, n: u64) -> OpId {
    env.act_blocking(environment_benches::edit(key, n))
        .unwrap()
        .version
}

fn bench_act(c: &mut Criterion) {
    let mut g = c.benchmark_group("act");
    g.throughput(Throughput::Elements(1));
    let (_h, env, _) = populated(1000);
    let key = Key::fs("src/small.rs").unwrap();
    let n = AtomicU64::new(0);
    g.bench_function("sequential small file", |b| {
        b.iter(|| act_one(&env, &key, n.fetch_add(1, Ordering::Relaxed)))
    });
    // 8 tasks acting at once through the async trait: group commit shares transactions.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .unwrap();
    let shared: Arc<dyn Environment> = Arc::new(env.clone());
    g.bench_function("8 concurrent tasks", |b| {
        b.iter_custom(|iters| environment_benches::act_from_8_tasks(&rt, &shared, iters))
    });
    g.finish();
}

fn bench_commit_by_view_size(c: &mut Criterion) {
    let mut g = c.benchmark_group("commit 1 key");
    for n in [1_000usize, 100_000] {
        let (_h, env, _) = populated(n);
        let key = Key::fs(path(n / 2)).unwrap();
        let i = AtomicU64::new(0);
        g.bench_with_input(BenchmarkId::new("view keys", n), &n, |b, _| {
            b.iter(|| act_one(&env, &key, i.fetch_add(1, Ordering::Relaxed)))
        });
    }
    g.finish();
}

fn bench_diff_and_read(c: &mut Criterion) {
    let n = 100_000;
    let (_h, env, v1) = populated(n);
    let v2 = act_one(&env, &Key::fs(path(4242)).unwrap(), 1);
    let mut r = ActRequest::new(actor(), Intent::edit("1000 changes"));
    for i in 0..1000 {
        r = r.put(Key::fs(path(i * 97)).unwrap(), Value::file("changed"));
    }
    let v3 = env.act_blocking(r).unwrap().version;
    let a = actor();
    assert_eq!(env.diff(&a, &v1, &v2, None).unwrap().len(), 1);
    assert_eq!(env.diff(&a, &v2, &v3, None).unwrap().len(), 1000);
    let mut g = c.benchmark_group("diff 100k-key views");
    g.bench_function("1 key differs", |b| {
        b.iter(|| env.diff(&a, &v1, &v2, None).unwrap())
    });
    g.bench_function("1000 keys differ", |b| {
        b.iter(|| env.diff(&a, &v2, &v3, None).unwrap())
    });
    g.finish();
    let key = Key::fs(path(4242)).unwrap();
    c.bench_function("read at an old version", |b| {
        b.iter(|| env.read(&a, &key, &v1).unwrap().unwrap())
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_secs(1));
    targets = bench_act, bench_commit_by_view_size, bench_diff_and_read
}
criterion_main!(benches);
