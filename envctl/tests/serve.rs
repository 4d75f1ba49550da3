//! `envctl serve` end to end, with a real HTTP client: the API as the credential's actor, its
//! refusals (statuses and the contract text, nothing changed), the generated OpenAPI document,
//! the event stream resumed after a reconnect, and several MCP clients over HTTP at once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::Ws;
use common::serving::{Server, call, capability, start};
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A workspace with the rules loaded, and its server started as alice.
fn serve() -> (Ws, Server) {
    let ws = Ws::acting_as(Some("human:alice"));
    std::fs::write(ws.path("../rules.toml"), RULES).unwrap();
    ws.ok(&["policy", "load", "../rules.toml"]);
    let server = start(&ws);
    (ws, server)
}

const RULES: &str = r#"
[[rule]]
id = "alice-everything"
effect = "permit"
principal = "human:alice"
actions = ["read", "write", "delete", "execute", "publish", "consume", "approve"]
resource = "*"

[[rule]]
id = "coder-reads"
effect = "permit"
principal = "agent:coder"
actions = ["read"]
resource = "*"

[[rule]]
id = "coder-writes-src"
effect = "permit"
principal = "agent:coder"
actions = ["write"]
resource = { path = "src/**" }

[[rule]]
id = "coder-releases-with-approval"
effect = "permit"
principal = "agent:coder"
actions = ["write"]
resource = { path = "release/**" }
approval_from = ["human:alice"]
"#;

/// A refusal says first that nothing happened, and why.
fn says_why(body: &Value) {
    let text = body["error"]["for_agent"].as_str().unwrap_or_default();
    assert!(text.starts_with("The action was NOT performed"), "{body}");
    assert!(text.contains("Next:"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_acts_as_the_credential_s_actor_and_a_refusal_changes_nothing() {
    let (ws, server) = serve();
    let coder = capability(&ws, "agent:coder");

    // No credential, a wrong one: 401, with the contract text.
    for token in ["", "envs_0000", "not a token at all"] {
        let (status, body) = call(&server, token, "status", json!({})).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{token:?}");
        says_why(&body);
    }
    let events = reqwest::get(format!("{}/api/v1/events", server.base))
        .await
        .unwrap();
    assert_eq!(events.status(), StatusCode::UNAUTHORIZED);

    // Each credential acts as its actor.
    let (status, me) = call(&server, &server.token, "status", json!({})).await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(me["actor"], "human:alice");
    let (_, them) = call(&server, &coder, "status", json!({})).await;
    assert_eq!(them["actor"], "agent:coder");
    let (status, wrote) = call(
        &server,
        &coder,
        "file.write",
        json!({ "path": "src/lib.rs", "content": "pub fn f() {}\n" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{wrote}");
    assert_eq!(ws.read("src/lib.rs").as_deref(), Some("pub fn f() {}\n"));
    let shown = ws.json(&["show", wrote["version"].as_str().unwrap()]);
    assert_eq!(shown["actor"], "agent:coder");

    // What the actor may not do: 403; held for an approval: 428 with the request filed.
    let head = ws.head("human:alice");
    let (status, body) = call(
        &server,
        &coder,
        "file.write",
        json!({ "path": "README.md", "content": "defaced\n" }),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    says_why(&body);
    let (status, body) = call(
        &server,
        &coder,
        "file.write",
        json!({ "path": "release/v1", "content": "1\n" }),
    )
    .await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{body}");
    assert!(body["error"]["data"]["approval"].is_string(), "{body}");
    assert_eq!(ws.read("README.md").as_deref(), Some("# demo\n"));
    assert!(!ws.path("release/v1").exists());
    // An actor the rules give nothing reads nothing through the new lists and diffs either:
    // neither a file's changes nor who holds which task.
    let stranger = capability(&ws, "agent:stranger");
    for (method, params) in [
        (
            "file.diff",
            json!({ "path": "README.md", "from": "HEAD~1" }),
        ),
        ("queue.leases", json!({})),
        ("queue.leases", json!({ "group": "workers" })),
    ] {
        let (status, body) = call(&server, &stranger, method, params).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method}: {body}");
        assert!(
            body.get("hunks").is_none() && body.get("leases").is_none(),
            "{body}"
        );
        says_why(&body);
    }

    // A resource as typed (the web view sends what the person wrote) or as its fields: one
    // answer, read by the service.
    let mut answers = Vec::new();
    for resource in [json!("path:release/v1"), json!({ "path": "release/v1" })] {
        let (status, body) = call(
            &server,
            &coder,
            "policy.explain",
            json!({ "action": "write", "resource": resource }),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        answers.push((body["outcome"].clone(), body["rules"].clone()));
    }
    assert_eq!(answers[0], answers[1]);
    assert_eq!(answers[0].1, json!(["coder-releases-with-approval"]));
    let (_, filed) = call(&server, &server.token, "approval.list", json!({})).await;

    // Malformed requests: 400 (or 404 for no such use case), nothing changed.
    for (method, body) in [
        (
            "file.write",
            json!({ "path": "a.txt", "content": "x", "bogus": true }),
        ),
        ("file.write", json!({ "path": "../escape", "content": "x" })),
        ("restore", json!({ "version": 7 })),
        ("restore", json!({ "version": "HEAD~1", "dryRun": true })),
        (
            "policy.explain",
            json!({ "action": "write", "resource": "planet:mars" }),
        ),
        (
            "approval.request",
            json!({ "action": "write", "resource": "path:../release" }),
        ),
        ("policy.what_may_i_do", json!({ "resource": 7 })),
        (
            "policy.explain",
            json!({ "action": "write", "resource": { "path": "a", "topic": "t" } }),
        ),
    ] {
        let (status, answer) = call(&server, &server.token, method, body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {body}: {answer}");
        says_why(&answer);
    }
    let (status, _) = call(&server, &server.token, "no.such.thing", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let raw = reqwest::Client::new()
        .post(format!("{}/api/v1/status", server.base))
        .bearer_auth(&server.token)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(raw.status(), StatusCode::BAD_REQUEST);
    assert!(!ws.path("a.txt").exists() && !ws.path("../escape").exists());
    assert_eq!(ws.head("human:alice"), head, "refusals recorded nothing");
    let (_, still) = call(&server, &server.token, "approval.list", json!({})).await;
    assert_eq!(still, filed, "a refused approval request filed nothing");

    // Another site: a rebound name or another origin is refused before anything runs.
    let client = reqwest::Client::new();
    let rebound = client
        .post(format!("{}/api/v1/status", server.base))
        .header("Host", "attacker.example")
        .bearer_auth(&server.token)
        .send()
        .await
        .unwrap();
    assert_eq!(rebound.status(), StatusCode::MISDIRECTED_REQUEST);
    let cross = client
        .post(format!("{}/api/v1/file.write", server.base))
        .header("Origin", "http://attacker.example")
        .bearer_auth(&server.token)
        .json(&json!({ "path": "csrf.txt", "content": "x" }))
        .send()
        .await
        .unwrap();
    assert_eq!(cross.status(), StatusCode::FORBIDDEN);
    assert!(!ws.path("csrf.txt").exists());

    // A revoked session token is refused at once.
    ws.ok(&["serve", "--revoke"]);
    let (status, _) = call(&server, &server.token, "status", json!({})).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = call(&server, &coder, "status", json!({})).await;
    assert_eq!(status, StatusCode::OK, "capability tokens stand");
    common::also_unprivileged(
        "the_api_acts_as_the_credential_s_actor_and_a_refusal_changes_nothing",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_lists_every_use_case_and_each_refuses_bad_input() {
    let (ws, server) = serve();
    let doc: Value = reqwest::get(format!("{}/openapi.json", server.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    for m in environment_workspace::Method::ALL {
        let path = format!("/api/v1/{}", m.name());
        let op = &paths[&path]["post"];
        assert_eq!(op["operationId"], m.name(), "{path}");
        for schema in [
            &op["requestBody"]["content"]["application/json"]["schema"],
            &op["responses"]["200"]["content"]["application/json"]["schema"],
        ] {
            assert_eq!(schema["type"], "object", "{path}");
            jsonschema::validator_for(schema).unwrap_or_else(|e| panic!("{path}: {e}"));
        }
        for status in ["400", "401", "403", "404", "409", "428", "503"] {
            let r = op["responses"][status]["$ref"].as_str().unwrap();
            let name = r.rsplit('/').next().unwrap();
            assert!(doc["components"]["responses"][name].is_object(), "{r}");
        }
    }
    assert!(paths.contains_key("/api/v1/events"));

    // Every route refuses a parameter it does not take, as the document says, and nothing
    // changes.
    let head = ws.head("human:alice");
    for m in environment_workspace::Method::ALL {
        let (status, body) =
            call(&server, &server.token, m.name(), json!({ "surely_not": 1 })).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{}: {body}", m.name());
        says_why(&body);
    }
    assert_eq!(ws.head("human:alice"), head);
}

/// Reads events from `response` until `until` says it has them all (at most 10 s).
async fn events_until(
    response: &mut reqwest::Response,
    until: impl Fn(&[(String, String, Value)]) -> bool,
) -> Vec<(String, String, Value)> {
    let mut got = Vec::new();
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !until(&got) {
        let chunk = tokio::time::timeout_at(deadline, response.chunk())
            .await
            .expect("the events came in time")
            .unwrap()
            .expect("the stream stays open");
        text.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = text.find("\n\n") {
            let block: String = text.drain(..end + 2).collect();
            let (mut kind, mut id, mut data) = (String::new(), String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event: ") {
                    kind = v.to_owned();
                } else if let Some(v) = line.strip_prefix("id: ") {
                    id = v.to_owned();
                } else if let Some(v) = line.strip_prefix("data: ") {
                    data.push_str(v);
                }
            }
            if !kind.is_empty() {
                got.push((kind, id, serde_json::from_str(&data).unwrap_or(Value::Null)));
            }
        }
    }
    got
}

fn ops(events: &[(String, String, Value)]) -> Vec<(String, Value)> {
    events
        .iter()
        .filter(|(k, _, _)| k == "operation")
        .map(|(_, id, v)| (id.clone(), v.clone()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_resumes_after_a_reconnect_without_losing_an_event() {
    let (ws, server) = serve();
    let client = reqwest::Client::new();
    let open = |last: Option<String>| {
        let mut req = client
            .get(format!("{}/api/v1/events", server.base))
            .bearer_auth(&server.token);
        if let Some(id) = last {
            req = req.header("Last-Event-ID", id);
        }
        req.send()
    };
    let mut stream = open(None).await.unwrap();
    assert_eq!(stream.status(), StatusCode::OK);
    // An operation recorded by another process shows up.
    ws.ok(&["exec", "--", "sh", "-c", "echo one > one.txt"]);
    let first = events_until(&mut stream, |e| !ops(e).is_empty()).await;
    let (last_id, op) = ops(&first).remove(0);
    assert_eq!(op["intent"]["kind"], "command", "{op}");
    drop(stream);

    // While the client is away, two more.
    for n in ["two", "three"] {
        let (status, _) = call(
            &server,
            &server.token,
            "file.write",
            json!({ "path": format!("{n}.txt"), "content": n }),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    let mut again = open(Some(last_id.clone())).await.unwrap();
    let missed = events_until(&mut again, |e| ops(e).len() >= 2).await;
    let missed = ops(&missed);
    let ids: Vec<u64> = missed.iter().map(|(id, _)| id.parse().unwrap()).collect();
    let after: u64 = last_id.parse().unwrap();
    assert_eq!(ids, [after + 1, after + 2], "{missed:?}");
    assert_eq!(missed[0].1["intent"]["text"], "write two.txt");
    assert_eq!(missed[1].1["intent"]["text"], "write three.txt");
}

/// A page of the server's own origin may call it, whichever of its names it was opened by
/// (`localhost` as well as the address it printed) and, behind a proxy that ends TLS, by its
/// public name over HTTPS; any other origin, or the public name over plain HTTP, may not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_s_own_pages_may_call_it_by_each_of_its_names() {
    let ws = Ws::acting_as(Some("human:alice"));
    let server = common::serving::start_with(&ws, &["--host", "env.example.org"]);
    let port = server.base.rsplit(':').next().unwrap().to_owned();
    let client = reqwest::Client::new();
    let write = |host: String, origin: String, path: &'static str| {
        client
            .post(format!("{}/api/v1/file.write", server.base))
            .header("Host", host)
            .header("Origin", origin)
            .bearer_auth(&server.token)
            .json(&json!({ "path": path, "content": "x" }))
            .send()
    };
    let local = format!("localhost:{port}");
    let by_name = write(local.clone(), format!("http://{local}"), "by-name.txt")
        .await
        .unwrap();
    assert_eq!(by_name.status(), StatusCode::OK);
    let public = "env.example.org".to_owned();
    let proxied = write(public.clone(), format!("https://{public}"), "proxied.txt")
        .await
        .unwrap();
    assert_eq!(proxied.status(), StatusCode::OK);
    for (origin, path) in [
        (format!("http://{public}"), "plain.txt"),
        (format!("https://{local}"), "tls-local.txt"),
        (
            "https://env.example.org.attacker.example".to_owned(),
            "lookalike.txt",
        ),
    ] {
        let refused = write(public.clone(), origin.clone(), path).await.unwrap();
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{origin}");
        assert!(!ws.path(path).exists(), "{origin}");
    }
    assert!(ws.path("by-name.txt").exists() && ws.path("proxied.txt").exists());
    common::also_unprivileged("the_server_s_own_pages_may_call_it_by_each_of_its_names");
}

/// Without a supervisor, the server watches the tree itself: a file someone edits with no
/// command at all is captured and reaches a connected stream, and the API reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edit_in_the_tree_reaches_the_stream_without_a_command() {
    let (ws, server) = serve();
    let mut stream = reqwest::Client::new()
        .get(format!("{}/api/v1/events", server.base))
        .bearer_auth(&server.token)
        .send()
        .await
        .unwrap();
    std::fs::write(ws.path("edited.txt"), "by hand\n").unwrap();
    let touches = |v: &Value| v["summary"]["keys"].to_string().contains("edited.txt");
    let got = events_until(&mut stream, |e| ops(e).iter().any(|(_, v)| touches(v))).await;
    let (_, op) = ops(&got).into_iter().find(|(_, v)| touches(v)).unwrap();
    assert_eq!(op["intent"]["kind"], "capture", "{op}");
    let (status, read) = call(
        &server,
        &server.token,
        "file.read",
        json!({ "path": "edited.txt" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(read["text"], "by hand\n");
}

/// Each credential has its own rate (`--rate-limit`, in bursts of twice as many): past it, a
/// request is refused with 429 before it runs and changes nothing, while another credential is
/// still served. A body over 16 MiB is refused whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_its_rate_or_its_size_a_request_is_refused_and_changes_nothing() {
    let ws = Ws::acting_as(Some("human:alice"));
    std::fs::write(ws.path("../rules.toml"), RULES).unwrap();
    ws.ok(&["policy", "load", "../rules.toml"]);
    let server = common::serving::start_with(&ws, &["--rate-limit", "5"]);
    let coder = capability(&ws, "agent:coder");
    let mut refused = None;
    for n in 0..40 {
        let path = format!("src/r{n}.txt");
        let (status, body) = call(
            &server,
            &coder,
            "file.write",
            json!({ "path": path, "content": "x" }),
        )
        .await;
        if status == StatusCode::TOO_MANY_REQUESTS {
            assert_eq!(body["error"]["kind"], "unavailable", "{body}");
            refused = Some(path);
            break;
        }
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(n < 20, "the burst of 10 is long spent by request {n}");
    }
    let refused = refused.expect("the rate was enforced");
    assert!(!ws.path(&refused).exists(), "a refused write wrote nothing");
    let (status, _) = call(&server, &server.token, "status", json!({})).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "another credential has its own rate"
    );

    // A body announced over the limit is refused before it is read (the server answers, and
    // closes, without waiting for it).
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = server.base.trim_start_matches("http://").to_owned();
    let mut raw = tokio::net::TcpStream::connect(&address).await.unwrap();
    let head = format!(
        "POST /api/v1/file.write HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{{\"path\": \"huge.txt\"",
        server.token,
        17 << 20
    );
    raw.write_all(head.as_bytes()).await.unwrap();
    let mut answer = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), raw.read(&mut answer))
        .await
        .expect("the server answered without the body")
        .unwrap();
    let line = String::from_utf8_lossy(&answer[..n]).to_string();
    assert!(line.starts_with("HTTP/1.1 413"), "{line}");
    assert!(!ws.path("huge.txt").exists());
    common::also_unprivileged("past_its_rate_or_its_size_a_request_is_refused_and_changes_nothing");
}

/// A file that is not text is compared by size and content hash, not line by line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_file_is_compared_by_size_and_hash() {
    let (ws, server) = serve();
    ws.ok(&["mark", "before"]);
    ws.ok(&["exec", "--", "sh", "-c", "printf 'a\\377\\000b' > blob.bin"]);
    let (status, diff) = call(
        &server,
        &server.token,
        "file.diff",
        json!({ "path": "blob.bin", "from": "before" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{diff}");
    assert_eq!(diff["text"], false, "{diff}");
    assert_eq!(diff["before"], Value::Null);
    assert_eq!(diff["after"]["size"], 4);
    let bytes = std::fs::read(ws.path("blob.bin")).unwrap();
    assert_eq!(
        diff["after"]["hash"],
        blake3::hash(&bytes).to_hex().to_string()
    );
    assert_eq!(diff["hunks"], json!([]));
    // A symlink is told by its kind and target's hash, not refused.
    ws.ok(&["exec", "--", "ln", "-s", "blob.bin", "link"]);
    let (status, diff) = call(
        &server,
        &server.token,
        "file.diff",
        json!({ "path": "link", "from": "before" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{diff}");
    assert_eq!(
        (diff["text"].clone(), diff["after"]["kind"].clone()),
        (json!(false), json!("symlink"))
    );
}

/// The queue's figures come with a new stream, and again after every change of the queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_s_changes_are_on_the_event_stream() {
    let (_ws, server) = serve();
    let mut stream = reqwest::Client::new()
        .get(format!("{}/api/v1/events", server.base))
        .bearer_auth(&server.token)
        .send()
        .await
        .unwrap();
    let queue = |e: &[(String, String, Value)]| -> Vec<Value> {
        e.iter()
            .filter(|(k, _, _)| k == "queue")
            .map(|(_, _, v)| v.clone())
            .collect()
    };
    let opened = events_until(&mut stream, |e| !queue(e).is_empty()).await;
    let topics = |v: &Value| -> Vec<String> {
        v["topics"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["topic"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(!topics(&queue(&opened)[0]).contains(&"tasks".to_owned()));
    let (status, _) = call(
        &server,
        &server.token,
        "queue.publish",
        json!({ "topic": "tasks", "payload": "build" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let changed = events_until(&mut stream, |e| {
        queue(e)
            .iter()
            .any(|v| topics(v).contains(&"tasks".to_owned()))
    })
    .await;
    let last = queue(&changed).pop().unwrap();
    assert_eq!(last["topics"][0]["retained"], 1, "{last}");

    // A message waiting in a group changes nothing while it waits (its age grows, but that is
    // no event): no further queue event comes unasked.
    let (status, _) = call(
        &server,
        &server.token,
        "queue.subscribe",
        json!({ "group": "workers", "topics": ["tasks"] }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = call(
        &server,
        &server.token,
        "queue.publish",
        json!({ "topic": "tasks", "payload": "wait" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let waiting = |v: &Value| v["topics"][0]["groups"][0]["depth"] == 1;
    events_until(&mut stream, |e| queue(e).iter().any(waiting)).await;
    let mut text = String::new();
    let quiet = tokio::time::Instant::now() + Duration::from_millis(1500);
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(quiet, stream.chunk()).await {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(!text.contains("event: queue"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_mcp_clients_over_http_each_act_as_themselves() {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
    let (ws, server) = serve();
    let coder = capability(&ws, "agent:coder");
    let connect = |token: String| {
        let url = format!("{}/mcp", server.base);
        async move {
            let transport = StreamableHttpClientTransport::from_config(
                StreamableHttpClientTransportConfig::with_uri(url).auth_header(token),
            );
            ().serve(transport).await.unwrap()
        }
    };
    let (alice, agent) = tokio::join!(connect(server.token.clone()), connect(coder));
    let write = |path: &str| {
        CallToolRequestParams::new("write_file").with_arguments(
            json!({ "path": path, "content": "hi\n" })
                .as_object()
                .cloned()
                .unwrap(),
        )
    };
    let (a, b) = tokio::join!(
        alice.call_tool(write("notes/alice.md")),
        agent.call_tool(write("src/agent.rs"))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_ne!(a.is_error, Some(true), "{a:?}");
    assert_ne!(b.is_error, Some(true), "{b:?}");
    let by = |v: &rmcp::model::CallToolResult| {
        let version = v.structured_content.as_ref().unwrap()["version"]
            .as_str()
            .unwrap()
            .to_owned();
        ws.json(&["show", &version])["actor"].clone()
    };
    assert_eq!(by(&a), "human:alice");
    assert_eq!(by(&b), "agent:coder");
    // The agent's own limits hold over HTTP too.
    let refused = agent.call_tool(write("README.md")).await.unwrap();
    assert_eq!(refused.is_error, Some(true));
    assert_eq!(ws.read("README.md").as_deref(), Some("# demo\n"));
    // No credential, no MCP.
    let anonymous = reqwest::Client::new()
        .post(format!("{}/mcp", server.base))
        .header("Accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let _ = (alice.cancel().await, agent.cancel().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_long_list_comes_a_page_at_a_time() {
    let (_ws, server) = serve();
    let t = &server.token;
    let (status, _) = call(&server, t, "mark", json!({ "name": "start" })).await;
    assert_eq!(status, StatusCode::OK);
    for n in 0..7 {
        let (status, _) = call(
            &server,
            t,
            "file.write",
            json!({ "path": format!("pages/{n}.txt"), "content": n.to_string() }),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let (status, _) = call(
            &server,
            t,
            "effect.begin",
            json!({ "key": format!("k{n}"), "target": "https://svc.example", "request": "r" }),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
    }
    // Each list, walked page by page, gives every item once and in order.
    async fn walk(
        server: &Server,
        method: &str,
        params: Value,
        items: &str,
        cursor: &str,
        key: &str,
    ) -> Vec<Value> {
        let mut seen = Vec::new();
        let mut params = params;
        loop {
            let (status, page) = call(server, &server.token, method, params.clone()).await;
            assert_eq!(status, StatusCode::OK, "{method} {params}: {page}");
            let got = page[items].as_array().unwrap();
            assert!(got.len() <= 3, "{page}");
            seen.extend(got.iter().map(|i| i[key].clone()));
            match &page["next"] {
                Value::Null => return seen,
                next => params[cursor] = next.clone(),
            }
        }
    }
    let ops = walk(
        &server,
        "history",
        json!({ "all": true, "limit": 3 }),
        "entries",
        "from",
        "seq",
    )
    .await;
    let seqs: Vec<u64> = ops.iter().map(|s| s.as_u64().unwrap()).collect();
    let mut expected = seqs.clone();
    expected.sort_unstable_by(|a, b| b.cmp(a));
    expected.dedup();
    assert_eq!(seqs, expected, "newest first, each once");
    assert_eq!(seqs.last(), Some(&1), "down to the first operation");
    // The group subscribes first: it receives what is published from then on.
    let (status, _) = call(
        &server,
        t,
        "queue.subscribe",
        json!({ "group": "paged", "topics": ["paged"] }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    for n in 0..7 {
        for (method, params) in [
            ("mark", json!({ "name": format!("m{n}") })),
            ("branch.create", json!({ "name": format!("b{n}") })),
            (
                "queue.publish",
                json!({ "topic": "paged", "payload": n.to_string() }),
            ),
        ] {
            let (status, body) = call(&server, t, method, params).await;
            assert_eq!(status, StatusCode::OK, "{method}: {body}");
        }
    }
    for (method, params, items, key, expected) in [
        (
            "file.list",
            json!({ "prefix": "pages", "limit": 3 }),
            "entries",
            "path",
            8, // the directory and its 7 files
        ),
        ("effect.list", json!({ "limit": 3 }), "effects", "id", 7),
        ("marks", json!({ "limit": 3 }), "marks", "name", 8), // start and m0..m6
        ("branch.list", json!({ "limit": 3 }), "branches", "name", 8), // main and b0..b6
        (
            "diff",
            json!({ "from": "start", "prefix": "pages", "limit": 3 }),
            "changes",
            "path",
            8, // the directory and its 7 files
        ),
    ] {
        let listed = walk(&server, method, params, items, "after", key).await;
        assert_eq!(listed.len(), expected, "{method}: {listed:?}");
    }
    let (status, claimed) = call(
        &server,
        t,
        "queue.claim",
        json!({ "group": "paged", "max": 7 }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{claimed}");
    let leases = walk(
        &server,
        "queue.leases",
        json!({ "group": "paged", "limit": 3 }),
        "leases",
        "after",
        "message_id",
    )
    .await;
    assert_eq!(leases.len(), 7, "{leases:?}");
    // Given back on their last attempt, every one is a dead letter.
    for attempt in 1..=5 {
        let leases = if attempt == 1 {
            claimed["leases"].as_array().unwrap().clone()
        } else {
            let (_, again) = call(
                &server,
                t,
                "queue.claim",
                json!({ "group": "paged", "max": 7 }),
            )
            .await;
            again["leases"].as_array().unwrap().clone()
        };
        assert_eq!(leases.len(), 7, "attempt {attempt}: {leases:?}");
        for l in leases {
            let receipt = l["receipt"].clone();
            let (status, body) = call(
                &server,
                t,
                "queue.nack",
                json!({ "receipt": receipt, "delay_ms": 0 }),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }
    }
    let dead = walk(
        &server,
        "queue.dead",
        json!({ "group": "paged", "limit": 3 }),
        "dead",
        "after",
        "message_id",
    )
    .await;
    assert_eq!(dead.len(), 7, "{dead:?}");
    // A cursor that names nothing is refused.
    let (status, _) = call(&server, t, "file.list", json!({ "after": "nowhere" })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// A failure of the queue's background purge reaches whoever asks for the status, and goes
/// once a purge succeeds again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_queue_purge_is_in_the_status_until_one_succeeds() {
    let (ws, server) = serve();
    let (status, _) = call(
        &server,
        &server.token,
        "queue.publish",
        json!({ "topic": "tasks", "payload": "build" }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let upkeep = || async {
        let (status, me) = call(&server, &server.token, "status", json!({})).await;
        assert_eq!(status, StatusCode::OK, "{me}");
        me["queue_upkeep_failure"].clone()
    };
    assert!(upkeep().await.is_null());

    // An operator's mistake on the queue's file: a table the purge needs is gone.
    let bus = rusqlite::Connection::open(ws.home().join("bus.db")).unwrap();
    bus.busy_timeout(Duration::from_secs(10)).unwrap();
    bus.execute_batch("ALTER TABLE bus_dedup RENAME TO bus_dedup_away")
        .unwrap();
    let until = |failing: bool| async move {
        // The server purges every five seconds.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        loop {
            let now = upkeep().await;
            if now.is_null() != failing {
                return now;
            }
            assert!(std::time::Instant::now() < deadline, "status stayed {now}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    let why = until(true).await;
    assert!(why.as_str().is_some_and(|w| !w.is_empty()), "{why}");

    bus.execute_batch("ALTER TABLE bus_dedup_away RENAME TO bus_dedup")
        .unwrap();
    until(false).await;
}
