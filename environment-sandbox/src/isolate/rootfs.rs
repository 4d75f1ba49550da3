//! Seeding a managed rootfs: a directory owned by the user that the launcher maps to root
//! inside ([`super::Root::Rootfs`]).

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::error::{Result, SandboxError};

/// Seeds rootfs directories.
///
/// Device nodes, fifos and sockets are skipped (an unprivileged user cannot create device
/// nodes; the launcher provides `/dev`). Hard links and modification times are kept. Ownership is not kept: everything belongs to the user,
/// which is root inside.
#[derive(Clone, Copy, Debug)]
pub struct Rootfs;

impl Rootfs {
    /// Copies the tree at `src` into `dest` (created if missing, else it must be empty):
    /// files with their modes and modification times, hard links as links (as the tar seed
    /// keeps them), directories, symbolic links as they are (never followed). The whole tree is
    /// looked at first: one that this user cannot fully read is refused with
    /// [`SandboxError::SeedUnreadable`] before anything is written. Returns the number of
    /// entries written.
    pub fn seed_from_dir(src: &Path, dest: &Path) -> Result<u64> {
        let entries = survey(src)?;
        empty_dest(dest)?;
        let mut count = 0;
        let mut dirs = Vec::new();
        // The first copy of each inode with several links: the others are links to it.
        let mut linked: HashMap<(u64, u64), PathBuf> = HashMap::new();
        for (rel, meta) in &entries {
            let (from, to) = (src.join(rel), dest.join(rel));
            let ft = meta.file_type();
            if ft.is_dir() {
                std::fs::create_dir(&to).map_err(SandboxError::io("mkdir", &to))?;
                dirs.push((to, meta.clone()));
            } else if ft.is_symlink() {
                let target =
                    std::fs::read_link(&from).map_err(SandboxError::io("readlink", &from))?;
                std::os::unix::fs::symlink(&target, &to)
                    .map_err(SandboxError::io("symlink", &to))?;
                set_times(&to, meta)?;
            } else if ft.is_file() {
                let id = (meta.dev(), meta.ino());
                match linked.get(&id) {
                    Some(first) if meta.nlink() > 1 => {
                        std::fs::hard_link(first, &to).map_err(SandboxError::io("link", &to))?;
                    }
                    _ => {
                        std::fs::copy(&from, &to).map_err(SandboxError::io("copy", &to))?;
                        set_times(&to, meta)?;
                        if meta.nlink() > 1 {
                            linked.insert(id, to.clone());
                        }
                    }
                }
            } else {
                continue;
            }
            count += 1;
        }
        // Directory modes and times last, deepest first, so a read-only directory could still
        // be filled and its time is not moved by what went into it.
        for (dir, meta) in dirs.into_iter().rev() {
            std::fs::set_permissions(&dir, meta.permissions())
                .map_err(SandboxError::io("chmod", &dir))?;
            set_times(&dir, &meta)?;
        }
        Ok(count + confine_package_tools(dest)?)
    }

    /// Unpacks the (uncompressed) tar archive `tarball` into `dest` (created if missing, else it
    /// must be empty), keeping modes and modification times. Every entry is checked before
    /// anything is written: an absolute path, a `..` component or a hard link leading out of
    /// `dest` is refused with [`SandboxError::SeedEntry`]. Returns the number of entries
    /// written.
    pub fn seed_from_tar(tarball: &Path, dest: &Path) -> Result<u64> {
        let mut file = File::open(tarball).map_err(SandboxError::io("open", tarball))?;
        check_tar(&mut file, tarball)?;
        file.rewind().map_err(SandboxError::io("seek", tarball))?;
        empty_dest(dest)?;
        let mut archive = tar::Archive::new(file);
        archive.set_preserve_permissions(true);
        archive.set_preserve_mtime(true);
        archive.set_preserve_ownerships(false);
        let mut count = 0;
        for entry in archive
            .entries()
            .map_err(SandboxError::io("read", tarball))?
        {
            let mut entry = entry.map_err(SandboxError::io("read", tarball))?;
            if skipped(entry.header().entry_type()) {
                continue;
            }
            let path = entry
                .path()
                .map_err(SandboxError::io("read", tarball))?
                .into_owned();
            // unpack_in refuses to write through a symlink that leads out of dest.
            let inside = entry
                .unpack_in(dest)
                .map_err(SandboxError::io("unpack", dest.join(&path)))?;
            if !inside {
                return Err(SandboxError::SeedEntry {
                    entry: path,
                    reason: "leads outside the rootfs",
                });
            }
            count += 1;
        }
        Ok(count + confine_package_tools(dest)?)
    }
}

/// Every entry of the tree at `src` (parents before children) with its `lstat`, after checking
/// that this user can read all of it: each directory listed, each file opened.
fn survey(src: &Path) -> Result<Vec<(PathBuf, std::fs::Metadata)>> {
    let mut entries = Vec::new();
    let mut unreadable: Vec<PathBuf> = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(dir) = stack.pop() {
        let from = src.join(&dir);
        let listing = match std::fs::read_dir(&from) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                unreadable.push(dir);
                continue;
            }
            Err(e) => return Err(SandboxError::io("read_dir", &from)(e)),
        };
        for entry in listing {
            let entry = entry.map_err(SandboxError::io("read_dir", &from))?;
            let rel = dir.join(entry.file_name());
            let path = src.join(&rel);
            let meta =
                std::fs::symlink_metadata(&path).map_err(SandboxError::io("lstat", &path))?;
            if meta.is_dir() {
                stack.push(rel.clone());
            } else if meta.is_file()
                && let Err(e) = File::open(&path)
            {
                if e.kind() != std::io::ErrorKind::PermissionDenied {
                    return Err(SandboxError::io("open", &path)(e));
                }
                unreadable.push(rel);
                continue;
            }
            entries.push((rel, meta));
        }
    }
    if let Some(first) = unreadable.first() {
        return Err(SandboxError::SeedUnreadable {
            count: unreadable.len(),
            first: first.clone(),
        });
    }
    Ok(entries)
}

/// Gives `path` (never followed) the access and modification times of `meta`.
fn set_times(path: &Path, meta: &std::fs::Metadata) -> Result<()> {
    let ts = |secs: i64, nsecs: i64| rustix::fs::Timespec {
        tv_sec: secs,
        tv_nsec: nsecs as _,
    };
    let times = rustix::fs::Timestamps {
        last_access: ts(meta.atime(), meta.atime_nsec()),
        last_modification: ts(meta.mtime(), meta.mtime_nsec()),
    };
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &times,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| SandboxError::io("set the times of", path)(e.into()))
}

/// Where apt is told how to work in the sandbox.
pub const APT_CONFIG: &str = "etc/apt/apt.conf.d/00environment-sandbox";

/// Package managers that switch users must not try: the agent is root inside with one uid and
/// no capability, so apt cannot drop to `_apt` for its downloads. Said once, at seed time, in
/// apt's own configuration (when the rootfs has apt), so that `apt-get` works without flags.
/// Returns the number of files written.
fn confine_package_tools(dest: &Path) -> Result<u64> {
    let conf_dir = dest.join("etc/apt/apt.conf.d");
    if !conf_dir.is_dir() {
        return Ok(0);
    }
    let path = dest.join(APT_CONFIG);
    std::fs::write(
        &path,
        "// Written by environment-sandbox: one uid inside, no capability to switch users.\n\
         APT::Sandbox::User \"root\";\n",
    )
    .map_err(SandboxError::io("write", &path))?;
    Ok(1)
}

fn skipped(kind: tar::EntryType) -> bool {
    matches!(
        kind,
        tar::EntryType::Char | tar::EntryType::Block | tar::EntryType::Fifo
    )
}

/// A relative path of normal components only.
fn contained(p: &Path) -> bool {
    !p.as_os_str().is_empty()
        && p.components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

fn check_tar<R: Read>(reader: R, tarball: &Path) -> Result<()> {
    let mut archive = tar::Archive::new(reader);
    // Symbolic links met so far: a later entry under one would be written through it.
    let mut links = std::collections::HashSet::new();
    for entry in archive
        .entries()
        .map_err(SandboxError::io("read", tarball))?
    {
        let entry = entry.map_err(SandboxError::io("read", tarball))?;
        let path = entry
            .path()
            .map_err(SandboxError::io("read", tarball))?
            .into_owned();
        if !contained(&path) {
            return Err(SandboxError::SeedEntry {
                entry: path,
                reason: "is absolute or contains '..'",
            });
        }
        let path: PathBuf = path
            .components()
            .filter(|c| *c != Component::CurDir)
            .collect();
        if path.ancestors().skip(1).any(|a| links.contains(a)) {
            return Err(SandboxError::SeedEntry {
                entry: path,
                reason: "passes through a symbolic link of the archive",
            });
        }
        if entry.header().entry_type() == tar::EntryType::Symlink {
            links.insert(path.clone());
        }
        if entry.header().entry_type() == tar::EntryType::Link {
            let target = entry
                .link_name()
                .map_err(SandboxError::io("read", tarball))?
                .map(|l| l.into_owned())
                .unwrap_or_default();
            if !contained(&target) {
                return Err(SandboxError::SeedEntry {
                    entry: path,
                    reason: "is a hard link to a path outside the rootfs",
                });
            }
        }
    }
    Ok(())
}

/// `dest` exists afterwards, and was missing or empty.
fn empty_dest(dest: &Path) -> Result<()> {
    match std::fs::read_dir(dest) {
        Ok(mut it) => {
            if it.next().is_some() {
                return Err(SandboxError::InvalidSpec {
                    detail: format!("rootfs destination {} is not empty", dest.display()),
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dest).map_err(SandboxError::io("mkdir", dest))?;
            std::fs::set_permissions(dest, std::fs::Permissions::from_mode(0o755))
                .map_err(SandboxError::io("chmod", dest))
        }
        Err(e) => Err(SandboxError::io("read_dir", dest)(e)),
    }
}
