//! `envctl serve` measured from outside, with a real HTTP client, all in one run:
//!
//! - an API read (`file.read`) and the first screen of the history (`history`, 200 entries) of
//!   an environment with many operations (`ENVCTL_BENCH_OPS`, default 100,000);
//! - how long after its commit an operation reaches a connected event stream;
//! - API writes with 100 event streams connected (held, then read) against writes with none,
//!   side by side on two servers, with the ratio of the medians printed;
//! - MCP `read_file` and `write_file` over Streamable HTTP against stdio, with the 95th
//!   percentile of each printed beside criterion's figures.
//!
//! `cargo bench -p envctl --bench http`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use environment_core::{ActRequest, ActorId, Intent, Key, LocalEnvironment, Options, Value as V};
use rmcp::ServiceExt;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

const ENVCTL: &str = env!("CARGO_BIN_EXE_envctl");

fn envctl(dir: &Path) -> Command {
    let mut c = Command::new(ENVCTL);
    c.arg("-C")
        .arg(dir)
        .env_remove("ENVIRONMENT_ACTOR")
        .env_remove("ENVIRONMENT_SOCKET")
        .env_remove("ENVIRONMENT_DIR");
    c
}

/// A workspace made an environment, with `ops` more operations in its log.
fn workspace(ops: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "alpha\n").unwrap();
    assert!(envctl(dir.path()).arg("init").status().unwrap().success());
    if ops > 0 {
        let env =
            LocalEnvironment::open(dir.path().join(".environment"), Options::default()).unwrap();
        let actor = ActorId::new("agent:bench").unwrap();
        for n in 0..ops {
            env.act_blocking(
                ActRequest::new(actor.clone(), Intent::edit(format!("step {n}"))).put(
                    Key::obj(format!("bench/{}", n % 64)).unwrap(),
                    V::file(n.to_string()),
                ),
            )
            .unwrap();
        }
    }
    dir
}

struct Server {
    child: Child,
    base: String,
    token: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(dir: &Path) -> Server {
    let mut child = envctl(dir)
        .args([
            "--json",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--rate-limit",
            "0",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let said: Value = serde_json::from_str(&line).unwrap();
    Server {
        child,
        base: format!("http://{}", said["listen"].as_str().unwrap()),
        token: said["token"].as_str().unwrap().to_owned(),
    }
}

async fn post(http: &reqwest::Client, s: &Server, method: &str, body: Value) -> Value {
    let r = http
        .post(format!("{}/api/v1/{method}", s.base))
        .bearer_auth(&s.token)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{method}: {}", r.status());
    r.json().await.unwrap()
}

/// Opens the event stream.
async fn events(http: &reqwest::Client, s: &Server) -> reqwest::Response {
    http.get(format!("{}/api/v1/events", s.base))
        .bearer_auth(&s.token)
        .send()
        .await
        .unwrap()
}

/// Reads the stream until an `operation` event arrives.
async fn next_operation(stream: &mut reqwest::Response, buf: &mut String) {
    loop {
        if let Some(at) = buf.find("event: operation")
            && let Some(end) = buf[at..].find("\n\n")
        {
            buf.drain(..at + end + 2);
            return;
        }
        let chunk = stream.chunk().await.unwrap().unwrap();
        buf.push_str(&String::from_utf8_lossy(&chunk));
    }
}

fn p95(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() * 95 / 100]
}

fn api(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ops: usize = std::env::var("ENVCTL_BENCH_OPS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let made = Instant::now();
    let dir = workspace(ops);
    eprintln!(
        "an environment of {ops} operations made in {:?}",
        made.elapsed()
    );
    let server = serve(dir.path());
    let http = reqwest::Client::new();
    let mut g = c.benchmark_group("http");
    g.sample_size(30);
    g.bench_function("api read (file.read)", |b| {
        b.iter(|| {
            rt.block_on(post(
                &http,
                &server,
                "file.read",
                json!({ "path": "a.txt" }),
            ))
        })
    });
    g.bench_function(format!("history's first screen, {ops} operations"), |b| {
        b.iter(|| rt.block_on(post(&http, &server, "history", json!({ "limit": 200 }))))
    });
    // From the answer of a write (its commit done) to its event on a connected stream: writes
    // back to back (each within the server's batching window of the last look) and writes
    // after a pause (a quiet environment).
    let mut stream = rt.block_on(events(&http, &server));
    let mut buf = String::new();
    let mut n = 0u64;
    for (name, pause) in [
        ("event after its commit, back to back", Duration::ZERO),
        (
            "event after its commit, after a pause",
            Duration::from_millis(60),
        ),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        tokio::time::sleep(pause).await;
                        n += 1;
                        let body = json!({ "path": "e.txt", "content": n.to_string() });
                        post(&http, &server, "file.write", body).await;
                        let committed = Instant::now();
                        next_operation(&mut stream, &mut buf).await;
                        total += committed.elapsed();
                    }
                    total
                })
            })
        });
    }
    drop(stream);
    g.finish();
}

/// API writes beside 100 connected event streams against writes with none, side by side: two
/// servers of like environments written alternately (which goes first swapped each time), so
/// that the machine's drift falls on both sides alike. Each criterion row times its side of
/// the same pairs; the ratios of the two sides' medians and means over every pair are printed.
fn streams(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (quiet_dir, busy_dir) = (workspace(0), workspace(0));
    let (quiet, busy) = (serve(quiet_dir.path()), serve(busy_dir.path()));
    let http = reqwest::Client::new();
    let mut g = c.benchmark_group("http");
    g.sample_size(30);
    let mut n = 0u64;
    for read in [false, true] {
        // Held: the server writes every event to each of them (the sockets' buffers take
        // them); the clients, whose reading would run on the same two cores, do not read.
        // Read: as a browser reads them, on the same two cores as the server.
        let mut streams = rt.block_on(futures_all(&http, &busy, 100));
        let readers: Vec<_> = if read {
            streams
                .drain(..)
                .map(|mut s| rt.spawn(async move { while let Ok(Some(_)) = s.chunk().await {} }))
                .collect()
        } else {
            Vec::new()
        };
        let how = if read { "read" } else { "held" };
        let mut pairs: Vec<[Duration; 2]> = Vec::new();
        for (side, name) in [
            (0, format!("api write, no event stream (beside {how})")),
            (1, format!("api write, 100 event streams {how}")),
        ] {
            g.bench_function(name, |b| {
                b.iter_custom(|iters| {
                    rt.block_on(async {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            n += 1;
                            let body = json!({ "path": "w.txt", "content": n.to_string() });
                            let mut pair = [Duration::ZERO; 2];
                            let order = if n.is_multiple_of(2) { [0, 1] } else { [1, 0] };
                            for which in order {
                                let server = [&quiet, &busy][which];
                                let t = Instant::now();
                                post(&http, server, "file.write", body.clone()).await;
                                pair[which] = t.elapsed();
                            }
                            total += pair[side];
                            pairs.push(pair);
                        }
                        total
                    })
                })
            });
        }
        let median = |side: usize| {
            let mut v: Vec<Duration> = pairs.iter().map(|p| p[side]).collect();
            v.sort();
            v[v.len() / 2]
        };
        let total = |side: usize| pairs.iter().map(|p| p[side].as_secs_f64()).sum::<f64>();
        let (none, with) = (median(0), median(1));
        eprintln!(
            "api write beside 100 event streams {how}: median {with:?} against {none:?} with \
             none, ratio {:.3} (of the means {:.3}) over {} pairs side by side",
            with.as_secs_f64() / none.as_secs_f64(),
            total(1) / total(0),
            pairs.len()
        );
        for r in readers {
            r.abort();
        }
        drop(streams);
    }
    g.finish();
}

async fn futures_all(http: &reqwest::Client, s: &Server, n: usize) -> Vec<reqwest::Response> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(events(http, s).await);
    }
    v
}

fn mcp(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = workspace(0);
    let server = serve(dir.path());
    let stdio = rt.block_on(common::connect_stdio(ENVCTL, dir.path()));
    let over_http = rt.block_on(async {
        let t = StreamableHttpClientTransport::from_config(
            StreamableHttpClientTransportConfig::with_uri(format!("{}/mcp", server.base))
                .auth_header(server.token.clone()),
        );
        ().serve(t).await.unwrap()
    });
    let mut g = c.benchmark_group("mcp");
    let mut n = 0u64;
    for (name, client) in [("stdio", &stdio), ("http", &over_http)] {
        let read = || common::call(client, "read_file", json!({ "path": "a.txt" }));
        g.bench_function(format!("read_file, {name}"), |b| {
            b.iter(|| rt.block_on(read()))
        });
        let mut write = || {
            n += 1;
            common::call(
                client,
                "write_file",
                json!({ "path": format!("{name}.txt"), "content": n.to_string() }),
            )
        };
        g.bench_function(format!("write_file, {name}"), |b| {
            b.iter(|| rt.block_on(write()))
        });
        // The tail, which criterion's figures leave out.
        let mut reads = Vec::new();
        let mut writes = Vec::new();
        for _ in 0..300 {
            let t = Instant::now();
            rt.block_on(read());
            reads.push(t.elapsed());
            let t = Instant::now();
            rt.block_on(write());
            writes.push(t.elapsed());
        }
        eprintln!(
            "mcp {name}: p95 read_file {:?}, p95 write_file {:?}",
            p95(reads),
            p95(writes)
        );
    }
    g.finish();
    rt.block_on(async {
        let _ = stdio.cancel().await;
        let _ = over_http.cancel().await;
    });
}

criterion_group!(benches, api, streams, mcp);
criterion_main!(benches);
