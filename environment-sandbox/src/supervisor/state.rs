//! What the supervisor's request handlers, its agent waiter and its owner share.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use environment_bus::Bus;
use environment_core::{
    ActorId, Authorizer, Intent, IntentKind, LocalEnvironment, Observation, OpFlags,
};
use environment_policy::Policy;

use crate::error::{Result, SandboxError};
use crate::launch::Launcher;
use crate::tracker::Tracker;

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

/// The state behind the control socket.
pub(crate) struct Shared {
    pub env: LocalEnvironment,
    /// `None` once shut down.
    pub tracker: RwLock<Option<Tracker>>,
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
    /// Receipts handed out through the socket, with their consumer group: settling is
    /// authorized on the group the receipt was claimed from, not on what the caller says.
    pub receipts: Mutex<HashMap<String, String>>,
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
        match guard.as_ref() {
            Some(t) => f(t),
            None => Err(SandboxError::Supervisor(
                "the supervisor is shutting down".into(),
            )),
        }
    }

    /// A capture barrier: everything changed up to now, attributed to `text`.
    pub fn capture(&self, text: &str) -> Result<Option<Observation>> {
        self.with_tracker(|t| {
            t.capture_now(
                Intent::new(IntentKind::Capture, text),
                OpFlags::AUTO_CAPTURE,
            )
        })
    }
}
