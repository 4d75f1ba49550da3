//! envctl end to end, through the built binary as a user runs it: exit codes, `--json`, and the
//! files on disk.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

use environment_core::{ActRequest, ActorId, Intent, Key, LocalEnvironment, Options, Value};
use serde_json::Value as Json;

fn entries(log: &Json) -> &Vec<Json> {
    log["entries"].as_array().unwrap()
}

#[test]
fn help_documents_the_exit_codes() {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    assert!(help.contains("Exit codes:"), "{help}");
    for line in [
        "2  malformed input",
        "3  not found",
        "4  denied",
        "6  no supervisor",
    ] {
        assert!(help.contains(line), "{line}: {help}");
    }
    let bad = Command::new(BIN).arg("frobnicate").output().unwrap();
    assert_eq!(code(&bad), 2);
}

#[test]
fn the_demo_runs_on_a_fresh_machine() {
    let keep = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["demo", "--keep"])
        .arg(keep.path())
        .env_remove("ENVIRONMENT_DIR")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("$ envctl restore good") && text.contains("intact"),
        "{text}"
    );
    let dir = std::fs::read_dir(keep.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    assert!(dir.join("src/lib.rs").is_file(), "the demo ends restored");
}

#[test]
fn an_agent_works_and_is_rolled_back() {
    let ws = Ws::new();
    // A scripted agent under `envctl run`: changes captured while it runs and at its end.
    let out = ws.run(&[
        "--actor",
        "agent:scripted",
        "run",
        "--",
        "sh",
        "-c",
        "echo 'pub fn add() {}' > src/lib.rs; sleep 0.3; echo v2 >> README.md; rm src/main.rs",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let summary = stderr(&out);
    assert!(summary.contains("files changed: 3"), "{summary}");
    let log = ws.json(&["log", "--all"]);
    let by_agent: Vec<&Json> = entries(&log)
        .iter()
        .filter(|e| e["actor"] == "agent:scripted")
        .collect();
    assert!(!by_agent.is_empty(), "{log}");
    // The default log squashes automatic captures.
    let short = ws.json(&["log"]);
    assert!(
        entries(&short).iter().any(|e| e["type"] == "captures"),
        "{short}"
    );

    // Out-of-band changes are captured by the next command, never lost.
    std::fs::write(ws.path("notes.txt"), "by hand\n").unwrap();
    ws.ok(&["mark", "good"]);
    let shown = ws.json(&["show", "good"]);
    assert_eq!(shown["changes"][0]["path"], "notes.txt", "{shown}");

    // Break things, then look at the damage.
    std::fs::remove_file(ws.path("src/lib.rs")).unwrap();
    std::fs::write(ws.path("README.md"), "broken\n").unwrap();
    let diff = ws.json(&["diff", "good", "HEAD"]);
    assert_eq!(
        (diff["removed"].as_u64(), diff["modified"].as_u64()),
        (Some(1), Some(1))
    );
    let stat = ws.json(&["diff", "good", "--stat"]);
    assert!(stat.get("changes").is_none() && stat["removed"] == 1);
    // One file's changes, line by line.
    let patch = ws.ok(&["diff", "good", "--file", "README.md"]);
    assert!(
        patch.starts_with("--- a/README.md\n+++ b/README.md\n@@ ") && patch.contains("\n+broken\n"),
        "{patch}"
    );
    let gone = ws.json(&["diff", "good", "--file", "src/lib.rs"]);
    assert!(
        gone["after"].is_null() && gone["before"]["size"].as_u64() > Some(0),
        "{gone}"
    );

    // A dry run previews and changes nothing.
    let before = ws.full_log("human:test");
    let plan = ws.json(&["restore", "good", "--dry-run"]);
    assert_eq!(plan["write"].as_array().unwrap().len(), 2, "{plan}");
    assert_eq!(ws.read("README.md").as_deref(), Some("broken\n"));
    assert!(!ws.path("src/lib.rs").exists());
    assert_eq!(ws.full_log("human:test"), before);

    // The restore brings the files back and appends a rollback.
    let done = ws.json(&["restore", "good"]);
    assert!(done["version"].is_string());
    assert_eq!(ws.read("src/lib.rs").as_deref(), Some("pub fn add() {}\n"));
    assert_eq!(ws.read("README.md").as_deref(), Some("# demo\nv2\n"));
    let head = ws.json(&["show", "HEAD"]);
    assert!(
        head["flags"]
            .as_array()
            .unwrap()
            .contains(&"rollback".into())
    );

    // Undo takes the restore back.
    ws.ok(&["undo"]);
    assert_eq!(ws.read("README.md").as_deref(), Some("broken\n"));
    assert!(!ws.path("src/lib.rs").exists());

    let v = ws.json(&["verify"]);
    assert_eq!(v["ok"], true);
    ws.ok(&["gc"]);
    ws.json(&["verify"]);
}

/// Undo steps back one operation at a time, past the undos before it; redo walks forward again
/// through the undos not redone, and is a conflict (exit 5) when there is none — in the log and
/// on disk.
#[test]
fn undo_steps_back_and_redo_walks_forward() {
    let ws = Ws::new();
    for v in ["one\n", "two\n", "three\n"] {
        std::fs::write(ws.path("notes.txt"), v).unwrap();
        ws.ok(&["status"]);
    }
    let on_disk = || ws.read("notes.txt");
    ws.ok(&["undo"]);
    assert_eq!(on_disk().as_deref(), Some("two\n"));
    ws.ok(&["undo"]);
    assert_eq!(
        on_disk().as_deref(),
        Some("one\n"),
        "a second undo steps further back"
    );
    ws.ok(&["redo"]);
    assert_eq!(on_disk().as_deref(), Some("two\n"));
    ws.ok(&["redo"]);
    assert_eq!(on_disk().as_deref(), Some("three\n"));
    ws.fails(&["redo"], 5);
    assert_eq!(on_disk().as_deref(), Some("three\n"));
    ws.ok(&["undo"]);
    assert_eq!(on_disk().as_deref(), Some("two\n"));
    // A new change ends what could be redone; undo takes that change back first.
    std::fs::write(ws.path("notes.txt"), "four\n").unwrap();
    ws.ok(&["status"]);
    ws.fails(&["redo"], 5);
    ws.ok(&["undo"]);
    assert_eq!(on_disk().as_deref(), Some("two\n"));
    let head = ws.json(&["show", "HEAD"]);
    assert_eq!(head["intent"]["kind"], "undo", "{head}");
}

#[test]
fn a_signal_to_run_shuts_down_cleanly_with_a_final_capture() {
    for signal in ["TERM", "INT"] {
        let ws = Ws::new();
        let child = Command::new(BIN)
            .args([
                "run",
                "--",
                "sh",
                "-c",
                "echo early > early.txt; sleep 30; echo late > late.txt",
            ])
            .current_dir(&ws.dir)
            .env_remove("ENVIRONMENT_DIR")
            .env_remove("ENVIRONMENT_SOCKET")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The agent runs (in a sandbox when this host allows: its first file is the sign).
        let started = ws.path("early.txt");
        for _ in 0..200 {
            if started.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        assert!(started.exists(), "the agent never started");
        std::thread::sleep(std::time::Duration::from_millis(200));
        // Only envctl is signalled: it stops the agent, captures, and summarizes.
        let kill = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let out = child.wait_with_output().unwrap();
        let err = stderr(&out);
        assert_eq!(
            code(&out),
            128 + 15,
            "SIG{signal}: the agent was terminated: {err}"
        );
        assert!(err.contains("files changed: 1"), "SIG{signal}: {err}");
        assert!(
            !ws.path("late.txt").exists(),
            "SIG{signal}: the agent was stopped"
        );
        let log = ws.full_log("human:test");
        assert!(
            entries(&log).iter().any(|e| e["summary"]["keys"]
                .as_array()
                .is_some_and(|k| k.contains(&"early.txt".into()))),
            "SIG{signal}: {log}"
        );
    }
}

#[test]
fn exec_records_one_operation_of_its_actor() {
    let ws = Ws::new();
    let out = ws.run(&[
        "--actor",
        "agent:builder",
        "exec",
        "--intent",
        "generate the config",
        "--",
        "sh",
        "-c",
        "echo debug=true > config.toml",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let op = ws.json(&["show", "HEAD"]);
    assert_eq!(op["actor"], "agent:builder");
    assert_eq!(op["intent"]["kind"], "command");
    assert_eq!(op["intent"]["text"], "generate the config");
    assert_eq!(op["changes"][0]["path"], "config.toml");
    // The command's own status comes back; a failing command is flagged.
    let out = ws.run(&["exec", "--", "sh", "-c", "echo x > fail.txt; exit 3"]);
    assert_eq!(code(&out), 3);
    let op = ws.json(&["show", "HEAD"]);
    assert!(
        op["flags"].as_array().unwrap().contains(&"failed".into()),
        "{op}"
    );
    // A program that does not exist: nothing ran, nothing recorded.
    let head = ws.head("human:test");
    ws.fails(&["exec", "--", "no-such-program-xyz"], 3);
    ws.fails(&["exec"], 2);
    ws.fails(&["log", "--limit", "many"], 2);
    assert_eq!(ws.head("human:test"), head);
}

#[test]
fn branches_marks_and_merges() {
    let ws = Ws::new();
    let marks = ws.json(&["mark"]);
    assert_eq!(marks["marks"].as_array().unwrap().len(), 0);
    ws.ok(&["mark", "start"]);
    ws.ok(&["branch", "feature", "start"]);
    let branches = ws.json(&["branch"]);
    let names: Vec<&str> = branches["branches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["feature", "main"]);

    // Another agent, linked to the library, works on the branch.
    {
        let env = LocalEnvironment::open(ws.home(), Options::default()).unwrap();
        let coder = ActorId::new("agent:coder").unwrap();
        env.act_blocking(
            ActRequest::new(coder, Intent::edit("add the feature"))
                .on("feature")
                .put(
                    Key::fs("src/feature.rs").unwrap(),
                    Value::file("pub fn f() {}\n"),
                )
                .put(
                    Key::fs("README.md").unwrap(),
                    Value::file("# demo, featured\n"),
                ),
        )
        .unwrap();
    }
    // Meanwhile main moves on elsewhere.
    std::fs::write(ws.path("CHANGELOG"), "v1\n").unwrap();
    let merged = ws.json(&["merge", "feature"]);
    assert_eq!(merged["conflicts"].as_array().unwrap().len(), 0, "{merged}");
    assert_eq!(
        ws.read("src/feature.rs").as_deref(),
        Some("pub fn f() {}\n")
    );
    assert_eq!(ws.read("README.md").as_deref(), Some("# demo, featured\n"));
    assert_eq!(ws.read("CHANGELOG").as_deref(), Some("v1\n"));
    let op = ws.json(&["show", "HEAD"]);
    assert!(
        op["flags"].as_array().unwrap().contains(&"merge".into()),
        "{op}"
    );
    assert_eq!(op["parents"].as_array().unwrap().len(), 2);
    // The merged tree is what main holds: nothing left to capture.
    let before = ws.full_log("human:test");
    ws.ok(&["status"]);
    assert_eq!(ws.full_log("human:test"), before);

    // Both sides change the same file: conflict objects, exit 5.
    {
        let env = LocalEnvironment::open(ws.home(), Options::default()).unwrap();
        let coder = ActorId::new("agent:coder").unwrap();
        env.act_blocking(
            ActRequest::new(coder, Intent::edit("reword"))
                .on("feature")
                .put(
                    Key::fs("CHANGELOG").unwrap(),
                    Value::file("v1 from feature\n"),
                ),
        )
        .unwrap();
    }
    std::fs::write(ws.path("CHANGELOG"), "v1 from main\n").unwrap();
    let out = ws.run(&["merge", "feature"]);
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert!(stderr(&out).contains("conflict"), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("conflict CHANGELOG") && said.contains("agent:coder"),
        "{said}"
    );
    // The workspace keeps main's side; editing the file resolves the conflict.
    assert_eq!(ws.read("CHANGELOG").as_deref(), Some("v1 from main\n"));
    std::fs::write(ws.path("CHANGELOG"), "v1 from both\n").unwrap();
    let fixed = ws.json(&["show", "HEAD"]);
    assert_eq!(fixed["changes"][0]["path"], "CHANGELOG", "{fixed}");
    assert_eq!(fixed["changes"][0]["after"]["kind"], "file", "{fixed}");

    // Names that clash or do not parse.
    ws.fails(&["mark", "start"], 5);
    ws.fails(&["branch", "feature"], 5);
    ws.fails(&["branch", "bad name\u{1}"], 2);
    ws.fails(&["merge", "no-such-branch"], 3);
    ws.json(&["verify"]);
}

#[test]
fn effects_in_flight_are_listed_until_settled() {
    let ws = Ws::new();
    assert_eq!(
        ws.json(&["effects"])["effects"].as_array().unwrap().len(),
        0
    );
    let id = {
        let env = LocalEnvironment::open(ws.home(), Options::default()).unwrap();
        let agent = ActorId::new("agent:deployer").unwrap();
        match env
            .effect_begin(&agent, "deploy-42", "https://deploy.example/api", b"{}")
            .unwrap()
        {
            environment_core::BeginOutcome::New(rec) => rec.id,
            other => panic!("{other:?}"),
        }
    };
    let open = ws.json(&["effects", "--unfinished"]);
    assert_eq!(open["effects"][0]["key"], "deploy-42", "{open}");
    assert_eq!(open["effects"][0]["actor"], "agent:deployer");
    {
        let env = LocalEnvironment::open(ws.home(), Options::default()).unwrap();
        let agent = ActorId::new("agent:deployer").unwrap();
        env.effect_complete(&agent, id, b"ok").unwrap();
    }
    assert_eq!(
        ws.json(&["effects", "--unfinished"])["effects"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    let all = ws.json(&["effects"]);
    assert_eq!(all["effects"][0]["result"], "ok", "{all}");
}

#[test]
fn queue_round_trip() {
    let ws = Ws::new();
    ws.ok(&["queue", "subscribe", "coders", "task.created"]);
    let p = ws.json(&[
        "queue",
        "publish",
        "task.created",
        "{\"id\": 1}",
        "--dedup",
        "task-1",
    ]);
    assert_eq!(p["duplicate"], false);
    let again = ws.json(&[
        "queue",
        "publish",
        "task.created",
        "{\"id\": 1}",
        "--dedup",
        "task-1",
    ]);
    assert_eq!(again["duplicate"], true);
    let claimed = ws.json(&["queue", "claim", "coders", "--lease", "30"]);
    let leases = claimed["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 1);
    assert_eq!(leases[0]["payload"], "{\"id\": 1}");
    let receipt = leases[0]["receipt"].as_str().unwrap().to_owned();
    // A receipt that leaked to another actor settles nothing for it.
    ws.fails(&["--actor", "agent:other", "queue", "ack", &receipt], 4);
    ws.fails(&["--actor", "agent:other", "queue", "nack", &receipt], 4);
    // The lease is in flight, held by the claimer, until it is settled.
    let held = ws.json(&["queue", "leases", "--group", "coders"]);
    assert_eq!(held["leases"][0]["message_id"], leases[0]["message_id"]);
    assert_eq!(held["leases"][0]["attempt"], 1);
    // The ack takes the next task in the same step.
    ws.ok(&["queue", "publish", "task.created", "{\"id\": 2}"]);
    let cycled = ws.json(&["queue", "ack", &receipt, "--next", "1"]);
    assert_eq!(cycled["leases"][0]["payload"], "{\"id\": 2}", "{cycled}");
    let next = cycled["leases"][0]["receipt"].as_str().unwrap().to_owned();
    ws.ok(&["queue", "ack", &next]);
    assert_eq!(
        ws.json(&["queue", "leases"])["leases"],
        serde_json::json!([])
    );
    // Settled: the same receipt again is a conflict, a made-up one is unknown.
    ws.fails(&["queue", "ack", &receipt], 5);
    ws.fails(&["queue", "nack", "12.0000000000000abc"], 3);
    ws.fails(&["queue", "ack", "garbage"], 3);
    ws.fails(&["queue", "claim", "nobody"], 3);
    ws.fails(&["queue", "publish", "bad topic!", "x"], 2);
    ws.fails(
        &["queue", "publish", "task.created", "@/no/such/payload"],
        3,
    );
    let big = ws.path("../big.bin");
    std::fs::write(&big, vec![b'x'; 2 << 20]).unwrap();
    ws.fails(
        &[
            "queue",
            "publish",
            "huge.topic",
            &format!("@{}", big.display()),
        ],
        2,
    );
    let stats = ws.json(&["queue", "stats"]);
    let topics: Vec<&str> = stats["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["topic"].as_str().unwrap())
        .collect();
    assert_eq!(
        topics,
        ["task.created"],
        "a refused publish creates no topic"
    );
    assert_eq!(
        ws.json(&["queue", "dead", "coders"])["dead"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    assert_eq!(ws.json(&["queue", "redrive", "coders"])["redriven"], 0);
    // Like every command, a queue command first captures what changed out of band.
    std::fs::write(ws.path("oob.txt"), "x").unwrap();
    ws.ok(&["queue", "stats"]);
    let log = ws.full_log("human:test");
    assert_eq!(entries(&log)[0]["summary"]["keys"][0], "oob.txt", "{log}");
}

#[test]
fn the_policy_denies_and_nothing_changes() {
    let ws = Ws::new();
    std::fs::write(
        ws.path("../bad.toml"),
        "[[rule]]\nid = \"x\"\neffect = \"maybe\"\n",
    )
    .unwrap();
    let err = ws.fails(&["policy", "load", "../bad.toml"], 2);
    assert!(err.contains("line"), "{err}");
    assert!(
        ws.json(&["status"])["policy_version"].is_null(),
        "a bad file loads nothing"
    );

    std::fs::write(ws.path("../rules.toml"), common::ALICE_AND_BOB).unwrap();
    std::fs::create_dir(ws.path("release")).unwrap();
    assert_eq!(
        ws.json(&["policy", "load", "../rules.toml"])["rules"],
        common::ALICE_AND_BOB_RULES
    );
    ws.ok(&["--actor", "agent:bob", "log"]);
    ws.ok(&["--actor", "agent:bob", "mark"]);

    let before = ws.full_log("human:alice");
    let readme = ws.read("README.md");
    let err = ws.fails(&["--actor", "agent:bob", "restore", "HEAD~1"], 4);
    assert!(err.contains("Denied"), "{err}");
    ws.fails(&["--actor", "agent:bob", "undo"], 4);
    ws.fails(&["--actor", "agent:bob", "exec", "--", "touch", "x"], 4);
    ws.fails(&["--actor", "agent:bob", "mark", "mine"], 4);
    ws.fails(&["--actor", "agent:bob", "queue", "publish", "t", "x"], 4);
    ws.fails(&["--actor", "agent:nobody", "log"], 4);
    ws.fails(
        &["--actor", "agent:nobody", "restore", "HEAD~1", "--dry-run"],
        4,
    );
    // Nor may bob change the policy that binds him.
    ws.fails(
        &["--actor", "agent:bob", "policy", "load", "../bad.toml"],
        2,
    );
    std::fs::write(ws.path("../mine.toml"), "[[rule]]\nid = \"all\"\neffect = \"permit\"\nprincipal = \"agent:bob\"\nactions = [\"write\"]\nresource = \"*\"\n").unwrap();
    ws.fails(
        &["--actor", "agent:bob", "policy", "load", "../mine.toml"],
        4,
    );
    ws.fails(
        &[
            "--actor",
            "agent:bob",
            "policy",
            "member",
            "agent:bob",
            "group:admins",
        ],
        4,
    );
    ws.fails(
        &[
            "--actor",
            "human:alice",
            "policy",
            "check",
            "agent:bob",
            "write",
            "README.md",
        ],
        4,
    );
    // Asking what someone else may do is a read of the policy: not everyone's to ask (and
    // the actor asked about is not the one asking).
    ws.fails(
        &["--actor", "agent:nobody", "policy", "may", "agent:bob"],
        4,
    );
    ws.fails(
        &[
            "--actor",
            "agent:nobody",
            "policy",
            "check",
            "agent:bob",
            "read",
            "README.md",
        ],
        4,
    );
    assert!(!ws.path("x").exists());
    assert_eq!(ws.read("README.md"), readme);
    assert!(ws.path("src/main.rs").exists());
    assert_eq!(
        ws.full_log("human:alice"),
        before,
        "denied actions record nothing"
    );

    // Bob may write under src/: his command is his.
    let out = ws.run(&[
        "--actor",
        "agent:bob",
        "exec",
        "--",
        "sh",
        "-c",
        "echo b > src/b.rs",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        ws.json(&["--actor", "human:alice", "show", "HEAD"])["actor"],
        "agent:bob"
    );
    // Outside it, the command ran: what he may change is recorded as his, what he may not is
    // put back in the tree and kept as refused, never recorded under anyone else: exit 4.
    let readme_before = ws.read("README.md");
    let err = ws.fails(
        &[
            "--actor",
            "agent:bob",
            "exec",
            "--",
            "sh",
            "-c",
            "echo c > src/c.rs; echo b > top.txt; echo x >> README.md",
        ],
        4,
    );
    assert!(err.contains("NOT recorded"), "{err}");
    assert!(
        !ws.path("top.txt").exists(),
        "a refused new file is removed"
    );
    assert_eq!(
        ws.read("README.md"),
        readme_before,
        "a refused edit is undone"
    );
    assert_eq!(ws.read("src/c.rs").as_deref(), Some("c\n"));
    let op = ws.json(&["--actor", "human:alice", "show", "HEAD"]);
    assert_eq!(op["actor"], "agent:bob");
    let paths: Vec<&str> = op["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["namespace"] == "fs")
        .filter_map(|c| c["path"].as_str())
        .collect();
    assert_eq!(paths, ["src/c.rs"], "{op}");
    let refused = ws.json(&["--actor", "human:alice", "refused"]);
    let mut named: Vec<&str> = refused["refused"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert_eq!(r["actor"], "agent:bob");
            r["path"].as_str().unwrap()
        })
        .collect();
    named.sort();
    assert_eq!(named, ["README.md", "top.txt"], "{refused}");
    // Nothing found later launders them: the next capture records nothing.
    let head = ws.json(&["--actor", "human:alice", "show", "HEAD"])["id"].clone();
    ws.ok(&["--actor", "human:alice", "status"]);
    assert_eq!(
        ws.json(&["--actor", "human:alice", "show", "HEAD"])["id"],
        head
    );

    // Questions to the policy: exit 0 when allowed, 4 when not.
    let yes = ws.json(&[
        "--actor",
        "human:alice",
        "policy",
        "check",
        "agent:bob",
        "write",
        "path:src/x.rs",
    ]);
    assert_eq!(yes["outcome"], "allow");
    assert_eq!(yes["rules"][0], "bob-writes-src");
    let out = ws.run(&[
        "--actor",
        "human:alice",
        "policy",
        "explain",
        "agent:bob",
        "write",
        "README.md",
    ]);
    assert_eq!(code(&out), 4);
    assert!(String::from_utf8_lossy(&out.stdout).contains("Denied"));
    let may = ws.json(&["--actor", "human:alice", "policy", "may", "agent:bob"]);
    assert!(may["permissions"].as_array().unwrap().len() >= 2, "{may}");
    ws.fails(
        &[
            "--actor",
            "human:alice",
            "policy",
            "check",
            "bob",
            "write",
            "x",
        ],
        2,
    );
    ws.fails(
        &[
            "--actor",
            "human:alice",
            "policy",
            "check",
            "agent:bob",
            "fly!",
            "x",
        ],
        2,
    );
    ws.fails(
        &[
            "--actor",
            "human:alice",
            "policy",
            "check",
            "agent:bob",
            "write",
            "path:../x",
        ],
        2,
    );
    ws.fails(
        &[
            "--actor",
            "human:alice",
            "policy",
            "check",
            "agent:bob",
            "write",
            "planet:mars",
        ],
        2,
    );
    assert_eq!(
        ws.json(&["--actor", "human:alice", "policy", "approvals"])["approvals"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
    ws.fails(
        &[
            "--actor",
            "human:alice",
            "policy",
            "approvals",
            "grant",
            "no-such-id",
        ],
        3,
    );
    ws.fails(&["policy", "approvals", "grant"], 2);
    // A write that needs approval files a request a human decides.
    ws.fails(
        &[
            "--actor",
            "agent:bob",
            "exec",
            "--",
            "sh",
            "-c",
            "echo 1 > release/v1",
        ],
        4,
    );
    let pending = ws.json(&["--actor", "human:alice", "policy", "approvals"]);
    let request = &pending["approvals"][0];
    assert_eq!(request["state"], "pending", "{pending}");
    assert_eq!(request["actor"], "agent:bob");
    let id = request["id"].as_str().unwrap().to_owned();
    ws.fails(
        &["--actor", "agent:bob", "policy", "approvals", "grant", &id],
        4,
    );
    let granted = ws.json(&[
        "--actor",
        "human:alice",
        "policy",
        "approvals",
        "grant",
        &id,
    ]);
    assert_eq!(granted["state"], "granted");
    ws.fails(
        &[
            "--actor",
            "human:alice",
            "policy",
            "approvals",
            "reject",
            &id,
        ],
        5,
    );
    ws.json(&["--actor", "human:alice", "verify"]);
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    let ws = Ws::new();
    let before = ws.full_log("human:test");
    for args in [
        &["show", "no-such-version"][..],
        &["show", "ffffffffffff"],
        &["diff", "HEAD", "nope"],
        &["restore", "nope"],
        &["restore", "nope", "--dry-run"],
        &["mark", "m", "nope"],
        &["branch", "b", "nope"],
        &["log", "--branch", "nope"],
    ] {
        let err = ws.fails(args, 3);
        assert!(err.contains("unknown"), "{args:?}: {err}");
    }
    ws.fails(&["show", "HEAD~99"], 3);
    ws.fails(&["--actor", "no-colon", "log"], 2);
    ws.fails(&["--actor", "", "log"], 2);
    ws.fails(&["mark", "bad name\u{7}"], 2);
    ws.fails(&["init"], 5);
    // A supervisor is named but none listens.
    let sock = ws.path("../no.sock");
    let sock = sock.to_str().unwrap();
    ws.fails(&["--socket", sock, "log"], 6);
    ws.fails(&["--socket", sock, "mcp"], 6);
    ws.fails(&["--socket", sock, "queue", "stats"], 6);
    // Malformed or unknown: said so, nothing run.
    ws.fails(
        &[
            "tournament",
            "--jobs",
            "0",
            "--test",
            "true",
            "--",
            "touch a",
        ],
        2,
    );
    ws.fails(
        &[
            "tournament",
            "--base",
            "nope",
            "--test",
            "true",
            "--",
            "touch a",
        ],
        3,
    );
    ws.fails(&["run", "--isolate", "rootfs", "--", "touch", "ran"], 3);
    ws.fails(&["run", "--isolate", "bogus", "--", "touch", "ran"], 2);
    assert!(!ws.path("ran").exists() && !ws.path("a").exists());
    assert_eq!(ws.full_log("human:test"), before);

    // Outside any environment.
    let elsewhere = tempfile::tempdir().unwrap();
    let out = envctl_in(elsewhere.path(), &["log"]);
    assert_eq!(code(&out), 3);
    assert_one_sentence(&stderr(&out));
    let out = envctl_in(elsewhere.path(), &["-C", "/no/such/dir", "log"]);
    assert_eq!(code(&out), 3);
    assert_one_sentence(&stderr(&out));
}

#[test]
fn a_home_that_cannot_be_written_is_refused() {
    // A workspace whose home is not a directory.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("w")).unwrap();
    std::fs::write(tmp.path().join("file"), "").unwrap();
    std::fs::write(
        tmp.path().join("w/.environment"),
        tmp.path().join("file").to_str().unwrap(),
    )
    .unwrap();
    let out = envctl_in(&tmp.path().join("w"), &["log"]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert_one_sentence(&stderr(&out));
    assert_eq!(std::fs::read(tmp.path().join("file")).unwrap(), b"");

    // A home the user may not write.
    let ws = Ws::new();
    let db = ws.home().join("env.db");
    let probe = ws.home().join("probe");
    set_mode(&ws.home(), 0o500);
    let privileged = std::fs::write(&probe, "x").is_ok();
    if privileged {
        assert!(
            !in_unprivileged_run(),
            "permissions are ignored even for the unprivileged run"
        );
        set_mode(&ws.home(), 0o755);
        also_unprivileged("a_home_that_cannot_be_written_is_refused");
        return;
    }
    set_mode(&db, 0o400);
    let out = ws.run(&["mark", "m"]);
    set_mode(&db, 0o644);
    set_mode(&ws.home(), 0o755);
    assert!(matches!(code(&out), 1), "{}", stderr(&out));
    assert_one_sentence(&stderr(&out));
    assert!(ws.json(&["mark"])["marks"].as_array().unwrap().is_empty());
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn init_with_a_home_elsewhere_and_a_rootfs() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    let home = tmp.path().join("state");
    let seed = tmp.path().join("seed");
    std::fs::create_dir_all(work.join("deep/er")).unwrap();
    std::fs::write(work.join("file"), "x").unwrap();
    std::fs::create_dir_all(seed.join("bin")).unwrap();
    std::fs::write(seed.join("bin/tool"), "#!/bin/sh\n").unwrap();
    std::os::unix::fs::symlink("bin/tool", seed.join("tool")).unwrap();
    let out = envctl_in(
        tmp.path(),
        &[
            "init",
            "work",
            "--home",
            home.to_str().unwrap(),
            "--rootfs",
            seed.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let j: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["captured"], 3, "{j}");
    assert!(home.join("env.db").exists() && work.join(".environment").is_file());
    assert!(home.join("rootfs/bin/tool").is_file());
    assert!(home.join("rootfs/tool").is_symlink());
    // Found from a subdirectory, like git.
    let out = envctl_in(&work.join("deep/er"), &["status", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let s: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["home"], home.canonicalize().unwrap().to_str().unwrap());
    let out = envctl_in(tmp.path(), &["init", "other", "--rootfs", "/no/such/seed"]);
    assert_eq!(code(&out), 3);
    assert!(!tmp.path().join("other").exists());
}

/// A reader that goes away (`envctl log | head -1`) ends the command quietly: no panic, and the
/// status says SIGPIPE, as for `git log | head`.
#[test]
fn a_closed_stdout_ends_a_command_quietly() {
    let ws = Ws::new();
    for i in 0..40 {
        std::fs::write(ws.path("README.md"), format!("# demo {i}\n")).unwrap();
        ws.ok(&["status"]);
    }
    let mut child = ws
        .cmd(&["log", "--all"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader is gone before the first line
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    use std::os::unix::process::ExitStatusExt;
    assert!(
        out.status.success() || out.status.signal() == Some(13),
        "{:?}: {err}",
        out.status
    );
}

/// A restore tells a person what it did by top-level entry; `--verbose` lists every path.
#[test]
fn a_restore_summarizes_by_top_level_entry() {
    let ws = Ws::new();
    let before = ws.json(&["status"])["head"].as_str().unwrap().to_owned();
    for i in 0..30 {
        let p = ws.path(&format!(".venv/lib/m{i}.py"));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, "x = 1\n").unwrap();
    }
    std::fs::write(ws.path("README.md"), "# changed\n").unwrap();
    ws.ok(&["status"]);
    let with = ws.json(&["status"])["head"].as_str().unwrap().to_owned();
    // Ignored content under a directory that goes is counted in the plan, and goes too.
    std::fs::create_dir_all(ws.path(".venv/lib/__pycache__")).unwrap();
    std::fs::write(ws.path(".venv/lib/__pycache__/m0.pyc"), "cache").unwrap();
    let plan = ws.json(&["restore", &before, "--dry-run"]);
    assert_eq!(plan["ignored_removed"], 2, "{plan}");
    let out = ws.ok(&["restore", &before]);
    assert!(out.contains("  .venv/: 32 removed"), "{out}");
    assert!(out.contains("  README.md: 1 written"), "{out}");
    assert!(!out.contains("m17.py"), "no path list by default: {out}");
    assert!(!ws.path(".venv").exists());
    let out = ws.ok(&["restore", &with, "--verbose"]);
    assert!(out.contains("write  .venv/lib/m17.py"), "{out}");
}

#[test]
fn an_init_that_cannot_seed_leaves_nothing_half_made() {
    also_unprivileged("an_init_that_cannot_seed_leaves_nothing_half_made");
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("tree");
    std::fs::create_dir_all(src.join("etc")).unwrap();
    std::fs::write(src.join("etc/ok"), "ok\n").unwrap();
    std::fs::write(src.join("etc/shadow"), "secret\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        src.join("etc/shadow"),
        std::fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let out = envctl_in(&work, &["init", "--rootfs", src.to_str().unwrap()]);
    if running_as_root() {
        assert_eq!(code(&out), 0, "root reads every file: {}", stderr(&out));
        return;
    }
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert_one_sentence(&stderr(&out));
    assert!(
        !work.join(".environment").exists(),
        "nothing half-made is left"
    );
    assert_eq!(
        code(&envctl_in(&work, &["status"])),
        3,
        "not an environment"
    );
    // Once the tree can be read, init works.
    std::fs::set_permissions(
        src.join("etc/shadow"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let out = envctl_in(&work, &["init", "--rootfs", src.to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(work.join(".environment/rootfs/etc/shadow").exists());
}

/// Runs envctl to its end and returns whether it succeeded and its peak resident memory in KiB.
fn peak_memory(dir: &Path, args: &[&str]) -> (bool, i64) {
    environment_benches::peak_memory(
        envctl_cmd(dir, args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null()),
    )
}

#[test]
fn large_and_sparse_files_are_captured_and_restored_in_bounded_memory() {
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::fs::{FileExt, MetadataExt};
    // Well above the bound, so nothing of either file may be held whole.
    const BOUND_KIB: i64 = 96 << 10;
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path();
    // Written and hashed in pieces: a child's peak memory counts the parent's at its exec, so
    // this process stays small.
    let hash = |path: &Path| {
        let mut h = blake3::Hasher::new();
        std::io::copy(&mut std::fs::File::open(path).unwrap(), &mut h).unwrap();
        h.finalize()
    };
    {
        let mut out = std::io::BufWriter::new(std::fs::File::create(work.join("big.bin")).unwrap());
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..(160 << 20) / 8 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.write_all(&x.to_le_bytes()).unwrap();
        }
    }
    let data = hash(&work.join("big.bin"));
    let mut img = std::fs::File::create(work.join("disk.img")).unwrap();
    img.seek(SeekFrom::Start(1 << 30)).unwrap();
    img.write_all(b"middle").unwrap();
    img.set_len(2 << 30).unwrap();
    drop(img);

    let (ok, init_kib) = peak_memory(work, &["init"]);
    assert!(ok, "init failed");
    assert!(init_kib < BOUND_KIB, "init peaked at {init_kib} KiB");
    assert!(envctl_in(work, &["mark", "before"]).status.success());
    std::fs::OpenOptions::new()
        .write(true)
        .open(work.join("big.bin"))
        .unwrap()
        .write_all_at(b"!", 80 << 20)
        .unwrap();
    let (ok, status_kib) = peak_memory(work, &["status"]);
    assert!(
        ok && status_kib < BOUND_KIB,
        "status: {ok}, {status_kib} KiB"
    );

    // The store holds the data once and about one chunk more; the holes not at all.
    let mut stored = 0;
    let mut stack = vec![work.join(".environment")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let m = e.as_ref().unwrap().metadata().unwrap();
            if m.is_dir() {
                stack.push(e.unwrap().path());
            } else {
                stored += m.blocks() * 512;
            }
        }
    }
    assert!(
        stored < (160 << 20) + (24 << 20),
        "the home takes {stored} bytes"
    );

    std::fs::remove_file(work.join("disk.img")).unwrap();
    std::fs::write(work.join("big.bin"), b"clobbered").unwrap();
    let (ok, restore_kib) = peak_memory(work, &["restore", "before"]);
    assert!(
        ok && restore_kib < BOUND_KIB,
        "restore: {ok}, {restore_kib} KiB"
    );
    assert_eq!(hash(&work.join("big.bin")), data);
    let img = std::fs::File::open(work.join("disk.img")).unwrap();
    let m = img.metadata().unwrap();
    assert_eq!(m.len(), 2 << 30);
    assert!(
        m.blocks() * 512 < 1 << 20,
        "the hole was written: {}",
        m.blocks() * 512
    );
    let mut middle = [0u8; 6];
    img.read_exact_at(&mut middle, 1 << 30).unwrap();
    assert_eq!(&middle, b"middle");
    also_unprivileged("large_and_sparse_files_are_captured_and_restored_in_bounded_memory");
}
