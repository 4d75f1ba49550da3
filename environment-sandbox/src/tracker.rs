//! The tracker: watcher, debounce, capture and restore of one root, behind one lock.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use environment_core::{
    ActorId, Intent, IntentKind, LocalEnvironment, MAIN, Observation, OpFlags, OpId,
};

use crate::capture::{Capturer, KeyMap};
use crate::error::{Result, SandboxError};
use crate::fsops::Root;
use crate::noise::{Noise, NoiseRules};
use crate::restore::RestorePlan;
use crate::statcache::StatCache;
use crate::watch::Watcher;

/// How a root is tracked.
#[derive(Clone, Debug)]
pub struct TrackerConfig {
    /// The directory tree to track.
    pub root: PathBuf,
    /// Where its paths live in the `fs` namespace (empty: at the top).
    pub key_prefix: Vec<u8>,
    /// The branch captures are committed to.
    pub branch: String,
    /// Who captures are attributed to.
    pub actor: ActorId,
    /// What is ignored and what is quiet.
    pub noise: NoiseRules,
    /// A capture waits until no change has come for this long…
    pub quiet_period: Duration,
    /// …but never longer than this after the first change, however busy the tree.
    pub max_wait: Duration,
    /// Capture automatically in a background thread (otherwise only on [`Tracker::capture_now`]).
    pub auto: bool,
}

impl TrackerConfig {
    /// Defaults for tracking `root` on `main`, captures attributed to `actor`.
    pub fn new(root: impl Into<PathBuf>, actor: ActorId) -> TrackerConfig {
        TrackerConfig {
            root: root.into(),
            key_prefix: Vec::new(),
            branch: MAIN.to_owned(),
            actor,
            noise: NoiseRules::default(),
            quiet_period: Duration::from_millis(200),
            max_wait: Duration::from_secs(2),
            auto: true,
        }
    }
}

struct State {
    capturer: Capturer,
    watcher: Watcher,
    dirty: BTreeSet<Vec<u8>>,
    first_change: Option<Instant>,
    last_change: Instant,
    captures: u64,
}

struct Shared {
    state: Mutex<State>,
    stop: Mutex<bool>,
    stopped: Condvar,
    config: TrackerConfig,
}

/// Tracks a live directory tree: every change is captured into the environment without the
/// cooperation of whoever makes it, and any version can be restored in place.
pub struct Tracker {
    shared: Arc<Shared>,
    thread: Option<thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Tracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracker")
            .field("root", &self.shared.config.root)
            .finish_non_exhaustive()
    }
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Tracker {
    /// Starts tracking: watches every directory, then captures whatever changed since the last
    /// capture recorded in the stat cache (everything, the first time).
    pub fn open(env: LocalEnvironment, config: TrackerConfig) -> Result<Tracker> {
        let root_path = config
            .root
            .canonicalize()
            .map_err(SandboxError::io("open root", &config.root))?;
        let root = Root::open(&root_path).map_err(SandboxError::io("open root", &root_path))?;
        let noise = Noise::new(&root_path, &config.noise)?;
        let scope = format!("{}\u{0}{}", root_path.display(), config.branch);
        let cache = StatCache::open(&env.home().join("sandbox.db"), &scope)?;
        if let Some(target) = cache.interrupted_restore()? {
            tracing::warn!(%target, "a restore was interrupted; run it again to complete it");
        }
        let watcher = Watcher::new(&root_path, noise.clone())
            .map_err(|e| SandboxError::Watch(e.to_string()))?;
        let capturer = Capturer {
            env,
            root,
            noise,
            cache,
            keys: KeyMap::new(&config.key_prefix),
            actor: config.actor.clone(),
            branch: config.branch.clone(),
        };
        let mut state = State {
            capturer,
            watcher,
            dirty: BTreeSet::new(),
            first_change: None,
            last_change: Instant::now(),
            captures: 0,
        };
        let dirty = state.capturer.rescan_dirty()?;
        state.capturer.capture(
            dirty,
            Intent::new(IntentKind::Capture, "initial capture"),
            OpFlags::AUTO_CAPTURE,
        )?;
        let shared = Arc::new(Shared {
            state: Mutex::new(state),
            stop: Mutex::new(false),
            stopped: Condvar::new(),
            config,
        });
        let thread = if shared.config.auto {
            let s = shared.clone();
            Some(
                thread::Builder::new()
                    .name("environment-capture".into())
                    .spawn(move || auto_capture(&s))
                    .map_err(|e| SandboxError::Watch(e.to_string()))?,
            )
        } else {
            None
        };
        Ok(Tracker { shared, thread })
    }

    /// A restore that was interrupted (its target), if any.
    pub fn interrupted_restore(&self) -> Result<Option<String>> {
        lock(&self.shared.state)
            .capturer
            .cache
            .interrupted_restore()
    }

    /// The capture barrier: captures everything changed up to now, attributed to `intent`
    /// (e.g. the command that just ended). `None` if nothing changed.
    pub fn capture_now(&self, intent: Intent, flags: OpFlags) -> Result<Option<Observation>> {
        let mut st = lock(&self.shared.state);
        capture_locked(&mut st, intent, flags)
    }

    /// Forces the next capture to be a full rescan against the stat cache, as after a queue
    /// overflow.
    pub fn rescan_now(&self) -> Result<Option<Observation>> {
        let mut st = lock(&self.shared.state);
        st.watcher.needs_rescan = true;
        capture_locked(
            &mut st,
            Intent::new(IntentKind::Capture, "rescan"),
            OpFlags::AUTO_CAPTURE,
        )
    }

    /// What a restore to `target` would change, without changing the tree. Uncaptured changes
    /// are captured first, so the plan is exact.
    pub fn plan_restore(&self, target: &OpId) -> Result<RestorePlan> {
        let mut st = lock(&self.shared.state);
        capture_locked(
            &mut st,
            Intent::new(IntentKind::Capture, "capture before a restore plan"),
            OpFlags::AUTO_CAPTURE,
        )?;
        Ok(st.capturer.plan(target)?.0)
    }

    /// Restores the live tree to `target`: a safety capture of anything not yet captured, then
    /// only what differs is written or removed, then a rollback operation is recorded. Processes
    /// working in the tree keep running; a file descriptor they already hold keeps the old inode
    /// (a replaced file is a new file at the same path).
    pub fn restore(&self, actor: &ActorId, target: &OpId, intent: Intent) -> Result<RestorePlan> {
        let mut st = lock(&self.shared.state);
        capture_locked(
            &mut st,
            Intent::new(IntentKind::Capture, "safety capture before a restore"),
            OpFlags::AUTO_CAPTURE,
        )?;
        let (plan, changes) = st.capturer.plan(target)?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        st.capturer.cache.begin_restore(&target.to_string(), now)?;
        let cache = st.capturer.apply(&changes)?;
        let branch = st.capturer.branch.clone();
        st.capturer.env.restore(actor, &branch, target, intent)?;
        st.capturer.cache.update(cache)?;
        st.capturer.cache.end_restore()?;
        // The restore's own events: what they name now equals the head, so they commit nothing.
        let State { watcher, dirty, .. } = &mut *st;
        watcher.drain(dirty);
        let pending = std::mem::take(&mut st.dirty);
        st.first_change = None;
        st.capturer.capture(
            pending,
            Intent::new(IntentKind::Capture, "automatic capture"),
            OpFlags::AUTO_CAPTURE,
        )?;
        Ok(plan)
    }

    /// How many captures the background thread made.
    pub fn captures(&self) -> u64 {
        lock(&self.shared.state).captures
    }

    /// Stops tracking after a final capture.
    pub fn close(mut self) -> Result<Option<Observation>> {
        self.stop_thread();
        self.capture_now(
            Intent::new(IntentKind::Capture, "final capture"),
            OpFlags::AUTO_CAPTURE,
        )
    }

    fn stop_thread(&mut self) {
        if let Ok(mut s) = self.shared.stop.lock() {
            *s = true;
        }
        self.shared.stopped.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

fn capture_locked(st: &mut State, intent: Intent, flags: OpFlags) -> Result<Option<Observation>> {
    let State { watcher, dirty, .. } = st;
    watcher.drain(dirty);
    if st.watcher.needs_rescan {
        st.watcher.needs_rescan = false;
        let rescanned = st.capturer.rescan_dirty()?;
        st.dirty.extend(rescanned);
        tracing::info!(paths = st.dirty.len(), "rescanned against the stat cache");
    }
    let pending = std::mem::take(&mut st.dirty);
    st.first_change = None;
    if pending.is_empty() {
        return Ok(None);
    }
    let obs = st.capturer.capture(pending, intent, flags)?;
    if obs.is_some() {
        st.captures += 1;
    }
    Ok(obs)
}

/// The background loop: wait for events, debounce (quiet period, bounded by the maximum wait),
/// capture.
fn auto_capture(shared: &Shared) {
    let cfg = &shared.config;
    loop {
        if shared.stop.lock().map(|s| *s).unwrap_or(true) {
            return;
        }
        let timeout = {
            let st = lock(&shared.state);
            match st.first_change {
                None => cfg.quiet_period,
                Some(first) => {
                    let quiet_left = cfg.quiet_period.saturating_sub(st.last_change.elapsed());
                    let max_left = cfg.max_wait.saturating_sub(first.elapsed());
                    quiet_left.min(max_left)
                }
            }
        };
        // Wait for the inotify descriptor to become readable, or for the debounce to run out.
        let fd = {
            let st = lock(&shared.state);
            rustix::io::dup(st.watcher.as_fd()).ok()
        };
        if let Some(fd) = fd {
            let mut fds = [rustix::event::PollFd::new(
                &fd,
                rustix::event::PollFlags::IN,
            )];
            let ts = rustix::event::Timespec {
                tv_sec: timeout.as_secs() as _,
                tv_nsec: timeout.subsec_nanos() as _,
            };
            let _ = rustix::event::poll(&mut fds, Some(&ts));
        } else {
            thread::sleep(timeout);
        }
        let mut st = lock(&shared.state);
        let State { watcher, dirty, .. } = &mut *st;
        if watcher.drain(dirty) > 0 {
            let now = Instant::now();
            st.last_change = now;
            if !st.dirty.is_empty() {
                st.first_change.get_or_insert(now);
            }
        }
        let due = st.watcher.needs_rescan
            || st.first_change.is_some_and(|first| {
                st.last_change.elapsed() >= cfg.quiet_period || first.elapsed() >= cfg.max_wait
            });
        if due
            && let Err(e) = capture_locked(
                &mut st,
                Intent::new(IntentKind::Capture, "automatic capture"),
                OpFlags::AUTO_CAPTURE,
            )
        {
            tracing::warn!(error = %e, "automatic capture failed; will retry");
        }
    }
}
