//! Why a command failed, and the exit code that says so.
//!
//! Every failure is one sentence for a person (what did not happen and why) plus a hint (what
//! to do next), and an [`ExitCode`] a script can branch on.

use std::fmt;

use environment_bus::BusError;
use environment_core::{BlobError, EnvError, ErrorKind, ForAgent};
use environment_policy::PolicyError;
use environment_sandbox::SandboxError;

/// The documented exit codes of `envctl`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitCode {
    /// 0: done.
    Ok = 0,
    /// 1: the command failed (storage, I/O, a damaged environment).
    Failure = 1,
    /// 2: malformed input (arguments, names, paths, payloads, rules).
    Usage = 2,
    /// 3: something named does not exist (a version, branch, mark, environment, topic, group,
    /// receipt, approval, effect, program).
    NotFound = 3,
    /// 4: the policy denied the action, or it needs an approval first.
    Denied = 4,
    /// 5: a conflict (a stale write, a name taken, a stale receipt, a decided approval, nothing
    /// to undo or redo, or a merge that recorded conflict objects).
    Conflict = 5,
    /// 6: a supervisor is required and none is listening.
    NoSupervisor = 6,
    /// 7: not available here: this host cannot make sandboxes, or the command cannot go
    /// through the supervisor that holds the workspace.
    Unavailable = 7,
}

impl From<ErrorKind> for ExitCode {
    /// The exit code of each kind of error: the one place envctl's codes are chosen.
    fn from(kind: ErrorKind) -> ExitCode {
        match kind {
            ErrorKind::Invalid => ExitCode::Usage,
            ErrorKind::NotFound => ExitCode::NotFound,
            ErrorKind::Conflict => ExitCode::Conflict,
            ErrorKind::Denied | ErrorKind::NeedsApproval => ExitCode::Denied,
            ErrorKind::Unavailable => ExitCode::Unavailable,
            _ => ExitCode::Failure,
        }
    }
}

impl ExitCode {
    /// The process exit status.
    pub fn status(self) -> i32 {
        self as i32
    }
}

/// A failed command: nothing it was asked to do happened (unless the message says otherwise).
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: ExitCode,
    /// One sentence: what failed and why.
    pub message: String,
    /// What to do next.
    pub hint: Option<String>,
    /// The library's own rendering for a language model, when it has one.
    pub for_agent: Option<String>,
    /// Part of the request did happen (e.g. a command ran but its changes could not be recorded
    /// as its actor's): the message says what.
    pub partial: bool,
    /// The workspace service's error, when it came from one: its kind and its details (the
    /// deciding rules, a filed approval), for a door that shows them.
    pub service: Option<(ErrorKind, serde_json::Value)>,
}

impl Failure {
    /// A failure with a code and a message.
    pub fn new(code: ExitCode, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            hint: None,
            for_agent: None,
            partial: false,
            service: None,
        }
    }

    /// Adds the hint.
    pub fn hint(mut self, hint: impl Into<String>) -> Failure {
        self.hint = Some(hint.into());
        self
    }

    /// Malformed input.
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure::new(ExitCode::Usage, message)
    }

    /// Something named does not exist.
    pub fn not_found(message: impl Into<String>) -> Failure {
        Failure::new(ExitCode::NotFound, message)
    }

    /// Anything else that went wrong.
    pub fn other(message: impl Into<String>) -> Failure {
        Failure::new(ExitCode::Failure, message)
    }

    /// An I/O error on a path.
    pub fn io(what: &str, path: &std::path::Path, e: std::io::Error) -> Failure {
        let f = Failure::other(format!("cannot {what} {}: {e}", path.display()));
        match e.kind() {
            std::io::ErrorKind::PermissionDenied => {
                f.hint("check the permissions of that path for the user running envctl")
            }
            std::io::ErrorKind::NotFound => Failure {
                code: ExitCode::NotFound,
                ..f.hint("check the path")
            },
            _ => f,
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.message.trim_end_matches('.');
        write!(f, "{m}.")?;
        if let Some(h) = &self.hint {
            write!(f, "\nhint: {h}")?;
        }
        Ok(())
    }
}

/// The results of commands.
pub type Outcome<T = ()> = std::result::Result<T, Failure>;

impl From<EnvError> for Failure {
    fn from(e: EnvError) -> Failure {
        let hint = match &e {
            EnvError::UnknownVersion(_) | EnvError::AmbiguousVersion { .. } => {
                "name a version by an op id (or a unique prefix of 4+ hex digits), a mark, a \
                 branch, or HEAD~N; `envctl log` lists them"
            }
            EnvError::VersionDropped(_) => {
                "retention dropped that version's content; pick a kept one from `envctl log`"
            }
            EnvError::UnknownBranch(_) => "`envctl branch` lists the branches",
            EnvError::UnknownEffect(_) => "`envctl effects` lists the effects",
            EnvError::NotAllowed(_) => {
                "`envctl policy explain` shows why; a human can change the rules or grant an \
                 approval (`envctl policy approvals`)"
            }
            EnvError::Conflict(_) => "re-read at the current head and redo the change on top of it",
            EnvError::BranchExists(_) | EnvError::MarkExists(_) => {
                "pick another name, or use the existing one"
            }
            EnvError::Key(_) | EnvError::DuplicateKey(_) => {
                "use a relative path without `.`, `..`, empty segments or NUL bytes"
            }
            EnvError::InvalidName { .. } => {
                "use letters, digits and `-_./` in names, not starting with `-`"
            }
            EnvError::Actor(_) => "an actor is `kind:name`, e.g. `human:alice` or `agent:coder-1`",
            EnvError::ValueTooLarge { .. } | EnvError::RequestTooLarge(_) => {
                "split the change into smaller parts"
            }
            EnvError::NothingToUndo(_) => "`envctl log` shows the history",
            EnvError::Integrity { .. } | EnvError::Blob(BlobError::Corrupt { .. }) => {
                "the environment's storage is damaged; keep a copy of its home before anything \
                 else"
            }
            EnvError::Home { .. } => {
                "check that the environment's home exists and is writable by this user"
            }
            EnvError::Db(_) | EnvError::Blob(BlobError::Io { .. }) => {
                "check the permissions and free space of the environment's home"
            }
            _ => "run `envctl verify`; report the error if it persists",
        };
        let message = match &e {
            EnvError::NotAllowed(d) => format!("denied by policy: {}", d.explanation),
            other => other.to_string(),
        };
        let mut f = self::Failure::new(e.kind().into(), message).hint(hint);
        f.for_agent = Some(e.for_agent());
        f
    }
}

/// The workspace service's refusal: its kind gives the exit code, its text is kept for a model.
impl From<environment_workspace::ServiceError> for Failure {
    fn from(e: environment_workspace::ServiceError) -> Failure {
        let mut f = Failure::new(e.kind().into(), e.message.clone());
        // The next step the service gives a model is the hint a person reads too.
        if let Some(next) = e
            .for_agent()
            .and_then(|t| t.rsplit_once("Next:"))
            .map(|(_, next)| next.trim().trim_end_matches('.'))
            .filter(|next| !next.is_empty())
        {
            f = f.hint(next.to_owned());
        }
        f.for_agent = e.for_agent().map(str::to_owned);
        f.service = Some((e.kind(), e.data));
        f
    }
}

impl From<SandboxError> for Failure {
    fn from(e: SandboxError) -> Failure {
        match e {
            SandboxError::Env(e) => e.into(),
            SandboxError::Io { op, path, source } => {
                let denied = source.kind() == std::io::ErrorKind::PermissionDenied;
                let f = Failure::other(format!("{op} {}: {source}", path.display()));
                if denied {
                    f.hint("check the permissions of the workspace for the user running envctl")
                } else {
                    f.hint("check the workspace and retry")
                }
            }
            SandboxError::Escape { .. } => Failure::other(e.to_string())
                .hint("a symlink in the workspace points outside it; remove or fix it"),
            SandboxError::NotWritable { .. } => Failure::usage(e.to_string())
                .hint("write a tracked path that is a regular file or does not exist yet"),
            SandboxError::InvalidSpec { .. } => Failure::usage(format!("{e}; nothing ran"))
                .hint("check the directories given to the sandbox (--writable)"),
            SandboxError::Cgroup { .. } => Failure::new(ExitCode::Unavailable, e.to_string()).hint(
                "run where a cgroup v2 subtree is delegated to this user (e.g. `systemd-run \
                     --user --scope -p Delegate=yes envctl …`), or drop --memory, \
                     --max-processes and --cpus",
            ),
            SandboxError::Rule { .. } => {
                Failure::usage(e.to_string()).hint("noise rules use gitignore syntax")
            }
            SandboxError::SeedUnreadable { .. } => Failure::other(e.to_string()).hint(
                "seed as the tree's owner, or from a tar archive one makes (`sudo tar -cf \
                 rootfs.tar -C DIR .`), then `envctl init --rootfs rootfs.tar`",
            ),
            SandboxError::Watch(_) => Failure::other(e.to_string())
                .hint("raise fs.inotify.max_user_watches, or ignore large generated directories"),
            other => Failure::other(other.to_string())
                .hint("check the environment's home; run `envctl verify`"),
        }
    }
}

impl From<PolicyError> for Failure {
    fn from(e: PolicyError) -> Failure {
        let hint = match &e {
            PolicyError::Invalid(_) => "fix the rule file at the places named and load it again",
            PolicyError::UnknownApproval(_) => "`envctl policy approvals` lists them",
            PolicyError::UnknownRule(_) => "the loaded rules are in the policy file",
            PolicyError::ApprovalNotPending { .. } => "it was decided already",
            PolicyError::NotAnApprover { .. } => {
                "only the actors or groups the rule names may decide it (pass --actor)"
            }
            PolicyError::NoApprovalNeeded(_) => "`envctl policy explain` shows the decision",
            PolicyError::BadEntity(_) | PolicyError::NotAGroup(_) => {
                "ids are `kind:name`; groups start with `group:` or `role:`"
            }
            PolicyError::Cycle { .. } => "a group cannot contain itself",
            _ => "check the permissions of the environment's home",
        };
        self::Failure::new(e.kind().into(), e.to_string()).hint(hint)
    }
}

impl From<BusError> for Failure {
    fn from(e: BusError) -> Failure {
        let hint = match &e {
            BusError::UnknownTopic { .. } => {
                "publish to the topic first; `envctl queue stats` lists topics"
            }
            BusError::UnknownGroup { .. } => {
                "create the group with `envctl queue subscribe GROUP TOPIC...`"
            }
            BusError::UnknownReceipt { .. } => {
                "use the receipt printed by `envctl queue claim` (DELIVERY.TOKEN)"
            }
            BusError::StaleReceipt { .. } => {
                "the lease expired or was settled; claim the message again"
            }
            BusError::NotYourReceipt { .. } => {
                "settle only the receipts your own `envctl queue claim` printed"
            }
            BusError::InvalidName { .. } => "names are short and use letters, digits and `-_.:`",
            BusError::PayloadTooLarge { .. } => "send a smaller payload, or a reference to a file",
            BusError::OutOfRange { .. } => "pick a value inside the allowed range",
            BusError::GroupConflict { .. } => "use the group's existing settings",
            BusError::NoSuchDeadLetter { .. } => "`envctl queue dead GROUP` lists the dead letters",
            _ => "check the permissions of the environment's home",
        };
        self::Failure::new(e.kind().into(), e.to_string()).hint(hint)
    }
}
