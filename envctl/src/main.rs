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
//! | 1 | failure (storage, I/O, a damaged environment) |
//! | 2 | malformed input (arguments, names, paths, payloads, rules) |
//! | 3 | not found (version, branch, mark, environment, topic, group, receipt, approval, program) |
//! | 4 | denied by the policy, or it needs an approval first |
//! | 5 | conflict (stale write, name taken, stale receipt, decided approval, merge with conflicts, nothing to undo or redo) |
//! | 6 | no supervisor is listening where one is required |
//! | 7 | not available here (no sandboxes on this host; not through a running supervisor) |
//!
//! `exec` and `run` exit with the command's own status once it ran. Errors go to stderr as one
//! sentence and a hint; results go to stdout (one JSON document with `--json`).
//!
//! # Layout
//!
//! [`workspace`] finds and opens an environment (the shared context of every command),
//! [`target`] decides whether a command goes to the stores or through a supervisor (a running
//! `envctl run`, found at `--socket`/`ENVIRONMENT_SOCKET` or the workspace's own socket),
//! `commands/` holds one module per command group, [`mcp`] the MCP server.

mod cli;
mod commands;
mod door;
mod failure;
mod mcp;
mod monitor;
mod output;
mod progress;
mod run_record;
mod serve;
mod stores;
mod target;
mod workspace;

use clap::Parser;

/// Clap's usage errors in the shape of every other error: one sentence and a hint.
fn usage_error(e: clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion)
        || matches!(
            e.kind(),
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        )
    {
        e.exit();
    }
    let text = e.render().to_string();
    let mut sentence = Vec::new();
    let mut usage = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(u) = line.strip_prefix("Usage: ") {
            usage = Some(u.to_owned());
        } else if usage.is_none()
            && !line.is_empty()
            && !line.starts_with("tip:")
            && !line.starts_with("For more information")
        {
            sentence.push(line.trim_start_matches("error: ").to_owned());
        }
    }
    let sentence = sentence.join(" ");
    let sentence = sentence.trim_end_matches(['.', ':']);
    let usage = usage.map(|u| format!("usage: {u}; ")).unwrap_or_default();
    eprintln!("envctl: {sentence}.\nhint: {usage}`envctl --help` lists the commands and options");
    std::process::exit(failure::ExitCode::Usage.status());
}

/// A command that prints and ends (not a server nor a supervisor, whose sockets must never
/// raise SIGPIPE) dies quietly of SIGPIPE when its reader goes away, as `git log | head` does,
/// instead of panicking on the failed write.
fn quiet_on_closed_stdout(command: &cli::Command) {
    if matches!(
        command,
        cli::Command::Run(_) | cli::Command::Mcp | cli::Command::Monitor { .. }
    ) {
        return;
    }
    #[allow(unsafe_code)]
    // SAFETY: restores the default action of one signal before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() {
    let cli = cli::Cli::try_parse().unwrap_or_else(|e| usage_error(e));
    quiet_on_closed_stdout(&cli.command);
    let status = match commands::dispatch(cli) {
        Ok(status) => status,
        Err(f) => {
            eprintln!("envctl: {f}");
            f.code.status()
        }
    };
    std::process::exit(status);
}
