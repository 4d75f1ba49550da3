//! MCP round trips through a real client (rmcp's), against `envctl mcp` over stdio, no
//! supervisor: `read_file` of a small file, and `write_file` of one (recorded as an operation
//! and written into the tree), each one call and its answer.
//!
//! `cargo bench -p envctl --bench mcp`. `ENVCTL_BENCH_PEER=/path/to/another/envctl` measures a
//! second build (an earlier one) in the same run, side by side.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::json;

const ENVCTL: &str = env!("CARGO_BIN_EXE_envctl");

fn workspace(bin: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "alpha\n").unwrap();
    let out = std::process::Command::new(bin)
        .arg("-C")
        .arg(dir.path())
        .arg("init")
        .env_remove("ENVIRONMENT_DIR")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

fn round_trips(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut builds = vec![("envctl", ENVCTL.to_owned())];
    if let Ok(peer) = std::env::var("ENVCTL_BENCH_PEER") {
        builds.push(("peer envctl", peer));
    }
    let mut g = c.benchmark_group("mcp round trip");
    for (name, bin) in &builds {
        let dir = workspace(bin);
        let client = rt.block_on(common::connect_stdio(bin, dir.path()));
        g.bench_function(format!("read_file, {name}"), |b| {
            b.iter(|| rt.block_on(common::call(&client, "read_file", json!({"path": "a.txt"}))))
        });
        let mut n = 0u64;
        g.bench_function(format!("write_file, {name}"), |b| {
            b.iter(|| {
                n += 1;
                let content = format!("version {n}\n");
                rt.block_on(common::call(
                    &client,
                    "write_file",
                    json!({"path": "notes.txt", "content": content}),
                ))
            })
        });
        rt.block_on(client.cancel()).unwrap();
    }
    g.finish();
}

criterion_group!(benches, round_trips);
criterion_main!(benches);
