//! The supervisor's control socket: a request's round trip (`status`), a recorded `exec` of
//! `true` through the socket, and a self-rollback of one changed file through the socket vs the
//! same rollback asked of the supervisor in-process (the ratio is the socket's cost).
//!
//! `cargo bench -p environment-benches --bench supervisor`
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use environment_core::ActorId;
use environment_sandbox::Unconfined;
use environment_supervisor::ControlClient;
use environment_supervisor::{RollbackMode, Supervisor, SupervisorConfig};

fn open(dir: &Path) -> Supervisor {
    let work = dir.join("work");
    std::fs::create_dir_all(work.join("src")).unwrap();
    for i in 0..100 {
        std::fs::write(work.join(format!("src/f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    let config = SupervisorConfig::new(
        dir.join("home"),
        &work,
        Arc::new(Unconfined::new(&work)),
        ActorId::new("agent:bench").unwrap(),
    );
    Supervisor::open(config).unwrap()
}

fn control(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let sup = open(dir.path());
    let work = dir.path().join("work");
    let mut client = ControlClient::connect(sup.socket_path()).unwrap();
    let start = client.mark("start").unwrap().version;
    let mut g = c.benchmark_group("control");
    g.sample_size(20).measurement_time(Duration::from_secs(3));

    g.bench_function("status round trip", |b| {
        b.iter(|| client.status().unwrap());
    });
    g.bench_function("exec true", |b| {
        b.iter(|| {
            let out = client.exec(&["true"]).unwrap();
            assert!(out.success);
        });
    });

    let mut n = 0u64;
    let mut break_one = || {
        n += 1;
        std::fs::write(work.join("src/f7.txt"), format!("broken {n}\n")).unwrap();
    };
    g.bench_function("self-rollback of 1 file (socket)", |b| {
        b.iter(|| {
            break_one();
            client.restore(&start, false).unwrap();
        });
    });
    let human = ActorId::new("human:bench").unwrap();
    g.bench_function("rollback of 1 file (in-process)", |b| {
        b.iter(|| {
            break_one();
            sup.rollback(&human, &start, RollbackMode::KeepRunning)
                .unwrap();
        });
    });
    g.finish();
    sup.shutdown().unwrap();
}

criterion_group!(benches, control);
criterion_main!(benches);
