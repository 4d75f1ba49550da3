//! envctl's commands without a supervisor, against git on the same tree in one run: `status`
//! after 1 and 1,000 changed files vs `git add -A && git commit` (both record the change), and
//! `log` vs `git log`. The workspace monitor runs, as it does after the first command.
//!
//! `cargo bench -p envctl --bench commands` uses `repo-100k-small` from
//! `shared/workloads/gen_tree.py` (100,000 files, no large ones); run once as a test it uses a
//! small tree.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::{Path, PathBuf};
use std::process::Command;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

const ENVCTL: &str = env!("CARGO_BIN_EXE_envctl");

fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn gen_tree(dir: &Path) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/workloads/gen_tree.py");
    let mut cmd = Command::new("python3");
    cmd.arg(&script).arg("make").arg(dir).args(["--large", ""]);
    if !bench_mode() {
        cmd.args(["--files", "2000", "--dirs", "150"]);
    }
    let out = cmd.output().expect("python3 runs gen_tree.py");
    assert!(
        out.status.success(),
        "gen_tree.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn files_of(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let name = e.file_name();
            if e.file_type().unwrap().is_dir() {
                if name != ".environment" {
                    stack.push(e.path());
                }
            } else if name != ".environment" {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Appends a line to `n` files, round robin from `*next`.
fn mutate(files: &[PathBuf], n: usize, next: &mut usize) {
    use std::io::Write;
    for _ in 0..n {
        let p = &files[*next % files.len()];
        *next += 7919;
        let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
        writeln!(f, "mutated {next}").unwrap();
    }
}

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
    let files = files_of(&tree);
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
    g.bench_function("git log", |b| {
        b.iter(|| sh(&tree, &format!("{git} log --oneline -n 20 >/dev/null")))
    });
    g.finish();
}

criterion_group!(benches, commands);
criterion_main!(benches);
