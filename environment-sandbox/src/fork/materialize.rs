//! Writing one version's tree into a fresh directory, once, in parallel.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use environment_core::{ActorId, EntryKind, LocalEnvironment, OpId, Value};
use rustix::fs::{Mode, OFlags};

use crate::capture::KeyMap;
use crate::error::{Result, SandboxError};
use crate::restore::{fill, obtain_contents};

/// Above this many files the writing is spread over threads.
const PARALLEL: usize = 256;

/// The directory holding `version`'s tree under `base_dir`, written on first use.
pub(super) fn materialize(
    env: &LocalEnvironment,
    keys: &KeyMap,
    base_dir: &Path,
    version: &OpId,
) -> Result<PathBuf> {
    let dest = base_dir.join(version.to_string());
    if dest.is_dir() {
        return Ok(dest);
    }
    // Written under a temporary name and renamed: a crash midway leaves only a temporary
    // directory (swept here), never a base that looks complete and is not.
    let tmp = base_dir.join(format!(".tmp-{}-{}", version, std::process::id()));
    super::remove_tree(&tmp)?;
    std::fs::create_dir(&tmp).map_err(SandboxError::io("mkdir", &tmp))?;
    let entries = env.list(&ActorId::system(), &keys.prefix(b"")?, version)?;
    let mut dirs: Vec<(PathBuf, u32)> = Vec::new();
    let mut files: Vec<(PathBuf, Value)> = Vec::new();
    for (key, value) in entries {
        let Some(rel) = keys.rel(&key) else { continue };
        let path = tmp.join(OsStr::from_bytes(rel));
        match value.meta.kind {
            // Created now, given their mode after their content is in (a read-only directory
            // could not be filled).
            EntryKind::Dir => {
                std::fs::create_dir_all(&path).map_err(SandboxError::io("mkdir", &path))?;
                dirs.push((path, value.meta.mode));
            }
            _ => files.push((path, value)),
        }
    }
    // A view records its directories, so parents normally exist already; a parent it lacks is
    // made once.
    let mut made: std::collections::HashSet<&Path> =
        dirs.iter().map(|(p, _)| p.as_path()).collect();
    made.insert(&tmp);
    for (path, _) in &files {
        if let Some(parent) = path.parent()
            && made.insert(parent)
        {
            std::fs::create_dir_all(parent).map_err(SandboxError::io("mkdir", parent))?;
        }
    }
    obtain_contents(env, files.iter().map(|(_, v)| v))?;
    write_all(env, &files)?;
    // Deepest first, so a directory's mode never stops the setting of its children's.
    dirs.sort_by(|a, b| b.0.cmp(&a.0));
    for (path, mode) in dirs {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode & 0o7777))
            .map_err(SandboxError::io("chmod", &path))?;
    }
    match std::fs::rename(&tmp, &dest) {
        Ok(()) => Ok(dest),
        // Another process materialized it first: theirs is as good as ours.
        Err(_) if dest.is_dir() => {
            super::remove_tree(&tmp)?;
            Ok(dest)
        }
        Err(e) => Err(SandboxError::io("rename", &dest)(e)),
    }
}

/// Removes what a materialization killed midway left behind: temporary directories whose
/// process is gone (a live one may still be writing its own).
pub(super) fn sweep(base_dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(base_dir).map_err(SandboxError::io("list", base_dir))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|n| n.starts_with(".tmp-"))
            .and_then(|n| n.rsplit('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            super::remove_tree(&entry.path())?;
        }
    }
    Ok(())
}

fn write_all(env: &LocalEnvironment, files: &[(PathBuf, Value)]) -> Result<()> {
    if files.len() < PARALLEL {
        return files.iter().try_for_each(|(p, v)| write_one(env, p, v));
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(2, 8);
    let chunk = files.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = files
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || part.iter().try_for_each(|(p, v)| write_one(env, p, v)))
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(SandboxError::Watch("a writer thread panicked".into())))
        })
    })
}

/// Writes one entry straight to its place: the directory is private until it is renamed.
fn write_one(env: &LocalEnvironment, path: &Path, v: &Value) -> Result<()> {
    match v.meta.kind {
        EntryKind::Symlink => {
            let target = v.meta.symlink_target.clone().unwrap_or_default();
            std::os::unix::fs::symlink(OsStr::from_bytes(&target), path)
                .map_err(SandboxError::io("symlink", path))
        }
        EntryKind::File => {
            let fd = rustix::fs::open(
                path,
                OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(|e| SandboxError::io("create", path)(e.into()))?;
            fill(env, fd, v, path).map(drop)
        }
        EntryKind::Fifo => rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(v.meta.mode & 0o7777),
            0,
        )
        .map_err(|e| SandboxError::io("mkfifo", path)(e.into())),
        // Devices, sockets and domain objects have no place in a working tree.
        _ => Ok(()),
    }
}
