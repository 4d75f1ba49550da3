//! `envctl exec`, `run`, `tournament`: programs run in the workspace, their changes recorded.
//!
//! Programs run through the sandbox's [`Launcher`] port: an [`environment_sandbox::Isolation`]
//! in host mode (the host read-only, the workspace writable, secrets and the environment's home
//! masked) when this host allows unprivileged user namespaces, else [`Unconfined`] (said once on
//! stderr). `exec` runs through the sandbox's [`Shell`]: one operation of its actor holding the
//! files it changed and its output (stored as blobs). `run` starts a [`Supervisor`] that
//! captures while the agent runs and answers on the control socket; `tournament` forks the
//! workspace into overlays, one sandbox each.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Once, OnceLock};
use std::time::Duration;

use environment_core::{Action, ActorId, Exit, Governance, Resource};
use environment_sandbox::{
    Bind, CgroupLimits, ForkConfig, Forks, Isolation as Sandbox, IsolationSpec, Launcher, Pick,
    SandboxError, Shell, Tournament, Unconfined, WorkingTree, Workspace as SandboxWorkspace,
};
use environment_supervisor::{AgentSpec, ShellHandles, Supervisor, SupervisorConfig, TrackedRoot};
use environment_workspace::Request;
use environment_workspace::commands::ExecParams;
use environment_workspace::tournament::{self, Report, TournamentParams};
use environment_workspace::versions::{MergeParams, Merged};
use serde_json::json;

use super::history::short;
use crate::cli::{ExecArgs, Isolation, Network, PickArg, RunArgs, SandboxArgs, TournamentArgs};
use crate::door::Door;
use crate::failure::{ExitCode, Failure, Outcome};
use crate::output::print_json;
use crate::workspace::{ROOTFS_DIR, ROOTFS_KEY_PREFIX, SOCKET_FILE, Session, Workspace, witness};

/// Where the workspace appears inside a managed rootfs.
pub(crate) const ROOTFS_WORKSPACE: &str = "/workspace";

/// Where the control socket appears inside a sandbox that is given it.
pub(crate) const SOCKET_DIR_INSIDE: &str = "/tmp/.environment-run";
/// What `ENVIRONMENT_SOCKET` names for an agent not given the socket: a path that cannot exist,
/// so a client inside fails to connect instead of finding a socket by chance.
const NO_SOCKET: &str = "/dev/null/no-control-socket";

fn exit_status(e: Exit) -> i32 {
    match e {
        Exit::Code(c) => c,
        Exit::Signal(n) => 128 + n,
        Exit::TimedOut => 124,
        // As a shell reports a command interrupted by its user.
        Exit::Cancelled => 130,
    }
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

/// Whether this host can make sandboxes: `Err` holds the reason it cannot. Found by trying,
/// once per process.
pub fn namespaces() -> Result<(), String> {
    static PROBED: OnceLock<Result<(), String>> = OnceLock::new();
    PROBED
        .get_or_init(|| Sandbox::probe().map(|_| ()).map_err(|e| e.to_string()))
        .clone()
}

/// What `--network`, `--writable` and `--pass-env` ask of a sandbox (the sandbox checks the
/// directories when it is built).
fn open_up(spec: &mut IsolationSpec, args: &SandboxArgs) {
    spec.network = args.network.unwrap_or(Network::Host) == Network::Host;
    spec.env_allow.extend(args.pass_env.iter().cloned());
    spec.writable.extend(args.writable.iter().cloned());
    spec.limits.cgroup = CgroupLimits {
        memory: args.memory,
        processes: args.max_processes,
        cpu_millis: args.cpus,
    };
}

/// A command that asked for a sandbox's walls or limits where none is made: refused, rather
/// than run without them.
fn unconfinable(why: &str) -> Failure {
    Failure::usage(format!(
        "{why}: --network, --writable, --pass-env, --memory, --max-processes and --cpus need a \
         sandbox; nothing ran"
    ))
}

/// Builds the sandbox, saying in one line each layer this kernel lacks (it never degrades
/// silently).
fn sandbox(spec: IsolationSpec) -> Outcome<Sandbox> {
    static SAID: Once = Once::new();
    let sandbox = Sandbox::new(spec)?;
    SAID.call_once(|| {
        for missing in sandbox.support().missing_layers() {
            eprintln!("envctl: this kernel lacks {missing}");
        }
    });
    Ok(sandbox)
}

/// The sandbox of a command in `ws`: host mode with the home masked when namespaces work, else
/// the host as it is (said once).
pub fn host_sandbox(ws: &Workspace, args: &SandboxArgs) -> Outcome<Arc<dyn Launcher>> {
    static SAID: Once = Once::new();
    match namespaces() {
        Ok(()) => {
            let mut spec = IsolationSpec::host(&ws.dir);
            spec.masked.push(ws.home.clone());
            open_up(&mut spec, args);
            Ok(Arc::new(sandbox(spec)?))
        }
        Err(why) if args.given() => Err(unconfinable(&format!(
            "this host refuses unprivileged user namespaces ({why}), so commands run unconfined"
        ))),
        Err(why) => {
            SAID.call_once(|| {
                eprintln!(
                    "envctl: this host refuses unprivileged user namespaces, so commands run \
                     unconfined on the host: {why}"
                )
            });
            Ok(Arc::new(Unconfined::new(&ws.dir)))
        }
    }
}

/// `envctl exec -- CMD...` through `door`: one recorded operation of the command's actor, its
/// output passed through, its exit status the command's. Changes its actor may not make are put
/// back and kept as refused; the command then fails (denied) saying all of what happened.
pub fn exec(door: &Door, a: &ExecArgs, cwd: Option<String>, json: bool) -> Outcome<i32> {
    program_of(&a.command)?;
    let r = door.request(ExecParams {
        argv: a.command.clone(),
        cwd,
        env: Default::default(),
        secrets: Default::default(),
        intent: a.intent.clone(),
        stdin: None,
        timeout_ms: None,
        output_limit: None,
    })?;
    let status = exit_status(r.exit);
    let cut = if r.stdout.truncated || r.stderr.truncated {
        " (output cut at the limit)"
    } else {
        ""
    };
    let refused = environment_core::put_back_note(&r.refused);
    let op = short(&r.op);
    if json {
        let mut out = json!(r);
        out["status"] = json!(status);
        print_json(&out);
    } else {
        use std::io::Write;
        let _ = std::io::stdout().write_all(&r.stdout.bytes.decode().unwrap_or_default());
        let _ = std::io::stderr().write_all(&r.stderr.bytes.decode().unwrap_or_default());
        if refused.is_none() {
            eprintln!(
                "envctl: recorded as {op} ({} file(s) changed), exit {status}{cut}{}",
                r.files_changed,
                door.via()
            );
        }
    }
    let Some((sentence, next)) = refused else {
        return Ok(status);
    };
    // Part of what the command did was refused: the failure says all of what happened. Paths
    // another working copy changed first are a conflict, not a denial.
    let code = if r.refused.iter().all(|c| c.verdict == "stale") {
        ExitCode::Conflict
    } else {
        ExitCode::Denied
    };
    let mut f = Failure::new(
        code,
        format!(
            "the command exited with status {status}{cut} and its other changes were recorded \
             as {op}, but {sentence}"
        ),
    )
    .hint(next);
    f.partial = true;
    Err(f)
}

/// The launcher of `run`, and where the agent finds the socket and the workspace.
struct Placement {
    launcher: Arc<dyn Launcher>,
    socket_inside: PathBuf,
    workspace_inside: PathBuf,
    /// The managed rootfs, tracked beside the workspace when the agent runs in it.
    rootfs: Option<PathBuf>,
}

fn placement(ws: &Workspace, a: &RunArgs, socket: &Path) -> Outcome<Placement> {
    let isolate = match a.isolate {
        Some(i) => i,
        None if namespaces().is_ok() => Isolation::Host,
        None => {
            if let Err(why) = namespaces() {
                eprintln!(
                    "envctl: this host refuses unprivileged user namespaces, so the agent runs \
                     unconfined on the host: {why}"
                );
            }
            Isolation::None
        }
    };
    let socket_dir = socket.parent().unwrap_or(Path::new("/")).to_path_buf();
    let inside = PathBuf::from(SOCKET_DIR_INSIDE);
    let socket_name = socket.file_name().unwrap_or_default();
    let given = |inside_path: PathBuf| {
        if a.self_rollback {
            inside_path
        } else {
            PathBuf::from(NO_SOCKET)
        }
    };
    if isolate == Isolation::None {
        if a.sandbox.given() {
            return Err(unconfinable("the agent runs unconfined (--isolate none)"));
        }
        return Ok(Placement {
            launcher: Arc::new(Unconfined::new(&ws.dir)),
            socket_inside: given(socket.to_path_buf()),
            workspace_inside: ws.dir.clone(),
            rootfs: None,
        });
    }
    if let Err(why) = namespaces() {
        return Err(Failure::new(
            ExitCode::Unavailable,
            format!("this host cannot make sandboxes ({why}); nothing ran"),
        )
        .hint("use --isolate none to run the agent unconfined"));
    }
    let mut tracked_rootfs = None;
    let mut spec = match isolate {
        Isolation::Rootfs => {
            let rootfs = ws.home.join(ROOTFS_DIR);
            if !rootfs.is_dir() {
                return Err(Failure::not_found(format!(
                    "this environment has no managed rootfs ({} is missing); nothing ran",
                    rootfs.display()
                ))
                .hint("make one with `envctl init --rootfs DIR_OR_TAR`"));
            }
            let mut spec = IsolationSpec::rootfs(&rootfs);
            spec.workspace = Some(SandboxWorkspace::Dir(ws.dir.clone()));
            spec.workspace_inside = Some(ROOTFS_WORKSPACE.into());
            // The stores (and the rootfs itself) are not the agent's to see through the
            // workspace.
            if let Ok(rel) = ws.home.strip_prefix(&ws.dir) {
                spec.masked.push(Path::new(ROOTFS_WORKSPACE).join(rel));
            }
            // envctl itself, callable inside as `envctl` (on the rootfs's PATH).
            if let Some(dir) = std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(Path::to_path_buf))
            {
                spec.binds.push(Bind {
                    host: dir,
                    inside: environment_sandbox::isolate::ROOTFS_TOOLS.into(),
                    writable: false,
                });
            }
            tracked_rootfs = Some(rootfs);
            spec
        }
        _ => {
            let mut spec = IsolationSpec::host(&ws.dir);
            // The agent gets neither the stores nor, unless given, the socket beneath them.
            spec.masked.push(ws.home.clone());
            // envctl itself stays callable inside (to talk to the socket), even from under
            // /tmp, which the sandbox replaces with its own.
            if let Some(dir) = std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(Path::to_path_buf))
            {
                spec.binds.push(Bind::same_path(dir));
            }
            spec
        }
    };
    if a.self_rollback {
        // The supervisor makes it too, but the sandbox's plan needs it now.
        std::fs::create_dir_all(&socket_dir).map_err(|e| Failure::io("create", &socket_dir, e))?;
        spec.binds.push(Bind {
            host: socket_dir,
            inside: inside.clone(),
            writable: false,
        });
    }
    open_up(&mut spec, &a.sandbox);
    let sandbox = sandbox(spec)?;
    let workspace_inside = sandbox.workspace_inside().to_path_buf();
    Ok(Placement {
        launcher: Arc::new(sandbox),
        socket_inside: given(inside.join(socket_name)),
        workspace_inside,
        rootfs: tracked_rootfs,
    })
}

/// `envctl run -- AGENT...`: a supervisor runs the agent with automatic capture and the control
/// socket; a final capture and a summary at its end, or at SIGTERM/SIGINT to envctl.
pub fn run(ws: Workspace, actor: ActorId, a: &RunArgs, json: bool) -> Outcome<i32> {
    // Whatever changed out of band is the witness's, captured before the agent starts.
    let mut s = Session::open(ws.clone(), actor.clone())?;
    s.authorize(Action::Execute, program_of(&a.command)?)?;
    let noise = s.noise_rules();
    let policy = s.policy.clone();
    s.stop_tracker()?;
    drop(s);
    let socket = ws.home.join(SOCKET_FILE);
    let place = placement(&ws, a, &socket)?;
    let mut config =
        SupervisorConfig::new(&ws.home, &ws.dir, place.launcher.clone(), actor.clone());
    config.socket = Some(socket);
    config.socket_inside = Some(place.socket_inside.clone());
    config.noise = noise;
    config.policy = policy.map(|p| p as Arc<dyn Governance>);
    config.token = ws.credentials.token.clone();
    config.capture_actor = actor.clone();
    let monitor = ws.home.join(crate::monitor::MONITOR_SOCKET);
    config.monitor = monitor.exists().then_some(monitor);
    if let Some(rootfs) = &place.rootfs {
        // Under the home's own (never captured) path in the workspace, so no tracker of the
        // workspace alone ever writes or removes the rootfs's keys.
        config.extra_roots.push(TrackedRoot {
            path: rootfs.clone(),
            key_prefix: ROOTFS_KEY_PREFIX.as_bytes().to_vec(),
            noise: Some(crate::workspace::rootfs_noise()),
        });
    }
    // The queue is there for the agent whether or not anyone used it before the run, as it is
    // without a supervisor (opening it creates it).
    config.bus = ws.open_queue(true)?;
    config.effects = crate::stores::Stores::read(&ws.home)?.open_effects()?;
    let supervisor = Supervisor::open(config)?;
    if let Some(tracker) = supervisor.tracker() {
        let shell = Shell::new(place.launcher.clone(), tracker, None)?;
        supervisor.attach_shell(ShellHandles {
            exec: Some(Arc::new(shell.clone())),
            processes: Some(Arc::new(shell.clone())),
            pty: Some(Arc::new(shell)),
        });
    }
    let spec = AgentSpec::new(a.command.iter())
        .env("ENVIRONMENT_DIR", &place.workspace_inside)
        .env("ENVIRONMENT_ACTOR", actor.as_str());
    let described = place.launcher.describe();
    // Written before the agent starts: a run killed at any moment after is reported.
    let active = match crate::run_record::ActiveRun::begin(&ws.home) {
        Ok(a) => a,
        Err(e) => {
            let _ = supervisor.shutdown_with_grace(Duration::from_secs(1));
            return Err(Failure::io("write the run's record in", &ws.home, e));
        }
    };
    if let Err(e) = supervisor.spawn_agent(spec) {
        let f = spawn_failure(&a.command[0], e);
        let _ = supervisor.shutdown_with_grace(Duration::from_secs(1));
        active.end();
        return Err(f);
    }
    let summary = supervisor.run_until_signal(Duration::from_secs(5))?;
    active.end();
    // What the policy does not let the agent record was put back by its captures; anything
    // still unrecorded (a capture that failed) is on disk all the same: the witness records it
    // now, so that nothing is lost, and the summary says so.
    let found = Session::open(ws.clone(), actor.clone())?;
    let found_after = found.head()?.to_string() != summary.final_version;
    drop(found);
    let status = match &summary.agent {
        Some(x) => x.code.unwrap_or_else(|| 128 + x.signal.unwrap_or(0)),
        None => 1,
    };
    if json {
        print_json(&json!({
            "status": status,
            "captures": summary.captures,
            "files_changed": summary.files_changed,
            "rollbacks": summary.rollbacks,
            "requests": summary.requests,
            "denied": summary.denied,
            "from": summary.first_version,
            "to": summary.final_version,
            "agent": summary.agent,
            "isolation": described,
            "recorded_as_found": found_after,
            "unreadable": paths_json(&summary.unreadable),
            "without_content": paths_json(&summary.without_content),
            "refused": paths_json(&summary.refused),
            "rescans": summary.blind,
        }));
    } else {
        let short = |v: &str| v.chars().take(12).collect::<String>();
        eprintln!(
            "envctl: the agent exited with status {status}.\n  captures:      {}\n  files \
             changed: {} ({} → {})\n  rollbacks:     {}\n  requests:      {} ({} denied)\n  \
             isolation:     {described}\n  history:       envctl log; back to the start: envctl \
             restore {}",
            summary.captures,
            summary.files_changed,
            short(&summary.first_version),
            short(&summary.final_version),
            summary.rollbacks,
            summary.requests,
            summary.denied,
            short(&summary.first_version),
        );
        if found_after {
            eprintln!(
                "  found after:   changes the run's captures did not record (a capture failed) \
                 were recorded as found by {} (envctl log)",
                witness()
            );
        }
        for (label, paths, what) in [
            (
                "unreadable:",
                &summary.unreadable,
                "could not be read and are not recorded yet",
            ),
            (
                "no content:",
                &summary.without_content,
                "stayed unreadable and are recorded without their content",
            ),
            (
                "refused:",
                &summary.refused,
                "the agent may not change were put back and kept as refused (envctl refused)",
            ),
        ] {
            if let Some((first, why)) = paths.first() {
                eprintln!(
                    "  {label:<14} {} path(s) {what} (first: {}: {why})",
                    paths.len(),
                    first.display()
                );
            }
        }
        for why in &summary.blind {
            eprintln!("  rescans:       every capture rescans the whole tree: {why}");
        }
    }
    Ok(status)
}

/// Paths with why, for `--json`.
fn paths_json(paths: &[(std::path::PathBuf, String)]) -> serde_json::Value {
    paths
        .iter()
        .map(|(p, why)| json!({"path": p.display().to_string(), "why": why}))
        .collect()
}

fn spawn_failure(program: &str, e: SandboxError) -> Failure {
    let text = e.to_string();
    if text.contains("No such file") || text.contains("not found") {
        Failure::not_found(format!(
            "cannot run {program:?}: no such program; nothing ran"
        ))
        .hint("check the name and PATH")
    } else if text.contains("ermission denied") {
        Failure::other(format!(
            "cannot run {program:?}: permission denied; nothing ran"
        ))
        .hint("check that it is executable by this user")
    } else {
        Failure::other(format!("cannot start {program:?}: {text}; nothing ran"))
    }
}

/// Each fork's sandbox: the host read-only, its workspace the overlay of its changes over the
/// shared base, no network.
/// The sandbox of a fork's working tree: the host read-only, the tree's overlay writable, no
/// network.
pub(crate) fn overlay_sandbox(
    tree: &WorkingTree,
) -> environment_sandbox::Result<Box<dyn Launcher>> {
    let mut spec = IsolationSpec::host(&tree.lower);
    spec.workspace = Some(SandboxWorkspace::Overlay {
        lower: tree.lower.clone(),
        upper: tree.upper.clone(),
        work: tree.work.clone(),
    });
    spec.network = false;
    Ok(Box::new(Sandbox::new(spec)?))
}

/// Refuses a tournament this host cannot run, or one asked with no job; nothing runs.
fn tournament_runs(a: &TournamentArgs) -> Outcome<()> {
    if let Err(why) = namespaces() {
        return Err(Failure::new(
            ExitCode::Unavailable,
            format!(
                "tournament runs each candidate in its own sandbox, and this host cannot make \
                 sandboxes ({why}); nothing ran"
            ),
        )
        .hint("run each candidate on its own branch with `envctl exec`, then `envctl merge` the winner"));
    }
    if a.jobs == 0 {
        return Err(Failure::usage("--jobs must be at least 1").hint("e.g. --jobs 2"));
    }
    Ok(())
}

/// `envctl tournament` through the workspace's door: the service runs the candidates in forks
/// and adopts the winner into the live tree. Exit 0 when a winner was adopted, 1 when none
/// passed.
pub fn tournament(door: &Door, a: &TournamentArgs, json: bool) -> Outcome<i32> {
    let outcome = door.request(TournamentParams {
        candidates: a.candidates.clone(),
        test: a.test.clone(),
        base: a.base.clone(),
        jobs: Some(a.jobs),
        pick_all: a.pick == PickArg::All,
        timeout_ms: None,
    })?;
    Ok(print_tournament(&outcome, a, json))
}

/// `envctl tournament` beside a running supervisor, which holds the tree: the candidates run
/// here, the winner is adopted into a branch of its own, which the supervisor then merges into
/// main and writes into its tree.
pub fn tournament_beside(
    s: &mut Session,
    a: &TournamentArgs,
    json: bool,
    remote: &mut crate::target::Remote,
) -> Outcome<i32> {
    tournament_runs(a)?;
    let base = match &a.base {
        Some(v) => s.env.resolve(v)?,
        None => s.head()?,
    };
    let mut t = Tournament::of_scripts(s.actor.clone(), base, &a.candidates, &a.test);
    t.concurrency = a.jobs;
    t.pick = match a.pick {
        PickArg::First => Pick::FirstToPass,
        PickArg::All => Pick::AllPassers,
    };
    let forks = Forks::open(
        s.env.clone(),
        ForkConfig {
            noise: s.noise_rules(),
            ..ForkConfig::default()
        },
    )?;
    t.target = format!("{}/adopted", t.name);
    s.env.create_branch(&s.actor, &t.target, &base)?;
    let mut report = t.run(&forks, &overlay_sandbox, None)?;
    if report.adopted.is_some() {
        // The adoption is the supervisor's merge, so the tree it keeps follows.
        let request = MergeParams {
            source: t.target.clone(),
        };
        let answer = remote.call(MergeParams::METHOD.name(), json!(request))?;
        let merged: Merged = serde_json::from_value(answer)
            .map_err(|e| Failure::other(format!("the merge's answer does not read: {e}")))?;
        report.adopted = Some(s.env.resolve(&merged.version)?);
    }
    let outcome = tournament::Outcome {
        base: base.to_string(),
        report: Report::from(&report),
    };
    Ok(print_tournament(&outcome, a, json))
}

/// Prints a tournament's outcome; its exit status (0 when a winner was adopted).
fn print_tournament(outcome: &tournament::Outcome, a: &TournamentArgs, json: bool) -> i32 {
    let report = &outcome.report;
    let status = if report.adopted.is_some() { 0 } else { 1 };
    if json {
        print_json(&json!(outcome));
        return status;
    }
    println!("{:<4} {:<6} {:<42} command", "", "test", "branch");
    for (i, c) in report.contestants.iter().enumerate() {
        let mark = if report.winner == Some(i) {
            "winner"
        } else {
            ""
        };
        println!(
            "{:<4} {:<6} {:<42} {}  {mark}",
            c.candidate.name,
            if c.passed { "pass" } else { "fail" },
            c.branch,
            a.candidates.get(i).map(String::as_str).unwrap_or_default(),
        );
    }
    match &report.adopted {
        Some(head) => println!(
            "adopted: main is now {} (written into the workspace)",
            short(head)
        ),
        None => eprintln!("envctl: no candidate passed the test; nothing was adopted"),
    }
    status
}

/// Where in the workspace `dir` envctl was started, when in a subdirectory of it: a command it
/// runs runs there.
pub fn cwd_in(dir: &Path) -> Option<String> {
    let cwd = std::env::current_dir().ok()?;
    let rel = cwd.strip_prefix(dir).ok()?;
    if rel.as_os_str().is_empty() {
        return None;
    }
    rel.to_str().map(str::to_owned)
}
