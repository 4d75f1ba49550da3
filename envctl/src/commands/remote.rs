//! Commands answered by a running supervisor, through its control socket: while `envctl run`
//! holds the workspace, its captures and a command's changes must not race, so log, show,
//! diff, status and mark go through it (restore, undo, redo, merge and exec go through the
//! workspace's one door, `crate::door`, in process or through it alike). The others say they cannot
//! (exit 7) and do nothing.

use serde_json::{Value, json};

use crate::cli::{Cli, Command};
use crate::failure::{Failure, Outcome};
use crate::output::print_json;
use crate::target::{Remote, SupervisorAddr, supervisor_unavailable};

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Runs `cli`'s command through the supervisor at `addr`; returns the exit status.
pub fn run(addr: &SupervisorAddr, cli: &Cli) -> Outcome<i32> {
    let json = cli.json;
    let credentials = environment_core::Credentials {
        token: cli.token.clone(),
        approval: cli.approval.clone(),
    };
    match &cli.command {
        // Answered by the supervisor.
        Command::Status => {}
        Command::Run(_) => {
            return Err(supervisor_unavailable(addr, "another `run`")
                .hint("one supervisor per workspace: this one already runs an agent"));
        }
        Command::Tournament(_) => return Err(supervisor_unavailable(addr, "tournament")),
        Command::Policy(_) => return Err(supervisor_unavailable(addr, "policy")),
        Command::Init { .. } | Command::Mcp | Command::Demo { .. } | Command::Monitor { .. } => {
            return Err(supervisor_unavailable(addr, "this command"));
        }
        // The use cases of the workspace go through its one door (`crate::door`), before this.
        _ => {
            return Err(Failure::other(
                "this command goes through the workspace's door",
            ));
        }
    }
    let mut remote = Remote::connect(addr, &credentials)?;
    match &cli.command {
        Command::Status => {
            let r = remote.call("status", Value::Null)?;
            if json {
                print_json(&json!({ "supervisor": r, "socket": addr.socket }));
            } else {
                println!("supervisor: {}", addr.socket.display());
                for k in [
                    "workspace",
                    "sandbox",
                    "actor",
                    "branch",
                    "head",
                    "agent_pid",
                ] {
                    println!("  {k:<10} {}", text(&r[k]));
                }
                println!(
                    "  captures {} · rollbacks {}",
                    text(&r["captures"]),
                    text(&r["rollbacks"])
                );
            }
        }
        _ => return Err(Failure::other("unreachable command routing")),
    }
    Ok(0)
}
