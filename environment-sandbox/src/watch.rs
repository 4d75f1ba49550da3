//! The watcher: inotify watches on every directory of a tracked root, turned into a dirty set.
//!
//! A directory is watched before it is scanned, so a file created inside it between the two is
//! seen one way or the other (`mkdir -p a/b/c && echo x > a/b/c/f` is never missed). Renames pair
//! their two halves by cookie; a directory moved in is watched and scanned, one moved out is a
//! deletion. A queue overflow or an exhausted watch limit cannot be recovered from events, so it
//! raises a flag that makes the next capture a rescan against the stat cache.

use std::collections::{BTreeSet, HashMap};
use std::ffi::OsStr;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

use crate::fsops::Root;
use crate::noise::Noise;

/// Directories with paths this long are watched and listed through descriptors: a path given
/// to the kernel must stay below `PATH_MAX`.
const LONG: usize = 3072;

/// Watches one tracked root.
pub struct Watcher {
    inotify: Inotify,
    root: PathBuf,
    /// The root's handle, for directories whose paths are too long for one system call.
    handle: Root,
    noise: Noise,
    paths: HashMap<WatchDescriptor, Vec<u8>>,
    wds: HashMap<Vec<u8>, WatchDescriptor>,
    /// A rescan is needed: the kernel queue overflowed or a watch could not be added.
    pub(crate) needs_rescan: bool,
    /// Directories that could not be watched (the watch limit), their subtrees with them:
    /// while any is left, no dirty set is complete. Retried at every drain.
    unwatched: BTreeSet<Vec<u8>>,
    /// The log has been told that the limit is reached (once for as long as it lasts).
    said_blind: bool,
    buffer: Vec<u8>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher")
            .field("root", &self.root)
            .field("watches", &self.paths.len())
            .finish()
    }
}

fn mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MODIFY
        | WatchMask::CLOSE_WRITE
        | WatchMask::ATTRIB
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::ONLYDIR
        | WatchMask::DONT_FOLLOW
        | WatchMask::EXCL_UNLINK
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        name.to_vec()
    } else {
        [dir, b"/", name].concat()
    }
}

fn under(path: &[u8], dir: &[u8]) -> bool {
    path == dir || (path.starts_with(dir) && path.get(dir.len()) == Some(&b'/'))
}

impl Watcher {
    /// Starts watching `root` (every directory below it that is not ignored).
    pub fn new(root: &Path, noise: Noise) -> io::Result<Watcher> {
        let mut w = Watcher {
            inotify: Inotify::init()?,
            root: root.to_owned(),
            handle: Root::open(root)?,
            noise,
            paths: HashMap::new(),
            wds: HashMap::new(),
            needs_rescan: false,
            unwatched: BTreeSet::new(),
            said_blind: false,
            buffer: vec![0u8; 64 * 1024],
        };
        let mut ignored = BTreeSet::new();
        w.watch_tree(Vec::new(), &mut ignored);
        Ok(w)
    }

    /// The inotify descriptor, for polling.
    pub fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.inotify.as_fd()
    }

    /// How many directories are watched.
    pub fn watched(&self) -> usize {
        self.paths.len()
    }

    /// Why events cannot be complete for as long as it lasts (directories left unwatched by
    /// the watch limit), so that every capture must rescan; `None` when every directory is
    /// watched.
    pub fn blind(&self) -> Option<String> {
        if !self.is_blind() {
            return None;
        }
        let first = self.unwatched.first()?;
        let limit = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_watches")
            .map(|l| format!(" of {}", l.trim()))
            .unwrap_or_default();
        Some(format!(
            "the inotify watch limit is reached ({} watches{limit}; raise fs.inotify.\
             max_user_watches): {} director(ies) are not watched, the first {}",
            self.paths.len(),
            self.unwatched.len(),
            self.root.join(OsStr::from_bytes(first)).display()
        ))
    }

    /// Whether some directory is left unwatched (see [`Watcher::blind`]).
    pub fn is_blind(&self) -> bool {
        !self.unwatched.is_empty()
    }

    /// Tries again to watch the directories the watch limit left out (watches may have been
    /// freed since); what it now watches is marked dirty, as a new directory is.
    fn rewatch(&mut self, dirty: &mut BTreeSet<Vec<u8>>) {
        // A failed retry tells nothing new: it must not ask for another rescan (the periodic
        // one covers the unwatched part).
        let asked = self.needs_rescan;
        let mut left = std::mem::take(&mut self.unwatched).into_iter();
        for dir in left.by_ref() {
            if self.wds.contains_key(&dir) {
                continue;
            }
            let first = dir.clone();
            self.watch_tree(dir, dirty);
            if self.unwatched.contains(&first) {
                // Still at the limit: the rest waits for the next drain.
                self.needs_rescan = asked;
                break;
            }
            if !self.unwatched.is_empty() {
                break;
            }
        }
        self.unwatched.extend(left);
        if self.unwatched.is_empty() {
            self.said_blind = false;
        }
    }

    /// Watches directory `rel` and everything below it, marking every entry found dirty.
    fn watch_tree(&mut self, rel: Vec<u8>, dirty: &mut BTreeSet<Vec<u8>>) {
        let mut stack = vec![rel];
        while let Some(dir) = stack.pop() {
            let abs = self.root.join(OsStr::from_bytes(&dir));
            let long = abs.as_os_str().len() >= LONG;
            match self.add_watch(&abs, &dir, long) {
                Ok(wd) => {
                    if let Some(old) = self.paths.insert(wd.clone(), dir.clone())
                        && old != dir
                    {
                        self.wds.remove(&old);
                    }
                    self.wds.insert(dir.clone(), wd);
                }
                Err(e) if e.raw_os_error() == Some(28) => {
                    // ENOSPC: the watch limit. Nothing below is watched until a retry succeeds,
                    // so no dirty set is complete meanwhile.
                    // Said once when it begins (a retry at every drain would say it again each
                    // time); `blind` says it to the user.
                    if !self.said_blind {
                        tracing::warn!(dir = %abs.display(), "inotify watch limit reached; falling back to rescans");
                        self.said_blind = true;
                    }
                    self.needs_rescan = true;
                    self.unwatched.insert(dir);
                    continue;
                }
                // Gone already, or not a directory any more: its parent's events say so.
                Err(_) => continue,
            }
            for (name, is_dir) in self.entries(&abs, &dir, long) {
                let child = join(&dir, &name);
                if self
                    .noise
                    .is_ignored(Path::new(OsStr::from_bytes(&child)), is_dir)
                {
                    continue;
                }
                dirty.insert(child.clone());
                if is_dir {
                    stack.push(child);
                }
            }
        }
    }

    /// Watches directory `rel`; one whose path is too long for a system call (`long`) through
    /// its handle, opened beneath the root a piece at a time.
    fn add_watch(&mut self, abs: &Path, rel: &[u8], long: bool) -> io::Result<WatchDescriptor> {
        if !long {
            return self.inotify.watches().add(abs, mask());
        }
        let fd = self.handle.open_beneath(
            Path::new(OsStr::from_bytes(rel)),
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY,
            0,
        )?;
        // The descriptor's magic link is followed on purpose: it is the directory just opened
        // without following anything.
        let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
        self.inotify
            .watches()
            .add(&link, mask() & !WatchMask::DONT_FOLLOW)
    }

    /// The names in directory `rel`, and whether each is a directory.
    fn entries(&self, abs: &Path, rel: &[u8], long: bool) -> Vec<(Vec<u8>, bool)> {
        if long {
            return self
                .handle
                .scan_dir(Path::new(OsStr::from_bytes(rel)))
                .map(|names| {
                    names
                        .into_iter()
                        .map(|(name, st)| {
                            let is_dir = st.is_ok_and(|st| {
                                crate::fsops::file_type(&st) == rustix::fs::FileType::Directory
                            });
                            (name, is_dir)
                        })
                        .collect()
                })
                .unwrap_or_default();
        }
        let Ok(entries) = std::fs::read_dir(abs) else {
            return Vec::new();
        };
        entries
            .flatten()
            .map(|e| {
                let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
                (e.file_name().as_bytes().to_vec(), is_dir)
            })
            .collect()
    }

    fn unwatch_tree(&mut self, rel: &[u8]) {
        let gone: Vec<Vec<u8>> = self.wds.keys().filter(|p| under(p, rel)).cloned().collect();
        for p in gone {
            if let Some(wd) = self.wds.remove(&p) {
                self.paths.remove(&wd);
                let _ = self.inotify.watches().remove(wd);
            }
        }
    }

    /// Reads every event the kernel has queued (without waiting) into `dirty`. Returns how many
    /// events were read. Once this returns, every change made before the call is in `dirty`.
    pub fn drain(&mut self, dirty: &mut BTreeSet<Vec<u8>>) -> usize {
        if !self.unwatched.is_empty() {
            self.rewatch(dirty);
        }
        let mut count = 0;
        let mut moves: HashMap<u32, (Vec<u8>, bool)> = HashMap::new();
        loop {
            let mut batch: Vec<(WatchDescriptor, EventMask, u32, Option<Vec<u8>>)> = Vec::new();
            match self.inotify.read_events(&mut self.buffer) {
                Ok(events) => {
                    for e in events {
                        batch.push((
                            e.wd.clone(),
                            e.mask,
                            e.cookie,
                            e.name.map(|n| n.as_bytes().to_vec()),
                        ));
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!(error = %e, "reading inotify events failed; falling back to a rescan");
                    self.needs_rescan = true;
                    break;
                }
            }
            if batch.is_empty() {
                break;
            }
            count += batch.len();
            for (wd, mask, cookie, name) in batch {
                self.handle(wd, mask, cookie, name, dirty, &mut moves);
            }
        }
        // Halves of renames whose other half never came moved out of the tree.
        for (_, (from, is_dir)) in moves {
            if is_dir {
                self.unwatch_tree(&from);
            }
        }
        count
    }

    fn handle(
        &mut self,
        wd: WatchDescriptor,
        mask: EventMask,
        cookie: u32,
        name: Option<Vec<u8>>,
        dirty: &mut BTreeSet<Vec<u8>>,
        moves: &mut HashMap<u32, (Vec<u8>, bool)>,
    ) {
        if mask.contains(EventMask::Q_OVERFLOW) {
            tracing::warn!("inotify queue overflowed; falling back to a rescan");
            self.needs_rescan = true;
            return;
        }
        if mask.contains(EventMask::IGNORED) {
            if let Some(p) = self.paths.remove(&wd)
                && self.wds.get(&p) == Some(&wd)
            {
                self.wds.remove(&p);
            }
            return;
        }
        let Some(dir) = self.paths.get(&wd).cloned() else {
            return;
        };
        let Some(name) = name else { return };
        let child = join(&dir, &name);
        let is_dir = mask.contains(EventMask::ISDIR);
        if self
            .noise
            .is_ignored(Path::new(OsStr::from_bytes(&child)), is_dir)
        {
            return;
        }
        dirty.insert(child.clone());
        if mask.contains(EventMask::MOVED_FROM) {
            moves.insert(cookie, (child, is_dir));
        } else if mask.contains(EventMask::MOVED_TO) {
            if let Some((from, true)) = moves.remove(&cookie) {
                // The watches moved with the directory; their paths did not.
                self.unwatch_paths_only(&from);
            }
            if is_dir {
                self.watch_tree(child, dirty);
            }
        } else if mask.contains(EventMask::CREATE) && is_dir {
            self.watch_tree(child, dirty);
        }
    }

    /// Forgets the paths of watches under `rel` without removing the watches (they now belong to
    /// the directory's new place, which `watch_tree` re-registers).
    fn unwatch_paths_only(&mut self, rel: &[u8]) {
        let gone: Vec<Vec<u8>> = self.wds.keys().filter(|p| under(p, rel)).cloned().collect();
        for p in gone {
            if let Some(wd) = self.wds.remove(&p) {
                self.paths.remove(&wd);
            }
        }
    }
}
