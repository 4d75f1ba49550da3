//! The Shell: commands, background processes and terminal sessions run in the sandbox on an
//! agent's behalf, each authorized, each confined by the [`Launcher`], and — for a recorded
//! command — captured as one operation.
//!
//! [`Shell`] implements the core traits [`environment_core::ShellExec`],
//! [`environment_core::BackgroundProcesses`] and [`environment_core::PtySessions`].
//!
//! **Authorization.** Starting anything is an `execute` action on
//! [`Resource::Program`] (the program and its arguments) by the requesting actor, asked of the
//! environment's authorizer; each secret the command asks for is a `read` action on
//! [`Resource::Secret`]. A refusal means nothing started and nothing was recorded.
//!
//! **What a recorded command stores.** At its end, one operation attributed to the requester,
//! with the request's intent (or the command line) as a `command` intent, flags `COMMAND` (plus
//! `FAILED` unless it exited with 0), holding every workspace change since it started and three
//! objects describing the run: `obj:exec/stdout` and `obj:exec/stderr` (kind artifact, the bytes
//! kept in the blob store, attributes `total`, `stored`, `truncated`), and `obj:exec/status`
//! (kind test result, JSON: command line, working directory, exit, duration, start time). The
//! keys are the same for every command: read them at the command's version to get its output;
//! the status changes with every run, so every command records an operation, even `true`.
//!
//! **Concurrency.** While a recorded command runs, automatic captures are held off
//! ([`Tracker::hold`]); changes made before it started are captured first, so they are not
//! attributed to it. Everything changed in the workspace while it runs is attributed to it —
//! including changes by others at the same time; of two commands running at once, the first
//! to end takes what both changed so far.
//!
//! **Background processes and terminal sessions** are not recorded operations: they run for
//! as long as they like, and the files they change are captured by the tracker's automatic
//! captures. Their output is kept outside the workspace (the shell's run directory under the
//! environment's home), never captured and never rolled back.
//!
//! **Secrets** are resolved when the command starts, passed only in its environment, and
//! replaced by `[redacted:NAME]` in everything stored (outputs, logs, terminal buffers). A secret
//! the command writes into a workspace file is not redacted there: files are captured as they
//! are.

mod background;
pub(crate) mod exec;
mod pty;
pub mod redact;

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use environment_core::{
    AccessRequest, Action, ActorId, AttrValue, Capabilities, Capability, CommandSpec, Context,
    EnvError, Key, LocalEnvironment, ProcessId, Resource, SecretProvider, SecretValue, SessionId,
};

use crate::error::{Result, SandboxError};
use crate::launch::Launcher;
use crate::tracker::Tracker;

pub use redact::Redactor;

/// Runs commands for agents in the sandbox. Cheap to clone: clones share the processes and
/// sessions, which belong to the shell — not to whoever started them — and end when the last
/// clone is dropped.
///
/// ```
/// use std::sync::Arc;
/// use environment_core::{ActorId, ExecRequest, LocalEnvironment, OpFlags, Options, ShellExec};
/// use environment_sandbox::{Shell, Tracker, TrackerConfig, Unconfined};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let work = tempfile::tempdir()?;
/// let home = tempfile::tempdir()?;
/// let env = LocalEnvironment::open(home.path(), Options::default())?;
/// let config = TrackerConfig::new(work.path(), ActorId::new("service:watcher")?);
/// let tracker = Arc::new(Tracker::open(env.clone(), config)?);
/// let shell = Shell::new(Arc::new(Unconfined::new(work.path())), tracker, None)?;
///
/// let agent = ActorId::new("agent:coder")?;
/// let request = ExecRequest::new(agent, ["sh", "-c", "echo hi > a.txt; echo hi > b.txt"])
///     .intent("write the greetings");
/// let outcome = tokio::runtime::Runtime::new()?.block_on(shell.exec(request))?;
/// assert!(outcome.exit.success());
/// assert_eq!(outcome.files_changed, 2);
/// let op = env.op(&outcome.op)?;
/// assert_eq!(op.intent.text, "write the greetings");
/// assert!(op.flags.contains(OpFlags::COMMAND));
/// assert_eq!(env.blobs().get(&outcome.stdout.blob)?, b"");
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Shell {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Shell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shell")
            .field("workspace", &self.inner.workspace)
            .field("launcher", &self.inner.launcher.describe())
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    launcher: Arc<dyn Launcher>,
    tracker: Arc<Tracker>,
    env: LocalEnvironment,
    workspace: PathBuf,
    secrets: Option<Arc<dyn SecretProvider>>,
    run_dir: PathBuf,
    next_id: AtomicU64,
    processes: Mutex<BTreeMap<ProcessId, Arc<background::Process>>>,
    sessions: Mutex<BTreeMap<SessionId, Arc<pty::Session>>>,
}

/// A command checked, authorized and with its secrets resolved, ready to start.
pub(crate) struct Prepared {
    spec: CommandSpec,
    cwd: PathBuf,
    secrets: Vec<(String, SecretValue)>,
}

impl Prepared {
    fn redactor(&self) -> Redactor {
        Redactor::new(self.secrets.iter().map(|(n, v)| (n.as_str(), v)))
    }
}

/// A poisoned lock only means another thread panicked; the tables stay usable.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A sandbox error as the core traits report it: the environment's own errors as they are,
/// anything else as a command that could not run.
fn to_env(program: &str, e: SandboxError) -> EnvError {
    match e {
        SandboxError::Env(e) => e,
        other => EnvError::Exec {
            program: program.to_owned(),
            detail: other.to_string(),
        },
    }
}

fn exec_error(program: &str, detail: impl std::fmt::Display) -> EnvError {
    EnvError::Exec {
        program: program.to_owned(),
        detail: detail.to_string(),
    }
}

impl Shell {
    /// A shell running commands through `launcher` in the workspace that `tracker` captures,
    /// recording into the tracker's environment and branch. `secrets` resolves the secret
    /// references commands ask for (without one, asking for a secret is an error).
    pub fn new(
        launcher: Arc<dyn Launcher>,
        tracker: Arc<Tracker>,
        secrets: Option<Arc<dyn SecretProvider>>,
    ) -> Result<Shell> {
        static INSTANCE: AtomicU64 = AtomicU64::new(0);
        let env = tracker.environment();
        let workspace = tracker.root().to_path_buf();
        // Background logs live outside the workspace (never captured, never rolled back).
        let run_dir = env.home().join("run").join(format!(
            "shell-{}-{}",
            std::process::id(),
            INSTANCE.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&run_dir).map_err(SandboxError::io("create", &run_dir))?;
        Ok(Shell {
            inner: Arc::new(Inner {
                launcher,
                tracker,
                env,
                workspace,
                secrets,
                run_dir,
                next_id: AtomicU64::new(1),
                processes: Mutex::new(BTreeMap::new()),
                sessions: Mutex::new(BTreeMap::new()),
            }),
        })
    }

    /// What the shell offers: recorded exec, background processes and terminal sessions.
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            offered: vec![
                Capability::ShellExec,
                Capability::BackgroundProcesses,
                Capability::Pty,
            ],
        }
    }

    /// The environment commands are recorded in.
    pub fn environment(&self) -> &LocalEnvironment {
        &self.inner.env
    }

    /// The directory holding background processes' output logs.
    pub fn run_dir(&self) -> &Path {
        &self.inner.run_dir
    }
}

impl Inner {
    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Checks the command, asks the authorizer, resolves the secrets. Nothing starts here.
    async fn prepare(&self, spec: &CommandSpec, operation: &str) -> Result<Prepared, EnvError> {
        let program = spec
            .argv
            .first()
            .ok_or_else(|| exec_error("", "the command line is empty"))?;
        if spec.argv.iter().any(|a| a.contains('\0')) {
            return Err(exec_error(program, "an argument contains a NUL byte"));
        }
        let cwd = self.working_dir(program, spec.cwd.as_deref())?;
        let mut context = Context {
            branch: Some(self.tracker.branch().to_owned()),
            ..Context::default()
        };
        context
            .attrs
            .insert("operation".into(), AttrValue::Str(operation.into()));
        self.env.check_access(&AccessRequest {
            actor: spec.actor.clone(),
            action: Action::Execute,
            resource: Resource::Program {
                program: program.clone(),
                args: spec.argv[1..].to_vec(),
            },
            context: context.clone(),
        })?;
        if operation == "exec" {
            // The command's record is written as this actor: refused now rather than after the
            // command ran.
            for key in exec::OUTPUT_KEYS {
                self.env.check_access(&AccessRequest {
                    actor: spec.actor.clone(),
                    action: Action::Write,
                    resource: Resource::Key(Key::obj(key)?),
                    context: context.clone(),
                })?;
            }
        }
        for secret in spec.secrets.values() {
            self.env.check_access(&AccessRequest {
                actor: spec.actor.clone(),
                action: Action::Read,
                resource: Resource::Secret(secret.name.clone()),
                context: context.clone(),
            })?;
        }
        let mut secrets = Vec::with_capacity(spec.secrets.len());
        for (var, secret) in &spec.secrets {
            let provider = self
                .secrets
                .as_ref()
                .ok_or_else(|| EnvError::SecretUnavailable {
                    name: secret.name.clone(),
                    detail: "no secret provider is configured".into(),
                })?;
            secrets.push((var.clone(), provider.resolve(secret).await?));
        }
        Ok(Prepared {
            spec: spec.clone(),
            cwd,
            secrets,
        })
    }

    /// The working directory on the host: relative to the workspace, inside it after symlinks.
    fn working_dir(&self, program: &str, cwd: Option<&str>) -> Result<PathBuf, EnvError> {
        let Some(rel) = cwd.filter(|c| !c.is_empty()) else {
            return Ok(self.workspace.clone());
        };
        let rel = Path::new(rel);
        if !rel
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        {
            return Err(exec_error(
                program,
                format!(
                    "working directory {} must be relative to the workspace, without `..`",
                    rel.display()
                ),
            ));
        }
        let dir = self.workspace.join(rel);
        let real = dir.canonicalize().map_err(|e| {
            exec_error(program, format!("working directory {}: {e}", rel.display()))
        })?;
        if !real.starts_with(&self.workspace) || !real.is_dir() {
            return Err(exec_error(
                program,
                format!(
                    "working directory {} is not a directory inside the workspace",
                    rel.display()
                ),
            ));
        }
        Ok(real)
    }

    /// The confined command, environment and secrets set; stdio is the caller's to set.
    fn command(&self, p: &Prepared) -> Result<Command, EnvError> {
        self.command_with(p, |_| {})
    }

    /// Like [`Inner::command`], with `before` applied before the launcher confines it (its
    /// `pre_exec` hooks then run before the launcher's).
    fn command_with(
        &self,
        p: &Prepared,
        before: impl FnOnce(&mut Command),
    ) -> Result<Command, EnvError> {
        let program = &p.spec.argv[0];
        let mut cmd = Command::new(program);
        cmd.args(&p.spec.argv[1..]).current_dir(&p.cwd);
        before(&mut cmd);
        self.launcher
            .confine(&mut cmd)
            .map_err(|e| to_env(program, e))?;
        // Set after confinement: what the request asks for explicitly is not filtered away.
        cmd.envs(&p.spec.env);
        for (var, value) in &p.secrets {
            cmd.env(var, value.expose());
        }
        Ok(cmd)
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The processes and sessions belong to the shell: they end with it.
        for p in lock(&self.processes).values() {
            p.kill();
        }
        for s in lock(&self.sessions).values() {
            s.kill();
        }
    }
}

/// Runs blocking work on the blocking pool.
async fn blocking<R: Send + 'static>(
    f: impl FnOnce() -> Result<R, EnvError> + Send + 'static,
) -> Result<R, EnvError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| EnvError::Exec {
            program: String::new(),
            detail: format!("the worker running the command failed: {e}"),
        })?
}

#[async_trait]
impl environment_core::ShellExec for Shell {
    async fn exec(
        &self,
        request: environment_core::ExecRequest,
    ) -> Result<environment_core::ExecOutcome, EnvError> {
        let prepared = self.inner.prepare(&request.command, "exec").await?;
        let inner = self.inner.clone();
        blocking(move || exec::run_recorded(&inner, prepared, request)).await
    }
}

/// The actor id of a request, for a process table.
fn actor_of(p: &Prepared) -> ActorId {
    p.spec.actor.clone()
}
