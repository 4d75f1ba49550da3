//! A fleet: three machines, each a working copy with its own home (its own blob cache and stat
//! cache), on one PostgreSQL database (log, queue, policy) and one bucket (blobs). A planner, a
//! coder and a tester hand a task to each other through the queue, each working in its own
//! copy, with a maintainer's approval for the release; then all three act at once on one
//! branch while the first collects garbage, and one is SIGKILLed mid-command. Nothing any of
//! them was told was recorded is lost, every copy ends as the head, and `verify` passes on
//! every machine.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Ws, code, envctl_in, fresh_bucket, fresh_schema};
use rand::Rng;

const RULES: &str = r#"
[[rule]]
id = "maintainer-everything"
effect = "permit"
principal = "human:maintainer"
actions = ["read", "write", "delete", "execute", "publish", "consume", "approve"]
resource = "*"

[[rule]]
id = "agents-read"
effect = "permit"
principal = "kind:agent"
actions = ["read"]
resource = "*"

[[rule]]
id = "agents-run-sh"
effect = "permit"
principal = "kind:agent"
actions = ["execute"]
resource = { program = "sh", args = ["..."] }

[[rule]]
id = "agents-record-commands"
effect = "permit"
principal = "kind:agent"
actions = ["write"]
resource = { object = "exec", key = "*" }

[[rule]]
id = "agents-use-the-queue"
effect = "permit"
principal = "kind:agent"
actions = ["publish", "consume"]
resource = "*"

[[rule]]
id = "planner-plans"
effect = "permit"
principal = "agent:planner"
actions = ["write", "delete"]
resource = { path = "tasks/**" }

[[rule]]
id = "coder-codes"
effect = "permit"
principal = "agent:coder"
actions = ["write", "delete"]
resource = { path = "src/**" }

[[rule]]
id = "coder-releases-with-approval"
effect = "permit"
principal = "agent:coder"
actions = ["write"]
resource = { path = "release/**" }
approval_from = ["human:maintainer"]

[[rule]]
id = "tester-tests"
effect = "permit"
principal = "agent:tester"
actions = ["write", "delete"]
resource = { path = "tests/**" }
"#;

/// A second machine: a working copy attached through `stores`, acting as `actor`.
fn attached(stores: &Path, actor: &'static str) -> Ws {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("copy");
    let out = envctl_in(
        tmp.path(),
        &[
            "--actor",
            actor,
            "attach",
            "--stores",
            stores.to_str().unwrap(),
            dir.to_str().unwrap(),
        ],
    );
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    Ws {
        _tmp: tmp,
        dir,
        actor: Some(actor),
    }
}

fn sh(ws: &Ws, script: &str) {
    ws.ok(&["exec", "--", "sh", "-c", script]);
}

/// Claims the next message of `group` as `actor` (the workspace's own when `None`): its
/// payload and receipt.
fn claim_as(ws: &Ws, actor: Option<&str>, group: &str) -> (String, String) {
    let mut args = actor.map_or_else(Vec::new, |a| vec!["--actor", a]);
    args.extend_from_slice(&["queue", "claim", group, "--lease", "120"]);
    let claimed = ws.json(&args);
    let lease = &claimed["leases"][0];
    (
        lease["payload"].as_str().unwrap_or_default().to_owned(),
        lease["receipt"].as_str().unwrap_or_default().to_owned(),
    )
}

fn claim(ws: &Ws, group: &str) -> (String, String) {
    claim_as(ws, None, group)
}

fn head(ws: &Ws) -> serde_json::Value {
    ws.json(&["log", "--all", "--limit", "1"])["entries"][0]["id"].clone()
}

#[test]
fn a_fleet_of_three_machines_works_one_task_and_survives_a_kill() {
    let Some(conn) = fresh_schema() else { return };
    let Some(bucket) = fresh_bucket() else { return };
    let lead = Ws::made_with(
        Some("agent:planner"),
        &[
            "--shared-queue",
            &conn,
            "--shared-policy",
            &conn,
            "--shared-log",
            &conn,
            "--shared-blobs",
            &bucket,
        ],
    );
    std::fs::write(lead.path("../rules.toml"), RULES).unwrap();
    lead.ok(&[
        "--actor",
        "human:maintainer",
        "policy",
        "load",
        "../rules.toml",
    ]);
    let stores = lead.home().join("stores.toml");
    let coder = attached(&stores, "agent:coder");
    let tester = attached(&stores, "agent:tester");
    for (group, topic) in [
        ("coders", "task.created"),
        ("testers", "patch.ready"),
        ("maintainers", "review.required"),
    ] {
        lead.ok(&["queue", "subscribe", group, topic]);
    }

    // The planner files the task on the first machine.
    sh(
        &lead,
        "mkdir -p tasks && echo 'write a parser' > tasks/1.md",
    );
    lead.ok(&["queue", "publish", "task.created", "tasks/1.md"]);

    // The coder, on the second, finds it in its own copy and writes the patch there.
    let (task, receipt) = claim(&coder, "coders");
    assert_eq!(task, "tasks/1.md");
    coder.ok(&["status"]);
    assert_eq!(coder.read(&task).as_deref(), Some("write a parser\n"));
    sh(&coder, "echo 'pub fn parse() {}' > src/parser.rs");
    coder.ok(&["queue", "publish", "patch.ready", "src/parser.rs"]);
    coder.ok(&["queue", "ack", &receipt]);

    // The tester, on the third, tests the patch as its copy has it.
    let (patch, receipt) = claim(&tester, "testers");
    tester.ok(&["status"]);
    sh(
        &tester,
        &format!("grep -q 'pub fn parse' {patch} && mkdir -p tests && echo pass > tests/parser"),
    );
    tester.ok(&["queue", "publish", "review.required", "tests pass"]);
    tester.ok(&["queue", "ack", &receipt]);

    // The release needs the maintainer: held on the coder's machine, granted on the first.
    coder.fails(
        &[
            "exec",
            "--",
            "sh",
            "-c",
            "mkdir -p release && echo v1 > release/v1",
        ],
        4,
    );
    assert!(coder.read("release/v1").is_none(), "put back");
    let (_, receipt) = claim_as(&lead, Some("human:maintainer"), "maintainers");
    let maintainer = |args: &[&str]| {
        let mut all = vec!["--actor", "human:maintainer"];
        all.extend_from_slice(args);
        lead.json(&all)
    };
    // One request for each path the command made (the directory and the file).
    let pending = maintainer(&["policy", "approvals"]);
    let requests = pending["approvals"].as_array().unwrap();
    assert_eq!(requests.len(), 2, "{pending}");
    let mut ids = std::collections::BTreeMap::new();
    for r in requests {
        assert_eq!(r["actor"], "agent:coder", "{pending}");
        let id = r["id"].as_str().unwrap().to_owned();
        assert_eq!(
            maintainer(&["policy", "approvals", "grant", &id])["state"],
            "granted"
        );
        ids.insert(r["resource"].as_str().unwrap().to_owned(), id);
    }
    lead.ok(&["--actor", "human:maintainer", "queue", "ack", &receipt]);
    // The directory first (one approval a request), then the file.
    for (resource, script) in [
        ("fs:release", "mkdir -p release"),
        ("fs:release/v1", "echo v1 > release/v1"),
    ] {
        coder.ok(&[
            "--approval",
            &ids[resource],
            "exec",
            "--",
            "sh",
            "-c",
            script,
        ]);
    }
    lead.ok(&["status"]);
    assert_eq!(lead.read("release/v1").as_deref(), Some("v1\n"));
    assert_eq!(lead.read("tests/parser").as_deref(), Some("pass\n"));

    // All three at once on one branch, the first collecting garbage meanwhile; the tester's
    // commands are SIGKILLed at random moments, mid-command or mid-capture.
    let acked = std::sync::Mutex::new(Vec::<(String, String)>::new());
    std::thread::scope(|s| {
        for (ws, dir) in [(&lead, "tasks"), (&coder, "src")] {
            let acked = &acked;
            s.spawn(move || {
                for i in 0..6 {
                    let path = format!("{dir}/load-{i}");
                    let text = format!("{dir} {i}");
                    let out =
                        ws.run(&["exec", "--", "sh", "-c", &format!("echo '{text}' > {path}")]);
                    // A command that conflicts with another machine's is told so; one that
                    // succeeded was recorded.
                    if code(&out) == 0 {
                        acked.lock().unwrap().push((path, format!("{text}\n")));
                    } else {
                        eprintln!("{path}: {}", String::from_utf8_lossy(&out.stderr));
                    }
                }
            });
        }
        s.spawn(|| {
            let mut rng = rand::rng();
            for i in 0..6 {
                let path = format!("tests/load-{i}");
                let script = format!("sleep 0.{}; echo 'tests {i}' > {path}", i % 3);
                let mut child = tester
                    .cmd(&["exec", "--", "sh", "-c", &script])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap();
                std::thread::sleep(Duration::from_millis(rng.random_range(50..900)));
                let _ = child.kill();
                let status = child.wait().unwrap();
                if status.success() {
                    acked.lock().unwrap().push((path, format!("tests {i}\n")));
                }
            }
        });
        for _ in 0..2 {
            lead.ok(&["--actor", "human:maintainer", "gc"]);
        }
    });
    let acked = acked.into_inner().unwrap();
    assert!(acked.len() >= 10, "too few commands finished: {acked:?}");

    // Each machine opens again (finishing what a kill interrupted) and takes the others'
    // changes: one head, every acknowledged file in every copy, every store whole.
    for ws in [&tester, &coder, &lead, &tester] {
        ws.ok(&["status"]);
    }
    let heads: Vec<_> = [&lead, &coder, &tester].iter().map(|ws| head(ws)).collect();
    assert!(heads.iter().all(|h| *h == heads[0]), "{heads:?}");
    for ws in [&lead, &coder, &tester] {
        for (path, text) in &acked {
            assert_eq!(ws.read(path).as_deref(), Some(text.as_str()), "{path}");
        }
        assert_eq!(ws.read("release/v1").as_deref(), Some("v1\n"));
        ws.ok(&["verify"]);
    }
    common::also_unprivileged("a_fleet_of_three_machines_works_one_task_and_survives_a_kill");
}
