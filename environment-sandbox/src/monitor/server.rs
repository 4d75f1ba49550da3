//! The monitor process: watches, keeps dirty sets, answers trackers.
//!
//! One thread accepts, one per connection answers, one keeps the kernel queues short (so a burst
//! between two commands does not overflow them). All of them share one state under a lock.

use std::collections::{HashMap, HashSet};
use std::io::{self, BufRead, BufReader};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use super::{Reply, Request, WirePath, send_all};
use crate::noise::{Noise, NoiseRules};
use crate::watch::Watcher;

/// How many dirty paths a root may hold before the monitor gives up on it (and the next tracker
/// rescans): the set lives in memory.
const MAX_DIRTY: usize = 1 << 20;

/// How a monitor runs.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// Where it listens. Its directory is created private if missing; a lock file beside it
    /// (`SOCKET.lock`) keeps a second monitor from starting.
    pub socket: PathBuf,
    /// It stops after this long without a request and without a connection.
    pub idle: Duration,
    /// It stops when this path (the environment home) is gone or replaced.
    pub guard: PathBuf,
}

/// How [`serve`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Another monitor holds the socket: nothing was started.
    AlreadyRunning,
    /// Idle for the configured time.
    Idle,
    /// Asked to stop.
    Stopped,
    /// The guarded home went away.
    HomeGone,
}

struct Watched {
    watcher: Watcher,
    rules: NoiseRules,
    /// Dirty path → the sequence number of the drain that saw it last.
    dirty: HashMap<Vec<u8>, u64>,
    /// Why the dirty set is not complete, and from which drain on; `None`: it is (baseline).
    incomplete: Option<(u64, String)>,
}

impl Watched {
    fn drain(&mut self, seq: u64) {
        let mut found = std::collections::BTreeSet::new();
        self.watcher.drain(&mut found);
        for p in found {
            self.dirty.insert(p, seq);
        }
        if let Some(why) = self.watcher.blind() {
            // Lasts until the watches are in place: no acknowledged rescan makes it complete.
            self.watcher.needs_rescan = false;
            self.lose(seq, &why);
        } else if std::mem::take(&mut self.watcher.needs_rescan) {
            self.lose(
                seq,
                "the monitor lost events (a queue overflow or the watch limit)",
            );
        } else if self.dirty.len() > MAX_DIRTY {
            self.lose(seq, "more paths changed than the monitor keeps");
        }
    }

    fn lose(&mut self, seq: u64, why: &str) {
        self.dirty.clear();
        self.incomplete = Some((seq, why.to_owned()));
    }
}

#[derive(Default)]
struct State {
    roots: HashMap<PathBuf, Watched>,
    /// Roots whose watches are being placed (a walk of the tree, done without the lock).
    starting: HashSet<PathBuf>,
    seq: u64,
    last_request: Option<Instant>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Why an answer given while the watches are still being placed is incomplete.
const STARTING: &str = "the monitor is still placing the watches of the tree";

/// Answers one request; `true` when the monitor is to stop.
fn answer(state: &Arc<Mutex<State>>, request: Request) -> (Reply, bool) {
    lock(state).last_request = Some(Instant::now());
    match request {
        Request::Changes { root, noise, now } => (changes(state, root, noise, now), false),
        Request::Ack {
            root,
            seq,
            keep,
            rescanned,
        } => {
            let mut s = lock(state);
            if let Some(w) = s.roots.get_mut(&root) {
                let keep: HashSet<Vec<u8>> = keep.into_iter().map(WirePath::into_bytes).collect();
                w.dirty.retain(|p, s| *s > seq || keep.contains(p));
                // A rescan that began after the drain `seq` saw everything up to it, so the
                // set is complete from there on, unless events were lost after that drain.
                if rescanned && w.incomplete.as_ref().is_some_and(|(at, _)| *at <= seq) {
                    w.incomplete = None;
                }
            }
            (Reply::Done, false)
        }
        Request::Stop => (Reply::Done, true),
    }
}

/// The dirty set of `root`, watching it first if it is not watched with `rules`. Placing the
/// watches walks the tree, which takes seconds on a large one: it runs without the lock (other
/// roots and the drain go on), and a question asked `now` gets an empty, incomplete answer
/// meanwhile instead of waiting.
fn changes(state: &Arc<Mutex<State>>, root: PathBuf, rules: NoiseRules, now: bool) -> Reply {
    loop {
        let mut s = lock(state);
        s.seq += 1;
        let seq = s.seq;
        if let Some(w) = s.roots.get_mut(&root).filter(|w| w.rules == rules) {
            w.drain(seq);
            return Reply::Changes {
                seq,
                incomplete: w.incomplete.as_ref().map(|(_, why)| why.clone()),
                blind: w.watcher.blind(),
                paths: w.dirty.keys().map(|p| WirePath::of(p)).collect(),
            };
        }
        let not_yet = Reply::Changes {
            seq,
            incomplete: Some(STARTING.to_owned()),
            blind: None,
            paths: Vec::new(),
        };
        if s.starting.contains(&root) {
            if now {
                return not_yet;
            }
            drop(s);
            thread::sleep(Duration::from_millis(10));
            continue;
        }
        s.starting.insert(root.clone());
        drop(s);
        if now {
            let (st, r) = (state.clone(), root.clone());
            let spawned = thread::Builder::new()
                .name("monitor-watch".into())
                .spawn(move || {
                    // A failure is told to the next question that waits (it tries again).
                    let _ = start_watching(&st, r, rules);
                });
            if spawned.is_err() {
                lock(state).starting.remove(&root);
            }
            return not_yet;
        }
        if let Err(message) = start_watching(state, root.clone(), rules.clone()) {
            return Reply::Error {
                message: format!("cannot watch {}: {message}", root.display()),
            };
        }
    }
}

/// Places the watches of `root` (the caller marked it starting) and keeps its dirty set from
/// now on, without a baseline.
fn start_watching(state: &Mutex<State>, root: PathBuf, rules: NoiseRules) -> Result<(), String> {
    let made = Noise::new(&root, &rules)
        .map_err(|e| e.to_string())
        .and_then(|noise| Watcher::new(&root, noise).map_err(|e| e.to_string()));
    let mut s = lock(state);
    s.starting.remove(&root);
    let watcher = made?;
    s.seq += 1;
    let seq = s.seq;
    let w = Watched {
        watcher,
        rules,
        dirty: HashMap::new(),
        incomplete: Some((seq, "the monitor just started watching the tree".into())),
    };
    s.roots.insert(root, w);
    Ok(())
}

fn identity(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// Runs a monitor until it is idle, asked to stop, or its home is gone. Returns at once with
/// [`Served::AlreadyRunning`] when another one holds the socket.
pub fn serve(config: MonitorConfig) -> io::Result<Served> {
    let dir = config.socket.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)?;
    let lock_path = PathBuf::from(format!("{}.lock", config.socket.display()));
    let lock_file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)?;
    if rustix::fs::flock(
        lock_file.as_fd(),
        rustix::fs::FlockOperation::NonBlockingLockExclusive,
    )
    .is_err()
    {
        return Ok(Served::AlreadyRunning);
    }
    // The lock is ours: a socket left there is a dead monitor's.
    let _ = std::fs::remove_file(&config.socket);
    let listener = UnixListener::bind(&config.socket)?;
    std::fs::set_permissions(&config.socket, std::fs::Permissions::from_mode(0o600))?;
    let ours = identity(&config.socket);
    let home = identity(&config.guard);
    listener.set_nonblocking(true)?;

    let state = Arc::new(Mutex::new(State::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let connections = Arc::new(AtomicUsize::new(0));
    // Every connection, so that the end of the monitor ends them too (an embedder's process
    // goes on after `serve` returns).
    let open: Arc<Mutex<HashMap<u64, UnixStream>>> = Arc::default();
    let mut next_id = 0u64;
    let drainer = {
        let (state, stop) = (state.clone(), stop.clone());
        thread::Builder::new()
            .name("monitor-drain".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    thread::sleep(Duration::from_millis(100));
                    let mut s = lock(&state);
                    // A new number: what this drain finds is newer than any answer given.
                    s.seq += 1;
                    let seq = s.seq;
                    for w in s.roots.values_mut() {
                        w.drain(seq);
                    }
                }
            })?
    };
    let started = Instant::now();
    let ended = loop {
        if stop.load(Ordering::Relaxed) {
            break Served::Stopped;
        }
        if home.is_none() || identity(&config.guard) != home {
            break Served::HomeGone;
        }
        if identity(&config.socket) != ours {
            // Someone removed or replaced the socket: no command can reach this monitor.
            break Served::HomeGone;
        }
        let last = lock(&state).last_request.unwrap_or(started);
        if connections.load(Ordering::SeqCst) == 0 && last.elapsed() >= config.idle {
            break Served::Idle;
        }
        match listener.accept() {
            Ok((stream, _)) => {
                next_id += 1;
                let id = next_id;
                if let Ok(s) = stream.try_clone() {
                    open.lock().unwrap_or_else(|p| p.into_inner()).insert(id, s);
                }
                let (state, stop, connections) = (state.clone(), stop.clone(), connections.clone());
                let open = open.clone();
                connections.fetch_add(1, Ordering::SeqCst);
                let spawned = thread::Builder::new()
                    .name("monitor-conn".into())
                    .spawn(move || {
                        let _ = answer_connection(stream, &state, &stop);
                        lock(&state).last_request = Some(Instant::now());
                        open.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                        connections.fetch_sub(1, Ordering::SeqCst);
                    });
                if spawned.is_err() {
                    tracing::warn!("cannot start a thread for a monitor connection");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let mut fds = [rustix::event::PollFd::new(
                    &listener,
                    rustix::event::PollFlags::IN,
                )];
                let timeout = rustix::event::Timespec {
                    tv_sec: 0,
                    tv_nsec: 200_000_000,
                };
                let _ = rustix::event::poll(&mut fds, Some(&timeout));
            }
            Err(e) => {
                tracing::warn!(error = %e, "the monitor cannot accept");
                thread::sleep(Duration::from_millis(100));
            }
        }
    };
    stop.store(true, Ordering::Relaxed);
    for (_, s) in open.lock().unwrap_or_else(|p| p.into_inner()).drain() {
        let _ = s.shutdown(std::net::Shutdown::Both);
    }
    let _ = drainer.join();
    if identity(&config.socket) == ours {
        let _ = std::fs::remove_file(&config.socket);
    }
    drop(lock_file);
    Ok(ended)
}

fn answer_connection(
    stream: UnixStream,
    state: &Arc<Mutex<State>>,
    stop: &AtomicBool,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    let writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let (reply, stopping) = match serde_json::from_str::<Request>(&line) {
            Ok(request) => answer(state, request),
            Err(e) => (
                Reply::Error {
                    message: format!("not a monitor request: {e}"),
                },
                false,
            ),
        };
        let mut out = serde_json::to_vec(&reply).map_err(io::Error::other)?;
        out.push(b'\n');
        send_all(&writer, &out)?;
        if stopping {
            stop.store(true, Ordering::Relaxed);
            return Ok(());
        }
    }
}
