//! Errors of the environment and their rendering for an agent.

use std::fmt;
use std::path::PathBuf;

use crate::authz::{ActorIdError, Decision, Verdict};
use crate::hash::Hash;
use crate::key::{Key, KeyError};
use crate::op::OpId;

/// What the blob store can fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BlobError {
    /// No blob with this hash.
    #[error("blob {0} is not in the blob store")]
    Missing(Hash),
    /// The blob's bytes no longer hash to its name: it was damaged on disk.
    #[error("blob {expected} is corrupt: its content hashes to {actual}")]
    Corrupt {
        /// The blob's name.
        expected: Hash,
        /// What its bytes hash to now.
        actual: Hash,
    },
    /// A blob named as a manifest of chunks does not hold one.
    #[error("blob {hash} is not a valid manifest of chunks: {reason}")]
    BadManifest {
        /// The blob's name.
        hash: Hash,
        /// What is wrong with it.
        reason: String,
    },
    /// The filesystem refused.
    #[error("blob store I/O at {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The blob store shared by the environment's machines (see
    /// [`SharedBlobs`](crate::SharedBlobs)) failed or refused.
    #[error("the shared blob store: {0}")]
    Shared(PortError),
}

/// A failure reported through a port (the governance, the queue): its kind, what happened, and
/// what the caller can do next. Adapters build it from their own errors, so none of their types
/// cross into the service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("{message}")]
pub struct PortError {
    /// What kind of failure it is.
    pub kind: ErrorKind,
    /// What happened.
    pub message: String,
    /// What the caller can do about it.
    pub next: String,
}

impl PortError {
    /// A failure of `kind`.
    pub fn new(kind: ErrorKind, message: impl Into<String>, next: impl Into<String>) -> PortError {
        PortError {
            kind,
            message: message.into(),
            next: next.into(),
        }
    }
}

/// Why an act touching keys that moved underneath it was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleWrite {
    /// The keys the action wanted to change that changed since its base version.
    pub keys: Vec<Key>,
    /// The operations that changed them (newest first).
    pub ops: Vec<OpId>,
    /// The version the action was based on.
    pub base: OpId,
    /// The branch's head now: re-read at this version.
    pub current: OpId,
}

/// Everything an environment operation can fail with. A returned error means the operation did
/// not happen and nothing changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// A malformed key.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A malformed actor id.
    #[error(transparent)]
    Actor(#[from] ActorIdError),
    /// The blob store failed.
    #[error(transparent)]
    Blob(#[from] BlobError),
    /// No operation with this id (or id prefix, mark or branch name).
    #[error("unknown version {0:?}")]
    UnknownVersion(String),
    /// A version prefix that names more than one operation.
    #[error("ambiguous version prefix {prefix:?}: {count} operations start with it")]
    AmbiguousVersion {
        /// The prefix given.
        prefix: String,
        /// How many operations matched.
        count: usize,
    },
    /// No branch with this name.
    #[error("unknown branch {0:?}")]
    UnknownBranch(String),
    /// A branch with this name exists already.
    #[error("branch {0:?} already exists")]
    BranchExists(String),
    /// A mark with this name exists already.
    #[error("mark {0:?} already exists")]
    MarkExists(String),
    /// A branch or mark name that is not allowed.
    #[error("invalid name {name:?}: {reason}")]
    InvalidName {
        /// The name given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A value larger than the configured limit.
    #[error("the value for {key} is {size} bytes; the limit is {limit}")]
    ValueTooLarge {
        /// The key.
        key: Key,
        /// Its size.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Too many changes in one act, or an intent text too long.
    #[error("the request is too large: {0}")]
    RequestTooLarge(String),
    /// The same key twice in one act.
    #[error("key {0} appears more than once in one act")]
    DuplicateKey(Key),
    /// The head moved and changed keys this action also changes.
    #[error(
        "stale write: {} changed since version {} (by {} operation(s)); the head is now {}",
        fmt_keys(&.0.keys), .0.base.short(), .0.ops.len(), .0.current.short()
    )]
    Conflict(Box<StaleWrite>),
    /// The authorizer did not allow the action.
    #[error("not allowed: {}", .0.explanation)]
    NotAllowed(Box<Decision>),
    /// An effect key reused with a different request.
    #[error("idempotency key {key:?} was used before with a different request")]
    IdempotencyKeyReused {
        /// The key.
        key: String,
    },
    /// No effect with this id.
    #[error("unknown effect {0}")]
    UnknownEffect(u64),
    /// An effect state change that its current state does not allow.
    #[error("effect {id} is {from} and cannot become {to}")]
    InvalidEffectTransition {
        /// The effect.
        id: u64,
        /// Its state.
        from: &'static str,
        /// The state asked for.
        to: &'static str,
    },
    /// A store behind one of the environment's ports failed (one that several machines share:
    /// it may be unreachable).
    #[error("{0}")]
    Store(PortError),
    /// The version was thinned out by retention: its record stays, its content does not.
    #[error("version {0} was dropped by retention; its content is no longer kept")]
    VersionDropped(OpId),
    /// Retention may not drop this version (a branch head, a mark, a fork point, a merge parent,
    /// a rollback target or the first operation).
    #[error("version {id} is protected from retention: {why}")]
    ProtectedVersion {
        /// The version.
        id: OpId,
        /// What protects it.
        why: &'static str,
    },
    /// Nothing to undo: every operation since the branch's first is undone already.
    #[error("nothing to undo on branch {0:?}")]
    NothingToUndo(String),
    /// Nothing to redo: the branch's last operation is not an undo still to redo.
    #[error("nothing to redo on branch {0:?}")]
    NothingToRedo(String),
    /// The implementation does not offer this capability.
    #[error("this environment does not support {0}")]
    Unsupported(&'static str),
    /// No background process or terminal session with this number (it never existed, or it
    /// was closed and forgotten).
    #[error("no {what} {id}")]
    NoSuchProcess {
        /// `process` or `session`.
        what: &'static str,
        /// The number asked for.
        id: u64,
    },
    /// A command could not be started (no such program, a working directory outside the
    /// workspace, an empty command line…).
    #[error("cannot run {program:?}: {detail}")]
    Exec {
        /// The program.
        program: String,
        /// What went wrong.
        detail: String,
    },
    /// A secret reference could not be resolved; the command was not started.
    #[error("secret {name:?} is unavailable: {detail}")]
    SecretUnavailable {
        /// The secret's name.
        name: String,
        /// Why.
        detail: String,
    },
    /// `verify()` found damage.
    #[error("integrity check failed at {at}: {detail}")]
    Integrity {
        /// The first broken record (an op id, a node hash, a table row).
        at: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The environment's home is not usable.
    #[error("environment home {path}: {detail}")]
    Home {
        /// The directory.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// SQLite failed.
    #[error("database: {0}")]
    Db(#[from] rusqlite::Error),
    /// A stored record could not be decoded.
    #[error("undecodable stored record ({what}): {detail}")]
    Decode {
        /// Which record.
        what: &'static str,
        /// The decoder's complaint.
        detail: String,
    },
    /// The transaction holding the operation failed to commit; nothing of it was stored.
    #[error("the transaction could not commit: {0}")]
    CommitFailed(String),
    /// The environment was closed (its writer thread is gone).
    #[error("the environment is closed")]
    Closed,
}

fn fmt_keys(keys: &[Key]) -> String {
    let shown: Vec<String> = keys.iter().take(5).map(|k| k.to_string()).collect();
    let more = keys.len().saturating_sub(5);
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}

/// Results of environment operations.
pub type Result<T, E = EnvError> = std::result::Result<T, E>;

/// What kind of failure an error is: the one classification of every error of the environment's
/// crates, which each door maps once to its own codes (envctl's exit codes, the control
/// socket's JSON-RPC codes, MCP's `isError`, HTTP statuses). A refusal of any kind but
/// [`ErrorKind::Internal`] and [`ErrorKind::Corrupt`] changed nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// The request is malformed: a bad path, name, size, argument or rule.
    Invalid,
    /// Something it names does not exist: a version, branch, effect, topic, receipt, approval.
    NotFound,
    /// It conflicts with the current state: a moved head, a name taken, a stale receipt,
    /// nothing left to undo, an approval already decided.
    Conflict,
    /// The policy, a token or the owner of a receipt refused it.
    Denied,
    /// The policy allows it once someone approves it.
    NeedsApproval,
    /// What it needs is not available here: a capability not configured, a secret, a sandbox
    /// this host cannot make, a store that cannot be reached.
    Unavailable,
    /// The stored state is damaged.
    Corrupt,
    /// Anything else: an I/O or storage failure; the action may not have completed.
    Internal,
}

impl ErrorKind {
    /// The kind's name, as it appears on the wire (`not_found`, `needs_approval`…).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Invalid => "invalid",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Conflict => "conflict",
            ErrorKind::Denied => "denied",
            ErrorKind::NeedsApproval => "needs_approval",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Corrupt => "corrupt",
            ErrorKind::Internal => "internal",
        }
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl BlobError {
    /// What kind of failure it is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            BlobError::Missing(_) => ErrorKind::NotFound,
            BlobError::Corrupt { .. } | BlobError::BadManifest { .. } => ErrorKind::Corrupt,
            BlobError::Shared(e) => e.kind,
            _ => ErrorKind::Internal,
        }
    }
}

impl EnvError {
    /// What kind of failure it is.
    ///
    /// ```
    /// use environment_core::{EnvError, ErrorKind};
    /// assert_eq!(EnvError::NothingToUndo("main".into()).kind(), ErrorKind::Conflict);
    /// ```
    pub fn kind(&self) -> ErrorKind {
        use ErrorKind::*;
        match self {
            EnvError::Key(_)
            | EnvError::Actor(_)
            | EnvError::InvalidName { .. }
            | EnvError::ValueTooLarge { .. }
            | EnvError::RequestTooLarge(_)
            | EnvError::DuplicateKey(_) => Invalid,
            // A program that is not there is not found; one that cannot start is invalid.
            EnvError::Exec { detail, .. }
                if detail.contains("No such file") || detail.contains("not found") =>
            {
                NotFound
            }
            EnvError::Exec { .. } => Invalid,
            EnvError::UnknownVersion(_)
            | EnvError::AmbiguousVersion { .. }
            | EnvError::UnknownBranch(_)
            | EnvError::UnknownEffect(_)
            | EnvError::VersionDropped(_)
            | EnvError::NoSuchProcess { .. } => NotFound,
            EnvError::BranchExists(_)
            | EnvError::MarkExists(_)
            | EnvError::Conflict(_)
            | EnvError::IdempotencyKeyReused { .. }
            | EnvError::InvalidEffectTransition { .. }
            | EnvError::ProtectedVersion { .. }
            | EnvError::NothingToUndo(_)
            | EnvError::NothingToRedo(_) => Conflict,
            EnvError::NotAllowed(d) => match d.verdict {
                Verdict::NeedsApproval { .. } => NeedsApproval,
                _ => Denied,
            },
            EnvError::Unsupported(_) | EnvError::SecretUnavailable { .. } | EnvError::Closed => {
                Unavailable
            }
            EnvError::Integrity { .. } | EnvError::Decode { .. } => Corrupt,
            EnvError::Blob(b) => b.kind(),
            EnvError::Store(e) => e.kind,
            EnvError::Home { .. } | EnvError::Db(_) | EnvError::CommitFailed(_) => Internal,
        }
    }
}

/// Renders an error for a language model: first that the action was not performed, then why,
/// then what to do next.
pub trait ForAgent {
    /// The text to put in the model's context.
    fn for_agent(&self) -> String;
}

const NOT_DONE: &str = "The action was NOT performed: nothing changed, and it must not be \
                        reported as done.";

impl ForAgent for EnvError {
    fn for_agent(&self) -> String {
        let next = match self {
            EnvError::Conflict(c) => format!(
                "Re-read {} at version {} (the current head), redo your change on top of it, and \
                 act again with base version {}.",
                fmt_keys(&c.keys),
                c.current,
                c.current
            ),
            EnvError::NotAllowed(d) if !d.next.is_empty() => sentence(&d.next),
            EnvError::NotAllowed(d) => match &d.verdict {
                Verdict::NeedsApproval { from, .. } => format!(
                    "Request approval from {} and retry with the granted approval; do not retry \
                     before it is granted.",
                    if from.is_empty() {
                        "an authorized approver".to_owned()
                    } else {
                        from.join(" or ")
                    }
                ),
                _ => "Do not retry the same action; ask a human whether it should be allowed, or \
                      choose an action you are allowed to take."
                    .to_owned(),
            },
            EnvError::Key(_) | EnvError::DuplicateKey(_) => {
                "Use a relative path with no `.`, `..`, empty segment or NUL byte, each key once."
                    .to_owned()
            }
            EnvError::UnknownVersion(_)
            | EnvError::AmbiguousVersion { .. }
            | EnvError::VersionDropped(_) => {
                "List the history to find a valid version (a longer id prefix, a mark or a branch \
                 name)."
                    .to_owned()
            }
            EnvError::UnknownBranch(_) => "List the branches and pick an existing one.".to_owned(),
            EnvError::BranchExists(_) | EnvError::MarkExists(_) => {
                "Pick another name, or use the existing one.".to_owned()
            }
            EnvError::ValueTooLarge { .. } | EnvError::RequestTooLarge(_) => {
                "Split the change into smaller parts.".to_owned()
            }
            EnvError::IdempotencyKeyReused { .. } => {
                "Use a new idempotency key for a different request; the earlier effect stands."
                    .to_owned()
            }
            EnvError::Unsupported(_) => {
                "Use another capability; this one is not available here.".to_owned()
            }
            EnvError::NoSuchProcess { .. } => {
                "List the processes or sessions to find a valid number.".to_owned()
            }
            EnvError::Exec { .. } => {
                "Check the program name (is it installed?) and the working directory (relative to \
                 the workspace, inside it), then retry."
                    .to_owned()
            }
            EnvError::SecretUnavailable { .. } => {
                "Ask a human to provide the secret; do not try to obtain it another way.".to_owned()
            }
            EnvError::Integrity { .. } | EnvError::Blob(BlobError::Corrupt { .. }) => {
                "Stop and tell a human: the environment's storage is damaged.".to_owned()
            }
            _ => "Report the error to a human if it persists.".to_owned(),
        };
        let why = match self {
            EnvError::NotAllowed(d) if !d.explanation.is_empty() => d.explanation.clone(),
            other => other.to_string(),
        };
        format!(
            "{NOT_DONE} Reason: {}. Next: {next}",
            why.trim_end_matches('.')
        )
    }
}

/// `text` as a sentence: its first letter capitalized, one final stop.
fn sentence(text: &str) -> String {
    let text = text.trim_end_matches('.');
    let mut chars = text.chars();
    match chars.next() {
        Some(c) => format!("{}{}.", c.to_uppercase(), chars.as_str()),
        None => String::new(),
    }
}

impl ForAgent for KeyError {
    fn for_agent(&self) -> String {
        EnvError::Key(self.clone()).for_agent()
    }
}

impl ForAgent for BlobError {
    fn for_agent(&self) -> String {
        let next = match self {
            BlobError::Corrupt { .. } | BlobError::BadManifest { .. } => {
                "Stop and tell a human: the environment's storage is damaged."
            }
            BlobError::Missing(_) => "Store the content first, or refer to content that exists.",
            BlobError::Io { .. } => "Report the error to a human if it persists.",
            BlobError::Shared(e) => e.next.as_str(),
        };
        format!("{NOT_DONE} Reason: {self}. Next: {next}")
    }
}
