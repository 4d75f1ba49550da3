//! The JSON API: every use case at `POST /api/v1/{method}`, its body the use case's request and
//! its answer the use case's, as the service's types say; an error is the service's kind as an
//! HTTP status, with the contract text in its body. The OpenAPI document is generated from the
//! same types.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use environment_core::{Cancel, ErrorKind};
use environment_workspace::{Caller, Method};
use serde_json::{Map, Value, json};

use super::Served;
use super::auth::refused;
use crate::failure::{ExitCode, Failure};
use crate::mcp::CallOffOnDrop;

/// One use case, called as the request's caller.
pub(crate) async fn call(
    State(served): State<Arc<Served>>,
    Extension(caller): Extension<Caller>,
    Path(method): Path<String>,
    body: Bytes,
) -> Response {
    let Some(m) = Method::from_name(&method) else {
        return refused(
            StatusCode::NOT_FOUND,
            ErrorKind::NotFound,
            &format!("there is no use case {method:?}"),
            "the OpenAPI document at /openapi.json lists them",
        );
    };
    let params = match serde_json::from_slice::<Value>(&body) {
        _ if body.is_empty() => Map::new(),
        Ok(Value::Object(params)) => params,
        Ok(_) => {
            return refused(
                StatusCode::BAD_REQUEST,
                ErrorKind::Invalid,
                "the body is not a JSON object",
                "send the use case's parameters as one JSON object",
            );
        }
        Err(e) => {
            return refused(
                StatusCode::BAD_REQUEST,
                ErrorKind::Invalid,
                &format!("the body is not JSON: {e}"),
                "send the use case's parameters as one JSON object",
            );
        }
    };
    let door = match served.door(&caller) {
        Ok(door) => door,
        Err(f) => return failure(&f),
    };
    let cancel = Cancel::new();
    // A client that goes away calls its command off.
    let mut called_off = CallOffOnDrop(Some(cancel.clone()));
    let work = tokio::task::spawn_blocking(move || {
        door.call_cancellable(m, Value::Object(params), &cancel)
    });
    let done = work.await;
    called_off.0 = None;
    match done {
        Ok(Ok(answer)) => (StatusCode::OK, Json(answer)).into_response(),
        Ok(Err(f)) => failure(&f),
        Err(e) => failure(&Failure::other(format!(
            "the call stopped unexpectedly: {e}"
        ))),
    }
}

/// The HTTP status of each kind of error: the one place it is chosen.
pub(crate) fn status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::Invalid => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::Denied => StatusCode::FORBIDDEN,
        ErrorKind::NeedsApproval => StatusCode::PRECONDITION_REQUIRED,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// A failed call as its response: the service's kind (or the failure's code) as the status,
/// the contract text and the details in the body.
pub(crate) fn failure(f: &Failure) -> Response {
    let (kind, data) = match &f.service {
        Some((kind, data)) => (*kind, data.clone()),
        None => (
            match f.code {
                ExitCode::Usage => ErrorKind::Invalid,
                ExitCode::NotFound => ErrorKind::NotFound,
                ExitCode::Conflict => ErrorKind::Conflict,
                ExitCode::Denied => ErrorKind::Denied,
                ExitCode::Unavailable | ExitCode::NoSupervisor => ErrorKind::Unavailable,
                _ => ErrorKind::Internal,
            },
            Value::Null,
        ),
    };
    let body = json!({
        "error": {
            "kind": kind,
            "message": f.message,
            "for_agent": f.for_agent.clone().unwrap_or_else(|| {
                crate::mcp::for_model("the request", f)
            }),
            "hint": f.hint,
            "data": data,
        }
    });
    (status(kind), Json(body)).into_response()
}

/// The OpenAPI 3.1 document: a path per use case, its request and answer schemas generated
/// from the service's types, the errors each status stands for.
pub(crate) async fn openapi() -> Json<Value> {
    Json(document())
}

/// See [`openapi`].
pub(crate) fn document() -> Value {
    let mut paths = Map::new();
    for m in Method::ALL {
        let c = m.contract();
        paths.insert(
            format!("/api/v1/{}", m.name()),
            json!({
                "post": {
                    "operationId": m.name(),
                    "summary": c.summary,
                    "requestBody": {
                        "required": true,
                        "content": { "application/json": { "schema": bare(c.params) } },
                    },
                    "responses": responses(bare(c.result)),
                }
            }),
        );
    }
    paths.insert(
        "/api/v1/events".into(),
        json!({
            "get": {
                "operationId": "events",
                "summary": "The environment's events as Server-Sent Events: `operation` (its id is the operation's position in the log; reconnect with Last-Event-ID to get every one since), `approval` and `effect` (the current state of each on connecting, then every change). The credential may also be given as `access_token` in the query, for a browser's EventSource.",
                "parameters": [
                    { "name": "Last-Event-ID", "in": "header", "required": false, "schema": { "type": "string" } },
                    { "name": "access_token", "in": "query", "required": false, "schema": { "type": "string" } },
                ],
                "responses": {
                    "200": { "description": "the stream", "content": { "text/event-stream": { "schema": { "type": "string" } } } },
                    "401": { "$ref": "#/components/responses/unauthorized" },
                },
            }
        }),
    );
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "environment",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The workspace service of an environment for AI agents over HTTP. Every request acts as the actor its bearer credential names, and the environment's policy decides what it may do; a refused request changes nothing.",
        },
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "security": [{ "bearer": [] }],
        "paths": paths,
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": { "Error": error_schema() },
            "responses": error_responses(),
        },
    })
}

/// A schema without its own `$schema` and `title` (the document names the dialect once).
fn bare(mut schema: Value) -> Value {
    if let Some(o) = schema.as_object_mut() {
        o.remove("$schema");
        o.remove("title");
    }
    schema
}

fn responses(ok: Value) -> Value {
    let mut r = json!({
        "200": { "description": "the answer", "content": { "application/json": { "schema": ok } } },
    });
    for (status, name) in ERRORS {
        r[status.to_string()] = json!({ "$ref": format!("#/components/responses/{name}") });
    }
    r
}

/// The statuses an API call may answer with, besides 200.
const ERRORS: [(u16, &str); 10] = [
    (400, "invalid"),
    (401, "unauthorized"),
    (403, "denied"),
    (404, "not_found"),
    (409, "conflict"),
    (413, "too_large"),
    (428, "needs_approval"),
    (429, "too_many"),
    (503, "unavailable"),
    (500, "internal"),
];

fn error_responses() -> Value {
    let said = |what: &str| {
        json!({
            "description": what,
            "content": { "application/json": { "schema": { "$ref": "#/components/schemas/Error" } } },
        })
    };
    json!({
        "invalid": said("the request is malformed: a missing, unknown or ill-typed parameter, a bad path or name; nothing changed"),
        "unauthorized": said("no valid credential; nothing changed"),
        "denied": said("the policy refused; nothing changed"),
        "not_found": said("something named does not exist; nothing changed"),
        "conflict": said("the request conflicts with the state (a name taken, nothing to undo…); nothing changed"),
        "too_large": { "description": "the body is larger than the server takes; nothing changed" },
        "needs_approval": said("the policy holds the action for an approval (its id in error.data.approval): present it once granted; nothing changed"),
        "too_many": said("too many requests with this credential; nothing changed"),
        "unavailable": said("the capability is not configured here (a policy, the queue, a shell, forks)"),
        "internal": said("the server failed; the request may not have happened"),
    })
}

fn error_schema() -> Value {
    json!({
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["kind", "message", "for_agent"],
                "properties": {
                    "kind": { "type": "string", "enum": ["invalid", "not_found", "conflict", "denied", "needs_approval", "unavailable", "corrupt", "internal"] },
                    "message": { "type": "string" },
                    "for_agent": { "type": "string", "description": "the text for a language model: it says first that the action did NOT happen, and ends with what to do next" },
                    "hint": { "type": ["string", "null"] },
                    "data": { "description": "the details: the deciding rules, a filed approval's id" },
                },
            }
        },
    })
}
