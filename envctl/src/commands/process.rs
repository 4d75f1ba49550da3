//! `envctl exec`, `run`, `tournament`: programs run in the workspace, their changes recorded.
//!
//! Both spawn through the sandbox's [`Launcher`] port; this build uses [`Unconfined`] (the
//! workspace on the host). The changes a command makes are captured at its end and attributed
//! to its actor and intent; its output is passed through (CLI) or returned (MCP), not stored.
//! `run` keeps its tracker in this process: a supervisor that owns the tracker and a control
//! socket, a confining launcher (`--isolate rootfs`) and `--self-rollback` take its place once
//! they are part of the build.

use std::process::{Command, ExitStatus, Stdio};

use environment_core::{
    Action, EnvError, HistoryEntry, HistoryOptions, Intent, IntentKind, MAIN, Observation, OpFlags,
    Resource,
};
use environment_sandbox::{Launcher, SandboxError, Unconfined};
use serde_json::json;

use crate::cli::{ExecArgs, Isolation, RunArgs};
use crate::failure::{ExitCode, Failure, Outcome};
use crate::output::print_json;
use crate::workspace::{Session, witness};

/// What a recorded command did.
pub struct Executed {
    /// Its exit status (128 + N when killed by signal N).
    pub status: i32,
    /// The operation its changes were recorded as (`None`: it changed nothing).
    pub recorded: Option<Observation>,
    /// Its stdout and stderr, when they were captured rather than passed through.
    pub output: Option<(Vec<u8>, Vec<u8>)>,
}

fn status_code(s: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    s.code().unwrap_or_else(|| 128 + s.signal().unwrap_or(0))
}

/// The program resource a command line asks to run.
fn program_of(argv: &[String]) -> Outcome<Resource> {
    let (program, args) = argv
        .split_first()
        .ok_or_else(|| Failure::usage("no command given").hint("put it after `--`"))?;
    Ok(Resource::Program {
        program: program.clone(),
        args: args.to_vec(),
    })
}

/// Builds the command for `argv`, confined by the launcher, in the workspace.
fn command(s: &Session, launcher: &dyn Launcher, argv: &[String]) -> Outcome<Command> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env("ENVIRONMENT_DIR", &s.ws.dir)
        .env("ENVIRONMENT_ACTOR", s.actor.as_str());
    launcher.confine(&mut cmd)?;
    cmd.current_dir(launcher.workspace_inside());
    Ok(cmd)
}

fn spawn_failure(program: &str, e: std::io::Error) -> Failure {
    match e.kind() {
        std::io::ErrorKind::NotFound => Failure::not_found(format!(
            "cannot run {program:?}: no such program; nothing ran"
        ))
        .hint("check the name and PATH"),
        std::io::ErrorKind::PermissionDenied => Failure::other(format!(
            "cannot run {program:?}: permission denied; nothing ran"
        ))
        .hint("check that it is executable by this user"),
        _ => Failure::other(format!("cannot run {program:?}: {e}; nothing ran")),
    }
}

/// Hands tracking to a tracker that attributes captures to the session's actor.
fn track_as_actor(s: &mut Session, auto: bool) -> Outcome<environment_sandbox::Tracker> {
    s.stop_tracker()?;
    s.start_tracker(s.actor.clone(), auto, "capturing the workspace")
}

/// Hands tracking back to the witness; when a capture as the actor was refused, the witness
/// records the changes (they are on disk: refusing to record them would lose them).
fn back_to_witness(s: &mut Session) -> Outcome<()> {
    let t = s.start_tracker(witness(), false, "capturing the workspace")?;
    s.set_tracker(t);
    Ok(())
}

fn refused_capture(s: &Session, e: EnvError) -> Failure {
    let why = Failure::from(e).message;
    let mut f = Failure::new(
        ExitCode::Denied,
        format!(
            "the command ran, but {} may not record its changes ({why}); they were recorded as \
             changes found in the workspace by {}",
            s.actor,
            witness()
        ),
    )
    .hint("`envctl log` shows them; `envctl undo` takes them back");
    f.partial = true;
    f
}

/// Runs `argv` in the workspace as one recorded operation of the session's actor. Output is
/// passed through (`capture_output` false) or returned.
pub fn exec_recorded(
    s: &mut Session,
    argv: &[String],
    intent: Option<&str>,
    capture_output: bool,
) -> Outcome<Executed> {
    s.authorize(Action::Execute, program_of(argv)?)?;
    let launcher = Unconfined::new(&s.ws.dir);
    let mut cmd = command(s, &launcher, argv)?;
    if capture_output {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
    }
    let tracker = track_as_actor(s, false)?;
    let ran = if capture_output {
        cmd.output().map(|o| (o.status, Some((o.stdout, o.stderr))))
    } else {
        cmd.status().map(|st| (st, None))
    };
    let (status, output) = match ran {
        Ok(r) => r,
        Err(e) => {
            drop(tracker);
            back_to_witness(s)?;
            return Err(spawn_failure(&argv[0], e));
        }
    };
    let code = status_code(status);
    let mut flags = OpFlags::COMMAND;
    if code != 0 {
        flags |= OpFlags::FAILED;
    }
    let text = intent.map(str::to_owned).unwrap_or_else(|| {
        let line = argv.join(" ");
        if code == 0 {
            line
        } else {
            format!("{line} (exit {code})")
        }
    });
    let recorded = tracker.capture_now(Intent::new(IntentKind::Command, text), flags);
    drop(tracker);
    back_to_witness(s)?;
    let recorded = match recorded {
        Ok(r) => r,
        Err(SandboxError::Env(e @ EnvError::NotAllowed(_))) => return Err(refused_capture(s, e)),
        Err(e) => return Err(e.into()),
    };
    Ok(Executed {
        status: code,
        recorded,
        output,
    })
}

/// `envctl exec -- CMD...`.
pub fn exec(s: &mut Session, a: &ExecArgs, json: bool) -> Outcome<i32> {
    let done = exec_recorded(s, &a.command, a.intent.as_deref(), false)?;
    let summary = |o: &Observation| {
        format!(
            "+{} ~{} -{}",
            o.summary.added, o.summary.modified, o.summary.removed
        )
    };
    if json {
        print_json(&json!({
            "status": done.status,
            "version": done.recorded.as_ref().map(|o| o.version.to_string()),
            "added": done.recorded.as_ref().map(|o| o.summary.added),
            "modified": done.recorded.as_ref().map(|o| o.summary.modified),
            "removed": done.recorded.as_ref().map(|o| o.summary.removed),
        }));
    } else {
        match &done.recorded {
            Some(o) => eprintln!(
                "envctl: recorded as {} ({}), exit {}",
                o.version.short(),
                summary(o),
                done.status
            ),
            None => eprintln!("envctl: no file changed, exit {}", done.status),
        }
    }
    Ok(done.status)
}

/// While the agent runs, an interrupt from the terminal is the agent's to handle (it gets it
/// too, being in the same process group): envctl keeps going, so that the final capture and
/// the summary still happen. Holding a registered handler is what keeps the default action
/// (exit) away; the agent's exec resets handlers, so it is not affected.
struct InterruptsHeld {
    _signal: tokio::signal::unix::Signal,
    _runtime: tokio::runtime::Runtime,
}

fn hold_interrupts() -> Option<InterruptsHeld> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .ok()?;
    let signal = runtime
        .block_on(async {
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        })
        .ok()?;
    Some(InterruptsHeld {
        _signal: signal,
        _runtime: runtime,
    })
}

/// `envctl run -- AGENT...`: the agent runs with automatic capture; a final capture and a
/// summary at its exit.
pub fn run(s: &mut Session, a: &RunArgs, json: bool) -> Outcome<i32> {
    if a.isolate == Isolation::Rootfs {
        return Err(Failure::new(
            ExitCode::Unavailable,
            "--isolate rootfs is not available in this build: the namespace launcher is not \
             part of it; nothing ran",
        )
        .hint("use --isolate host"));
    }
    if a.self_rollback {
        return Err(Failure::new(
            ExitCode::Unavailable,
            "--self-rollback is not available in this build: it needs the supervisor's control \
             socket; nothing ran",
        )
        .hint("leave it out; `envctl restore` rolls back from another terminal"));
    }
    s.authorize(Action::Execute, program_of(&a.command)?)?;
    let start = s.head()?;
    let launcher = Unconfined::new(&s.ws.dir);
    let mut cmd = command(s, &launcher, &a.command)?;
    let tracker = track_as_actor(s, true)?;
    let held = hold_interrupts();
    let status = match cmd.status() {
        Ok(st) => status_code(st),
        Err(e) => {
            drop(tracker);
            back_to_witness(s)?;
            return Err(spawn_failure(&a.command[0], e));
        }
    };
    drop(held);
    let background = tracker.captures();
    let last = tracker.close();
    back_to_witness(s)?;
    let captures = background + u64::from(matches!(last, Ok(Some(_))));
    if let Err(e) = last {
        return Err(match e {
            SandboxError::Env(e @ EnvError::NotAllowed(_)) => refused_capture(s, e),
            e => e.into(),
        });
    }
    let end = s.head()?;
    let changed = s.env.diff(&s.actor, &start, &end, None)?.len();
    let entries = s.env.history(
        &s.actor,
        MAIN,
        &HistoryOptions {
            all: true,
            limit: 100_000,
        },
    )?;
    let mut rollbacks = 0;
    for e in &entries {
        if let HistoryEntry::Op { op, .. } = e {
            if op.id == start {
                break;
            }
            if op.flags.contains(OpFlags::ROLLBACK) {
                rollbacks += 1;
            }
        }
    }
    if json {
        print_json(&json!({
            "status": status,
            "captures": captures,
            "files_changed": changed,
            "rollbacks": rollbacks,
            "from": start.to_string(),
            "to": end.to_string(),
        }));
    } else {
        eprintln!(
            "envctl: the agent exited with status {status}.\n  captures:      {captures}\n  \
             files changed: {changed} ({} → {})\n  rollbacks:     {rollbacks}\n  isolation:     \
             {}\n  history:       envctl log; back to the start: envctl restore {}",
            start.short(),
            end.short(),
            launcher.describe(),
            start.short()
        );
    }
    Ok(status)
}

/// `envctl tournament` in this build.
pub fn tournament_unavailable() -> Failure {
    Failure::new(
        ExitCode::Unavailable,
        "tournament is not available in this build: it needs the sandbox's fork support; \
         nothing was run",
    )
    .hint("run each candidate on its own branch with `envctl exec`, then `envctl merge` the winner")
}
