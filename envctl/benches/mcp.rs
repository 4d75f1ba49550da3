//! MCP round trips through a real client (rmcp's), against `envctl mcp` over stdio, no
//! supervisor: `read_file` of a small file, and `write_file` of one (recorded as an operation
//! and written into the tree), each one call and its answer.
//!
//! `cargo bench -p envctl --bench mcp`. `ENVCTL_BENCH_PEER=/path/to/another/envctl` measures a
//! second build (an earlier one) in the same run, side by side.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::path::Path;

use criterion::{Criterion, criterion_group, criterion_main};
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{RoleClient, ServiceExt};
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

async fn connect(bin: &str, dir: &Path) -> RunningService<RoleClient, ()> {
    let transport = TokioChildProcess::new(tokio::process::Command::new(bin).configure(|cmd| {
        cmd.arg("-C")
            .arg(dir)
            .arg("mcp")
            .env_remove("ENVIRONMENT_ACTOR")
            .env_remove("ENVIRONMENT_SOCKET")
            .env_remove("ENVIRONMENT_DIR");
    }))
    .unwrap();
    ().serve(transport).await.unwrap()
}

async fn call(client: &RunningService<RoleClient, ()>, tool: &str, args: serde_json::Value) {
    let args = args.as_object().cloned().unwrap_or_default();
    let r = client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{tool}: {r:?}");
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
        let client = rt.block_on(connect(bin, dir.path()));
        g.bench_function(format!("read_file, {name}"), |b| {
            b.iter(|| rt.block_on(call(&client, "read_file", json!({"path": "a.txt"}))))
        });
        let mut n = 0u64;
        g.bench_function(format!("write_file, {name}"), |b| {
            b.iter(|| {
                n += 1;
                let content = format!("version {n}\n");
                rt.block_on(call(
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
