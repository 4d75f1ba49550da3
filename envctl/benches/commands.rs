//! envctl's commands without a supervisor, against git on the same tree in one run: `status`
//! after 1 and 1,000 changed files vs `git add -A && git commit` (both record the change), and
//! `log` vs `git log`, also as the first command after the monitor stopped. The workspace
//! monitor runs, as it does after the first command.
//!
//! `cargo bench -p envctl --bench commands` uses `repo-100k-small` from
//! `shared/workloads/gen_tree.py` (100,000 files, no large ones); run once as a test it uses a
//! small tree.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::Path;
use std::process::Command;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use environment_benches::{gen_tree, mutate, small_files};

const ENVCTL: &str = env!("CARGO_BIN_EXE_envctl");

fn run(dir: &Path, program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .env("ENVIRONMENT_MONITOR_IDLE", "3600")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn sh(dir: &Path, script: &str) {
    run(dir, "sh", &["-c", script]);
}

fn commands(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let tree = tmp.path().join("tree");
    gen_tree(&tree);
    let files = small_files(&tree, &[".environment"]);
    run(&tree, ENVCTL, &["init"]);
    // The first command after init finds the monitor init started, with its baseline.
    run(&tree, ENVCTL, &["status"]);
    // git keeps its repository outside the tree, so envctl does not see it.
    let git_dir = tmp.path().join("git");
    let git = format!(
        "git --git-dir={} --work-tree=. -c user.name=bench -c user.email=bench@localhost",
        git_dir.display()
    );
    // git leaves the environment's own home alone, as envctl does.
    sh(
        &tree,
        &format!(
            "git init -q --bare {0} && echo /.environment/ >> {0}/info/exclude && {git} add -A \
             && {git} commit -q -m init",
            git_dir.display()
        ),
    );
    let mut next = 0usize;
    let mut g = c.benchmark_group("without a supervisor");
    g.sample_size(20);
    for n in [1usize, 1000] {
        g.bench_function(format!("envctl status, {n} changed"), |b| {
            b.iter_batched(
                || mutate(&files, n, &mut next),
                |_| run(&tree, ENVCTL, &["status"]),
                BatchSize::PerIteration,
            )
        });
        g.bench_function(format!("git add -A && git commit, {n} changed"), |b| {
            b.iter_batched(
                || mutate(&files, n, &mut next),
                |_| sh(&tree, &format!("{git} add -A && {git} commit -q -m x")),
                BatchSize::PerIteration,
            )
        });
    }
    run(&tree, ENVCTL, &["status"]);
    g.bench_function("envctl log", |b| b.iter(|| run(&tree, ENVCTL, &["log"])));
    // The first command after the monitor stopped (idle) starts a new one, which places its
    // watches (a walk of the tree) while `log` answers from the history alone.
    let socket = tree.join(".environment/run/monitor.sock");
    let stop_monitor = || {
        if let Ok(m) = environment_sandbox::MonitorClient::connect(&socket) {
            m.stop().unwrap();
        }
        while std::os::unix::net::UnixStream::connect(&socket).is_ok() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    };
    g.bench_function("envctl log, first after the monitor stopped", |b| {
        b.iter_batched(
            stop_monitor,
            |_| run(&tree, ENVCTL, &["log"]),
            BatchSize::PerIteration,
        )
    });
    g.bench_function("git log", |b| {
        b.iter(|| sh(&tree, &format!("{git} log --oneline -n 20 >/dev/null")))
    });
    g.finish();
}

criterion_group!(benches, commands);
criterion_main!(benches);
