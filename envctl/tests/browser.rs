//! The web view in a real browser: Debian's Chromium, headless, driven over WebDriver
//! (chromedriver). A person loads the history, sees an operation another process makes appear
//! live, opens its diff, grants a held merge and sees it land, redrives a dead letter, asks
//! the policy, and previews and confirms a restore. A screenshot of each page is saved under
//! `target/tmp/screenshots/`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::serving::{call, capability, start};
use common::{Ws, missing_prerequisite};
use environment_core::{ActRequest, ActorId, Intent, Key, LocalEnvironment, Options, Value as V};
use reqwest::StatusCode;
use serde_json::{Value, json};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A headless Chromium session through chromedriver, both ended when dropped.
struct Browser {
    driver: Child,
    http: reqwest::Client,
    session: String,
    shots: PathBuf,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

impl Browser {
    async fn start() -> Browser {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let http = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        for _ in 0..200 {
            if http.get(format!("{base}/status")).send().await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let profile = tempfile::tempdir().unwrap().keep();
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": CHROMIUM,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--window-size=1280,900",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        }}});
        let r: Value = http
            .post(format!("{base}/session"))
            .json(&caps)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let session = r["value"]["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no browser session: {r}"))
            .to_owned();
        let shots = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
        std::fs::create_dir_all(&shots).unwrap();
        Browser {
            driver,
            http,
            session: format!("{base}/session/{session}"),
            shots,
        }
    }

    async fn post(&self, path: &str, body: Value) -> Value {
        let r: Value = self
            .http
            .post(format!("{}{path}", self.session))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.post("/url", json!({ "url": url })).await;
    }

    /// Runs `script` in the page and returns what it returns.
    async fn js(&self, script: &str, args: Value) -> Value {
        self.post("/execute/sync", json!({ "script": script, "args": args }))
            .await
    }

    /// Waits (at most 10 s) until `script` returns something truthy; returns it.
    async fn until(&self, what: &str, script: &str, args: Value) -> Value {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let v = self.js(script, args.clone()).await;
            let truthy = !(v.is_null() || v == json!(false) || v == json!("") || v == json!(0));
            if truthy && v.get("error").is_none() {
                return v;
            }
            if Instant::now() > deadline {
                self.shot("failed").await;
                panic!("the page never showed {what}: {v}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Clicks the first element `css` selects, once it is there: found and clicked in one step,
    /// so a list the page redraws meanwhile (a live event) cannot take it away in between.
    async fn click(&self, css: &str) {
        self.until(
            css,
            "const e = document.querySelector(arguments[0]); if (!e) return false; e.click(); return true;",
            json!([css]),
        )
        .await;
    }

    async fn shot(&self, name: &str) -> PathBuf {
        let png = self
            .http
            .get(format!("{}/screenshot", self.session))
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png["value"].as_str().unwrap_or_default())
            .unwrap_or_default();
        let path = self.shots.join(format!("{name}.png"));
        std::fs::write(&path, bytes).unwrap();
        path
    }
}

fn chromium_missing() -> Option<String> {
    [CHROMIUM, CHROMEDRIVER]
        .iter()
        .find(|p| !Path::new(p).exists())
        .map(|p| format!("{p} is not installed (Debian's chromium and chromium-driver)"))
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
id = "coder-writes-features"
effect = "permit"
principal = "agent:coder"
actions = ["write"]
resource = { path = "feature*" }

[[rule]]
id = "coder-merges-with-approval"
effect = "permit"
principal = "agent:coder"
actions = ["write"]
resource = { branch = "main" }
approval_from = ["human:alice"]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_follows_and_steers_the_environment_in_a_browser() {
    if let Some(reason) = chromium_missing() {
        missing_prerequisite(&reason);
        return;
    }
    let ws = Ws::acting_as(Some("human:alice"));
    std::fs::write(ws.path("../rules.toml"), RULES).unwrap();
    ws.ok(&["policy", "load", "../rules.toml"]);
    let server = start(&ws);
    let browser = Browser::start().await;

    // The history.
    browser.goto(&server.url).await;
    browser
        .until(
            "the history",
            "return document.querySelectorAll('#history li').length",
            json!([]),
        )
        .await;
    browser
        .until(
            "who is signed in",
            "return document.getElementById('whoami').textContent.includes('human:alice')",
            json!([]),
        )
        .await;
    browser.shot("history").await;

    // An operation another process makes appears live.
    ws.ok(&["exec", "--", "sh", "-c", "echo hello > live.txt"]);
    let seen = Instant::now();
    let id = browser
        .until(
            "the other process's operation",
            "const li = [...document.querySelectorAll('#history li.fresh')].find(l => l.textContent.includes('live.txt')); return li ? li.dataset.id : null;",
            json!([]),
        )
        .await;
    eprintln!(
        "the operation appeared {} ms after its command ended",
        seen.elapsed().as_millis()
    );
    let id = id.as_str().unwrap().to_owned();

    // Its page, and the diff of the file it changed.
    browser.click(&format!("#history li[data-id='{id}']")).await;
    browser
        .until(
            "the operation's changes",
            "return [...document.querySelectorAll('#op-changes li')].some(l => l.textContent.includes('live.txt'))",
            json!([]),
        )
        .await;
    browser
        .js(
            "[...document.querySelectorAll('#op-changes li')].find(l => l.textContent.includes('live.txt')).click()",
            json!([]),
        )
        .await;
    browser
        .until(
            "the file's diff",
            "const d = document.querySelector('#op-diff .add'); return d && d.textContent.includes('hello')",
            json!([]),
        )
        .await;
    browser.shot("operation").await;

    // A merge the agent may do only with an approval: held, granted in the page, then done.
    let env = LocalEnvironment::open(ws.home(), Options::default()).unwrap();
    let alice = ActorId::new("human:alice").unwrap();
    let main = env.head("main").unwrap();
    env.create_branch(&alice, "feature", &main).unwrap();
    env.act_blocking(
        ActRequest::new(alice, Intent::edit("on feature"))
            .on("feature")
            .put(Key::fs("feature.txt").unwrap(), V::file("feature\n")),
    )
    .unwrap();
    drop(env);
    let coder = capability(&ws, "agent:coder");
    let (status, held) = call(&server, &coder, "merge", json!({ "source": "feature" })).await;
    assert_eq!(status, StatusCode::PRECONDITION_REQUIRED, "{held}");
    let approval = held["error"]["data"]["approval"]
        .as_str()
        .unwrap()
        .to_owned();
    browser.goto(&format!("{}/#approvals", server.base)).await;
    browser
        .click(&format!("#approvals tr[data-id='{approval}'] button.grant"))
        .await;
    browser
        .until(
            "the approval granted",
            "const r = document.querySelector(`#approvals tr[data-id='${arguments[0]}'] .state`); return r && r.textContent === 'granted'",
            json!([approval]),
        )
        .await;
    browser.shot("approvals").await;
    let (status, merged) = call(
        &server,
        &coder,
        "merge",
        json!({ "source": "feature", "approval": approval }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{merged}");
    assert_eq!(ws.read("feature.txt").as_deref(), Some("feature\n"));
    browser.goto(&format!("{}/#history", server.base)).await;
    browser
        .until(
            "the merge in the history",
            "return [...document.querySelectorAll('#history li.merge')].some(l => l.textContent.includes('agent:coder'))",
            json!([]),
        )
        .await;
    // Drawn as a graph: the branch's operation in its own lane, forked from main's and joined
    // back by the merge.
    browser
        .until(
            "the branch's lane, its fork and its merge",
            "const rows = [...document.querySelectorAll('#history li')]; \
             const merge = rows.find(l => l.classList.contains('merge') && l.textContent.includes('agent:coder')); \
             const feature = rows.find(l => l.textContent.includes('on feature')); \
             return !!(merge && merge.querySelector('svg .merge-edge') && feature && feature.querySelector('svg .dot[data-lane=\"1\"]') \
               && document.querySelector('#history svg .fork-edge') && document.getElementById('branches').textContent.includes('feature'))",
            json!([]),
        )
        .await;
    browser.shot("history-graph").await;

    // A dead letter, redriven from the queue board.
    let t = &server.token;
    call(
        &server,
        t,
        "queue.subscribe",
        json!({ "group": "workers", "topics": ["tasks"] }),
    )
    .await;
    call(
        &server,
        t,
        "queue.publish",
        json!({ "topic": "tasks", "payload": "build" }),
    )
    .await;
    for _ in 0..5 {
        let (_, claimed) = call(&server, t, "queue.claim", json!({ "group": "workers" })).await;
        let receipt = claimed["leases"][0]["receipt"].as_str().unwrap().to_owned();
        call(
            &server,
            t,
            "queue.nack",
            json!({ "receipt": receipt, "delay_ms": 0 }),
        )
        .await;
    }
    let (_, dead) = call(&server, t, "queue.dead", json!({ "group": "workers" })).await;
    assert_eq!(dead["dead"].as_array().unwrap().len(), 1, "{dead}");
    // And a lease in flight, shown on the board with its holder and attempt.
    call(
        &server,
        t,
        "queue.publish",
        json!({ "topic": "tasks", "payload": "review" }),
    )
    .await;
    let (_, held) = call(&server, t, "queue.claim", json!({ "group": "workers" })).await;
    let held_id = held["leases"][0]["message_id"].as_i64().unwrap();
    browser.goto(&format!("{}/#queue", server.base)).await;
    browser
        .until(
            "the lease in flight on the board",
            "return [...document.querySelectorAll('#queue li.lease')].some(l => l.textContent.startsWith('#' + arguments[0] + ' held by ') && l.textContent.includes('attempt 1'))",
            json!([held_id]),
        )
        .await;
    browser.shot("queue").await;
    browser.click("#queue button.redrive").await;
    browser
        .until(
            "the dead letter redriven",
            "return !document.querySelector('#queue button.redrive') && document.getElementById('queue').textContent.includes('0 dead')",
            json!([]),
        )
        .await;
    let (_, dead) = call(&server, t, "queue.dead", json!({ "group": "workers" })).await;
    assert!(dead["dead"].as_array().unwrap().is_empty(), "{dead}");

    // The policy, asked as a person types a resource: the service reads the text.
    browser.goto(&format!("{}/#policy", server.base)).await;
    browser
        .js(
            "document.getElementById('explain-actor').value = 'agent:coder';
             document.getElementById('explain-action').value = 'write';
             document.getElementById('explain-resource').value = 'path:feature-2.txt';
             document.getElementById('explain-form').requestSubmit();",
            json!([]),
        )
        .await;
    browser
        .until(
            "the explanation",
            "return document.getElementById('explain').textContent.startsWith('allow:')",
            json!([]),
        )
        .await;
    browser
        .js(
            "document.getElementById('may-actor').value = 'agent:coder';
             document.getElementById('may-resource').value = 'prefix:';
             document.getElementById('may-form').requestSubmit();",
            json!([]),
        )
        .await;
    browser
        .until(
            "what the coder may do",
            "return [...document.querySelectorAll('#may li')].some(l => l.textContent.includes('coder-writes-features'))",
            json!([]),
        )
        .await;
    browser.shot("policy").await;

    // A restore: previewed, then confirmed, from the page of the version before live.txt.
    let (_, shown) = call(&server, t, "show", json!({ "version": id })).await;
    let before = shown["parents"][0].as_str().unwrap().to_owned();
    browser.goto(&format!("{}/#op/{before}", server.base)).await;
    browser.click("#restore-preview").await;
    browser
        .until(
            "the restore's preview",
            "return document.getElementById('restore-plan').textContent.includes('removed')",
            json!([]),
        )
        .await;
    assert!(ws.path("live.txt").exists(), "a preview changes nothing");
    browser.shot("restore-preview").await;
    browser.click("#restore-confirm").await;
    browser
        .until(
            "the restore done",
            "return document.getElementById('restore-done').textContent.startsWith('Restored')",
            json!([]),
        )
        .await;
    browser.shot("restored").await;
    assert!(!ws.path("live.txt").exists());
    assert!(!ws.path("feature.txt").exists());
}
