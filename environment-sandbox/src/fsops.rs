//! Filesystem calls relative to a tracked root that never leave it.
//!
//! Every path is resolved from the root's directory handle with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS)`, so neither `..` nor a symlink planted by the agent can make a read or a
//! write land outside the root. On kernels without `openat2` the same guarantee comes from
//! walking one component at a time with `O_NOFOLLOW`. The last component of a path is always
//! operated on through its parent's handle (`*at` calls with a plain name).

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags, Stat};

/// The handle of a tracked root.
#[derive(Debug)]
pub struct Root {
    fd: OwnedFd,
    path: PathBuf,
}

fn errno(e: rustix::io::Errno) -> io::Error {
    io::Error::from_raw_os_error(e.raw_os_error())
}

/// Whether an error means "a symlink or `..` was in the way".
pub fn is_escape(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(code) if code == rustix::io::Errno::XDEV.raw_os_error() || code == rustix::io::Errno::LOOP.raw_os_error())
}

impl Root {
    /// Opens the root directory.
    pub fn open(path: &Path) -> io::Result<Root> {
        let fd = rustix::fs::open(
            path,
            OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(errno)?;
        Ok(Root {
            fd,
            path: path.to_owned(),
        })
    }

    /// The root's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens `rel` beneath the root, following no symlink anywhere on the way (the last component
    /// included). A path longer than one system call takes (`PATH_MAX`) is opened a piece at a
    /// time, each piece beneath the directory the last one opened.
    pub fn open_beneath(&self, rel: &Path, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
        let bytes = rel.as_os_str().as_bytes();
        let mut start = 0;
        let mut dir: Option<OwnedFd> = None;
        while bytes.len() - start > PIECE {
            // The longest run of whole components that fits (a name is at most 255 bytes).
            let cut = bytes[start..=start + PIECE]
                .iter()
                .rposition(|b| *b == b'/')
                .filter(|cut| *cut > 0)
                .ok_or_else(|| errno(rustix::io::Errno::NAMETOOLONG))?;
            let piece = Path::new(OsStr::from_bytes(&bytes[start..start + cut]));
            let base = dir.as_ref().map_or(self.fd.as_fd(), |f| f.as_fd());
            dir = Some(beneath(base, piece, OFlags::PATH | OFlags::DIRECTORY, 0)?);
            start += cut + 1;
        }
        let base = dir.as_ref().map_or(self.fd.as_fd(), |f| f.as_fd());
        beneath(
            base,
            Path::new(OsStr::from_bytes(&bytes[start..])),
            flags,
            mode,
        )
    }

    /// The parent directory of `rel` (opened beneath the root) and `rel`'s last component.
    pub fn parent<'p>(&self, rel: &'p Path) -> io::Result<(OwnedFd, &'p OsStr)> {
        let name = rel
            .file_name()
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        let fd = self.open_beneath(parent, OFlags::DIRECTORY | OFlags::RDONLY, 0)?;
        Ok((fd, name))
    }

    /// `lstat` of `rel`, beneath the root.
    pub fn lstat(&self, rel: &Path) -> io::Result<Stat> {
        if rel.as_os_str().is_empty() {
            return rustix::fs::fstat(&self.fd).map_err(errno);
        }
        let (dir, name) = self.parent(rel)?;
        rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(errno)
    }

    /// The target of the symlink `rel`.
    pub fn readlink(&self, rel: &Path) -> io::Result<Vec<u8>> {
        let (dir, name) = self.parent(rel)?;
        Ok(rustix::fs::readlinkat(&dir, name, Vec::new())
            .map_err(errno)?
            .into_bytes())
    }

    /// The names in directory `rel`.
    pub fn list_dir(&self, rel: &Path) -> io::Result<Vec<Vec<u8>>> {
        let fd = self.open_beneath(rel, OFlags::DIRECTORY | OFlags::RDONLY, 0)?;
        list_fd(&fd)
    }

    /// Directory `rel` opened beneath the root, its names, and the `lstat` of each (relative to
    /// the open directory: one path resolution for the whole directory, not one per entry).
    pub fn scan_dir(&self, rel: &Path) -> io::Result<Vec<(Vec<u8>, io::Result<Stat>)>> {
        let fd = self.open_beneath(rel, OFlags::DIRECTORY | OFlags::RDONLY, 0)?;
        let names = list_fd(&fd)?;
        Ok(names
            .into_iter()
            .map(|n| {
                let st =
                    rustix::fs::statat(&fd, n.as_slice(), AtFlags::SYMLINK_NOFOLLOW).map_err(errno);
                (n, st)
            })
            .collect())
    }
}

/// Paths longer than this go to the kernel in pieces: a path argument must stay below
/// `PATH_MAX` (4096 bytes with its terminating NUL).
const PIECE: usize = 3072;

/// Opens `rel` beneath the directory `base`, following no symlink and no `..` on the way.
fn beneath(base: BorrowedFd<'_>, rel: &Path, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
    if rel.as_os_str().is_empty() {
        return rustix::fs::openat(
            base,
            ".",
            flags | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .map_err(errno);
    }
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(
        base,
        rel,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
        resolve,
    ) {
        Err(rustix::io::Errno::NOSYS) => walk_open(base, rel, flags, mode),
        other => other.map_err(errno),
    }
}

/// The fallback for kernels without `openat2`: one component at a time, `O_NOFOLLOW` each.
fn walk_open(base: BorrowedFd<'_>, rel: &Path, flags: OFlags, mode: u32) -> io::Result<OwnedFd> {
    let comps: Vec<&OsStr> = rel.iter().collect();
    let Some((last, dirs)) = comps.split_last() else {
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    };
    let mut cur: Option<OwnedFd> = None;
    for c in dirs {
        if c.as_bytes() == b".." || c.as_bytes() == b"." {
            return Err(errno(rustix::io::Errno::XDEV));
        }
        let at = cur.as_ref().map_or(base, |f| f.as_fd());
        let next = rustix::fs::openat(
            at,
            *c,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            if e == rustix::io::Errno::NOTDIR {
                errno(rustix::io::Errno::XDEV)
            } else {
                errno(e)
            }
        })?;
        cur = Some(next);
    }
    let at = cur.as_ref().map_or(base, |f| f.as_fd());
    rustix::fs::openat(
        at,
        *last,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    )
    .map_err(errno)
}

/// The names in an open directory.
fn list_fd(fd: &OwnedFd) -> io::Result<Vec<Vec<u8>>> {
    let mut dir = rustix::fs::Dir::read_from(fd).map_err(errno)?;
    let mut out = Vec::new();
    while let Some(entry) = dir.read() {
        let entry = entry.map_err(errno)?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(name.to_vec());
        }
    }
    Ok(out)
}

/// The file type bits of a stat.
pub fn file_type(st: &Stat) -> rustix::fs::FileType {
    rustix::fs::FileType::from_raw_mode(st.st_mode)
}

/// Modification time in nanoseconds.
pub fn mtime_ns(st: &Stat) -> i64 {
    st.st_mtime
        .saturating_mul(1_000_000_000)
        .saturating_add(st.st_mtime_nsec as i64)
}

/// Change time in nanoseconds.
pub fn ctime_ns(st: &Stat) -> i64 {
    st.st_ctime
        .saturating_mul(1_000_000_000)
        .saturating_add(st.st_ctime_nsec as i64)
}
