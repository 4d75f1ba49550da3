//! `envctl mcp`: the environment as an MCP server on stdin/stdout.
//!
//! Every tool is one use case of the workspace service ([`environment_workspace::Workspace`]),
//! called in this process or through a running supervisor's socket: the service parses the
//! arguments (refusing unknown ones), authorizes the call as the server's actor with what the
//! call presents, acts and answers. The answer goes back as the call's structured content,
//! described by the tool's output schema, with a rendering for the model as text; a failure
//! comes back with `isError` and a text that first says the tool did NOT execute. In process,
//! every call first captures what changed in the workspace since the last one (the witness's),
//! so a call sees, and never overwrites, work done outside the server.

mod framing;
mod params;
mod render;
mod resources;
mod tools;

use environment_core::{ActorId, Cancel};
use environment_workspace::Method;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListResourceTemplatesResult, ListResourcesResult, ListToolsResult,
    PaginatedRequestParams, ProgressNotificationParam, ReadResourceRequestParams,
    ReadResourceResponse, ReadResourceResult, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;

use crate::door::Door;
use crate::failure::{Failure, Outcome};
use crate::target::{Canceller, SupervisorAddr, Target};
use crate::workspace::{Serving, Session, Workspace};
use environment_workspace::Caller;
use std::sync::Arc;
use tools::{TOOLS, ToolSpec};

/// Serves MCP on stdio until the client disconnects.
pub fn serve(ws: Workspace, actor: ActorId) -> Outcome<()> {
    let launcher =
        crate::commands::process::host_sandbox(&ws, &crate::cli::SandboxArgs::default())?;
    let credentials = ws.credentials.clone();
    let session = Target::Direct(Box::new(Session::open(ws, actor)?));
    let serving = Serving {
        launcher: Some(launcher),
        capture_each_call: true,
        create_queue: true,
        forking: crate::commands::process::namespaces().is_ok(),
    };
    stdio(EnvServer::new(Door::open(session, &credentials, serving)?))
}

/// MCP over stdio with the tools going through the supervisor at `addr`, as the actor its
/// connection opens a session as (or the socket's own).
pub fn serve_remote(
    addr: SupervisorAddr,
    credentials: environment_core::Credentials,
) -> Outcome<()> {
    let door = Door::open(Target::Supervisor(addr), &credentials, Serving::default())?;
    stdio(EnvServer::new(door))
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

/// The text of a failed call: that it did not execute, why, and what to do next.
pub(crate) fn for_model(tool: &str, f: &Failure) -> String {
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

/// The MCP server: one workspace (or a supervisor's socket), and whom each call acts as.
#[derive(Clone)]
pub struct EnvServer {
    doors: Doors,
}

/// Opens the door of a caller.
pub type DoorOf = Arc<dyn Fn(&Caller) -> Outcome<Door> + Send + Sync>;

/// Where an MCP server's calls go.
#[derive(Clone)]
pub enum Doors {
    /// One door, one actor, for every call (a server on stdio).
    One(Door),
    /// A door for each caller, bound from each HTTP request's credential (see
    /// `crate::serve`): several agents share one server, each acting as itself.
    PerCaller(DoorOf),
}

impl EnvServer {
    /// A server whose tools go through `door`.
    pub fn new(door: Door) -> EnvServer {
        EnvServer {
            doors: Doors::One(door),
        }
    }

    /// A server whose calls each go through the door of the caller their HTTP request was
    /// authenticated as.
    pub fn per_caller(doors: DoorOf) -> EnvServer {
        EnvServer {
            doors: Doors::PerCaller(doors),
        }
    }

    /// The door of the request in `context`.
    fn door(&self, context: &RequestContext<RoleServer>) -> Outcome<Door> {
        match &self.doors {
            Doors::One(door) => Ok(door.clone()),
            Doors::PerCaller(open) => {
                let caller = context
                    .extensions
                    .get::<axum::http::request::Parts>()
                    .and_then(|p| p.extensions.get::<Caller>())
                    .ok_or_else(|| {
                        Failure::new(
                            crate::failure::ExitCode::Denied,
                            "the request carries no credential",
                        )
                    })?;
                open(caller)
            }
        }
    }

    /// Runs `tool` with the arguments given: renamed into the service's, then called. While it
    /// runs, the client is told every second that it still does (when it asked for progress),
    /// and a cancellation from the client calls the command off (in process: it is killed and
    /// recorded as cancelled).
    async fn run(
        &self,
        tool: &'static ToolSpec,
        args: Option<JsonObject>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let mut args = args.unwrap_or_default();
        args.retain(|_, v| !v.is_null());
        if let Err(e) = (tool.adapt)(&mut args) {
            return failed(tool, &e.into());
        }
        let door = match self.door(&context) {
            Ok(door) => door,
            Err(f) => return failed(tool, &f),
        };
        let cancel = Cancel::new();
        // A call dropped before its end (the server stopping) calls its command off too.
        let mut called_off = CallOffOnDrop(Some(cancel.clone()));
        // Through a supervisor, a call is called off by hanging its connection up.
        let hang_up = door.canceller();
        let work = spawn(door, tool.method, args, cancel.clone());
        let done = running(work, &context, tool.name, &cancel, hang_up.as_ref()).await;
        called_off.0 = None;
        if done.is_ok() && tool.method == Method::Mark {
            // A mark is listed as a resource.
            let _ = context.peer.notify_resource_list_changed().await;
        }
        match done {
            Ok(answer) => {
                let mut result = CallToolResult::success(vec![ContentBlock::text(render::answer(
                    tool.method,
                    &answer,
                ))]);
                result.structured_content = Some(answer);
                result
            }
            Err(f) => failed(tool, &f),
        }
    }
}

/// Calls the use case `method` with `args` on the blocking pool, through `door`; `cancel`
/// calls its command off.
fn spawn(
    door: Door,
    method: Method,
    args: JsonObject,
    cancel: Cancel,
) -> tokio::task::JoinHandle<Outcome<Value>> {
    tokio::task::spawn_blocking(move || door.call_cancellable(method, Value::Object(args), &cancel))
}

impl EnvServer {
    /// The answer of a short use case (one a resource reads) for the request in `context`.
    async fn answer(
        &self,
        context: &RequestContext<RoleServer>,
        method: Method,
        args: JsonObject,
    ) -> Outcome<Value> {
        spawn(self.door(context)?, method, args, Cancel::new())
            .await
            .unwrap_or_else(|e| {
                Err(Failure::other(format!(
                    "the read stopped unexpectedly: {e}"
                )))
            })
    }
}

/// A resource read that failed, as the protocol's error (a resource has no `isError`), with
/// the text a model reads: MCP's codes for a missing resource and bad params, and for what
/// JSON-RPC has no code of its own (a denial, a capability not there) the control socket's,
/// with the kind named in `data`.
fn unreadable(uri: &str, f: &Failure) -> ErrorData {
    use crate::failure::ExitCode;
    use environment_supervisor::rpc;
    let text = for_model(&format!("resources/read {uri}"), f);
    let own = |code: i64, kind: &str| {
        ErrorData::new(
            rmcp::model::ErrorCode(code as i32),
            text.clone(),
            Some(serde_json::json!({ "kind": kind })),
        )
    };
    match f.code {
        ExitCode::NotFound => ErrorData::resource_not_found(text, None),
        ExitCode::Usage => ErrorData::invalid_params(text, None),
        ExitCode::Denied => own(rpc::DENIED, "denied"),
        ExitCode::Unavailable => own(rpc::UNAVAILABLE, "unavailable"),
        _ => ErrorData::internal_error(text, None),
    }
}

/// Calls a command off when the call holding it is dropped before its end (`None` once it
/// ended).
pub(crate) struct CallOffOnDrop(pub(crate) Option<Cancel>);

impl Drop for CallOffOnDrop {
    fn drop(&mut self) {
        if let Some(cancel) = &self.0 {
            cancel.cancel();
        }
    }
}

/// Waits for `work`, telling the client every second that `tool` still runs (when it gave a
/// progress token), and calling it off through `cancel` when the client cancels the request.
async fn running(
    mut work: tokio::task::JoinHandle<Outcome<Value>>,
    context: &RequestContext<RoleServer>,
    tool: &str,
    cancel: &Cancel,
    hang_up: Option<&Canceller>,
) -> Outcome<Value> {
    let progress = context.meta.get_progress_token();
    let started = tokio::time::Instant::now();
    let mut ticks = tokio::time::interval_at(started + PROGRESS_EVERY, PROGRESS_EVERY);
    loop {
        tokio::select! {
            done = &mut work => {
                return done.unwrap_or_else(|e| {
                    Err(Failure::other(format!("the tool stopped unexpectedly: {e}")))
                });
            }
            _ = context.ct.cancelled(), if !cancel.is_cancelled() => {
                cancel.cancel();
                if let Some(h) = hang_up {
                    h.cancel();
                }
            }
            _ = ticks.tick(), if progress.is_some() => {
                let secs = started.elapsed().as_secs();
                if let Some(token) = &progress {
                    let mut note = ProgressNotificationParam::new(token.clone(), secs as f64);
                    note.message = Some(format!("{tool} has run for {secs} s"));
                    // A client that stopped listening does not stop the work.
                    let _ = context.peer.notify_progress(note).await;
                }
            }
        }
    }
}

/// How often a running call reports progress.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

fn failed(tool: &ToolSpec, f: &Failure) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(for_model(tool.name, f))])
}

impl ServerHandler for EnvServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .enable_resources_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("envctl", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "An environment for your work: every change to the workspace is recorded, so you \
                 can read the history, mark good states, and restore or undo. Some actions may \
                 be refused by a policy; a refused or failed tool call did not happen.",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(
            TOOLS.iter().map(ToolSpec::tool).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(tool) = tools::find(&request.name) else {
            return Err(ErrorData::invalid_params(
                format!(
                    "there is no tool named {:?}; tools/list names them",
                    request.name
                ),
                None,
            ));
        };
        Ok(self.run(tool, request.arguments, context).await.into())
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        tools::find(name).map(ToolSpec::tool)
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let marks = self
            .answer(&context, Method::Marks, JsonObject::new())
            .await
            .map_err(|f| unreadable("the resource list", &f))?;
        Ok(ListResourcesResult::with_all_items(resources::listed(
            &marks,
        )))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        Ok(ListResourceTemplatesResult::with_all_items(
            resources::templates(),
        ))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri.as_str();
        let read = resources::read(uri).map_err(|e| unreadable(uri, &e.into()))?;
        let answer = self
            .answer(&context, read.method, read.args)
            .await
            .map_err(|f| unreadable(uri, &f))?;
        Ok(ReadResourceResult::new(vec![resources::contents(uri, read.method, &answer)]).into())
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
        let long = "é".repeat(render::MAX_OUTPUT);
        let t = render::truncated(&long);
        assert!(t.len() < long.len() && t.ends_with("more bytes]"));
        assert_eq!(render::truncated("short"), "short");
    }

    #[test]
    fn every_tool_has_an_output_schema_and_takes_credentials() {
        for t in TOOLS {
            let tool = t.tool();
            assert!(
                tool.output_schema.is_some(),
                "{} has no output schema",
                t.name
            );
            let props = &tool.input_schema["properties"];
            assert!(
                props.get("approval").is_some() && props.get("token").is_some(),
                "{}",
                t.name
            );
            assert_eq!(
                tool.input_schema["additionalProperties"], false,
                "{}",
                t.name
            );
        }
    }
}
