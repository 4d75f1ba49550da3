//! Restore: bring the live tree to a version, writing only what differs.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{Seek, SeekFrom, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

use environment_core::{Content, EntryKind, KeyChange, LocalEnvironment, OpId, Value};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps};
use serde_like::PlanEntry;

use crate::capture::{Capturer, HARDLINK, UNREADABLE};
use crate::error::{Result, SandboxError};
use crate::fsops;
use crate::noise::Class;
use crate::statcache::StatEntry;

mod serde_like {
    use environment_core::Key;

    /// One path a restore changes.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub enum PlanEntry {
        /// Written (created or replaced) with the target's value.
        Write(Key),
        /// Removed.
        Remove(Key),
    }
}

pub use serde_like::PlanEntry as RestoreStep;

/// What a restore will do (or did).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RestorePlan {
    /// The version restored from (the head after the safety capture).
    pub from: OpId,
    /// The version restored to.
    pub to: OpId,
    /// The paths written or removed: removals deepest first, then directories shallowest
    /// first, then files and symlinks.
    pub steps: Vec<PlanEntry>,
    /// What the restore could not do, and why (a device node without the privilege to make
    /// one): the tree differs from the version there. Empty for a plan not yet applied.
    pub not_restored: Vec<(std::path::PathBuf, String)>,
    /// How many ignored paths go with the directories the target lacks (never captured, so
    /// not among the steps; precious ones are kept and not counted).
    pub ignored_removed: u64,
}

impl RestorePlan {
    /// Takes in the plan of a further tree restored with this one (its steps, what it could
    /// not do, the ignored paths it removes).
    pub(crate) fn absorb(&mut self, other: RestorePlan) {
        self.steps.extend(other.steps);
        self.not_restored.extend(other.not_restored);
        self.ignored_removed += other.ignored_removed;
    }
}

/// Sorts changes in the order a restore applies them: removals deepest first (children before
/// their directory); then directories shallowest first; then files and symlinks, whose
/// directories all exist by then, so they can be written in any order (see `Capturer::apply`).
pub(crate) fn in_plan_order(changes: &mut [KeyChange]) {
    let depth = |c: &KeyChange| c.key.path().iter().filter(|b| **b == b'/').count();
    let not_dir = |c: &KeyChange| {
        c.after
            .as_ref()
            .is_some_and(|v| v.meta.kind != EntryKind::Dir)
    };
    changes.sort_by(|a, b| {
        let (ra, rb) = (a.after.is_none(), b.after.is_none());
        rb.cmp(&ra)
            .then_with(|| not_dir(a).cmp(&not_dir(b)))
            .then_with(|| {
                if ra {
                    depth(b).cmp(&depth(a))
                } else {
                    depth(a).cmp(&depth(b))
                }
            })
            .then_with(|| a.key.cmp(&b.key))
    });
}

static TMP: AtomicU64 = AtomicU64::new(0);

fn errno(e: rustix::io::Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.raw_os_error())
}

impl Capturer {
    /// The restore steps from the version the tree holds to `target`, for the paths of this
    /// root that are not ignored.
    pub(crate) fn plan(&self, target: &OpId) -> Result<(RestorePlan, Vec<KeyChange>)> {
        self.plan_between(self.held()?, target)
    }

    /// The steps that take a tree holding `from` to `target`.
    pub(crate) fn plan_between(
        &self,
        from: OpId,
        target: &OpId,
    ) -> Result<(RestorePlan, Vec<KeyChange>)> {
        let prefix = self.keys.prefix(b"")?;
        let mut changes: Vec<KeyChange> = self
            .env
            .diff(&self.actor, &from, target, Some(&prefix))?
            .into_iter()
            .filter(|c| {
                self.keys.rel(&c.key).is_some_and(|r| {
                    let is_dir = c
                        .after
                        .as_ref()
                        .or(c.before.as_ref())
                        .is_some_and(|v| v.meta.kind == EntryKind::Dir);
                    self.noise.classify(Path::new(OsStr::from_bytes(r)), is_dir) != Class::Ignored
                })
            })
            .collect();
        in_plan_order(&mut changes);
        let steps = changes
            .iter()
            .map(|c| {
                if c.after.is_some() {
                    PlanEntry::Write(c.key.clone())
                } else {
                    PlanEntry::Remove(c.key.clone())
                }
            })
            .collect();
        // Counted under the outermost removed directories only (an inner one is in it).
        let removed_dirs: std::collections::BTreeSet<&[u8]> = changes
            .iter()
            .filter(|c| {
                c.after.is_none()
                    && c.before
                        .as_ref()
                        .is_some_and(|v| v.meta.kind == EntryKind::Dir)
            })
            .filter_map(|c| self.keys.rel(&c.key))
            .collect();
        let outermost = |rel: &[u8]| {
            !rel.iter()
                .enumerate()
                .any(|(i, b)| *b == b'/' && removed_dirs.contains(&rel[..i]))
        };
        let ignored_removed = removed_dirs
            .iter()
            .filter(|rel| outermost(rel))
            .map(|rel| self.ignored_under(Path::new(OsStr::from_bytes(rel))))
            .sum();
        Ok((
            RestorePlan {
                from,
                to: *target,
                steps,
                not_restored: Vec::new(),
                ignored_removed,
            },
            changes,
        ))
    }

    /// How many ignored, not precious paths lie under the directory `dir` on disk: what its
    /// removal takes beyond the captured paths.
    fn ignored_under(&self, dir: &Path) -> u64 {
        let mut count = 0;
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            let Ok(entries) = self.root.scan_dir(&d) else {
                continue;
            };
            for (name, st) in entries {
                let path = d.join(OsStr::from_bytes(&name));
                let is_dir = st
                    .as_ref()
                    .is_ok_and(|st| fsops::file_type(st) == FileType::Directory);
                if self.noise.is_precious(&path, is_dir) {
                    continue;
                }
                if self.noise.is_ignored(&path, is_dir) {
                    count += 1;
                }
                if is_dir {
                    stack.push(path);
                }
            }
        }
        count
    }

    /// Applies `changes` to the live tree; returns the stat-cache updates for what it wrote.
    ///
    /// Changes come in plan order (removals deepest first, then directories shallowest first,
    /// then files and symlinks). The run of file and symlink writes is written in parallel: in
    /// one view no file is another's ancestor, and their directories were written before them.
    pub(crate) fn apply(&self, changes: &[KeyChange]) -> Result<Applied> {
        self.apply_keeping(changes, false)
    }

    /// [`Capturer::apply`] of what others committed into a tree being worked in: a directory
    /// to remove that still holds something the noise rules do not ignore (made here and not
    /// recorded yet) is kept with it, for the next capture, and named in what was not done.
    pub(crate) fn apply_theirs(&self, changes: &[KeyChange]) -> Result<Applied> {
        self.apply_keeping(changes, true)
    }

    fn apply_keeping(&self, changes: &[KeyChange], keep_unrecorded: bool) -> Result<Applied> {
        obtain_contents(&self.env, changes.iter().filter_map(|c| c.after.as_ref()))?;
        let mut cache = Vec::new();
        let mut run: Vec<FileWrite<'_>> = Vec::new();
        let mut links: Vec<FileWrite<'_>> = Vec::new();
        let mut tree = self.tree_writer();
        tree.keep_unrecorded = keep_unrecorded;
        // Read-only directories are written as tar and rsync do: made writable while their
        // contents change, and given their final mode last, deepest first.
        let mut finals = self.open_up_parents(changes)?;
        for c in changes {
            let Some(rel) = self.keys.rel(&c.key) else {
                continue;
            };
            let path = Path::new(OsStr::from_bytes(rel));
            match &c.after {
                // Recorded without its content: whatever is there stays; nothing can be made
                // where nothing is.
                Some(v) if v.meta.attributes.contains_key(UNREADABLE) => {
                    if self.root.lstat(path).is_err() {
                        tree.not_restored
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((
                                path.to_path_buf(),
                                "its content could not be read when it was recorded".into(),
                            ));
                    }
                    continue;
                }
                // A hard link of a group whose first path is another: linked to it once that
                // one is written.
                Some(v)
                    if v.meta
                        .attributes
                        .get(HARDLINK)
                        .is_some_and(|l| l.as_bytes() != rel) =>
                {
                    links.push(FileWrite {
                        rel,
                        v,
                        new: false,
                        patch: None,
                    });
                    continue;
                }
                Some(v) if matches!(v.meta.kind, EntryKind::File | EntryKind::Symlink) => {
                    run.push(FileWrite {
                        rel,
                        v,
                        new: c.before.is_none(),
                        patch: self.patchable(rel, c.before.as_ref(), v)?,
                    });
                    continue;
                }
                _ => tree.write_files(&mut run, &mut cache)?,
            }
            match &c.after {
                None => {
                    finals.remove(rel);
                    if tree.remove(path)? {
                        cache.push((rel.to_vec(), None));
                    }
                }
                Some(v) => {
                    if v.meta.kind == EntryKind::Dir {
                        finals.insert(rel.to_vec(), v.meta.mode & 0o7777);
                    }
                    if let Some(st) = tree.write(&mut Parents::default(), path, v, false)? {
                        cache.push((rel.to_vec(), Some(st)));
                    }
                }
            }
        }
        tree.write_files(&mut run, &mut cache)?;
        tree.write_files(&mut links, &mut cache)?;
        let mut finals: Vec<_> = finals.into_iter().collect();
        finals
            .sort_by_key(|(rel, _)| std::cmp::Reverse(rel.iter().filter(|b| **b == b'/').count()));
        for (rel, mode) in finals {
            let path = Path::new(OsStr::from_bytes(&rel));
            if let Some(st) = self.set_dir_mode(path, mode)? {
                cache.push((rel, Some(st)));
            }
        }
        let not_restored =
            std::mem::take(&mut *tree.not_restored.lock().unwrap_or_else(|p| p.into_inner()));
        Ok(Applied {
            cache,
            not_restored,
        })
    }

    /// Makes every existing directory that a change writes into (or removes from) writable to
    /// its owner for the restore; returns their modes to put back.
    fn open_up_parents(
        &self,
        changes: &[KeyChange],
    ) -> Result<std::collections::BTreeMap<Vec<u8>, u32>> {
        let mut finals = std::collections::BTreeMap::new();
        // Each directory is looked at once, however many of its entries change.
        let mut seen = std::collections::HashSet::new();
        for c in changes {
            let Some(rel) = self.keys.rel(&c.key) else {
                continue;
            };
            let parent = rel
                .iter()
                .rposition(|b| *b == b'/')
                .map_or(&rel[..0], |i| &rel[..i]);
            if !seen.insert(parent) {
                continue;
            }
            let path = Path::new(OsStr::from_bytes(parent));
            let Ok(st) = self.root.lstat(path) else {
                continue;
            };
            if fsops::file_type(&st) == FileType::Directory && st.st_mode & 0o300 != 0o300 {
                self.set_dir_mode(path, (st.st_mode | 0o700) & 0o7777)?;
                finals.insert(parent.to_vec(), st.st_mode & 0o7777);
            }
        }
        Ok(finals)
    }

    /// Sets a directory's mode; its stat after, or `None` when it is gone.
    fn set_dir_mode(&self, path: &Path, mode: u32) -> Result<Option<StatEntry>> {
        let fd = match self
            .root
            .open_beneath(path, OFlags::DIRECTORY | OFlags::RDONLY, 0)
        {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(SandboxError::io("open", path)(e)),
        };
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
            .map_err(|e| SandboxError::io("chmod", path)(errno(e)))?;
        let st = rustix::fs::fstat(&fd).map_err(|e| SandboxError::io("fstat", path)(errno(e)))?;
        Ok(Some(StatEntry::of(&st)))
    }

    /// Drops from `dirty` the paths a restore wrote (or removed) that are still exactly as it
    /// left them: their events were the restore's own.
    pub(crate) fn forget_own_writes(
        &self,
        dirty: &mut std::collections::BTreeSet<Vec<u8>>,
        written: &[(Vec<u8>, Option<StatEntry>)],
    ) {
        let mut parents = Parents::default();
        for (rel, entry) in written {
            if !dirty.contains(rel) {
                continue;
            }
            let now = parents
                .open(&self.root, Path::new(OsStr::from_bytes(rel)))
                .ok()
                .and_then(|(dir, name)| {
                    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok()
                });
            let unchanged = match (entry, now) {
                (Some(e), Some(st)) => *e == StatEntry::of(&st),
                (None, None) => true,
                _ => false,
            };
            if unchanged {
                dirty.remove(rel);
            }
        }
    }

    /// How a chunked file that stays a chunked file can be patched in place: what the version
    /// left has there, and the stat-cache entry that proves the disk still holds it. `None`
    /// for every other file (written whole to a temporary name and renamed over), and for a
    /// hard link (patching one name would change the others).
    fn patchable(
        &self,
        rel: &[u8],
        before: Option<&Value>,
        after: &Value,
    ) -> Result<Option<Patch>> {
        let (Some(b), Content::Chunks(_)) = (before, &after.content) else {
            return Ok(None);
        };
        let Content::Chunks(from) = b.content else {
            return Ok(None);
        };
        let linked = |v: &Value| v.meta.attributes.contains_key(HARDLINK);
        if b.meta.kind != EntryKind::File || linked(b) || linked(after) {
            return Ok(None);
        }
        Ok(self
            .cache
            .lookup(rel)?
            .filter(|seen| seen.links == 1 && seen.size == b.meta.size)
            .map(|seen| Patch { from, seen }))
    }

    fn tree_writer(&self) -> TreeWriter<'_> {
        TreeWriter {
            env: &self.env,
            root: &self.root,
            noise: &self.noise,
            not_restored: std::sync::Mutex::new(Vec::new()),
            keep_unrecorded: false,
        }
    }
}

/// What applying a restore did: the stat-cache updates for what it wrote, and what it could
/// not do.
#[derive(Default)]
pub(crate) struct Applied {
    pub cache: Vec<(Vec<u8>, Option<StatEntry>)>,
    pub not_restored: Vec<(std::path::PathBuf, String)>,
}

/// What writes into the live tree: shareable between threads, so a long run of file writes
/// uses every core.
struct TreeWriter<'a> {
    env: &'a LocalEnvironment,
    root: &'a crate::fsops::Root,
    noise: &'a crate::noise::Noise,
    /// What could not be written, and why.
    not_restored: std::sync::Mutex<Vec<(std::path::PathBuf, String)>>,
    /// Keep a directory to remove that holds what the noise rules do not ignore.
    keep_unrecorded: bool,
}

impl TreeWriter<'_> {
    /// Writes a run of files and symlinks, in parallel when it is long. Each thread takes a
    /// contiguous share of the run, which is in key order, so neighbours share a directory
    /// that it opens once.
    fn write_files(
        &self,
        run: &mut Vec<FileWrite<'_>>,
        cache: &mut Vec<(Vec<u8>, Option<StatEntry>)>,
    ) -> Result<()> {
        const PARALLEL_FROM: usize = 64;
        let threads = if run.len() >= PARALLEL_FROM {
            crate::parallel::threads()
        } else {
            1
        };
        let written =
            crate::parallel::map_with(run, threads, "restore", Parents::default, |parents, w| {
                let path = Path::new(OsStr::from_bytes(w.rel));
                if let Some(patch) = &w.patch
                    && let Some(st) = self.patch(parents, path, w.v, patch)?
                {
                    return Ok(Some(st));
                }
                self.write(parents, path, w.v, w.new)
            })?;
        for (w, st) in run.drain(..).zip(written) {
            if let Some(st) = st {
                cache.push((w.rel.to_vec(), Some(st)));
            }
        }
        Ok(())
    }

    /// Removes a path; a directory only if nothing but removable entries are in it (ignored
    /// content keeps its directory). Whether it is gone.
    fn remove(&self, path: &Path) -> Result<bool> {
        let (dir, name) = match self.root.parent(path) {
            Ok(x) => x,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(true),
            Err(e) if fsops::is_escape(&e) => {
                return Err(SandboxError::Escape {
                    path: path.to_owned(),
                });
            }
            Err(e) => return Err(SandboxError::io("open parent", path)(e)),
        };
        let st = match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => return Ok(true),
            Err(e) => return Err(SandboxError::io("lstat", path)(errno(e))),
        };
        if fsops::file_type(&st) == FileType::Directory {
            match rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(true),
                Err(rustix::io::Errno::NOTEMPTY)
                    if self.keep_unrecorded && self.holds_unrecorded(path) =>
                {
                    self.not_restored
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((
                            path.to_path_buf(),
                            "kept: it holds what was made here and not recorded yet".into(),
                        ));
                    Ok(false)
                }
                // What is left is ignored content (everything tracked under it went first): the
                // target has no such directory, so it goes with it, but for precious paths.
                Err(rustix::io::Errno::NOTEMPTY) => self.remove_tree(&dir, name, path),
                Err(e) => Err(SandboxError::io("rmdir", path)(errno(e))),
            }
        } else {
            match rustix::fs::unlinkat(&dir, name, AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(true),
                Err(e) => Err(SandboxError::io("unlink", path)(errno(e))),
            }
        }
    }

    /// Whether the directory `path` holds an entry the noise rules do not ignore.
    fn holds_unrecorded(&self, path: &Path) -> bool {
        let Ok(entries) = self.root.scan_dir(path) else {
            return true;
        };
        entries.into_iter().any(|(name, st)| {
            let is_dir = st.is_ok_and(|st| fsops::file_type(&st) == FileType::Directory);
            let rel = path.join(OsStr::from_bytes(&name));
            !self.noise.is_ignored(&rel, is_dir)
        })
    }

    /// Removes the directory `name` of `dir` (at `path` under the root) and everything in it,
    /// through directory descriptors (no path is resolved twice, no link followed), keeping
    /// precious paths and the directories that hold them. A read-only directory is made
    /// writable to be emptied. Returns whether it is gone.
    fn remove_tree(&self, dir: &OwnedFd, name: &OsStr, path: &Path) -> Result<bool> {
        let io = |op: &'static str, e: rustix::io::Errno| SandboxError::io(op, path)(errno(e));
        if self.noise.is_precious(path, true) {
            return Ok(false);
        }
        let fd = match rustix::fs::openat(
            dir,
            name,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(true),
            Err(e) => return Err(io("open", e)),
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| io("fstat", e))?;
        if st.st_mode & 0o300 != 0o300 {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode((st.st_mode | 0o700) & 0o7777))
                .map_err(|e| io("chmod", e))?;
        }
        let mut names = Vec::new();
        let entries = rustix::fs::Dir::read_from(&fd).map_err(|e| io("read_dir", e))?;
        for entry in entries {
            let entry = entry.map_err(|e| io("read_dir", e))?;
            let n = entry.file_name().to_bytes();
            if n != b"." && n != b".." {
                names.push((n.to_vec(), entry.file_type()));
            }
        }
        let mut kept = false;
        for (n, kind) in names {
            let child_name = OsStr::from_bytes(&n);
            let child = path.join(child_name);
            if kind == FileType::Directory {
                kept |= !self.remove_tree(&fd, child_name, &child)?;
            } else if self.noise.is_precious(&child, false) {
                kept = true;
            } else {
                match rustix::fs::unlinkat(&fd, child_name, AtFlags::empty()) {
                    Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                    // A directory the listing did not type (some filesystems do not).
                    Err(rustix::io::Errno::ISDIR) => {
                        kept |= !self.remove_tree(&fd, child_name, &child)?;
                    }
                    Err(e) => return Err(SandboxError::io("unlink", &child)(errno(e))),
                }
            }
        }
        if kept {
            return Ok(false);
        }
        match rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(true),
            Err(e) => Err(io("rmdir", e)),
        }
    }

    /// Writes one value: files and symlinks to a temporary name in the same directory, then
    /// renamed over; directories created or their mode set. A file `new` to the tree (absent
    /// from the version left) is created at its name directly when nothing is there: no
    /// reader can see it half-written that could see it before, and a restore cut short is
    /// finished by its intent record, which finds the name taken and writes it over.
    fn write(
        &self,
        parents: &mut Parents,
        path: &Path,
        v: &Value,
        new: bool,
    ) -> Result<Option<StatEntry>> {
        let (dir, name) = match parents.open(self.root, path) {
            Ok(x) => x,
            Err(e) if fsops::is_escape(&e) => {
                return Err(SandboxError::Escape {
                    path: path.to_owned(),
                });
            }
            Err(e) => return Err(SandboxError::io("open parent", path)(e)),
        };
        if new
            && v.meta.kind == EntryKind::File
            && !v.meta.attributes.contains_key(HARDLINK)
            && let Some(st) = self.create_new(dir, name, v, path)?
        {
            return Ok(Some(st));
        }
        let existing = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).ok();
        let existing_dir = existing
            .as_ref()
            .is_some_and(|st| fsops::file_type(st) == FileType::Directory);
        let mode = Mode::from_raw_mode(v.meta.mode & 0o7777);
        match v.meta.kind {
            EntryKind::Dir => {
                if !existing_dir {
                    if existing.is_some() {
                        rustix::fs::unlinkat(dir, name, AtFlags::empty())
                            .map_err(|e| SandboxError::io("unlink", path)(errno(e)))?;
                    }
                    rustix::fs::mkdirat(dir, name, mode)
                        .map_err(|e| SandboxError::io("mkdir", path)(errno(e)))?;
                }
                let fd = rustix::fs::openat(
                    dir,
                    name,
                    OFlags::DIRECTORY | OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| SandboxError::io("open", path)(errno(e)))?;
                // Writable to its owner until its contents are written (see `apply`, which
                // gives it its final mode last).
                let writable = Mode::from_raw_mode((v.meta.mode | 0o700) & 0o7777);
                rustix::fs::fchmod(&fd, writable)
                    .map_err(|e| SandboxError::io("chmod", path)(errno(e)))?;
                let st = rustix::fs::fstat(&fd)
                    .map_err(|e| SandboxError::io("fstat", path)(errno(e)))?;
                return Ok(Some(StatEntry::of(&st)));
            }
            EntryKind::File | EntryKind::Symlink | EntryKind::Fifo => {}
            other @ (EntryKind::Device | EntryKind::Socket) => {
                // A device node or a socket: made where the caller may (mknod), else named.
                let (kind, rdev) = match other {
                    EntryKind::Socket => (FileType::Socket, 0),
                    _ => (
                        if v.meta.attributes.get("type").map(String::as_str) == Some("blockdevice")
                        {
                            FileType::BlockDevice
                        } else {
                            FileType::CharacterDevice
                        },
                        v.meta
                            .attributes
                            .get("rdev")
                            .and_then(|r| r.parse::<u64>().ok())
                            .unwrap_or(0),
                    ),
                };
                if existing.is_some() && !existing_dir {
                    let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
                }
                return match rustix::fs::mknodat(dir, name, kind, mode, rdev) {
                    Ok(()) => {
                        let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
                            .map_err(|e| SandboxError::io("lstat", path)(errno(e)))?;
                        Ok(Some(StatEntry::of(&st)))
                    }
                    Err(e) => {
                        self.not_restored
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .push((
                                path.to_path_buf(),
                                format!("a {other:?} cannot be made here ({})", errno(e)),
                            ));
                        Ok(None)
                    }
                };
            }
            // Not a file system entry (a conflict object, a record): the tree keeps what it
            // has at that path.
            _ => return Ok(None),
        }
        let tmp_name = format!(
            "{}{}-{}",
            crate::noise::RESTORE_TEMP,
            std::process::id(),
            TMP.fetch_add(1, Ordering::Relaxed)
        );
        let tmp = tmp_name.as_str();
        match v.meta.kind {
            EntryKind::Symlink => {
                let target = v.meta.symlink_target.clone().unwrap_or_default();
                rustix::fs::symlinkat(OsStr::from_bytes(&target), dir, tmp)
                    .map_err(|e| SandboxError::io("symlink", path)(errno(e)))?;
                if let Some(ns) = v.meta.mtime_ns {
                    let t = ts(ns);
                    let _ = rustix::fs::utimensat(
                        dir,
                        tmp,
                        &Timestamps {
                            last_access: t,
                            last_modification: t,
                        },
                        AtFlags::SYMLINK_NOFOLLOW,
                    );
                }
            }
            EntryKind::Fifo => {
                rustix::fs::mknodat(dir, tmp, FileType::Fifo, mode, 0)
                    .map_err(|e| SandboxError::io("mkfifo", path)(errno(e)))?;
            }
            _ if self.link_to_first(path, v, dir, tmp)? => {
                if existing.is_some_and(|st| Some(st.st_ino) == self.first_ino(v)) {
                    // Already a link of the group: nothing to do but drop the new name.
                    let _ = rustix::fs::unlinkat(dir, tmp, AtFlags::empty());
                    return Ok(existing.map(|st| StatEntry::of(&st)));
                }
            }
            _ => {
                let fd = rustix::fs::openat(
                    dir,
                    tmp,
                    OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::WRONLY
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o600),
                )
                .map_err(|e| SandboxError::io("create", path)(errno(e)))?;
                if let Err(e) = fill(self.env, fd, v, path) {
                    let _ = rustix::fs::unlinkat(dir, tmp, AtFlags::empty());
                    return Err(e);
                }
            }
        }
        if existing_dir {
            // A directory where the view has a file: it goes with all it holds, but for
            // precious paths (then the rename below fails and says so).
            let _ = self.remove(path);
        }
        rustix::fs::renameat(dir, tmp, dir, name).map_err(|e| {
            let _ = rustix::fs::unlinkat(dir, tmp, AtFlags::empty());
            SandboxError::io("rename", path)(errno(e))
        })?;
        let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| SandboxError::io("lstat", path)(errno(e)))?;
        Ok(Some(StatEntry::of(&st)))
    }
}

/// One file or symlink of a run.
struct FileWrite<'a> {
    rel: &'a [u8],
    v: &'a Value,
    /// Absent from the version the restore leaves.
    new: bool,
    /// A chunked file that may be patched in place.
    patch: Option<Patch>,
}

/// A chunked file on disk, as the version a restore leaves has it.
struct Patch {
    /// Its manifest in that version.
    from: environment_core::Hash,
    /// Its stat-cache entry: the file is patched only while it still matches.
    seen: StatEntry,
}

/// The directory of the last path written, kept open for its neighbours.
#[derive(Default)]
struct Parents {
    last: Option<(std::path::PathBuf, OwnedFd)>,
}

impl Parents {
    /// `path`'s parent, opened beneath the root (or the one already open), and its name.
    fn open<'p>(
        &mut self,
        root: &crate::fsops::Root,
        path: &'p Path,
    ) -> std::io::Result<(&OwnedFd, &'p OsStr)> {
        let name = path
            .file_name()
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        let parent = path.parent().unwrap_or(Path::new(""));
        if self.last.as_ref().is_none_or(|(p, _)| p != parent) {
            let fd = root.open_beneath(parent, OFlags::DIRECTORY | OFlags::RDONLY, 0)?;
            self.last = Some((parent.to_path_buf(), fd));
        }
        let (_, fd) = self
            .last
            .as_ref()
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))?;
        Ok((fd, name))
    }
}

impl TreeWriter<'_> {
    /// Patches a chunked file in place: only the pieces that differ are written, so a
    /// one-byte change to a large file costs about one chunk. `None` when the file is not the
    /// one the stat cache saw (changed since, replaced): it is then written whole. A patch cut
    /// short changes the file's ctime, so the restore's intent record, finishing it, writes the
    /// file whole.
    fn patch(
        &self,
        parents: &mut Parents,
        path: &Path,
        v: &Value,
        patch: &Patch,
    ) -> Result<Option<StatEntry>> {
        let Content::Chunks(to) = &v.content else {
            return Ok(None);
        };
        let Ok((dir, name)) = parents.open(self.root, path) else {
            return Ok(None);
        };
        let Ok(fd) = rustix::fs::openat(
            dir,
            name,
            OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return Ok(None);
        };
        let io = |what| move |e| SandboxError::io(what, path)(errno(e));
        let st = rustix::fs::fstat(&fd).map_err(io("fstat"))?;
        if StatEntry::of(&st) != patch.seen {
            return Ok(None);
        }
        let file = File::from(fd);
        self.env
            .blobs()
            .patch_chunked(&patch.from, to, &file)
            .map_err(environment_core::EnvError::from)?;
        finish_file(&file, v, path)?;
        let st = rustix::fs::fstat(&file).map_err(io("fstat"))?;
        Ok(Some(StatEntry::of(&st)))
    }

    /// Creates a file at `name` in `dir` when nothing is there and fills it; `None` when the
    /// name is taken (then it is written over the usual way).
    fn create_new(
        &self,
        dir: &OwnedFd,
        name: &OsStr,
        v: &Value,
        path: &Path,
    ) -> Result<Option<StatEntry>> {
        let fd = match rustix::fs::openat(
            dir,
            name,
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::EXIST) => return Ok(None),
            Err(e) => return Err(SandboxError::io("create", path)(errno(e))),
        };
        match fill(self.env, fd, v, path) {
            Ok(file) => {
                let st = rustix::fs::fstat(&file)
                    .map_err(|e| SandboxError::io("fstat", path)(errno(e)))?;
                Ok(Some(StatEntry::of(&st)))
            }
            Err(e) => {
                let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
                Err(e)
            }
        }
    }

    /// The inode of the first path of `v`'s hard-link group, as it is on disk.
    fn first_ino(&self, v: &Value) -> Option<u64> {
        let first = v.meta.attributes.get(HARDLINK)?;
        let st = self.root.lstat(Path::new(first.as_str())).ok()?;
        (fsops::file_type(&st) == FileType::RegularFile).then_some(st.st_ino)
    }

    /// Makes `tmp` (in `dir`, beside `name`) a hard link of the first path of `v`'s group, when
    /// `v` is a member of one other than its first and that path holds a regular file of the
    /// group's size (written before the members: see `apply`). False: write the content.
    fn link_to_first(&self, path: &Path, v: &Value, dir: &OwnedFd, tmp: &str) -> Result<bool> {
        let Some(first) = v.meta.attributes.get(HARDLINK) else {
            return Ok(false);
        };
        let first = Path::new(first.as_str());
        if first == path || v.meta.kind != EntryKind::File {
            return Ok(false);
        }
        let Ok((first_dir, first_name)) = self.root.parent(first) else {
            return Ok(false);
        };
        let fits =
            rustix::fs::statat(&first_dir, first_name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
                fsops::file_type(&st) == FileType::RegularFile && st.st_size as u64 == v.meta.size
            });
        Ok(fits && rustix::fs::linkat(&first_dir, first_name, dir, tmp, AtFlags::empty()).is_ok())
    }
}

/// In a working copy of a shared environment, fetches the contents of `values` that this
/// machine lacks, many at a time, before any is written: each file's write then reads its
/// blobs here rather than waiting on a request of its own. A content no machine shared is left
/// for its file's write to report.
pub(crate) fn obtain_contents<'v>(
    env: &LocalEnvironment,
    values: impl IntoIterator<Item = &'v Value>,
) -> Result<()> {
    let blobs = env.blobs();
    if blobs.shared().is_some() {
        blobs
            .obtain_contents(values)
            .map_err(environment_core::EnvError::from)?;
    }
    Ok(())
}

/// Writes a file's content (leaving holes where the content is zeros, so sparse files stay
/// sparse), then its mode (after the content: writing clears setuid) and mtime.
pub(crate) fn fill(env: &LocalEnvironment, fd: OwnedFd, v: &Value, path: &Path) -> Result<File> {
    let mut file = File::from(fd);
    let io = SandboxError::io;
    let bytes = match &v.content {
        Content::Inline(b) => b.clone(),
        Content::Blob(_) => env.content(v)?,
        // Piece by piece, holes as the manifest has them.
        Content::Chunks(m) => {
            env.blobs()
                .write_chunked(m, &file)
                .map_err(environment_core::EnvError::from)?;
            finish_file(&file, v, path)?;
            return Ok(file);
        }
    };
    const CHUNK: usize = 64 << 10;
    let mut pos = 0usize;
    // The file is new and empty: its length needs setting only when it ends in a hole.
    let mut ends_in_hole = false;
    while pos < bytes.len() {
        let end = (pos + CHUNK).min(bytes.len());
        let chunk = &bytes[pos..end];
        ends_in_hole = chunk.iter().all(|b| *b == 0);
        if ends_in_hole {
            file.seek(SeekFrom::Current(chunk.len() as i64))
                .map_err(io("seek", path))?;
        } else {
            file.write_all(chunk).map_err(io("write", path))?;
        }
        pos = end;
    }
    if ends_in_hole {
        file.set_len(bytes.len() as u64)
            .map_err(io("truncate", path))?;
    }
    finish_file(&file, v, path)?;
    Ok(file)
}

/// A written file's mode (after the content: writing clears setuid) and mtime.
fn finish_file(file: &File, v: &Value, path: &Path) -> Result<()> {
    let io = SandboxError::io;
    rustix::fs::fchmod(file.as_fd(), Mode::from_raw_mode(v.meta.mode & 0o7777))
        .map_err(|e| io("chmod", path)(errno(e)))?;
    if let Some(ns) = v.meta.mtime_ns {
        let t = ts(ns);
        rustix::fs::futimens(
            file.as_fd(),
            &Timestamps {
                last_access: t,
                last_modification: t,
            },
        )
        .map_err(|e| io("utimens", path)(errno(e)))?;
    }
    Ok(())
}

fn ts(ns: i64) -> Timespec {
    Timespec {
        tv_sec: ns.div_euclid(1_000_000_000),
        tv_nsec: ns.rem_euclid(1_000_000_000) as _,
    }
}
