//! `envctl serve`: the workspace service over HTTP, for people in a browser, for platform
//! services and for remote agents. One axum server (tokio's own web framework: hyper under it,
//! tower's layers around it, and the router rmcp's Streamable HTTP transport plugs into) puts
//! on one loopback port:
//!
//! - `POST /api/v1/{method}`: every use case, its request and answer the service's own types,
//!   its errors the service's kinds as HTTP statuses ([`api`]);
//! - `GET /openapi.json`: the OpenAPI 3.1 document, generated from those types;
//! - `GET /api/v1/events`: the environment's events as Server-Sent Events, resumable
//!   ([`events`]);
//! - `/mcp`: MCP over Streamable HTTP, each request acting as its own credential's actor;
//! - `/`: the web view ([`ui`]), its assets embedded in the binary.
//!
//! Nothing here decides what anyone may do: every request is a call of the service as the
//! caller its credential names ([`auth`]), through the same door as the CLI's.

mod api;
mod auth;
mod events;
mod ui;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use environment_core::{ActorId, Governance, Queue};
use environment_policy::Policy;
use environment_workspace::{self as service, Caller};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;

use crate::cli::ServeArgs;
use crate::door::Door;
use crate::failure::{ExitCode, Failure, Outcome};
use crate::mcp::EnvServer;
use crate::target::{Remote, SupervisorAddr};
use crate::workspace::{Serving, Session, Workspace};

/// The largest request body taken (a file written whole, in JSON).
const MAX_BODY: usize = 16 << 20;

/// Where the use cases run.
enum Backend {
    /// The service, opened by this process on the workspace's stores.
    Direct(Arc<service::Workspace>),
    /// The workspace's running supervisor, through its operator's socket: one connection per
    /// caller, opened as that caller.
    Supervisor(PathBuf),
}

/// What the server shares between its requests.
pub(crate) struct Served {
    backend: Backend,
    /// Connections to the supervisor, by actor and default token.
    remotes: Mutex<HashMap<(String, Option<String>), Door>>,
    /// The session token of the person who started the server.
    pub(crate) session: auth::SessionToken,
    /// Verifies capability tokens presented as credentials.
    pub(crate) policy: Option<Arc<Policy>>,
    /// The `Host` values a request may carry, and the origins a browser may send.
    pub(crate) hosts: Vec<String>,
    pub(crate) origins: Vec<String>,
    pub(crate) limiter: auth::RateLimiter,
    /// What the log's watcher saw last.
    pub(crate) seen: tokio::sync::watch::Receiver<events::Seen>,
    /// The event feed of each caller with a stream open.
    pub(crate) feeds: events::Feeds,
}

impl Served {
    /// The door `caller` goes through.
    pub(crate) fn door(&self, caller: &Caller) -> Outcome<Door> {
        match &self.backend {
            Backend::Direct(ws) => Ok(Door::Service(ws.clone(), caller.clone(), None)),
            Backend::Supervisor(socket) => {
                let key = (caller.actor.to_string(), caller.default_token.clone());
                let mut remotes = self.remotes.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(door) = remotes.get(&key) {
                    return Ok(door.clone());
                }
                let addr = SupervisorAddr {
                    socket: socket.clone(),
                    opens_as: Some(caller.actor.clone()),
                };
                let credentials = environment_core::Credentials {
                    token: caller.default_token.clone(),
                    approval: None,
                };
                let door = Door::through(Remote::connect(&addr, &credentials)?);
                remotes.insert(key, door.clone());
                Ok(door)
            }
        }
    }
}

/// Runs the server until SIGINT or SIGTERM.
pub fn run(ws: Workspace, actor: ActorId, a: &ServeArgs, json: bool) -> Outcome<i32> {
    if a.revoke {
        auth::SessionToken::revoke(&ws.home)?;
        if !json {
            println!("The session token is revoked; a running server refuses it from now on.");
        }
        return Ok(ExitCode::Ok.status());
    }
    if !a.listen.ip().is_loopback() && !a.behind_proxy {
        return Err(Failure::usage(format!(
            "{} is not a loopback address; nothing was started",
            a.listen
        ))
        .hint("serve on 127.0.0.1, or put it behind a reverse proxy that ends TLS and pass --behind-proxy"));
    }
    let policy = ws.policy()?.map(Arc::new);
    let env = ws.open_environment(Arc::new(environment_core::AllowAll))?;
    let session = auth::SessionToken::create(&ws.home, &actor)?;
    // Beside a supervisor, its queue is watched in the file it keeps it in.
    let mut queue: Option<Arc<dyn Queue>> = None;
    let backend = match crate::target::running(&ws, &actor) {
        Some(addr) => {
            queue = ws.watch_queue()?;
            Backend::Supervisor(addr.socket)
        }
        None => {
            let launcher =
                crate::commands::process::host_sandbox(&ws, &crate::cli::SandboxArgs::default())?;
            // A server's own watcher: what anyone changes in the tree is captured as it
            // happens (and shows up live), not at the next request.
            let serving = Serving {
                launcher: Some(launcher),
                capture_each_call: false,
                create_queue: true,
                forking: crate::commands::process::namespaces().is_ok(),
            };
            let mut session = Session::open(ws.clone(), actor.clone())?;
            session.watch_in_background()?;
            Backend::Direct(Arc::new(session.into_service(serving)?))
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| Failure::other(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(a.listen)
            .await
            .map_err(|e| Failure::other(format!("cannot listen on {}: {e}", a.listen)))?;
        let bound = listener
            .local_addr()
            .map_err(|e| Failure::other(format!("cannot read the bound address: {e}")))?;
        // In process, the service's own environment tells of its commits at once.
        let watched = match &backend {
            Backend::Direct(ws) => events::Watched {
                env: ws.env.clone(),
                policy: ws.policy.clone(),
                queue: ws.bus.clone(),
                branch: ws.branch.clone(),
            },
            Backend::Supervisor(_) => events::Watched {
                env,
                policy: policy.clone().map(|p| p as Arc<dyn Governance>),
                queue,
                branch: environment_core::MAIN.into(),
            },
        };
        let seen = events::watch_log(watched).await;
        let hosts = auth::hosts(bound, &a.hosts);
        let served = Arc::new(Served {
            backend,
            remotes: Mutex::new(HashMap::new()),
            session,
            policy,
            hosts: hosts.clone(),
            origins: auth::origins(&hosts, &a.hosts),
            limiter: auth::RateLimiter::new(a.rate_limit),
            seen,
            feeds: events::Feeds::default(),
        });
        let url = format!("http://{bound}/#token={}", served.session.token());
        announce(&url, bound, &served, json);
        if a.open {
            open_browser(&url);
        }
        let mcp_config = StreamableHttpServerConfig::default()
            .with_allowed_hosts(served.hosts.clone())
            .with_allowed_origins(served.origins.clone())
            .with_max_request_body_bytes(MAX_BODY);
        // The MCP sessions end with the server.
        let stop = mcp_config.cancellation_token.clone();
        let app = router(served.clone(), mcp_config);
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                shutdown_signal().await;
                stop.cancel();
            })
            .await
            .map_err(|e| Failure::other(format!("the server failed: {e}")))
    })?;
    Ok(ExitCode::Ok.status())
}

/// Says where the server is, with the URL that signs the person in.
fn announce(url: &str, bound: SocketAddr, served: &Served, json: bool) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = if json {
        writeln!(
            out,
            "{}",
            json!({
                "url": url,
                "listen": bound.to_string(),
                "token": served.session.token(),
                "actor": served.session.actor().as_str(),
                "token_file": served.session.path().display().to_string(),
            })
        )
    } else {
        writeln!(
            out,
            "envctl: serving the environment at {url}\n  (signed in as {}; the token is in {}, \
             `envctl serve --revoke` ends it)",
            served.session.actor(),
            served.session.path().display()
        )
    };
    let _ = out.flush();
}

fn open_browser(url: &str) {
    for opener in ["xdg-open", "open"] {
        if std::process::Command::new(opener)
            .arg(url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .is_ok()
        {
            return;
        }
    }
    eprintln!("envctl: no browser could be opened; go to {url}");
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

/// Every route, each behind the checks it needs.
fn router(served: Arc<Served>, mcp_config: StreamableHttpServerConfig) -> Router {
    let per_caller = {
        let served = served.clone();
        Arc::new(move |caller: &Caller| served.door(caller))
    };
    let mcp = StreamableHttpService::new(
        move || Ok(EnvServer::per_caller(per_caller.clone())),
        Arc::new(LocalSessionManager::default()),
        mcp_config,
    );
    let authenticated = Router::new()
        .route("/api/v1/events", axum::routing::get(events::stream))
        .route("/api/v1/{method}", axum::routing::post(api::call))
        .nest_service("/mcp", mcp)
        .layer(axum::middleware::from_fn_with_state(
            served.clone(),
            auth::authenticate,
        ));
    Router::new()
        .route("/openapi.json", axum::routing::get(api::openapi))
        .merge(ui::routes())
        .merge(authenticated)
        .layer(axum::middleware::from_fn_with_state(
            served.clone(),
            auth::same_site,
        ))
        .layer(tower_http::limit::RequestBodyLimitLayer::new(MAX_BODY))
        .with_state(served)
}
