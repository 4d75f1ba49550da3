//! The workspace service answers the same through every door: one set of test bodies runs
//! every use case in process (`Workspace::call`) and through the supervisor's control socket,
//! on two workspaces made alike, and the two transcripts (answers with their ids and paths
//! normalized, or error kinds with what they did to the disk and the log) must be equal. Each
//! body also checks its outcomes on disk and in the log, so a door that agrees with the other
//! on a wrong answer still fails.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

// The sandbox's test helpers (trees on disk and in views, running as an unprivileged uid).
#[path = "../../environment-sandbox/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use common::{always, both, disk, no_skip, view, write};
use environment_bus::{Bus, BusConfig, GroupOptions};
use environment_core::{ActorId, ErrorKind, LocalEnvironment, Options, SystemClock};
use environment_policy::Policy;
use environment_sandbox::Unconfined;
use environment_supervisor::{ControlClient, ControlError, Supervisor, SupervisorConfig, rpc};
use environment_workspace::{Method, ServiceError};
use serde_json::{Value, json};

fn agent() -> ActorId {
    ActorId::new("agent:coder").unwrap()
}

/// The agent may do anything but write under `secrets/`, and publishing to `deploy` needs a
/// human's approval.
const RULES: &str = r#"
[[rule]]
id = "supervisor-captures"
effect = "permit"
principal = "service:supervisor"
actions = ["read", "write", "delete"]
resource = "*"

[[rule]]
id = "agent-works"
effect = "permit"
principal = "agent:coder"
actions = ["read", "write", "delete", "execute"]
resource = "*"

[[rule]]
id = "agent-tasks"
effect = "permit"
principal = "agent:coder"
actions = ["publish", "consume"]
resource = { topic = "tasks" }

[[rule]]
id = "agent-audits"
effect = "permit"
principal = "agent:coder"
actions = ["consume"]
resource = { topic = "audit" }

[[rule]]
id = "operator-works"
effect = "permit"
principal = "human:operator"
actions = ["read", "write", "delete"]
resource = "*"

[[rule]]
id = "no-secrets"
effect = "forbid"
principal = "agent:coder"
actions = ["write", "delete"]
resource = { path = "secrets/**" }

[[rule]]
id = "deploys-need-approval"
effect = "permit"
principal = "agent:coder"
actions = ["publish"]
resource = { topic = "deploy" }
approval_from = ["human:operator"]
"#;

/// A governed supervisor over a small workspace under `rules`, with a queue, and its policy.
fn open(dir: &Path, rules: &str) -> (Supervisor, PathBuf, PathBuf, Arc<Policy>) {
    let work = dir.join("work");
    let home = dir.join("home");
    std::fs::create_dir_all(&work).unwrap();
    write(&work, "src/main.rs", b"fn main() {}\n");
    write(&work, "config.toml", b"debug = false\n");
    write(&work, "secrets/token", b"s3cr3t\n");
    let policy = Arc::new(Policy::in_memory(Arc::new(SystemClock)).unwrap());
    policy.load_rules(rules).unwrap();
    let mut c = SupervisorConfig::new(&home, &work, Arc::new(Unconfined::new(&work)), agent());
    // Captures happen at the use cases' own barriers only, never on a timer that the two runs
    // would see fire at different moments.
    c.quiet_period = Duration::from_secs(600);
    c.max_wait = Duration::from_secs(1200);
    c.policy = Some(policy.clone());
    std::fs::create_dir_all(&home).unwrap();
    let bus = Bus::open(home.join("bus.db"), BusConfig::default()).unwrap();
    bus.create_topic("tasks").wait().unwrap();
    bus.create_group("tasks", &["tasks"], GroupOptions::default())
        .wait()
        .unwrap();
    c.bus = Some(Arc::new(bus));
    (Supervisor::open(c).unwrap(), work, home, policy)
}

/// What a door answered: the result, or the error's kind and details.
type Answer = Result<Value, (ErrorKind, Value)>;

/// A way to call the workspace service.
trait Door {
    fn call(&mut self, method: &str, params: Value) -> Answer;
}

/// In process: the service's own entry point.
struct InProcess(Arc<environment_workspace::Workspace>);

impl Door for InProcess {
    fn call(&mut self, method: &str, params: Value) -> Answer {
        let Value::Object(params) = params else {
            panic!("params are an object")
        };
        let m = Method::from_name(method).unwrap();
        self.0
            .call(m, params)
            .map_err(|e: ServiceError| (e.kind(), e.data))
    }
}

/// Through the control socket.
struct Socket(ControlClient);

impl Door for Socket {
    fn call(&mut self, method: &str, params: Value) -> Answer {
        self.0.call(method, params).map_err(|e| match e {
            ControlError::Rpc { code, mut data, .. } => {
                let kind = rpc::kind_of_error(code, &data);
                // The wire names the kind in the details too; it is compared as the kind.
                data.as_object_mut().unwrap().remove("kind");
                (kind, data)
            }
            other => panic!("the socket failed: {other}"),
        })
    }
}

/// One use case's outcome in the transcript: the answer with everything that differs between
/// two workspaces made alike (ids, versions, times, paths of the temporary directory) blanked.
fn normalized(v: &Value, dir: &Path) -> Value {
    match v {
        Value::String(s) => {
            let s = s.replace(&dir.display().to_string(), "<dir>");
            let hexish = s.len() >= 12 && s.chars().all(|c| c.is_ascii_hexdigit());
            Value::String(if hexish { "<id>".into() } else { blank_ids(&s) })
        }
        Value::Array(items) => Value::Array(items.iter().map(|i| normalized(i, dir)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let blank = k.ends_with("_ms")
                        || matches!(
                            k.as_str(),
                            "time"
                                | "at"
                                | "started"
                                | "ended"
                                | "duration_ms"
                                | "id"
                                | "receipt"
                                | "pid"
                                | "agent_pid"
                                | "policy_version"
                                | "lease_until_ms"
                                | "created"
                                | "requests"
                                | "first_time"
                        );
                    let v = if blank && !v.is_null() {
                        json!("<varies>")
                    } else {
                        normalized(v, dir)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Blanks the runs of 12 or more hex digits in a text (ids quoted in messages).
fn blank_ids(s: &str) -> String {
    let mut out = String::new();
    let mut run = String::new();
    for c in s.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_hexdigit() {
            run.push(c);
            continue;
        }
        if run.len() >= 12 {
            out.push_str("<id>");
        } else {
            out.push_str(&run);
        }
        run.clear();
        out.push(c);
    }
    out.pop();
    out
}

/// Records each call's normalized outcome.
struct Transcript<'a> {
    door: &'a mut dyn Door,
    dir: PathBuf,
    lines: Vec<(String, Value)>,
}

impl Transcript<'_> {
    fn call(&mut self, method: &str, params: Value) -> Answer {
        let answer = self.door.call(method, params.clone());
        if let Ok(v) = &answer {
            // The published contract describes what the dispatcher took and gave.
            let c = Method::from_name(method).unwrap().contract();
            for (what, schema, value) in [("params", &c.params, &params), ("answer", &c.result, v)]
            {
                let validator = jsonschema::validator_for(schema).unwrap();
                let errors: Vec<String> = validator
                    .iter_errors(value)
                    .map(|e| e.to_string())
                    .collect();
                assert!(
                    errors.is_empty(),
                    "{method} {params}: the {what} break the schema: {errors:?}\n{value}"
                );
            }
        }
        let shown = match &answer {
            Ok(v) => json!({ "ok": normalized(v, &self.dir) }),
            Err((kind, data)) => json!({ "error": kind, "data": normalized(data, &self.dir) }),
        };
        self.lines.push((format!("{method} {params}"), shown));
        answer
    }

    fn ok(&mut self, method: &str, params: Value) -> Value {
        self.call(method, params.clone())
            .unwrap_or_else(|e| panic!("{method} {params}: {e:?}"))
    }

    fn refused(&mut self, method: &str, params: Value, kind: ErrorKind) {
        match self.call(method, params.clone()) {
            Err((k, _)) => assert_eq!(k, kind, "{method} {params}"),
            Ok(v) => panic!("{method} {params} was not refused: {v}"),
        }
    }
}

/// Every use case, with its outcomes checked on disk and in the log.
fn body(t: &mut Transcript<'_>, env: &LocalEnvironment, work: &Path) {
    let first = env.head("main").unwrap();

    // Files: read, list, write; a write is the agent's operation and lands on disk.
    write(work, "config.toml", b"debug = true\n");
    let read = t.ok("file.read", json!({ "path": "config.toml" }));
    assert_eq!(read["text"], "debug = true\n");
    t.ok("file.list", json!({ "prefix": "src" }));
    let written = t.ok(
        "file.write",
        json!({ "path": "docs/notes.md", "content": "hello\n" }),
    );
    assert_eq!(
        std::fs::read_to_string(work.join("docs/notes.md")).unwrap(),
        "hello\n"
    );
    let op = env.op(&env.head("main").unwrap()).unwrap();
    assert_eq!(written["version"], op.id.to_string());
    assert_eq!(op.actor, agent());
    // What the write did to the file, line by line, and the two sides by size and hash.
    write(work, "docs/notes.md", b"hello\nworld\n");
    let diff = t.ok(
        "file.diff",
        json!({ "path": "docs/notes.md", "from": written["version"] }),
    );
    assert_eq!(diff["text"], true, "{diff}");
    assert_eq!(
        diff["hunks"][0]["lines"],
        json!([{ "op": "keep", "text": "hello" }, { "op": "add", "text": "world" }]),
        "{diff}"
    );
    assert_eq!(diff["before"]["size"], 6);
    assert_eq!(diff["after"]["size"], 12);
    assert_ne!(diff["before"]["hash"], diff["after"]["hash"]);
    t.refused(
        "file.diff",
        json!({ "path": "../outside", "from": written["version"] }),
        ErrorKind::Invalid,
    );
    t.refused(
        "file.diff",
        json!({ "path": "docs/notes.md", "from": "no-such-mark" }),
        ErrorKind::NotFound,
    );

    // A refusal changes nothing, on disk or in the log.
    let head = env.head("main").unwrap();
    t.refused(
        "file.write",
        json!({ "path": "secrets/token", "content": "leaked\n" }),
        ErrorKind::Denied,
    );
    t.refused(
        "file.write",
        json!({ "path": "../outside", "content": "x" }),
        ErrorKind::Invalid,
    );
    t.refused(
        "file.read",
        json!({ "path": "config.toml", "dryRun": true }),
        ErrorKind::Invalid,
    );
    t.refused(
        "file.read",
        json!({ "path": "no/such" }),
        ErrorKind::NotFound,
    );
    t.refused(
        "show",
        json!({ "version": "0000000000000" }),
        ErrorKind::NotFound,
    );
    assert_eq!(env.head("main").unwrap(), head);
    assert_eq!(
        std::fs::read_to_string(work.join("secrets/token")).unwrap(),
        "s3cr3t\n"
    );

    // Versions: history, show, diff, marks, status, refused.
    t.ok("history", json!({ "limit": 10 }));
    t.ok("show", json!({ "version": head.to_string() }));
    let diff = t.ok("diff", json!({ "from": first.to_string() }));
    assert!(diff.to_string().contains("docs/notes.md"), "{diff}");
    t.ok("mark", json!({ "name": "good" }));
    t.refused("mark", json!({ "name": "good" }), ErrorKind::Conflict);
    t.ok("status", json!({}));
    t.ok("refused", json!({}));
    let marks = t.ok("marks", json!({}));
    assert_eq!(marks["marks"][0]["name"], "good", "{marks}");
    t.ok("branch.create", json!({ "name": "try", "from": "good" }));
    t.refused(
        "branch.create",
        json!({ "name": "try" }),
        ErrorKind::Conflict,
    );
    let branches = t.ok("branch.list", json!({}));
    assert!(branches.to_string().contains("\"try\""), "{branches}");
    let start = env.op(&env.head("try").unwrap()).unwrap();
    assert_eq!(start.parents, vec![env.resolve("good").unwrap()]);

    // A delete is the agent's operation; one it may not make, or of nothing, changes nothing.
    std::fs::write(work.join("scratch.txt"), "tmp\n").unwrap();
    let deleted = t.ok("file.delete", json!({ "path": "scratch.txt" }));
    assert!(!work.join("scratch.txt").exists());
    let op = env.op(&env.head("main").unwrap()).unwrap();
    assert_eq!(deleted["version"], op.id.to_string());
    assert_eq!(op.actor, agent());
    let head = env.head("main").unwrap();
    t.refused(
        "file.delete",
        json!({ "path": "secrets/token" }),
        ErrorKind::Denied,
    );
    t.refused(
        "file.delete",
        json!({ "path": "scratch.txt" }),
        ErrorKind::NotFound,
    );
    t.refused("file.delete", json!({ "path": "src" }), ErrorKind::Invalid);
    assert_eq!(env.head("main").unwrap(), head);
    assert!(work.join("secrets/token").exists() && work.join("src").is_dir());

    // Restore (previewed, then done), undo and redo, each checked on disk.
    std::fs::remove_file(work.join("config.toml")).unwrap();
    let plan = t.ok("restore", json!({ "version": "good", "dry_run": true }));
    assert!(
        !work.join("config.toml").exists(),
        "a preview writes nothing: {plan}"
    );
    t.ok("restore", json!({ "version": "good" }));
    assert_eq!(
        std::fs::read_to_string(work.join("config.toml")).unwrap(),
        "debug = true\n"
    );
    t.ok("undo", json!({}));
    assert!(!work.join("config.toml").exists());
    t.ok("redo", json!({}));
    assert!(work.join("config.toml").exists());

    // Merge a branch made by someone else.
    let base = env.head("main").unwrap();
    env.create_branch(&agent(), "feature", &base).unwrap();
    let other = ActorId::new("human:operator").unwrap();
    env.act_blocking(
        environment_core::ActRequest::new(
            other,
            environment_core::Intent::new(environment_core::IntentKind::Edit, "add a file"),
        )
        .on("feature")
        .put(
            environment_core::Key::fs("feature.txt").unwrap(),
            environment_core::Value::file(b"from the branch\n".to_vec()),
        ),
    )
    .unwrap();
    t.ok("merge", json!({ "source": "feature" }));
    assert_eq!(
        std::fs::read_to_string(work.join("feature.txt")).unwrap(),
        "from the branch\n"
    );

    // The queue: publish, claim, ack, nack; a publish that needs an approval changes nothing.
    t.ok(
        "queue.publish",
        json!({ "topic": "tasks", "payload": "one" }),
    );
    t.ok(
        "queue.publish",
        json!({ "topic": "tasks", "payload": "two" }),
    );
    let claimed = t.ok("queue.claim", json!({ "group": "tasks", "max": 1 }));
    let receipt = claimed["leases"][0]["receipt"].as_str().unwrap().to_owned();
    t.ok(
        "queue.extend",
        json!({ "receipt": receipt, "lease_ms": 60000 }),
    );
    // The board's view: the lease in flight, its holder, its attempt.
    let leases = t.ok("queue.leases", json!({ "group": "tasks" }));
    assert_eq!(leases["leases"].as_array().unwrap().len(), 1, "{leases}");
    let lease = &leases["leases"][0];
    assert_eq!(lease["message_id"], claimed["leases"][0]["message_id"]);
    assert_eq!(lease["consumer"], agent().as_str());
    assert_eq!(lease["attempt"], 1);
    t.ok("queue.leases", json!({}));
    t.ok("queue.ack", json!({ "receipt": receipt }));
    let settled = t.ok("queue.leases", json!({ "group": "tasks" }));
    assert_eq!(
        settled["leases"],
        json!([]),
        "an acked lease is no longer in flight"
    );
    // Settled: the same receipt is stale (a conflict); a made-up one is not found.
    t.refused(
        "queue.ack",
        json!({ "receipt": receipt }),
        ErrorKind::Conflict,
    );
    t.refused(
        "queue.ack",
        json!({ "receipt": "99.0000000000000abc" }),
        ErrorKind::NotFound,
    );
    let claimed = t.ok("queue.claim", json!({ "group": "tasks", "max": 1 }));
    let receipt = claimed["leases"][0]["receipt"].as_str().unwrap().to_owned();
    t.ok(
        "queue.nack",
        json!({ "receipt": receipt, "delay_ms": 60000 }),
    );
    // A worker's cycle in two steps: the ack of what is done takes what is next.
    for payload in ["three", "four"] {
        t.ok(
            "queue.publish",
            json!({ "topic": "tasks", "payload": payload }),
        );
    }
    let claimed = t.ok("queue.claim", json!({ "group": "tasks", "max": 1 }));
    assert_eq!(claimed["leases"][0]["payload"], "three", "{claimed}");
    let receipt = claimed["leases"][0]["receipt"].as_str().unwrap().to_owned();
    let cycled = t.ok("queue.ack", json!({ "receipt": receipt, "next": 1 }));
    assert_eq!(cycled["leases"][0]["payload"], "four", "{cycled}");
    t.refused(
        "queue.ack",
        json!({ "receipt": receipt, "next": 1 }),
        ErrorKind::Conflict,
    );
    let next = cycled["leases"][0]["receipt"].as_str().unwrap().to_owned();
    t.ok("queue.ack", json!({ "receipt": next }));
    t.ok(
        "queue.subscribe",
        json!({ "group": "audit", "topics": ["tasks"] }),
    );
    t.refused(
        "queue.subscribe",
        json!({ "group": "spies", "topics": ["deploy"] }),
        ErrorKind::Denied,
    );
    let dead = t.ok("queue.dead", json!({ "group": "tasks" }));
    assert_eq!(dead["dead"], json!([]), "{dead}");
    t.ok("queue.redrive", json!({ "group": "tasks" }));
    let stats = t.ok("queue.stats", json!({}));
    assert!(stats.to_string().contains("\"audit\""), "{stats}");
    t.refused(
        "queue.publish",
        json!({ "topic": "deploy", "payload": "now" }),
        ErrorKind::NeedsApproval,
    );

    // The policy: explain, what may I do, request an approval.
    t.ok(
        "policy.explain",
        json!({ "action": "write", "resource": { "path": "secrets/token" } }),
    );
    t.ok(
        "policy.what_may_i_do",
        json!({ "resource": { "prefix": "src" } }),
    );
    let asked = t.ok(
        "approval.request",
        json!({ "action": "publish", "resource": { "topic": "deploy" } }),
    );
    let status = t.ok("approval.status", json!({ "id": asked["id"] }));
    assert_eq!(status["state"], "pending", "{status}");
    t.refused(
        "approval.status",
        json!({ "id": "apr-nobody-asked" }),
        ErrorKind::NotFound,
    );
    // Only an approver the request names may decide it; the agent that asked may not.
    t.refused(
        "approval.grant",
        json!({ "id": asked["id"] }),
        ErrorKind::Denied,
    );
    t.refused(
        "approval.reject",
        json!({ "id": asked["id"] }),
        ErrorKind::Denied,
    );
    let still = t.ok("approval.status", json!({ "id": asked["id"] }));
    assert_eq!(still["state"], "pending", "{still}");
    let listed = t.ok("approval.list", json!({}));
    assert_eq!(listed["approvals"][0]["id"], asked["id"], "{listed}");
    // About another actor, a read of the policy (the agent reads everything here).
    let theirs = t.ok(
        "policy.explain",
        json!({ "actor": "human:operator", "action": "write", "resource": { "path": "secrets/token" } }),
    );
    assert_eq!(theirs["allowed"], true, "{theirs}");

    // Administration (the agent may write the environment under these rules): a rule file
    // with issues changes nothing; a good one is a new version.
    t.refused(
        "policy.load",
        json!({ "rules": "[[rule]]\nid = \"x\"\neffect = \"maybe\"\n" }),
        ErrorKind::Invalid,
    );
    let loaded = t.ok("policy.load", json!({ "rules": RULES }));
    assert_eq!(loaded["rules"], 7, "{loaded}");
    let joined = t.ok(
        "policy.member",
        json!({ "member": "agent:coder", "group": "group:reviewers" }),
    );
    assert_eq!(
        joined["version"],
        loaded["version"].as_u64().unwrap() + 1,
        "{joined}"
    );

    // Effects: begun once under a key, settled, and never performed twice.
    let deploy = json!({ "key": "deploy-1", "target": "https://deploy.example", "request": "v1" });
    let begun = t.ok("effect.begin", deploy.clone());
    assert_eq!(begun["outcome"], "new", "{begun}");
    let again = t.ok("effect.begin", deploy.clone());
    assert_eq!(again["outcome"], "in_flight", "{again}");
    let open = t.ok("effect.list", json!({ "unfinished": true }));
    assert_eq!(open["effects"][0]["key"], "deploy-1", "{open}");
    t.ok(
        "effect.complete",
        json!({ "id": begun["effect"]["id"], "result": "deployed" }),
    );
    let done = t.ok("effect.begin", deploy);
    assert_eq!(
        (done["outcome"].clone(), done["effect"]["result"].clone()),
        (json!("already_done"), json!("deployed"))
    );
    t.refused(
        "effect.fail",
        json!({ "id": 999_999, "error": "never begun" }),
        ErrorKind::NotFound,
    );
    t.refused(
        "effect.complete",
        json!({ "id": begun["effect"]["id"], "error": "both" }),
        ErrorKind::Invalid,
    );
    t.ok("effect.list", json!({}));

    // The stores check out.
    t.ok("verify", json!({}));
    t.ok("verify", json!({ "deep": true }));

    // Commands: a recorded exec, a background process.
    let ran = t.ok(
        "exec",
        json!({ "argv": ["sh", "-c", "echo built > out.txt; echo done"] }),
    );
    assert_eq!(ran["exit"], json!({ "code": 0 }), "{ran}");
    assert_eq!(
        std::fs::read_to_string(work.join("out.txt")).unwrap(),
        "built\n"
    );
    let spawned = t.ok("process.spawn", json!({ "argv": ["sh", "-c", "echo bg"] }));
    let id = spawned["id"].as_u64().unwrap();
    t.ok("process.wait", json!({ "id": id, "timeout_ms": 10000 }));
    t.ok("process.read", json!({ "id": id }));
    t.ok("process.list", json!({}));
    t.refused(
        "process.signal",
        json!({ "id": 999_999, "signal": "terminate" }),
        ErrorKind::NotFound,
    );
    t.ok("pty.list", json!({}));

    // A supervisor runs no tournament: its forks would run outside the agent's sandbox.
    t.refused(
        "tournament",
        json!({ "candidates": ["true"], "test": "true" }),
        ErrorKind::Unavailable,
    );

    // Upkeep.
    t.ok("gc", json!({}));
}

/// Runs the body through `door` on a fresh workspace under `dir`, then checks the stores.
fn run(dir: &Path, through_socket: bool) -> Vec<(String, Value)> {
    let (sup, work, home, _) = open(dir, RULES);
    let env = sup.env().clone();
    let mut door: Box<dyn Door> = if through_socket {
        Box::new(Socket(ControlClient::connect(sup.socket_path()).unwrap()))
    } else {
        Box::new(InProcess(sup.workspace().clone()))
    };
    let mut t = Transcript {
        door: &mut *door,
        dir: dir.to_owned(),
        lines: Vec::new(),
    };
    body(&mut t, &env, &work);
    let lines = t.lines;
    drop(door);
    sup.shutdown().unwrap();
    let env = LocalEnvironment::open(&home, Options::default()).unwrap();
    env.verify_deep(&ActorId::system()).unwrap();
    assert_eq!(
        view(&env, &env.head("main").unwrap()),
        disk(&work, &no_skip),
        "the head holds exactly what is on disk"
    );
    lines
}

fn every_use_case_answers_the_same_scenario(dir: &Path) {
    let in_process = run(&dir.join("in-process"), false);
    let socket = run(&dir.join("socket"), true);
    assert_eq!(in_process.len(), socket.len());
    let methods: std::collections::BTreeSet<&str> = in_process
        .iter()
        .map(|(call, _)| call.split(' ').next().unwrap())
        .collect();
    for m in Method::ALL {
        // The terminal sessions are exercised by the shell's own tests; the rest are here.
        if m.name().starts_with("pty.") && m.name() != "pty.list" {
            continue;
        }
        assert!(methods.contains(m.name()), "{} is not exercised", m.name());
    }
    let differ: Vec<String> = in_process
        .iter()
        .zip(&socket)
        .filter(|((_, a), (_, b))| a != b)
        .map(|((call, a), (_, b))| format!("{call}:\n  in process: {a}\n  socket:     {b}"))
        .collect();
    assert!(
        differ.is_empty(),
        "in process and through the socket differ:\n{}",
        differ.join("\n")
    );
}

#[test]
fn every_use_case_answers_the_same_in_process_and_through_the_socket() {
    both(
        "every_use_case_answers_the_same_in_process_and_through_the_socket",
        always,
        every_use_case_answers_the_same_scenario,
    );
}

// ---- the door-by-outcome matrix ------------------------------------------------------------

/// The agent may read and run anything, change `docs/`, `src/` and the files at the top, and
/// roll main back; never a secret; `held/` only with an operator's approval.
const MATRIX_RULES: &str = r#"
[[rule]]
id = "supervisor-captures"
effect = "permit"
principal = "service:supervisor"
actions = ["read", "write", "delete"]
resource = "*"

[[rule]]
id = "agent-reads-and-runs"
effect = "permit"
principal = "agent:coder"
actions = ["read", "execute"]
resource = "*"

[[rule]]
id = "agent-docs"
effect = "permit"
principal = "agent:coder"
actions = ["write", "delete"]
resource = { path = "docs/**" }

[[rule]]
id = "agent-docs-dir"
effect = "permit"
principal = "agent:coder"
actions = ["write", "delete"]
resource = { path = "docs" }

[[rule]]
id = "agent-src"
effect = "permit"
principal = "agent:coder"
actions = ["write", "delete"]
resource = { path = "src/**" }

[[rule]]
id = "agent-top-files"
effect = "permit"
principal = "agent:coder"
actions = ["write", "delete"]
resource = { path = "*.txt" }

[[rule]]
id = "agent-command-records"
effect = "permit"
principal = "agent:coder"
actions = ["write"]
resource = { object = "exec", key = "*" }

[[rule]]
id = "agent-rolls-main"
effect = "permit"
principal = "agent:coder"
actions = ["write"]
resource = { branch = "main" }

[[rule]]
id = "operator-works"
effect = "permit"
principal = "human:operator"
actions = ["read", "write", "delete"]
resource = "*"

[[rule]]
id = "no-secrets"
effect = "forbid"
principal = "agent:coder"
actions = ["write", "delete"]
resource = { path = "secrets/**" }

[[rule]]
id = "agent-works-the-queue"
effect = "permit"
principal = "agent:coder"
actions = ["publish", "consume"]
resource = { topic = "work" }

[[rule]]
id = "no-payments"
effect = "forbid"
principal = "agent:coder"
actions = ["execute"]
resource = { service = "bank" }

[[rule]]
id = "held-writes"
effect = "permit"
principal = "agent:coder"
actions = ["write"]
resource = { path = "held/**" }
approval_from = ["human:operator"]

[[rule]]
id = "deploys-need-approval"
effect = "permit"
principal = "agent:coder"
actions = ["publish"]
resource = { topic = "deploy" }
approval_from = ["human:operator"]
"#;

/// What a case must leave: its answer, then the tree and the log as they were (a refusal) or
/// changed by one operation of the agent (an allow).
enum Expect {
    /// Done, as one more operation of the agent's.
    Done,
    /// Done outside the operation log (the queue, the effect log): the log and the tree stay.
    Answered,
    /// Refused with this kind; nothing changed on disk or in the log.
    Refused(ErrorKind),
}

/// One use case under one outcome of the policy, through one door, checked on disk and in
/// the log.
fn case(
    t: &mut Transcript<'_>,
    env: &LocalEnvironment,
    work: &Path,
    (method, params): (&str, Value),
    expect: Expect,
) -> Value {
    let head = env.head("main").unwrap();
    let tree = disk(work, &no_skip);
    match expect {
        Expect::Done => {
            let answer = t.ok(method, params.clone());
            let now = env.head("main").unwrap();
            assert_ne!(now, head, "{method} {params} recorded nothing");
            assert_eq!(env.op(&now).unwrap().actor, agent(), "{method} {params}");
            answer
        }
        Expect::Answered => {
            let answer = t.ok(method, params.clone());
            assert_eq!(
                env.head("main").unwrap(),
                head,
                "{method} {params} changed the log"
            );
            answer
        }
        Expect::Refused(kind) => {
            t.refused(method, params.clone(), kind);
            assert_eq!(
                env.head("main").unwrap(),
                head,
                "{method} {params} changed the log"
            );
            assert_eq!(
                disk(work, &no_skip),
                tree,
                "{method} {params} changed the tree"
            );
            Value::Null
        }
    }
}

/// Each use case that changes the workspace, under each outcome: allowed, denied, held for an
/// approval (then presented once granted, and not twice), and narrowed by a capability token.
fn matrix(t: &mut Transcript<'_>, env: &LocalEnvironment, work: &Path, policy: &Policy) {
    use Expect::{Answered, Done, Refused};
    let operator = ActorId::new("human:operator").unwrap();
    // Another line of work changes a secret: merging it, or restoring to it, would too.
    let start = env.head("main").unwrap();
    env.create_branch(&operator, "ops", &start).unwrap();
    env.act_blocking(
        environment_core::ActRequest::new(
            operator.clone(),
            environment_core::Intent::edit("rotate the token"),
        )
        .on("ops")
        .put(
            environment_core::Key::fs("secrets/token").unwrap(),
            environment_core::Value::file(b"rotated\n".to_vec()),
        ),
    )
    .unwrap();
    let call = |m: &'static str, p: Value| (m, p);

    // Allowed.
    case(
        t,
        env,
        work,
        call(
            "file.write",
            json!({ "path": "docs/a.md", "content": "a\n" }),
        ),
        Done,
    );
    assert_eq!(
        std::fs::read_to_string(work.join("docs/a.md")).unwrap(),
        "a\n"
    );
    case(
        t,
        env,
        work,
        call("file.delete", json!({ "path": "docs/a.md" })),
        Done,
    );
    assert!(!work.join("docs/a.md").exists());
    case(t, env, work, call("undo", json!({})), Done);
    assert!(
        work.join("docs/a.md").exists(),
        "undo brought the file back"
    );
    case(t, env, work, call("redo", json!({})), Done);
    assert!(!work.join("docs/a.md").exists(), "redo took it away again");
    case(t, env, work, call("undo", json!({})), Done);
    assert!(work.join("docs/a.md").exists());
    case(
        t,
        env,
        work,
        call("restore", json!({ "version": start.to_string() })),
        Done,
    );
    assert!(!work.join("docs/a.md").exists());
    let ran = case(
        t,
        env,
        work,
        call("exec", json!({ "argv": ["sh", "-c", "echo b > b.txt"] })),
        Done,
    );
    assert_eq!(ran["refused"], json!([]), "{ran}");
    assert!(work.join("b.txt").exists());

    // Denied: a secret, however it would change.
    let secret = || std::fs::read_to_string(work.join("secrets/token")).unwrap();
    let denied = Refused(ErrorKind::Denied);
    case(
        t,
        env,
        work,
        call(
            "file.write",
            json!({ "path": "secrets/token", "content": "x" }),
        ),
        Refused(ErrorKind::Denied),
    );
    case(
        t,
        env,
        work,
        call("file.delete", json!({ "path": "secrets/token" })),
        Refused(ErrorKind::Denied),
    );
    case(
        t,
        env,
        work,
        call("merge", json!({ "source": "ops" })),
        Refused(ErrorKind::Denied),
    );
    case(
        t,
        env,
        work,
        call("restore", json!({ "version": "ops" })),
        denied,
    );
    assert_eq!(secret(), "s3cr3t\n");
    // A command's change to a secret is put back and kept as refused; its other changes are
    // the agent's.
    let ran = case(
        t,
        env,
        work,
        call(
            "exec",
            json!({ "argv": ["sh", "-c", "echo c > c.txt; echo leak > secrets/token"] }),
        ),
        Done,
    );
    assert_eq!(ran["refused"][0]["path"], "secrets/token", "{ran}");
    assert_eq!(secret(), "s3cr3t\n");
    assert!(work.join("c.txt").exists());
    let op = env.op(&env.head("main").unwrap()).unwrap();
    assert!(
        !op.summary
            .keys
            .iter()
            .any(|k| k.display_path() == "secrets/token")
    );

    // Held for an approval: refused with the request filed; granted, it lets exactly one
    // write through.
    let plan = json!({ "path": "held/plan.md", "content": "plan\n" });
    case(
        t,
        env,
        work,
        call("file.write", plan.clone()),
        Refused(ErrorKind::NeedsApproval),
    );
    let id = policy
        .approvals()
        .into_iter()
        .find(|a| a.resource.contains("held/plan.md"))
        .expect("the refusal filed an approval request")
        .id;
    policy
        .grant(
            &id,
            "human:operator",
            environment_policy::GrantScope::once(),
        )
        .unwrap();
    let mut with = plan.clone();
    with["approval"] = json!(id);
    case(t, env, work, call("file.write", with.clone()), Done);
    assert_eq!(
        std::fs::read_to_string(work.join("held/plan.md")).unwrap(),
        "plan\n"
    );
    with["content"] = json!("again\n");
    case(
        t,
        env,
        work,
        call("file.write", with),
        Refused(ErrorKind::NeedsApproval),
    );
    case(
        t,
        env,
        work,
        call(
            "queue.publish",
            json!({ "topic": "deploy", "payload": "v1" }),
        ),
        Refused(ErrorKind::NeedsApproval),
    );

    // Narrowed by a token: it may write under src/ and nothing else, whatever the rules allow.
    let token = policy
        .issue_token(
            agent().as_str(),
            environment_policy::TokenLimits {
                actions: Some(vec!["read".into(), "write".into()]),
                paths: Some(vec!["src/**".into()]),
                ..Default::default()
            },
        )
        .unwrap()
        .encode();
    case(
        t,
        env,
        work,
        call(
            "file.write",
            json!({ "path": "src/lib.rs", "content": "//\n", "token": token }),
        ),
        Done,
    );
    case(
        t,
        env,
        work,
        call(
            "file.write",
            json!({ "path": "config.toml", "content": "x", "token": token }),
        ),
        Refused(ErrorKind::Denied),
    );
    case(
        t,
        env,
        work,
        call("undo", json!({ "token": token })),
        Refused(ErrorKind::Denied),
    );
    case(
        t,
        env,
        work,
        call(
            "exec",
            json!({ "argv": ["touch", "t.txt"], "token": token }),
        ),
        Refused(ErrorKind::Denied),
    );
    case(
        t,
        env,
        work,
        call("mark", json!({ "name": "narrowed", "token": token })),
        Refused(ErrorKind::Denied),
    );
    case(
        t,
        env,
        work,
        call("redo", json!({ "token": token })),
        Refused(ErrorKind::Denied),
    );
    assert!(!work.join("t.txt").exists());

    // The queue: a claim's receipt is settled only as the token allows, once.
    case(
        t,
        env,
        work,
        call(
            "queue.subscribe",
            json!({ "group": "work", "topics": ["work"] }),
        ),
        Answered,
    );
    case(
        t,
        env,
        work,
        call("queue.publish", json!({ "topic": "work", "payload": "w1" })),
        Answered,
    );
    let claimed = case(
        t,
        env,
        work,
        call("queue.claim", json!({ "group": "work" })),
        Answered,
    );
    let receipt = claimed["leases"][0]["receipt"].clone();
    case(
        t,
        env,
        work,
        call("queue.ack", json!({ "receipt": receipt, "token": token })),
        Refused(ErrorKind::Denied),
    );
    case(
        t,
        env,
        work,
        call("queue.ack", json!({ "receipt": receipt })),
        Answered,
    );
    case(
        t,
        env,
        work,
        call("queue.ack", json!({ "receipt": receipt })),
        Refused(ErrorKind::Conflict),
    );
    case(
        t,
        env,
        work,
        call(
            "queue.publish",
            json!({ "topic": "work", "payload": "w2", "token": token }),
        ),
        Refused(ErrorKind::Denied),
    );

    // Effects: begun and settled as the rules and the token allow.
    case(
        t,
        env,
        work,
        call(
            "effect.begin",
            json!({ "key": "wire-1", "target": "bank", "request": "100" }),
        ),
        Refused(ErrorKind::Denied),
    );
    let begun = case(
        t,
        env,
        work,
        call(
            "effect.begin",
            json!({ "key": "ping-1", "target": "status", "request": "ping" }),
        ),
        Answered,
    );
    let id = begun["effect"]["id"].clone();
    case(
        t,
        env,
        work,
        call(
            "effect.complete",
            json!({ "id": id, "result": "pong", "token": token }),
        ),
        Refused(ErrorKind::Denied),
    );
    case(
        t,
        env,
        work,
        call("effect.complete", json!({ "id": id, "result": "pong" })),
        Answered,
    );
    let listed = t.ok("effect.list", json!({}));
    assert_eq!(listed["effects"][0]["state"], "done", "{listed}");
    assert_eq!(
        listed["effects"].as_array().unwrap().len(),
        1,
        "a refused begin filed nothing"
    );
}

/// Runs the matrix through `door` on a fresh workspace under `dir`.
fn run_matrix(dir: &Path, through_socket: bool) -> Vec<(String, Value)> {
    let (sup, work, _home, policy) = open(dir, MATRIX_RULES);
    let env = sup.env().clone();
    let mut door: Box<dyn Door> = if through_socket {
        Box::new(Socket(ControlClient::connect(sup.socket_path()).unwrap()))
    } else {
        Box::new(InProcess(sup.workspace().clone()))
    };
    let mut t = Transcript {
        door: &mut *door,
        dir: dir.to_owned(),
        lines: Vec::new(),
    };
    matrix(&mut t, &env, &work, &policy);
    let lines = t.lines;
    drop(door);
    sup.shutdown().unwrap();
    lines
}

fn every_door_decides_alike_scenario(dir: &Path) {
    let in_process = run_matrix(&dir.join("in-process"), false);
    let socket = run_matrix(&dir.join("socket"), true);
    let differ: Vec<String> = in_process
        .iter()
        .zip(&socket)
        .filter(|((_, a), (_, b))| a != b)
        .map(|((call, a), (_, b))| format!("{call}:\n  in process: {a}\n  socket:     {b}"))
        .collect();
    assert!(
        differ.is_empty(),
        "the doors differ:\n{}",
        differ.join("\n")
    );
}

/// Every use case that changes the workspace, under every outcome of the policy, through both
/// doors: the same answers, and the tree and the log as each outcome demands.
#[test]
fn every_door_decides_every_outcome_alike() {
    both(
        "every_door_decides_every_outcome_alike",
        always,
        every_door_decides_alike_scenario,
    );
}

/// A client that only shuts its writing down after its request (a script's half-close) still
/// gets its answer, and its command runs to its end; one that closes its end entirely calls
/// its command off.
fn a_half_close_is_not_a_hang_up_scenario(dir: &Path) {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixStream;
    let (sup, work, _home, _) = open(dir, RULES);
    let request = |argv: Value| {
        let mut line = serde_json::to_vec(
            &json!({ "jsonrpc": "2.0", "id": 1, "method": "exec", "params": { "argv": argv } }),
        )
        .unwrap();
        line.push(b'\n');
        line
    };
    let mut half = UnixStream::connect(sup.socket_path()).unwrap();
    half.write_all(&request(json!([
        "sh",
        "-c",
        "sleep 0.3; echo done > half.txt"
    ])))
    .unwrap();
    half.shutdown(std::net::Shutdown::Write).unwrap();
    let mut answer = String::new();
    BufReader::new(&half).read_line(&mut answer).unwrap();
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["result"]["exit"], json!({ "code": 0 }), "{answer}");
    assert!(work.join("half.txt").exists());

    let gone = UnixStream::connect(sup.socket_path()).unwrap();
    (&gone)
        .write_all(&request(json!([
            "sh",
            "-c",
            "sleep 30; echo late > gone.txt"
        ])))
        .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    drop(gone);
    // The command is called off and recorded as cancelled.
    let env = sup.env().clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let cancelled = loop {
        let head = env.head("main").unwrap();
        let status = env
            .read_unchecked(&environment_core::Key::obj("exec/status").unwrap(), &head)
            .unwrap()
            .map(|v| serde_json::from_slice::<Value>(&env.content(&v).unwrap()).unwrap());
        if status.as_ref().is_some_and(|s| s["exit"] == "cancelled") {
            break true;
        }
        if std::time::Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        cancelled,
        "a client that went away did not call its command off"
    );
    assert!(!work.join("gone.txt").exists());
    sup.shutdown().unwrap();
}

#[test]
fn a_half_close_is_not_a_hang_up() {
    both(
        "a_half_close_is_not_a_hang_up",
        always,
        a_half_close_is_not_a_hang_up_scenario,
    );
}

/// The typed API is the same at both doors: a request type sent in process
/// (`Workspace::request`) and through the socket (`ControlClient::request`) gets the same typed
/// answer, and what one door wrote the other reads.
fn typed_requests_scenario(dir: &Path) {
    use environment_workspace::{files, versions};
    let (sup, work, _home, _) = open(dir, RULES);
    let service = sup.workspace().clone();
    let mut socket = ControlClient::connect(sup.socket_path()).unwrap();

    let written = service
        .request(files::WriteParams {
            path: "notes/typed.md".into(),
            content: "typed\n".into(),
            intent: None,
        })
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(work.join("notes/typed.md")).unwrap(),
        "typed\n"
    );
    let read = files::ReadParams {
        path: "notes/typed.md".into(),
        version: Some(written.version.clone()),
    };
    let here = service.request(read.clone()).unwrap();
    let there = socket.request(read).unwrap();
    assert_eq!(here, there);
    assert_eq!(there.content.text.as_deref(), Some("typed\n"));

    let history = versions::HistoryParams {
        all: true,
        ..Default::default()
    };
    assert_eq!(
        service.request(history.clone()).unwrap(),
        socket.request(history).unwrap()
    );
    let diff = versions::DiffParams {
        from: format!("{}~1", written.version),
        to: Some(written.version.clone()),
        prefix: None,
        limit: None,
        after: None,
    };
    let d = socket.request(diff.clone()).unwrap();
    assert_eq!(d, service.request(diff).unwrap());
    assert_eq!(
        (d.total, d.added),
        (2, 2),
        "notes/ and notes/typed.md: {d:?}"
    );

    // A refusal is the same kind at both doors, and changes nothing.
    let head = sup.env().head("main").unwrap();
    let secret = files::WriteParams {
        path: "secrets/typed".into(),
        content: "no\n".into(),
        intent: None,
    };
    assert_eq!(
        service.request(secret.clone()).unwrap_err().kind(),
        ErrorKind::Denied
    );
    match socket.request(secret).unwrap_err() {
        ControlError::Rpc { code, data, .. } => {
            assert_eq!(rpc::kind_of_error(code, &data), ErrorKind::Denied)
        }
        other => panic!("the socket failed: {other}"),
    }
    assert!(!work.join("secrets/typed").exists());
    assert_eq!(sup.env().head("main").unwrap(), head);
    sup.shutdown().unwrap();
}

#[test]
fn typed_requests_answer_alike_in_process_and_through_the_socket() {
    both(
        "typed_requests_answer_alike_in_process_and_through_the_socket",
        always,
        typed_requests_scenario,
    );
}

/// Every method, at both doors, refuses a parameter it does not take as invalid, its schema
/// refuses it too, and nothing changes: not the log, not the disk.
fn unknown_parameters_scenario(dir: &Path) {
    let (sup, work, _home, _) = open(dir, RULES);
    let service = sup.workspace().clone();
    let mut socket = Socket(ControlClient::connect(sup.socket_path()).unwrap());
    let mut in_process = InProcess(service);
    let head = sup.env().head("main").unwrap();
    let before = disk(&work, &no_skip);
    for m in Method::ALL {
        let params = json!({ "surely_not_a_parameter": true });
        let schema = m.contract().params;
        assert!(
            !jsonschema::validator_for(&schema)
                .unwrap()
                .is_valid(&params),
            "{}: the schema takes an unknown parameter",
            m.name()
        );
        for door in [&mut in_process as &mut dyn Door, &mut socket] {
            match door.call(m.name(), params.clone()) {
                Err((kind, _)) => assert_eq!(kind, ErrorKind::Invalid, "{}", m.name()),
                Ok(v) => panic!("{} took an unknown parameter: {v}", m.name()),
            }
        }
    }
    assert_eq!(sup.env().head("main").unwrap(), head);
    assert_eq!(disk(&work, &no_skip), before);
    sup.shutdown().unwrap();
}

#[test]
fn every_method_refuses_unknown_parameters_at_every_door() {
    both(
        "every_method_refuses_unknown_parameters_at_every_door",
        always,
        unknown_parameters_scenario,
    );
}

/// A connection's identity is bound once, when it opens: the agent's socket acts as the agent
/// and cannot become anyone else; the operator's socket (private to the supervisor's user, in
/// a directory the sandbox does not show) acts as the actor its `session.open` names, and as
/// nobody before it.
fn identity_is_bound_per_connection_scenario(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let (sup, work, _home, _) = open(dir, RULES);
    let env = sup.env().clone();
    let head = env.head("main").unwrap();
    let kind = |e: ControlError| match e {
        ControlError::Rpc { code, data, .. } => rpc::kind_of_error(code, &data),
        other => panic!("the socket failed: {other}"),
    };
    let write = |path: &str| json!({ "path": path, "content": "rotated\n" });

    // Private to the supervisor's user, apart from the agent's socket.
    let op_path = sup.operator_socket_path().to_owned();
    assert_ne!(op_path.parent(), sup.socket_path().parent());
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&op_path), 0o600);
    assert_eq!(mode(op_path.parent().unwrap()), 0o700);

    // The agent's connection is the agent's: it cannot open a session as the operator, and
    // what the agent may not do stays refused.
    let mut agent = ControlClient::connect(sup.socket_path()).unwrap();
    assert_eq!(
        kind(agent.open_session("human:operator").unwrap_err()),
        ErrorKind::Denied
    );
    assert_eq!(
        kind(
            agent
                .call("file.write", write("secrets/token"))
                .unwrap_err()
        ),
        ErrorKind::Denied
    );
    assert_eq!(agent.status().unwrap().actor, "agent:coder");
    // Opening it as the agent it is changes nothing.
    agent.open_session("agent:coder").unwrap();
    assert_eq!(agent.status().unwrap().actor, "agent:coder");

    // An operator's connection acts as nobody until it opens a session.
    let mut operator = ControlClient::connect(&op_path).unwrap();
    assert_eq!(
        kind(
            operator
                .call("file.write", write("secrets/token"))
                .unwrap_err()
        ),
        ErrorKind::Invalid
    );
    for bad in ["", "*", "kind:agent"] {
        assert_eq!(
            kind(operator.open_session(bad).unwrap_err()),
            ErrorKind::Invalid,
            "{bad:?}"
        );
    }
    assert_eq!(env.head("main").unwrap(), head, "nothing changed so far");
    assert_eq!(
        std::fs::read_to_string(work.join("secrets/token")).unwrap(),
        "s3cr3t\n"
    );

    // Opened as the operator, it does what the operator may, recorded as the operator's.
    operator.open_session("human:operator").unwrap();
    assert_eq!(operator.status().unwrap().actor, "human:operator");
    let written = operator.call("file.write", write("secrets/token")).unwrap();
    assert_eq!(
        std::fs::read_to_string(work.join("secrets/token")).unwrap(),
        "rotated\n"
    );
    let op = env
        .op(&env.resolve(written["version"].as_str().unwrap()).unwrap())
        .unwrap();
    assert_eq!(op.actor.as_str(), "human:operator");
    // Bound once: it cannot become someone else.
    assert_eq!(
        kind(operator.open_session("agent:coder").unwrap_err()),
        ErrorKind::Invalid
    );
    assert_eq!(operator.status().unwrap().actor, "human:operator");
    sup.shutdown().unwrap();
}

#[test]
fn identity_is_bound_per_connection() {
    both(
        "identity_is_bound_per_connection",
        always,
        identity_is_bound_per_connection_scenario,
    );
}

/// The capture actor follows one rule: what changes in a supervised workspace is the agent's
/// act, decided as its requests are. A change the agent may not make, made on disk outside any
/// request, is put back and kept as the agent's refused change, never recorded under another
/// actor; and no door lends out the witness, whose captures alone the policy does not gate.
fn captures_are_the_agent_s_scenario(dir: &Path) {
    let (sup, work, _home, _) = open(dir, RULES);
    let env = sup.env().clone();
    write(&work, "secrets/laundered", b"exfiltrated\n");
    write(&work, "src/lib.rs", b"pub fn ok() {}\n");
    let mut socket = ControlClient::connect(sup.socket_path()).unwrap();
    // A mark is a capture barrier: everything on disk is recorded first.
    socket.mark("after").unwrap();
    assert!(
        !work.join("secrets/laundered").exists(),
        "the forbidden change was put back"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("src/lib.rs")).unwrap(),
        "pub fn ok() {}\n"
    );
    let refused = env.refused(&agent(), "main", 10).unwrap();
    assert!(
        refused
            .iter()
            .any(|r| r.key.display_path() == "secrets/laundered" && r.actor == agent()),
        "{refused:?}"
    );
    let head = env.head("main").unwrap();
    let recorded = env
        .read_unchecked(
            &environment_core::Key::fs("secrets/laundered").unwrap(),
            &head,
        )
        .unwrap();
    assert!(recorded.is_none(), "the refused change entered main");
    let ops = env
        .history(
            &agent(),
            "main",
            &environment_core::HistoryOptions {
                all: true,
                limit: 100,
            },
        )
        .unwrap();
    let lib_by = ops.iter().find_map(|e| match e {
        environment_core::HistoryEntry::Op { op, .. }
            if op
                .summary
                .keys
                .iter()
                .any(|k| k.display_path() == "src/lib.rs") =>
        {
            Some(op.actor.clone())
        }
        _ => None,
    });
    assert_eq!(lib_by, Some(agent()), "the allowed change is the agent's");

    // The refused changes come a page at a time, newest first, each once.
    for name in ["a", "b", "c"] {
        write(&work, &format!("secrets/{name}"), b"again\n");
    }
    socket.mark("after-more").unwrap();
    let (mut ids, mut after) = (Vec::new(), None);
    loop {
        let page = socket
            .request(environment_workspace::versions::RefusedParams {
                branch: None,
                limit: Some(1),
                after,
            })
            .unwrap();
        assert!(page.refused.len() <= 1, "{page:?}");
        ids.extend(page.refused.iter().map(|r| r.id));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let mut expected = ids.clone();
    expected.sort_unstable_by(|a, b| b.cmp(a));
    expected.dedup();
    assert_eq!(ids, expected, "newest first, each once");
    assert_eq!(ids.len(), 4, "{ids:?}");

    // The witness is no caller: not in process, not through the operator's socket.
    let before = env.head("main").unwrap();
    let witness = environment_workspace::Caller::new(environment_core::witness());
    let params = json!({ "path": "secrets/w", "content": "w\n" });
    let Value::Object(map) = params.clone() else {
        unreachable!()
    };
    let e = sup
        .workspace()
        .call_as(
            &witness,
            Method::FileWrite,
            map,
            &environment_core::Cancel::new(),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Denied);
    let mut op = ControlClient::connect(sup.operator_socket_path()).unwrap();
    op.open_session(environment_core::witness().as_str())
        .unwrap();
    match op.call("file.write", params).unwrap_err() {
        ControlError::Rpc { code, data, .. } => {
            assert_eq!(rpc::kind_of_error(code, &data), ErrorKind::Denied)
        }
        other => panic!("the socket failed: {other}"),
    }
    assert!(!work.join("secrets/w").exists());
    assert_eq!(env.head("main").unwrap(), before);
    sup.shutdown().unwrap();
}

#[test]
fn captures_are_the_agent_s_and_the_witness_is_no_caller() {
    both(
        "captures_are_the_agent_s_and_the_witness_is_no_caller",
        always,
        captures_are_the_agent_s_scenario,
    );
}

/// A file of a mebibyte is written whole through the socket as in process, and read back the
/// same (it used to exceed the socket's line limit).
fn a_mebibyte_file_scenario(dir: &Path) {
    use environment_workspace::files;
    let (sup, work, _home, _) = open(dir, RULES);
    let content: String = (0..(1 << 20))
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let mut socket = ControlClient::connect(sup.socket_path()).unwrap();
    let written = socket
        .request(files::WriteParams {
            path: "big.txt".into(),
            content: content.clone(),
            intent: None,
        })
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(work.join("big.txt")).unwrap(),
        content
    );
    let read = socket
        .request(files::ReadParams {
            path: "big.txt".into(),
            version: Some(written.version),
        })
        .unwrap();
    assert_eq!(read.content.text.as_deref(), Some(content.as_str()));
    sup.shutdown().unwrap();
}

#[test]
fn a_mebibyte_file_goes_through_the_socket() {
    both(
        "a_mebibyte_file_goes_through_the_socket",
        always,
        a_mebibyte_file_scenario,
    );
}
