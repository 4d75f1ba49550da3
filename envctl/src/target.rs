//! Where a command goes: straight to the stores, or through a running supervisor.
//!
//! A supervisor (started by `envctl run`) owns the watcher and the stores while an agent runs;
//! commands then go through its control socket so that its captures and theirs do not race.
//! Without one, a command opens the stores itself and first captures what changed.
//!
//! This build has no client for the supervisor's control socket: a command that finds one
//! listening (at `--socket`, or the workspace's `HOME/control.sock`) says so and does nothing
//! (exit 7), and a `--socket` where nothing listens is exit 6. Going through the supervisor means
//! answering [`Target::Supervisor`] in each command module with the control client's calls.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use environment_core::ActorId;

use crate::failure::{ExitCode, Failure, Outcome};
use crate::workspace::{SOCKET_FILE, Session, Workspace};

/// A supervisor's control socket that accepted a connection.
#[derive(Debug, Clone)]
pub struct SupervisorAddr {
    /// The socket's path.
    pub socket: PathBuf,
}

/// Where a command goes.
pub enum Target {
    /// The stores, opened by this process.
    Direct(Box<Session>),
    /// A running supervisor.
    Supervisor(SupervisorAddr),
}

/// Whether something listens at `socket`.
pub fn probe(socket: &Path) -> Outcome<SupervisorAddr> {
    match UnixStream::connect(socket) {
        Ok(_) => Ok(SupervisorAddr {
            socket: socket.to_owned(),
        }),
        Err(e) => Err(Failure::new(
            ExitCode::NoSupervisor,
            format!("no supervisor is listening at {}: {e}", socket.display()),
        )
        .hint("start one with `envctl run -- AGENT...`, or leave out --socket to work directly")),
    }
}

impl Target {
    /// The supervisor named by `socket` (which must be listening), else the one of the
    /// workspace if it runs, else the stores directly.
    pub fn open(ws: Workspace, actor: ActorId, socket: Option<&Path>) -> Outcome<Target> {
        if let Some(s) = socket {
            return Ok(Target::Supervisor(probe(s)?));
        }
        let own = ws.home.join(SOCKET_FILE);
        if own.exists()
            && let Ok(addr) = probe(&own)
        {
            return Ok(Target::Supervisor(addr));
        }
        Ok(Target::Direct(Box::new(Session::open(ws, actor)?)))
    }

    /// The session, for commands that work on the stores.
    pub fn direct(&mut self) -> Outcome<&mut Session> {
        match self {
            Target::Direct(s) => Ok(s),
            Target::Supervisor(addr) => Err(supervisor_unavailable(addr)),
        }
    }
}

/// Talking to a supervisor is not part of this build yet.
pub fn supervisor_unavailable(addr: &SupervisorAddr) -> Failure {
    Failure::new(
        ExitCode::Unavailable,
        format!(
            "a supervisor listens at {}, but this build of envctl cannot talk to it; nothing \
             was done",
            addr.socket.display()
        ),
    )
    .hint("stop the supervisor, or use an envctl built with supervisor support")
}
