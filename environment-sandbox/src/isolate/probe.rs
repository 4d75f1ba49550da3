//! Whether the host supports rootless isolation, found by trying: a child process unshares the
//! namespaces, maps its uid, and (as pid 1 of its own pid namespace) mounts a tmpfs, a fresh
//! `/proc` and makes a mount read-only. A refusal becomes [`SandboxError::Isolation`] naming
//! what is missing and how to enable it. The layers that confine the agent further (Landlock,
//! seccomp) are asked of the kernel; one it lacks is named by [`Support::missing_layers`].

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use rustix::fs::{Mode, OFlags};
use rustix::mount::{MountFlags, MountPropagationFlags};
use rustix::thread::UnshareFlags;

use crate::error::{Result, SandboxError};

/// What this host allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Support {
    /// A fresh procfs can be mounted in a new pid namespace (refused in containers whose own
    /// `/proc` is partly masked; the launcher then binds the host's).
    pub fresh_proc: bool,
    /// Resource control through cgroup v2.
    pub cgroup: CgroupSupport,
    /// The Landlock ABI the kernel offers (0: none; writes are then confined by the read-only
    /// mounts alone).
    pub landlock_abi: i32,
    /// Whether the kernel runs seccomp filters (without, the refused system calls rest on the
    /// dropped capabilities alone).
    pub seccomp: bool,
}

impl Support {
    /// The confinement layers this kernel lacks, each with what holds without it; empty when
    /// every layer is on.
    pub fn missing_layers(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if self.landlock_abi == 0 {
            missing.push(
                "Landlock (the kernel offers none: writes are confined by read-only mounts alone)"
                    .to_owned(),
            );
        }
        if !self.seccomp {
            missing.push(
                "seccomp (the kernel runs no filters: the refused system calls rest on the \
                 dropped capabilities alone)"
                    .to_owned(),
            );
        }
        missing
    }
}

/// Whether cgroup v2 limits could be applied.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CgroupSupport {
    /// A cgroup v2 subtree writable by this user (delegated).
    Delegated {
        /// This process's cgroup.
        dir: PathBuf,
        /// The controllers it offers (`cgroup.controllers`).
        controllers: Vec<String>,
    },
    /// Not available, and why.
    Unavailable(String),
}

impl fmt::Display for CgroupSupport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CgroupSupport::Delegated { dir, controllers } => write!(
                f,
                "delegated subtree {} ({})",
                dir.display(),
                controllers.join(" ")
            ),
            CgroupSupport::Unavailable(why) => write!(f, "unavailable ({why})"),
        }
    }
}

/// The stages of the trial, in order.
const USERNS: u8 = 1;
const MAPS: u8 = 2;
const NAMESPACES: u8 = 3;
const FORK: u8 = 4;
const MOUNT: u8 = 5;
const SETATTR: u8 = 6;

/// The probe result, computed once per process.
pub(crate) fn cached() -> Result<Support> {
    static ONCE: OnceLock<std::result::Result<Support, (String, String)>> = OnceLock::new();
    ONCE.get_or_init(|| {
        probe().map_err(|e| match e {
            SandboxError::Isolation { missing, hint } => (missing, hint),
            other => (other.to_string(), String::new()),
        })
    })
    .clone()
    .map_err(|(missing, hint)| SandboxError::Isolation { missing, hint })
}

pub(crate) fn probe() -> Result<Support> {
    let uid_map = format!("0 {} 1\n", rustix::process::geteuid().as_raw());
    let gid_map = format!("0 {} 1\n", rustix::process::getegid().as_raw());
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SandboxError::io("pipe", "probe")(e.into()))?;
    #[allow(unsafe_code)]
    // SAFETY: the child only makes system calls on data prepared before the fork and ends
    // with _exit (see `trial`).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(SandboxError::io("fork", "probe")(io::Error::last_os_error()));
    }
    if pid == 0 {
        drop(r);
        let rec = trial(uid_map.as_bytes(), gid_map.as_bytes());
        let _ = rustix::io::write(&w, &rec);
        #[allow(unsafe_code)]
        // SAFETY: ends the child without running the parent's cleanup.
        unsafe {
            libc::_exit(0)
        }
    }
    drop(w);
    let mut rec = [0u8; 7];
    let mut got = 0;
    while got < rec.len() {
        match rustix::io::read(&r, &mut rec[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => break,
        }
    }
    let mut status = 0;
    #[allow(unsafe_code)]
    // SAFETY: waits for the child forked above; the status goes to a local.
    unsafe {
        libc::waitpid(pid, &mut status, 0);
    }
    if got < rec.len() {
        return Err(SandboxError::Isolation {
            missing: "the isolation probe died before reporting".to_owned(),
            hint: seccomp_hint().unwrap_or_default(),
        });
    }
    let errno = i32::from_ne_bytes([rec[1], rec[2], rec[3], rec[4]]);
    if rec[0] != 0 {
        let (missing, hint) = explain(rec[0], errno);
        return Err(SandboxError::Isolation { missing, hint });
    }
    Ok(Support {
        fresh_proc: rec[5] == 1,
        cgroup: cgroup_support(),
        landlock_abi: super::lockdown::landlock_abi(),
        seccomp: super::lockdown::seccomp_available(),
    })
}

/// The trial, in the forked child: `[failed stage, errno (4 bytes), fresh proc, 0]`.
fn trial(uid_map: &[u8], gid_map: &[u8]) -> [u8; 7] {
    let fail = |stage: u8, e: rustix::io::Errno| {
        let b = e.raw_os_error().to_ne_bytes();
        [stage, b[0], b[1], b[2], b[3], 0, 0]
    };
    #[allow(unsafe_code)]
    // SAFETY: the forked child has a single thread.
    if let Err(e) = unsafe { rustix::thread::unshare_unsafe(UnshareFlags::NEWUSER) } {
        return fail(USERNS, e);
    }
    let write = |path: &std::ffi::CStr, data: &[u8]| -> rustix::io::Result<()> {
        let fd = rustix::fs::open(path, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())?;
        rustix::io::write(&fd, data).map(|_| ())
    };
    if let Err(e) = write(c"/proc/self/setgroups", b"deny")
        .and_then(|()| write(c"/proc/self/uid_map", uid_map))
        .and_then(|()| write(c"/proc/self/gid_map", gid_map))
    {
        return fail(MAPS, e);
    }
    let flags = UnshareFlags::NEWNS
        | UnshareFlags::NEWPID
        | UnshareFlags::NEWUTS
        | UnshareFlags::NEWIPC
        | UnshareFlags::NEWNET;
    #[allow(unsafe_code)]
    // SAFETY: as above.
    if let Err(e) = unsafe { rustix::thread::unshare_unsafe(flags) } {
        return fail(NAMESPACES, e);
    }
    // Mounting procfs needs a process inside the new pid namespace.
    let (r, w) = match rustix::pipe::pipe() {
        Ok(p) => p,
        Err(e) => return fail(FORK, e),
    };
    #[allow(unsafe_code)]
    // SAFETY: single-threaded child; the grandchild makes system calls only and _exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return fail(FORK, rustix::io::Errno::AGAIN);
    }
    if pid == 0 {
        drop(r);
        let rec = mounts();
        let _ = rustix::io::write(&w, &rec);
        #[allow(unsafe_code)]
        // SAFETY: ends the grandchild.
        unsafe {
            libc::_exit(0)
        }
    }
    drop(w);
    let mut rec = [0u8; 7];
    let n = rustix::io::read(&r, &mut rec).unwrap_or(0);
    #[allow(unsafe_code)]
    // SAFETY: reaps the grandchild.
    unsafe {
        let mut st = 0;
        libc::waitpid(pid, &mut st, 0);
    }
    if n < rec.len() {
        return fail(FORK, rustix::io::Errno::CHILD);
    }
    rec
}

/// As pid 1 of the new namespaces: a private tmpfs, a fresh /proc in it, a read-only remount.
fn mounts() -> [u8; 7] {
    let fail = |stage: u8, e: rustix::io::Errno| {
        let b = e.raw_os_error().to_ne_bytes();
        [stage, b[0], b[1], b[2], b[3], 0, 0]
    };
    if let Err(e) = rustix::mount::mount_change(
        c"/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    ) {
        return fail(MOUNT, e);
    }
    let staging = if rustix::fs::stat(c"/tmp").is_ok() {
        c"/tmp"
    } else {
        c"/mnt"
    };
    if let Err(e) = rustix::mount::mount(
        c"tmpfs",
        staging,
        c"tmpfs",
        MountFlags::empty(),
        c"mode=0755",
    ) {
        return fail(MOUNT, e);
    }
    let dir = if staging == c"/tmp" {
        c"/tmp/proc"
    } else {
        c"/mnt/proc"
    };
    let _ = rustix::fs::mkdir(dir, Mode::from_raw_mode(0o755));
    let fresh = rustix::mount::mount(
        c"proc",
        dir,
        c"proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        None,
    )
    .is_ok();
    if let Err(e) = super::child::read_only(staging) {
        return fail(SETATTR, e);
    }
    [0, 0, 0, 0, 0, u8::from(fresh), 0]
}

fn read_sysctl(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

fn seccomp_hint() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let mode = status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp:"))?
        .trim()
        .to_owned();
    (mode == "2").then(|| {
        "this process runs under a seccomp filter (a container runtime's default profile \
         refuses unshare and mount): run the container with a profile that allows them, e.g. \
         `--security-opt seccomp=unconfined`, or use the unconfined launcher"
            .to_owned()
    })
}

/// What is missing and what to do, from the failed stage and errno plus the host's settings.
fn explain(stage: u8, errno: i32) -> (String, String) {
    let err = io::Error::from_raw_os_error(errno);
    let missing = match stage {
        USERNS => format!("creating an unprivileged user namespace was refused ({err})"),
        MAPS => format!("writing the uid/gid map of the new user namespace failed ({err})"),
        NAMESPACES => {
            format!(
                "creating mount/pid/uts/ipc/net namespaces in the user namespace failed ({err})"
            )
        }
        FORK => format!("starting the first process of the new pid namespace failed ({err})"),
        MOUNT => format!("mounting inside the user namespace was refused ({err})"),
        SETATTR => format!("making a mount read-only with mount_setattr failed ({err})"),
        _ => format!("the isolation probe failed ({err})"),
    };
    let mut hints = Vec::new();
    if read_sysctl("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") {
        hints.push(
            "unprivileged user namespaces are disabled by sysctl: \
             `sysctl -w kernel.unprivileged_userns_clone=1`"
                .to_owned(),
        );
    }
    if read_sysctl("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        hints.push(
            "user namespaces are disabled by sysctl: `sysctl -w user.max_user_namespaces=15000`"
                .to_owned(),
        );
    }
    if read_sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1")
    {
        hints.push(
            "AppArmor restricts unprivileged user namespaces \
             (kernel.apparmor_restrict_unprivileged_userns=1): set it to 0, or give this \
             program an AppArmor profile that allows `userns,`"
                .to_owned(),
        );
    }
    if let Some(h) = seccomp_hint() {
        hints.push(h);
    }
    if hints.is_empty() {
        hints.push(match (stage, errno) {
            (USERNS, libc::EINVAL) => {
                "the kernel was built without user namespaces (CONFIG_USER_NS)".to_owned()
            }
            (USERNS, libc::ENOSPC) => {
                "the user namespace limit is reached (user.max_user_namespaces)".to_owned()
            }
            (SETATTR, libc::ENOSYS) => "Linux 5.12 or later is needed (mount_setattr)".to_owned(),
            (MOUNT, _) | (NAMESPACES, _) => "a security module (AppArmor, SELinux) or a \
                 container's seccomp profile refuses it; run outside the container or relax \
                 its profile"
                .to_owned(),
            _ => "use the unconfined launcher on this host".to_owned(),
        });
    }
    (missing, hints.join("; "))
}

/// A writable cgroup v2 subtree of this process, if the host has one.
fn cgroup_support() -> CgroupSupport {
    let Ok(own) = std::fs::read_to_string("/proc/self/cgroup") else {
        return CgroupSupport::Unavailable("no /proc/self/cgroup".to_owned());
    };
    let unified = own.lines().count() == 1;
    let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
        return CgroupSupport::Unavailable("cgroup v1 host".to_owned());
    };
    if !unified {
        let v1: Vec<&str> = own
            .lines()
            .filter_map(|l| l.split(':').nth(1))
            .filter(|c| !c.is_empty())
            .collect();
        return CgroupSupport::Unavailable(format!(
            "hybrid cgroup v1/v2 host: the controllers are bound to cgroup v1 ({})",
            v1.join(", ")
        ));
    }
    let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    if rustix::fs::access(&dir, rustix::fs::Access::WRITE_OK).is_err() {
        return CgroupSupport::Unavailable(format!(
            "{} is not writable by this user (no delegated subtree)",
            dir.display()
        ));
    }
    let controllers = std::fs::read_to_string(dir.join("cgroup.controllers"))
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    CgroupSupport::Delegated { dir, controllers }
}
