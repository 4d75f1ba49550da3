//! Where a tracker learns what changed: its own watcher, or the workspace monitor's dirty set.

use std::collections::BTreeSet;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;

use crate::monitor::MonitorClient;
use crate::noise::NoiseRules;
use crate::watch::Watcher;

/// Why a tracker's own watcher asks for a rescan.
const LOST: &str = "events were lost to a queue overflow or the watch limit";

/// The source of a tracker's dirty paths.
pub(crate) enum Feed {
    /// Inotify watches of this process.
    Watcher(Box<Watcher>),
    /// A workspace monitor, which keeps the dirty set between processes.
    Monitor(Box<MonitorFeed>),
}

pub(crate) struct MonitorFeed {
    client: MonitorClient,
    root: PathBuf,
    rules: NoiseRules,
    /// The last drain's sequence number: what an acknowledgement covers.
    seq: Option<u64>,
    /// Why the next capture must rescan.
    rescan: Option<String>,
    /// A rescan was taken since the last acknowledgement.
    rescanned: bool,
    /// The monitor went away: its set is lost, every capture rescans.
    gone: bool,
    /// Why every capture rescans for as long as it lasts, as the last answer said.
    blind: Option<String>,
    /// The next question is answered at once, with what the monitor knows (a tracker that
    /// will not rescan when it opens need not wait for the monitor's watches to be placed).
    now: bool,
}

impl MonitorFeed {
    /// The monitor did not answer: its set is lost, and every capture from now on rescans.
    fn went_away(&mut self, e: &std::io::Error) {
        tracing::warn!(error = %e, "the workspace monitor went away; rescanning");
        self.gone = true;
        self.blind = Some(format!("the workspace monitor went away ({e})"));
    }
}

impl Feed {
    /// A monitor's feed; `now`: the first question does not wait for the monitor to have
    /// placed its watches (it then answers "incomplete" and nothing).
    pub(crate) fn monitor(
        client: MonitorClient,
        root: PathBuf,
        rules: NoiseRules,
        now: bool,
    ) -> Feed {
        Feed::Monitor(Box::new(MonitorFeed {
            client,
            root,
            rules,
            seq: None,
            rescan: None,
            rescanned: false,
            gone: false,
            blind: None,
            now,
        }))
    }

    /// Moves what changed into `dirty`; returns how many events or paths were read.
    pub(crate) fn drain(&mut self, dirty: &mut BTreeSet<Vec<u8>>) -> usize {
        match self {
            Feed::Watcher(w) => w.drain(dirty),
            Feed::Monitor(m) if m.gone => 0,
            Feed::Monitor(m) => match if std::mem::take(&mut m.now) {
                m.client.changes_now(&m.root, &m.rules)
            } else {
                m.client.changes(&m.root, &m.rules)
            } {
                Ok(c) => {
                    let n = c.paths.len();
                    dirty.extend(c.paths);
                    m.seq = Some(c.seq);
                    m.blind = c.blind;
                    if let Some(why) = c.incomplete {
                        m.rescan.get_or_insert(why);
                    }
                    n
                }
                Err(e) => {
                    m.went_away(&e);
                    m.rescan = m.blind.clone();
                    0
                }
            },
        }
    }

    /// Why every capture rescans the whole tree for as long as it lasts (directories the
    /// watch limit leaves unwatched, a monitor gone); `None` while the feed is whole.
    pub(crate) fn blind(&self) -> Option<String> {
        match self {
            Feed::Watcher(w) => w.blind(),
            Feed::Monitor(m) => m.blind.clone(),
        }
    }

    /// Whether part of the tree is left unwatched (see [`Feed::blind`]), cheaply.
    pub(crate) fn is_blind(&self) -> bool {
        match self {
            Feed::Watcher(w) => w.is_blind(),
            Feed::Monitor(m) => m.blind.is_some(),
        }
    }

    /// Whether the next capture must rescan (without taking the request); a blind feed asks
    /// only through [`Feed::take_rescan`], so that a tracker rescans when it captures, not at
    /// every tick.
    pub(crate) fn needs_rescan(&self) -> bool {
        match self {
            Feed::Watcher(w) => w.needs_rescan,
            Feed::Monitor(m) => m.rescan.is_some() || m.gone,
        }
    }

    /// Asks for a rescan at the next capture.
    pub(crate) fn request_rescan(&mut self, why: &str) {
        match self {
            Feed::Watcher(w) => w.needs_rescan = true,
            Feed::Monitor(m) => m.rescan = Some(why.to_owned()),
        }
    }

    /// Takes the rescan request: why the capture about to run must rescan, if it must.
    pub(crate) fn take_rescan(&mut self) -> Option<String> {
        match self {
            Feed::Watcher(w) => {
                let lost = std::mem::take(&mut w.needs_rescan).then(|| LOST.to_owned());
                w.blind().or(lost)
            }
            Feed::Monitor(m) if m.gone => Some("no workspace monitor".to_owned()),
            Feed::Monitor(m) => m.rescan.take(),
        }
    }

    /// A rescan of the whole tree was captured (acknowledged with the next capture: it gives
    /// the monitor a baseline).
    pub(crate) fn rescanned(&mut self) {
        if let Feed::Monitor(m) = self {
            m.rescanned = true;
        }
    }

    /// After a committed capture: everything drained so far is recorded except `pending`.
    pub(crate) fn acknowledge(&mut self, pending: &BTreeSet<Vec<u8>>) {
        let Feed::Monitor(m) = self else { return };
        let Some(seq) = m.seq else { return };
        if m.gone {
            return;
        }
        match m.client.acknowledge(&m.root, seq, pending, m.rescanned) {
            Ok(()) => m.rescanned = false,
            Err(e) => m.went_away(&e),
        }
    }

    /// The inotify descriptor, for a drain thread (own watcher only).
    pub(crate) fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        match self {
            Feed::Watcher(w) => Some(w.as_fd()),
            Feed::Monitor(_) => None,
        }
    }
}
