//! The workspace monitor: keeps the dirty set of tracked roots between commands, so that a
//! command run without a supervisor costs what changed instead of a rescan of the whole tree.
//!
//! The model is git's `fsmonitor--daemon`: one process per environment home, started on demand
//! by the first command ([`serve`] is what it runs), which watches every tracked root with
//! inotify and answers on a Unix socket in the home. A [`Tracker`](crate::Tracker) opened with
//! [`TrackerConfig::monitor`](crate::TrackerConfig::monitor) asks it for the paths changed
//! since the last acknowledged capture instead of watching and rescanning itself.
//!
//! The monitor can only vouch for what happened while it watched. Each root therefore carries a
//! *baseline*: set once a tracker has rescanned the whole tree against the stat cache *after*
//! the monitor started watching it and acknowledged the capture, cleared by anything that loses
//! events (a queue overflow, the watch limit, a dirty set too large to keep). Without a
//! baseline a tracker rescans; with one, the dirty set is complete.
//!
//! A path leaves the dirty set only when a tracker acknowledges the capture that recorded it
//! (entries carry the sequence number of the drain that saw them last), so a command killed
//! between reading the set and committing loses nothing: the next command gets the same paths.

mod server;

use std::collections::BTreeSet;
use std::io::{self, BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::noise::NoiseRules;

pub use server::{MonitorConfig, Served, serve};

/// A path on the wire: text when it is UTF-8, its bytes otherwise (no path is ever mangled).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum WirePath {
    Text(String),
    Bytes(Vec<u8>),
}

impl WirePath {
    fn of(p: &[u8]) -> WirePath {
        match std::str::from_utf8(p) {
            Ok(s) => WirePath::Text(s.to_owned()),
            Err(_) => WirePath::Bytes(p.to_vec()),
        }
    }

    fn into_bytes(self) -> Vec<u8> {
        match self {
            WirePath::Text(s) => s.into_bytes(),
            WirePath::Bytes(b) => b,
        }
    }
}

/// What a tracker asks.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    /// The paths changed under `root` since the last acknowledged capture (watching it from now
    /// on if it was not watched, or watched with other rules). `now`: answer at once, even when
    /// the watches are still being placed (the answer is then empty and incomplete).
    Changes {
        root: PathBuf,
        noise: NoiseRules,
        #[serde(default)]
        now: bool,
    },
    /// A capture of everything drained up to `seq` is committed, except the paths in `keep`
    /// (still pending in the tracker); `rescanned`: it included a rescan of the whole tree.
    Ack {
        root: PathBuf,
        seq: u64,
        keep: Vec<WirePath>,
        rescanned: bool,
    },
    /// Stop now.
    Stop,
}

/// What the monitor answers.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
enum Reply {
    Changes {
        seq: u64,
        /// Why the set cannot be trusted to be complete; none when it can.
        incomplete: Option<String>,
        /// Why no set will be complete for as long as it lasts (the watch limit).
        #[serde(default)]
        blind: Option<String>,
        paths: Vec<WirePath>,
    },
    Done,
    Error {
        message: String,
    },
}

/// The paths changed under a root since the last acknowledged capture.
#[derive(Debug, Clone, Default)]
pub struct Changes {
    /// The sequence number of the drain that produced them: acknowledge it after the capture.
    pub seq: u64,
    /// Why the set may be incomplete (the monitor has no baseline for the root: it just started
    /// watching, or lost events): the tracker must rescan. `None`: the set is complete.
    pub incomplete: Option<String>,
    /// Why no set will be complete while it lasts (directories the watch limit leaves
    /// unwatched): every capture rescans, and the user should be told. `None` otherwise.
    pub blind: Option<String>,
    /// The changed paths, relative to the root.
    pub paths: BTreeSet<Vec<u8>>,
}

/// Writes `bytes` whole to a socket without raising SIGPIPE when the other end is gone (a
/// command that ignores nothing would die of it, silently): the error says so instead.
fn send_all(stream: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::net::send(stream, bytes, rustix::net::SendFlags::NOSIGNAL) {
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// A connection to a workspace monitor.
#[derive(Debug)]
pub struct MonitorClient {
    reader: BufReader<UnixStream>,
    socket: PathBuf,
}

fn protocol(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

impl MonitorClient {
    /// Connects to the monitor listening at `socket`.
    pub fn connect(socket: &Path) -> io::Result<MonitorClient> {
        let stream = UnixStream::connect(socket)?;
        // The first question about a root waits for its watches to be in place (a walk of the
        // tree); after that, answers take a moment.
        stream.set_read_timeout(Some(Duration::from_secs(300)))?;
        Ok(MonitorClient {
            reader: BufReader::new(stream),
            socket: socket.to_owned(),
        })
    }

    /// Connects to the monitor at `socket`, waiting up to `wait` for one that is starting.
    pub fn connect_waiting(socket: &Path, wait: Duration) -> io::Result<MonitorClient> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            match MonitorClient::connect(socket) {
                Ok(c) => return Ok(c),
                Err(e) if std::time::Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Where it listens.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    fn call(&mut self, request: &Request) -> io::Result<Reply> {
        let mut line = serde_json::to_vec(request).map_err(protocol)?;
        line.push(b'\n');
        send_all(self.reader.get_ref(), &line)?;
        let mut answer = String::new();
        if self.reader.read_line(&mut answer)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the workspace monitor closed the connection",
            ));
        }
        match serde_json::from_str(&answer).map_err(protocol)? {
            Reply::Error { message } => Err(io::Error::other(message)),
            reply => Ok(reply),
        }
    }

    /// The paths changed under `root` (watched with `noise`) since the last acknowledged
    /// capture. Every change made before this call is in the answer or makes it incomplete.
    /// The first question about a root waits for its watches to be placed (a walk of the tree).
    pub fn changes(&mut self, root: &Path, noise: &NoiseRules) -> io::Result<Changes> {
        self.changes_asking(root, noise, false)
    }

    /// [`MonitorClient::changes`] without waiting: while the monitor is still placing the
    /// watches of `root` (it just started, or starts now), the answer is empty and incomplete.
    /// For a command that only reads the history and needs no more than what is known.
    pub fn changes_now(&mut self, root: &Path, noise: &NoiseRules) -> io::Result<Changes> {
        self.changes_asking(root, noise, true)
    }

    fn changes_asking(
        &mut self,
        root: &Path,
        noise: &NoiseRules,
        now: bool,
    ) -> io::Result<Changes> {
        match self.call(&Request::Changes {
            root: root.to_owned(),
            noise: noise.clone(),
            now,
        })? {
            Reply::Changes {
                seq,
                incomplete,
                blind,
                paths,
            } => Ok(Changes {
                seq,
                incomplete,
                blind,
                paths: paths.into_iter().map(WirePath::into_bytes).collect(),
            }),
            other => Err(protocol(format!("unexpected answer {other:?}"))),
        }
    }

    /// Says that everything drained up to `seq` is captured, except `keep` (still pending);
    /// `rescanned` when the capture included a rescan of the whole tree (which gives the root a
    /// baseline, unless events were lost after `seq`).
    pub fn acknowledge(
        &mut self,
        root: &Path,
        seq: u64,
        keep: &BTreeSet<Vec<u8>>,
        rescanned: bool,
    ) -> io::Result<()> {
        self.call(&Request::Ack {
            root: root.to_owned(),
            seq,
            keep: keep.iter().map(|p| WirePath::of(p)).collect(),
            rescanned,
        })
        .map(drop)
    }

    /// Asks the monitor to stop.
    pub fn stop(mut self) -> io::Result<()> {
        self.call(&Request::Stop).map(drop)
    }
}
