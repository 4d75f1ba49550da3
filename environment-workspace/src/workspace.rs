//! An open workspace: the environment, the trackers of its trees, the shell, the policy and the
//! queue, shared by every session on it (the supervisor's socket, its agent waiter and its
//! owner among them).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use environment_core::{
    ActorId, Authorizer, BackgroundProcesses, Credentials, Governance, Intent, IntentKind,
    LocalEnvironment, Observation, OpFlags, OpId, PtySessions, Queue, ShellExec,
};

use environment_sandbox::fork::{ForkConfig, WorkingTree};
use environment_sandbox::launch::Launcher;
use environment_sandbox::restore::RestorePlan;
use environment_sandbox::tracker::Tracker;
use environment_sandbox::{Result, SandboxError};

/// What the workspace answered, for a closing summary.
#[derive(Default, Debug)]
pub struct Counters {
    /// Restores and undos done.
    pub rollbacks: AtomicU64,
    /// Use cases called.
    pub requests: AtomicU64,
    /// Requests the policy refused.
    pub denied: AtomicU64,
}

impl Counters {
    /// Counts one more.
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// The shell capabilities the workspace offers (`exec`, `process.*`, `pty.*`); each is optional.
#[derive(Clone, Default)]
pub struct ShellHandles {
    /// Recorded commands (`exec`).
    pub exec: Option<Arc<dyn ShellExec>>,
    /// Background processes (`process.*`).
    pub processes: Option<Arc<dyn BackgroundProcesses>>,
    /// Terminal sessions (`pty.*`).
    pub pty: Option<Arc<dyn PtySessions>>,
}

impl std::fmt::Debug for ShellHandles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShellHandles")
            .field("exec", &self.exec.is_some())
            .field("processes", &self.processes.is_some())
            .field("pty", &self.pty.is_some())
            .finish()
    }
}

/// How a workspace runs tournaments: the configuration of its forks, and the sandbox each
/// fork's working tree runs in.
#[derive(Clone)]
pub struct Forking {
    /// The forks' configuration (the tree's noise rules and key prefix).
    pub config: ForkConfig,
    /// The sandbox of one fork's working tree.
    pub sandbox: Arc<ForkSandbox>,
}

/// Makes the sandbox a fork's working tree runs in.
pub type ForkSandbox = dyn Fn(&WorkingTree) -> Result<Box<dyn Launcher>> + Send + Sync;

/// How a workspace is set up: its environment, the ports behind its use cases, whom its requests
/// act as, and how it captures. Fixed for the workspace's life; the trees it tracks come with it
/// as [`Trees`].
pub struct Setup {
    /// The environment.
    pub env: LocalEnvironment,
    /// Decides every request (and every operation of the environment).
    pub authorizer: Arc<dyn Authorizer>,
    /// The policy behind the `policy.*` and `approval.*` use cases.
    pub policy: Option<Arc<dyn Governance>>,
    /// The queue behind `queue.*`.
    pub bus: Option<Arc<dyn Queue>>,
    /// How commands are confined; `None` for a workspace that runs none (its shell is empty).
    pub launcher: Option<Arc<dyn Launcher>>,
    /// Whom requests act as.
    pub actor: ActorId,
    /// Applied to every request that presents none, so the agent cannot shed its limits by
    /// omitting the token it was given.
    pub default_token: Option<String>,
    /// The branch the workspace is captured to.
    pub branch: String,
    /// Whether every call first captures what changed in the trees (for a workspace whose
    /// trackers do not capture in the background): a call then sees, and never overwrites,
    /// what was done outside it.
    pub capture_each_call: bool,
    /// How tournaments run, when the workspace runs them.
    pub forking: Option<Forking>,
}

/// The trees a workspace tracks and the shell that runs in them: the live parts, which a
/// supervisor may attach after opening (its shell) and takes back when it shuts down.
pub struct Trees {
    /// The tracker of the workspace tree. Shared with the shell, whose commands take their own
    /// captures.
    pub tracker: Arc<Tracker>,
    /// The trackers of the further roots (a managed rootfs), restored with the workspace.
    pub extra: Vec<Arc<Tracker>>,
    /// The shell capabilities offered.
    pub shell: ShellHandles,
}

/// An open workspace, shared by the sessions on it. Its [`Setup`] is read through it
/// (`workspace.env`, `workspace.policy`…).
pub struct Workspace {
    setup: Setup,
    /// `None` once shut down.
    pub tracker: RwLock<Option<Arc<Tracker>>>,
    /// The further roots' trackers (empty once shut down).
    pub extra: RwLock<Vec<Arc<Tracker>>>,
    /// The shell capabilities behind `exec`, `process.*` and `pty.*`, once attached.
    pub shell: RwLock<ShellHandles>,
    /// Receipts handed out, with their group and consumer: settling is authorized on the group
    /// the receipt was claimed from, and done as its claimer.
    pub(crate) receipts: Mutex<Receipts>,
    /// What was answered.
    pub counters: Counters,
    /// The running agent's pid, for `status`.
    pub agent_pid: Mutex<Option<u32>>,
}

impl std::ops::Deref for Workspace {
    type Target = Setup;

    fn deref(&self) -> &Setup {
        &self.setup
    }
}

/// Who calls the workspace: the actor its requests act as, and the capability token presented
/// with every request that presents none (so an agent cannot shed its limits by omitting the
/// token it was given). It is bound once, when a door opens (a connection of the control
/// socket, a service in process), and never named by a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    /// Whom the requests act as.
    pub actor: ActorId,
    /// The token presented with every request that presents none.
    pub default_token: Option<String>,
}

impl Caller {
    /// `actor`, presenting no token by default.
    pub fn new(actor: ActorId) -> Caller {
        Caller {
            actor,
            default_token: None,
        }
    }
}

/// Locks `m`, carrying on after a panic of another holder (the data stays usable).
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Workspace {
    /// Opens a workspace set up as `setup` on the trees it tracks.
    pub fn new(setup: Setup, trees: Trees) -> Workspace {
        Workspace {
            setup,
            tracker: RwLock::new(Some(trees.tracker)),
            extra: RwLock::new(trees.extra),
            shell: RwLock::new(trees.shell),
            receipts: Mutex::new(Receipts::default()),
            counters: Counters::default(),
            agent_pid: Mutex::new(None),
        }
    }
}

impl Workspace {
    /// The workspace's own caller: its actor (the supervised agent's, say) and default token.
    pub fn caller(&self) -> Caller {
        Caller {
            actor: self.actor.clone(),
            default_token: self.default_token.clone(),
        }
    }

    /// Runs `f` on the tracker, unless the workspace has shut down. A read lock is held
    /// meanwhile, so shutdown waits for work in flight.
    pub fn with_tracker<R>(&self, f: impl FnOnce(&Tracker) -> Result<R>) -> Result<R> {
        let guard = self.tracker.read().unwrap_or_else(|p| p.into_inner());
        match guard.as_deref() {
            Some(t) => f(t),
            None => Err(SandboxError::Supervisor(
                "the workspace is shutting down".into(),
            )),
        }
    }

    /// A capture barrier: everything changed up to now, attributed to `text` (the workspace's
    /// capture is returned; the further roots record their own).
    pub fn capture(&self, text: &str) -> Result<Option<Observation>> {
        self.capture_extra(text)?;
        self.with_tracker(|t| {
            t.capture_now(
                Intent::new(IntentKind::Capture, text),
                OpFlags::AUTO_CAPTURE,
            )
        })
    }

    fn capture_extra(&self, text: &str) -> Result<()> {
        for t in self.extra.read().unwrap_or_else(|p| p.into_inner()).iter() {
            t.capture_now(
                Intent::new(IntentKind::Capture, text),
                OpFlags::AUTO_CAPTURE,
            )?;
        }
        Ok(())
    }

    /// What a restore to `target` would write and remove, in every tracked root.
    pub fn plan_restore(&self, target: &OpId) -> Result<RestorePlan> {
        let extra = self.extra.read().unwrap_or_else(|p| p.into_inner());
        let others: Vec<&Tracker> = extra.iter().map(|t| &**t).collect();
        self.with_tracker(|t| t.plan_restore_with(&others, target))
    }

    /// Writes into every tracked tree what changed on the branch since the version it holds,
    /// after the head moved through the environment's API (a merge) or on another machine
    /// (see [`Tracker::sync`]).
    pub fn sync(&self) -> Result<RestorePlan> {
        let mut plan = self.with_tracker(|t| t.sync())?;
        for t in self.extra.read().unwrap_or_else(|p| p.into_inner()).iter() {
            plan.steps.extend(t.sync()?.steps);
        }
        Ok(plan)
    }

    /// Restores every tracked root to `target` as `actor`, presenting `credentials`, in one
    /// rollback operation (see [`Tracker::restore_with`]).
    pub fn restore(
        &self,
        actor: &ActorId,
        credentials: &Credentials,
        target: &OpId,
        intent: Intent,
    ) -> Result<RestorePlan> {
        let extra = self.extra.read().unwrap_or_else(|p| p.into_inner());
        let others: Vec<&Tracker> = extra.iter().map(|t| &**t).collect();
        self.with_tracker(|t| {
            t.presenting(credentials.clone())
                .restore_with(&others, actor, target, intent)
        })
    }
}

impl Workspace {
    /// The attached shell capabilities.
    pub fn shell(&self) -> ShellHandles {
        self.shell.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The receipts a workspace handed out, by receipt, and the size at which the long-lapsed ones
/// are next looked for: twice what was left the last time, so forgetting costs a claim a
/// constant on average however many leases are held.
#[derive(Default)]
pub(crate) struct Receipts {
    pub(crate) claims: HashMap<String, Claimed>,
    pub(crate) forget_at: usize,
}

/// Who claimed a receipt this workspace handed out, and from which group: settling is
/// authorized on the group and done as that consumer.
#[derive(Clone, Debug)]
pub(crate) struct Claimed {
    /// The consumer group.
    pub(crate) group: String,
    /// The consumer named in the claim.
    pub(crate) consumer: String,
    /// Who claimed it: only they settle it.
    pub(crate) claimer: ActorId,
    /// When its lease ran out, ms since the epoch (as first handed out; an extension is not
    /// tracked here). Past it, and a grace period, the entry may be dropped: the bus then
    /// knows the receipt as stale.
    pub(crate) until_ms: i64,
}
