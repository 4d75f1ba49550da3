//! The methods of the control socket: the workspace service's use cases under their own names
//! ([`Method`]), and the published schema of their parameters, results and errors, generated
//! from the types the use cases are written in.

use serde_json::{Value, json};

pub use environment_workspace::Method;

use super::rpc;

/// The published schema of the control socket (an OpenRPC document): every method with its
/// parameters and result as JSON Schemas, generated from the service's request and answer
/// types, and the error codes every method may answer with.
///
/// ```
/// let doc = environment_supervisor::schema();
/// let write = doc["methods"].as_array().unwrap().iter().find(|m| m["name"] == "file.write");
/// assert!(write.unwrap()["params"].as_array().unwrap().iter().any(|p| p["name"] == "path"));
/// ```
pub fn schema() -> Value {
    let methods: Vec<Value> = Method::ALL.iter().map(|m| method(*m)).collect();
    json!({
        "openrpc": "1.3.2",
        "info": {
            "title": "environment supervisor control socket",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "JSON-RPC 2.0 between a sandboxed agent and its supervisor. Every request is authorized by the environment's policy as the agent's actor (with the request's token, or the agent's own) before anything happens; a refused request changes nothing. Params are always named (an object); a parameter the method does not take is refused.",
        },
        "x-transport": {
            "kind": "unix-socket",
            "path": "the ENVIRONMENT_SOCKET variable of the agent (host default: <home>/run/control.sock)",
            "framing": format!("newline-delimited JSON: each request, notification, batch and response is one line of UTF-8 JSON ending in \\n; at most {} bytes per line. Responses come in request order on each connection. A request without id is a notification and gets no response. Malformed lines and unknown methods get an error response and the connection stays open. A client that closes its end calls its request in flight off.", rpc::MAX_MESSAGE_BYTES),
        },
        "methods": methods,
        "components": { "errors": errors() },
        "x-error-data": "Every error's data is an object with at least for_agent: the text for a language model, which states first that the action did NOT happen and ends with what to do next; and kind, the error's kind.",
    })
}

/// One method: its summary, its params one by one (an OpenRPC param each), its result.
fn method(m: Method) -> Value {
    let c = m.contract();
    let required: Vec<&str> = c.params["required"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let params: Vec<Value> = c.params["properties"]
        .as_object()
        .map(|props| {
            props
                .iter()
                .map(|(name, schema)| {
                    json!({
                        "name": name,
                        "required": required.contains(&name.as_str()),
                        "description": schema["description"],
                        "schema": schema,
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let errors: Vec<Value> = errors()
        .as_object()
        .map(|e| {
            e.keys()
                .map(|k| json!({ "$ref": format!("#/components/errors/{k}") }))
                .collect()
        })
        .unwrap_or_default();
    json!({
        "name": m.name(),
        "summary": c.summary,
        "paramStructure": "by-name",
        "params": params,
        "x-params-schema": c.params,
        "result": { "name": m.name(), "schema": c.result },
        "errors": errors,
    })
}

/// The error codes, each with what it means.
fn errors() -> Value {
    json!({
        "parse_error": { "code": rpc::PARSE_ERROR, "message": "the line is not JSON" },
        "invalid_request": { "code": rpc::INVALID_REQUEST, "message": "not a JSON-RPC 2.0 request object (or a line too long, or an empty batch)" },
        "method_not_found": { "code": rpc::METHOD_NOT_FOUND, "message": "no such method" },
        "invalid_params": { "code": rpc::INVALID_PARAMS, "message": "missing, unknown or ill-typed parameters; a bad path or name" },
        "internal": { "code": rpc::INTERNAL_ERROR, "message": "the supervisor failed; report it" },
        "denied": {
            "code": rpc::DENIED,
            "message": "the policy refused (verdict deny) or requires an approval first (verdict needs_approval, with the filed approval id); nothing changed",
            "data": {
                "for_agent": "text for a language model, opening with: The action was NOT performed",
                "verdict": "deny | needs_approval",
                "rules": "the deciding rule ids",
                "approval": "approval request id, when filed",
                "policy_version": "integer",
            },
        },
        "not_found": { "code": rpc::NOT_FOUND, "message": "something named does not exist: a version, mark or branch (or an ambiguous prefix, or a version thinned out by retention), a file, a process, a topic or group, a receipt not handed out here or settled already, an approval" },
        "conflict": { "code": rpc::CONFLICT, "message": "conflicts with the state: a name taken, a stale receipt, nothing to undo, no approval needed" },
        "unavailable": { "code": rpc::UNAVAILABLE, "message": "the capability is not configured in this workspace (policy, queue, shell, forks)" },
    })
}
