//! Commands that cannot go through a running supervisor. While `envctl run` holds the
//! workspace, the workspace's use cases go through its control socket (the one door,
//! `crate::door`); these others say they cannot (exit 7) and do nothing.

use crate::cli::Command;
use crate::failure::Failure;
use crate::target::{SupervisorAddr, supervisor_unavailable};

/// Why `command` is not done through the supervisor at `addr`.
pub fn refusal(addr: &SupervisorAddr, command: &Command) -> Failure {
    match command {
        Command::Run(_) => supervisor_unavailable(addr, "another `run`")
            .hint("one supervisor per workspace: this one already runs an agent"),
        Command::Tournament(_) => supervisor_unavailable(addr, "tournament"),
        Command::Init { .. }
        | Command::Mcp
        | Command::Serve(_)
        | Command::Demo { .. }
        | Command::Monitor { .. } => supervisor_unavailable(addr, "this command"),
        // The use cases of the workspace go through its one door, before this.
        _ => Failure::other("this command goes through the workspace's door"),
    }
}
