//! Seeding a managed rootfs: a directory owned by the user that the launcher maps to root
//! inside ([`super::Root::Rootfs`]).

use std::fs::File;
use std::io::{Read, Seek};
use std::os::unix::fs::PermissionsExt;
use std::path::{Component, Path, PathBuf};

use crate::error::{Result, SandboxError};

/// Seeds rootfs directories.
///
/// Device nodes, fifos and sockets are skipped (an unprivileged user cannot create device
/// nodes; the launcher provides `/dev`). Ownership is not kept: everything belongs to the user,
/// which is root inside.
#[derive(Clone, Copy, Debug)]
pub struct Rootfs;

impl Rootfs {
    /// Copies the tree at `src` into `dest` (created if missing, else it must be empty):
    /// files with their modes, directories, symbolic links as they are (never followed).
    /// Returns the number of entries written.
    pub fn seed_from_dir(src: &Path, dest: &Path) -> Result<u64> {
        empty_dest(dest)?;
        let mut count = 0;
        let mut dirs = Vec::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let from = src.join(&rel);
            let entries = std::fs::read_dir(&from).map_err(SandboxError::io("read_dir", &from))?;
            for entry in entries {
                let entry = entry.map_err(SandboxError::io("read_dir", &from))?;
                let rel = rel.join(entry.file_name());
                let (from, to) = (src.join(&rel), dest.join(&rel));
                let meta =
                    std::fs::symlink_metadata(&from).map_err(SandboxError::io("lstat", &from))?;
                let ft = meta.file_type();
                if ft.is_dir() {
                    std::fs::create_dir(&to).map_err(SandboxError::io("mkdir", &to))?;
                    dirs.push((to, meta.permissions()));
                    stack.push(rel);
                } else if ft.is_symlink() {
                    let target =
                        std::fs::read_link(&from).map_err(SandboxError::io("readlink", &from))?;
                    std::os::unix::fs::symlink(&target, &to)
                        .map_err(SandboxError::io("symlink", &to))?;
                } else if ft.is_file() {
                    std::fs::copy(&from, &to).map_err(SandboxError::io("copy", &to))?;
                } else {
                    continue;
                }
                count += 1;
            }
        }
        // Directory modes last, deepest first, so a read-only directory could still be filled.
        for (dir, perm) in dirs.into_iter().rev() {
            std::fs::set_permissions(&dir, perm).map_err(SandboxError::io("chmod", &dir))?;
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
