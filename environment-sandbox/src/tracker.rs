//! The tracker: watcher, debounce, capture and restore of one root.
//!
//! Three locks, always taken in this order and never held across each other's work: the watcher
//! (held only to read the kernel queue), the pending dirty set (held for a moment), and the
//! capturer (held for a capture or a restore). A dedicated thread keeps reading the kernel queue
//! while a capture runs, so a burst of writes does not overflow it; another debounces and
//! captures.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use environment_core::{
    ActRequest, ActorId, Change, Credentials, EntryKind, Intent, IntentKind, Key, LocalEnvironment,
    MAIN, Observation, OpFlags, OpId, Value,
};

use crate::capture::{Captured, Capturer, KeyMap};
use crate::error::{Result, SandboxError};
use crate::feed::Feed;
use crate::fsops::Root;
use crate::monitor::MonitorClient;
use crate::noise::{Noise, NoiseRules};
use crate::restore::RestorePlan;
use crate::statcache::{RestoreIntent, StatCache, StatEntry};
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
    /// Read the kernel queue and capture in background threads. Without them (manual mode)
    /// nothing reads the queue between [`Tracker::capture_now`] barriers: a burst of more events
    /// than the kernel queues (`max_queued_events`) then falls back to a rescan.
    pub auto: bool,
    /// A workspace monitor's socket ([`crate::monitor`]): the tracker learns what changed
    /// since the last capture from it instead of rescanning the tree, and, in manual mode,
    /// asks it at every barrier instead of watching itself. Its dirty set outlives this
    /// process, so a later tracker on the same root starts where this one stopped. One that
    /// cannot be reached is [`SandboxError::Monitor`] in manual mode; in background mode the
    /// tracker rescans instead.
    pub monitor: Option<PathBuf>,
    /// A path that cannot be read stays pending and is retried; one that has stayed unreadable
    /// this long (no chmod, no write since, by its ctime) is recorded without its content
    /// instead, with the [`UNREADABLE`](crate::capture::UNREADABLE) marker and a warning in the
    /// operation's intent. Long enough for dpkg's mode-0 window (milliseconds), short enough
    /// that a file another user keeps closed never holds a change back.
    pub unreadable_after: Duration,
    /// Rescan the whole tree at open when nothing vouches for the changes since the last
    /// capture (no monitor, or one without a baseline). Off for read-only work: the tracker
    /// then captures only what a monitor knows, and later barriers rescan.
    pub rescan_on_open: bool,
    /// In the background, how often the tracker looks whether the branch moved past the
    /// version its tree holds (another machine's working copy committed) and writes those
    /// changes in, as [`Tracker::sync`] does; `None`: only when it captures. Never while a
    /// recorded command holds automatic captures back.
    pub follow_every: Option<Duration>,
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
            monitor: None,
            rescan_on_open: true,
            unreadable_after: Duration::from_secs(10),
            follow_every: Some(Duration::from_secs(2)),
        }
    }
}

/// Changes seen and not yet captured.
#[derive(Default)]
struct Pending {
    dirty: BTreeSet<Vec<u8>>,
    first_change: Option<Instant>,
    last_change: Option<Instant>,
}

struct Shared {
    watcher: Mutex<Feed>,
    pending: Mutex<Pending>,
    capturer: Mutex<Capturer>,
    stop: AtomicBool,
    captures: AtomicU64,
    /// Commands running whose changes their own end-capture takes: automatic captures wait.
    holds: AtomicU64,
    /// The paths the last captures could not read, and why: pending until they can be.
    unreadable: Mutex<BTreeMap<Vec<u8>, String>>,
    /// The paths no capture can record (longer than the key limit), and why.
    refused: Mutex<BTreeMap<Vec<u8>, String>>,
    /// The paths recorded without their content (unreadable past the bound), and why.
    without_content: Mutex<BTreeMap<Vec<u8>, String>>,
    /// The keys of changes the actor may not make, put back and kept as refused, and why.
    disallowed: Mutex<BTreeMap<Vec<u8>, String>>,
    /// What is running while the tree changes (an agent's command), named in the intent of
    /// automatic captures.
    context: Mutex<Option<String>>,
    /// The monitor that gave a background tracker its opening set: told at the last capture
    /// that everything it saw since is recorded.
    handoff: Mutex<Option<Feed>>,
    config: TrackerConfig,
}

/// After a capture of `batch`: what it could not read goes back into the pending set (a change
/// is never dropped), and the sets of unreadable and refused paths are brought up to date.
fn settle(shared: &Shared, batch: &BTreeSet<Vec<u8>>, captured: &Captured) {
    let unreadable = &captured.unreadable;
    for (set, found) in [
        (&shared.unreadable, unreadable),
        (&shared.refused, &captured.refused),
        (&shared.without_content, &captured.without_content),
    ] {
        let mut u = lock(set);
        u.retain(|p, _| !batch.contains(p));
        for (p, why) in found {
            u.insert(p.clone(), why.clone());
        }
    }
    if !unreadable.is_empty() {
        tracing::warn!(
            paths = unreadable.len(),
            "paths that cannot be read now stay pending and are captured once they can be"
        );
    }
    if !captured.refused.is_empty() {
        tracing::warn!(
            paths = captured.refused.len(),
            "paths longer than the key limit are never recorded"
        );
    }
    if !captured.disallowed.is_empty() {
        let mut d = lock(&shared.disallowed);
        for r in &captured.disallowed {
            d.insert(r.key.path().to_vec(), r.decision.explanation.clone());
        }
        tracing::info!(
            changes = captured.disallowed.len(),
            "changes the actor may not make were put back and kept as refused"
        );
    }
    keep_pending(shared, unreadable.iter().map(|(p, _)| p.clone()));
}

/// The paths of a set kept by the tracker, with why each is there.
fn listed(set: &Mutex<BTreeMap<Vec<u8>, String>>) -> Vec<(PathBuf, String)> {
    lock(set)
        .iter()
        .map(|(p, why)| (PathBuf::from(std::ffi::OsStr::from_bytes(p)), why.clone()))
        .collect()
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The stat cache's scope of a tracked root (canonical) on a branch.
fn scope(root: &std::path::Path, branch: &str) -> String {
    format!("{}\u{0}{}", root.display(), branch)
}

/// Finishes a restore (or a sync of the head into the tree) that a crash interrupted, from its
/// intent record, so that the half-written tree never becomes the head: the writes are
/// repeated (each is idempotent) and a restore's rollback operation recorded if it was not.
/// One that can no longer be finished (its actor is refused now, say) is given up: the tree is
/// then captured as it is, and the returned sentence says why (for the capture's intent).
fn finish_interrupted(capturer: &mut Capturer) -> Result<Option<String>> {
    let Some(record) = capturer.cache.interrupted_restore()? else {
        return Ok(None);
    };
    let note = finish(capturer, &record).err().map(|e| {
        tracing::warn!(target = %record.target, error = %e, "an interrupted restore cannot be finished");
        format!(
            "an interrupted restore to {} could not be finished: {e}",
            record.target
        )
    });
    capturer.cache.end_restore()?;
    Ok(note)
}

fn finish(capturer: &mut Capturer, record: &RestoreIntent) -> Result<()> {
    // A record this code cannot read names nothing to finish.
    let parse = |v: &str| v.parse::<OpId>().ok();
    let Some(target) = parse(&record.target) else {
        return Ok(());
    };
    match (&record.actor, &record.from) {
        (Some(actor), _) => {
            // Not recorded yet if the head still differs from the target.
            let head = capturer.head()?;
            let (_, changes) = capturer.plan_between(head, &target)?;
            if changes.is_empty() {
                return capturer.cache.set_holds(&head.to_string());
            }
            let Ok(actor) = ActorId::new(actor.as_str()) else {
                return Ok(());
            };
            let intent = Intent::new(
                IntentKind::Restore,
                format!(
                    "{} (finished after an interruption)",
                    record.intent.as_deref().unwrap_or("restore")
                ),
            );
            let (env, branch) = (capturer.env.clone(), capturer.branch.clone());
            let mut written = Vec::new();
            let rollback =
                env.restore_applying(&actor, &branch, &target, intent, || -> Result<()> {
                    written = capturer.apply(&changes)?.cache;
                    Ok(())
                })?;
            capturer.cache.update(written)?;
            capturer.cache.set_holds(&rollback.to_string())
        }
        (None, Some(from)) => {
            let Some(from) = parse(from) else {
                return Ok(());
            };
            // A sync: the tree holds the target once it is written. What changed on disk since,
            // other than by the sync itself, is left for the next capture, from the version it
            // was made on.
            let (_, changes) = capturer.plan_between(from, &target)?;
            let untouched = capturer.resumable(&changes)?;
            let applied = capturer.apply_theirs(&untouched)?;
            capturer.cache.update(applied.cache)?;
            if untouched.len() == changes.len() {
                capturer.cache.set_holds(&target.to_string())?;
            }
            Ok(())
        }
        (None, None) => Ok(()),
    }
}

/// After a committed capture: tells the feed that everything drained so far is recorded, but for
/// what is still pending (a monitor then forgets the rest).
fn acknowledge(shared: &Shared) {
    let mut feed = lock(&shared.watcher);
    let pending = lock(&shared.pending);
    feed.acknowledge(&pending.dirty);
}

/// Puts paths back into the pending set, due after the quiet period.
fn keep_pending(shared: &Shared, paths: impl IntoIterator<Item = Vec<u8>>) {
    let mut p = lock(&shared.pending);
    let before = p.dirty.len();
    p.dirty.extend(paths);
    if p.dirty.len() > before {
        let now = Instant::now();
        p.first_change.get_or_insert(now);
        p.last_change = Some(now);
    }
}

/// Tracks a live directory tree: every change is captured into the environment without the
/// cooperation of whoever makes it, and any version can be restored in place.
pub struct Tracker {
    shared: Arc<Shared>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Tracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracker")
            .field("root", &self.shared.config.root)
            .finish_non_exhaustive()
    }
}

/// A poisoned lock only means another thread panicked mid-way; the data stays usable (the
/// stores are transactional), so the lock is taken back.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn intent(text: &str) -> Intent {
    Intent::new(IntentKind::Capture, text)
}

/// The intent of an automatic capture: what was running, when the tracker was told.
fn automatic(shared: &Shared) -> Intent {
    match &*lock(&shared.context) {
        Some(what) => intent(&format!("automatic capture while {what} ran")),
        None => intent("automatic capture"),
    }
}

impl Tracker {
    /// Starts tracking: watches every directory, then captures whatever changed since the last
    /// capture recorded in the stat cache (everything, the first time).
    pub fn open(env: LocalEnvironment, mut config: TrackerConfig) -> Result<Tracker> {
        let root_path = config
            .root
            .canonicalize()
            .map_err(SandboxError::io("open root", &config.root))?;
        let root = Root::open(&root_path).map_err(SandboxError::io("open root", &root_path))?;
        let noise = Noise::new(&root_path, &config.noise)?;
        let cache = StatCache::open(
            &env.home().join("sandbox.db"),
            &scope(&root_path, &config.branch),
        )?;
        // Watch first, then look: a change in between is seen by one or the other. A monitor
        // was watching already; this process watches itself only if it captures in the
        // background or has no monitor.
        let monitor = match &config.monitor {
            Some(socket) => match MonitorClient::connect(socket) {
                Ok(client) => Some(Feed::monitor(
                    client,
                    root_path.clone(),
                    config.noise.clone(),
                    !config.rescan_on_open,
                )),
                // In the background, a tracker watches by itself anyway: the monitor only
                // spares it the opening rescan.
                Err(e) if config.auto => {
                    tracing::warn!(error = %e, "the workspace monitor is unreachable; rescanning");
                    None
                }
                Err(source) => {
                    return Err(SandboxError::Monitor {
                        socket: socket.clone(),
                        source,
                    });
                }
            },
            None => None,
        };
        let (mut feed, mut opening) = match monitor {
            Some(m) if !config.auto => (m, None),
            m => (
                Feed::Watcher(Box::new(
                    Watcher::new(&root_path, noise.clone())
                        .map_err(|e| SandboxError::Watch(e.to_string()))?,
                )),
                m,
            ),
        };
        let mut capturer = Capturer {
            unreadable_after: config.unreadable_after,
            env,
            root,
            noise,
            cache,
            keys: KeyMap::new(&config.key_prefix),
            actor: config.actor.clone(),
            branch: config.branch.clone(),
        };
        // Before the first look: a half-written restore must never become the head.
        let unfinished = finish_interrupted(&mut capturer)?;
        let first_ever = capturer.cache.is_empty()?;
        let source = opening.as_mut().unwrap_or(&mut feed);
        let mut dirty = BTreeSet::new();
        source.drain(&mut dirty);
        let vouched = matches!(source, Feed::Monitor(_)) && source.take_rescan().is_none();
        if !vouched {
            if config.rescan_on_open {
                dirty.extend(capturer.rescan_dirty()?);
                // The rescan covers whatever the feed lost while it was set up (the watch limit
                // met while placing watches): that request is answered. A blind feed asks again.
                let _ = source.take_rescan();
                source.rescanned();
            } else {
                source.request_rescan("not rescanned when the tracker opened");
            }
        }
        // What changed while no one watched is nobody's known act: the witness records it.
        capturer.actor = environment_core::witness();
        let first = capturer.capture_with(
            &dirty,
            None,
            intent(&match (first_ever, unfinished) {
                (true, _) => "initial capture".to_owned(),
                (false, None) => "changes found in the tree since the last capture".to_owned(),
                (false, Some(why)) => {
                    format!("changes found in the tree since the last capture ({why})")
                }
            }),
            OpFlags::AUTO_CAPTURE,
            Vec::new(),
        );
        capturer.actor = config.actor.clone();
        let first = first?;
        config.root = root_path;
        let shared = Arc::new(Shared {
            watcher: Mutex::new(feed),
            pending: Mutex::new(Pending::default()),
            capturer: Mutex::new(capturer),
            stop: AtomicBool::new(false),
            captures: AtomicU64::new(0),
            holds: AtomicU64::new(0),
            unreadable: Mutex::new(BTreeMap::new()),
            refused: Mutex::new(BTreeMap::new()),
            disallowed: Mutex::new(BTreeMap::new()),
            without_content: Mutex::new(BTreeMap::new()),
            context: Mutex::new(None),
            handoff: Mutex::new(None),
            config,
        });
        settle(&shared, &dirty, &first);
        match opening.as_mut() {
            // The monitor only told what changed before this tracker watched by itself.
            Some(m) => m.acknowledge(&lock(&shared.pending).dirty),
            None => acknowledge(&shared),
        }
        // Kept for the last capture, which tells the monitor what this tracker recorded.
        *lock(&shared.handoff) = opening;
        let mut threads = Vec::new();
        if shared.config.auto {
            for (name, f) in [
                ("environment-drain", drain_loop as fn(&Shared)),
                ("environment-capture", capture_loop),
            ] {
                let s = shared.clone();
                threads.push(
                    thread::Builder::new()
                        .name(name.into())
                        .spawn(move || f(&s))
                        .map_err(|e| SandboxError::Watch(e.to_string()))?,
                );
            }
        }
        Ok(Tracker { shared, threads })
    }

    /// Makes a new working copy of the branch in `config.root` (an empty directory, made if
    /// missing) and tracks it: the tree starts as the environment's first, empty version, and
    /// the branch's head is written into it before this returns. For an environment whose log
    /// and blobs are shared by several machines ([`Options::shared_blobs`] and a shared log
    /// store), each machine attaches its own working copy; from then on, each capture commits
    /// its changes based on the version its tree holds (rebased onto what the others
    /// committed, a path changed on both sides kept as refused) and writes the others' changes
    /// in, as [`Tracker::sync`] does.
    ///
    /// [`Options::shared_blobs`]: environment_core::Options::shared_blobs
    ///
    /// ```no_run
    /// # use environment_core::{ActorId, LocalEnvironment, Options};
    /// # use environment_sandbox::{Tracker, TrackerConfig};
    /// let env = LocalEnvironment::open("/var/lib/agent/env", Options::default())?;
    /// let config = TrackerConfig::new("/work/copy", ActorId::new("agent:coder")?);
    /// let tracker = Tracker::attach(env, config)?;
    /// assert_eq!(tracker.holds()?, tracker.environment().head("main")?);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn attach(env: LocalEnvironment, config: TrackerConfig) -> Result<Tracker> {
        let refuse = |reason| SandboxError::NotAttachable {
            path: config.root.clone(),
            reason,
        };
        match std::fs::read_dir(&config.root) {
            Ok(entries) => {
                // What the noise rules ignore (the environment's own home, say) may be there.
                let noise = Noise::new(&config.root, &config.noise)?;
                for e in entries {
                    let e = e.map_err(SandboxError::io("read", &config.root))?;
                    let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
                    if !noise.is_ignored(std::path::Path::new(&e.file_name()), is_dir) {
                        return Err(refuse("the directory is not empty"));
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(&config.root)
                    .map_err(SandboxError::io("create", &config.root))?;
            }
            Err(e) => return Err(SandboxError::io("read", &config.root)(e)),
        }
        if !Tracker::begin_copy(&env, &config)? {
            return Err(refuse(
                "a tracker of this environment already knows this directory",
            ));
        }
        let tracker = Tracker::open(env, config)?;
        // The opening capture wrote the head in; a commit since then is written in too.
        tracker.sync()?;
        Ok(tracker)
    }

    /// Records that the tree at `config.root` holds the environment's first, empty version,
    /// unless a tracker of it is known already (then `false`, and nothing changes): its files
    /// are then captured, when it is opened, as changes made on that version, rebased onto
    /// whatever the branch holds by then, and never taken for deletions of what the branch has
    /// and the tree lacks. For the first working copy of a shared environment, whose log
    /// another machine may have started at the same moment; [`Tracker::attach`] starts from
    /// it too.
    pub fn begin_copy(env: &LocalEnvironment, config: &TrackerConfig) -> Result<bool> {
        let root = config
            .root
            .canonicalize()
            .map_err(SandboxError::io("open root", &config.root))?;
        let cache = StatCache::open(
            &env.home().join("sandbox.db"),
            &scope(&root, &config.branch),
        )?;
        if cache.holds()?.is_some() || !cache.is_empty()? {
            return Ok(false);
        }
        cache.set_holds(&env.first_version()?.to_string())?;
        Ok(true)
    }

    /// A restore that was interrupted (its target), if any.
    pub fn interrupted_restore(&self) -> Result<Option<String>> {
        Ok(lock(&self.shared.capturer)
            .cache
            .interrupted_restore()?
            .map(|r| r.target))
    }

    /// The capture barrier: captures everything changed up to now, attributed to `intent`
    /// (e.g. the command that just ended). `None` if nothing changed.
    pub fn capture_now(&self, intent: Intent, flags: OpFlags) -> Result<Option<Observation>> {
        drain(&self.shared);
        let mut capturer = lock(&self.shared.capturer);
        capture_pending(&self.shared, &mut capturer, intent, flags)
    }

    /// Keeps automatic captures away while a recorded command runs, so that the changes it
    /// makes are all taken by [`Tracker::capture_command`] at its end, not split off into
    /// automatic captures. Changes made before are captured first (an automatic capture), so
    /// they are not attributed to the command. Explicit barriers and restores still capture.
    /// Held until dropped; holds may overlap (concurrent commands: the first to end takes
    /// everything dirty by then).
    pub fn hold(&self) -> Result<CaptureHold> {
        let hold = CaptureHold {
            shared: self.shared.clone(),
        };
        self.shared.holds.fetch_add(1, Ordering::SeqCst);
        // Under the capturer's lock: an automatic capture already under way finishes first.
        drain(&self.shared);
        let mut capturer = lock(&self.shared.capturer);
        capture_pending(
            &self.shared,
            &mut capturer,
            automatic(&self.shared),
            OpFlags::AUTO_CAPTURE,
        )?;
        Ok(hold)
    }

    /// The capture barrier at the end of a recorded command: everything changed up to now, plus
    /// `extra` changes (the command's output objects), in one operation attributed to `actor`
    /// with the command's intent. Always records an operation when `extra` changes anything.
    pub fn capture_command(
        &self,
        actor: &ActorId,
        intent: Intent,
        flags: OpFlags,
        extra: Vec<Change>,
    ) -> Result<Captured> {
        self.capture_command_as(actor, intent, flags, extra, None)
    }

    fn capture_command_as(
        &self,
        actor: &ActorId,
        intent: Intent,
        flags: OpFlags,
        extra: Vec<Change>,
        presented: Option<&Credentials>,
    ) -> Result<Captured> {
        drain(&self.shared);
        let mut capturer = lock(&self.shared.capturer);
        let (dirty, intent) = take_pending(&self.shared, &capturer, intent)?;
        // Decided with what the command's request presented, for this capture only.
        let own = capturer.env.clone();
        capturer.env = presenting(&own, presented);
        let captured = capturer.capture_with(&dirty, Some(actor), intent, flags, extra);
        capturer.env = own;
        match captured {
            Ok(captured) => {
                if captured.observation.is_some() {
                    self.shared.captures.fetch_add(1, Ordering::Relaxed);
                }
                settle(&self.shared, &dirty, &captured);
                acknowledge(&self.shared);
                Ok(captured)
            }
            Err(e) => {
                // Not recorded (e.g. the actor may not write a key the command changed): the
                // changes stay pending for the next capture, which is not attributed to it.
                keep_pending(&self.shared, dirty);
                Err(e)
            }
        }
    }

    /// Writes a whole file (created or replaced, keeping its mode; the directories it needs
    /// made) as one operation of `actor` on the branch, then into the tree. What changed in the
    /// tree before is captured first, and automatic captures wait meanwhile. A path the noise
    /// rules ignore, or one holding something other than a regular file, is refused with
    /// [`SandboxError::NotWritable`] and nothing changes.
    pub fn write_file(
        &self,
        actor: &ActorId,
        rel: &str,
        content: Vec<u8>,
        intent_: Intent,
    ) -> Result<Observation> {
        self.edit_file(actor, rel, Some(content), intent_, None)
    }

    /// Deletes a file or a symlink as one operation of `actor` on the branch, then from the
    /// tree, as [`Tracker::write_file`] writes one. A path that holds nothing is
    /// [`SandboxError::Missing`]; a directory, or a path the noise rules ignore, is
    /// [`SandboxError::NotWritable`]; either way nothing changes.
    pub fn delete_file(&self, actor: &ActorId, rel: &str, intent_: Intent) -> Result<Observation> {
        self.edit_file(actor, rel, None, intent_, None)
    }

    /// This tracker's operations of an actor decided with `credentials` (a capability token, a
    /// granted approval) presented, as one request presents them: the environment decides and
    /// spends them with the operation, so a refused one spends nothing.
    pub fn presenting(&self, credentials: Credentials) -> Presenting<'_> {
        Presenting {
            tracker: self,
            credentials,
        }
    }

    /// Records `content` (or, with `None`, the removal) at `rel`, then makes the tree agree.
    fn edit_file(
        &self,
        actor: &ActorId,
        rel: &str,
        content: Option<Vec<u8>>,
        intent_: Intent,
        presented: Option<&Credentials>,
    ) -> Result<Observation> {
        let refused = |reason| SandboxError::NotWritable {
            path: rel.to_owned(),
            reason,
        };
        let _hold = self.hold()?;
        let capturer = self.captured("capture before an edit")?;
        let key = capturer.keys.key(rel.as_bytes())?;
        if capturer.noise.is_ignored(std::path::Path::new(rel), false) {
            return Err(refused(
                "a path the workspace ignores (caches, editor files, the environment's own)",
            ));
        }
        let env = presenting(&capturer.env, presented);
        let before = capturer.held()?;
        drop(capturer);
        let now = env.read_unchecked(&key, &before)?;
        let req = ActRequest::new(actor.clone(), intent_)
            .on(self.branch())
            .base(before);
        let req = match content {
            None => match now {
                None => {
                    return Err(SandboxError::Missing {
                        path: rel.to_owned(),
                    });
                }
                Some(v) if v.meta.kind == EntryKind::Dir => {
                    return Err(refused(
                        "is a directory; only files and symlinks are deleted",
                    ));
                }
                Some(_) => req.delete(key),
            },
            Some(content) => {
                let mode = match now {
                    Some(v) if v.meta.kind == EntryKind::File => v.meta.mode,
                    Some(_) => return Err(refused("exists and is not a regular file")),
                    None => 0o644,
                };
                file_with_parents(&env, req, &before, key, content, mode)?.ok_or_else(|| {
                    refused("a directory on its path is a file or a symlink in the workspace")
                })?
            }
        };
        let obs = env.act_blocking(req)?;
        self.sync()?;
        Ok(obs)
    }

    /// Names what runs while the tree changes (e.g. an agent's command line), so that the
    /// automatic captures say so in their intent; `None` when nothing runs.
    pub fn set_context(&self, what: Option<String>) {
        *lock(&self.shared.context) = what;
    }

    /// Why every capture of this tracker rescans the whole tree, for as long as it lasts: part
    /// of the tree is left unwatched by the inotify watch limit, or the workspace monitor went
    /// away. Nothing is missed (the rescans see it), but captures cost the whole tree, so the
    /// user should be told. `None` while the change feed is whole.
    pub fn blind(&self) -> Option<String> {
        lock(&self.shared.watcher).blind()
    }

    /// The paths the last captures could not read (relative to the root), and why. They are
    /// neither recorded nor removed: they stay pending and are captured once they can be read.
    pub fn unreadable(&self) -> Vec<(PathBuf, String)> {
        listed(&self.shared.unreadable)
    }

    /// The paths recorded without their content because they stayed unreadable (relative to
    /// the root), and why.
    pub fn without_content(&self) -> Vec<(PathBuf, String)> {
        listed(&self.shared.without_content)
    }

    /// The keys' paths of the changes this tracker found that its actor may not make, and
    /// why: put back in the tree and kept as refused (see [`LocalEnvironment::refused`]).
    ///
    /// [`LocalEnvironment::refused`]: environment_core::LocalEnvironment::refused
    pub fn disallowed(&self) -> Vec<(PathBuf, String)> {
        listed(&self.shared.disallowed)
    }

    /// The paths no capture can record (longer than the key limit), relative to the root, and
    /// why: refused alone while everything else is captured; a restore leaves them alone.
    pub fn refused(&self) -> Vec<(PathBuf, String)> {
        listed(&self.shared.refused)
    }

    /// The tracked root (canonical).
    pub fn root(&self) -> &std::path::Path {
        self.shared.config.root.as_path()
    }

    /// The environment captures are committed to.
    pub fn environment(&self) -> LocalEnvironment {
        lock(&self.shared.capturer).env.clone()
    }

    /// The branch captures are committed to.
    pub fn branch(&self) -> &str {
        &self.shared.config.branch
    }

    /// Forces a full rescan against the stat cache, as after a queue overflow.
    pub fn rescan_now(&self) -> Result<Option<Observation>> {
        lock(&self.shared.watcher).request_rescan("asked for");
        self.capture_now(intent("rescan"), OpFlags::AUTO_CAPTURE)
    }

    /// What a restore to `target` would change, without changing the tree. Uncaptured changes
    /// are captured first, so the plan is exact.
    pub fn plan_restore(&self, target: &OpId) -> Result<RestorePlan> {
        let capturer = self.captured("capture before a restore plan")?;
        Ok(capturer.plan(target)?.0)
    }

    /// The capturer, once everything changed so far is captured (attributed to `why`).
    fn captured(&self, why: &str) -> Result<MutexGuard<'_, Capturer>> {
        drain(&self.shared);
        let mut capturer = lock(&self.shared.capturer);
        capture_pending(
            &self.shared,
            &mut capturer,
            intent(why),
            OpFlags::AUTO_CAPTURE,
        )?;
        Ok(capturer)
    }

    /// Drops the events of what was just `written` (still as written) from the dirty set: the
    /// head holds those paths already. Returns the capturer for what comes next.
    fn forget_written(&self, written: &[(Vec<u8>, Option<StatEntry>)]) -> MutexGuard<'_, Capturer> {
        drain(&self.shared);
        let capturer = lock(&self.shared.capturer);
        let mut pending = lock(&self.shared.pending);
        capturer.forget_own_writes(&mut pending.dirty, written);
        drop(pending);
        capturer
    }

    /// Restores the live tree to `target`: a safety capture of anything not yet captured, then
    /// only what differs is written or removed, then a rollback operation is recorded. Processes
    /// working in the tree keep running; a file descriptor they already hold keeps the old inode
    /// (a replaced file is a new file at the same path).
    pub fn restore(&self, actor: &ActorId, target: &OpId, intent_: Intent) -> Result<RestorePlan> {
        self.restore_as(actor, target, intent_, None)
    }

    fn restore_as(
        &self,
        actor: &ActorId,
        target: &OpId,
        intent_: Intent,
        presented: Option<&Credentials>,
    ) -> Result<RestorePlan> {
        let mut capturer = self.captured("safety capture before a restore")?;
        let (plan, changes) = capturer.plan(target)?;
        let now = now_ms();
        let (env, branch) = (
            presenting(&capturer.env, presented),
            capturer.branch.clone(),
        );
        let mut written = Vec::new();
        let mut not_restored = Vec::new();
        let record = RestoreIntent {
            target: target.to_string(),
            from: Some(plan.from.to_string()),
            actor: Some(actor.as_str().to_owned()),
            intent: Some(intent_.text.clone()),
        };
        // Authorized before a single file is written: a refused restore leaves the tree as is.
        let rollback =
            env.restore_applying(actor, &branch, target, intent_, || -> Result<()> {
                capturer.cache.begin_restore(&record, now)?;
                let applied = capturer.apply(&changes)?;
                written = applied.cache;
                not_restored = applied.not_restored;
                Ok(())
            })?;
        capturer.cache.update(written.clone())?;
        capturer.cache.set_holds(&rollback.to_string())?;
        capturer.cache.end_restore()?;
        // The restore's own events: a path still exactly as the restore left it needs no
        // reading (the head holds it already); anything else is captured as usual.
        drop(capturer);
        let mut capturer = self.forget_written(&written);
        capture_pending(
            &self.shared,
            &mut capturer,
            automatic(&self.shared),
            OpFlags::AUTO_CAPTURE,
        )?;
        Ok(RestorePlan {
            not_restored,
            ..plan
        })
    }

    /// What a restore to `target` would change in this tree and in `others` (further trees
    /// tracked on the same branch under their own key prefixes), without changing them.
    pub fn plan_restore_with(&self, others: &[&Tracker], target: &OpId) -> Result<RestorePlan> {
        let mut plan = self.plan_restore(target)?;
        for t in others {
            plan.absorb(t.plan_restore(target)?);
        }
        Ok(plan)
    }

    /// Restores this tree and `others` (further trees tracked on the same branch under their own
    /// key prefixes, such as a managed rootfs) to `target` together: their uncaptured changes
    /// are captured first, this tracker records the one rollback operation once it is
    /// authorized, and the others are then brought to the same version.
    pub fn restore_with(
        &self,
        others: &[&Tracker],
        actor: &ActorId,
        target: &OpId,
        intent_: Intent,
    ) -> Result<RestorePlan> {
        self.restore_with_as(others, actor, target, intent_, None)
    }

    fn restore_with_as(
        &self,
        others: &[&Tracker],
        actor: &ActorId,
        target: &OpId,
        intent_: Intent,
        presented: Option<&Credentials>,
    ) -> Result<RestorePlan> {
        for t in others {
            drop(t.captured("safety capture before a restore")?);
        }
        let mut plan = self.restore_as(actor, target, intent_, presented)?;
        for t in others {
            let other = t.sync()?;
            plan.absorb(other);
        }
        Ok(plan)
    }

    /// Brings the live tree to the branch's head: what changed in the tree is captured first
    /// (a change to a path the branch also changed is kept as refused and put back), then what
    /// others committed since the version the tree holds (another working copy on another
    /// machine, a merge or an act through the environment's API) is written into it. Records
    /// no operation of its own. A path changed in the tree while it is written is left alone
    /// and captured next. Returns what was written (nothing when the branch had not moved).
    pub fn sync(&self) -> Result<RestorePlan> {
        drain(&self.shared);
        let mut capturer = lock(&self.shared.capturer);
        let held = capturer.held()?;
        let captured = capture_pending_all(
            &self.shared,
            &mut capturer,
            intent("capture before writing the head into the tree"),
            OpFlags::AUTO_CAPTURE,
        )?;
        Ok(captured.and_then(|c| c.synced).unwrap_or(RestorePlan {
            from: held,
            to: held,
            steps: Vec::new(),
            not_restored: Vec::new(),
            ignored_removed: 0,
        }))
    }

    /// The version the tree holds: the branch's head, unless others committed since the last
    /// capture or [`Tracker::sync`].
    pub fn holds(&self) -> Result<OpId> {
        lock(&self.shared.capturer).held()
    }

    /// How many captures the background thread made.
    pub fn captures(&self) -> u64 {
        self.shared.captures.load(Ordering::Relaxed)
    }

    /// Stops tracking after a final capture.
    pub fn close(mut self) -> Result<Option<Observation>> {
        self.stop_threads();
        self.capture_last(intent("final capture"), OpFlags::AUTO_CAPTURE)
    }

    /// The last capture (the capture barrier, then no more): with a monitor that gave this
    /// tracker its opening set, the monitor is told afterwards that everything it saw up to
    /// this barrier is recorded, so that the next command does not read it again. A capture
    /// that fails tells it nothing.
    pub fn capture_last(&self, intent: Intent, flags: OpFlags) -> Result<Option<Observation>> {
        let mut monitor = lock(&self.shared.handoff).take();
        // What the monitor saw before this point, this tracker saw too (it watched from before
        // the opening drain), so the capture below records it.
        if let Some(m) = monitor.as_mut() {
            m.drain(&mut BTreeSet::new());
        }
        let captured = self.capture_now(intent, flags)?;
        if let Some(m) = monitor.as_mut() {
            m.acknowledge(&lock(&self.shared.pending).dirty);
        }
        Ok(captured)
    }

    fn stop_threads(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        self.stop_threads();
    }
}

/// Moves every event the kernel has queued into the pending set.
fn drain(shared: &Shared) -> usize {
    let mut found = BTreeSet::new();
    // The watcher stays locked until what it read is pending: a barrier that drains an empty
    // queue meanwhile (the drain thread got there first) would otherwise capture without it.
    let mut watcher = lock(&shared.watcher);
    let n = watcher.drain(&mut found);
    if !found.is_empty() {
        let now = Instant::now();
        let mut p = lock(&shared.pending);
        p.dirty.extend(found);
        p.first_change.get_or_insert(now);
        p.last_change = Some(now);
    }
    drop(watcher);
    n
}

/// Released when dropped: see [`Tracker::hold`].
#[must_use = "the hold ends when this is dropped"]
pub struct CaptureHold {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for CaptureHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CaptureHold").finish_non_exhaustive()
    }
}

impl Drop for CaptureHold {
    fn drop(&mut self) {
        self.shared.holds.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Captures what is pending (after a rescan, if the watcher lost events).
fn capture_pending(
    shared: &Shared,
    capturer: &mut Capturer,
    intent: Intent,
    flags: OpFlags,
) -> Result<Option<Observation>> {
    Ok(capture_pending_all(shared, capturer, intent, flags)?.and_then(|c| c.observation))
}

/// [`capture_pending`], with everything the capture did; `None` when nothing was pending and
/// the branch had not moved past the tree's version.
fn capture_pending_all(
    shared: &Shared,
    capturer: &mut Capturer,
    intent: Intent,
    flags: OpFlags,
) -> Result<Option<Captured>> {
    let (pending, intent) = take_pending(shared, capturer, intent)?;
    if pending.is_empty() && !capturer.behind()? {
        acknowledge(shared);
        return Ok(None);
    }
    // The batch is held until it is committed: a capture that fails puts it back whole.
    match capturer.capture_with(&pending, None, intent, flags, Vec::new()) {
        Ok(captured) => {
            if captured.observation.is_some() {
                shared.captures.fetch_add(1, Ordering::Relaxed);
            }
            settle(shared, &pending, &captured);
            acknowledge(shared);
            if !captured.written.is_empty() {
                // The events of what the capture wrote in from others are its own.
                drain(shared);
                capturer.forget_own_writes(&mut lock(&shared.pending).dirty, &captured.written);
            }
            Ok(Some(captured))
        }
        Err(e) => {
            keep_pending(shared, pending);
            Err(e)
        }
    }
}

/// Takes the pending dirty set (extended by a rescan if the watcher lost events; the intent
/// then says so).
fn take_pending(
    shared: &Shared,
    capturer: &Capturer,
    mut intent: Intent,
) -> Result<(BTreeSet<Vec<u8>>, Intent)> {
    let rescan = lock(&shared.watcher).take_rescan();
    let mut pending = std::mem::take(&mut lock(&shared.pending).dirty);
    if let Some(why) = rescan {
        let found = match capturer.rescan_dirty() {
            Ok(found) => found,
            Err(e) => {
                lock(&shared.watcher).request_rescan(&why);
                keep_pending(shared, pending);
                return Err(e);
            }
        };
        lock(&shared.watcher).rescanned();
        tracing::warn!(paths = found.len(), %why, "rescanned against the stat cache");
        pending.extend(found);
        // The log says so too: this capture's changes were found by a rescan.
        intent.text = format!("{} (rescan: {why})", intent.text);
    }
    {
        let mut p = lock(&shared.pending);
        if p.dirty.is_empty() {
            p.first_change = None;
        }
    }
    Ok((pending, intent))
}

/// The drain thread: waits for the inotify descriptor and empties the kernel queue, whatever
/// the capturer is doing.
fn drain_loop(shared: &Shared) {
    // Close-on-exec: nothing the supervisor starts may hold (and empty) the watcher.
    let fd = match lock(&shared.watcher)
        .as_fd()
        .map(|fd| rustix::io::fcntl_dupfd_cloexec(fd, 0))
    {
        Some(Ok(fd)) => fd,
        None => {
            tracing::error!("a tracker fed by a monitor has no watcher to poll");
            return;
        }
        Some(Err(e)) => {
            tracing::error!(error = %e, "cannot poll the watcher; automatic capture stops");
            return;
        }
    };
    while !shared.stop.load(Ordering::Relaxed) {
        let mut fds = [rustix::event::PollFd::new(
            &fd,
            rustix::event::PollFlags::IN,
        )];
        let timeout = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 50_000_000,
        };
        if matches!(rustix::event::poll(&mut fds, Some(&timeout)), Ok(n) if n > 0) {
            drain(shared);
        }
    }
}

/// The capture thread: debounces (a quiet period, bounded by the maximum wait) and captures.
fn capture_loop(shared: &Shared) {
    let cfg = &shared.config;
    let tick = cfg
        .quiet_period
        .min(Duration::from_millis(50))
        .max(Duration::from_millis(5));
    // A change in a directory the watch limit leaves unwatched makes no event: while part of the
    // tree is unwatched, it is also rescanned at this interval.
    const BLIND_RESCAN_EVERY: Duration = Duration::from_secs(10);
    let mut last_capture = Instant::now();
    let mut last_follow = Instant::now();
    while !shared.stop.load(Ordering::Relaxed) {
        thread::sleep(tick);
        // Others' commits are written in by the capture below, which finds the branch moved.
        let follow = cfg
            .follow_every
            .is_some_and(|every| last_follow.elapsed() >= every);
        if follow {
            last_follow = Instant::now();
        }
        let due = follow || {
            let feed = lock(&shared.watcher);
            let rescan = feed.needs_rescan()
                || (feed.is_blind() && last_capture.elapsed() >= BLIND_RESCAN_EVERY);
            drop(feed);
            let p = lock(&shared.pending);
            rescan
                || match (p.first_change, p.last_change) {
                    (Some(first), Some(last)) => {
                        last.elapsed() >= cfg.quiet_period || first.elapsed() >= cfg.max_wait
                    }
                    _ => false,
                }
        };
        if due && shared.holds.load(Ordering::SeqCst) == 0 {
            let mut capturer = lock(&shared.capturer);
            // Checked again under the lock: a hold taken meanwhile waited for this lock, so its
            // command has not started, or it is seen here.
            if shared.holds.load(Ordering::SeqCst) > 0 {
                continue;
            }
            last_capture = Instant::now();
            if let Err(e) = capture_pending(
                shared,
                &mut capturer,
                automatic(shared),
                OpFlags::AUTO_CAPTURE,
            ) {
                tracing::warn!(error = %e, "automatic capture failed; will retry");
            }
        }
    }
}

/// `req` putting a file at `key`, and every ancestor directory the version `before` lacks; `None`
/// for a write below a file or a symlink (`a.txt/notes.md`, `link/notes.md`), before anything
/// is recorded.
fn file_with_parents(
    env: &LocalEnvironment,
    mut req: ActRequest,
    before: &OpId,
    key: Key,
    content: Vec<u8>,
    mode: u32,
) -> Result<Option<ActRequest>> {
    let mut parent = key.parent();
    while let Some(dir) = parent {
        if dir.path().is_empty() {
            break;
        }
        parent = dir.parent();
        match env.read_unchecked(&dir, before)? {
            Some(v) if v.meta.kind == EntryKind::Dir => break,
            Some(_) => return Ok(None),
            None => req = req.put(dir, Value::dir()),
        }
    }
    Ok(Some(req.put(key, Value::file(content).mode(mode))))
}

/// `env`, presenting `credentials` when some are given (none presented leaves the tracker's
/// own, such as the token its captures are made under).
fn presenting(env: &LocalEnvironment, credentials: Option<&Credentials>) -> LocalEnvironment {
    match credentials {
        Some(c) if *c != Credentials::default() => env.presenting(c.clone()),
        _ => env.clone(),
    }
}

/// A tracker's operations of an actor with the credentials one request presents (see
/// [`Tracker::presenting`]).
pub struct Presenting<'a> {
    tracker: &'a Tracker,
    credentials: Credentials,
}

impl Presenting<'_> {
    /// [`Tracker::capture_command`], decided with the credentials presented (a granted
    /// approval covers the command's changes in the tree).
    pub fn capture_command(
        &self,
        actor: &ActorId,
        intent: Intent,
        flags: OpFlags,
        extra: Vec<Change>,
    ) -> Result<Captured> {
        self.tracker
            .capture_command_as(actor, intent, flags, extra, Some(&self.credentials))
    }

    /// [`Tracker::write_file`], decided with the credentials presented.
    pub fn write_file(
        &self,
        actor: &ActorId,
        rel: &str,
        content: Vec<u8>,
        intent_: Intent,
    ) -> Result<Observation> {
        self.tracker
            .edit_file(actor, rel, Some(content), intent_, Some(&self.credentials))
    }

    /// [`Tracker::delete_file`], decided with the credentials presented.
    pub fn delete_file(&self, actor: &ActorId, rel: &str, intent_: Intent) -> Result<Observation> {
        self.tracker
            .edit_file(actor, rel, None, intent_, Some(&self.credentials))
    }

    /// [`Tracker::restore_with`], decided with the credentials presented.
    pub fn restore_with(
        &self,
        others: &[&Tracker],
        actor: &ActorId,
        target: &OpId,
        intent_: Intent,
    ) -> Result<RestorePlan> {
        self.tracker
            .restore_with_as(others, actor, target, intent_, Some(&self.credentials))
    }
}
