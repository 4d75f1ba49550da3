//! The wire format of the control socket: JSON-RPC 2.0, one JSON message per line.
//!
//! Every message — request, notification, batch, response — is one line of UTF-8 JSON ending in
//! `\n` (JSON text never contains a raw newline, so no other framing is needed). A line longer
//! than [`MAX_MESSAGE_BYTES`] is refused with an invalid-request error and skipped; the
//! connection survives it, as it survives malformed JSON and unknown methods.

use environment_core::ErrorKind;
use environment_workspace::ServiceError;
use serde::Serialize;
use serde_json::{Map, Value};

/// The longest accepted message (one line), in bytes: a file of a mebibyte written whole fits
/// with room for its JSON escaping, and a peer that fills every connection holds at most
/// 64 × 4 MiB.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

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

/// A JSON-RPC error object. Its `data` is always an object with at least `for_agent`: the text
/// to put in a language model's context, which states first that the action did not happen.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RpcError {
    /// One of the codes of this module.
    pub code: i64,
    /// A short description.
    pub message: String,
    /// `{"for_agent": "...", "kind": "...", ...}` with details that depend on the code.
    pub data: Value,
}

impl RpcError {
    /// An error of the wire itself (a line that is not JSON, not a request), with the standard
    /// agent-facing text.
    pub(crate) fn new(code: i64, message: impl Into<String>, next: &str) -> RpcError {
        let mut e: RpcError = ServiceError::new(kind_of(code), message, next).into();
        e.code = code;
        e
    }

    /// The kind of error, as its `data` names it (or as its code implies).
    pub fn kind(&self) -> ErrorKind {
        kind_of_error(self.code, &self.data)
    }

    /// The agent-facing text.
    pub fn for_agent(&self) -> Option<&str> {
        self.data.get("for_agent").and_then(Value::as_str)
    }
}

/// A use case's error on the wire: its kind's code, its message, and its details with the kind
/// named (`data.kind`).
impl From<ServiceError> for RpcError {
    fn from(e: ServiceError) -> RpcError {
        let kind = e.kind();
        let e = e.with("kind", serde_json::json!(kind));
        RpcError {
            code: code_of(kind),
            message: e.message,
            data: e.data,
        }
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
                ServiceError::invalid("`params` must be an object (named parameters)").into(),
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
