//! Rootless isolation: the [`Launcher`] that runs an agent's program in its own user, mount, pid,
//! uts and ipc namespaces (and optionally its own network namespace), with no setuid helper, no
//! FUSE and no capability in the initial namespace.
//!
//! The agent sees one of two roots:
//! - [`Root::Host`]: the host filesystem, read-only (every submount too), with the workspace, the
//!   declared writable directories and the extra binds on top, a private `/tmp`, a minimal `/dev`
//!   and a fresh `/proc`; secret paths are masked.
//! - [`Root::Rootfs`]: a directory owned by the user (see [`Rootfs`] to seed one), mapped to root
//!   inside and fully writable, so an agent can install packages and break global config while a
//!   tracker on that directory captures every change.
//!
//! # Process tree
//!
//! ```text
//! caller ── spawns ──▶ outer   (the Child's pid; outside the sandbox's pid namespace)
//!                        └──▶ init    (pid 1 inside: builds the root, reaps orphans)
//!                               └──▶ agent (pid 2 inside: the command's program)
//! ```
//!
//! `outer` forwards the signals sent to it (by `kill`, not those a terminal sends to its whole
//! process group, which reach the agent directly) to `init`, which forwards them to the agent.
//! When the agent ends, `init` passes its wait status to `outer` and exits, which kills whatever
//! is left in the namespace; `outer` then exits the same way (the same code, or the same signal
//! re-raised on itself), so `Child::wait` reports the agent's status. Killing `outer` kills
//! `init` (parent-death signal), and with it every process of the sandbox.
//!
//! `pre_exec` closures added to the command *after* [`Launcher::confine`] run in the agent
//! process inside the sandbox (for example `setsid` and `TIOCSCTTY` for a PTY); those added
//! before run in `outer`. A signal sent to the whole process group (`killpg`) reaches the agent
//! directly and once more through the forwarding; send signals to the Child's pid instead.
//!
//! When the sandbox cannot be set up, `spawn` fails with the errno of the step that failed and
//! a line naming the step is written to the command's stderr.
//!
//! `/dev` holds `null`, `zero`, `full`, `random`, `urandom` and `tty` (bound from the host), a
//! private `devpts` instance (the agent can open PTYs; a PTY opened outside works as its stdio
//! and controlling terminal, though `ttyname` cannot name it inside) and a `/dev/shm` tmpfs.
//!
//! ```
//! use std::process::Command;
//! use environment_sandbox::{Isolation, IsolationSpec, Launcher};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let work = tempfile::tempdir()?;
//! if let Err(e) = Isolation::probe() {
//!     eprintln!("{e}"); // this host refuses unprivileged user namespaces, and says why
//!     return Ok(());
//! }
//! let sandbox = Isolation::new(IsolationSpec::host(work.path()))?;
//! let mut cmd = Command::new("/bin/sh");
//! cmd.args(["-c", "echo hi > note; echo $$; touch /usr/x"]);
//! sandbox.confine(&mut cmd)?;
//! let out = cmd.output()?;
//! assert_eq!(out.stdout, b"2\n"); // pid 2, under the sandbox's init
//! assert!(!out.status.success()); // the host is read-only...
//! assert_eq!(std::fs::read_to_string(work.path().join("note"))?, "hi\n"); // the workspace not
//! # Ok(()) }
//! ```

mod cgroup;
mod child;
mod lockdown;
mod plan;
mod probe;
mod rootfs;

use std::ffi::{OsStr, OsString};
use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

pub use cgroup::CgroupLimits;
pub use lockdown::{DENIED, Denied, compiled_filters};
pub use probe::{CgroupSupport, Support};
pub use rootfs::Rootfs;

use crate::error::{Result, SandboxError};
use crate::launch::Launcher;

/// What the agent sees as `/`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Root {
    /// The host filesystem, read-only.
    Host,
    /// A directory owned by the user, mapped to root inside and fully writable.
    Rootfs(PathBuf),
}

/// The agent's workspace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Workspace {
    /// A host directory, bind-mounted writable.
    Dir(PathBuf),
    /// An overlay: reads fall through to `lower` (never written), writes and deletions
    /// (whiteouts) go to `upper`; `work` is overlayfs's scratch directory on `upper`'s
    /// filesystem. Mounted with `userxattr`, so it works unprivileged.
    Overlay {
        /// The read-only layer.
        lower: PathBuf,
        /// Where changes go.
        upper: PathBuf,
        /// Overlayfs's scratch directory, empty, on the same filesystem as `upper`.
        work: PathBuf,
    },
}

/// A host path made visible inside.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bind {
    /// The host path (a directory or a file, e.g. a control socket's directory).
    pub host: PathBuf,
    /// Where it appears inside (absolute). In host mode, a path that does not exist must lie
    /// under a directory the sandbox mounts itself (`/tmp`, the workspace, a writable
    /// directory): the read-only host cannot get a new mount point.
    pub inside: PathBuf,
    /// Writable inside, or read-only.
    pub writable: bool,
}

impl Bind {
    /// `path` visible read-only at the same path inside — e.g. the directory of a program the
    /// agent runs, which a private `/tmp` would otherwise hide.
    pub fn same_path(path: impl Into<PathBuf>) -> Bind {
        let path = path.into();
        Bind {
            host: path.clone(),
            inside: path,
            writable: false,
        }
    }
}

/// Resource limits: rlimits set on the agent process (inherited by everything it starts; `None`
/// leaves the caller's limit, a value above the current hard limit is clamped to it), and
/// cgroup v2 limits shared by every process the launcher confines, which a host without a
/// delegated cgroup v2 subtree refuses ([`SandboxError::Cgroup`] from [`Isolation::new`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    /// Memory, processes and CPU of the whole sandbox (cgroup v2).
    pub cgroup: CgroupLimits,
    /// Address space in bytes (`RLIMIT_AS`).
    pub address_space: Option<u64>,
    /// CPU time in seconds (`RLIMIT_CPU`).
    pub cpu_seconds: Option<u64>,
    /// Open file descriptors (`RLIMIT_NOFILE`).
    pub open_files: Option<u64>,
    /// Processes of the user (`RLIMIT_NPROC`; counted per host uid, so across sandboxes).
    pub processes: Option<u64>,
    /// Largest file the agent may write, in bytes (`RLIMIT_FSIZE`).
    pub file_size: Option<u64>,
    /// Largest core dump, in bytes (`RLIMIT_CORE`).
    pub core_size: Option<u64>,
}

/// Everything an [`Isolation`] is built from.
#[derive(Clone, Debug)]
pub struct IsolationSpec {
    /// What the agent sees as `/`.
    pub root: Root,
    /// The workspace, if any (a rootfs can be its own workspace).
    pub workspace: Option<Workspace>,
    /// Where the workspace appears inside. Default: the same path in host mode (the lower
    /// directory for an overlay), `/workspace` in rootfs mode.
    pub workspace_inside: Option<PathBuf>,
    /// Host mode: further host directories made writable at the same path (tracked
    /// directories such as the agent's home). Refused in rootfs mode, which is writable
    /// throughout.
    pub writable: Vec<PathBuf>,
    /// Extra host paths made visible inside.
    pub binds: Vec<Bind>,
    /// Paths (inside) that are made empty: a directory becomes an empty read-only tmpfs, a file
    /// reads as empty. Paths that do not exist stay absent. Applied after every bind.
    pub masked: Vec<PathBuf>,
    /// Names of the caller's environment variables the agent may see; a trailing `*` matches a
    /// prefix (`LC_*`). Variables set explicitly on the command and in `env_set` are always kept.
    pub env_allow: Vec<String>,
    /// Variables set for the agent (e.g. `ENVIRONMENT_SOCKET`).
    pub env_set: Vec<(OsString, OsString)>,
    /// Whether the agent has the host's network. `false`: a network namespace with only `lo`.
    pub network: bool,
    /// Resource limits.
    pub limits: Limits,
    /// The host name inside.
    pub hostname: String,
}

macro_rules! rootfs_tools {
    () => {
        "/run/environment/bin"
    };
}

/// Where tools of the host are bound into a managed rootfs, read-only (envctl puts itself
/// there, so an agent can call `envctl` inside).
pub const ROOTFS_TOOLS: &str = rootfs_tools!();

/// `PATH` inside a managed rootfs: the usual directories, then [`ROOTFS_TOOLS`].
pub const ROOTFS_PATH: &str = concat!(
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:",
    rootfs_tools!()
);

/// The environment variables kept by default.
pub const DEFAULT_ENV_ALLOW: &[&str] = &["PATH", "HOME", "USER", "LANG", "LC_*", "TERM", "TZ"];

/// Secret paths masked by default, relative to the home directory.
pub const DEFAULT_MASKED: &[&str] = &[
    ".ssh",
    ".aws",
    ".gnupg",
    ".config/gcloud",
    ".azure",
    ".kube",
    ".docker/config.json",
    ".netrc",
    ".git-credentials",
];

impl IsolationSpec {
    /// Host mode around `workspace`, with the default masks (under `$HOME`) and env allow-list,
    /// network on, no limits.
    pub fn host(workspace: impl Into<PathBuf>) -> IsolationSpec {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        IsolationSpec {
            root: Root::Host,
            workspace: Some(Workspace::Dir(workspace.into())),
            workspace_inside: None,
            writable: Vec::new(),
            binds: Vec::new(),
            masked: home.map(|h| default_masked(&h)).unwrap_or_default(),
            env_allow: DEFAULT_ENV_ALLOW.iter().map(|s| (*s).to_owned()).collect(),
            env_set: Vec::new(),
            network: true,
            limits: Limits::default(),
            hostname: "sandbox".to_owned(),
        }
    }

    /// Rootfs mode on `dir` (which is also the workspace until one is set), with the default env
    /// allow-list, network on, no limits and no masks.
    pub fn rootfs(dir: impl Into<PathBuf>) -> IsolationSpec {
        IsolationSpec {
            root: Root::Rootfs(dir.into()),
            workspace: None,
            masked: Vec::new(),
            ..IsolationSpec::host("/")
        }
    }
}

/// The default secret paths under `home`.
pub fn default_masked(home: &Path) -> Vec<PathBuf> {
    DEFAULT_MASKED.iter().map(|p| home.join(p)).collect()
}

/// A launcher that confines commands as its [`IsolationSpec`] says. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Isolation {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    spec: IsolationSpec,
    support: Support,
    plan: Arc<plan::Plan>,
    workspace_inside: PathBuf,
    /// The host directory whose contents appear at `workspace_inside`, for mapping a command's
    /// working directory.
    workspace_host: Option<PathBuf>,
    /// The sandbox's cgroup, when limits asked for one; removed with the last clone.
    cgroup: Option<cgroup::Cgroup>,
}

impl Isolation {
    /// Checks the spec and the host's support (once per process), and prepares the mount plan.
    /// Fails with [`SandboxError::Isolation`] when the host refuses namespaces, and with
    /// [`SandboxError::InvalidSpec`] when a path is unusable.
    pub fn new(spec: IsolationSpec) -> Result<Isolation> {
        let support = probe::cached()?;
        let spec = canonical(spec)?;
        let workspace_inside = match (&spec.workspace_inside, &spec.workspace, &spec.root) {
            (Some(p), _, _) => p.clone(),
            (None, Some(Workspace::Dir(d)), Root::Host) => d.clone(),
            (None, Some(Workspace::Overlay { lower, .. }), Root::Host) => lower.clone(),
            (None, Some(_), Root::Rootfs(_)) => PathBuf::from("/workspace"),
            (None, None, Root::Rootfs(_)) => PathBuf::from("/"),
            (None, None, Root::Host) => PathBuf::from("/"),
        };
        absolute_clean("workspace_inside", &workspace_inside)?;
        let workspace_host = match (&spec.workspace, &spec.root) {
            (Some(Workspace::Dir(d)), _) => Some(d.clone()),
            (Some(Workspace::Overlay { .. }), _) => None,
            (None, Root::Rootfs(dir)) => Some(dir.clone()),
            (None, Root::Host) => None,
        };
        let mut plan = plan::Plan::build(&spec, &workspace_inside, &support)?;
        let cgroup = if spec.limits.cgroup.any() {
            let cgroup = cgroup::Cgroup::create(&support.cgroup, &spec.limits.cgroup)?;
            plan.cgroup = Some(cgroup.procs()?);
            Some(cgroup)
        } else {
            None
        };
        Ok(Isolation {
            inner: Arc::new(Inner {
                spec,
                support,
                plan: Arc::new(plan),
                workspace_inside,
                workspace_host,
                cgroup,
            }),
        })
    }

    /// Whether this host supports rootless isolation, found by trying it (a child process
    /// unshares its namespaces and mounts); the typed error names what is missing and how to
    /// enable it.
    pub fn probe() -> Result<Support> {
        probe::probe()
    }

    /// What this host allows, and so which confinement layers hold (see
    /// [`Support::missing_layers`]).
    pub fn support(&self) -> &Support {
        &self.inner.support
    }

    /// The spec this launcher was built from (paths canonicalized).
    pub fn spec(&self) -> &IsolationSpec {
        &self.inner.spec
    }

    /// Where a host path appears inside: under the workspace it is translated, elsewhere it is
    /// the same path in host mode; in rootfs mode, a path under the rootfs directory is
    /// translated and any other path is taken as an inside path already.
    fn inside_path(&self, path: &Path) -> PathBuf {
        let inner = &self.inner;
        if let Some(host) = &inner.workspace_host
            && let Ok(rel) = path.strip_prefix(host)
        {
            return inner.workspace_inside.join(rel);
        }
        if let Root::Rootfs(dir) = &inner.spec.root
            && let Ok(rel) = path.strip_prefix(dir)
        {
            return Path::new("/").join(rel);
        }
        path.to_path_buf()
    }

    fn env_allowed(&self, name: &OsStr) -> bool {
        let Some(name) = name.to_str() else {
            return false;
        };
        self.inner.spec.env_allow.iter().any(|rule| {
            rule.strip_suffix('*')
                .map_or(rule == name, |prefix| name.starts_with(prefix))
        })
    }

    fn filter_env(&self, command: &mut Command) {
        let explicit: Vec<(OsString, Option<OsString>)> = command
            .get_envs()
            .map(|(k, v)| (k.to_owned(), v.map(OsStr::to_owned)))
            .collect();
        let mut env: std::collections::BTreeMap<OsString, OsString> = std::env::vars_os()
            .filter(|(k, _)| self.env_allowed(k))
            .collect();
        if matches!(self.inner.spec.root, Root::Rootfs(_)) {
            // The caller's home does not exist in the rootfs; the agent is root there. Nor do
            // the caller's program directories: the rootfs's own PATH, and the directory where
            // a launcher may put its tools.
            env.insert("HOME".into(), "/root".into());
            env.insert("USER".into(), "root".into());
            env.insert("PATH".into(), ROOTFS_PATH.into());
        }
        for (k, v) in explicit {
            match v {
                Some(v) => env.insert(k, v),
                None => env.remove(&k),
            };
        }
        for (k, v) in &self.inner.spec.env_set {
            env.insert(k.clone(), v.clone());
        }
        command.env_clear();
        command.envs(env);
    }
}

impl Launcher for Isolation {
    fn confine(&self, command: &mut Command) -> Result<()> {
        let cwd = match command.get_current_dir() {
            Some(dir) if dir.is_absolute() => self.inside_path(dir),
            Some(dir) => {
                let base =
                    std::env::current_dir().map_err(SandboxError::io("current directory", "."))?;
                self.inside_path(&base.join(dir))
            }
            None => self.inner.workspace_inside.clone(),
        };
        let cwd = plan::cstring("working directory", &cwd)?;
        self.filter_env(command);
        // The host's chdir happens before the sandbox exists; the real one happens inside.
        command.current_dir("/");
        let ruleset = match &self.inner.plan.landlock {
            Some(ll) => ll.ruleset()?,
            None => None,
        };
        child::install(command, Arc::clone(&self.inner.plan), cwd, ruleset);
        Ok(())
    }

    fn workspace_inside(&self) -> &Path {
        &self.inner.workspace_inside
    }

    fn describe(&self) -> String {
        let inner = &self.inner;
        let mut parts = vec![
            "user+mount+pid+uts+ipc namespaces".to_owned(),
            "no capabilities (every set empty)".to_owned(),
            "no_new_privs".to_owned(),
        ];
        let plan = &inner.plan;
        parts.push(if plan.seccomp.is_empty() {
            "seccomp unavailable (the kernel runs no filters)".to_owned()
        } else {
            format!(
                "seccomp filter ({} calls refused, namespaces in clone)",
                lockdown::DENIED.len()
            )
        });
        parts.push(match &plan.landlock {
            Some(ll) => format!(
                "Landlock ABI {} (writes only in {} paths)",
                ll.abi,
                ll.writable.len()
            ),
            None => "Landlock unavailable (writes confined by mounts alone)".to_owned(),
        });
        parts.push(match &inner.spec.root {
            Root::Host => "host read-only".to_owned(),
            Root::Rootfs(dir) => format!("rootfs {} as root", dir.display()),
        });
        parts.push(match &inner.spec.workspace {
            Some(Workspace::Dir(d)) => format!(
                "workspace {} at {}",
                d.display(),
                inner.workspace_inside.display()
            ),
            Some(Workspace::Overlay { lower, upper, .. }) => format!(
                "workspace overlay of {} (changes in {}) at {}",
                lower.display(),
                upper.display(),
                inner.workspace_inside.display()
            ),
            None => "no workspace bind".to_owned(),
        });
        parts.push(if inner.support.fresh_proc {
            "/proc fresh".to_owned()
        } else {
            "/proc bind-mounted from the host (a fresh mount was refused)".to_owned()
        });
        parts.push(if inner.spec.network {
            "network shared".to_owned()
        } else {
            "network off (own namespace, lo only)".to_owned()
        });
        if !inner.spec.masked.is_empty() {
            parts.push(format!("{} secret paths masked", inner.spec.masked.len()));
        }
        parts.push(match &inner.cgroup {
            Some(cg) => format!(
                "cgroup v2 limits in {} ({})",
                cg.dir().display(),
                inner.spec.limits.cgroup
            ),
            None => format!("no cgroup v2 limits (cgroup v2: {})", inner.support.cgroup),
        });
        parts.join(", ")
    }
}

/// Makes every host path of the spec absolute, symlink-free (mounts follow symlinks, and inside
/// the half-built sandbox an absolute link would resolve against the wrong root) and checked.
fn canonical(mut spec: IsolationSpec) -> Result<IsolationSpec> {
    fn real(what: &str, p: &Path) -> Result<PathBuf> {
        std::fs::canonicalize(p).map_err(|e| SandboxError::InvalidSpec {
            detail: format!("{what} {}: {e}", p.display()),
        })
    }
    if let Root::Rootfs(dir) = &spec.root {
        let dir = real("rootfs", dir)?;
        if !dir.is_dir() {
            return Err(SandboxError::InvalidSpec {
                detail: format!("rootfs {} is not a directory", dir.display()),
            });
        }
        spec.root = Root::Rootfs(dir);
    }
    spec.workspace = match spec.workspace {
        Some(Workspace::Dir(d)) => Some(Workspace::Dir(real("workspace", &d)?)),
        Some(Workspace::Overlay { lower, upper, work }) => {
            let o = Workspace::Overlay {
                lower: real("overlay lower", &lower)?,
                upper: real("overlay upper", &upper)?,
                work: real("overlay work", &work)?,
            };
            if let Workspace::Overlay { lower, upper, work } = &o {
                for p in [lower, upper, work] {
                    // Overlayfs options separate with ',' and ':' and escape with '\'.
                    if p.as_os_str()
                        .as_encoded_bytes()
                        .iter()
                        .any(|b| matches!(b, b',' | b':' | b'\\'))
                    {
                        return Err(SandboxError::InvalidSpec {
                            detail: format!(
                                "overlay path {} contains ',', ':' or '\\'",
                                p.display()
                            ),
                        });
                    }
                }
            }
            Some(o)
        }
        None => None,
    };
    if let (Root::Rootfs(_), Some(dir)) = (&spec.root, spec.writable.first()) {
        return Err(SandboxError::InvalidSpec {
            detail: format!(
                "writable directory {}: a managed rootfs is writable throughout; writable \
                 directories apply to host mode",
                dir.display()
            ),
        });
    }
    spec.writable = spec
        .writable
        .iter()
        .map(|p| real("writable directory", p))
        .collect::<Result<_>>()?;
    for b in &mut spec.binds {
        b.host = real("bind source", &b.host)?;
        absolute_clean("bind target", &b.inside)?;
    }
    // A mask is a host path in host mode; a missing one is simply absent inside.
    spec.masked = spec
        .masked
        .iter()
        .filter_map(|p| match &spec.root {
            Root::Host => std::fs::canonicalize(p).ok(),
            Root::Rootfs(_) => Some(p.clone()),
        })
        .collect();
    if let Some(p) = &spec.workspace_inside {
        absolute_clean("workspace_inside", p)?;
    }
    Ok(spec)
}

/// An inside path must be absolute and free of `.`/`..`.
fn absolute_clean(what: &str, p: &Path) -> Result<()> {
    let ok = p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if ok {
        Ok(())
    } else {
        Err(SandboxError::InvalidSpec {
            detail: format!(
                "{what} {} must be absolute without '.' or '..'",
                p.display()
            ),
        })
    }
}
