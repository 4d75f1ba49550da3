//! cgroup v2 limits for a sandbox: memory, processes and CPU bandwidth, which rlimits cannot
//! express for a whole process tree (`RLIMIT_NPROC` counts every process of the host uid,
//! `RLIMIT_AS` each process alone).
//!
//! The limits live in a cgroup of their own, `sandbox-<pid>-<n>`, created under the cgroup this
//! process runs in when that one is delegated to this user (writable, with the controllers in
//! its `cgroup.controllers`). cgroup v2 lets a cgroup hand controllers to its children only while
//! it holds no process itself; when this process is the only one in it (a `systemd-run --scope
//! -p Delegate=yes` or a service with `Delegate=yes`), it first moves itself into a leaf,
//! `supervisor-<pid>`, as delegation asks of its users. Anything else is refused before
//! anything changed, with the reason.
//!
//! The sandbox's first process (`outer`) joins the cgroup before it unshares anything, so every
//! process of the sandbox is in it, the sandbox's own two (`outer` and `init`) included. The
//! agent cannot leave it: the host, `/sys/fs/cgroup` included, is read-only inside. The cgroup
//! is removed when the [`Isolation`](super::Isolation) is dropped; one left by a process that
//! was killed is removed by the next one made in the same place.

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::probe::CgroupSupport;
use crate::error::{Result, SandboxError};

/// The cgroup v2 limits of a sandbox, shared by every process in it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    /// Memory in bytes (`memory.max`; swap is then refused too, `memory.swap.max` = 0): past
    /// it, the kernel reclaims and then kills the largest process of the sandbox.
    pub memory: Option<u64>,
    /// Processes and threads at once (`pids.max`), the sandbox's own two included: past it,
    /// `fork` and `clone` fail with `EAGAIN`.
    pub processes: Option<u64>,
    /// CPU bandwidth in thousandths of a CPU (`cpu.max`; 1500 = one and a half CPUs): past it,
    /// the sandbox's processes wait for the next period.
    pub cpu_millis: Option<u64>,
}

impl CgroupLimits {
    /// Whether any limit is asked.
    pub fn any(&self) -> bool {
        self.memory.is_some() || self.processes.is_some() || self.cpu_millis.is_some()
    }

    /// The controllers the limits need, and what to write in which file.
    fn files(&self) -> Vec<(&'static str, &'static str, String)> {
        let mut files = Vec::new();
        if let Some(bytes) = self.memory {
            files.push(("memory", "memory.max", bytes.to_string()));
            files.push(("memory", "memory.swap.max", "0".to_owned()));
        }
        if let Some(n) = self.processes {
            files.push(("pids", "pids.max", n.to_string()));
        }
        if let Some(millis) = self.cpu_millis {
            files.push(("cpu", "cpu.max", cpu_max(millis)));
        }
        files
    }
}

impl std::fmt::Display for CgroupLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if let Some(bytes) = self.memory {
            parts.push(if bytes % (1 << 20) == 0 {
                format!("memory {} MiB", bytes >> 20)
            } else {
                format!("memory {bytes} bytes")
            });
        }
        if let Some(n) = self.processes {
            parts.push(format!("{n} processes"));
        }
        if let Some(m) = self.cpu_millis {
            parts.push(format!("{}.{:03} CPUs", m / 1000, m % 1000));
        }
        f.write_str(&parts.join(", "))
    }
}

/// The period of `cpu.max`, in microseconds (the kernel's default).
const CPU_PERIOD: u64 = 100_000;

/// `cpu.max` for `millis` thousandths of a CPU: the quota per period, never below the kernel's
/// least (1 ms).
fn cpu_max(millis: u64) -> String {
    let quota = millis.saturating_mul(CPU_PERIOD / 1000).max(1000);
    format!("{quota} {CPU_PERIOD}")
}

/// A sandbox's cgroup, removed when dropped.
#[derive(Debug)]
pub(crate) struct Cgroup {
    dir: PathBuf,
}

fn refused(why: impl Into<String>) -> SandboxError {
    SandboxError::Cgroup { why: why.into() }
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    // The interface files exist already: never create one in a directory that is not a cgroup.
    use std::io::Write;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(value.as_bytes())
}

fn words(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

impl Cgroup {
    /// Makes the cgroup for `limits` under the delegated subtree, or says why it cannot.
    pub(crate) fn create(support: &CgroupSupport, limits: &CgroupLimits) -> Result<Cgroup> {
        let (base, offered) = match support {
            CgroupSupport::Delegated { dir, controllers } => (dir, controllers),
            CgroupSupport::Unavailable(why) => return Err(refused(why.clone())),
        };
        let files = limits.files();
        let mut needed: Vec<&str> = files.iter().map(|(c, _, _)| *c).collect();
        needed.dedup();
        if let Some(c) = needed.iter().find(|c| !offered.iter().any(|o| o == *c)) {
            return Err(refused(format!(
                "the {c} controller is not delegated to {} (its cgroup.controllers: {})",
                base.display(),
                offered.join(" ")
            )));
        }
        enable(base, &needed)?;
        reap_stale(base);
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let dir = base.join(format!(
            "sandbox-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&dir).map_err(|e| refused(format!("mkdir {}: {e}", dir.display())))?;
        let cgroup = Cgroup { dir };
        for (_, file, value) in &files {
            let path = cgroup.dir.join(file);
            match write(&path, value) {
                Ok(()) => {}
                // Without swap accounting there is no swap to refuse.
                Err(e) if *file == "memory.swap.max" && e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(refused(format!("write {value} to {}: {e}", path.display())));
                }
            }
        }
        Ok(cgroup)
    }

    /// The file `outer` writes itself into.
    pub(crate) fn procs(&self) -> Result<CString> {
        super::plan::cstring("cgroup", &self.dir.join("cgroup.procs"))
    }

    /// Where the cgroup is.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // The processes of a pid namespace are gone a moment after its init; the cgroup can
        // be removed once they are.
        for _ in 0..50 {
            match std::fs::remove_dir(&self.dir) {
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                _ => return,
            }
        }
    }
}

/// Hands `needed` to the children of `base`. cgroup v2 allows that only while `base` holds no
/// process; when this process is the only one there, it moves into a leaf of its own first.
fn enable(base: &Path, needed: &[&str]) -> Result<()> {
    let control = base.join("cgroup.subtree_control");
    let on = words(&control);
    let missing: Vec<String> = needed
        .iter()
        .filter(|c| !on.iter().any(|o| o == *c))
        .map(|c| format!("+{c}"))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let ask = missing.join(" ");
    match write(&control, &ask) {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {}
        Err(e) => {
            return Err(refused(format!(
                "write {ask} to {}: {e}",
                control.display()
            )));
        }
    }
    let me = std::process::id().to_string();
    let procs = words(&base.join("cgroup.procs"));
    if procs.iter().any(|p| *p != me) {
        return Err(refused(format!(
            "{} holds other processes ({}), so cgroup v2 cannot hand its controllers to a \
             sandbox's cgroup; run in a cgroup of its own with the controllers delegated (e.g. \
             systemd-run --user --scope -p Delegate=yes envctl …)",
            base.display(),
            procs.len()
        )));
    }
    let leaf = base.join(format!("supervisor-{me}"));
    match std::fs::create_dir(&leaf) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(refused(format!("mkdir {}: {e}", leaf.display()))),
    }
    write(&leaf.join("cgroup.procs"), &me)
        .and_then(|()| write(&control, &ask))
        .map_err(|e| refused(format!("move this process into {}: {e}", leaf.display())))
}

/// Removes the cgroups of processes that are gone (a `rmdir` of a cgroup that still holds a
/// process fails, so a live one is never touched).
fn reap_stale(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| {
            n.strip_prefix("sandbox-")
                .and_then(|r| r.split('-').next())
                .or_else(|| n.strip_prefix("supervisor-"))
        }) else {
            continue;
        };
        if pid != std::process::id().to_string() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_bandwidth_is_a_quota_per_period() {
        assert_eq!(cpu_max(1500), "150000 100000");
        assert_eq!(cpu_max(1000), "100000 100000");
        assert_eq!(cpu_max(1), "1000 100000");
    }

    #[test]
    fn each_limit_names_its_controller() {
        let l = CgroupLimits {
            memory: Some(64 << 20),
            processes: Some(32),
            cpu_millis: None,
        };
        let files = l.files();
        assert_eq!(
            files,
            vec![
                ("memory", "memory.max", (64u64 << 20).to_string()),
                ("memory", "memory.swap.max", "0".to_owned()),
                ("pids", "pids.max", "32".to_owned()),
            ]
        );
        assert!(!CgroupLimits::default().any());
    }

    #[test]
    fn an_unavailable_subtree_is_refused_with_its_reason() {
        let err = Cgroup::create(
            &CgroupSupport::Unavailable("cgroup v1 host".to_owned()),
            &CgroupLimits {
                processes: Some(8),
                ..CgroupLimits::default()
            },
        )
        .unwrap_err();
        assert!(matches!(err, SandboxError::Cgroup { why } if why == "cgroup v1 host"));
    }

    #[test]
    fn a_directory_that_is_not_a_cgroup_gets_nothing_written() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup.subtree_control"), "memory pids cpu").unwrap();
        let err = Cgroup::create(
            &CgroupSupport::Delegated {
                dir: dir.path().to_path_buf(),
                controllers: vec!["pids".to_owned()],
            },
            &CgroupLimits {
                processes: Some(8),
                ..CgroupLimits::default()
            },
        )
        .unwrap_err();
        assert!(matches!(err, SandboxError::Cgroup { .. }));
        // The sandbox's directory was made, refused its limit file and is gone again.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
