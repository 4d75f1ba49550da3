//! What the supervisor's request handlers, its agent waiter and its owner share.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use environment_bus::Bus;
use environment_core::{
    ActorId, Authorizer, BackgroundProcesses, Intent, IntentKind, LocalEnvironment, Observation,
    OpFlags, OpId, PtySessions, ShellExec,
};
use environment_policy::Policy;

use environment_sandbox::error::{Result, SandboxError};
use environment_sandbox::launch::Launcher;
use environment_sandbox::restore::RestorePlan;
use environment_sandbox::tracker::Tracker;

/// Counters for the closing summary.
#[derive(Default)]
pub(crate) struct Counters {
    pub rollbacks: AtomicU64,
    pub requests: AtomicU64,
    pub denied: AtomicU64,
}

impl Counters {
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// The shell capabilities the supervisor exposes on its socket; each is optional.
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

/// The state behind the control socket.
pub(crate) struct Shared {
    pub env: LocalEnvironment,
    /// `None` once shut down. Shared with the shell, whose commands take their own captures.
    pub tracker: RwLock<Option<Arc<Tracker>>>,
    /// The trackers of the further roots (empty once shut down).
    pub extra: RwLock<Vec<Arc<Tracker>>>,
    /// The shell capabilities behind `exec`, `process.*` and `pty.*`, once attached.
    pub shell: RwLock<ShellHandles>,
    pub authorizer: Arc<dyn Authorizer>,
    pub policy: Option<Arc<Policy>>,
    pub bus: Option<Bus>,
    pub launcher: Arc<dyn Launcher>,
    /// Whom requests on the socket act as.
    pub actor: ActorId,
    /// Applied to every request that presents none, so the agent cannot shed its limits by
    /// omitting the token it was given.
    pub default_token: Option<String>,
    pub branch: String,
    /// Receipts handed out through the socket, with their group and consumer: settling is
    /// authorized on the group the receipt was claimed from, and done as its claimer.
    pub receipts: Mutex<HashMap<String, Claimed>>,
    pub counters: Counters,
    /// The running agent's pid, for `status`.
    pub agent_pid: Mutex<Option<u32>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Runs `f` on the tracker, unless the supervisor has shut down. A read lock is held
    /// meanwhile, so shutdown waits for work in flight.
    pub fn with_tracker<R>(&self, f: impl FnOnce(&Tracker) -> Result<R>) -> Result<R> {
        let guard = self.tracker.read().unwrap_or_else(|p| p.into_inner());
        match guard.as_deref() {
            Some(t) => f(t),
            None => Err(SandboxError::Supervisor(
                "the supervisor is shutting down".into(),
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

    /// Writes into every tracked tree what changed on the branch since `from`, after the head
    /// moved through the environment's API (a merge).
    pub fn sync_from(&self, from: &OpId) -> Result<RestorePlan> {
        let mut plan = self.with_tracker(|t| t.sync_from(from))?;
        for t in self.extra.read().unwrap_or_else(|p| p.into_inner()).iter() {
            plan.steps.extend(t.sync_from(from)?.steps);
        }
        Ok(plan)
    }

    /// Restores every tracked root to `target` as `actor`, in one rollback operation (see
    /// [`Tracker::restore_with`]).
    pub fn restore(&self, actor: &ActorId, target: &OpId, intent: Intent) -> Result<RestorePlan> {
        let extra = self.extra.read().unwrap_or_else(|p| p.into_inner());
        let others: Vec<&Tracker> = extra.iter().map(|t| &**t).collect();
        self.with_tracker(|t| t.restore_with(&others, actor, target, intent))
    }
}

impl Shared {
    /// The attached shell capabilities.
    pub fn shell(&self) -> ShellHandles {
        self.shell.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Who claimed a receipt this supervisor handed out, and from which group: settling is
/// authorized on the group and done as that consumer.
#[derive(Clone, Debug)]
pub(crate) struct Claimed {
    /// The consumer group.
    pub(crate) group: String,
    /// The consumer named in the claim.
    pub(crate) consumer: String,
}
