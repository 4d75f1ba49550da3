//! A running `envctl serve` for the HTTP suites, and the calls they make to it.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::BufRead;
use std::process::{Child, Stdio};

use environment_policy::{Policy, TokenLimits};
use reqwest::StatusCode;
use serde_json::Value;

use super::Ws;

/// A running `envctl serve`, stopped when dropped.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The session token it printed.
    pub token: String,
    /// The URL that signs a browser in.
    pub url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `envctl serve` in `ws` as its actor, on a free loopback port.
pub fn start(ws: &Ws) -> Server {
    start_with(ws, &[])
}

/// [`start`], with further arguments of `envctl serve`.
pub fn start_with(ws: &Ws, more: &[&str]) -> Server {
    let mut args = vec!["--json", "serve", "--listen", "127.0.0.1:0"];
    args.extend_from_slice(more);
    let mut child = ws
        .cmd(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let said: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    let listen = said["listen"].as_str().unwrap().to_owned();
    Server {
        child,
        base: format!("http://{listen}"),
        token: said["token"].as_str().unwrap().to_owned(),
        url: said["url"].as_str().unwrap().to_owned(),
    }
}

/// A capability token of the policy for `actor` (no further limits).
pub fn capability(ws: &Ws, actor: &str) -> String {
    let policy = Policy::open(
        &ws.home().join("policy.db"),
        std::sync::Arc::new(environment_core::SystemClock),
    )
    .unwrap();
    policy
        .issue_token(actor, TokenLimits::default())
        .unwrap()
        .encode()
}

/// POSTs a use case with `token` (none when empty): the status and the body.
pub async fn call(server: &Server, token: &str, method: &str, body: Value) -> (StatusCode, Value) {
    let mut req = reqwest::Client::new()
        .post(format!("{}/api/v1/{method}", server.base))
        .json(&body);
    if !token.is_empty() {
        req = req.bearer_auth(token);
    }
    let r = req.send().await.unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}
