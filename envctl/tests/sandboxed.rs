//! envctl with the sandbox: recorded commands through the shell, tournaments over overlays,
//! agents under a supervisor (rolling themselves back through its socket), commands routed
//! through a running supervisor, and held actions retried with their approval.
//!
//! Tests that need user namespaces say SKIPPED and why when the host refuses them; run as root
//! (as CI does), they also run again as an unprivileged uid.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};

use common::*;
use std::time::Duration;

use environment_core::{ActRequest, ActorId, Intent, Key, LocalEnvironment, Options, Value};
use environment_sandbox::Isolation;
use serde_json::Value as Json;

/// Whether this host makes sandboxes; says SKIPPED and why when not.
fn sandboxes(test: &str) -> bool {
    match Isolation::probe() {
        Ok(_) => true,
        Err(e) => {
            common::missing_prerequisite(&format!(
                "{test}: this host refuses unprivileged user namespaces: {e}"
            ));
            false
        }
    }
}

/// The paths an operation (as `envctl show --json` prints it) changed.
fn changed_paths(op: &Json) -> Vec<&str> {
    op["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["path"].as_str())
        .collect()
}

fn log_all(ws: &Ws) -> Vec<Json> {
    ws.json(&["log", "--all"])["entries"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn exec_stores_output_and_attributes_changes() {
    let ws = Ws::acting_as(Some("human:test"));
    let out = ws.run(&[
        "--actor",
        "agent:builder",
        "exec",
        "--intent",
        "make the config",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; echo debug=true > config.toml",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "out\n");
    assert!(stderr(&out).starts_with("err\n"), "{}", stderr(&out));
    let head = ws.json(&["show", "HEAD"]);
    let short = &head["id"].as_str().unwrap()[..12];
    assert!(
        stderr(&out).contains(&format!("recorded as {short}")),
        "the op id is printed: {}",
        stderr(&out)
    );
    assert_eq!(head["actor"], "agent:builder");
    assert_eq!(head["intent"]["text"], "make the config");
    assert!(
        head["flags"]
            .as_array()
            .unwrap()
            .contains(&"command".into())
    );
    let paths = changed_paths(&head);
    assert!(paths.contains(&"config.toml"), "{head}");

    // The output is stored with the operation, and --json gives the outcome.
    let done = ws.json(&[
        "--actor",
        "agent:builder",
        "exec",
        "--",
        "sh",
        "-c",
        "echo again",
    ]);
    assert_eq!(done["status"], 0);
    assert_eq!(done["stdout"]["text"], "again\n");
    assert_eq!(done["stdout"]["stored"], 6);
    assert_eq!(done["files_changed"], 0);
    let op = done["op"].as_str().unwrap();
    // A command that changed no file is recorded all the same.
    assert_eq!(log_all(&ws)[0]["id"], op);
    let env = LocalEnvironment::open(ws.home(), Options::default()).unwrap();
    let reader = ActorId::new("human:test").unwrap();
    let stored = env
        .read(
            &reader,
            &Key::obj("exec/stdout").unwrap(),
            &env.resolve(op).unwrap(),
        )
        .unwrap()
        .unwrap();
    assert_eq!(env.content(&stored).unwrap(), b"again\n");

    // Started in a subdirectory, it runs there.
    let out = ws
        .cmd(&["exec", "--", "sh", "-c", "touch here"])
        .current_dir(ws.path("src"))
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(ws.path("src/here").exists());

    // A failing command's status comes back, flagged failed.
    let out = ws.run(&["exec", "--", "sh", "-c", "exit 3"]);
    assert_eq!(code(&out), 3);
    assert!(
        log_all(&ws)[0]["flags"]
            .as_array()
            .unwrap()
            .contains(&"failed".into())
    );

    if sandboxes("exec_stores_output_and_attributes_changes (confinement)") {
        // The host is read-only around the workspace, and the stores are out of reach.
        let out = ws.run(&[
            "exec",
            "--",
            "sh",
            "-c",
            "touch /usr/envctl-must-not-exist; ls .environment | wc -l",
        ]);
        assert!(!Path::new("/usr/envctl-must-not-exist").exists());
        assert_eq!(
            stdout(&out).trim(),
            "0",
            "the home is masked: {}",
            stderr(&out)
        );
    }
}

#[test]
fn tournament_adopts_the_one_that_passes() {
    if !sandboxes("tournament_adopts_the_one_that_passes") {
        let ws = Ws::acting_as(Some("human:test"));
        let err = ws.fails(&["tournament", "--test", "true", "--", "true"], 7);
        assert!(err.contains("sandbox"), "{err}");
        return;
    }
    let ws = Ws::acting_as(Some("human:test"));
    std::fs::write(ws.path("total.sh"), "echo $((2 + 2 + 2))\n").unwrap();
    let out = ws.run(&[
        "tournament",
        "--pick",
        "all",
        "--jobs",
        "2",
        "--test",
        "test \"$(sh total.sh)\" = 4",
        "--",
        "echo 'echo $((2 + 2 - 2))' > total.sh",
        "echo 'echo $((2 + 2))' > total.sh && echo fixed > CHANGES",
        "echo 'echo five' > total.sh",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let table = stdout(&out);
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with('c')).collect();
    assert_eq!(rows.len(), 3, "{table}");
    assert!(
        rows[0].contains("fail") && !rows[0].contains("winner"),
        "{table}"
    );
    assert!(
        rows[1].contains("pass") && rows[1].contains("winner"),
        "{table}"
    );
    assert!(rows[2].contains("fail"), "{table}");
    assert!(table.contains("adopted: main is now"), "{table}");
    // The winner is on disk and in the log; the losers stay as branches.
    assert_eq!(ws.read("total.sh").as_deref(), Some("echo $((2 + 2))\n"));
    assert_eq!(ws.read("CHANGES").as_deref(), Some("fixed\n"));
    let head = ws.json(&["show", "HEAD"]);
    assert!(
        head["intent"]["text"].as_str().unwrap().contains("c2"),
        "{head}"
    );
    let branches = ws.json(&["branch"]);
    let names: Vec<String> = branches["branches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["name"].as_str().unwrap().to_owned())
        .collect();
    for c in ["c1", "c2", "c3"] {
        assert!(
            names
                .iter()
                .any(|n| n.starts_with("tournament/") && n.ends_with(c)),
            "{names:?}"
        );
    }

    // None passes: exit 1, nothing adopted, the report in JSON.
    let before = ws.json(&["show", "HEAD"])["id"].clone();
    let out = ws.run(&[
        "--json",
        "tournament",
        "--test",
        "false",
        "--",
        "touch x",
        "touch y",
    ]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let report: Json = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["report"]["winner"].is_null(), "{report}");
    assert_eq!(report["report"]["contestants"].as_array().unwrap().len(), 2);
    assert_eq!(ws.json(&["show", "HEAD"])["id"], before);
    assert!(!ws.path("x").exists());
    also_unprivileged("tournament_adopts_the_one_that_passes");
}

#[test]
fn an_agent_rolls_itself_back_through_the_socket() {
    if !sandboxes("an_agent_rolls_itself_back_through_the_socket") {
        return;
    }
    let ws = Ws::acting_as(Some("human:test"));
    // The agent: a script that marks, breaks its files, and restores through the socket by
    // running envctl inside the sandbox; the supervisor's pid for it must not change.
    let script = format!(
        "set -e
         pid() {{ {BIN} --json status | tr -d ' \\n' | sed -n 's/.*\"agent_pid\":\\([0-9][0-9]*\\).*/\\1/p'; }}
         before=$(pid)
         n=0
         while [ -z \"$before\" ] && [ $n -lt 100 ]; do sleep 0.05; before=$(pid); n=$((n+1)); done
         {BIN} mark good
         rm src/main.rs
         echo broken > README.md
         {BIN} restore good
         test -f src/main.rs
         grep -q demo README.md
         echo \"pids $before $(pid)\"
         echo after > after.txt"
    );
    let out = ws.run(&[
        "--actor",
        "agent:self",
        "run",
        "--isolate",
        "host",
        "--self-rollback",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    let said = stdout(&out);
    assert_eq!(code(&out), 0, "{said}{}", stderr(&out));
    let pids: Vec<&str> = said
        .lines()
        .find_map(|l| l.strip_prefix("pids "))
        .unwrap_or_else(|| panic!("{said}"))
        .split(' ')
        .collect();
    assert!(
        !pids[0].is_empty() && pids[0] == pids[1],
        "same agent: {said}"
    );
    assert!(
        stderr(&out).contains("rollbacks:     1"),
        "{}",
        stderr(&out)
    );
    // After the rollback it carried on; the files are back.
    assert_eq!(ws.read("README.md").as_deref(), Some("# demo\n"));
    assert!(ws.path("src/main.rs").exists());
    assert_eq!(ws.read("after.txt").as_deref(), Some("after\n"));
    let log = log_all(&ws);
    assert!(
        log.iter().any(|e| e["actor"] == "agent:self"
            && e["flags"].as_array().unwrap().contains(&"rollback".into())),
        "{log:?}"
    );

    // Without --self-rollback the agent cannot reach the socket.
    let out = ws.run(&[
        "run",
        "--isolate",
        "host",
        "--",
        "sh",
        "-c",
        &format!("{BIN} status; echo \"status exit $?\""),
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stdout(&out).contains("status exit 6"), "{}", stdout(&out));
    also_unprivileged("an_agent_rolls_itself_back_through_the_socket");
}

/// Starts `envctl run` with a long agent and waits for its socket and the agent's first file.
fn supervised(ws: &Ws, isolate: &str) -> Child {
    let child = ws
        .cmd(&[
            "--actor",
            "agent:long",
            "run",
            "--isolate",
            isolate,
            "--",
            "sh",
            "-c",
            "echo one > one.txt; exec sleep 60",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for _ in 0..400 {
        if ws.socket().exists() && ws.path("one.txt").exists() {
            return child;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    let out = stop(child);
    panic!("the supervisor never came up: {}", stderr(&out));
}

fn stop(child: Child) -> Output {
    let ok = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
    child.wait_with_output().unwrap()
}

#[test]
fn commands_go_through_a_running_supervisor() {
    let ws = Ws::acting_as(Some("human:test"));
    let child = supervised(&ws, "none");
    let log = ws.json(&["log"]);
    assert_eq!(log["via"], "supervisor", "{log}");
    let status = ws.json(&["status"]);
    assert_eq!(status["supervisor"]["actor"], "agent:long", "{status}");
    assert!(status["supervisor"]["agent_pid"].is_u64(), "{status}");
    let marked = ws.json(&["mark", "m1"]);
    assert_eq!(marked["name"], "m1");
    let shown = ws.json(&["show", "m1"]);
    assert!(shown["id"].is_string(), "{shown}");
    // An exec through the supervisor: recorded, its output printed.
    let out = ws.run(&["exec", "--", "sh", "-c", "echo via; echo two > two.txt"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "via\n");
    assert!(
        stderr(&out).contains("through the supervisor"),
        "{}",
        stderr(&out)
    );
    // Started in a subdirectory, the command runs there.
    let out = ws
        .cmd(&["exec", "--", "pwd"])
        .current_dir(ws.path("src"))
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).trim_end().ends_with("/src"),
        "{}",
        stdout(&out)
    );
    let diff = ws.json(&["diff", "m1"]);
    assert!(
        diff["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["path"] == "two.txt" && c["change"] == "added"),
        "{diff}"
    );
    // A dry run changes nothing; the restore does, under the running agent.
    let plan = ws.json(&["restore", "m1", "--dry-run"]);
    assert_eq!(plan["remove"][0], "two.txt", "{plan}");
    assert!(ws.path("two.txt").exists());
    let done = ws.json(&["restore", "m1"]);
    assert!(done["version"].is_string(), "{done}");
    assert!(!ws.path("two.txt").exists());
    // Through the operator's socket the command acts as its own actor, not the agent's.
    assert_eq!(status["actor"], "human:test", "{status}");
    let restore_op = ws.json(&["show", done["version"].as_str().unwrap()]);
    assert_eq!(restore_op["actor"], "human:test", "{restore_op}");
    // Through the agent's socket, no one else may pass for the agent.
    let out = ws.run(&[
        "--socket",
        ws.socket().to_str().unwrap(),
        "--actor",
        "human:intruder",
        "mark",
        "m2",
    ]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    ws.ok(&["undo"]);
    assert!(ws.path("two.txt").exists());
    // What touches only the stores runs beside it.
    ws.ok(&["branch", "b"]);
    ws.ok(&["verify"]);
    ws.ok(&["gc"]);
    ws.ok(&["queue", "stats"]);
    let marks = ws.json(&["mark"]);
    assert!(marks.to_string().contains("m1"), "{marks}");
    // A merge goes through it, and lands in the tree.
    let env = LocalEnvironment::open(ws.home(), Options::default()).unwrap();
    env.act_blocking(
        ActRequest::new(ActorId::new("human:test").unwrap(), Intent::edit("on b"))
            .on("b")
            .put(Key::fs("from-b.txt").unwrap(), Value::file("b\n")),
    )
    .unwrap();
    drop(env);
    let merged = ws.json(&["merge", "b"]);
    assert_eq!(merged["branch"], "b", "{merged}");
    assert_eq!(merged["noop"], false, "{merged}");
    assert_eq!(ws.read("from-b.txt").as_deref(), Some("b\n"));
    // A tournament runs on forks, and the supervisor merges its winner into the tree.
    if sandboxes("commands_go_through_a_running_supervisor (tournament)") {
        let out = ws.ok(&[
            "tournament",
            "--test",
            "test -f won.txt",
            "--",
            "echo no > lost.txt",
            "echo yes > won.txt",
        ]);
        assert!(out.contains("winner"), "{out}");
        assert_eq!(ws.read("won.txt").as_deref(), Some("yes\n"));
        assert!(!ws.path("lost.txt").exists());
        std::fs::remove_file(ws.path("won.txt")).unwrap();
    }
    ws.fails(&["show", "no-such-version"], 3);
    ws.fails(&["run", "--", "true"], 7);
    let out = stop(child);
    let summary = stderr(&out);
    assert!(summary.contains("rollbacks:     2"), "{summary}");
    // Direct again once it is gone.
    assert!(ws.json(&["log"]).get("via").is_none());
}

const RULES: &str = r#"
[[rule]]
id = "alice-everything"
effect = "permit"
principal = "human:alice"
actions = ["read", "write", "delete", "execute", "publish", "consume", "approve"]
resource = "*"

[[rule]]
id = "bob-reads"
effect = "permit"
principal = "agent:bob"
actions = ["read"]
resource = "*"

[[rule]]
id = "bob-writes-files"
effect = "permit"
principal = "agent:bob"
actions = ["write"]
resource = { path = "**" }

[[rule]]
id = "bob-merges-into-main-with-approval"
effect = "permit"
principal = "agent:bob"
actions = ["write"]
resource = { branch = "main" }
approval_from = ["human:alice"]
"#;

#[test]
fn a_held_merge_is_retried_with_its_approval() {
    let ws = Ws::acting_as(Some("human:test"));
    std::fs::write(ws.path("../rules.toml"), RULES).unwrap();
    ws.ok(&["policy", "load", "../rules.toml"]);
    ws.ok(&["--actor", "human:alice", "branch", "feature"]);
    {
        let env = LocalEnvironment::open(ws.home(), Options::default()).unwrap();
        env.act_blocking(
            ActRequest::new(
                ActorId::new("human:alice").unwrap(),
                Intent::edit("feature"),
            )
            .on("feature")
            .put(
                Key::fs("src/feature.rs").unwrap(),
                Value::file("pub fn f() {}\n"),
            ),
        )
        .unwrap();
    }
    let err = ws.fails(&["--actor", "agent:bob", "merge", "feature"], 4);
    assert!(!ws.path("src/feature.rs").exists(), "{err}");
    let pending = ws.json(&["--actor", "human:alice", "policy", "approvals"]);
    let id = pending["approvals"][0]["id"].as_str().unwrap().to_owned();
    // Not granted yet: presenting it changes nothing.
    ws.fails(
        &[
            "--actor",
            "agent:bob",
            "--approval",
            &id,
            "merge",
            "feature",
        ],
        4,
    );
    assert!(!ws.path("src/feature.rs").exists());
    ws.ok(&[
        "--actor",
        "human:alice",
        "policy",
        "approvals",
        "grant",
        &id,
    ]);
    // A made-up approval does not help either.
    ws.fails(
        &[
            "--actor",
            "agent:bob",
            "--approval",
            "no-such-approval",
            "merge",
            "feature",
        ],
        4,
    );
    let merged = ws.json(&[
        "--actor",
        "agent:bob",
        "--approval",
        &id,
        "merge",
        "feature",
    ]);
    assert_eq!(merged["conflicts"].as_array().unwrap().len(), 0, "{merged}");
    assert_eq!(
        ws.read("src/feature.rs").as_deref(),
        Some("pub fn f() {}\n")
    );
    let head = ws.json(&["--actor", "human:alice", "show", "HEAD"]);
    assert_eq!(head["actor"], "agent:bob", "{head}");
}

#[test]
fn an_agent_runs_in_the_managed_rootfs() {
    if !sandboxes("an_agent_runs_in_the_managed_rootfs") {
        return;
    }
    let Some(busybox) = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    else {
        common::missing_prerequisite(
            "an_agent_runs_in_the_managed_rootfs: no busybox to make a rootfs of",
        );
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("root");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy(busybox, root.join("bin/busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", root.join("bin/sh")).unwrap();
    std::fs::create_dir_all(root.join("etc/apt/apt.conf.d")).unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("a.txt"), "alpha\n").unwrap();
    let ws = Ws {
        _tmp: tempfile::tempdir().unwrap(),
        dir: work,
        actor: Some("human:test"),
    };
    let root_arg = root.to_str().unwrap();
    ws.ok(&["init", "--rootfs", root_arg]);
    let before = ws.json(&["status"])["head"].as_str().unwrap().to_owned();
    let out = ws.run(&[
        "--actor",
        "agent:rooted",
        "run",
        "--isolate",
        "rootfs",
        "--",
        "/bin/sh",
        "-c",
        "test \"$PWD\" = /workspace && test -f a.txt && test -x /bin/busybox && echo made > b.txt \
         && mkdir -p /etc && echo configured > /etc/motd && test ! -e /workspace/.environment/env.db \
         && test -x /run/environment/bin/envctl && echo \"$PATH\" > path.txt",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    // The host's PATH stays outside; envctl is on the rootfs's.
    assert_eq!(
        ws.read("path.txt").as_deref().map(str::trim),
        Some(environment_sandbox::isolate::ROOTFS_PATH)
    );
    // apt is told at seed time not to switch users it cannot switch to.
    let apt = std::fs::read_to_string(
        ws.home()
            .join("rootfs/etc/apt/apt.conf.d/00environment-sandbox"),
    )
    .unwrap();
    assert!(apt.contains("APT::Sandbox::User \"root\";"), "{apt}");
    std::fs::remove_file(ws.path("path.txt")).unwrap();
    assert_eq!(ws.read("b.txt").as_deref(), Some("made\n"));
    let log = log_all(&ws);
    assert!(
        log.iter().any(|e| e["actor"] == "agent:rooted"),
        "the agent's changes are its own: {log:?}"
    );
    // The rootfs is tracked too: what the agent changed there is in the log.
    assert!(
        log.iter().any(|e| e["summary"]["keys"]
            .as_array()
            .is_some_and(|k| k.iter().any(|k| k == ".environment/rootfs/etc/motd"))),
        "the rootfs change was captured: {log:?}"
    );
    // The sandbox's mount points in the rootfs are not the user's history...
    for point in ["workspace", "run/environment", "tmp/.environment-run"] {
        let key = format!(".environment/rootfs/{point}");
        assert!(
            !log.iter()
                .any(|e| e["summary"]["keys"].as_array().is_some_and(|k| k
                    .iter()
                    .any(|k| k.as_str().is_some_and(|k| k.starts_with(&key))))),
            "{key} was captured: {log:?}"
        );
    }
    // A restore brings the rootfs back with the workspace.
    let motd = ws.home().join("rootfs/etc/motd");
    assert!(motd.exists());
    ws.ok(&["restore", &before]);
    assert!(!motd.exists(), "the rootfs was restored too");
    // ...and a restore to before the first run leaves them for the next one.
    assert!(ws.home().join("rootfs/workspace").is_dir());
    assert!(ws.home().join("rootfs/run/environment/bin").is_dir());
    assert!(ws.home().join("rootfs/bin/busybox").exists());
    assert_eq!(ws.read("b.txt"), None);
    also_unprivileged("an_agent_runs_in_the_managed_rootfs");
}

#[test]
fn a_run_s_refused_changes_are_put_back_and_kept_as_the_agent_s() {
    let ws = Ws::acting_as(Some("human:test"));
    std::fs::write(
        ws.path("../rules.toml"),
        r#"
[[rule]]
id = "bob-reads-and-runs"
effect = "permit"
principal = "agent:bob"
actions = ["read", "execute"]
resource = "*"

[[rule]]
id = "bob-writes-src"
effect = "permit"
principal = "agent:bob"
actions = ["write"]
resource = { path = "src/**" }

[[rule]]
id = "bob-records-commands"
effect = "permit"
principal = "agent:bob"
actions = ["write"]
resource = { object = "exec", key = "*" }
"#,
    )
    .unwrap();
    ws.ok(&["policy", "load", "../rules.toml"]);
    let out = ws.run(&[
        "--actor",
        "agent:bob",
        "run",
        "--isolate",
        "none",
        "--",
        "sh",
        "-c",
        "echo a > src/a.rs; echo b > top.txt",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("refused:"), "{}", stderr(&out));
    // What bob may write is his; what he may not is put back and kept as refused, never
    // recorded under another actor.
    assert_eq!(ws.read("src/a.rs").as_deref(), Some("a\n"));
    assert!(
        !ws.path("top.txt").exists(),
        "the refused file was put back"
    );
    let log = ws.json(&["--actor", "agent:bob", "log", "--all"]);
    let entries = log["entries"].as_array().unwrap();
    let records_top = |e: &&serde_json::Value| {
        e["summary"]["keys"]
            .as_array()
            .unwrap()
            .contains(&"top.txt".into())
    };
    assert!(!entries.iter().any(|e| records_top(&e)), "{log}");
    let wrote_a = entries.iter().any(|e| {
        e["actor"] == "agent:bob"
            && e["summary"]["keys"]
                .as_array()
                .unwrap()
                .contains(&"src/a.rs".into())
    });
    assert!(wrote_a, "{log}");
    let refused = ws.json(&["--actor", "agent:bob", "refused"]);
    let refused = refused["refused"].as_array().unwrap();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["path"], "top.txt");
    assert_eq!(refused[0]["actor"], "agent:bob");

    // Through the supervisor's socket: the command's refused change is put back, kept as
    // refused, and the answer says so (exit 4), while its allowed change is recorded.
    let out = ws.run(&[
        "--actor",
        "agent:bob",
        "run",
        "--isolate",
        "none",
        "--self-rollback",
        "--",
        "sh",
        "-c",
        &format!(
            "{BIN} exec -- sh -c 'echo v > viaexec.txt; echo ok > src/ok.rs'; echo \"exec exit $?\""
        ),
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stdout(&out).contains("exec exit 4"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(stderr(&out).contains("NOT recorded"), "{}", stderr(&out));
    assert!(!ws.path("viaexec.txt").exists());
    assert_eq!(ws.read("src/ok.rs").as_deref(), Some("ok\n"));
    let refused = ws.json(&["--actor", "agent:bob", "refused"]);
    let refused = refused["refused"].as_array().unwrap();
    assert_eq!(refused.len(), 2, "{refused:?}");
    assert_eq!(refused[0]["path"], "viaexec.txt");
    also_unprivileged("a_run_s_refused_changes_are_put_back_and_kept_as_the_agent_s");
}

/// A capability token of `actor` limited to `actions`, issued by the workspace's policy.
fn token_for(ws: &Ws, actor: &str, actions: &[&str]) -> String {
    let policy = environment_policy::Policy::open(
        &ws.home().join("policy.db"),
        std::sync::Arc::new(environment_core::SystemClock),
    )
    .unwrap();
    let limits = environment_policy::TokenLimits {
        actions: Some(actions.iter().map(|a| (*a).to_owned()).collect()),
        ..Default::default()
    };
    policy.issue_token(actor, limits).unwrap().encode()
}

#[test]
fn a_token_narrows_what_the_actor_may_do() {
    let ws = Ws::acting_as(Some("human:test"));
    std::fs::write(
        ws.path("../rules.toml"),
        r#"
[[rule]]
id = "everyone-everything"
effect = "permit"
principal = "*"
actions = ["read", "write", "execute"]
resource = "*"
"#,
    )
    .unwrap();
    ws.ok(&["policy", "load", "../rules.toml"]);
    let token = token_for(&ws, "agent:bob", &["read"]);
    let head = ws.json(&["show", "HEAD"])["id"].clone();
    // With the read-only token, bob's own right to run and write is narrowed away.
    for args in [
        &["exec", "--", "sh", "-c", "echo x > top.txt"][..],
        &["mark", "mine"],
    ] {
        let mut all = vec!["--actor", "agent:bob", "--token", &token];
        all.extend_from_slice(args);
        ws.fails(&all, 4);
    }
    assert!(!ws.path("top.txt").exists());
    ws.fails(
        &["--actor", "agent:bob", "--token", "ept1.forged", "log"],
        4,
    );
    assert_eq!(ws.json(&["show", "HEAD"])["id"], head);
    // Reading is within it; without the token, bob's own rights apply.
    ws.ok(&["--actor", "agent:bob", "--token", &token, "log"]);
    ws.ok(&["--actor", "agent:bob", "mark", "mine"]);

    // A run under a read+execute token: it runs, and its captures are narrowed by the token as
    // its requests are: what it writes is put back and kept as refused, not recorded.
    let run_token = token_for(&ws, "agent:bob", &["read", "execute"]);
    let head = ws.json(&["show", "HEAD"])["id"].clone();
    let out = ws.run(&[
        "--actor",
        "agent:bob",
        "--token",
        &run_token,
        "run",
        "--isolate",
        "none",
        "--",
        "sh",
        "-c",
        "echo x > viarun.txt",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(!ws.path("viarun.txt").exists(), "{}", stderr(&out));
    assert_eq!(ws.json(&["show", "HEAD"])["id"], head);
    let refused = ws.json(&["refused"]);
    assert_eq!(refused["refused"][0]["path"], "viarun.txt", "{refused}");
    assert_eq!(refused["refused"][0]["actor"], "agent:bob");
}

fn sandboxed_processes(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .count()
}

/// SIGKILL of `envctl run` ends the agent and its background processes; the next command says
/// the run ended abnormally and records what the agent wrote before.
#[test]
fn a_killed_run_takes_its_sandbox_along_and_is_reported() {
    if !sandboxes("a_killed_run_takes_its_sandbox_along_and_is_reported") {
        return;
    }
    let ws = Ws::new();
    let marker = format!("killed-run-{}", std::process::id());
    let script = format!("sleep 120 & echo before > before.txt; sleep 120; : {marker}");
    let mut child = ws
        .cmd(&["run", "--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..400 {
        if ws.path("before.txt").exists() && sandboxed_processes(&marker) > 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    assert!(sandboxed_processes(&marker) > 0, "the agent runs");
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = std::time::Instant::now();
    while sandboxed_processes(&marker) > 0 && killed.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        sandboxed_processes(&marker),
        0,
        "the sandbox outlived envctl"
    );
    let out = ws.run(&["status"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("ended abnormally"),
        "{}",
        stderr(&out)
    );
    let head = ws.json(&["show", "HEAD"]);
    let paths = changed_paths(&head);
    assert!(paths.contains(&"before.txt"), "{head}");
    // Said once: the record is gone.
    let again = ws.run(&["status"]);
    assert!(!stderr(&again).contains("ended abnormally"));
    also_unprivileged("a_killed_run_takes_its_sandbox_along_and_is_reported");
}

/// `--network none`, `--writable DIR` and `--pass-env NAME` on `exec` and `run`, and the
/// summary of `run` names every layer that held.
#[test]
fn exec_and_run_take_network_writable_and_passed_variables() {
    if !sandboxes("exec_and_run_take_network_writable_and_passed_variables") {
        return;
    }
    let ws = Ws::new();
    let cache = tempfile::tempdir_in("/var/tmp").unwrap();
    let cache_dir = cache.path().display().to_string();
    let script = format!(
        "echo cached > {cache_dir}/c; echo \"[$npm_config_cache][$PIP_INDEX_URL][$HIDDEN_VAR]\"; \
         tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '"
    );
    let out = ws
        .cmd(&[
            "exec",
            "--network",
            "none",
            "--writable",
            &cache_dir,
            "--pass-env",
            "npm_config_*",
            "--pass-env",
            "PIP_INDEX_URL",
            "--",
            "sh",
            "-c",
            &script,
        ])
        .env("npm_config_cache", "/c")
        .env("PIP_INDEX_URL", "http://index")
        .env("HIDDEN_VAR", "secret")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "[/c][http://index][]\nlo\n");
    assert_eq!(
        std::fs::read_to_string(cache.path().join("c")).unwrap(),
        "cached\n"
    );
    // Without --writable the same write is refused, and nothing lands.
    std::fs::remove_file(cache.path().join("c")).unwrap();
    let out = ws.run(&["exec", "--", "sh", "-c", &format!("echo x > {cache_dir}/c")]);
    assert_ne!(code(&out), 0);
    assert!(!cache.path().join("c").exists());
    // A missing writable directory is refused before anything runs.
    let out = ws.run(&[
        "exec",
        "--writable",
        "/nonexistent/dir",
        "--",
        "touch",
        "ran",
    ]);
    assert_ne!(code(&out), 0);
    assert!(!ws.path("ran").exists());

    // run: the agent is not given the socket (its directory is out of reach), and the summary
    // says what held.
    let home = ws.home().display().to_string();
    let out = ws.run(&[
        "run",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        &format!(
            "ls {home} {home}/run; test -S \"$ENVIRONMENT_SOCKET\" && echo SOCKET; \
             ls /tmp/.environment-run; cat /proc/self/status"
        ),
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        !text.contains("SOCKET") && !text.contains("control.sock"),
        "{text}"
    );
    assert!(!text.contains("env.db"), "{text}");
    assert!(text.contains("CapEff:\t0000000000000000"), "{text}");
    assert!(text.contains("NoNewPrivs:\t1"), "{text}");
    let summary = stderr(&out);
    for layer in [
        "no capabilities",
        "no_new_privs",
        "seccomp",
        "Landlock",
        "masked",
        "network off",
    ] {
        assert!(
            summary.contains(layer),
            "the summary names {layer}: {summary}"
        );
    }
}

/// A command run through a running supervisor's socket holds no more privilege than the agent:
/// the same layers confine it.
#[test]
fn exec_through_the_socket_holds_no_privilege() {
    if !sandboxes("exec_through_the_socket_holds_no_privilege") {
        return;
    }
    let ws = Ws::acting_as(Some("human:test"));
    let child = supervised(&ws, "host");
    let out = ws.run(&["exec", "--", "cat", "/proc/self/status"]);
    // Asking the supervisor for more than its sandbox gives is refused, and runs nothing.
    let outside = tempfile::tempdir().unwrap();
    let before = ws.json(&["log", "--all"]);
    for more in [
        &["--writable", outside.path().to_str().unwrap()][..],
        &["--network", "host"],
        &["--network", "none"],
        &["--pass-env", "HOME"],
    ] {
        let mut args = vec!["exec"];
        args.extend_from_slice(more);
        args.extend_from_slice(&["--", "sh", "-c", "touch ran; touch \"$0\"/x"]);
        args.push(outside.path().to_str().unwrap());
        ws.fails(&args, 2);
    }
    assert!(!ws.path("ran").exists() && !outside.path().join("x").exists());
    assert_eq!(
        ws.json(&["log", "--all"]),
        before,
        "a refused exec records nothing"
    );
    drop(stop(child));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("through the supervisor"),
        "{}",
        stderr(&out)
    );
    let status = stdout(&out);
    assert!(status.contains("CapEff:\t0000000000000000"), "{status}");
    assert!(status.contains("CapBnd:\t0000000000000000"), "{status}");
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("Seccomp:\t2"), "{status}");
    also_unprivileged("exec_through_the_socket_holds_no_privilege");
}

#[test]
fn the_run_summary_names_what_could_not_be_read() {
    if !sandboxes("the_run_summary_names_what_could_not_be_read") {
        return;
    }
    let ws = Ws::new();
    // The agent (without capabilities inside) makes a file nobody may read, as dpkg does for
    // a moment; the supervisor, unless it is root, cannot read it either.
    let out = ws.run(&[
        "--json",
        "run",
        "--isolate",
        "host",
        "--",
        "sh",
        "-c",
        "echo secret > locked && chmod 000 locked && echo ok > fine",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let summary: Json = serde_json::from_slice(&out.stdout).unwrap();
    let unreadable: Vec<&str> = summary["unreadable"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|u| u["path"].as_str())
        .collect();
    if running_as_root() {
        assert!(unreadable.is_empty(), "root reads everything: {summary}");
    } else {
        assert_eq!(unreadable, ["locked"], "{summary}");
        assert!(ws.read("fine").is_some());
    }
    also_unprivileged("the_run_summary_names_what_could_not_be_read");
}

/// Limits the host cannot apply are refused before the agent starts (exit 7, nothing run,
/// nothing recorded), never dropped; where a cgroup v2 subtree is delegated they hold.
#[test]
fn cgroup_limits_are_applied_or_refused_never_dropped() {
    if !sandboxes("cgroup_limits_are_applied_or_refused_never_dropped") {
        return;
    }
    let ws = Ws::acting_as(Some("human:test"));
    ws.ok(&["status"]);
    let before = log_all(&ws).len();
    let delegated = matches!(
        Isolation::probe().unwrap().cgroup,
        environment_sandbox::CgroupSupport::Delegated { ref controllers, .. }
            if controllers.iter().any(|c| c == "pids")
    );
    for command in ["run", "exec"] {
        let out = ws.run(&[
            command,
            "--max-processes",
            "16",
            "--",
            "sh",
            "-c",
            "cat /sys/fs/cgroup/$(cut -d: -f3 /proc/self/cgroup)/pids.max > made",
        ]);
        if delegated {
            assert_eq!(code(&out), 0, "{}", stderr(&out));
            assert_eq!(ws.read("made").as_deref(), Some("16\n"));
            std::fs::remove_file(ws.path("made")).unwrap();
        } else {
            eprintln!(
                "cgroup v2 enforcement not checked on this host: {}",
                stderr(&out)
            );
            assert_eq!(code(&out), 7, "{command}: {}", stderr(&out));
            assert_eq!(ws.read("made"), None, "{command} ran without its limits");
            assert_eq!(log_all(&ws).len(), before, "{command} recorded something");
        }
    }
    // Unconfined, a limit cannot hold: refused too.
    let out = ws.run(&[
        "run",
        "--isolate",
        "none",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        "touch made",
    ]);
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert_eq!(ws.read("made"), None);
    also_unprivileged("cgroup_limits_are_applied_or_refused_never_dropped");
}

/// Every path under `root` but the sandbox's own mount points, with its type, mode, link target
/// and content hash.
fn rootfs_listing(root: &Path) -> std::collections::BTreeMap<String, String> {
    use std::os::unix::fs::PermissionsExt;
    const MOUNT_POINTS: &[&str] = &["workspace", "run/environment", "tmp/.environment-run"];
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            if MOUNT_POINTS
                .iter()
                .any(|m| rel == *m || rel.starts_with(&format!("{m}/")))
            {
                continue;
            }
            let meta = std::fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode() & 0o7777;
            let what = if meta.is_symlink() {
                format!("link {}", std::fs::read_link(&path).unwrap().display())
            } else if meta.is_dir() {
                stack.push(path.clone());
                format!("dir {mode:o}")
            } else {
                let content = std::fs::read(&path)
                    .map(|b| blake3::hash(&b).to_hex().to_string())
                    .unwrap_or_else(|e| format!("unreadable ({e})"));
                format!("file {mode:o} {content}")
            };
            out.insert(rel, what);
        }
    }
    out
}

/// A package built here, in a file repository the agent can read at /workspace/repo.
fn local_apt_repository(work: &Path) -> bool {
    let pkg = work.join("../pkg/hello-local");
    std::fs::create_dir_all(pkg.join("DEBIAN")).unwrap();
    std::fs::create_dir_all(pkg.join("usr/share/hello-local")).unwrap();
    std::fs::create_dir_all(pkg.join("usr/bin")).unwrap();
    std::fs::write(
        pkg.join("DEBIAN/control"),
        "Package: hello-local\nVersion: 1.0\nArchitecture: all\nMaintainer: Test \
         <test@example.org>\nDescription: a package built by the test\n",
    )
    .unwrap();
    // A maintainer script, as real packages have: dpkg runs it as root inside.
    std::fs::write(
        pkg.join("DEBIAN/postinst"),
        "#!/bin/sh\nset -e\necho configured > /etc/hello-local.conf\n",
    )
    .unwrap();
    std::fs::write(pkg.join("usr/share/hello-local/greeting"), "hello, apt\n").unwrap();
    std::fs::write(
        pkg.join("usr/bin/hello-local"),
        "#!/bin/sh\ncat /usr/share/hello-local/greeting\n",
    )
    .unwrap();
    for script in ["DEBIAN/postinst", "usr/bin/hello-local"] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(pkg.join(script), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let repo = work.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let built = Command::new("dpkg-deb")
        .args(["--build", "--root-owner-group"])
        .arg(&pkg)
        .arg(&repo)
        .output();
    let index = Command::new("dpkg-scanpackages")
        .arg(".")
        .current_dir(&repo)
        .stderr(Stdio::null())
        .output();
    match (built, index) {
        (Ok(b), Ok(i)) if b.status.success() && i.status.success() => {
            std::fs::write(repo.join("Packages"), i.stdout).unwrap();
            true
        }
        (b, i) => {
            common::missing_prerequisite(&format!(
                "dpkg-deb and dpkg-scanpackages (apt-get install dpkg-dev) build the test's \
                 package: {b:?} {i:?}"
            ));
            false
        }
    }
}

/// The Debian minbase rootfs (a tar archive, so that any user can seed from it) that `.ci/run`
/// builds with debootstrap.
const DEBIAN_ROOTFS: &str = "ENVIRONMENT_TEST_DEBIAN_ROOTFS";

/// apt-get works in a managed Debian rootfs with no extra flag, offline, from a repository the
/// test builds, as root and as uid 65534 (one uid inside, no capability: apt cannot switch to
/// `_apt`, dpkg unpacks each file with mode 0 before its chmod); everything it did is captured,
/// and a restore to before it makes the rootfs exactly what it was.
#[test]
fn apt_get_installs_in_a_debian_rootfs_and_a_restore_takes_it_all_back() {
    const TEST: &str = "apt_get_installs_in_a_debian_rootfs_and_a_restore_takes_it_all_back";
    if !sandboxes(TEST) {
        return;
    }
    let Some(tarball) = std::env::var_os(DEBIAN_ROOTFS).filter(|t| Path::new(t).is_file()) else {
        common::missing_prerequisite(&format!(
            "{TEST}: {DEBIAN_ROOTFS} names no Debian rootfs archive (`debootstrap --variant=minbase \
             bookworm DIR && tar -cf debian.tar -C DIR .`, as .ci/run does)"
        ));
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    if !local_apt_repository(&work) {
        return;
    }
    let ws = Ws {
        _tmp: tempfile::tempdir().unwrap(),
        dir: work,
        actor: Some("human:test"),
    };
    ws.ok(&["init", "--rootfs", tarball.to_str().unwrap()]);
    let rootfs = ws.home().join("rootfs");
    let seeded = rootfs_listing(&rootfs);
    let before = ws.json(&["status"])["head"].as_str().unwrap().to_owned();
    let out = ws.run(&[
        "--actor",
        "agent:admin",
        "run",
        "--isolate",
        "rootfs",
        "--network",
        "none",
        "--",
        "sh",
        "-c",
        "set -e; echo 'deb [trusted=yes] file:/workspace/repo ./' > /etc/apt/sources.list; \
         rm -f /etc/apt/sources.list.d/*; apt-get update -q; apt-get install -y -q hello-local; \
         hello-local > said.txt",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(ws.read("said.txt").as_deref(), Some("hello, apt\n"));
    // Installed in the rootfs, as dpkg knows it...
    let status = std::fs::read_to_string(rootfs.join("var/lib/dpkg/status")).unwrap();
    assert!(status.contains("Package: hello-local\nStatus: install ok installed"));
    assert_eq!(
        std::fs::read_to_string(rootfs.join("etc/hello-local.conf")).unwrap(),
        "configured\n"
    );
    // ...and every file of it captured, as the agent's.
    let mut keys: Vec<String> = Vec::new();
    for entry in log_all(&ws).iter().filter(|e| e["actor"] == "agent:admin") {
        let op = ws.json(&["show", entry["id"].as_str().unwrap()]);
        keys.extend(changed_paths(&op).into_iter().map(str::to_owned));
    }
    for path in [
        "usr/bin/hello-local",
        "usr/share/hello-local/greeting",
        "etc/hello-local.conf",
        "var/lib/dpkg/info/hello-local.list",
    ] {
        let key = format!(".environment/rootfs/{path}");
        assert!(
            keys.contains(&key),
            "{key} was not captured as the agent's: {keys:?}"
        );
    }
    // A restore to before the install makes the rootfs exactly what was seeded.
    ws.ok(&["restore", &before]);
    let restored = rootfs_listing(&rootfs);
    let differ: Vec<_> = seeded
        .iter()
        .filter(|(k, v)| restored.get(*k) != Some(*v))
        .map(|(k, _)| k.clone())
        .chain(
            restored
                .keys()
                .filter(|k| !seeded.contains_key(*k))
                .cloned(),
        )
        .collect();
    assert!(
        differ.is_empty(),
        "the restore left these different: {differ:?}"
    );
    also_unprivileged(TEST);
}

/// An error has one kind, and each kind one exit code, whether the command runs on the stores
/// or through the supervisor's socket: a name taken is a conflict (5), an unknown version is not
/// found (3), both ways.
#[test]
fn one_error_has_one_exit_code_through_every_door() {
    let ws = Ws::acting_as(Some("human:test"));
    let script = format!(
        "{BIN} mark m1; {BIN} mark m1; echo \"mark $?\"; \
         {BIN} restore no-such-version; echo \"restore $?\""
    );
    let out = ws.run(&[
        "--actor",
        "agent:kinds",
        "run",
        "--isolate",
        "none",
        "--self-rollback",
        "--",
        "sh",
        "-c",
        &script,
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let said = stdout(&out);
    assert!(
        said.contains("mark 5"),
        "through the socket: {said}{}",
        stderr(&out)
    );
    assert!(said.contains("restore 3"), "through the socket: {said}");
    // The same requests on the stores, with no supervisor.
    ws.fails(&["mark", "m1"], 5);
    ws.fails(&["restore", "no-such-version"], 3);
}
