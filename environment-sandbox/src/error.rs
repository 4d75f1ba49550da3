//! Errors of the snapshot engine.

use std::path::PathBuf;

use environment_core::{EnvError, ErrorKind, ForAgent};

/// What capture, restore and their setup can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxError {
    /// The environment refused or failed.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// A filesystem call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path, relative to the tracked root (or absolute for the root itself).
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A path would leave the tracked root (a symlink or `..` on the way): refused.
    #[error("{path} leads outside the tracked root; nothing was written there")]
    Escape {
        /// The path, relative to the root.
        path: PathBuf,
    },
    /// A noise rule that does not parse.
    #[error("invalid noise rule {rule:?}: {detail}")]
    Rule {
        /// The rule.
        rule: String,
        /// The parser's complaint.
        detail: String,
    },
    /// The inotify watch limit was reached; captures fall back to rescans.
    #[error("inotify: {0}")]
    Watch(String),
    /// The workspace monitor named in the tracker's config cannot be reached.
    #[error("the workspace monitor at {socket} cannot be reached: {source}")]
    Monitor {
        /// Its socket.
        socket: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The host refuses what rootless isolation needs.
    #[error("rootless isolation is unavailable on this host: {missing}. Hint: {hint}")]
    Isolation {
        /// What was refused, with the system's error.
        missing: String,
        /// How to enable it (the sysctl, security profile or kernel feature involved).
        hint: String,
    },
    /// cgroup v2 limits were asked and this host cannot apply them: refused before anything
    /// ran.
    #[error("cgroup v2 limits cannot be applied on this host: {why}; nothing was started")]
    Cgroup {
        /// Why (no delegated subtree, a controller missing, a write refused).
        why: String,
    },
    /// An isolation spec that cannot be used (a missing path, a relative inside path…).
    #[error("invalid isolation spec: {detail}")]
    InvalidSpec {
        /// What is wrong.
        detail: String,
    },
    /// A rootfs seed source this user cannot fully read: refused before anything was written.
    #[error(
        "{count} entries of the rootfs source cannot be read by this user (first: {}); nothing was seeded",
        first.display()
    )]
    SeedUnreadable {
        /// How many files and directories cannot be read.
        count: usize,
        /// The first of them, relative to the source.
        first: PathBuf,
    },
    /// A rootfs seed entry that would land outside the destination, or cannot be created:
    /// refused before anything was written.
    #[error("rootfs seed entry {entry}: {reason}; nothing was written")]
    SeedEntry {
        /// The entry's path as the archive or source names it.
        entry: PathBuf,
        /// Why it is refused.
        reason: &'static str,
    },
    /// The supervisor cannot do what was asked (setup, agent lifecycle, shutting down).
    #[error("supervisor: {0}")]
    Supervisor(String),
    /// A file write refused before anything changed: the path is ignored by the tree's noise
    /// rules, or holds something that is not a regular file.
    #[error("{path}: {reason}")]
    NotWritable {
        /// The path, relative to the root.
        path: String,
        /// Why.
        reason: &'static str,
    },
    /// A path to delete holds nothing; nothing changed.
    #[error("{path}: there is no such file")]
    Missing {
        /// The path, relative to the root.
        path: String,
    },
    /// A working copy is attached only to an empty directory that no tracker knows; nothing
    /// was written.
    #[error("{path}: {reason}; nothing was written")]
    NotAttachable {
        /// The directory.
        path: PathBuf,
        /// Why it cannot take a new working copy.
        reason: &'static str,
    },
    /// The stat cache failed.
    #[error("stat cache: {0}")]
    Cache(#[from] rusqlite::Error),
}

impl SandboxError {
    /// What kind of failure it is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            SandboxError::Env(e) => e.kind(),
            SandboxError::Escape { .. }
            | SandboxError::Rule { .. }
            | SandboxError::InvalidSpec { .. }
            | SandboxError::SeedEntry { .. }
            | SandboxError::NotWritable { .. }
            | SandboxError::NotAttachable { .. } => ErrorKind::Invalid,
            SandboxError::Io { source, .. }
                if source.kind() == std::io::ErrorKind::PermissionDenied =>
            {
                ErrorKind::Denied
            }
            SandboxError::Isolation { .. }
            | SandboxError::Cgroup { .. }
            | SandboxError::Monitor { .. }
            | SandboxError::SeedUnreadable { .. } => ErrorKind::Unavailable,
            SandboxError::Missing { .. } => ErrorKind::NotFound,
            _ => ErrorKind::Internal,
        }
    }

    /// The error of an I/O operation `op` on `path`, for `map_err`.
    pub fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> SandboxError {
        let path = path.into();
        move |source| SandboxError::Io { op, path, source }
    }
}

impl ForAgent for SandboxError {
    fn for_agent(&self) -> String {
        match self {
            SandboxError::Env(e) => e.for_agent(),
            other => format!(
                "The action was NOT performed to completion and must not be reported as done. \
                 Reason: {other}. Next: check the path and retry; if it persists, tell a human."
            ),
        }
    }
}

/// Results of the snapshot engine.
pub type Result<T, E = SandboxError> = std::result::Result<T, E>;
