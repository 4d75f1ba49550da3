//! One module per command group; [`dispatch`] routes a parsed command line to them.

mod demo;
mod history;
mod init;
mod maintain;
mod names;
pub mod policy;
pub mod process;
pub mod queue;
mod remote;
mod rollback;

use environment_core::ActorId;

use crate::cli::{Cli, Command};
use crate::door::Door;
use crate::failure::{ExitCode, Failure, Outcome};
use crate::target::Target;
use crate::workspace::{Look, Serving, Session, Workspace};

/// Parses an actor id given on the command line (`kind:name`).
pub fn parse_actor(s: &str) -> Outcome<ActorId> {
    let bad = || {
        Failure::usage(format!("{s:?} is not an actor id"))
            .hint("an actor is `kind:name`, e.g. human:alice or agent:coder-1")
    };
    match s.split_once(':') {
        Some((k, n)) if !k.is_empty() && !n.is_empty() => ActorId::new(s).map_err(|_| bad()),
        _ => Err(bad()),
    }
}

/// The actor of this invocation: --actor, else `default`.
fn actor_of(cli: &Cli, default: &str) -> Outcome<ActorId> {
    match &cli.actor {
        Some(a) => parse_actor(a),
        None => parse_actor(default),
    }
}

/// The actor `--actor` (or `ENVIRONMENT_ACTOR`) names, if any: through a `--socket`, the
/// connection opens a session as it (the agent's socket refuses); without, it acts as the
/// socket's own actor.
fn named_actor(cli: &Cli) -> Outcome<Option<ActorId>> {
    cli.actor.as_deref().map(parse_actor).transpose()
}

/// Who a person at the terminal is.
fn default_human() -> String {
    let user: String = std::env::var("USER")
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
        .collect();
    if user.is_empty() {
        "human:operator".into()
    } else {
        format!("human:{user}")
    }
}

/// What this invocation presents with every request.
fn credentials(cli: &Cli) -> environment_core::Credentials {
    environment_core::Credentials {
        token: cli.token.clone(),
        approval: cli.approval.clone(),
    }
}

/// The rollback a command asks for (restore, undo, redo), with whether to list every path.
fn rollback_of(command: &Command) -> Option<(rollback::Rollback, bool)> {
    use rollback::Rollback;
    match command {
        Command::Restore {
            version,
            dry_run,
            verbose,
        } => Some((
            Rollback::Restore {
                version: version.clone(),
                dry_run: *dry_run,
            },
            *verbose,
        )),
        Command::Undo { verbose } => Some((Rollback::Undo, *verbose)),
        Command::Redo { verbose } => Some((Rollback::Redo, *verbose)),
        _ => None,
    }
}

/// Whether a command is a use case of the workspace service, run through [`Door`] the same in
/// process and through a supervisor.
fn goes_through_door(command: &Command) -> bool {
    rollback_of(command).is_some()
        || matches!(
            command,
            Command::Log { .. }
                | Command::Show { .. }
                | Command::Refused { .. }
                | Command::Diff { .. }
                | Command::Mark { .. }
                | Command::Branch { .. }
                | Command::Effects { .. }
                | Command::Gc
                | Command::Verify
                | Command::Queue(_)
                | Command::Merge { .. }
                | Command::Exec(_)
                | Command::Tournament(_)
                | Command::Status
                | Command::Policy(_)
        )
}

/// Runs `cli`'s command through the door of `target` when it [`goes_through_door`]: its exit
/// status, or `None` for a command that does not. `held` is the workspace a supervisor holds,
/// when known (a command's working directory is given relative to it).
fn through_door(cli: &Cli, target: Target, held: Option<&Workspace>) -> Outcome<Option<i32>> {
    if !goes_through_door(&cli.command) {
        return Ok(None);
    }
    if let Command::Exec(a) = &cli.command {
        // A command runs in this host's sandbox, as asked; through a supervisor, in the run's,
        // which its callers (the agent among them) cannot widen.
        let (launcher, cwd) = match &target {
            Target::Direct(s) => (
                Some(process::host_sandbox(&s.ws, &a.sandbox)?),
                process::cwd_in(&s.ws.dir),
            ),
            Target::Supervisor(_) if a.sandbox.given() => {
                return Err(Failure::usage(
                    "a command run through the supervisor gets the run's sandbox: --network, \
                     --writable, --pass-env and the limits cannot change it",
                )
                .hint("give them to `envctl run`, or run exec when no supervisor runs"));
            }
            Target::Supervisor(_) => (None, held.and_then(|w| process::cwd_in(&w.dir))),
        };
        let serving = Serving {
            launcher,
            ..Serving::default()
        };
        let door = Door::open(target, &credentials(cli), serving)?;
        return process::exec(&door, a, cwd, cli.json).map(Some);
    }
    // The workspace this process knows: the one held by a supervisor, or the one it opened.
    let known = match &target {
        Target::Direct(s) => Some(s.ws.clone()),
        Target::Supervisor(_) => held.cloned(),
    };
    let serving = Serving {
        // A queue command makes the queue when it is not there yet.
        create_queue: matches!(cli.command, Command::Queue(_)),
        // Forks run in sandboxes of their own; without them the service says it cannot.
        forking: matches!(cli.command, Command::Tournament(_)) && process::namespaces().is_ok(),
        ..Serving::default()
    };
    let door = Door::open(target, &credentials(cli), serving)?;
    if let Some((what, verbose)) = rollback_of(&cli.command) {
        rollback::run(&door, &what, verbose, cli.json)?;
        return Ok(Some(ExitCode::Ok.status()));
    }
    let json = cli.json;
    match &cli.command {
        Command::Merge { branch } => return names::merge(&door, branch, json).map(Some),
        Command::Log { all, branch, limit } => history::log(&door, *all, branch, *limit, json)?,
        Command::Show { version } => history::show(&door, version, json)?,
        Command::Refused { branch, limit } => history::refused(&door, branch, *limit, json)?,
        Command::Diff {
            from,
            to,
            file: Some(path),
            ..
        } => history::file_diff(&door, path, from, to.as_deref(), json)?,
        Command::Diff { from, to, stat, .. } => {
            history::diff(&door, from, to.as_deref(), *stat, json)?
        }
        Command::Mark { name, version } => {
            names::mark(&door, name.as_deref(), version.as_deref(), json)?
        }
        Command::Branch { name, version } => {
            names::branch(&door, name.as_deref(), version.as_deref(), json)?
        }
        Command::Effects { unfinished } => maintain::effects(&door, *unfinished, json)?,
        Command::Gc => maintain::gc(&door, json)?,
        Command::Verify => maintain::verify(&door, json)?,
        Command::Queue(q) => queue::run(&door, q, json)?,
        Command::Tournament(a) => return process::tournament(&door, a, json).map(Some),
        Command::Status => maintain::status(&door, known.as_ref(), json)?,
        Command::Policy(p) => policy::run(&door, known.as_ref(), p, json)?,
        _ => return Ok(None),
    }
    Ok(Some(ExitCode::Ok.status()))
}

/// Runs a command; returns the exit status.
pub fn dispatch(mut cli: Cli) -> Outcome<i32> {
    let json = cli.json;
    // Like `git -C`: the command runs as if started in DIR, so relative paths given to it
    // (rule files, payload files) are read from there.
    if let Some(d) = &cli.chdir {
        let abs = d.canonicalize().map_err(|e| Failure::io("enter", d, e))?;
        std::env::set_current_dir(&abs).map_err(|e| Failure::io("enter", &abs, e))?;
        cli.chdir = Some(abs);
    }
    match &cli.command {
        Command::Init {
            dir,
            rootfs,
            home,
            shared_queue,
            shared_policy,
            shared_effects,
            shared_log,
            shared_blobs,
        } => {
            let actor = actor_of(&cli, &default_human())?;
            let dir = dir.clone().or(cli.chdir.clone());
            let stores = crate::stores::Stores {
                queue: shared_queue
                    .clone()
                    .map(|postgres| crate::stores::Shared { postgres }),
                policy: shared_policy
                    .clone()
                    .map(|postgres| crate::stores::Shared { postgres }),
                effects: shared_effects
                    .clone()
                    .map(|postgres| crate::stores::Shared { postgres }),
                log: shared_log
                    .clone()
                    .map(|postgres| crate::stores::Shared { postgres }),
                blobs: shared_blobs
                    .clone()
                    .map(|bucket| crate::stores::SharedBlobs { bucket }),
            };
            init::run(
                dir,
                rootfs.as_deref(),
                home.as_deref(),
                &stores,
                actor,
                json,
            )?;
            return Ok(0);
        }
        Command::Attach { stores, dir, home } => {
            let actor = actor_of(&cli, &default_human())?;
            init::attach(stores, dir, home.as_deref(), actor, json)?;
            return Ok(0);
        }
        Command::Mcp => {
            let actor = actor_of(&cli, "agent:mcp")?;
            if let Some(sock) = &cli.socket {
                let addr = crate::target::probe(sock, named_actor(&cli)?)?;
                crate::mcp::serve_remote(addr, credentials(&cli))?;
                return Ok(0);
            }
            let mut ws = Workspace::find(cli.chdir.as_deref())?;
            ws.credentials = credentials(&cli);
            if let Some(addr) = crate::target::running(&ws, &actor) {
                crate::mcp::serve_remote(addr, credentials(&cli))?;
                return Ok(0);
            }
            crate::mcp::serve(ws, actor)?;
            return Ok(0);
        }
        Command::Serve(a) => {
            let actor = actor_of(&cli, &default_human())?;
            let mut ws = Workspace::find(cli.chdir.as_deref())?;
            ws.credentials = credentials(&cli);
            return crate::serve::run(ws, actor, a, json);
        }
        Command::Demo { keep } => {
            demo::run(keep.as_deref())?;
            return Ok(0);
        }
        Command::Monitor { home, detach } => return crate::monitor::serve(home, *detach),
        _ => {}
    }
    let actor = actor_of(&cli, &default_human())?;
    // A running supervisor answers while it holds the workspace: the one named, else the
    // workspace's own.
    if let Some(sock) = &cli.socket {
        let addr = crate::target::probe(sock, named_actor(&cli)?)?;
        if let Some(status) = through_door(&cli, Target::Supervisor(addr.clone()), None)? {
            return Ok(status);
        }
        return Err(remote::refusal(&addr, &cli.command));
    }
    let mut ws = Workspace::find(cli.chdir.as_deref())?;
    ws.credentials = credentials(&cli);
    if let Some(addr) = crate::target::running(&ws, &actor) {
        if let Command::Tournament(a) = &cli.command {
            // The candidates run on forks; the supervisor adopts the winner into its tree.
            let mut remote = crate::target::Remote::connect(&addr, &credentials(&cli))?;
            let mut s = Session::open_stores(ws, actor)?;
            return process::tournament_beside(&mut s, a, json, &mut remote);
        }
        if let Some(status) = through_door(&cli, Target::Supervisor(addr.clone()), Some(&ws))? {
            return Ok(status);
        }
        return Err(remote::refusal(&addr, &cli.command));
    }
    if let Command::Run(a) = &cli.command {
        return process::run(ws, actor, a, json);
    }
    // Reading the history never rescans the tree: it records what the monitor saw, if anything.
    let look = match &cli.command {
        Command::Log { .. }
        | Command::Show { .. }
        | Command::Diff { .. }
        | Command::Effects { .. }
        | Command::Refused { .. }
        | Command::Verify => Look::Known,
        _ => Look::Changes,
    };
    // Every other command was dispatched above, on its own: these are the workspace's use
    // cases, through its one door.
    let target = Target::open_looking(ws, actor, look)?;
    through_door(&cli, target, None)?
        .ok_or_else(|| Failure::other("this command is not a use case of the workspace"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actors_are_kind_colon_name() {
        assert_eq!(parse_actor("agent:a-1").unwrap().as_str(), "agent:a-1");
        for bad in ["agent", ":x", "agent:", "", "a:\u{1}"] {
            assert_eq!(
                parse_actor(bad).unwrap_err().code,
                crate::failure::ExitCode::Usage,
                "{bad:?}"
            );
        }
    }
}
