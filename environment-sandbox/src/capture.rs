//! Capture: read what changed on disk and commit it as one operation.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::File;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use environment_core::{
    ActRequest, ActorId, Change, Content, EntryKind, Intent, Key, KeyChange, KeyPrefix,
    LocalEnvironment, Meta, Namespace, Observation, OpFlags, OpId, RefusedChange, Value,
    value::INLINE_MAX,
};
use rustix::fs::{FileType, OFlags};

use crate::error::{Result, SandboxError};
use crate::fsops::{self, Root};
use crate::noise::{Class, Noise};
use crate::statcache::{StatCache, StatEntry};

/// Above this many files in one capture, blobs are written without a per-file fsync and the
/// filesystem is synced once before the commit.
const BULK: usize = 32;

/// Files up to this size are read whole before they are stored; larger ones are stored in
/// chunks (see `environment_core::blob::Manifest`).
const IN_MEMORY: u64 = 4 << 20;

/// How often a file that keeps changing while it is read is read again.
const REREADS: usize = 5;

/// Where a tracked root's keys live, and how its paths map to them.
#[derive(Clone, Debug)]
pub struct KeyMap {
    prefix: Vec<u8>,
}

impl KeyMap {
    /// Paths map to `fs:<prefix>/<path>` (to `fs:<path>` with an empty prefix).
    pub fn new(prefix: &[u8]) -> KeyMap {
        KeyMap {
            prefix: prefix.to_vec(),
        }
    }

    /// The key of a path relative to the root.
    pub fn key(&self, rel: &[u8]) -> Result<Key> {
        let mut p = self.prefix.clone();
        if !p.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(rel);
        Ok(Key::fs(p).map_err(environment_core::EnvError::from)?)
    }

    /// The path relative to the root of a key, if it is under this root.
    pub fn rel<'k>(&self, key: &'k Key) -> Option<&'k [u8]> {
        if key.namespace() != Namespace::Fs {
            return None;
        }
        let p = key.path();
        if self.prefix.is_empty() {
            return Some(p);
        }
        p.strip_prefix(self.prefix.as_slice())?.strip_prefix(b"/")
    }

    /// The prefix selecting every key of the root (or of `rel` under it).
    pub fn prefix(&self, rel: &[u8]) -> Result<KeyPrefix> {
        let mut p = self.prefix.clone();
        if !p.is_empty() && !rel.is_empty() {
            p.push(b'/');
        }
        p.extend_from_slice(rel);
        Ok(KeyPrefix::new(Namespace::Fs, p).map_err(environment_core::EnvError::from)?)
    }
}

/// A path and what it looks like now.
type Looked = (Vec<u8>, Seen);

/// What reads the tree during a capture: shareable between threads, so a large capture reads,
/// hashes and stores files on every core.
struct Reader<'a> {
    root: &'a Root,
    noise: &'a Noise,
    blobs: &'a environment_core::BlobStore,
}

impl Reader<'_> {
    /// Looks at every path, in parallel when there are many.
    fn look_all(&self, paths: &[&[u8]], bulk: bool) -> Result<Vec<Looked>> {
        let threads = if bulk { crate::parallel::threads() } else { 1 };
        crate::parallel::map(paths, threads, "capture", |p| {
            Ok((p.to_vec(), self.look(p, bulk)?))
        })
    }

    /// Reads one path: its value, or that it is gone.
    fn look(&self, rel: &[u8], bulk: bool) -> Result<Seen> {
        let path = rel_path(rel);
        let st = match self.root.lstat(path) {
            Ok(st) => st,
            Err(e)
                if e.kind() == std::io::ErrorKind::NotFound
                    || e.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error())
                    || fsops::is_escape(&e) =>
            {
                return Ok(if self.noise.is_ignored(path, false) {
                    Seen::Skipped
                } else {
                    Seen::Gone
                });
            }
            // A directory on the way that may not be searched: the path is not gone, only out
            // of sight for now.
            Err(e) if denied(&e) => return Ok(Seen::Unreadable(e)),
            Err(e) => return Err(SandboxError::io("lstat", path)(e)),
        };
        let ft = fsops::file_type(&st);
        let class = self.noise.classify(path, ft == FileType::Directory);
        if class == Class::Ignored {
            return Ok(Seen::Skipped);
        }
        let mode = st.st_mode & 0o7777;
        let value = match ft {
            FileType::Directory => Value::dir().mode(mode),
            FileType::Symlink => {
                let target = match self.root.readlink(path) {
                    Ok(t) => t,
                    Err(e) if denied(&e) => return Ok(Seen::Unreadable(e)),
                    Err(e) => return Err(SandboxError::io("readlink", path)(e)),
                };
                let mut v = Value::symlink(target);
                v.meta.mtime_ns = Some(fsops::mtime_ns(&st));
                v
            }
            FileType::RegularFile => return self.read_file(path, bulk, class),
            other => {
                let kind = match other {
                    FileType::Fifo => EntryKind::Fifo,
                    FileType::Socket => EntryKind::Socket,
                    _ => EntryKind::Device,
                };
                let mut meta = Meta::of(kind);
                meta.mode = mode;
                meta.attributes
                    .insert("rdev".into(), st.st_rdev.to_string());
                meta.attributes
                    .insert("type".into(), format!("{other:?}").to_lowercase());
                Value {
                    content: Content::Inline(Vec::new()),
                    meta,
                }
            }
        };
        Ok(Seen::Present(value, StatEntry::of(&st), class, 1))
    }

    /// Reads a regular file, again if it changed while being read (fstat before and after).
    fn read_file(&self, path: &Path, bulk: bool, class: Class) -> Result<Seen> {
        let blobs = self.blobs;
        for _ in 0..REREADS {
            // Non-blocking, so a FIFO swapped in after the lstat cannot hang the capture (and
            // the type is checked on what was opened).
            let fd = match self
                .root
                .open_beneath(path, OFlags::RDONLY | OFlags::NONBLOCK, 0)
            {
                Ok(fd) => fd,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Seen::Gone),
                Err(e) if denied(&e) || e.raw_os_error() == Some(libc::ELOOP) => {
                    return Ok(Seen::Unreadable(e));
                }
                Err(e) => return Err(SandboxError::io("open", path)(e)),
            };
            let before =
                rustix::fs::fstat(&fd).map_err(|e| SandboxError::io("fstat", path)(e.into()))?;
            if fsops::file_type(&before) != FileType::RegularFile {
                // Replaced by something else since the lstat: looked at again next time.
                return Ok(Seen::Unreadable(std::io::Error::other(
                    "replaced by another kind of file while being read",
                )));
            }
            let mut file = File::from(fd);
            let size = before.st_size as u64;
            let content = if size as usize <= INLINE_MAX {
                let mut buf = Vec::with_capacity(size as usize);
                file.read_to_end(&mut buf)
                    .map_err(SandboxError::io("read", path))?;
                if buf.len() <= INLINE_MAX {
                    Content::Inline(buf)
                } else {
                    continue;
                }
            } else if size <= IN_MEMORY {
                // Read whole, so the blob is named before it is written (see `BlobStore::put`).
                let mut buf = Vec::with_capacity(size as usize);
                file.read_to_end(&mut buf)
                    .map_err(SandboxError::io("read", path))?;
                let stored = if bulk {
                    blobs.put_unsynced(&buf)
                } else {
                    blobs.put(&buf)
                };
                Content::Blob(stored.map_err(environment_core::EnvError::from)?)
            } else {
                // Larger: in chunks, holes as holes, one chunk in memory at a time.
                let put = blobs
                    .put_chunked(&file, !bulk)
                    .map_err(environment_core::EnvError::from)?;
                Content::Chunks(put.manifest)
            };
            let after =
                rustix::fs::fstat(&file).map_err(|e| SandboxError::io("fstat", path)(e.into()))?;
            if StatEntry::of(&after) != StatEntry::of(&before) {
                continue;
            }
            // Timestamps move in clock ticks, not per write: a file modified within the last
            // tick may have changed while it was read with fstat none the wiser. Such a file is
            // read again and must give the same bytes.
            if is_recent(&after) && !same_content(&mut file, &content, blobs)? {
                continue;
            }
            let mut meta = Meta::of(EntryKind::File);
            meta.mode = before.st_mode & 0o7777;
            meta.size = size;
            meta.mtime_ns = Some(fsops::mtime_ns(&before));
            if (before.st_blocks as u64) * 512 < size {
                meta.attributes.insert("sparse".into(), "true".into());
            }
            return Ok(Seen::Present(
                Value { content, meta },
                StatEntry::of(&before),
                class,
                before.st_nlink,
            ));
        }
        // It keeps changing: leave it for the next capture rather than record a torn read.
        tracing::warn!(path = %path.display(), "file kept changing while being read; will capture it later");
        Ok(Seen::Skipped)
    }
}

/// What a capture committed.
#[derive(Clone, Debug)]
pub struct Captured {
    /// The operation, unless nothing changed.
    pub observation: Option<Observation>,
    /// How many tracked paths (files, directories, links) it created, changed or removed.
    pub files: u64,
    /// The paths it could not read now, and why: neither recorded nor removed (a tracker keeps
    /// them pending and tries again).
    pub unreadable: Vec<(Vec<u8>, String)>,
    /// The paths that can never be recorded (longer than the key limit), and why: refused
    /// alone, while the rest of the capture goes on.
    pub refused: Vec<(Vec<u8>, String)>,
    /// The paths that stayed unreadable past the tracker's bound, and why: recorded with their
    /// metadata and the [`UNREADABLE`] marker instead of their content.
    pub without_content: Vec<(Vec<u8>, String)>,
    /// The changes the actor may not make, or that were stale (the path changed on the branch
    /// since the version the tree held): recorded as refused with the decision (not in the
    /// branch), and put back in the tree to their value at the head.
    pub disallowed: Vec<RefusedChange>,
    /// What others committed on the branch since the version the tree held (another working
    /// copy, or the environment's API), written into the tree after the capture; `None` when
    /// the branch had not moved.
    pub synced: Option<crate::restore::RestorePlan>,
    /// The stat-cache entries of the paths `synced` wrote: their events are the capture's own.
    pub(crate) written: Vec<(Vec<u8>, Option<StatEntry>)>,
}

/// The attribute of a file that is one of several hard links to one inode in the tree: the
/// first of their paths (in byte order), the same in every member's value, so that a restore
/// links them again.
pub const HARDLINK: &str = "hardlink";

/// The attribute of a value recorded without its content, because the path stayed unreadable
/// (a mode-000 file of another user, say); it holds why. A restore leaves such a path as it
/// finds it, and names it when it is missing.
pub const UNREADABLE: &str = "unreadable";

/// What is known of a path that cannot be read: its type, mode and mtime, and the marker.
fn without_content(st: &rustix::fs::Stat, why: &str) -> Value {
    let mode = st.st_mode & 0o7777;
    let mut v = if fsops::file_type(st) == FileType::Directory {
        Value::dir()
    } else {
        Value::file(Vec::new())
    }
    .mode(mode);
    v.meta.mtime_ns = Some(fsops::mtime_ns(st));
    v.meta
        .attributes
        .insert(UNREADABLE.to_owned(), why.to_owned());
    v.meta
        .attributes
        .insert("unreadable_size".to_owned(), st.st_size.to_string());
    v
}

/// Reads `paths` (relative to `root`) as values, in parallel when there are many: `None` for a
/// path that is gone, nothing for an ignored one. For captures of trees that are not watched
/// (a fork's overlay upper layer).
pub(crate) fn read_values(
    root: &Root,
    noise: &Noise,
    blobs: &environment_core::BlobStore,
    paths: Vec<Vec<u8>>,
) -> Result<Vec<(Vec<u8>, Option<Value>)>> {
    let bulk = paths.len() > BULK;
    let reader = Reader { root, noise, blobs };
    let paths: Vec<&[u8]> = paths.iter().map(Vec::as_slice).collect();
    reader
        .look_all(&paths, bulk)?
        .into_iter()
        .filter_map(|(rel, seen)| match seen {
            Seen::Present(v, ..) => Some(Ok((rel, Some(v)))),
            Seen::Gone => Some(Ok((rel, None))),
            Seen::Skipped => None,
            // A fork's layer is read once: what cannot be read is an error, never dropped.
            Seen::Unreadable(e) => Some(Err(SandboxError::io("read", rel_path(&rel))(e))),
        })
        .collect::<Result<_>>()
}

/// Reads changed paths and commits them.
pub struct Capturer {
    /// A file that has stayed unreadable this long (by its ctime: no chmod, no write since) is
    /// recorded without its content instead of waiting on.
    pub(crate) unreadable_after: std::time::Duration,
    pub(crate) env: LocalEnvironment,
    pub(crate) root: Root,
    pub(crate) noise: Noise,
    pub(crate) cache: StatCache,
    pub(crate) keys: KeyMap,
    pub(crate) actor: ActorId,
    pub(crate) branch: String,
}

impl std::fmt::Debug for Capturer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Capturer")
            .field("root", &self.root.path())
            .field("branch", &self.branch)
            .finish()
    }
}

fn rel_path(rel: &[u8]) -> &Path {
    Path::new(std::ffi::OsStr::from_bytes(rel))
}

/// Whether a path is a temporary file of an interrupted restore.
fn is_restore_temp(rel: &[u8]) -> bool {
    rel.rsplit(|b| *b == b'/')
        .next()
        .is_some_and(|n| n.starts_with(crate::noise::RESTORE_TEMP.as_bytes()))
}

/// Whether a file was modified so recently that a write in the same clock tick could follow.
fn is_recent(st: &rustix::fs::Stat) -> bool {
    const TICK_NS: i64 = 50_000_000;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(i64::MAX);
    now - fsops::mtime_ns(st).max(fsops::ctime_ns(st)) < TICK_NS
}

/// Reads the file again from the start and checks it still holds `content`.
fn same_content(
    file: &mut File,
    content: &Content,
    blobs: &environment_core::BlobStore,
) -> Result<bool> {
    use std::io::{Seek, SeekFrom};
    let io = |e: std::io::Error| SandboxError::Io {
        op: "re-read",
        path: std::path::PathBuf::new(),
        source: e,
    };
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    match content {
        Content::Inline(bytes) => {
            let mut again = Vec::with_capacity(bytes.len());
            file.read_to_end(&mut again).map_err(io)?;
            Ok(&again == bytes)
        }
        Content::Blob(hash) => {
            let mut hasher = blake3::Hasher::new();
            std::io::copy(file, &mut hasher).map_err(io)?;
            Ok(hasher.finalize().as_bytes() == &hash.0)
        }
        // Chunked again: what it stores is already there if the file did not change.
        Content::Chunks(manifest) => Ok(blobs
            .put_chunked(file, false)
            .map_err(environment_core::EnvError::from)?
            .manifest
            == *manifest),
    }
}

/// What one path looks like now.
enum Seen {
    Gone,
    /// Its value, its stat, its class, and its link count (a regular file's: more than one
    /// is a hard-link group).
    Present(Value, StatEntry, Class, u64),
    Skipped,
    /// Cannot be read now (a mode-000 file, a directory on the way that may not be searched, a
    /// file swapped for another kind mid-read): neither recorded nor removed, and kept pending.
    Unreadable(std::io::Error),
}

/// Whether an error says "not allowed" rather than "not there".
fn denied(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EACCES) | Some(libc::EPERM))
}

impl Capturer {
    /// The branch head.
    pub fn head(&self) -> Result<OpId> {
        Ok(self.env.head(&self.branch)?)
    }

    /// The version the tree holds (see [`StatCache::holds`]): what captures compare the disk
    /// with and are based on. The head when none is recorded (a tree tracked before the
    /// version it holds was kept), which is then recorded.
    pub(crate) fn held(&self) -> Result<OpId> {
        Ok(self.position()?.0)
    }

    /// The version the tree holds and the branch's head, read once each.
    fn position(&self) -> Result<(OpId, OpId)> {
        let head = self.head()?;
        let Some(held) = self.cache.holds()?.and_then(|v| v.parse::<OpId>().ok()) else {
            self.cache.set_holds(&head.to_string())?;
            return Ok((head, head));
        };
        if held == head || !self.env.is_dropped(&held)? {
            return Ok((held, head));
        }
        // Retention dropped it (on another machine, while this tree was idle): its nearest
        // kept ancestor stands in. What changed between the two is on disk and at the head
        // alike, so the next capture finds nothing to record there (or keeps a change as
        // refused where the head changed it further); a path others added since is in
        // neither, so it is never taken for a deletion. A path recorded once (on disk as the
        // stat cache has it) that neither the head nor the stand-in has was removed by others
        // since: it goes now, since no capture could tell it from one made here.
        let mut at = held;
        while self.env.is_dropped(&at)? {
            let Some(parent) = self.env.op(&at)?.parents.first().copied() else {
                break;
            };
            at = parent;
        }
        self.remove_recorded_outside(&[head, at])?;
        self.cache.move_holds(&held.to_string(), &at.to_string())?;
        Ok((at, head))
    }

    /// Removes from the tree the paths on disk as last captured or written that none of
    /// `versions` has (a directory only once nothing unrecorded is left in it).
    fn remove_recorded_outside(&self, versions: &[OpId]) -> Result<()> {
        let prefix = self.keys.prefix(b"")?;
        let mut known = HashSet::new();
        for v in versions {
            for (k, _) in self.env.list(&self.actor, &prefix, v)? {
                if let Some(rel) = self.keys.rel(&k) {
                    known.insert(rel.to_vec());
                }
            }
        }
        let mut gone = Vec::new();
        for (rel, entry) in self.cache.all()? {
            if !known.contains(rel) && self.stat_now(rel) == Some(*entry) {
                gone.push(KeyChange {
                    key: self.keys.key(rel)?,
                    before: None,
                    after: None,
                });
            }
        }
        crate::restore::in_plan_order(&mut gone);
        self.apply_theirs(&gone)?;
        Ok(())
    }

    /// Whether the branch moved past the version the tree holds (another working copy, or the
    /// environment's API, committed): a capture then writes those changes into the tree.
    pub(crate) fn behind(&self) -> Result<bool> {
        let (held, head) = self.position()?;
        Ok(held != head)
    }

    /// Captures the given paths (relative to the root; anything under a path that is gone is
    /// removed too), attributed to `actor` (default: the tracker's), with `extra` changes (e.g.
    /// a command's output objects) in the same operation. Commits one operation if anything
    /// effectively changed; an operation carrying extra changes is never quiet. What cannot be
    /// read now is returned in [`Captured::unreadable`], neither recorded nor removed.
    pub fn capture_with(
        &mut self,
        dirty: &BTreeSet<Vec<u8>>,
        actor: Option<&ActorId>,
        intent: Intent,
        flags: OpFlags,
        extra: Vec<Change>,
    ) -> Result<Captured> {
        // What others committed since the tree's version: those paths are looked at too, so a
        // change made here to one of them is found (and refused as stale) before the newer
        // value is written over it.
        let (held, now) = self.position()?;
        let (theirs_plan, theirs) = if now == held {
            (None, Vec::new())
        } else {
            let (plan, changes) = self.plan_between(held, &now)?;
            (Some(plan), changes)
        };
        let mut with_theirs;
        let dirty = if theirs.is_empty() {
            dirty
        } else {
            // Only the paths changed here are read: one the tree's version has that is not as
            // last captured or written, one it lacks that is there now (a new working copy
            // misses them all).
            let changed_here = |c: &KeyChange| -> Result<Option<Vec<u8>>> {
                let Some(rel) = self.keys.rel(&c.key) else {
                    return Ok(None);
                };
                let now = self.stat_now(rel);
                let changed = match &c.before {
                    Some(_) => now != self.cache.lookup(rel)?,
                    None => now.is_some(),
                };
                Ok(changed.then(|| rel.to_vec()))
            };
            with_theirs = dirty.clone();
            for c in &theirs {
                with_theirs.extend(changed_here(c)?);
            }
            &with_theirs
        };
        let bulk = dirty.len() > BULK;
        let guard = self
            .env
            .blobs()
            .write_guard()
            .map_err(environment_core::EnvError::from)?;
        let mut changes: BTreeMap<Key, Option<Value>> = BTreeMap::new();
        let mut cache: Vec<(Vec<u8>, Option<StatEntry>)> = Vec::new();
        let mut all_quiet = true;
        let mut unreadable = Vec::new();
        let reader = Reader {
            root: &self.root,
            noise: &self.noise,
            blobs: self.env.blobs(),
        };
        let paths: Vec<&[u8]> = dirty
            .iter()
            .map(Vec::as_slice)
            .filter(|r| !r.is_empty())
            .collect();
        let mut looked = reader.look_all(&paths, bulk)?;
        self.link_groups(&reader, &mut looked, bulk)?;
        let mut refused = Vec::new();
        let mut marked = Vec::new();
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        for (rel, seen) in &looked {
            let key = match self.keys.key(rel) {
                Ok(key) => key,
                Err(e) => {
                    refused.push((rel.clone(), e.to_string()));
                    continue;
                }
            };
            match seen {
                Seen::Skipped => {}
                Seen::Unreadable(e) => {
                    let why = e.to_string();
                    // Unchanged (no chmod, no write) for longer than the bound: it stays so.
                    let stays = self.root.lstat(rel_path(rel)).ok().filter(|st| {
                        now_ns - fsops::ctime_ns(st) >= self.unreadable_after.as_nanos() as i64
                    });
                    match stays {
                        Some(st) => {
                            let value = without_content(&st, &why);
                            if self.env.read_unchecked(&key, &held)?.as_ref() != Some(&value) {
                                all_quiet = false;
                                changes.insert(key, Some(value));
                            }
                            marked.push((rel.clone(), why));
                        }
                        None => unreadable.push((rel.clone(), why)),
                    }
                }
                Seen::Gone => {
                    let prefix = self.keys.prefix(rel)?;
                    for (k, _) in self.env.list(&self.actor, &prefix, &held)? {
                        if let Some(r) = self.keys.rel(&k) {
                            if self.noise.classify(rel_path(r), false) != Class::Quiet {
                                all_quiet = false;
                            }
                            cache.push((r.to_vec(), None));
                        }
                        changes.insert(k, None);
                    }
                    cache.push((rel.clone(), None));
                }
                // As last recorded or written (a restore's own write, seen again through a
                // monitor): unchanged, whatever the tree's version says now.
                Seen::Present(_, stat, ..) if self.cache.lookup(rel)? == Some(*stat) => {}
                Seen::Present(value, stat, class, _) => {
                    let before = self.env.read_unchecked(&key, &held)?;
                    if before.as_ref() != Some(value) {
                        if *class != Class::Quiet {
                            all_quiet = false;
                        }
                        changes.insert(key, Some(value.clone()));
                    }
                    cache.push((rel.clone(), Some(*stat)));
                }
            }
        }
        // A path found again after its parent was removed stays.
        let files = changes.len() as u64;
        let mut changes: Vec<Change> = changes
            .into_iter()
            .map(|(k, v)| match v {
                Some(v) => Change::Put(k, v),
                None => Change::Delete(k),
            })
            .collect();
        let had_extra = !extra.is_empty();
        if had_extra {
            all_quiet = false;
            changes.extend(extra);
        }
        let mut observation = if changes.is_empty() {
            None
        } else {
            if bulk {
                self.env
                    .blobs()
                    .sync()
                    .map_err(environment_core::EnvError::from)?;
            }
            let mut flags = flags;
            if all_quiet {
                flags |= OpFlags::QUIET;
            }
            let mut intent = intent;
            if let Some((first, _)) = marked.first() {
                intent.text = format!(
                    "{} ({} path(s) could not be read and are recorded without content; first: \
                     {})",
                    intent.text,
                    marked.len(),
                    rel_path(first).display()
                );
            }
            // What the actor may not record is kept as refused and put back below, never left
            // in the tree for a later capture to record under another actor.
            // Based on the tree's version: a branch that moved since is rebased onto, and a
            // path changed on both sides is kept as refused (put back below).
            let mut req = ActRequest::new(actor.unwrap_or(&self.actor).clone(), intent)
                .on(self.branch.clone())
                .base(held)
                .flags(flags)
                .recording_refusals();
            req.changes = changes;
            let obs = self.env.act_blocking(req)?;
            Some(obs)
        };
        drop(guard);
        let disallowed = observation
            .as_mut()
            .map(|o| std::mem::take(&mut o.refused))
            .unwrap_or_default();
        let put_back = disallowed
            .iter()
            .filter(|r| self.keys.rel(&r.key).is_some())
            .count();
        let files = files.saturating_sub(put_back as u64);
        // The cache has an entry for every key this capture changed, unless it recorded paths
        // without content or changes of its caller's: then it no longer covers the tree's version.
        let from = held.to_string();
        let to = match &observation {
            None => Some(from.clone()),
            Some(o) if o.noop => Some(from.clone()),
            Some(o) if marked.is_empty() && !had_extra && !o.rebased => Some(o.version.to_string()),
            Some(_) => None,
        };
        if disallowed.is_empty() {
            self.cache
                .update_after(cache, to.as_deref().map(|to| (from.as_str(), to)))?;
        } else {
            // The disk holds what was refused until it is put back: the cache forgets those
            // paths (so each is written whole, never patched from an entry that no longer
            // describes it), learns them again from the writes that put them back, and no
            // longer vouches for the tree's version meanwhile.
            let back: HashSet<&[u8]> = disallowed
                .iter()
                .filter_map(|r| self.keys.rel(&r.key))
                .collect();
            let mut cache: Vec<_> = cache
                .into_iter()
                .filter(|(rel, _)| !back.contains(rel.as_slice()))
                .collect();
            cache.extend(back.iter().map(|rel| (rel.to_vec(), None)));
            self.cache.update_after(cache, None)?;
            self.put_back(&disallowed)?;
        }
        // The version the branch stood at when this capture committed (or at its start, when
        // it committed nothing): what it has beyond the tree's version, others' changes, is
        // written into the tree, which then holds the capture's version.
        let (under, mut holds) = match &observation {
            // Not rebased: committed right on the tree's version.
            Some(o) if !o.noop && !o.rebased => (held, o.version),
            Some(o) if !o.noop => (
                self.env
                    .op(&o.version)?
                    .parents
                    .first()
                    .copied()
                    .unwrap_or(held),
                o.version,
            ),
            Some(o) => (o.version, o.version),
            None => (now, now),
        };
        let (synced, written) = if under == held {
            (None, Vec::new())
        } else {
            let put_back: HashSet<&Key> = disallowed.iter().map(|r| &r.key).collect();
            let (plan, changes) = match theirs_plan {
                Some(plan) if under == now => (plan, theirs),
                _ => self.plan_between(held, &under)?,
            };
            let changes: Vec<KeyChange> = changes
                .into_iter()
                .filter(|c| !put_back.contains(&c.key))
                .collect();
            let (applied, whole) = self.write_theirs(held, holds, &changes)?;
            if !whole {
                // A path changed here while the others' value was written is left for the
                // next capture, which must still compare it with the version it was made on.
                holds = held;
            }
            let plan = crate::restore::RestorePlan {
                not_restored: applied.not_restored,
                ..plan
            };
            (Some(plan), applied.cache)
        };
        // Moved on only from the version this capture started from: another tracker of the
        // same tree that moved it meanwhile is never taken back.
        self.cache
            .move_holds(&held.to_string(), &holds.to_string())?;
        Ok(Captured {
            observation: observation.filter(|o| !o.noop),
            files,
            unreadable,
            refused,
            without_content: marked,
            disallowed,
            synced,
            written,
        })
    }

    /// Writes into the tree the changes others committed since `from` (the version it holds),
    /// under a sync record to `to` (the version the tree then holds) that finishes them if this
    /// process dies mid-way. A path that changed on disk since it was last captured or written
    /// is left alone, for the next capture: the second value says whether none was.
    fn write_theirs(
        &mut self,
        from: OpId,
        to: OpId,
        changes: &[KeyChange],
    ) -> Result<(crate::restore::Applied, bool)> {
        let untouched = self.untouched(changes)?;
        let whole = untouched.len() == changes.len();
        if untouched.is_empty() {
            return Ok((crate::restore::Applied::default(), whole));
        }
        let record = crate::statcache::RestoreIntent {
            target: to.to_string(),
            from: Some(from.to_string()),
            actor: None,
            intent: None,
        };
        self.cache
            .begin_restore(&record, crate::tracker::now_ms())?;
        let applied = self.apply_theirs(&untouched)?;
        self.cache.update(applied.cache.clone())?;
        self.cache.end_restore()?;
        Ok((applied, whole))
    }

    /// The changes whose path is on disk as it was last captured or written (by its stat):
    /// nothing made here is written over. A directory made, removed or given a mode is always
    /// among them (its stat moves with every entry made or removed in it); removing one that
    /// holds something never recorded keeps it (see [`Capturer::apply_theirs`]).
    pub(crate) fn untouched(&self, changes: &[KeyChange]) -> Result<Vec<KeyChange>> {
        /// From this many changes on, the whole cache is loaded once rather than asked for
        /// each path (a new working copy's first sync writes every path).
        const LOAD_FROM: usize = 256;
        let dir_or_none =
            |v: &Option<Value>| v.as_ref().is_none_or(|v| v.meta.kind == EntryKind::Dir);
        let all = if changes.len() >= LOAD_FROM {
            Some(self.cache.all()?)
        } else {
            None
        };
        let mut out = Vec::with_capacity(changes.len());
        for c in changes {
            let Some(rel) = self.keys.rel(&c.key) else {
                continue;
            };
            let only_dirs = dir_or_none(&c.before) && dir_or_none(&c.after);
            let cached = match all {
                Some(all) => all.get(rel).copied(),
                None => self.cache.lookup(rel)?,
            };
            if only_dirs || self.stat_now(rel) == cached {
                out.push(c.clone());
            }
        }
        Ok(out)
    }

    /// The changes of an interrupted sync that are still to do or were done before the
    /// interruption: a path on disk as last captured or written, one holding exactly the value
    /// the sync was writing there (its own write, whose stat the cache had not learnt yet), or
    /// one new to the tree that no capture ever saw (being made by the sync). A path changed
    /// here otherwise is left for the next capture.
    pub(crate) fn resumable(&self, changes: &[KeyChange]) -> Result<Vec<KeyChange>> {
        let mut out = self.untouched(changes)?;
        let kept: HashSet<Key> = out.iter().map(|c| c.key.clone()).collect();
        for c in changes.iter().filter(|c| !kept.contains(&c.key)) {
            let Some(rel) = self.keys.rel(&c.key) else {
                continue;
            };
            // A path new to the tree that no capture ever saw was being made by the sync (a
            // new file is written at its name directly): finished, whatever it holds now.
            let made_by_sync = c.before.is_none() && self.cache.lookup(rel)?.is_none();
            if made_by_sync || self.holds_value(rel, c.after.as_ref()) {
                out.push(c.clone());
            }
        }
        crate::restore::in_plan_order(&mut out);
        Ok(out)
    }

    /// Whether the path holds exactly `value` (`None`: nothing): a file's bytes (see
    /// `same_content`), a symlink's target. Anything else is taken as not.
    fn holds_value(&self, rel: &[u8], value: Option<&Value>) -> bool {
        let path = rel_path(rel);
        let Some(v) = value else {
            return self.root.lstat(path).is_err();
        };
        match v.meta.kind {
            EntryKind::Symlink => self
                .root
                .readlink(path)
                .is_ok_and(|t| Some(t.as_slice()) == v.meta.symlink_target.as_deref()),
            EntryKind::File => self
                .root
                .open_beneath(path, OFlags::RDONLY | OFlags::NONBLOCK, 0)
                .is_ok_and(|fd| {
                    same_content(&mut File::from(fd), &v.content, self.env.blobs()).unwrap_or(false)
                }),
            _ => false,
        }
    }

    /// The stat of a path now, as the cache keeps it; `None` when nothing is there.
    fn stat_now(&self, rel: &[u8]) -> Option<StatEntry> {
        self.root
            .lstat(rel_path(rel))
            .ok()
            .map(|st| StatEntry::of(&st))
    }

    /// Puts the paths of `refused` back to their value at the head they were refused against:
    /// written again, or removed when they did not exist there.
    fn put_back(&mut self, refused: &[RefusedChange]) -> Result<()> {
        let mut changes = Vec::with_capacity(refused.len());
        for r in refused {
            if self.keys.rel(&r.key).is_none() {
                continue; // an object (a command's output), not a path of this tree
            }
            changes.push(KeyChange {
                key: r.key.clone(),
                before: r.value.clone(),
                after: self.env.read_unchecked(&r.key, &r.head)?,
            });
        }
        crate::restore::in_plan_order(&mut changes);
        let applied = self.apply(&changes)?;
        self.cache.update(applied.cache)
    }

    /// Hard links: every path of a group is looked at with any of them (a write through one
    /// changes them all, and inotify names only the path written; a link removed changes the
    /// others' link count), and each member's value names its group by the group's first path.
    fn link_groups(&self, reader: &Reader<'_>, looked: &mut Vec<Looked>, bulk: bool) -> Result<()> {
        let mut more = BTreeSet::new();
        // Inodes whose links may include paths cached with one link only (a link just made to
        // a file captured alone): found by one look at the whole cache.
        let mut unsure = BTreeSet::new();
        for (rel, seen) in looked.iter() {
            let ino = match seen {
                Seen::Present(v, st, _, links) if *links > 1 && v.meta.kind == EntryKind::File => {
                    let cached = self.cache.lookup(rel)?;
                    if cached.is_none_or(|e| e.ino != st.ino || e.links != *links) {
                        unsure.insert(st.ino);
                    }
                    Some(st.ino)
                }
                Seen::Gone => self
                    .cache
                    .lookup(rel)?
                    .filter(|e| {
                        e.links > 1 && FileType::from_raw_mode(e.mode) == FileType::RegularFile
                    })
                    .map(|e| e.ino),
                _ => None,
            };
            if let Some(ino) = ino {
                more.extend(self.cache.paths_with_ino(ino)?);
            }
        }
        if !unsure.is_empty() {
            more.extend(self.cache.paths_of_inodes(&unsure)?);
        }
        if !more.is_empty() {
            // Only when there is a group: a capture without hard links copies no path.
            let known: HashSet<&[u8]> = looked.iter().map(|(p, _)| p.as_slice()).collect();
            more.retain(|p| !known.contains(p.as_slice()));
        }
        if !more.is_empty() {
            let extra: Vec<&[u8]> = more.iter().map(Vec::as_slice).collect();
            let found = reader.look_all(&extra, bulk)?;
            looked.extend(found);
        }
        // Members of one inode: the same inode number, checked on the same device.
        let mut groups: HashMap<(u64, u64), Vec<usize>> = HashMap::new();
        for (i, (rel, seen)) in looked.iter().enumerate() {
            if let Seen::Present(v, st, _, links) = seen
                && *links > 1
                && v.meta.kind == EntryKind::File
                && let Ok(now) = self.root.lstat(rel_path(rel))
                && now.st_ino == st.ino
            {
                groups.entry((now.st_dev, st.ino)).or_default().push(i);
            }
        }
        for members in groups.values().filter(|m| m.len() > 1) {
            let Some(first) = members.iter().map(|i| &looked[*i].0).min().cloned() else {
                continue;
            };
            let label = String::from_utf8_lossy(&first).into_owned();
            for i in members {
                if let Seen::Present(v, ..) = &mut looked[*i].1 {
                    v.meta.attributes.insert(HARDLINK.to_owned(), label.clone());
                }
            }
        }
        Ok(())
    }

    /// Walks the whole tree and returns the paths whose stat differs from the cache, plus those
    /// the cache or the head knows and the disk no longer has. Reads no file content. The walk
    /// goes a level at a time, the directories of a level listed, stat'ed and compared with the
    /// cache on every core.
    pub fn rescan_dirty(&self) -> Result<BTreeSet<Vec<u8>>> {
        /// Below this many directories in a level, threads cost more than they give.
        const PARALLEL_FROM: usize = 8;
        let cache = self.cache.all()?;
        let mut dirty = BTreeSet::new();
        // The cached paths found on disk (the others found are dirty).
        let mut found: Vec<Vec<u8>> = Vec::with_capacity(cache.len());
        let mut level: Vec<Vec<u8>> = vec![Vec::new()];
        while !level.is_empty() {
            let threads = if level.len() >= PARALLEL_FROM {
                crate::parallel::threads()
            } else {
                1
            };
            let (root, noise) = (&self.root, &self.noise);
            let looked = crate::parallel::map(&level, threads, "rescan", |dir| {
                Ok(look_at(root, noise, dir, cache))
            })?;
            let mut next = Vec::new();
            for l in looked {
                dirty.extend(l.dirty);
                next.extend(l.dirs);
                found.extend(l.cached);
            }
            level = next;
        }
        let found: HashSet<&[u8]> = found.iter().map(Vec::as_slice).collect();
        let on_disk = |p: &[u8]| found.contains(p) || dirty.contains(p);
        let mut gone: Vec<Vec<u8>> = Vec::new();
        if found.len() < cache.len() {
            gone.extend(
                cache
                    .keys()
                    .filter(|p| !found.contains(p.as_slice()))
                    .cloned(),
            );
        }
        // A recorded path neither on disk nor in the cache is gone too: the tree's version is
        // listed for them, unless the cache is known to hold every key of it.
        let version = self.held()?;
        let head = version.to_string();
        if !self.cache.covers(&head) {
            let mut covered = true;
            for (k, _) in self
                .env
                .list(&self.actor, &self.keys.prefix(b"")?, &version)?
            {
                if let Some(r) = self.keys.rel(&k) {
                    if !on_disk(r) {
                        gone.push(r.to_vec());
                    }
                    covered &= cache.contains_key(r);
                }
            }
            if covered {
                self.cache.set_covers(&head)?;
            }
        }
        dirty.extend(gone);
        Ok(dirty)
    }
}

/// One directory of a rescan: its entries compared with the cache.
fn look_at(
    root: &Root,
    noise: &Noise,
    dir: &[u8],
    cache: &HashMap<Vec<u8>, StatEntry>,
) -> LevelScan {
    let mut l = LevelScan::default();
    let Ok(entries) = root.scan_dir(rel_path(dir)) else {
        l.dirty.push(dir.to_vec());
        return l;
    };
    for (name, st) in entries {
        let rel = if dir.is_empty() {
            name
        } else {
            [dir, b"/", &name].concat()
        };
        if is_restore_temp(&rel) {
            // Left by a restore that was killed: ours to remove.
            if let Ok((d, n)) = root.parent(rel_path(&rel)) {
                let _ = rustix::fs::unlinkat(&d, n, rustix::fs::AtFlags::empty());
            }
            continue;
        }
        let Ok(st) = st else {
            l.dirty.push(rel);
            continue;
        };
        let is_dir = fsops::file_type(&st) == FileType::Directory;
        if noise.is_ignored_below_kept(rel_path(&rel), is_dir) {
            continue;
        }
        if is_dir {
            l.dirs.push(rel.clone());
        }
        match cache.get(&rel) {
            Some(e) if *e == StatEntry::of(&st) => l.cached.push(rel),
            Some(_) => {
                l.dirty.push(rel.clone());
                l.cached.push(rel);
            }
            None => l.dirty.push(rel),
        }
    }
    l
}

/// What a rescan found in one directory.
#[derive(Default)]
struct LevelScan {
    /// Entries whose stat differs from the cache, or that could not be stat'ed.
    dirty: Vec<Vec<u8>>,
    /// Subdirectories to walk next.
    dirs: Vec<Vec<u8>>,
    /// Entries the cache knows.
    cached: Vec<Vec<u8>>,
}
