//! The launcher port: how a command is put into a sandbox before it is spawned.
//!
//! Everything that starts a program for an agent (the supervisor's agent, a recorded `exec`, a
//! background process, a PTY session, a tournament candidate) builds an ordinary
//! [`std::process::Command`] — program, arguments, stdio, working directory, environment — and
//! hands it to a [`Launcher`], which confines it. Keeping the seam at `Command` lets callers own
//! their stdio (pipes, a PTY) while the launcher owns namespaces, mounts and limits.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::Result;

/// Puts a command into a sandbox before it is spawned.
pub trait Launcher: Send + Sync {
    /// Confines `command`: installs whatever must happen between fork and exec, filters its
    /// environment, and translates its working directory to the path inside the sandbox. The
    /// command is then spawned by the caller as usual.
    fn confine(&self, command: &mut Command) -> Result<()>;

    /// Where the workspace appears to the confined program.
    fn workspace_inside(&self) -> &Path;

    /// A short description for logs and the agent ("user+mount+pid namespaces, host read-only").
    fn describe(&self) -> String;
}

/// No confinement: the command runs as the caller, on the host, in the workspace. For hosts
/// without unprivileged user namespaces, and for tests of what is built on top of a launcher.
#[derive(Clone, Debug)]
pub struct Unconfined {
    workspace: PathBuf,
}

impl Unconfined {
    /// A launcher that runs commands directly, with `workspace` as their working directory.
    pub fn new(workspace: impl Into<PathBuf>) -> Unconfined {
        Unconfined {
            workspace: workspace.into(),
        }
    }
}

impl Launcher for Unconfined {
    fn confine(&self, _command: &mut Command) -> Result<()> {
        Ok(())
    }

    fn workspace_inside(&self) -> &Path {
        &self.workspace
    }

    fn describe(&self) -> String {
        "unconfined (no isolation)".to_owned()
    }
}
