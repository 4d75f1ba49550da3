//! The wire format of the control socket: JSON-RPC 2.0, one JSON message per line.
//!
//! Every message — request, notification, batch, response — is one line of UTF-8 JSON ending in
//! `\n` (JSON text never contains a raw newline, so no other framing is needed). A line longer
//! than [`MAX_MESSAGE_BYTES`] is refused with an invalid-request error and skipped; the
//! connection survives it, as it survives malformed JSON and unknown methods.

use environment_bus::BusError;
use environment_core::{EnvError, ErrorKind, ForAgent, Verdict};
use environment_policy::PolicyError;
use serde::Serialize;
use serde_json::{Map, Value, json};

use environment_sandbox::error::SandboxError;

/// The longest accepted message (one line), in bytes.
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;

/// The line is not JSON (JSON-RPC standard code).
pub const PARSE_ERROR: i64 = -32700;
/// The JSON is not a valid request object (standard code).
pub const INVALID_REQUEST: i64 = -32600;
/// No such method (standard code).
pub const METHOD_NOT_FOUND: i64 = -32601;
/// Missing, unknown or ill-typed parameters; bad paths or names (standard code).
pub const INVALID_PARAMS: i64 = -32602;
/// The supervisor failed; the action may not have completed (standard code).
pub const INTERNAL_ERROR: i64 = -32603;
/// The policy refused the request (or it needs an approval first); nothing changed.
pub const DENIED: i64 = -32001;
/// Something named does not exist: a version (or it is ambiguous, or was thinned out), a
/// mark, a branch, a process, a topic, a receipt, an approval.
pub const NOT_FOUND: i64 = -32002;
/// The request conflicts with the state: a name already taken, a stale receipt, nothing to
/// undo, a write based on a moved head.
pub const CONFLICT: i64 = -32003;
/// The capability is not configured on this supervisor (no policy, no bus, no shell).
pub const UNAVAILABLE: i64 = -32004;

/// The code of each kind of error: the one place the socket's codes are chosen.
pub fn code_of(kind: ErrorKind) -> i64 {
    match kind {
        ErrorKind::Invalid => INVALID_PARAMS,
        ErrorKind::NotFound => NOT_FOUND,
        ErrorKind::Conflict => CONFLICT,
        ErrorKind::Denied | ErrorKind::NeedsApproval => DENIED,
        ErrorKind::Unavailable => UNAVAILABLE,
        _ => INTERNAL_ERROR,
    }
}

/// The kind of an error received with `code` and `data`: as `data` names it, or as the code
/// implies when it does not.
pub fn kind_of_error(code: i64, data: &Value) -> ErrorKind {
    data.get("kind")
        .and_then(|k| serde_json::from_value(k.clone()).ok())
        .unwrap_or_else(|| kind_of(code))
}

/// The kind of an error sent with `code` alone (a malformed request, an unknown method).
fn kind_of(code: i64) -> ErrorKind {
    match code {
        PARSE_ERROR | INVALID_REQUEST | INVALID_PARAMS => ErrorKind::Invalid,
        METHOD_NOT_FOUND | NOT_FOUND => ErrorKind::NotFound,
        CONFLICT => ErrorKind::Conflict,
        DENIED => ErrorKind::Denied,
        UNAVAILABLE => ErrorKind::Unavailable,
        _ => ErrorKind::Internal,
    }
}

/// The words that open every error's agent-facing text when the method did not run at all.
pub(crate) const NOT_DONE: &str =
    "The action was NOT performed: nothing changed, and it must not be reported as done.";

/// A JSON-RPC error object. Its `data` is always an object with at least `for_agent`: the text
/// to put in a language model's context, which states first that the action did not happen.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RpcError {
    /// One of the codes of this module.
    pub code: i64,
    /// A short description.
    pub message: String,
    /// `{"for_agent": "...", ...}` with details that depend on the code.
    pub data: Value,
}

impl RpcError {
    /// An error with the standard agent-facing text built from `message` and `next`.
    pub(crate) fn new(code: i64, message: impl Into<String>, next: &str) -> RpcError {
        let message = message.into();
        let for_agent = format!("{NOT_DONE} Reason: {message}. Next: {next}");
        RpcError::rendered(code, message, for_agent)
    }

    /// An error whose agent-facing text was rendered elsewhere (core's `ForAgent`).
    pub(crate) fn rendered(code: i64, message: impl Into<String>, for_agent: String) -> RpcError {
        RpcError::of_kind(kind_of(code), code, message, for_agent)
    }

    /// An error of `kind`, with its code.
    pub(crate) fn classified(kind: ErrorKind, message: String, for_agent: String) -> RpcError {
        RpcError::of_kind(kind, code_of(kind), message, for_agent)
    }

    fn of_kind(kind: ErrorKind, code: i64, message: impl Into<String>, for_agent: String) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: serde_json::json!({ "for_agent": for_agent, "kind": kind }),
        }
    }

    /// The kind of error, as its `data` names it (or as its code implies).
    pub fn kind(&self) -> ErrorKind {
        kind_of_error(self.code, &self.data)
    }

    /// Adds a field to `data`.
    pub(crate) fn with(mut self, key: &str, value: Value) -> RpcError {
        if let Value::Object(m) = &mut self.data {
            m.insert(key.to_owned(), value);
        }
        self
    }

    pub(crate) fn invalid_params(detail: impl std::fmt::Display) -> RpcError {
        RpcError::new(
            INVALID_PARAMS,
            format!("invalid params: {detail}"),
            "fix the parameters as the schema describes them and send the request again.",
        )
    }

    pub(crate) fn unavailable(what: &str) -> RpcError {
        RpcError::new(
            UNAVAILABLE,
            format!("{what} is not configured on this supervisor"),
            "use another method; this one is not available here.",
        )
    }

    /// The agent-facing text.
    pub fn for_agent(&self) -> Option<&str> {
        self.data.get("for_agent").and_then(Value::as_str)
    }
}

/// A request as read from the wire, checked for JSON-RPC shape.
#[derive(Debug)]
pub(crate) struct Call {
    /// `None` for a notification (no answer is sent).
    pub id: Option<Value>,
    pub method: String,
    pub params: Map<String, Value>,
}

/// Checks one request object's envelope. On error, the id to answer with (if one was readable).
pub(crate) fn parse_call(v: Value) -> Result<Call, (Value, RpcError)> {
    let invalid = |id: Value, why: &str| {
        (
            id,
            RpcError::new(
                INVALID_REQUEST,
                format!("invalid request: {why}"),
                "send a JSON-RPC 2.0 request object: {\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"…\",\"params\":{…}}.",
            ),
        )
    };
    let Value::Object(mut obj) = v else {
        return Err(invalid(Value::Null, "not an object"));
    };
    let id = obj.remove("id");
    let answer_id = match &id {
        Some(i @ (Value::String(_) | Value::Number(_) | Value::Null)) => i.clone(),
        Some(_) => {
            return Err(invalid(
                Value::Null,
                "`id` must be a string, a number or null",
            ));
        }
        None => Value::Null,
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid(answer_id, "`jsonrpc` must be \"2.0\""));
    }
    let Some(Value::String(method)) = obj.remove("method") else {
        return Err(invalid(answer_id, "`method` must be a string"));
    };
    let params = match obj.remove("params") {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err((
                answer_id,
                RpcError::invalid_params("`params` must be an object (named parameters)"),
            ));
        }
    };
    Ok(Call { id, method, params })
}

/// A success response line (without the newline).
pub(crate) fn success(id: Value, result: Value) -> Value {
    serde_json::json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// An error response line (without the newline).
pub(crate) fn failure(id: Value, error: &RpcError) -> Value {
    serde_json::json!({ "jsonrpc": "2.0", "id": id, "error": error })
}

/// Renders core's errors with their documented codes.
pub(crate) fn env_error(e: EnvError) -> RpcError {
    let mut err = RpcError::classified(e.kind(), e.to_string(), e.for_agent());
    if let EnvError::NotAllowed(d) = &e {
        let (verdict, approval) = match &d.verdict {
            Verdict::Allow => ("allow", None),
            Verdict::NeedsApproval { request, .. } => ("needs_approval", request.clone()),
            _ => ("deny", None),
        };
        err = err
            .with("verdict", json!(verdict))
            .with("rules", json!(d.rules))
            .with("policy_version", json!(d.policy_version));
        if let Some(a) = approval {
            err = err.with("approval", json!(a));
        }
    }
    err
}

pub(crate) fn sandbox_error(e: SandboxError) -> RpcError {
    match e {
        SandboxError::Env(e) => env_error(e),
        other => RpcError::classified(other.kind(), other.to_string(), other.for_agent()),
    }
}

pub(crate) fn bus_error(e: BusError) -> RpcError {
    let kind = e.kind();
    let next = match kind {
        ErrorKind::Conflict => "claim again; this lease is no longer yours.",
        ErrorKind::Denied => "settle only the receipts your own claims handed you.",
        ErrorKind::Invalid | ErrorKind::NotFound => {
            "fix the topic, group, receipt or sizes and retry."
        }
        _ => "report the error to a human if it persists.",
    };
    let message = e.to_string();
    let for_agent = format!("{NOT_DONE} Reason: {message}. Next: {next}");
    RpcError::classified(kind, message, for_agent)
}

pub(crate) fn policy_error(e: PolicyError) -> RpcError {
    let kind = e.kind();
    let next = match &e {
        PolicyError::NoApprovalNeeded(_) => {
            "act directly if it is allowed; if it is denied, an approval cannot help."
        }
        _ if matches!(kind, ErrorKind::Invalid | ErrorKind::NotFound) => {
            "fix the request and retry."
        }
        _ => "report the error to a human if it persists.",
    };
    let message = e.to_string();
    let for_agent = format!("{NOT_DONE} Reason: {message}. Next: {next}");
    RpcError::classified(kind, message, for_agent)
}
