//! `envctl mcp`: the environment as an MCP server on stdin/stdout.
//!
//! Every tool call is an action of the configured actor and passes the policy when one is
//! loaded; a refused call changes nothing. Before each call, whatever changed in the workspace
//! since the last one is captured (attributed to the capture service), so the call sees, and
//! never overwrites, work done outside the server. A failure comes back with `isError` and a
//! text that first says the tool did NOT execute and its result must not be invented.

mod framing;
mod params;
mod tools;

use std::sync::{Arc, Mutex};

use environment_core::ActorId;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::{ErrorData, ServerHandler, ServiceExt, tool_handler};

use crate::failure::{Failure, Outcome};
use crate::target::{Remote, SupervisorAddr};
use crate::workspace::{Session, Workspace};

/// The most output of a command returned to the model, per stream.
const MAX_OUTPUT: usize = 32 * 1024;

/// Serves MCP on stdio until the client disconnects.
pub fn serve(ws: Workspace, actor: ActorId) -> Outcome<()> {
    let session = Session::open(ws, actor)?;
    stdio(EnvServer::new(session))
}

fn stdio(server: EnvServer) -> Outcome<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::other(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async move {
        let framed = framing::stdio();
        let service = server
            .serve((framed.input, framed.output))
            .await
            .map_err(|e| Failure::other(format!("the MCP handshake failed: {e}")))?;
        service
            .waiting()
            .await
            .map_err(|e| Failure::other(format!("the MCP server stopped: {e}")))?;
        // Everything the server answered reaches stdout before the process ends.
        let _ = framed.written.await;
        Ok(())
    })
}

/// A file's content for the model, the same locally and through a supervisor: the text when it
/// is UTF-8, else the bytes in base64 with the encoding named.
pub(crate) fn file_text(path: &str, size: u64, text: Option<&str>, base64: Option<&str>) -> String {
    match (text, base64) {
        (Some(t), _) => t.to_owned(),
        (None, b64) => format!(
            "{path} is not UTF-8 text ({size} bytes); its content in base64 (standard alphabet, \
             padded) follows.\nencoding: base64\n{}",
            b64.unwrap_or_default()
        ),
    }
}

/// The refused changes for the model, from their JSON form (the same locally and through a
/// supervisor): one line each.
pub(crate) fn refused_text(refused: &[serde_json::Value]) -> String {
    if refused.is_empty() {
        return "No change was refused.".to_owned();
    }
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    refused
        .iter()
        .map(|r| {
            format!(
                "#{} {} {} {} ({}: {})",
                r["id"],
                text(&r["actor"]),
                text(&r["change"]),
                text(&r["path"]),
                text(&r["verdict"]),
                text(&r["reason"])
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The text of a failed call: that it did not execute, why, and what to do next.
fn for_model(tool: &str, f: &Failure) -> String {
    if f.partial {
        let next = f
            .hint
            .as_deref()
            .unwrap_or("read the history before going on");
        return format!(
            "The tool `{tool}` did NOT complete as asked; do not report it as done. What \
             happened: {}. Next: {next}.",
            f.message
        );
    }
    let head = format!(
        "The tool `{tool}` did NOT execute: nothing changed, and its result must not be \
         invented or reported as done."
    );
    let rest = match &f.for_agent {
        Some(text) => match text.find("Reason:") {
            Some(i) => text[i..].to_owned(),
            None => text.clone(),
        },
        None => format!(
            "Reason: {}. Next: {}.",
            f.message.trim_end_matches('.'),
            f.hint
                .as_deref()
                .unwrap_or("report the error to a human if it persists")
        ),
    };
    format!("{head} {rest}")
}

fn truncated(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    if text.len() <= MAX_OUTPUT {
        return text.into_owned();
    }
    let mut end = MAX_OUTPUT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[… {} more bytes]", &text[..end], text.len() - end)
}

/// What the tools work on.
#[derive(Clone)]
enum Backend {
    /// The stores, opened by this process.
    Local(Arc<Mutex<Session>>),
    /// A running supervisor, through its control socket.
    Supervisor(Arc<Mutex<Remote>>),
}

/// The MCP server: one open environment (or a supervisor's socket), one actor.
#[derive(Clone)]
pub struct EnvServer {
    backend: Backend,
    tool_router: ToolRouter<EnvServer>,
}

impl EnvServer {
    /// A server over an open session.
    pub fn new(session: Session) -> EnvServer {
        EnvServer {
            backend: Backend::Local(Arc::new(Mutex::new(session))),
            tool_router: Self::tool_router(),
        }
    }

    /// A server whose tools go through a supervisor's control socket.
    pub fn through(remote: Remote) -> EnvServer {
        EnvServer {
            backend: Backend::Supervisor(Arc::new(Mutex::new(remote))),
            tool_router: Self::tool_router(),
        }
    }

    /// Runs a tool: through the supervisor as `method` with `params` (nulls left out) when
    /// the server goes through one, else `work` on the stores.
    async fn routed(
        &self,
        tool: &'static str,
        method: &'static str,
        params: serde_json::Value,
        work: impl FnOnce(&mut Session) -> Outcome<String> + Send + 'static,
    ) -> Result<CallToolResult, ErrorData> {
        let Backend::Supervisor(remote) = &self.backend else {
            return self.call(tool, work).await;
        };
        let remote = remote.clone();
        let params = match params {
            serde_json::Value::Object(m) => {
                serde_json::Value::Object(m.into_iter().filter(|(_, v)| !v.is_null()).collect())
            }
            other => other,
        };
        let done = tokio::task::spawn_blocking(move || {
            let mut r = remote.lock().unwrap_or_else(|p| p.into_inner());
            r.call(method, params)
        })
        .await
        .unwrap_or_else(|e| {
            Err(Failure::other(format!(
                "the tool stopped unexpectedly: {e}"
            )))
        });
        Ok(match done {
            Ok(answer) => {
                CallToolResult::success(vec![ContentBlock::text(answer_text(method, &answer))])
            }
            Err(f) => CallToolResult::error(vec![ContentBlock::text(for_model(tool, &f))]),
        })
    }

    /// Runs `work` on the blocking pool after capturing what changed since the last call.
    async fn call(
        &self,
        tool: &'static str,
        work: impl FnOnce(&mut Session) -> Outcome<String> + Send + 'static,
    ) -> Result<CallToolResult, ErrorData> {
        let session = match &self.backend {
            Backend::Local(s) => s.clone(),
            Backend::Supervisor(_) => {
                let f = Failure::new(
                    crate::failure::ExitCode::Unavailable,
                    format!("the {tool} tool does not go through the supervisor"),
                )
                .hint("use exec (e.g. `cat FILE`) for files while the supervisor runs");
                return Ok(CallToolResult::error(vec![ContentBlock::text(for_model(
                    tool, &f,
                ))]));
            }
        };
        let done = tokio::task::spawn_blocking(move || {
            let mut s = session.lock().unwrap_or_else(|p| p.into_inner());
            s.capture_found(&format!("changes found before the {tool} tool"))?;
            work(&mut s)
        })
        .await;
        let result = match done {
            Ok(r) => r,
            Err(e) => Err(Failure::other(format!(
                "the tool stopped unexpectedly: {e}"
            ))),
        };
        Ok(match result {
            Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Err(f) => CallToolResult::error(vec![ContentBlock::text(for_model(tool, &f))]),
        })
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for EnvServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("envctl", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "An environment for your work: every change to the workspace is recorded, so you \
                 can read the history, mark good states, and restore or undo. Some actions may \
                 be refused by a policy; a refused or failed tool call did not happen.",
            )
    }
}

/// MCP over stdio with the tools going through the supervisor at `addr` (its actor acts:
/// `actor` only names the server).
pub fn serve_remote(
    addr: SupervisorAddr,
    _actor: ActorId,
    credentials: environment_core::Credentials,
) -> Outcome<()> {
    let remote = Remote::connect(&addr, &credentials)?;
    stdio(EnvServer::through(remote))
}

/// The text of a supervisor's answer for a model.
fn answer_text(method: &str, answer: &serde_json::Value) -> String {
    if method == "exec" {
        let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
        return format!(
            "The command ran and exited with {}; recorded as operation {} ({} file(s) changed).\n--- stdout ---\n{}\n--- stderr ---\n{}",
            answer["exit"],
            text(&answer["op"]),
            answer["files_changed"],
            truncated(text(&answer["stdout"]["text"]).as_bytes()),
            truncated(text(&answer["stderr"]["text"]).as_bytes()),
        );
    }
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    match method {
        "refused" => refused_text(
            answer["refused"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default(),
        ),
        "file.read" => file_text(
            answer["path"].as_str().unwrap_or_default(),
            answer["size"].as_u64().unwrap_or_default(),
            answer["text"].as_str(),
            answer["base64"].as_str(),
        ),
        "file.list" => {
            let lines: Vec<String> = answer["entries"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| match e["kind"].as_str() {
                    Some("dir") => format!("{}/", text(&e["path"])),
                    Some("symlink") => format!("{} -> symlink", text(&e["path"])),
                    _ => format!("{} ({} bytes)", text(&e["path"]), e["size"]),
                })
                .collect();
            if lines.is_empty() {
                "No files.".to_owned()
            } else {
                lines.join("\n")
            }
        }
        "file.write" => format!(
            "Wrote {}; recorded as {}.",
            text(&answer["path"]),
            text(&answer["version"])
                .chars()
                .take(12)
                .collect::<String>()
        ),
        _ => serde_json::to_string_pretty(answer).unwrap_or_else(|_| answer.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use environment_core::EnvError;

    #[test]
    fn a_failure_says_first_that_nothing_happened() {
        let f = Failure::from(EnvError::UnknownVersion("v9".into()));
        let t = for_model("restore", &f);
        assert!(t.starts_with(
            "The tool `restore` did NOT execute: nothing changed, and its result must not be \
             invented or reported as done. Reason: unknown version"
        ));
        assert!(t.contains("Next: List the history"), "{t}");
        assert_eq!(
            t.matches("NOT").count(),
            1,
            "core's own preamble is not repeated: {t}"
        );

        let plain = Failure::usage("the command is empty").hint("pass an argv list");
        let t = for_model("exec", &plain);
        assert!(
            t.ends_with("Reason: the command is empty. Next: pass an argv list."),
            "{t}"
        );

        let mut partial = Failure::other("the command ran, but its changes are not yours");
        partial.partial = true;
        let t = for_model("exec", &partial);
        assert!(
            t.starts_with("The tool `exec` did NOT complete as asked"),
            "{t}"
        );
    }

    #[test]
    fn long_output_is_cut_on_a_character_boundary() {
        let long = "é".repeat(MAX_OUTPUT);
        let t = truncated(long.as_bytes());
        assert!(t.len() < long.len() && t.ends_with("more bytes]"));
        assert_eq!(truncated(b"short"), "short");
    }
}
