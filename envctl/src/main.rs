//! envctl: the environment for agents and people who did not link the library.
//!
//! One command puts any agent into an environment — automatic capture, rollback, history,
//! marks, branches, the queue and the policy — and `envctl mcp` gives the same to agents that
//! speak MCP.
//!
//! # Exit codes
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | done |
//! | 1 | failure (storage, I/O, a damaged environment, nothing to undo) |
//! | 2 | malformed input (arguments, names, paths, payloads, rules) |
//! | 3 | not found (version, branch, mark, environment, topic, group, receipt, approval, program) |
//! | 4 | denied by the policy, or it needs an approval first |
//! | 5 | conflict (stale write, name taken, stale receipt, decided approval, merge with conflicts) |
//! | 6 | no supervisor is listening where one is required |
//! | 7 | not available in this build |
//!
//! `exec` and `run` exit with the command's own status once it ran. Errors go to stderr as one
//! sentence and a hint; results go to stdout (one JSON document with `--json`).
//!
//! # Layout
//!
//! [`workspace`] finds and opens an environment (the shared context of every command),
//! [`target`] decides whether a command goes to the stores or through a supervisor,
//! `commands/` holds one module per command group, [`mcp`] the MCP server.

mod cli;
mod commands;
mod failure;
mod mcp;
mod output;
mod progress;
mod target;
mod workspace;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
    let status = match commands::dispatch(cli) {
        Ok(status) => status,
        Err(f) => {
            eprintln!("envctl: {f}");
            f.code.status()
        }
    };
    std::process::exit(status);
}
