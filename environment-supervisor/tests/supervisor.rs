//! The supervisor and its control socket: self-rollback by a running agent, authorization of
//! every request, malformed input, agent crashes, rollbacks from outside in both modes, the
//! published schema, and the final capture on shutdown and SIGTERM. The agents are this test
//! binary re-executed with a marker variable (or `sh`). The main scenarios also run as an
//! unprivileged uid.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

// The sandbox's test helpers (trees on disk and in views, running as an unprivileged uid).
#[path = "../../environment-sandbox/tests/common/mod.rs"]
mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{always, both, disk, no_skip, view, write};
use environment_bus::{Bus, BusConfig, GroupOptions};
use environment_core::{
    ActorId, ExecOutcome, ExecRequest, Exit, HistoryOptions, Key, LocalEnvironment, OpFlags,
    Options, ShellExec, StoredOutput, SystemClock,
};
use environment_policy::{GrantScope, Policy, TokenLimits};
use environment_sandbox::isolate::{Bind, IsolationSpec};
use environment_sandbox::{Isolation, Unconfined};
use environment_supervisor::ControlClient;
use environment_supervisor::rpc;
use environment_supervisor::{
    AgentSpec, Method, RollbackMode, ShellHandles, Supervisor, SupervisorConfig,
};
use serde_json::{Value, json};

/// Set in a re-executed copy of this binary: which agent to be.
const ROLE: &str = "ENVIRONMENT_TEST_AGENT_ROLE";
/// Where the agent writes its report (outside the workspace).
const REPORT: &str = "ENVIRONMENT_TEST_AGENT_REPORT";

fn agent() -> ActorId {
    ActorId::new("agent:coder").unwrap()
}

fn human() -> ActorId {
    ActorId::new("human:operator").unwrap()
}

/// A workspace with a few files, and a home beside it (never inside it).
fn layout(dir: &Path) -> (PathBuf, PathBuf) {
    let work = dir.join("work");
    let home = dir.join("home");
    std::fs::create_dir_all(&work).unwrap();
    write(&work, "src/main.rs", b"fn main() {}\n");
    write(&work, "src/lib.rs", b"pub fn answer() -> u32 { 42 }\n");
    write(&work, "config.toml", b"debug = false\n");
    (work, home)
}

fn config(work: &Path, home: &Path) -> SupervisorConfig {
    let mut c = SupervisorConfig::new(home, work, Arc::new(Unconfined::new(work)), agent());
    c.quiet_period = Duration::from_millis(50);
    c.max_wait = Duration::from_millis(500);
    c
}

/// [`config`] with an in-memory policy holding `rules`.
fn governed(work: &Path, home: &Path, rules: &str) -> SupervisorConfig {
    let policy = Arc::new(Policy::in_memory(Arc::new(SystemClock)).unwrap());
    policy.load_rules(rules).unwrap();
    let mut c = config(work, home);
    c.policy = Some(policy);
    c
}

/// This binary, re-executed as the agent `role`.
fn agent_spec(role: &str, report: &Path) -> AgentSpec {
    AgentSpec::new([
        std::env::current_exe().unwrap().into_os_string(),
        "--exact".into(),
        "agent_entry".into(),
        "--nocapture".into(),
        "--test-threads=1".into(),
    ])
    .env(ROLE, role)
    .env(REPORT, report)
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn reopen_and_verify(home: &Path, work: &Path) {
    let env = LocalEnvironment::open(home, Options::default()).unwrap();
    env.verify_deep(&environment_core::ActorId::system())
        .unwrap();
    assert_eq!(
        view(&env, &env.head("main").unwrap()),
        disk(work, &no_skip),
        "the head holds exactly what is on disk"
    );
}

// ---- the agents ----------------------------------------------------------------------------

#[test]
fn agent_entry() {
    // Only as a re-executed agent; a no-op in a normal test run.
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let report = PathBuf::from(std::env::var(REPORT).unwrap());
    match role.as_str() {
        "self-rollback" => self_rollback_agent(&report),
        "die-mid-request" => {
            // Sends a restore and dies before the answer: the supervisor must not care.
            let mut s = UnixStream::connect(std::env::var("ENVIRONMENT_SOCKET").unwrap()).unwrap();
            s.write_all(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"restore\",\"params\":{\"version\":\"main~1\"}}\n")
                .unwrap();
            std::process::abort();
        }
        other => panic!("unknown agent role {other}"),
    }
}

/// Breaks the workspace, asks for a rollback over the socket, checks the files in the same
/// process, and reports its pid before and after.
fn self_rollback_agent(report: &Path) {
    let pid_before = std::process::id();
    let ws = std::env::current_dir().unwrap();
    let mut control = ControlClient::from_env().unwrap();
    let marked = control.mark("before").unwrap();
    assert_eq!(marked.name, "before");

    std::fs::remove_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("config.toml"), "debug = true # broken\n").unwrap();
    std::fs::write(ws.join("junk.txt"), "scratch").unwrap();

    let preview = control.restore("before", true).unwrap();
    assert!(preview.dry_run);
    assert!(preview.steps.writes >= 3, "{preview:?}");
    assert_eq!(preview.steps.remove, ["junk.txt"], "{preview:?}");
    // A preview changes nothing on disk.
    assert!(ws.join("junk.txt").exists());

    let restored = control.restore("before", false).unwrap();
    let version = restored.version.unwrap();
    assert_eq!(restored.restored_to, Some(marked.version));

    // Same process, files back.
    assert_eq!(
        std::fs::read_to_string(ws.join("src/main.rs")).unwrap(),
        "fn main() {}\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("config.toml")).unwrap(),
        "debug = false\n"
    );
    assert!(!ws.join("junk.txt").exists());
    let status = control.status().unwrap();
    assert_eq!(status.head, version);
    std::fs::write(
        report,
        json!({
            "pid_before": pid_before,
            "pid_after": std::process::id(),
            "pid_seen_by_supervisor": status.agent_pid,
            "version": version,
        })
        .to_string(),
    )
    .unwrap();
}

// ---- self-rollback -------------------------------------------------------------------------

fn self_rollback_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let expected = disk(&work, &no_skip);
    let sup = Supervisor::open(config(&work, &home)).unwrap();
    let report = dir.join("report.json");
    let exit = sup.run_agent(agent_spec("self-rollback", &report)).unwrap();
    assert!(exit.success(), "the agent failed: {exit:?}");
    assert_eq!(exit.restarts, 0);
    let r: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    assert_eq!(r["pid_before"], r["pid_after"]);
    assert_eq!(r["pid_before"], exit.pid);
    assert_eq!(r["pid_seen_by_supervisor"], exit.pid);
    assert_eq!(disk(&work, &no_skip), expected);
    let rollback = sup
        .env()
        .op(&sup.env().resolve(r["version"].as_str().unwrap()).unwrap())
        .unwrap();
    assert!(rollback.flags.contains(OpFlags::ROLLBACK));
    assert_eq!(rollback.actor, agent());
    let summary = sup.shutdown().unwrap();
    assert_eq!(summary.rollbacks, 1);
    assert_eq!(summary.denied, 0);
    assert!(summary.requests >= 4);
    assert_eq!(summary.agent.unwrap().pid, exit.pid);
    reopen_and_verify(&home, &work);
}

#[test]
fn an_agent_rolls_itself_back_and_keeps_running() {
    both(
        "an_agent_rolls_itself_back_and_keeps_running",
        always,
        self_rollback_scenario,
    );
}

/// The same, with the agent confined in namespaces: the socket's directory is bound into the
/// sandbox and the agent finds it where `socket_inside` says.
#[test]
fn a_confined_agent_rolls_itself_back_through_the_socket() {
    both(
        "a_confined_agent_rolls_itself_back_through_the_socket",
        common::no_isolation,
        confined_self_rollback_scenario,
    );
}

fn confined_self_rollback_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let expected = disk(&work, &no_skip);
    let (run, out) = (home.join("run"), dir.join("out"));
    std::fs::create_dir_all(&run).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    let mut spec = IsolationSpec::host(&work);
    spec.binds.push(Bind {
        host: run.clone(),
        inside: "/tmp/environment-control".into(),
        writable: true,
    });
    spec.binds.push(Bind {
        host: out.clone(),
        inside: "/tmp/out".into(),
        writable: true,
    });
    // The agent is this test binary: visible inside even when it lives under /tmp, which the
    // sandbox replaces with its own.
    let bin_dir = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    spec.binds.push(Bind::same_path(bin_dir));
    let mut cfg = config(&work, &home);
    cfg.launcher = Arc::new(Isolation::new(spec).unwrap());
    cfg.socket_inside = Some("/tmp/environment-control/control.sock".into());
    let sup = Supervisor::open(cfg).unwrap();
    assert_eq!(sup.socket_path(), run.join("control.sock"));
    let exit = sup
        .run_agent(agent_spec(
            "self-rollback",
            Path::new("/tmp/out/report.json"),
        ))
        .unwrap();
    assert!(exit.success(), "the confined agent failed: {exit:?}");
    let r: Value =
        serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    // Its pid is its namespace's; what matters is that it did not change.
    assert_eq!(r["pid_before"], r["pid_after"]);
    assert_eq!(disk(&work, &no_skip), expected);
    let summary = sup.shutdown().unwrap();
    assert_eq!((summary.rollbacks, summary.denied), (1, 0));
    reopen_and_verify(&home, &work);
}

// ---- authorization -------------------------------------------------------------------------

const RULES: &str = r#"
[[rule]]
id = "supervisor-captures"
effect = "permit"
principal = "service:supervisor"
actions = ["read", "write", "delete"]
resource = "*"

[[rule]]
id = "agent-reads"
effect = "permit"
principal = "agent:coder"
actions = ["read"]
resource = "*"

[[rule]]
id = "agent-rolls-back"
effect = "permit"
principal = "agent:coder"
actions = ["write"]
resource = { branch = "main" }
when = { operation = "restore" }

[[rule]]
id = "agent-restores-files"
effect = "permit"
principal = "agent:coder"
actions = ["write", "delete"]
resource = { path = "**" }
when = { operation = "restore" }

[[rule]]
id = "agent-marks"
effect = "permit"
principal = "agent:coder"
actions = ["write"]
resource = { environment = true }
when = { operation = "mark" }

[[rule]]
id = "agent-tasks"
effect = "permit"
principal = "agent:coder"
actions = ["publish", "consume"]
resource = { topic = "tasks" }

[[rule]]
id = "deploys-need-approval"
effect = "permit"
principal = "agent:coder"
actions = ["publish"]
resource = { topic = "deploy" }
approval_from = ["human:operator"]
"#;

fn blob_count(env: &LocalEnvironment) -> usize {
    env.blobs().list().unwrap().len()
}

fn full_history(env: &LocalEnvironment) -> Vec<String> {
    env.history(
        &ActorId::new("service:supervisor").unwrap(),
        "main",
        &HistoryOptions {
            all: true,
            limit: 10_000,
        },
    )
    .unwrap()
    .iter()
    .map(ToString::to_string)
    .collect()
}

fn denied(e: environment_supervisor::ControlError) -> Value {
    assert_eq!(e.code(), Some(rpc::DENIED), "{e:?}");
    let text = e.for_agent();
    assert!(
        text.starts_with("The action was NOT performed"),
        "the agent-facing text says first that nothing happened: {text}"
    );
    match e {
        environment_supervisor::ControlError::Rpc { data, .. } => data,
        other => panic!("{other:?}"),
    }
}

fn authorization_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let policy = Arc::new(Policy::open(&dir.join("policy.db"), Arc::new(SystemClock)).unwrap());
    policy.load_rules(RULES).unwrap();
    let bus = Bus::open(dir.join("bus.db"), BusConfig::default()).unwrap();
    for t in ["tasks", "deploy"] {
        bus.create_topic(t).wait().unwrap();
    }
    bus.create_group("tasks", &["tasks"], GroupOptions::default())
        .wait()
        .unwrap();
    let mut cfg = config(&work, &home);
    cfg.policy = Some(policy.clone());
    cfg.bus = Some(Arc::new(bus.clone()));
    // The tree is broken below by hand, not by the agent (who may not write it here).
    cfg.capture_actor = ActorId::new("service:supervisor").unwrap();
    let sup = Supervisor::open(cfg).unwrap();
    let env = sup.env().clone();
    let mut c = ControlClient::connect(sup.socket_path()).unwrap();

    // gc is not the agent's to call: refused with the agent-facing text, and nothing changes —
    // not even an orphan blob that a gc would have swept.
    let orphan = env.blobs().put(b"referenced by nothing").unwrap();
    let (history, blobs) = (full_history(&env), blob_count(&env));
    let data = denied(c.call("gc", Value::Null).unwrap_err());
    assert_eq!(data["verdict"], "deny");
    assert!(
        data["for_agent"]
            .as_str()
            .unwrap()
            .contains("no rule permits")
    );
    assert_eq!(full_history(&env), history);
    assert_eq!(blob_count(&env), blobs);
    assert!(env.blobs().contains(&orphan));

    // Writing a file is not the agent's either here: refused, and neither the log nor the tree
    // changes; reading it is allowed.
    let data = denied(
        c.call(
            "file.write",
            serde_json::json!({ "path": "config.toml", "content": "debug = true\n" }),
        )
        .unwrap_err(),
    );
    assert_eq!(data["verdict"], "deny");
    assert_eq!(full_history(&env), history);
    assert_eq!(
        std::fs::read_to_string(work.join("config.toml")).unwrap(),
        "debug = false\n"
    );
    let read = c
        .call("file.read", serde_json::json!({ "path": "config.toml" }))
        .unwrap();
    assert_eq!(read["text"], "debug = false\n");

    // What the rules allow works: history, mark, a restore.
    let good = c.mark("good").unwrap().version;
    assert!(!c.history(10).unwrap().entries.is_empty());
    std::fs::write(work.join("config.toml"), "broken").unwrap();
    let restored = c.restore("good", false).unwrap();
    assert_eq!(restored.restored_to, Some(good));
    assert_eq!(
        std::fs::read_to_string(work.join("config.toml")).unwrap(),
        "debug = false\n"
    );

    // A read-only token: reads pass, the restore its holder could do without it does not.
    let token = policy
        .issue_token(
            "agent:coder",
            TokenLimits {
                actions: Some(vec!["read".into()]),
                ..TokenLimits::default()
            },
        )
        .unwrap()
        .encode();
    let mut scoped = ControlClient::connect(sup.socket_path())
        .unwrap()
        .with_token(Some(token));
    assert!(scoped.status().is_ok());
    assert!(scoped.restore("good", true).is_ok(), "a preview is a read");
    std::fs::write(work.join("config.toml"), "broken again").unwrap();
    sup.capture("break it").unwrap().unwrap();
    let (history, blobs) = (full_history(&env), blob_count(&env));
    let data = denied(scoped.restore("good", false).unwrap_err());
    assert!(
        data["for_agent"].as_str().unwrap().contains("token"),
        "{data}"
    );
    assert_eq!(full_history(&env), history);
    assert_eq!(blob_count(&env), blobs);
    assert_eq!(
        std::fs::read_to_string(work.join("config.toml")).unwrap(),
        "broken again"
    );
    // Nor may a human whom no rule lets restore roll the workspace back from outside.
    let err = sup
        .rollback(&human(), "good", RollbackMode::KeepRunning)
        .unwrap_err();
    assert!(err.to_string().contains("not allowed"), "{err}");
    assert_eq!(full_history(&env), history);
    assert_eq!(
        std::fs::read_to_string(work.join("config.toml")).unwrap(),
        "broken again"
    );
    // A token made for someone else is no good either.
    let foreign = policy
        .issue_token("agent:other", TokenLimits::default())
        .unwrap()
        .encode();
    denied(c.call("status", json!({ "token": foreign })).unwrap_err());

    // The queue, through the same gate.
    let published = c
        .call(
            "queue.publish",
            json!({ "topic": "tasks", "payload": "fix the build" }),
        )
        .unwrap();
    assert_eq!(published["duplicate"], false);
    let leases = c.call("queue.claim", json!({ "group": "tasks" })).unwrap();
    let lease = &leases["leases"][0];
    assert_eq!(lease["payload"], "fix the build");
    assert_eq!(lease["publisher"], "agent:coder");
    c.call("queue.ack", json!({ "receipt": lease["receipt"] }))
        .unwrap();
    let again = c
        .call("queue.ack", json!({ "receipt": lease["receipt"] }))
        .unwrap_err();
    // A settled receipt is stale (a conflict) at every door; an unknown one is not found.
    assert_eq!(again.code(), Some(rpc::CONFLICT), "{again:?}");
    // A deploy needs a human's approval: refused with the approval filed.
    let data = denied(
        c.call(
            "queue.publish",
            json!({ "topic": "deploy", "payload": "v2" }),
        )
        .unwrap_err(),
    );
    assert_eq!(data["verdict"], "needs_approval");
    let approval = data["approval"].as_str().unwrap().to_owned();
    assert_eq!(policy.approval(&approval).unwrap().actor, "agent:coder");
    // Once a human grants it, the agent retries with it — once.
    policy
        .grant(&approval, "human:operator", GrantScope::once())
        .unwrap();
    let deploy = json!({ "topic": "deploy", "payload": "v2", "approval": approval });
    assert_eq!(
        c.call("queue.publish", deploy.clone()).unwrap()["duplicate"],
        false
    );
    denied(c.call("queue.publish", deploy).unwrap_err());
    // The rule that holds a deploy for approval lets the agent ask again (as the deploy itself
    // would file it): a new pending request, the agent's own.
    let asked = c
        .call(
            "approval.request",
            json!({ "action": "publish", "resource": { "topic": "deploy" } }),
        )
        .unwrap();
    assert_eq!(asked["state"], "pending");
    assert_ne!(asked["id"], approval.as_str());
    let filed = policy.approval(asked["id"].as_str().unwrap()).unwrap();
    assert_eq!(filed.actor, "agent:coder");
    // A request the policy does not hold for approval files nothing.
    let before = policy.approvals().len();
    let plain = c
        .call(
            "approval.request",
            json!({ "action": "delete", "resource": { "environment": true } }),
        )
        .unwrap_err();
    assert_eq!(plain.code(), Some(rpc::CONFLICT), "{plain:?}");
    assert_eq!(policy.approvals().len(), before);

    // The agent may ask what it may do (a read of the environment).
    let why = c
        .call(
            "policy.explain",
            json!({ "action": "delete", "resource": { "environment": true }, "operation": "gc" }),
        )
        .unwrap();
    assert_eq!(why["allowed"], false);
    let text = why["explanation"].as_str().unwrap();
    assert!(
        text.starts_with("Denied") && text.contains("Next: "),
        "{text}"
    );
    let may = c
        .call(
            "policy.what_may_i_do",
            json!({ "resource": { "topic": "tasks" } }),
        )
        .unwrap();
    let actions: BTreeSet<&str> = may["permissions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["action"].as_str().unwrap())
        .collect();
    assert!(
        actions.contains("publish") && actions.contains("consume"),
        "{may}"
    );

    let summary = sup.shutdown().unwrap();
    assert!(summary.denied >= 5, "{summary:?}");
    reopen_and_verify(&home, &work);
}

#[test]
fn the_socket_refuses_what_the_policy_does_not_allow() {
    both(
        "the_socket_refuses_what_the_policy_does_not_allow",
        always,
        authorization_scenario,
    );
}

#[test]
fn a_quota_is_spent_once_per_request() {
    both(
        "a_quota_is_spent_once_per_request",
        always,
        a_quota_is_spent_once_per_request_scenario,
    );
}

fn a_quota_is_spent_once_per_request_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let cfg = governed(
        &work,
        &home,
        // The quota is on the branch rule (the first `when`), not on the files a restore writes.
        &RULES.replacen(
            "when = { operation = \"restore\" }",
            "when = { operation = \"restore\" }\nquota = { count = 2, window_secs = 3600 }",
            1,
        ),
    );
    let sup = Supervisor::open(cfg).unwrap();
    let mut c = ControlClient::connect(sup.socket_path()).unwrap();
    c.mark("start").unwrap();
    for _ in 0..2 {
        std::fs::write(work.join("config.toml"), "broken").unwrap();
        c.restore("start", false).unwrap();
    }
    std::fs::write(work.join("config.toml"), "broken").unwrap();
    let data = denied(c.restore("start", false).unwrap_err());
    assert!(
        data["for_agent"].as_str().unwrap().contains("quota"),
        "{data}"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("config.toml")).unwrap(),
        "broken"
    );
    sup.shutdown().unwrap();
}

// ---- malformed requests --------------------------------------------------------------------

struct Raw {
    w: UnixStream,
    r: BufReader<UnixStream>,
}

impl Raw {
    fn connect(path: &Path) -> Raw {
        let w = UnixStream::connect(path).unwrap();
        w.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let r = BufReader::new(w.try_clone().unwrap());
        Raw { w, r }
    }
    fn send(&mut self, line: &[u8]) {
        self.w.write_all(line).unwrap();
        self.w.write_all(b"\n").unwrap();
    }
    fn recv(&mut self) -> Value {
        let mut s = String::new();
        assert!(self.r.read_line(&mut s).unwrap() > 0, "connection closed");
        serde_json::from_str(&s).unwrap()
    }
    fn ask(&mut self, line: &str) -> Value {
        self.send(line.as_bytes());
        self.recv()
    }
}

fn code(v: &Value) -> i64 {
    v["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("no error: {v}"))
}

#[test]
fn malformed_requests_get_errors_and_the_connection_survives() {
    both(
        "malformed_requests_get_errors_and_the_connection_survives",
        always,
        malformed_requests_get_errors_and_the_connection_survives_scenario,
    );
}

fn malformed_requests_get_errors_and_the_connection_survives_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let sup = Supervisor::open(config(&work, &home)).unwrap();
    let mut c = Raw::connect(sup.socket_path());
    let head = sup.env().head("main").unwrap();

    let v = c.ask("this is not json");
    assert_eq!(code(&v), rpc::PARSE_ERROR);
    assert_eq!(v["id"], Value::Null);
    assert!(
        v["error"]["data"]["for_agent"]
            .as_str()
            .unwrap()
            .starts_with("The action was NOT performed")
    );
    assert_eq!(
        code(&c.ask(r#"{"jsonrpc":"2.0","id":1}"#)),
        rpc::INVALID_REQUEST
    );
    let v = c.ask(r#"{"jsonrpc":"1.0","id":2,"method":"status"}"#);
    assert_eq!(
        (code(&v), v["id"].clone()),
        (rpc::INVALID_REQUEST, json!(2))
    );
    assert_eq!(code(&c.ask(r#"[]"#)), rpc::INVALID_REQUEST);
    assert_eq!(
        code(&c.ask(r#"{"jsonrpc":"2.0","id":3,"method":"rm -rf"}"#)),
        rpc::METHOD_NOT_FOUND
    );
    assert_eq!(
        code(&c.ask(r#"{"jsonrpc":"2.0","id":4,"method":"mark","params":["x"]}"#)),
        rpc::INVALID_PARAMS
    );
    assert_eq!(
        code(&c.ask(
            r#"{"jsonrpc":"2.0","id":5,"method":"mark","params":{"name":"x","colour":"red"}}"#
        )),
        rpc::INVALID_PARAMS
    );
    assert_eq!(
        code(&c.ask(r#"{"jsonrpc":"2.0","id":6,"method":"restore","params":{"version":42}}"#)),
        rpc::INVALID_PARAMS
    );
    assert_eq!(
        code(&c.ask(
            r#"{"jsonrpc":"2.0","id":7,"method":"restore","params":{"version":"deadbeef00"}}"#
        )),
        rpc::NOT_FOUND
    );
    assert_eq!(
        code(&c.ask(
            r#"{"jsonrpc":"2.0","id":8,"method":"diff","params":{"from":"main","prefix":"../etc"}}"#
        )),
        rpc::INVALID_PARAMS
    );
    assert_eq!(
        code(&c.ask(r#"{"jsonrpc":"2.0","id":9,"method":"queue.publish","params":{"topic":"t","payload":"p"}}"#)),
        rpc::UNAVAILABLE
    );
    // Nothing of that changed anything.
    assert_eq!(sup.env().head("main").unwrap(), head);
    assert!(sup.env().marks().unwrap().is_empty());

    // An oversized line is refused and skipped.
    let mut huge = br#"{"jsonrpc":"2.0","id":10,"method":"status","params":{"pad":""#.to_vec();
    huge.extend(std::iter::repeat_n(b'x', rpc::MAX_MESSAGE_BYTES + 10));
    huge.extend(br#""}}"#);
    c.send(&huge);
    assert_eq!(code(&c.recv()), rpc::INVALID_REQUEST);

    // A notification is carried out and not answered; a name taken is a conflict.
    c.send(br#"{"jsonrpc":"2.0","method":"mark","params":{"name":"quiet"}}"#);
    let v = c.ask(r#"{"jsonrpc":"2.0","id":11,"method":"mark","params":{"name":"quiet"}}"#);
    assert_eq!((code(&v), v["id"].clone()), (rpc::CONFLICT, json!(11)));
    assert_eq!(sup.env().marks().unwrap().len(), 1);

    // A batch: answers in order, none for its notification.
    let v = c.ask(
        r#"[{"jsonrpc":"2.0","id":"a","method":"status"},{"jsonrpc":"2.0","method":"status"},{"jsonrpc":"2.0","id":"b","method":"nope"}]"#,
    );
    let answers = v.as_array().unwrap();
    assert_eq!(answers.len(), 2);
    assert_eq!(answers[0]["id"], "a");
    assert!(answers[0]["result"]["head"].is_string());
    assert_eq!(
        (code(&answers[1]), answers[1]["id"].clone()),
        (rpc::METHOD_NOT_FOUND, json!("b"))
    );

    // Still the same connection, still answering.
    let v = c.ask(r#"{"jsonrpc":"2.0","id":12,"method":"status"}"#);
    assert_eq!(v["result"]["actor"], "agent:coder");
    sup.shutdown().unwrap();
}

// ---- crashes -------------------------------------------------------------------------------

#[test]
fn an_agent_killed_mid_work_or_mid_request_corrupts_nothing() {
    both(
        "an_agent_killed_mid_work_or_mid_request_corrupts_nothing",
        always,
        an_agent_killed_mid_work_or_mid_request_corrupts_nothing_scenario,
    );
}

fn an_agent_killed_mid_work_or_mid_request_corrupts_nothing_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let sup = Supervisor::open(config(&work, &home)).unwrap();
    // A busy writer, killed with SIGKILL.
    let pid = sup
        .spawn_agent(AgentSpec::new([
            "sh",
            "-c",
            "i=0; while :; do i=$((i+1)); mkdir -p d$((i%7)); echo $i > d$((i%7))/f$((i%13)); rm -f d$((i%5))/f$((i%11)); done",
        ]))
        .unwrap();
    wait_for("the agent's first files", || work.join("d1").exists());
    std::thread::sleep(Duration::from_millis(300));
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::KILL,
    )
    .unwrap();
    let exit = sup.wait_agent().unwrap();
    assert_eq!(exit.signal, Some(9));
    // An agent that dies right after sending a request.
    sup.capture("before the second agent").unwrap();
    let exit = sup
        .run_agent(agent_spec("die-mid-request", &dir.join("unused")))
        .unwrap();
    assert_eq!(exit.signal, Some(6), "{exit:?}");
    // Its request was read whole before it died, so it is carried out all the same.
    wait_for("the dead agent's restore", || {
        let head = sup.env().head("main").unwrap();
        sup.env()
            .op(&head)
            .unwrap()
            .flags
            .contains(OpFlags::ROLLBACK)
    });
    let summary = sup.shutdown().unwrap();
    assert!(summary.captures >= 1);
    assert_eq!(summary.rollbacks, 1, "{summary:?}");
    reopen_and_verify(&home, &work);
}

// ---- rollbacks from outside ----------------------------------------------------------------

fn pids(file: &Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect()
}

fn alive(pid: u32) -> bool {
    rustix::process::test_kill_process(rustix::process::Pid::from_raw(pid as i32).unwrap()).is_ok()
}

fn outside_rollback_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let sup = Supervisor::open(config(&work, &home)).unwrap();
    let good = sup.env().head("main").unwrap();
    let expected = disk(&work, &no_skip);
    let pid_file = dir.join("pids");
    let script = format!("echo $$ >> '{}'; exec sleep 1000", pid_file.display());
    let first = sup
        .spawn_agent(AgentSpec::new(["sh", "-c", &script]))
        .unwrap();
    wait_for("the agent's pid", || pids(&pid_file).len() == 1);
    assert_eq!(pids(&pid_file), [first]);

    // Keep running: the files come back under the same process.
    std::fs::remove_file(work.join("src/lib.rs")).unwrap();
    std::fs::write(work.join("new.txt"), "new").unwrap();
    let r = sup
        .rollback(&human(), &good.to_string(), RollbackMode::KeepRunning)
        .unwrap();
    assert_eq!(r.agent_pid, Some(first));
    assert!(!r.restarted);
    // src/lib.rs written back (and `src` itself, when its recorded mtime differs), new.txt gone.
    assert!((1..=2).contains(&r.writes), "{r:?}");
    assert_eq!(r.removals, 1, "{r:?}");
    assert_eq!(disk(&work, &no_skip), expected);
    assert!(alive(first));
    assert_eq!(sup.agent_pid(), Some(first));

    // Restart: stopped, restored, started again with the same command.
    std::fs::write(work.join("config.toml"), "debug = true\n").unwrap();
    let r = sup
        .rollback(
            &human(),
            &good.to_string(),
            RollbackMode::RestartAgent {
                grace: Duration::from_secs(5),
            },
        )
        .unwrap();
    assert!(r.restarted);
    let second = r.agent_pid.unwrap();
    assert_ne!(second, first);
    assert_eq!(disk(&work, &no_skip), expected);
    wait_for("the restarted agent's pid", || pids(&pid_file).len() == 2);
    assert_eq!(pids(&pid_file), [first, second]);
    assert_eq!(sup.agent_pid(), Some(second));
    let op = sup
        .env()
        .op(&sup.env().resolve(&r.version).unwrap())
        .unwrap();
    assert!(op.flags.contains(OpFlags::ROLLBACK));
    assert_eq!(op.actor, human());

    let summary = sup.shutdown_with_grace(Duration::from_secs(5)).unwrap();
    let exit = summary.agent.unwrap();
    assert_eq!(
        (exit.pid, exit.restarts, exit.signal),
        (second, 1, Some(15))
    );
    assert_eq!(summary.rollbacks, 2);
    assert!(!alive(first) && !alive(second));
    reopen_and_verify(&home, &work);
}

#[test]
fn a_rollback_from_outside_keeps_or_restarts_the_agent() {
    both(
        "a_rollback_from_outside_keeps_or_restarts_the_agent",
        always,
        outside_rollback_scenario,
    );
}

// ---- shutdown ------------------------------------------------------------------------------

#[test]
fn shutdown_takes_a_final_capture() {
    both(
        "shutdown_takes_a_final_capture",
        always,
        shutdown_takes_a_final_capture_scenario,
    );
}

fn shutdown_takes_a_final_capture_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let mut cfg = config(&work, &home);
    // No automatic capture will come before the end.
    cfg.quiet_period = Duration::from_secs(600);
    cfg.max_wait = Duration::from_secs(600);
    let sup = Supervisor::open(cfg).unwrap();
    let before = sup.env().head("main").unwrap();
    let ready = dir.join("ready");
    let script = format!(
        "echo late > late.txt; touch '{}'; exec sleep 1000",
        ready.display()
    );
    sup.spawn_agent(AgentSpec::new(["sh", "-c", &script]))
        .unwrap();
    wait_for("the agent", || ready.exists());
    assert_eq!(sup.env().head("main").unwrap(), before);
    let summary = sup.shutdown_with_grace(Duration::from_secs(5)).unwrap();
    assert_eq!(summary.files_changed, 1);
    assert_eq!(summary.agent.unwrap().signal, Some(15));
    assert_ne!(summary.final_version, before.to_string());
    reopen_and_verify(&home, &work);
}

#[test]
fn a_final_capture_the_policy_refuses_still_lets_the_supervisor_stop() {
    both(
        "a_final_capture_the_policy_refuses_still_lets_the_supervisor_stop",
        always,
        a_final_capture_the_policy_refuses_scenario,
    );
}

/// Captures are the agent's own, and it may not write files. A change still unrecorded when the
/// supervisor stops (here made after the agent's last capture, which is the exit capture's
/// place) is refused to the final capture: shutting down still succeeds and reports it, and the
/// change is put back and kept as the agent's refused change, as after any capture.
fn a_final_capture_the_policy_refuses_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    // The workspace as it starts is recorded by the supervisor's own actor.
    Supervisor::open(governed(&work, &home, RULES))
        .unwrap()
        .shutdown()
        .unwrap();
    let mut cfg = governed(&work, &home, RULES);
    cfg.capture_actor = agent();
    // No automatic capture will come before the end.
    cfg.quiet_period = Duration::from_secs(600);
    cfg.max_wait = Duration::from_secs(600);
    let sup = Supervisor::open(cfg).unwrap();
    let before = sup.env().head("main").unwrap();
    write(&work, "late.txt", b"late\n");
    let summary = sup.shutdown_with_grace(Duration::from_secs(5)).unwrap();
    assert_eq!(summary.final_version, before.to_string());
    assert_eq!((summary.captures, summary.files_changed), (0, 0));
    assert!(!work.join("late.txt").exists(), "put back");
    let named: Vec<_> = summary.refused.iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(named, [PathBuf::from("late.txt")]);
    let env = environment_core::LocalEnvironment::open(&home, Default::default()).unwrap();
    let kept = env.refused(&agent(), "main", 10).unwrap();
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].actor, agent());
    assert_eq!(
        env.content(kept[0].value.as_ref().unwrap()).unwrap(),
        b"late\n"
    );
}

const SUPERVISOR_DIR: &str = "ENVIRONMENT_TEST_SUPERVISOR_DIR";

#[test]
fn supervisor_process_entry() {
    // Only when re-executed by `sigterm_stops_the_supervisor_with_a_final_capture`.
    let Ok(dir) = std::env::var(SUPERVISOR_DIR) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let (work, home) = (dir.join("work"), dir.join("home"));
    let mut cfg = config(&work, &home);
    cfg.quiet_period = Duration::from_secs(600);
    cfg.max_wait = Duration::from_secs(600);
    let sup = Supervisor::open(cfg).unwrap();
    let script = format!(
        "echo late > late.txt; touch '{}'; exec sleep 1000",
        dir.join("agent-ready").display()
    );
    sup.spawn_agent(AgentSpec::new(["sh", "-c", &script]))
        .unwrap();
    let summary = sup.run_until_signal(Duration::from_secs(5)).unwrap();
    std::fs::write(
        dir.join("summary.json"),
        serde_json::to_vec(&summary).unwrap(),
    )
    .unwrap();
}

#[test]
fn sigterm_stops_the_supervisor_with_a_final_capture() {
    both(
        "sigterm_stops_the_supervisor_with_a_final_capture",
        always,
        sigterm_stops_the_supervisor_with_a_final_capture_scenario,
    );
}

fn sigterm_stops_the_supervisor_with_a_final_capture_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "supervisor_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(SUPERVISOR_DIR, dir)
        .spawn()
        .unwrap();
    wait_for("the supervised agent", || dir.join("agent-ready").exists());
    // The handlers are installed right after the agent starts; give them a moment.
    std::thread::sleep(Duration::from_millis(500));
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "the supervisor process failed: {status:?}"
    );
    let summary: Value =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["files_changed"], 1, "{summary}");
    assert_eq!(summary["agent"]["signal"], 15);
    reopen_and_verify(&home, &work);
    assert!(work.join("late.txt").exists());
    assert!(
        !home.join("run/control.sock").exists(),
        "the socket is removed"
    );
}

// ---- setup errors --------------------------------------------------------------------------

#[test]
fn the_home_may_not_live_inside_the_workspace() {
    both(
        "the_home_may_not_live_inside_the_workspace",
        always,
        the_home_may_not_live_inside_the_workspace_scenario,
    );
}

fn the_home_may_not_live_inside_the_workspace_scenario(dir: &Path) {
    let (work, _) = layout(dir);
    let err = Supervisor::open(config(&work, &work.join(".env"))).unwrap_err();
    assert!(err.to_string().contains("inside the workspace"), "{err}");
    let mut cfg = config(&work, &dir.join("home"));
    cfg.socket = Some(work.join("control.sock"));
    assert!(Supervisor::open(cfg).is_err());
    assert!(!work.join("control.sock").exists());
}

#[test]
fn a_second_supervisor_on_the_same_socket_is_refused() {
    both(
        "a_second_supervisor_on_the_same_socket_is_refused",
        always,
        a_second_supervisor_on_the_same_socket_is_refused_scenario,
    );
}

fn a_second_supervisor_on_the_same_socket_is_refused_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let sup = Supervisor::open(config(&work, &home)).unwrap();
    let mut cfg = config(&work, &dir.join("home2"));
    cfg.socket = Some(sup.socket_path().to_owned());
    let err = Supervisor::open(cfg).unwrap_err();
    assert!(err.to_string().contains("in use"), "{err}");
    // Nor is a file that is not a socket replaced.
    let file = dir.join("not-a-socket");
    std::fs::write(&file, "keep me").unwrap();
    let mut cfg = config(&work, &dir.join("home3"));
    cfg.socket = Some(file.clone());
    assert!(Supervisor::open(cfg).is_err());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
    // The first one still answers.
    let mut c = ControlClient::connect(sup.socket_path()).unwrap();
    assert!(c.status().is_ok());
    sup.shutdown().unwrap();
}

// ---- schema --------------------------------------------------------------------------------

#[test]
fn the_schema_and_the_dispatcher_list_the_same_methods() {
    let schema = environment_supervisor::schema();
    let in_schema: BTreeSet<String> = schema["methods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap().to_owned())
        .collect();
    let dispatched: BTreeSet<String> = Method::ALL.iter().map(|m| m.name().to_owned()).collect();
    assert_eq!(in_schema, dispatched);
    for name in &in_schema {
        assert_eq!(
            Method::from_name(name).map(|m| m.name()),
            Some(name.as_str())
        );
    }
    // Every error code the dispatcher can answer with is documented.
    let codes: BTreeSet<i64> = schema["components"]["errors"]
        .as_object()
        .unwrap()
        .values()
        .map(|e| e["code"].as_i64().unwrap())
        .collect();
    let ours = [
        rpc::PARSE_ERROR,
        rpc::INVALID_REQUEST,
        rpc::METHOD_NOT_FOUND,
        rpc::INVALID_PARAMS,
        rpc::INTERNAL_ERROR,
        rpc::DENIED,
        rpc::NOT_FOUND,
        rpc::CONFLICT,
        rpc::UNAVAILABLE,
    ];
    assert_eq!(codes, ours.into_iter().collect());
    // And each method's documented errors resolve to one of them.
    for m in schema["methods"].as_array().unwrap() {
        for e in m["errors"].as_array().unwrap() {
            let r = e["$ref"].as_str().unwrap();
            let name = r.rsplit('/').next().unwrap();
            assert!(schema["components"]["errors"][name].is_object(), "{r}");
        }
        // Every method's params refuse what they do not name, and accept the credentials.
        let params = &m["x-params-schema"];
        assert_eq!(params["additionalProperties"], false, "{}", m["name"]);
        assert!(params["properties"]["token"].is_object(), "{}", m["name"]);
        assert_eq!(m["result"]["schema"]["type"], "object", "{}", m["name"]);
        assert!(!m["summary"].as_str().unwrap().is_empty(), "{}", m["name"]);
    }
    // A method the schema does not list is not dispatched.
    assert!(Method::from_name("rpc.discover").is_none());
}

// ---- shell methods ------------------------------------------------------------------------

/// A stand-in for the sandbox's shell: records what it was asked and answers with output it
/// stored. The supervisor's part — authorization, the actor, the wire format — is what is tested.
struct StubShell {
    env: LocalEnvironment,
    asked: std::sync::Mutex<Vec<ExecRequest>>,
}

#[async_trait::async_trait]
impl ShellExec for StubShell {
    async fn exec(&self, request: ExecRequest) -> environment_core::Result<ExecOutcome> {
        let out = self.env.blobs().put(b"hello\n").unwrap();
        let stored = StoredOutput {
            blob: out,
            total: 6,
            stored: 6,
            truncated: false,
            preview: "hello\n".into(),
        };
        self.asked.lock().unwrap().push(request);
        Ok(ExecOutcome {
            exit: Exit::Code(0),
            stdout: stored.clone(),
            stderr: StoredOutput {
                total: 0,
                stored: 0,
                preview: String::new(),
                blob: self.env.blobs().put(b"").unwrap(),
                truncated: false,
            },
            op: self.env.head("main").unwrap(),
            files_changed: 0,
            duration_ms: 1,
            refused: Vec::new(),
        })
    }
}

#[test]
fn exec_is_authorized_as_the_agent_before_the_shell_sees_it() {
    both(
        "exec_is_authorized_as_the_agent_before_the_shell_sees_it",
        always,
        exec_is_authorized_as_the_agent_before_the_shell_sees_it_scenario,
    );
}

fn exec_is_authorized_as_the_agent_before_the_shell_sees_it_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let rules = format!(
        "{RULES}\n{}",
        r#"
[[rule]]
id = "agent-echoes"
effect = "permit"
principal = "agent:coder"
actions = ["execute"]
resource = { program = "echo", args = ["..."] }
"#
    );
    let mut cfg = governed(&work, &home, &rules);
    cfg.shell = false;
    let sup = Supervisor::open(cfg).unwrap();
    let mut c = ControlClient::connect(sup.socket_path()).unwrap();
    let err = c
        .call("exec", json!({ "argv": ["echo", "hi"] }))
        .unwrap_err();
    assert_eq!(err.code(), Some(rpc::UNAVAILABLE), "{err:?}");

    let stub = Arc::new(StubShell {
        env: sup.env().clone(),
        asked: Default::default(),
    });
    sup.attach_shell(ShellHandles {
        exec: Some(stub.clone()),
        ..ShellHandles::default()
    });
    let out = c
        .call(
            "exec",
            json!({ "argv": ["echo", "hi"], "cwd": "src", "intent": "say hi", "timeout_ms": 5000 }),
        )
        .unwrap();
    assert_eq!(out["success"], true);
    assert_eq!(out["exit"], json!({ "code": 0 }));
    assert_eq!(out["stdout"]["text"], "hello\n");
    {
        let asked = stub.asked.lock().unwrap();
        assert_eq!(asked.len(), 1);
        let r = &asked[0];
        assert_eq!(r.command.actor, agent());
        assert_eq!(r.command.argv, ["echo", "hi"]);
        assert_eq!(r.command.cwd.as_deref(), Some("src"));
        assert_eq!(r.command.intent, "say hi");
        assert_eq!(r.timeout_ms, Some(5000));
    }
    // A program the policy does not allow never reaches the shell.
    let data = denied(
        c.call("exec", json!({ "argv": ["rm", "-rf", "src"] }))
            .unwrap_err(),
    );
    assert!(data["for_agent"].as_str().unwrap().contains("rm"), "{data}");
    // Nor does a request that tries to choose its actor, or has no program.
    for bad in [
        json!({ "argv": ["echo"], "actor": "human:operator" }),
        json!({ "argv": [] }),
        json!({ "argv": ["echo"], "stdin": 3 }),
    ] {
        let err = c.call("exec", bad).unwrap_err();
        assert_eq!(err.code(), Some(rpc::INVALID_PARAMS), "{err:?}");
    }
    assert_eq!(stub.asked.lock().unwrap().len(), 1);
    // Methods whose capability is not attached say so.
    let err = c.call("process.list", Value::Null).unwrap_err();
    assert_eq!(err.code(), Some(rpc::UNAVAILABLE));
    sup.shutdown().unwrap();
}

/// Calls `method` until `until` holds. With `cursor`, each answer carries only what came since
/// the last call (a terminal's reads), and the texts are joined; without, each is whole.
fn poll(
    c: &mut ControlClient,
    method: &str,
    params: Value,
    cursor: bool,
    until: impl Fn(&Value) -> bool,
) -> Value {
    let start = Instant::now();
    let mut seen = String::new();
    loop {
        let mut v = c.call(method, params.clone()).unwrap();
        if cursor {
            seen.push_str(v["text"].as_str().unwrap_or_default());
            v["text"] = json!(seen);
        }
        if until(&v) {
            return v;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{method}: {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_agent_runs_commands_through_the_sandbox_shell() {
    both(
        "the_agent_runs_commands_through_the_sandbox_shell",
        always,
        the_agent_runs_commands_through_the_sandbox_shell_scenario,
    );
}

fn the_agent_runs_commands_through_the_sandbox_shell_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let sup = Supervisor::open(config(&work, &home)).unwrap();
    let mut c = ControlClient::connect(sup.socket_path()).unwrap();

    // A recorded command: output, exit, the file it made attributed to it, as the agent.
    let out = c
        .call(
            "exec",
            json!({ "argv": ["sh", "-c", "echo made > made.txt; echo out; echo err >&2"], "intent": "make a file" }),
        )
        .unwrap();
    assert_eq!(out["success"], true, "{out}");
    assert_eq!(out["stdout"]["text"], "out\n");
    assert_eq!(out["stderr"]["text"], "err\n");
    assert!(out["files_changed"].as_u64().unwrap() >= 1, "{out}");
    assert_eq!(
        std::fs::read_to_string(work.join("made.txt")).unwrap(),
        "made\n"
    );
    let op = c.call("show", json!({ "version": out["op"] })).unwrap();
    assert_eq!(op["actor"], "agent:coder");
    assert_eq!(op["intent"]["text"], "make a file");
    assert!(
        op["summary"]["keys"]
            .as_array()
            .unwrap()
            .contains(&json!("made.txt")),
        "{op}"
    );
    let failed = c.exec(&["sh", "-c", "exit 3"]).unwrap();
    assert_eq!((failed.success, failed.exit), (false, Exit::Code(3)));
    let err = c
        .call("exec", json!({ "argv": ["true"], "cwd": "../.." }))
        .unwrap_err();
    assert_eq!(err.code(), Some(rpc::INVALID_PARAMS), "{err:?}");

    // A background process, read from an offset and waited for.
    let id = c
        .call(
            "process.spawn",
            json!({ "argv": ["sh", "-c", "echo bg; sleep 0.2; echo done"] }),
        )
        .unwrap()["id"]
        .clone();
    let waited = c
        .call("process.wait", json!({ "id": id, "timeout_ms": 30000 }))
        .unwrap();
    assert_eq!(waited["exit"], json!({ "code": 0 }), "{waited}");
    let read = poll(&mut c, "process.read", json!({ "id": id }), false, |v| {
        v["eof"] == true
    });
    assert_eq!(read["text"], "bg\ndone\n");
    let tail = c
        .call("process.read", json!({ "id": id, "offset": 3 }))
        .unwrap();
    assert_eq!(tail["text"], "done\n");
    let list = c.call("process.list", Value::Null).unwrap();
    assert!(
        list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["id"] == id)
    );
    let err = c.call("process.read", json!({ "id": 999 })).unwrap_err();
    assert_eq!(err.code(), Some(rpc::NOT_FOUND), "{err:?}");

    // A terminal session: typed into, read, detached and re-attached, closed.
    let id = c
        .call(
            "pty.open",
            json!({ "argv": ["cat"], "rows": 10, "cols": 40 }),
        )
        .unwrap()["id"]
        .clone();
    c.call("pty.write", json!({ "id": id, "data": "hello\n" }))
        .unwrap();
    poll(&mut c, "pty.read", json!({ "id": id }), true, |v| {
        v["text"].as_str().unwrap().matches("hello").count() >= 2
    });
    c.call("pty.detach", json!({ "id": id })).unwrap();
    c.call("pty.write", json!({ "id": id, "data": "again\n" }))
        .unwrap();
    poll(&mut c, "pty.attach", json!({ "id": id }), true, |v| {
        v["text"].as_str().unwrap().contains("again")
    });
    c.call("pty.resize", json!({ "id": id, "rows": 20, "cols": 100 }))
        .unwrap();
    let sessions = c.call("pty.list", Value::Null).unwrap();
    assert!(
        sessions["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == id && s["rows"] == 20)
    );
    c.call("pty.close", json!({ "id": id })).unwrap();

    let summary = sup.shutdown().unwrap();
    assert!(summary.files_changed >= 1);
    reopen_and_verify(&home, &work);
}

// ---- further tracked roots -------------------------------------------------------------------

#[test]
fn a_rollback_restores_every_tracked_root() {
    both(
        "a_rollback_restores_every_tracked_root",
        always,
        every_tracked_root_scenario,
    );
}

/// A managed rootfs tracked beside the workspace: broken together, restored together by one
/// rollback, and its changes captured at shutdown.
fn every_tracked_root_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let rootfs = dir.join("rootfs");
    write(&rootfs, "etc/passwd", b"root:x:0:0::/root:/bin/sh\n");
    write(&rootfs, "bin/tool", b"#!/bin/sh\necho tool\n");
    let mut cfg = config(&work, &home);
    cfg.extra_roots.push(environment_supervisor::TrackedRoot {
        path: rootfs.clone(),
        key_prefix: b"rootfs".to_vec(),
        noise: None,
    });
    let sup = Supervisor::open(cfg).unwrap();
    let good = sup.capture("all set").unwrap();
    let good = good.unwrap_or_else(|| sup.env().head("main").unwrap());
    let (work_before, root_before) = (disk(&work, &no_skip), disk(&rootfs, &no_skip));
    assert!(
        sup.env()
            .read_unchecked(&Key::fs("rootfs/etc/passwd").unwrap(), &good)
            .unwrap()
            .is_some(),
        "the rootfs is tracked under its prefix"
    );

    std::fs::remove_file(rootfs.join("bin/tool")).unwrap();
    write(&rootfs, "etc/passwd", b"clobbered\n");
    write(&work, "config.toml", b"debug = true\n");
    let rb = sup
        .rollback(&human(), &good.to_string(), RollbackMode::KeepRunning)
        .unwrap();
    assert!(rb.writes >= 3, "{rb:?}");
    assert_eq!(disk(&work, &no_skip), work_before);
    assert_eq!(disk(&rootfs, &no_skip), root_before);

    write(&rootfs, "etc/motd", b"hello\n");
    let summary = sup.shutdown().unwrap();
    let env = LocalEnvironment::open(&home, Options::default()).unwrap();
    let last: environment_core::OpId = env.resolve(&summary.final_version).unwrap();
    assert!(
        env.read_unchecked(&Key::fs("rootfs/etc/motd").unwrap(), &last)
            .unwrap()
            .is_some(),
        "the final capture takes the rootfs too"
    );
    env.verify_deep(&environment_core::ActorId::system())
        .unwrap();
}

// ---- merge through the socket ------------------------------------------------------------------

#[test]
fn a_merge_through_the_socket_lands_in_the_tree() {
    both(
        "a_merge_through_the_socket_lands_in_the_tree",
        always,
        merge_scenario,
    );
}

fn merge_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let sup = Supervisor::open(config(&work, &home)).unwrap();
    let env = sup.env().clone();
    let head = env.head("main").unwrap();
    env.create_branch(&human(), "feature", &head).unwrap();
    env.act_blocking(
        environment_core::ActRequest::new(human(), environment_core::Intent::edit("feature"))
            .on("feature")
            .put(
                Key::fs("src/feature.rs").unwrap(),
                environment_core::Value::file("pub fn feature() {}\n"),
            ),
    )
    .unwrap();
    let mut client = ControlClient::connect(sup.socket_path()).unwrap();
    let merged = client
        .call("merge", serde_json::json!({ "source": "feature" }))
        .unwrap();
    assert_eq!(merged["noop"], false, "{merged}");
    assert_eq!(
        std::fs::read_to_string(work.join("src/feature.rs")).unwrap(),
        "pub fn feature() {}\n"
    );
    assert_eq!(merged["version"], env.head("main").unwrap().to_string());
    // An unknown branch is refused and nothing changes.
    let before = env.head("main").unwrap();
    assert!(
        client
            .call("merge", serde_json::json!({ "source": "no-such" }))
            .is_err()
    );
    assert_eq!(env.head("main").unwrap(), before);
    drop(client);
    sup.shutdown().unwrap();
    reopen_and_verify(&home, &work);
}

// ---- files through the socket ------------------------------------------------------------------

#[test]
fn files_are_read_listed_and_written_through_the_socket() {
    both(
        "files_are_read_listed_and_written_through_the_socket",
        always,
        files_scenario,
    );
}

fn files_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let sup = Supervisor::open(config(&work, &home)).unwrap();
    let env = sup.env().clone();
    let mut client = ControlClient::connect(sup.socket_path()).unwrap();
    // A change made behind the supervisor's back is read at once (captured first).
    write(&work, "config.toml", b"debug = true\n");
    let read = client
        .call("file.read", serde_json::json!({ "path": "config.toml" }))
        .unwrap();
    assert_eq!(read["text"], "debug = true\n", "{read}");
    let listed = client
        .call("file.list", serde_json::json!({ "prefix": "src" }))
        .unwrap();
    let paths: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["src", "src/lib.rs", "src/main.rs"], "{listed}");

    let written = client
        .call(
            "file.write",
            serde_json::json!({ "path": "docs/new/notes.md", "content": "hello\n" }),
        )
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(work.join("docs/new/notes.md")).unwrap(),
        "hello\n"
    );
    let op = env.op(&env.head("main").unwrap()).unwrap();
    assert_eq!(written["version"], op.id.to_string());
    assert_eq!(op.actor, agent(), "the write is the socket actor's");
    // An older version is still readable.
    let old = client
        .call(
            "file.read",
            serde_json::json!({ "path": "config.toml", "version": "main~2" }),
        )
        .unwrap();
    assert_eq!(old["text"], "debug = false\n", "{old}");

    // Bad paths change nothing.
    let head = env.head("main").unwrap();
    for path in ["../outside", "/etc/passwd", "a/./b"] {
        assert!(
            client
                .call(
                    "file.write",
                    serde_json::json!({ "path": path, "content": "x" })
                )
                .is_err(),
            "{path}"
        );
    }
    assert!(
        client
            .call("file.read", serde_json::json!({ "path": "no/such/file" }))
            .is_err()
    );
    assert_eq!(env.head("main").unwrap(), head);
    assert!(!dir.join("outside").exists());
    drop(client);
    sup.shutdown().unwrap();
    reopen_and_verify(&home, &work);
}

#[test]
fn a_connection_flood_leaves_every_change_captured_with_its_actor() {
    both(
        "a_connection_flood_leaves_every_change_captured_with_its_actor",
        always,
        connection_flood_scenario,
    );
}

/// 20,000 connections, thousands of them held open at once, while a file is written: the
/// socket takes no more than its limit, the change is captured as the capture actor's, and the
/// socket answers again once the flood is over.
fn connection_flood_scenario(dir: &Path) {
    let (work, home) = layout(dir);
    let cfg = config(&work, &home);
    let limit = cfg.control_limits.max_connections;
    let capture_actor = cfg.capture_actor.clone();
    let sup = Supervisor::open(cfg).unwrap();
    let before = sup.env().head("main").unwrap();
    let socket = sup.socket_path().to_path_buf();
    let flood = std::thread::spawn(move || {
        let mut held = std::collections::VecDeque::new();
        let (mut refused, mut failed) = (0usize, 0usize);
        for _ in 0..20_000 {
            match UnixStream::connect(&socket) {
                Ok(s) => held.push_back(s),
                Err(_) => failed += 1,
            }
            if held.len() >= 2_000 {
                let mut s: UnixStream = held.pop_front().unwrap();
                s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
                let mut buf = [0u8; 256];
                if matches!(std::io::Read::read(&mut s, &mut buf), Ok(n) if n > 0) {
                    refused += 1;
                }
            }
        }
        (refused, failed)
    });
    std::thread::sleep(Duration::from_millis(50));
    write(
        &work,
        "during-flood.txt",
        b"written while the socket was flooded\n",
    );
    let (refused, failed) = flood.join().unwrap();
    assert!(
        refused + failed > 0,
        "connections past the limit of {limit} were refused"
    );
    wait_for("the capture of the file written during the flood", || {
        view(sup.env(), &sup.env().head("main").unwrap()).contains_key("during-flood.txt")
    });
    let head = sup.env().head("main").unwrap();
    assert_ne!(head, before);
    assert_eq!(sup.env().op(&head).unwrap().actor, capture_actor);
    // The socket serves again, once it has seen the flood's connections close.
    wait_for("the socket to serve again", || {
        ControlClient::connect(sup.socket_path())
            .and_then(|mut c| c.call("status", json!({})))
            .is_ok()
    });
    sup.shutdown_with_grace(Duration::from_secs(5)).unwrap();
    reopen_and_verify(&home, &work);
}

/// The automatic captures of a run name the agent's command, so the history says what made
/// the change.
#[test]
fn automatic_captures_name_the_agents_command() {
    let dir = tempfile::tempdir().unwrap();
    let (work, home) = layout(dir.path());
    let sup = Supervisor::open(config(&work, &home)).unwrap();
    sup.spawn_agent(AgentSpec::new([
        "sh",
        "-c",
        "echo made > auto.txt; exec sleep 30",
    ]))
    .unwrap();
    wait_for("the automatic capture", || {
        view(sup.env(), &sup.env().head("main").unwrap()).contains_key("auto.txt")
    });
    let op = sup.env().op(&sup.env().head("main").unwrap()).unwrap();
    assert!(
        op.intent
            .text
            .contains("`sh -c echo made > auto.txt; exec sleep 30`"),
        "{}",
        op.intent.text
    );
    sup.shutdown_with_grace(Duration::from_secs(5)).unwrap();
}
