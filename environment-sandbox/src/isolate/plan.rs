//! The mount plan: every path and option the sandbox's init needs, computed before the fork so
//! that the child only makes system calls on prepared C strings (no allocation after fork).
//!
//! The child mounts a tmpfs on a staging directory and pivots into it, so the host is at
//! [`OLD`] and the sandbox's root is assembled at [`NEW`]; a final pivot makes [`NEW`] the root
//! and detaches everything else.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::lockdown::{self, LandlockPlan};
use super::probe::Support;
use super::{IsolationSpec, Root, Workspace};
use crate::error::{Result, SandboxError};

/// Where the host's root is while the sandbox's root is assembled.
pub(crate) const OLD: &str = "/oldroot";
/// Where the sandbox's root is assembled.
pub(crate) const NEW: &str = "/newroot";

/// One thing the init does to build the root, in order.
#[derive(Debug)]
pub(crate) enum Step {
    /// `mkdir`, an existing directory is fine.
    Mkdir(CString),
    /// Create an empty file to mount on, an existing one is fine.
    Touch(CString),
    /// A fresh tmpfs.
    Tmpfs {
        target: CString,
        data: CString,
        readonly: bool,
    },
    /// A (recursive) bind mount, optionally made read-only with every submount.
    Bind {
        source: CString,
        target: CString,
        readonly: bool,
        /// Skipped when the source is missing (device nodes a container may lack).
        optional: bool,
    },
    /// An overlay mount.
    Overlay { target: CString, data: CString },
    /// A fresh procfs, or a recursive bind of the host's when refused (or known refused).
    Proc {
        target: CString,
        host: CString,
        fresh: bool,
    },
    /// A private devpts instance; optional.
    Devpts { target: CString },
    /// A symbolic link.
    Symlink { target: CString, link: CString },
}

impl Step {
    /// What the step does, for the message when it fails.
    pub(crate) fn what(&self) -> &'static str {
        match self {
            Step::Mkdir(_) => "create a mount point directory",
            Step::Touch(_) => "create a mount point file",
            Step::Tmpfs { .. } => "mount a tmpfs",
            Step::Bind { .. } => "bind-mount a host path",
            Step::Overlay { .. } => "mount the overlay workspace",
            Step::Proc { .. } => "mount /proc",
            Step::Devpts { .. } => "mount /dev/pts",
            Step::Symlink { .. } => "create a /dev symlink",
        }
    }
}

/// One `setrlimit` for the agent.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rlimit {
    pub resource: rustix::process::Resource,
    pub value: u64,
}

/// Everything the child needs.
#[derive(Debug)]
pub(crate) struct Plan {
    /// The existing host directory the staging tmpfs is mounted on.
    pub staging: CString,
    pub new_root: CString,
    pub old_root: CString,
    /// Written to `/proc/self/uid_map` and `gid_map`: root inside is the caller outside.
    pub uid_map: CString,
    pub gid_map: CString,
    pub steps: Vec<Step>,
    pub hostname: Vec<u8>,
    pub network: bool,
    pub limits: Vec<Rlimit>,
    /// The seccomp programs the agent installs last (empty: the kernel runs no filters).
    pub seccomp: Vec<seccompiler::BpfProgram>,
    /// What Landlock grants, when the kernel offers it.
    pub landlock: Option<LandlockPlan>,
    /// The `cgroup.procs` of the sandbox's cgroup, which `outer` joins first.
    pub cgroup: Option<CString>,
    /// The read end of the caller's lifeline (see `child::lifeline`).
    pub lifeline: std::os::fd::RawFd,
}

pub(crate) fn cstring(what: &str, p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| SandboxError::InvalidSpec {
        detail: format!("{what} {} contains a NUL byte", p.display()),
    })
}

/// `prefix` followed by an absolute path.
fn under(prefix: &str, p: &Path) -> PathBuf {
    let rel = p.strip_prefix("/").unwrap_or(p);
    if rel.as_os_str().is_empty() {
        PathBuf::from(prefix)
    } else {
        Path::new(prefix).join(rel)
    }
}

/// A builder that keeps the C strings and the mkdir chains in one place.
struct Steps {
    steps: Vec<Step>,
}

impl Steps {
    fn c(p: &Path) -> Result<CString> {
        cstring("path", p)
    }

    /// `mkdir -p` of an inside path's ancestors (and the path itself when `dir`), then `touch`
    /// when it is a file.
    fn mount_point(&mut self, inside: &Path, dir: bool) -> Result<()> {
        let mut at = PathBuf::from(NEW);
        let comps: Vec<_> = inside
            .components()
            .filter_map(|c| match c {
                Component::Normal(n) => Some(n),
                _ => None,
            })
            .collect();
        for (i, c) in comps.iter().enumerate() {
            at.push(c);
            if i + 1 < comps.len() || dir {
                self.steps.push(Step::Mkdir(Self::c(&at)?));
            } else {
                self.steps.push(Step::Touch(Self::c(&at)?));
            }
        }
        Ok(())
    }

    fn bind(&mut self, host: &Path, inside: &Path, readonly: bool, optional: bool) -> Result<()> {
        let dir = std::fs::metadata(host).map(|m| m.is_dir()).unwrap_or(true);
        self.mount_point(inside, dir)?;
        self.steps.push(Step::Bind {
            source: Self::c(&under(OLD, host))?,
            target: Self::c(&under(NEW, inside))?,
            readonly,
            optional,
        });
        Ok(())
    }

    fn tmpfs(&mut self, inside: &Path, data: &str, readonly: bool) -> Result<()> {
        self.mount_point(inside, true)?;
        self.steps.push(Step::Tmpfs {
            target: Self::c(&under(NEW, inside))?,
            data: CString::new(data).map_err(|_| SandboxError::InvalidSpec {
                detail: "tmpfs options".to_owned(),
            })?,
            readonly,
        });
        Ok(())
    }

    fn dev(&mut self) -> Result<()> {
        let dev = Path::new("/dev");
        self.tmpfs(dev, "mode=0755", false)?;
        for node in ["null", "zero", "full", "random", "urandom", "tty"] {
            let host = dev.join(node);
            self.mount_point(&host, false)?;
            self.steps.push(Step::Bind {
                source: Self::c(&under(OLD, &host))?,
                target: Self::c(&under(NEW, &host))?,
                readonly: false,
                optional: true,
            });
        }
        for (link, target) in [
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
            ("ptmx", "pts/ptmx"),
        ] {
            self.steps.push(Step::Symlink {
                target: CString::new(target).unwrap_or_default(),
                link: Self::c(&under(NEW, &dev.join(link)))?,
            });
        }
        self.mount_point(&dev.join("pts"), true)?;
        self.steps.push(Step::Devpts {
            target: Self::c(&under(NEW, &dev.join("pts")))?,
        });
        self.tmpfs(&dev.join("shm"), "mode=1777", false)?;
        Ok(())
    }
}

impl Plan {
    pub(crate) fn build(
        spec: &IsolationSpec,
        workspace_inside: &Path,
        support: &Support,
    ) -> Result<Plan> {
        let mut s = Steps { steps: Vec::new() };
        let root = Path::new("/");
        match &spec.root {
            Root::Host => {
                s.steps.push(Step::Bind {
                    source: Steps::c(Path::new(OLD))?,
                    target: Steps::c(Path::new(NEW))?,
                    readonly: true,
                    optional: false,
                });
                s.tmpfs(Path::new("/tmp"), "mode=1777", false)?;
            }
            Root::Rootfs(dir) => {
                s.steps.push(Step::Bind {
                    source: Steps::c(&under(OLD, dir))?,
                    target: Steps::c(Path::new(NEW))?,
                    readonly: false,
                    optional: false,
                });
                s.mount_point(Path::new("/proc"), true)?;
            }
        }
        s.dev()?;
        s.steps.push(Step::Proc {
            target: Steps::c(&under(NEW, Path::new("/proc")))?,
            host: Steps::c(&under(OLD, Path::new("/proc")))?,
            fresh: support.fresh_proc,
        });

        // Binds, parents before children so a child is not hidden by its parent's mount.
        enum Mount<'a> {
            Bind(&'a Path, bool),
            Overlay(&'a Path, &'a Path, &'a Path),
        }
        let mut mounts: Vec<(PathBuf, Mount<'_>)> = Vec::new();
        match &spec.workspace {
            // A rootfs that is its own workspace needs no bind.
            Some(Workspace::Dir(_))
                if matches!(spec.root, Root::Rootfs(_)) && workspace_inside == root => {}
            Some(Workspace::Dir(d)) => {
                mounts.push((workspace_inside.to_path_buf(), Mount::Bind(d, true)));
            }
            Some(Workspace::Overlay { lower, upper, work }) => mounts.push((
                workspace_inside.to_path_buf(),
                Mount::Overlay(lower, upper, work),
            )),
            None => {}
        }
        if matches!(spec.root, Root::Host) {
            for w in &spec.writable {
                mounts.push((w.clone(), Mount::Bind(w, true)));
            }
        }
        for b in &spec.binds {
            mounts.push((b.inside.clone(), Mount::Bind(&b.host, b.writable)));
        }
        mounts.sort_by_key(|(inside, _)| inside.components().count());
        // Landlock grants writes where the mounts do, and nowhere else.
        let mut writable: Vec<PathBuf> = match &spec.root {
            Root::Host => vec![PathBuf::from("/tmp"), PathBuf::from("/dev")],
            Root::Rootfs(_) => vec![PathBuf::from("/")],
        };
        writable.extend(mounts.iter().filter_map(|(inside, m)| match m {
            Mount::Bind(_, true) | Mount::Overlay(..) => Some(inside.clone()),
            Mount::Bind(_, false) => None,
        }));
        if let (Root::Rootfs(_), None) = (&spec.root, &spec.workspace) {
            writable.push(workspace_inside.to_path_buf());
        }
        for (inside, m) in mounts {
            match m {
                Mount::Bind(host, writable) => s.bind(host, &inside, !writable, false)?,
                Mount::Overlay(lower, upper, work) => {
                    s.mount_point(&inside, true)?;
                    let mut data = b"lowerdir=".to_vec();
                    data.extend_from_slice(under(OLD, lower).as_os_str().as_bytes());
                    data.extend_from_slice(b",upperdir=");
                    data.extend_from_slice(under(OLD, upper).as_os_str().as_bytes());
                    data.extend_from_slice(b",workdir=");
                    data.extend_from_slice(under(OLD, work).as_os_str().as_bytes());
                    data.extend_from_slice(b",userxattr");
                    s.steps.push(Step::Overlay {
                        target: Steps::c(&under(NEW, &inside))?,
                        data: CString::new(data).map_err(|_| SandboxError::InvalidSpec {
                            detail: "overlay paths contain a NUL byte".to_owned(),
                        })?,
                    });
                }
            }
        }

        // Masks last, so that a secret under a writable directory is still hidden.
        for m in &spec.masked {
            let on_host = host_path(spec, workspace_inside, m);
            // A link inside a rootfs would be followed from the half-built root: not masked.
            let Ok(meta) = std::fs::symlink_metadata(&on_host) else {
                continue;
            };
            if meta.file_type().is_symlink() {
                continue;
            }
            if meta.is_dir() {
                s.steps.push(Step::Tmpfs {
                    target: Steps::c(&under(NEW, m))?,
                    data: CString::new("mode=0700,size=4k").unwrap_or_default(),
                    readonly: true,
                });
            } else {
                s.steps.push(Step::Bind {
                    source: Steps::c(&under(OLD, Path::new("/dev/null")))?,
                    target: Steps::c(&under(NEW, m))?,
                    readonly: true,
                    optional: false,
                });
            }
        }

        let staging = ["/tmp", "/mnt", "/var/tmp", "/run"]
            .into_iter()
            .find(|p| Path::new(p).is_dir())
            .ok_or_else(|| SandboxError::InvalidSpec {
                detail: "no staging directory (/tmp, /mnt, /var/tmp or /run) on the host"
                    .to_owned(),
            })?;
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        let l = &spec.limits;
        use rustix::process::Resource;
        let limits = [
            (Resource::As, l.address_space),
            (Resource::Cpu, l.cpu_seconds),
            (Resource::Nofile, l.open_files),
            (Resource::Nproc, l.processes),
            (Resource::Fsize, l.file_size),
            (Resource::Core, l.core_size),
        ]
        .into_iter()
        .filter_map(|(resource, v)| v.map(|value| Rlimit { resource, value }))
        .collect();
        Ok(Plan {
            staging: CString::new(staging).unwrap_or_default(),
            new_root: CString::new(format!("{staging}{NEW}")).unwrap_or_default(),
            old_root: CString::new(format!("{staging}{OLD}")).unwrap_or_default(),
            uid_map: CString::new(format!("0 {uid} 1\n")).unwrap_or_default(),
            gid_map: CString::new(format!("0 {gid} 1\n")).unwrap_or_default(),
            steps: s.steps,
            hostname: spec.hostname.as_bytes().to_vec(),
            network: spec.network,
            limits,
            seccomp: if support.seccomp {
                lockdown::seccomp_programs()?
            } else {
                Vec::new()
            },
            landlock: LandlockPlan::new(
                support.landlock_abi,
                writable
                    .iter()
                    .map(|p| cstring("writable path", p))
                    .collect::<Result<_>>()?,
            ),
            cgroup: None,
            lifeline: super::child::lifeline()
                .map_err(|e| SandboxError::io("make the sandbox's lifeline", "pipe")(e))?,
        })
    }
}

/// Where an inside path lives on the host: in the workspace or a bind when it is under one
/// (the last mounted wins, as inside), else in the root.
fn host_path(spec: &IsolationSpec, workspace_inside: &Path, inside: &Path) -> PathBuf {
    let mut mounted: Vec<(&Path, &Path)> = Vec::new();
    if let Some(Workspace::Dir(d)) = &spec.workspace {
        mounted.push((workspace_inside, d));
    }
    mounted.extend(
        spec.binds
            .iter()
            .map(|b| (b.inside.as_path(), b.host.as_path())),
    );
    for (at, host) in mounted.into_iter().rev() {
        if let Ok(rel) = inside.strip_prefix(at) {
            return host.join(rel);
        }
    }
    match &spec.root {
        Root::Host => inside.to_path_buf(),
        Root::Rootfs(dir) => under(&dir.to_string_lossy(), inside),
    }
}
