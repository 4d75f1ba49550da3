//! Where a command goes: straight to the stores, or through a running supervisor.
//!
//! A supervisor (started by `envctl run`) owns the watcher and the stores while an agent runs;
//! commands then go through its control socket so that its captures and theirs do not race.
//! Without one, a command opens the stores itself and first captures what changed.
//!
//! A command that finds one listening goes through it with a [`Remote`]: through the
//! operator's socket of the workspace's own supervisor (`HOME/operator/control.sock`), as the
//! invocation's actor (the connection opens a session as it); or through the agent's socket
//! named by `--socket` (`ENVIRONMENT_SOCKET` inside the sandbox), as the agent, unless
//! `--actor` names someone else (which that socket refuses). A `--socket` where nothing
//! listens is exit 6.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use environment_core::{ActorId, Credentials};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use environment_supervisor::{ControlClient, ControlError, HangUp};
use serde_json::Value;

use crate::failure::{ExitCode, Failure, Outcome};
use crate::workspace::{Look, Session, Workspace};

/// The workspace's own supervisor, when one runs: its operator's socket, a connection to which
/// acts as `actor`.
pub fn running(ws: &Workspace, actor: &ActorId) -> Option<SupervisorAddr> {
    let own = ws.home.join(environment_supervisor::OPERATOR_SOCKET);
    if !own.exists() {
        return None;
    }
    probe(&own, Some(actor.clone())).ok()
}

/// A supervisor's control socket that accepted a connection.
#[derive(Debug, Clone)]
pub struct SupervisorAddr {
    /// The socket's path.
    pub socket: PathBuf,
    /// The actor a connection opens its session as; `None` acts as the socket's own (the
    /// agent's).
    pub opens_as: Option<ActorId>,
}

/// Where a command goes.
pub enum Target {
    /// The stores, opened by this process.
    Direct(Box<Session>),
    /// A running supervisor.
    Supervisor(SupervisorAddr),
}

/// Whether something listens at `socket`; its connections will open a session as `opens_as`.
pub fn probe(socket: &Path, opens_as: Option<ActorId>) -> Outcome<SupervisorAddr> {
    match UnixStream::connect(socket) {
        Ok(_) => Ok(SupervisorAddr {
            socket: socket.to_owned(),
            opens_as,
        }),
        Err(e) => Err(Failure::new(
            ExitCode::NoSupervisor,
            format!("no supervisor is listening at {}: {e}", socket.display()),
        )
        .hint("start one with `envctl run -- AGENT...`, or leave out --socket to work directly")),
    }
}

impl Target {
    /// The workspace's own supervisor if it runs (as `actor`), else the stores directly,
    /// looking at the tree as `look` says.
    pub fn open_looking(ws: Workspace, actor: ActorId, look: Look) -> Outcome<Target> {
        if let Some(addr) = running(&ws, &actor) {
            return Ok(Target::Supervisor(addr));
        }
        Ok(Target::Direct(Box::new(Session::open_looking(
            ws, actor, look,
        )?)))
    }
}

/// The one-sentence refusal of a command that cannot go through a running supervisor.
pub fn supervisor_unavailable(addr: &SupervisorAddr, what: &str) -> Failure {
    Failure::new(
        ExitCode::Unavailable,
        format!(
            "{what} cannot go through the supervisor listening at {} while it runs; nothing \
             was done",
            addr.socket.display()
        ),
    )
    .hint("wait for `envctl run` to end (or stop it), then run this again")
}

/// A connection to a supervisor's control socket, presenting this invocation's credentials.
pub struct Remote {
    client: ControlClient,
    approval: Option<String>,
    token: Option<String>,
    addr: SupervisorAddr,
    /// Set when a call was called off by hanging up: the next call connects again.
    hung_up: Arc<AtomicBool>,
}

/// Calls off a [`Remote`]'s call in flight (see [`Remote::canceller`]).
pub struct Canceller {
    hang_up: HangUp,
    hung_up: Arc<AtomicBool>,
}

impl Canceller {
    /// Calls it off: the supervisor kills the command it runs for the call, and records it as
    /// cancelled.
    pub fn cancel(&self) {
        self.hung_up.store(true, Ordering::Release);
        self.hang_up.hang_up();
    }
}

impl Remote {
    /// Connects to `addr`.
    pub fn connect(addr: &SupervisorAddr, credentials: &Credentials) -> Outcome<Remote> {
        Ok(Remote {
            client: Remote::client(addr, credentials.token.clone())?,
            approval: credentials.approval.clone(),
            token: credentials.token.clone(),
            addr: addr.clone(),
            hung_up: Arc::new(AtomicBool::new(false)),
        })
    }

    fn client(addr: &SupervisorAddr, token: Option<String>) -> Outcome<ControlClient> {
        let mut client = ControlClient::connect(&addr.socket)
            .map_err(|e| control_failure(addr, e))?
            .with_token(token);
        if let Some(actor) = &addr.opens_as {
            client
                .open_session(actor.as_str())
                .map_err(|e| control_failure(addr, e))?;
        }
        Ok(client)
    }

    /// The socket it is connected to.
    pub fn socket(&self) -> &Path {
        &self.addr.socket
    }

    /// What calls off the next call (or the one in flight) from another thread.
    pub fn canceller(&self) -> Outcome<Canceller> {
        Ok(Canceller {
            hang_up: self
                .client
                .hang_up_handle()
                .map_err(|e| control_failure(&self.addr, e))?,
            hung_up: self.hung_up.clone(),
        })
    }

    /// Calls `method` with `params` (an object), presenting this invocation's approval unless
    /// the call presents one of its own.
    pub fn call(&mut self, method: &str, mut params: Value) -> Outcome<Value> {
        if self.hung_up.swap(false, Ordering::AcqRel) {
            self.client = Remote::client(&self.addr, self.token.clone())?;
        }
        if let (Some(a), Value::Object(m)) = (&self.approval, &mut params) {
            m.entry("approval")
                .or_insert_with(|| Value::String(a.clone()));
        }
        self.client
            .call(method, params)
            .map_err(|e| control_failure(&self.addr, e))
    }
}

/// A supervisor's refusal in envctl's terms: the exit code follows the JSON-RPC error code.
pub fn control_failure(addr: &SupervisorAddr, e: ControlError) -> Failure {
    use environment_supervisor::rpc;
    let for_agent = e.for_agent();
    let mut f = match &e {
        ControlError::Rpc {
            code,
            message,
            data,
        } => {
            let kind = rpc::kind_of_error(*code, data);
            let exit = ExitCode::from(kind);
            let detail = data
                .get("detail")
                .or_else(|| data.get("reason"))
                .and_then(Value::as_str)
                .map(|d| format!(": {d}"))
                .unwrap_or_default();
            let mut f = Failure::new(
                exit,
                format!("the supervisor refused: {message}{detail}; nothing was done"),
            );
            if let Some(id) = data.get("approval").and_then(Value::as_str) {
                f = f.hint(format!(
                    "approval {id} was requested; once granted, retry with --approval {id}"
                ));
            } else if exit == ExitCode::Denied {
                f = f.hint("`envctl policy explain` shows why");
            } else if exit == ExitCode::NotFound {
                f = f.hint("`envctl log` lists the versions");
            }
            f
        }
        ControlError::Io(io) => Failure::new(
            ExitCode::NoSupervisor,
            format!(
                "no supervisor answers at {}: {io}; nothing was done",
                addr.socket.display()
            ),
        )
        .hint("start one with `envctl run -- AGENT...`"),
        other => Failure::other(format!(
            "the supervisor at {} answered badly: {other}",
            addr.socket.display()
        )),
    };
    f.for_agent = Some(for_agent);
    if let ControlError::Rpc { code, data, .. } = e {
        f.service = Some((rpc::kind_of_error(code, &data), data));
    }
    f
}
