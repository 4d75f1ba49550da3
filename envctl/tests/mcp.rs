//! `envctl mcp` driven by a real MCP client over stdio: the handshake, the tool list with
//! schemas, every tool, failures with the did-NOT-execute text, and a policy denial.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use environment_core::{Key, LocalEnvironment, OpFlags, Options};
use rmcp::model::{
    CallToolRequest, CallToolRequestParams, CallToolResult, ClientRequest,
    ProgressNotificationParam, ReadResourceRequestParams, ResourceContents,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RunningService};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_envctl");

const TOOLS: &[&str] = &[
    "history",
    "show",
    "diff",
    "mark",
    "restore",
    "undo",
    "exec",
    "read_file",
    "write_file",
    "list_files",
    "queue_publish",
    "queue_claim",
    "queue_ack",
    "queue_nack",
    "policy_explain",
    "what_may_i_do",
    "request_approval",
];

fn envctl(dir: &Path, args: &[&str]) -> std::process::Output {
    let out = Command::new(BIN)
        .arg("-C")
        .arg(dir)
        .args(args)
        .env_remove("ENVIRONMENT_DIR")
        .env_remove("ENVIRONMENT_SOCKET")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "envctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

async fn connect(dir: &Path) -> RunningService<RoleClient, ()> {
    connect_with(dir, ()).await
}

/// A client of `envctl mcp` in `dir` whose notifications `handler` gets.
async fn connect_with<H: ClientHandler>(dir: &Path, handler: H) -> RunningService<RoleClient, H> {
    let transport = TokioChildProcess::new(tokio::process::Command::new(BIN).configure(|cmd| {
        cmd.arg("-C")
            .arg(dir)
            .arg("mcp")
            .env_remove("ENVIRONMENT_ACTOR")
            .env_remove("ENVIRONMENT_SOCKET");
    }))
    .unwrap();
    handler.serve(transport).await.unwrap()
}

/// Counts the notifications a client gets: progress, and changes of the resource list.
#[derive(Clone, Default)]
struct Notes {
    progress: Arc<AtomicUsize>,
    resources_changed: Arc<AtomicUsize>,
}

impl ClientHandler for Notes {
    async fn on_progress(
        &self,
        _params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.fetch_add(1, Ordering::SeqCst);
    }

    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.resources_changed.fetch_add(1, Ordering::SeqCst);
    }
}

/// The history and the files at any version are resources; a mark adds one, and the client is
/// told the list changed. An address that names nothing, or a path out of the workspace, is an
/// error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_name_the_history_and_files_at_versions() {
    let ws = workspace();
    let dir = ws.path();
    std::fs::write(dir.join("blob.bin"), [0xffu8, 0x00, 0xfe]).unwrap();
    let notes = Notes::default();
    let client = connect_with(dir, notes.clone()).await;
    let read = |uri: &str| {
        let uri = uri.to_owned();
        let client = &client;
        async move {
            client
                .read_resource(ReadResourceRequestParams::new(uri))
                .await
                .map(|r| r.contents)
        }
    };
    let listed = client.list_all_resources().await.unwrap();
    assert_eq!(
        listed.len(),
        1,
        "only the history before any mark: {listed:?}"
    );
    let templates = client.list_all_resource_templates().await.unwrap();
    assert_eq!(templates.len(), 2);

    ok(&client, "mark", json!({"name": "good"})).await;
    until("the resource list's change", || {
        notes.resources_changed.load(Ordering::SeqCst) > 0
    })
    .await;
    let listed = client.list_all_resources().await.unwrap();
    assert!(
        listed
            .iter()
            .any(|r| r.uri == "environment://versions/good"),
        "{listed:?}"
    );
    std::fs::write(dir.join("a.txt"), "changed\n").unwrap();

    let text = |c: &ResourceContents| match c {
        ResourceContents::TextResourceContents { text, .. } => text.clone(),
        other => panic!("{other:?}"),
    };
    let history: Value =
        serde_json::from_str(&text(&read("environment://history").await.unwrap()[0])).unwrap();
    assert!(
        !history["entries"].as_array().unwrap().is_empty(),
        "{history}"
    );
    assert_eq!(
        text(&read("environment://files/good/a.txt").await.unwrap()[0]),
        "alpha\n"
    );
    assert_eq!(
        text(&read("environment://files/HEAD/a.txt").await.unwrap()[0]),
        "changed\n",
        "HEAD is the workspace as it is now"
    );
    let files: Value = serde_json::from_str(&text(
        &read("environment://versions/good").await.unwrap()[0],
    ))
    .unwrap();
    assert!(files.to_string().contains("src/lib.rs"), "{files}");
    match &read("environment://files/HEAD/blob.bin").await.unwrap()[0] {
        ResourceContents::BlobResourceContents { blob, .. } => assert_eq!(blob, "/wD+"),
        other => panic!("{other:?}"),
    }
    for bad in [
        "environment://nothing",
        "environment://files/HEAD/../../etc/passwd",
        "environment://files/no-such-version/a.txt",
        "environment://files/HEAD/missing.txt",
        "file:///etc/passwd",
    ] {
        assert!(read(bad).await.is_err(), "{bad}");
    }
    client.cancel().await.unwrap();
}

/// Whether a `sleep SECS` runs on this host (inside a sandbox or not).
fn sleeping(secs: u32) -> bool {
    let cmdline = format!("sleep\0{secs}\0").into_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .any(|p| std::fs::read(p.path().join("cmdline")).is_ok_and(|c| c == cmdline))
}

/// Waits (at most 20 s) for `done`.
async fn until(what: &str, done: impl Fn() -> bool) {
    for _ in 0..2000 {
        if done() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("{what} did not happen");
}

/// A long `exec` reports progress while it runs; once the client cancels it, the command and
/// what it started are killed, and what it did until then is recorded as a cancelled command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_exec_is_killed_and_recorded_as_cancelled() {
    let ws = workspace();
    let notes = Notes::default();
    let client = connect_with(ws.path(), notes.clone()).await;
    cancelled_exec(&client, &notes, ws.path(), 67).await;
    client.cancel().await.unwrap();
}

/// The same through a supervisor: the server hangs its connection up, and the supervisor calls
/// the command off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_exec_through_a_supervisor_is_killed_too() {
    let ws = workspace();
    let notes = Notes::default();
    let (mut run, client) = supervised(ws.path(), notes.clone()).await;
    cancelled_exec(&client, &notes, ws.path(), 68).await;
    // The next call goes through a new connection.
    ok(&client, "status", json!({})).await;
    client.cancel().await.unwrap();
    let _ = run.kill();
    let _ = run.wait();
}

/// Cancels an `exec` of a command that sleeps `secs` (a time no other test sleeps, to be found
/// among the host's processes) once it reported progress, and checks it was killed and recorded
/// as cancelled with what it did before.
async fn cancelled_exec<H: ClientHandler>(
    client: &RunningService<RoleClient, H>,
    notes: &Notes,
    dir: &Path,
    secs: u32,
) {
    let script = format!(
        "echo started > started.txt; sleep {secs} & echo $! > sleeper.pid; wait; \
         echo late > late.txt"
    );
    let call = CallToolRequestParams::new("exec").with_arguments(
        json!({"command": ["sh", "-c", script]})
            .as_object()
            .cloned()
            .unwrap(),
    );
    let handle = client
        .send_cancellable_request(
            ClientRequest::CallToolRequest(CallToolRequest::new(call)),
            PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    until("the command's start", || dir.join("sleeper.pid").exists()).await;
    until("a progress notification", || {
        notes.progress.load(Ordering::SeqCst) > 0
    })
    .await;
    assert!(sleeping(secs), "the command's child runs");
    handle
        .cancel(Some("the user changed their mind".into()))
        .await
        .unwrap();

    let home = dir.join(".environment");
    let recorded = || {
        let env = LocalEnvironment::open(&home, Options::default()).unwrap();
        let mut at = Some(env.head("main").unwrap());
        // The command's operation, among the last few (a supervisor may capture after it).
        for _ in 0..10 {
            let op = env.op(&at?).unwrap();
            if op.flags.contains(OpFlags::COMMAND) {
                return Some((env, op));
            }
            at = op.parents.first().copied();
        }
        None
    };
    until("the cancelled command's record", || recorded().is_some()).await;
    let (env, op) = recorded().unwrap();
    assert!(op.flags.contains(OpFlags::FAILED));
    let status = env
        .read_unchecked(&Key::obj("exec/status").unwrap(), &op.id)
        .unwrap()
        .unwrap();
    let status: Value = serde_json::from_slice(&env.content(&status).unwrap()).unwrap();
    assert_eq!(status["exit"], "cancelled", "{status}");
    assert!(
        env.read_unchecked(&Key::fs("started.txt").unwrap(), &op.id)
            .unwrap()
            .is_some(),
        "what the command did before is its operation's"
    );
    assert!(
        !sleeping(secs),
        "the command's child survived the cancellation"
    );
    assert!(!dir.join("late.txt").exists());
}

async fn call<H: ClientHandler>(
    client: &RunningService<RoleClient, H>,
    tool: &str,
    args: Value,
) -> CallToolResult {
    let args = args.as_object().cloned().unwrap_or_default();
    client
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(args))
        .await
        .unwrap()
}

fn text(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A successful call's text, once its structured content is checked against the output
/// schema the tool publishes.
async fn ok<H: ClientHandler>(
    client: &RunningService<RoleClient, H>,
    tool: &str,
    args: Value,
) -> String {
    let r = call(client, tool, args).await;
    assert_ne!(r.is_error, Some(true), "{tool} failed: {}", text(&r));
    conforms(client, tool, &r).await;
    text(&r)
}

/// Checks that `r` carries structured content and that it is valid under `tool`'s output
/// schema, as a client that validates (the spec asks it to) would.
async fn conforms<H: ClientHandler>(
    client: &RunningService<RoleClient, H>,
    tool: &str,
    r: &CallToolResult,
) {
    let tools = client.list_all_tools().await.unwrap();
    let listed = tools.iter().find(|t| t.name == tool).unwrap();
    let schema = Value::Object(
        listed
            .output_schema
            .as_deref()
            .cloned()
            .unwrap_or_else(|| panic!("{tool} publishes no output schema")),
    );
    let content = r
        .structured_content
        .as_ref()
        .unwrap_or_else(|| panic!("{tool} answered without structured content"));
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator
        .iter_errors(content)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{tool}: {errors:?}\n{content:#}");
}

/// A failed call's text, checked to say first that nothing happened.
async fn refused<H: ClientHandler>(
    client: &RunningService<RoleClient, H>,
    tool: &str,
    args: Value,
) -> String {
    let r = call(client, tool, args).await;
    assert_eq!(r.is_error, Some(true), "{tool} should fail: {}", text(&r));
    let t = text(&r);
    assert!(
        t.starts_with(&format!("The tool `{tool}` did NOT execute")),
        "{t}"
    );
    assert!(
        t.contains("must not be invented or reported as done"),
        "{t}"
    );
    assert!(t.contains("Reason:") && t.contains("Next:"), "{t}");
    // Said once: no second "did NOT happen", no second next step, no doubled stop.
    assert_eq!(t.matches("NOT").count(), 1, "{t}");
    assert_eq!(t.matches("Next:").count(), 1, "{t}");
    let doubled_stop = t.replace("...", "").contains(".. ") || t.ends_with("..");
    assert!(!doubled_stop, "{t}");
    t
}

fn workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("a.txt"), "alpha\n").unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/lib.rs"), "fn main() {}\n").unwrap();
    envctl(dir.path(), &["init"]);
    dir
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_tool_over_stdio() {
    let ws = workspace();
    let dir = ws.path();
    envctl(dir, &["queue", "subscribe", "workers", "task.created"]);
    let client = connect(dir).await;

    let info = client.peer_info().unwrap();
    assert_eq!(info.server_info.as_ref().unwrap().name, "envctl");
    let tools = client.list_all_tools().await.unwrap();
    for name in TOOLS {
        let t = tools
            .iter()
            .find(|t| t.name == *name)
            .unwrap_or_else(|| panic!("tool {name} is missing"));
        assert!(
            t.description.as_deref().is_some_and(|d| d.len() > 20),
            "{name}"
        );
        assert_eq!(t.input_schema.get("type"), Some(&json!("object")), "{name}");
    }
    let write = tools.iter().find(|t| t.name == "write_file").unwrap();
    let props = write.input_schema.get("properties").unwrap();
    assert!(props.get("path").is_some() && props.get("content").is_some());

    assert!(
        ok(&client, "history", json!({}))
            .await
            .contains("create the environment")
    );

    ok(
        &client,
        "write_file",
        json!({"path": "notes/todo.txt", "content": "ship it\n"}),
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(dir.join("notes/todo.txt")).unwrap(),
        "ship it\n"
    );
    assert_eq!(
        ok(&client, "read_file", json!({"path": "notes/todo.txt"})).await,
        "ship it\n"
    );
    ok(&client, "mark", json!({"name": "before"})).await;

    // Work done outside the server is seen by the next call.
    std::fs::write(dir.join("oob.txt"), "outside\n").unwrap();
    let listing = ok(&client, "list_files", json!({})).await;
    assert!(
        listing.contains("notes/todo.txt") && listing.contains("oob.txt"),
        "{listing}"
    );
    assert!(
        ok(&client, "list_files", json!({"prefix": "src"}))
            .await
            .contains("src/lib.rs")
    );

    let out = ok(
        &client,
        "exec",
        json!({"command": ["sh", "-c", "echo hi; echo made > made.txt"], "intent": "make it"}),
    )
    .await;
    assert!(
        out.contains("status 0") && out.contains("hi") && out.contains("recorded as"),
        "{out}"
    );
    assert!(dir.join("made.txt").exists());
    let shown = ok(&client, "show", json!({"version": "HEAD"})).await;
    assert!(
        shown.contains("made.txt") && shown.contains("make it"),
        "{shown}"
    );
    assert!(
        ok(&client, "diff", json!({"from": "before"}))
            .await
            .contains("A made.txt")
    );
    let patch = ok(
        &client,
        "file_diff",
        json!({"path": "made.txt", "from": "before"}),
    )
    .await;
    assert!(
        patch.starts_with("--- /dev/null\n+++ b/made.txt\n@@ -0,0 +1,1 @@"),
        "{patch}"
    );
    let failed = ok(&client, "exec", json!({"command": ["sh", "-c", "exit 3"]})).await;
    assert!(failed.contains("status 3"), "{failed}");

    let preview = ok(
        &client,
        "restore",
        json!({"version": "before", "dry_run": true}),
    )
    .await;
    assert!(
        preview.contains("Dry run") && preview.contains("made.txt"),
        "{preview}"
    );
    assert!(dir.join("made.txt").exists(), "a dry run changes nothing");
    ok(&client, "restore", json!({"version": "before"})).await;
    assert!(!dir.join("made.txt").exists() && !dir.join("oob.txt").exists());
    assert!(dir.join("notes/todo.txt").exists());
    ok(&client, "undo", json!({})).await;
    assert!(dir.join("made.txt").exists(), "undo takes the restore back");

    let published = ok(
        &client,
        "queue_publish",
        json!({"topic": "task.created", "payload": "{\"task\": 1}", "dedup": "t1"}),
    )
    .await;
    assert!(published.contains("\"duplicate\": false"), "{published}");
    let claimed: Value =
        serde_json::from_str(&ok(&client, "queue_claim", json!({"group": "workers"})).await)
            .unwrap();
    let receipt = claimed["leases"][0]["receipt"].as_str().unwrap().to_owned();
    assert_eq!(claimed["leases"][0]["payload"], "{\"task\": 1}");
    ok(
        &client,
        "queue_extend",
        json!({"receipt": receipt, "lease_secs": 120}),
    )
    .await;
    let leases: Value =
        serde_json::from_str(&ok(&client, "queue_leases", json!({"group": "workers"})).await)
            .unwrap();
    assert_eq!(
        leases["leases"][0]["message_id"],
        claimed["leases"][0]["message_id"]
    );
    ok(&client, "queue_ack", json!({"receipt": receipt})).await;
    assert!(
        ok(&client, "queue_stats", json!({}))
            .await
            .contains("workers")
    );
    refused(&client, "queue_nack", json!({"receipt": receipt})).await;
    refused(&client, "queue_ack", json!({"receipt": "not-a-receipt"})).await;
    refused(&client, "queue_claim", json!({"group": "nobody"})).await;

    assert!(
        ok(
            &client,
            "policy_explain",
            json!({"action": "write", "resource": "path:a.txt"})
        )
        .await
        .contains("no policy")
    );
    assert!(
        ok(&client, "what_may_i_do", json!({}))
            .await
            .contains("No policy")
    );
    refused(
        &client,
        "request_approval",
        json!({"action": "write", "resource": "a.txt"}),
    )
    .await;

    // An effect on the world outside is performed once, whatever the retries.
    let deploy = json!({"key": "deploy-7", "target": "https://deploy.example", "request": "v7"});
    let begun = call(&client, "effect_begin", deploy.clone()).await;
    conforms(&client, "effect_begin", &begun).await;
    assert!(
        text(&begun).contains("perform the effect now"),
        "{}",
        text(&begun)
    );
    let id = begun.structured_content.unwrap()["effect"]["id"].clone();
    ok(
        &client,
        "effect_complete",
        json!({"id": id, "result": "deployed"}),
    )
    .await;
    let again = ok(&client, "effect_begin", deploy).await;
    assert!(
        again.contains("do NOT perform it again") && again.contains("deployed"),
        "{again}"
    );
    assert!(ok(&client, "effects", json!({})).await.contains("deploy-7"));
    refused(
        &client,
        "effect_fail",
        json!({"id": 424242, "error": "never begun"}),
    )
    .await;
    assert!(ok(&client, "verify", json!({})).await.contains("intact"));

    // Bad input: nothing happens, and the text says so first.
    let head = ok(&client, "show", json!({"version": "HEAD"})).await;
    let escape = refused(&client, "read_file", json!({"path": "../etc/passwd"})).await;
    assert!(escape.contains("relative"), "{escape}");
    refused(
        &client,
        "write_file",
        json!({"path": "/abs.txt", "content": "x"}),
    )
    .await;
    let ignored = refused(
        &client,
        "write_file",
        json!({"path": ".environment/env.db", "content": "x"}),
    )
    .await;
    assert!(ignored.contains("ignores"), "{ignored}");
    let unknown = refused(&client, "restore", json!({"version": "no-such-version"})).await;
    assert!(unknown.contains("history"), "{unknown}");
    refused(&client, "read_file", json!({"path": "missing.txt"})).await;
    refused(
        &client,
        "exec",
        json!({"command": ["no-such-program-here"]}),
    )
    .await;
    refused(&client, "mark", json!({"name": "before"})).await;
    assert_eq!(ok(&client, "show", json!({"version": "HEAD"})).await, head);
    assert!(!dir.join("abs.txt").exists());

    client.cancel().await.unwrap();
    envctl(dir, &["verify"]);
}

const RULES: &str = r#"
[[rule]]
id = "mcp-reads"
effect = "permit"
principal = "agent:mcp"
actions = ["read"]
resource = "*"

[[rule]]
id = "approved-writes"
effect = "permit"
principal = "agent:mcp"
actions = ["write"]
resource = { path = "approved/**" }
approval_from = ["human:alice"]

[[rule]]
id = "alice-reviews"
effect = "permit"
principal = "human:alice"
actions = ["read"]
resource = { environment = true }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_call_changes_nothing() {
    let ws = workspace();
    let dir = ws.path();
    std::fs::write(dir.join("rules.toml"), RULES).unwrap();
    envctl(dir, &["policy", "load", "rules.toml"]);
    let head = String::from_utf8(envctl(dir, &["--actor", "agent:mcp", "status", "--json"]).stdout)
        .unwrap();
    let client = connect(dir).await;

    assert_eq!(
        ok(&client, "read_file", json!({"path": "a.txt"})).await,
        "alpha\n"
    );
    let denied = refused(
        &client,
        "write_file",
        json!({"path": "a.txt", "content": "x"}),
    )
    .await;
    assert!(denied.contains("Denied"), "{denied}");
    assert_eq!(
        std::fs::read_to_string(dir.join("a.txt")).unwrap(),
        "alpha\n"
    );
    refused(&client, "exec", json!({"command": ["touch", "made.txt"]})).await;
    assert!(!dir.join("made.txt").exists());
    refused(&client, "restore", json!({"version": "HEAD~1"})).await;
    assert!(dir.join("a.txt").exists() && dir.join("src/lib.rs").exists());
    refused(
        &client,
        "queue_publish",
        json!({"topic": "t", "payload": "x"}),
    )
    .await;

    let why = ok(
        &client,
        "policy_explain",
        json!({"action": "write", "resource": "path:a.txt"}),
    )
    .await;
    assert!(why.starts_with("Denied"), "{why}");
    let may = ok(&client, "what_may_i_do", json!({})).await;
    assert!(may.contains("read") && may.contains("approved/**"), "{may}");
    let filed = ok(
        &client,
        "request_approval",
        json!({"action": "write", "resource": "path:approved/plan.md"}),
    )
    .await;
    assert!(
        filed.contains("pending") && filed.contains("human:alice"),
        "{filed}"
    );
    client.cancel().await.unwrap();

    let after =
        String::from_utf8(envctl(dir, &["--actor", "agent:mcp", "status", "--json"]).stdout)
            .unwrap();
    let (a, b): (Value, Value) = (
        serde_json::from_str(&head).unwrap(),
        serde_json::from_str(&after).unwrap(),
    );
    assert_eq!(a["head"], b["head"], "denied calls recorded nothing");
    let approvals = String::from_utf8(
        envctl(
            dir,
            &["--actor", "human:alice", "policy", "approvals", "--json"],
        )
        .stdout,
    )
    .unwrap();
    assert!(approvals.contains("approved/plan.md"), "{approvals}");

    // Once a human grants it, the agent sees so and presents it with the one call it is for.
    let client = connect(dir).await;
    let asked = call(
        &client,
        "request_approval",
        json!({"action": "write", "resource": "path:approved/plan.md"}),
    )
    .await;
    let id = asked.structured_content.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        ok(&client, "approval_status", json!({"id": id}))
            .await
            .contains("pending")
    );
    let without = json!({"path": "approved/plan.md", "content": "plan\n"});
    refused(&client, "write_file", without.clone()).await;
    envctl(
        dir,
        &[
            "--actor",
            "human:alice",
            "policy",
            "approvals",
            "grant",
            &id,
        ],
    );
    let granted = call(&client, "approval_status", json!({"id": id})).await;
    assert_eq!(granted.structured_content.unwrap()["state"], "granted");
    let mut with = without.clone();
    with["approval"] = json!(id);
    // A write the approval lets through but that fails for another reason spends nothing.
    std::fs::create_dir_all(dir.join("approved/plan.md")).unwrap();
    refused(&client, "write_file", with.clone()).await;
    std::fs::remove_dir(dir.join("approved/plan.md")).unwrap();
    let status = call(&client, "approval_status", json!({"id": id})).await;
    assert_eq!(status.structured_content.unwrap()["uses_left"], 1);
    ok(&client, "write_file", with.clone()).await;
    assert_eq!(
        std::fs::read_to_string(dir.join("approved/plan.md")).unwrap(),
        "plan\n"
    );
    // Granted once, used once.
    with["content"] = json!("again\n");
    refused(&client, "write_file", with).await;
    assert_eq!(
        std::fs::read_to_string(dir.join("approved/plan.md")).unwrap(),
        "plan\n"
    );
    // Another actor's request is not this one's to read.
    let other = call(&client, "approval_status", json!({"id": "apr-not-yours"})).await;
    assert_eq!(other.is_error, Some(true));
    client.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_go_through_a_supervisor_socket() {
    let ws = workspace();
    let dir = ws.path();
    assert!(!dir.join(".environment/bus.db").exists(), "no queue yet");
    let (mut run, client) = supervised(dir, ()).await;
    let marked = ok(&client, "mark", json!({"name": "start"})).await;
    assert!(marked.contains("start"), "{marked}");
    let out = ok(
        &client,
        "exec",
        json!({"command": ["sh", "-c", "echo via; echo two > two.txt"]}),
    )
    .await;
    assert!(out.contains("via") && out.contains("recorded as"), "{out}");
    assert!(dir.join("two.txt").exists());
    let history = ok(&client, "history", json!({"all": true})).await;
    assert!(history.contains("agent:long"), "{history}");
    let preview = ok(
        &client,
        "restore",
        json!({"version": "start", "dry_run": true}),
    )
    .await;
    assert!(preview.contains("two.txt"), "{preview}");
    assert!(dir.join("two.txt").exists());
    ok(&client, "restore", json!({"version": "start"})).await;
    assert!(!dir.join("two.txt").exists());
    // Files go through the socket too.
    let written = ok(
        &client,
        "write_file",
        json!({"path": "notes/via.md", "content": "through the socket\n"}),
    )
    .await;
    assert!(written.contains("Wrote notes/via.md"), "{written}");
    assert_eq!(
        std::fs::read_to_string(dir.join("notes/via.md")).unwrap(),
        "through the socket\n"
    );
    let read = ok(&client, "read_file", json!({"path": "notes/via.md"})).await;
    assert_eq!(read, "through the socket\n");
    let listing = ok(&client, "list_files", json!({"prefix": "notes"})).await;
    assert!(listing.contains("notes/via.md"), "{listing}");
    // What does not exist did not happen.
    refused(&client, "read_file", json!({"path": "no/such.txt"})).await;
    refused(&client, "show", json!({"version": "no-such-version"})).await;
    // The queue works through the socket though none existed before the run began.
    ok(
        &client,
        "queue_publish",
        json!({"topic": "task.created", "payload": "through the socket"}),
    )
    .await;
    // Nothing was refused, and the answer says it in the same words as locally.
    assert_eq!(
        ok(&client, "refused", json!({})).await,
        "No change was refused."
    );
    client.cancel().await.unwrap();

    let killed = Command::new("kill")
        .args(["-TERM", &run.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    assert!(run.wait().unwrap().code().is_some());
}

/// `envctl run` of a long agent in `dir` (as `agent:long`), and an MCP client of `envctl mcp
/// --socket` through its supervisor, whose notifications `handler` gets.
async fn supervised<H: ClientHandler>(
    dir: &Path,
    handler: H,
) -> (std::process::Child, RunningService<RoleClient, H>) {
    let socket = dir.join(".environment/run/control.sock");
    let run = Command::new(BIN)
        .arg("-C")
        .arg(dir)
        .args(["--actor", "agent:long", "run", "--isolate", "none", "--"])
        .args(["sh", "-c", "echo one > one.txt; exec sleep 60"])
        .env_remove("ENVIRONMENT_DIR")
        .env_remove("ENVIRONMENT_SOCKET")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    for _ in 0..400 {
        if socket.exists() && dir.join("one.txt").exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    assert!(socket.exists(), "the supervisor never came up");
    let transport = TokioChildProcess::new(tokio::process::Command::new(BIN).configure(|cmd| {
        cmd.arg("mcp")
            .arg("--socket")
            .arg(&socket)
            .env_remove("ENVIRONMENT_DIR")
            .env_remove("ENVIRONMENT_SOCKET");
    }))
    .unwrap();
    (run, handler.serve(transport).await.unwrap())
}

/// Makes `depth` nested directories of 200-byte names below `root`, one descriptor at a time
/// (the path is too long for one system call); returns the directory and its relative path.
fn deep_dir(root: &Path, depth: usize) -> (std::os::fd::OwnedFd, String) {
    use rustix::fs::{Mode, OFlags};
    let mut dir = rustix::fs::open(root, OFlags::DIRECTORY, Mode::empty()).unwrap();
    let mut rel = Vec::new();
    for i in 0..depth {
        let name = format!("{i:03}{}", "d".repeat(197));
        rustix::fs::mkdirat(&dir, name.as_str(), Mode::from_raw_mode(0o755)).unwrap();
        dir = rustix::fs::openat(&dir, name.as_str(), OFlags::DIRECTORY, Mode::empty()).unwrap();
        rel.push(name);
    }
    (dir, rel.join("/"))
}

fn read_at(dir: &std::os::fd::OwnedFd, name: &str) -> Option<String> {
    use rustix::fs::{Mode, OFlags};
    let f = rustix::fs::openat(dir, name, OFlags::RDONLY, Mode::empty()).ok()?;
    let mut out = vec![0u8; 256];
    let n = rustix::io::read(&f, &mut out).unwrap();
    Some(String::from_utf8_lossy(&out[..n]).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_beyond_path_max_work_over_mcp() {
    use rustix::fs::{Mode, OFlags};
    let ws = workspace();
    let dir = ws.path();
    let (deep, rel) = deep_dir(dir, 25);
    assert!(rel.len() > 4096);
    let f = rustix::fs::openat(
        &deep,
        "bottom.txt",
        OFlags::CREATE | OFlags::WRONLY,
        Mode::from_raw_mode(0o644),
    )
    .unwrap();
    rustix::io::write(&f, b"deep\n").unwrap();
    drop(f);
    let client = connect(dir).await;
    let file = format!("{rel}/bottom.txt");
    assert!(
        ok(&client, "list_files", json!({}))
            .await
            .contains("bottom.txt")
    );
    assert_eq!(
        ok(&client, "read_file", json!({"path": file})).await,
        "deep\n"
    );
    ok(&client, "mark", json!({"name": "deep"})).await;
    ok(
        &client,
        "write_file",
        json!({"path": file, "content": "changed\n"}),
    )
    .await;
    assert_eq!(read_at(&deep, "bottom.txt").as_deref(), Some("changed\n"));
    assert!(
        ok(&client, "diff", json!({"from": "deep"}))
            .await
            .contains("bottom.txt")
    );
    ok(&client, "restore", json!({"version": "deep"})).await;
    assert_eq!(read_at(&deep, "bottom.txt").as_deref(), Some("deep\n"));
    client.cancel().await.unwrap();
}

/// A write below a file or through a symlink, and a call with an argument the tool does not
/// take, are refused and change nothing: not the tree, not the history, not what later calls
/// see or can do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_or_an_unknown_argument_changes_nothing() {
    let ws = workspace();
    let dir = ws.path();
    std::os::unix::fs::symlink("src", dir.join("link")).unwrap();
    let client = connect(dir).await;
    // The symlink is captured before the first call.
    ok(&client, "list_files", json!({})).await;
    let head = ok(&client, "show", json!({"version": "HEAD"})).await;

    refused(
        &client,
        "write_file",
        json!({"path": "a.txt/notes.md", "content": "x"}),
    )
    .await;
    refused(
        &client,
        "write_file",
        json!({"path": "link/notes.md", "content": "x"}),
    )
    .await;
    refused(&client, "read_file", json!({"path": "a.txt/notes.md"})).await;
    assert!(!dir.join("src/notes.md").exists());
    assert_eq!(
        std::fs::read_to_string(dir.join("a.txt")).unwrap(),
        "alpha\n"
    );
    assert_eq!(ok(&client, "show", json!({"version": "HEAD"})).await, head);

    // `dryRun` is not `dry_run`: the call is refused, not run as a real restore.
    ok(
        &client,
        "write_file",
        json!({"path": "a.txt", "content": "beta\n"}),
    )
    .await;
    let written = ok(&client, "show", json!({"version": "HEAD"})).await;
    let r = client
        .call_tool(
            CallToolRequestParams::new("restore".to_owned()).with_arguments(
                json!({"version": "HEAD~1", "dryRun": true})
                    .as_object()
                    .cloned()
                    .unwrap(),
            ),
        )
        .await;
    assert!(
        r.as_ref().map_or(true, |r| r.is_error == Some(true)),
        "an unknown argument must be refused: {r:?}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("a.txt")).unwrap(),
        "beta\n"
    );
    assert_eq!(
        ok(&client, "show", json!({"version": "HEAD"})).await,
        written
    );

    // Later restores still work.
    ok(&client, "restore", json!({"version": "HEAD~1"})).await;
    assert_eq!(
        std::fs::read_to_string(dir.join("a.txt")).unwrap(),
        "alpha\n"
    );
    client.cancel().await.unwrap();
}

/// The command ran; what its actor may not change is put back, kept as refused, and said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_s_refused_changes_are_put_back_and_said() {
    let ws = workspace();
    let dir = ws.path();
    std::fs::create_dir(dir.join("approved")).unwrap();
    envctl(dir, &["status"]);
    let rules = format!(
        "{RULES}{}",
        r#"
[[rule]]
id = "mcp-runs-sh"
effect = "permit"
principal = "agent:mcp"
actions = ["execute"]
resource = { program = "sh", args = ["..."] }

[[rule]]
id = "mcp-records-commands"
effect = "permit"
principal = "agent:mcp"
actions = ["write"]
resource = { object = "exec", key = "*" }

[[rule]]
id = "mcp-writes-src"
effect = "permit"
principal = "agent:mcp"
actions = ["write"]
resource = { path = "src/**" }
"#
    );
    std::fs::write(dir.join("rules.toml"), rules).unwrap();
    envctl(dir, &["policy", "load", "rules.toml"]);
    let client = connect(dir).await;
    let said = ok(
        &client,
        "exec",
        json!({"command": ["sh", "-c", "echo s > src/new.rs; echo t > top.txt; echo p > approved/plan.md"]}),
    )
    .await;
    let listed = ok(&client, "refused", json!({})).await;
    client.cancel().await.unwrap();
    assert!(
        listed.contains("agent:mcp write top.txt (deny")
            && listed.contains("agent:mcp write approved/plan.md (needs approval"),
        "{listed}"
    );
    assert!(said.contains("2 change(s) were NOT recorded"), "{said}");
    assert!(
        said.contains("top.txt") && said.contains("approved/plan.md"),
        "{said}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("src/new.rs")).unwrap(),
        "s\n"
    );
    assert!(!dir.join("top.txt").exists());
    assert!(!dir.join("approved/plan.md").exists());
    let out = envctl(dir, &["--actor", "agent:mcp", "--json", "refused"]);
    let listed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let verdict = |path: &str| {
        listed["refused"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["path"] == path)
            .map(|r| (r["actor"].clone(), r["verdict"].clone()))
    };
    assert_eq!(
        verdict("top.txt"),
        Some((json!("agent:mcp"), json!("deny"))),
        "{listed}"
    );
    assert_eq!(
        verdict("approved/plan.md"),
        Some((json!("agent:mcp"), json!("needs approval"))),
        "{listed}"
    );
    // Nothing of it reaches the branch later, under anyone.
    let log = envctl(dir, &["--actor", "agent:mcp", "--json", "log", "--all"]);
    let log: Value = serde_json::from_slice(&log.stdout).unwrap();
    for e in log["entries"].as_array().unwrap() {
        let keys = e["summary"]["keys"].as_array().unwrap();
        assert!(
            !keys.contains(&json!("top.txt")) && !keys.contains(&json!("approved/plan.md")),
            "{e}"
        );
    }
}

/// The server reads the policy live: a rule revoked by a human's `envctl policy load` while the
/// server runs applies to its next call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_revoked_while_the_server_runs_applies_to_the_next_call() {
    let ws = workspace();
    let dir = ws.path();
    let admin = r#"
[[rule]]
id = "operator-administers"
effect = "permit"
principal = "human:operator"
actions = ["write"]
resource = { environment = true }
"#;
    let writes = r#"
[[rule]]
id = "mcp-writes-a"
effect = "permit"
principal = "agent:mcp"
actions = ["write"]
resource = { path = "a.txt" }
"#;
    std::fs::write(dir.join("rules.toml"), format!("{RULES}{admin}{writes}")).unwrap();
    envctl(dir, &["policy", "load", "rules.toml"]);
    let client = connect(dir).await;
    ok(
        &client,
        "write_file",
        json!({"path": "a.txt", "content": "one\n"}),
    )
    .await;
    std::fs::write(dir.join("rules.toml"), format!("{RULES}{admin}")).unwrap();
    envctl(dir, &["policy", "load", "rules.toml"]);
    refused(
        &client,
        "write_file",
        json!({"path": "a.txt", "content": "two\n"}),
    )
    .await;
    client.cancel().await.unwrap();
    assert_eq!(std::fs::read_to_string(dir.join("a.txt")).unwrap(), "one\n");
}

/// A line that is not JSON gets JSON-RPC's parse error (`-32700`, id null), and the session
/// goes on: the next request is answered.
#[test]
fn a_malformed_line_is_answered_with_a_parse_error() {
    use std::io::{BufRead, Write};
    let ws = workspace();
    let mut child = Command::new(BIN)
        .arg("-C")
        .arg(ws.path())
        .arg("mcp")
        .env_remove("ENVIRONMENT_ACTOR")
        .env_remove("ENVIRONMENT_SOCKET")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"}}});
    writeln!(stdin, "{init}").unwrap();
    writeln!(
        stdin,
        r#"{{"jsonrpc":"2.0","method":"notifications/initialized"}}"#
    )
    .unwrap();
    writeln!(stdin, "this is not json {{").unwrap();
    writeln!(stdin, r#"{{"jsonrpc":"2.0","id":2,"method":"tools/list"}}"#).unwrap();
    // The end of input ends the session once everything sent is answered.
    drop(stdin);
    let answers: Vec<Value> = std::io::BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    child.wait().unwrap();
    let parse = answers
        .iter()
        .find(|a| a["error"]["code"] == -32700)
        .unwrap_or_else(|| panic!("no parse error in {answers:?}"));
    assert_eq!(parse["id"], Value::Null);
    assert!(
        answers
            .iter()
            .any(|a| a["id"] == 2 && a["result"]["tools"].is_array()),
        "{answers:?}"
    );
}

/// Every tool says whether it only reads, and whether it destroys or repeats harmlessly; a file
/// that is not text is read as base64 with its encoding named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_annotated_and_binary_files_read_as_base64() {
    let ws = workspace();
    let dir = ws.path();
    std::fs::write(dir.join("blob.bin"), [0xffu8, 0x00, 0xfe, b'a']).unwrap();
    let client = connect(dir).await;
    let tools = client.list_all_tools().await.unwrap();
    let reads = [
        "history",
        "show",
        "diff",
        "read_file",
        "list_files",
        "policy_explain",
        "what_may_i_do",
        "refused",
        "status",
        "marks",
        "branches",
        "approval_status",
        "effects",
        "verify",
        "queue_stats",
        "queue_leases",
        "file_diff",
    ];
    for t in &tools {
        let a = t
            .annotations
            .as_ref()
            .unwrap_or_else(|| panic!("{} has no annotations", t.name));
        let read_only = reads.contains(&t.name.as_ref());
        assert_eq!(a.read_only_hint, Some(read_only), "{}", t.name);
        if !read_only {
            assert!(a.destructive_hint.is_some(), "{}", t.name);
            assert!(a.idempotent_hint.is_some(), "{}", t.name);
        }
    }
    for destructive in ["restore", "undo", "redo", "exec", "write_file"] {
        let t = tools.iter().find(|t| t.name == destructive).unwrap();
        assert_eq!(t.annotations.as_ref().unwrap().destructive_hint, Some(true));
    }
    let read = ok(&client, "read_file", json!({"path": "blob.bin"})).await;
    client.cancel().await.unwrap();
    let (head, b64) = read.split_once("encoding: base64\n").expect(&read);
    assert!(head.contains("4 bytes"), "{read}");
    assert_eq!(b64, "/wD+YQ==");
}

/// A tournament over MCP: each candidate in a fork with a sandbox of its own, the one that
/// passes the test adopted into the workspace, the report in the structured content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tournament_adopts_its_winner_over_mcp() {
    if let Err(e) = environment_sandbox::Isolation::probe() {
        let why = format!("this host refuses unprivileged user namespaces: {e}");
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "a prerequisite is missing under CI=true: {why}"
        );
        eprintln!("skipped: {why}");
        return;
    }
    let ws = workspace();
    let dir = ws.path();
    let client = connect(dir).await;
    let r = call(
        &client,
        "tournament",
        json!({
            "candidates": ["echo one > pick.txt", "echo two > pick.txt"],
            "test": "grep -q two pick.txt",
            "pick_all": true,
        }),
    )
    .await;
    assert_ne!(r.is_error, Some(true), "{}", text(&r));
    conforms(&client, "tournament", &r).await;
    let report = &r.structured_content.as_ref().unwrap()["report"];
    assert_eq!(report["winner"], 1, "{report}");
    assert!(report["adopted"].is_string(), "{report}");
    assert_eq!(
        std::fs::read_to_string(dir.join("pick.txt")).unwrap(),
        "two\n"
    );
    // Nothing passes: nothing is adopted, and the workspace is as it was.
    let none = ok(
        &client,
        "tournament",
        json!({ "candidates": ["echo three > pick.txt"], "test": "false" }),
    )
    .await;
    assert!(none.contains("nothing was adopted"), "{none}");
    assert_eq!(
        std::fs::read_to_string(dir.join("pick.txt")).unwrap(),
        "two\n"
    );
    client.cancel().await.unwrap();
}

/// A resource read that fails says why in its code: not found (-32002), bad params (-32602),
/// denied (-32001, the control socket's, with `data.kind`), and reads nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_resource_read_says_why() {
    let ws = workspace();
    let dir = ws.path();
    let rules = r#"
[[rule]]
id = "mcp-reads-src"
effect = "permit"
principal = "agent:mcp"
actions = ["read"]
resource = { path = "src/**" }
"#;
    std::fs::write(dir.join("rules.toml"), rules).unwrap();
    envctl(dir, &["policy", "load", "rules.toml"]);
    let client = connect(dir).await;
    let read = |uri: &str| {
        let uri = uri.to_owned();
        let client = &client;
        async move {
            client
                .read_resource(ReadResourceRequestParams::new(uri))
                .await
        }
    };
    assert!(read("environment://files/HEAD/src/lib.rs").await.is_ok());
    let code = |r: Result<_, rmcp::ServiceError>| match r {
        Err(rmcp::ServiceError::McpError(e)) => (e.code.0, e.data),
        other => panic!("{other:?}"),
    };
    let (denied, data) = code(read("environment://files/HEAD/a.txt").await);
    assert_eq!(denied, -32001);
    assert_eq!(data.unwrap()["kind"], "denied");
    assert_eq!(
        code(read("environment://files/HEAD/src/missing.rs").await).0,
        -32002
    );
    assert_eq!(
        code(read("environment://files/HEAD/src/../../etc/passwd").await).0,
        -32602
    );
    client.cancel().await.unwrap();
}
