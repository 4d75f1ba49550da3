//! What the benches share: the reference trees of `shared/workloads/gen_tree.py` and the
//! mutations they time. The benches themselves live in `benches/` (and envctl's in its own).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether this is a measured run (`cargo bench`), not the run once as a test.
pub fn bench_mode() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// The cores this machine has (what a parallel peer may use).
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Makes the reference tree `repo-100k-small` at `dir` (100,000 files, no large ones) when
/// measuring, a tree of 2,000 files otherwise.
pub fn gen_tree(dir: &Path) {
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

/// The small files of a tree (not the large `big*` ones), sorted, skipping the directories
/// named in `skip` (a repository, an environment's home).
pub fn small_files(root: &Path, skip: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let name = e.file_name();
            if e.file_type().unwrap().is_dir() {
                if !skip.iter().any(|s| name == *s) {
                    stack.push(e.path());
                }
            } else if !name.to_string_lossy().starts_with("big") {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// Appends a line to `n` files, round robin from `*next`.
pub fn mutate(files: &[PathBuf], n: usize, next: &mut usize) {
    use std::io::Write;
    for _ in 0..n {
        let p = &files[*next % files.len()];
        *next += 7919;
        let mut f = std::fs::OpenOptions::new().append(true).open(p).unwrap();
        writeln!(f, "mutated {next}").unwrap();
    }
}

/// Runs `cmd` to its end and returns whether it exited with 0 and its peak resident memory in
/// KiB (from `wait4`, which std's `wait` does not give).
#[allow(clippy::zombie_processes)] // reaped by `wait4` below
pub fn peak_memory(cmd: &mut Command) -> (bool, i64) {
    let child = cmd.spawn().unwrap();
    let pid = child.id() as i32;
    let mut status = 0;
    #[allow(unsafe_code)]
    // SAFETY: `rusage` is plain data, valid zeroed; `wait4` writes only to the two locals, for
    // the child just spawned, which std has not waited for (it never will: `child` is dropped
    // without a wait).
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::wait4(pid, &mut status, 0, &mut usage), pid);
        usage
    };
    (
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        usage.ru_maxrss,
    )
}

/// The test server (`ENVIRONMENT_TEST_POSTGRES`) with `search_path` set to the schema `name`,
/// made empty, or `None` when no server is named (said on stderr; a failure under
/// `CI=true`).
pub fn postgres_schema(name: &str) -> Option<postgres::Config> {
    let url = environment_conformance::prerequisite::postgres()?;
    let mut server: postgres::Config = url.parse().unwrap();
    server
        .connect(postgres::NoTls)
        .unwrap()
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {name} CASCADE; CREATE SCHEMA {name}"
        ))
        .unwrap();
    server.options(&format!("-c search_path={name}"));
    Some(server)
}

/// One small-file edit by `agent:bench` that writes `n` into `key`.
pub fn edit(key: &environment_core::Key, n: u64) -> environment_core::ActRequest {
    environment_core::ActRequest::new(
        environment_core::ActorId::new("agent:bench").unwrap(),
        environment_core::Intent::edit("edit"),
    )
    .put(
        key.clone(),
        environment_core::Value::file(n.to_le_bytes().to_vec()),
    )
}

/// The time `iters` acts take from 8 tasks acting at once through the async trait, each on a
/// file of its own (what group commit shares transactions between), scaled to `iters`.
pub fn act_from_8_tasks(
    rt: &tokio::runtime::Runtime,
    env: &std::sync::Arc<dyn environment_core::Environment>,
    iters: u64,
) -> std::time::Duration {
    let per_task = iters.div_ceil(8);
    let start = std::time::Instant::now();
    rt.block_on(async {
        let mut tasks = Vec::new();
        for t in 0..8u64 {
            let env = env.clone();
            tasks.push(tokio::spawn(async move {
                let key = environment_core::Key::fs(format!("tasks/t{t}.txt")).unwrap();
                for i in 0..per_task {
                    env.act(edit(&key, i)).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    start
        .elapsed()
        .mul_f64(iters as f64 / (per_task * 8) as f64)
}
