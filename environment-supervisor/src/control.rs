//! A small blocking client of the supervisor's control socket, for agents written in Rust and
//! for command-line tools.
//!
//! ```no_run
//! use environment_supervisor::ControlClient;
//!
//! # fn main() -> Result<(), environment_supervisor::ControlError> {
//! // Inside the sandbox: the socket's path is in ENVIRONMENT_SOCKET.
//! let mut control = ControlClient::from_env()?;
//! control.mark("before-refactor")?;
//! // … the refactor goes wrong …
//! let restored = control.restore("before-refactor", false)?;
//! println!("restored; the head is now {:?}", restored.version);
//! # Ok(()) }
//! ```

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;

use environment_workspace::{Request, commands, versions};
use serde_json::{Value, json};

use crate::{SOCKET_VAR, TOKEN_VAR};

/// What a call on the control socket can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// `ENVIRONMENT_SOCKET` is not set: not running under a supervisor.
    #[error("ENVIRONMENT_SOCKET is not set: this process does not run under a supervisor")]
    NoSocket,
    /// The socket could not be reached or the connection broke.
    #[error("control socket: {0}")]
    Io(#[from] std::io::Error),
    /// The supervisor's answer is not a JSON-RPC response.
    #[error("unexpected answer from the supervisor: {0}")]
    Protocol(String),
    /// The supervisor answered with an error.
    #[error("{message} (code {code})")]
    Rpc {
        /// One of the codes of [`crate::rpc`].
        code: i64,
        /// A short description.
        message: String,
        /// Details; `for_agent` holds the text for a language model.
        data: Value,
    },
}

impl ControlError {
    /// The JSON-RPC error code, when the supervisor answered with one.
    pub fn code(&self) -> Option<i64> {
        match self {
            ControlError::Rpc { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The text to put in a language model's context: it says first that the action did NOT
    /// happen.
    pub fn for_agent(&self) -> String {
        match self {
            ControlError::Rpc { data, message, .. } => data
                .get("for_agent")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .unwrap_or_else(|| {
                    format!("The action was NOT performed and must not be reported as done. Reason: {message}.")
                }),
            other => format!(
                "The action was NOT performed and must not be reported as done. Reason: {other}. \
                 Next: check that the supervisor is running."
            ),
        }
    }
}

/// Hangs a [`ControlClient`]'s connection up (see [`ControlClient::hang_up_handle`]).
#[derive(Debug)]
pub struct HangUp(UnixStream);

impl HangUp {
    /// Hangs up: the request in flight, if any, is called off.
    pub fn hang_up(&self) {
        let _ = self.0.shutdown(std::net::Shutdown::Both);
    }
}

/// A connection to the control socket. Calls are answered in order.
#[derive(Debug)]
pub struct ControlClient {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    next_id: u64,
    token: Option<String>,
}

impl ControlClient {
    /// Connects to the socket at `path`.
    pub fn connect(path: impl AsRef<Path>) -> Result<ControlClient, ControlError> {
        let writer = UnixStream::connect(path)?;
        let reader = BufReader::new(writer.try_clone()?);
        Ok(ControlClient {
            reader,
            writer,
            next_id: 1,
            token: None,
        })
    }

    /// Connects to the socket named by `ENVIRONMENT_SOCKET`, presenting the token in
    /// `ENVIRONMENT_TOKEN` if there is one.
    pub fn from_env() -> Result<ControlClient, ControlError> {
        let path = std::env::var_os(SOCKET_VAR).ok_or(ControlError::NoSocket)?;
        let client = ControlClient::connect(path)?;
        Ok(client.with_token(std::env::var(TOKEN_VAR).ok()))
    }

    /// Presents `token` (a capability token) with every call from now on.
    pub fn with_token(mut self, token: Option<String>) -> ControlClient {
        self.token = token;
        self
    }

    /// Calls `method` with named `params` (an object, or null) and returns its result.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, ControlError> {
        let mut params = match params {
            Value::Null => serde_json::Map::new(),
            Value::Object(m) => m,
            _ => {
                return Err(ControlError::Protocol(
                    "params must be a JSON object".into(),
                ));
            }
        };
        if let Some(t) = &self.token
            && !params.contains_key("token")
        {
            params.insert("token".into(), Value::String(t.clone()));
        }
        let id = self.next_id;
        self.next_id += 1;
        let request = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        let answer = self.exchange(
            &serde_json::to_vec(&request).map_err(|e| ControlError::Protocol(e.to_string()))?,
        )?;
        if answer.get("id") != Some(&json!(id)) {
            return Err(ControlError::Protocol(format!(
                "answer to request {id} carries id {:?}",
                answer.get("id")
            )));
        }
        into_result(answer)
    }

    /// A handle that calls off, from another thread, the request this client has in flight:
    /// it hangs the connection up, and the supervisor kills a command it runs for it (recorded
    /// as cancelled). The client answers nothing more afterwards; connect again.
    pub fn hang_up_handle(&self) -> Result<HangUp, ControlError> {
        Ok(HangUp(self.writer.try_clone()?))
    }

    /// Sends one raw line and reads one answer line, as JSON. For tools and tests that speak
    /// the protocol themselves.
    pub fn exchange(&mut self, line: &[u8]) -> Result<Value, ControlError> {
        let mut out = line.to_vec();
        out.push(b'\n');
        self.writer.write_all(&out)?;
        self.writer.flush()?;
        let mut answer = String::new();
        if self.reader.read_line(&mut answer)? == 0 {
            return Err(ControlError::Protocol(
                "the supervisor closed the connection".into(),
            ));
        }
        serde_json::from_str(&answer).map_err(|e| ControlError::Protocol(e.to_string()))
    }

    /// Binds this connection to `actor`, on an operator's socket
    /// ([`Supervisor::operator_socket_path`](crate::Supervisor::operator_socket_path)): every
    /// request after it acts as that actor, presenting this client's token by default. The
    /// agent's socket refuses it (its connections act as the agent), and a connection binds
    /// once.
    pub fn open_session(&mut self, actor: &str) -> Result<(), ControlError> {
        self.call(crate::SESSION_OPEN, json!({ "actor": actor }))
            .map(drop)
    }

    /// Sends a typed request and reads its typed answer: the same API as the service's
    /// [`Workspace::request`](environment_workspace::Workspace::request), through the socket.
    pub fn request<R: Request>(&mut self, request: R) -> Result<R::Answer, ControlError> {
        let params =
            serde_json::to_value(request).map_err(|e| ControlError::Protocol(e.to_string()))?;
        let answer = self.call(R::METHOD.name(), params)?;
        serde_json::from_value(answer).map_err(|e| {
            ControlError::Protocol(format!(
                "the answer to {} does not read as its type: {e}",
                R::METHOD.name()
            ))
        })
    }

    /// The branch's history: key nodes, automatic captures squashed.
    pub fn history(&mut self, limit: usize) -> Result<versions::History, ControlError> {
        self.request(versions::HistoryParams {
            limit: Some(limit),
            ..Default::default()
        })
    }

    /// The workspace's state: its head, the agent's pid, captures, rollbacks.
    pub fn status(&mut self) -> Result<versions::Status, ControlError> {
        self.request(versions::StatusParams {})
    }

    /// Names the current state of the workspace (captured first) as `name`.
    pub fn mark(&mut self, name: &str) -> Result<versions::Marked, ControlError> {
        self.request(versions::MarkParams {
            name: name.to_owned(),
            version: None,
        })
    }

    /// Runs a command in the sandbox as a recorded operation; the answer carries its exit,
    /// output and the operation that records it.
    pub fn exec<S: AsRef<str>>(&mut self, argv: &[S]) -> Result<commands::Executed, ControlError> {
        self.request(commands::ExecParams {
            argv: argv.iter().map(|a| a.as_ref().to_owned()).collect(),
            cwd: None,
            env: Default::default(),
            secrets: Default::default(),
            intent: None,
            stdin: None,
            timeout_ms: None,
            output_limit: None,
        })
    }

    /// Restores the workspace to `version` (an id, a prefix, a mark, `main~1`); with `dry_run`,
    /// only says what would change.
    pub fn restore(
        &mut self,
        version: &str,
        dry_run: bool,
    ) -> Result<versions::Restored, ControlError> {
        self.request(versions::RestoreParams {
            version: version.to_owned(),
            dry_run,
            intent: None,
        })
    }
}

/// A response's result, or its error.
fn into_result(mut answer: Value) -> Result<Value, ControlError> {
    if let Some(result) = answer.get_mut("result") {
        return Ok(result.take());
    }
    match answer.get_mut("error") {
        Some(e) => Err(ControlError::Rpc {
            code: e.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            data: e.get_mut("data").map(Value::take).unwrap_or(Value::Null),
        }),
        None => Err(ControlError::Protocol(
            "a response with neither result nor error".into(),
        )),
    }
}
