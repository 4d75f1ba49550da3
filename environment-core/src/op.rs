//! Operation records: the append-only, hash-chained log of who changed what, on which version,
//! with what intent.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::authz::ActorId;
use crate::hash::{Hash, ParseHashError};
use crate::key::Key;

/// An operation's id: the blake3 hash of its record, which covers its parents' ids. A version of
/// the environment is named by the id of the operation that produced it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OpId(pub Hash);

/// A version is the operation that produced it.
pub type Version = OpId;

impl OpId {
    /// The first 12 hex digits, enough to name an op in a log.
    pub fn short(&self) -> String {
        self.0.short(12)
    }
}

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OpId({})", self.short())
    }
}

impl FromStr for OpId {
    type Err = ParseHashError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        s.parse().map(OpId)
    }
}

/// The kind of an intent: what sort of thing the actor meant to do.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum IntentKind {
    /// An edit of content.
    Edit,
    /// A command that ran (its file changes are attributed to it).
    Command,
    /// A capture of changes made outside the environment's API.
    Capture,
    /// A restore to an earlier version.
    Restore,
    /// A merge of two branches.
    Merge,
    /// A test run.
    Test,
    /// A review.
    Review,
    /// Planning or bookkeeping.
    Plan,
    /// The creation of the environment or a branch.
    Setup,
    /// Anything else, named by the caller.
    Other(String),
    /// An undo: a restore to the version before the last operation not undone yet.
    Undo,
    /// A redo: a restore to the version the last undo not redone yet took away.
    Redo,
}

impl fmt::Display for IntentKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            IntentKind::Edit => "edit",
            IntentKind::Command => "command",
            IntentKind::Capture => "capture",
            IntentKind::Restore => "restore",
            IntentKind::Merge => "merge",
            IntentKind::Test => "test",
            IntentKind::Review => "review",
            IntentKind::Plan => "plan",
            IntentKind::Setup => "setup",
            IntentKind::Other(s) => s,
            IntentKind::Undo => "undo",
            IntentKind::Redo => "redo",
        };
        f.write_str(s)
    }
}

/// Why an actor did something: free text plus a kind.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Intent {
    /// What the actor meant, in its own words.
    pub text: String,
    /// What sort of thing it was.
    pub kind: IntentKind,
}

impl Intent {
    /// An intent of the given kind.
    pub fn new(kind: IntentKind, text: impl Into<String>) -> Intent {
        Intent {
            text: text.into(),
            kind,
        }
    }

    /// An edit.
    pub fn edit(text: impl Into<String>) -> Intent {
        Intent::new(IntentKind::Edit, text)
    }
}

/// Flags of an operation; several may be set.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct OpFlags(pub u32);

impl OpFlags {
    /// The first operation of an environment.
    pub const INIT: OpFlags = OpFlags(1);
    /// Recorded by automatic capture rather than asked for.
    pub const AUTO_CAPTURE: OpFlags = OpFlags(1 << 1);
    /// Touched only paths marked quiet: never a history node of its own.
    pub const QUIET: OpFlags = OpFlags(1 << 2);
    /// A restore or undo: the view is an earlier one.
    pub const ROLLBACK: OpFlags = OpFlags(1 << 3);
    /// A merge of two branches.
    pub const MERGE: OpFlags = OpFlags(1 << 4);
    /// The merge left conflict objects.
    pub const CONFLICTS: OpFlags = OpFlags(1 << 5);
    /// The head had moved past the base version and the change was rebased onto it.
    pub const REBASED: OpFlags = OpFlags(1 << 6);
    /// A command ran.
    pub const COMMAND: OpFlags = OpFlags(1 << 7);
    /// What it recorded failed (a command's non-zero exit, a failing test).
    pub const FAILED: OpFlags = OpFlags(1 << 8);
    /// A branch was created here.
    pub const BRANCH: OpFlags = OpFlags(1 << 9);

    const NAMES: [(OpFlags, &'static str); 10] = [
        (OpFlags::INIT, "init"),
        (OpFlags::AUTO_CAPTURE, "auto-capture"),
        (OpFlags::QUIET, "quiet"),
        (OpFlags::ROLLBACK, "rollback"),
        (OpFlags::MERGE, "merge"),
        (OpFlags::CONFLICTS, "conflicts"),
        (OpFlags::REBASED, "rebased"),
        (OpFlags::COMMAND, "command"),
        (OpFlags::FAILED, "failed"),
        (OpFlags::BRANCH, "branch"),
    ];

    /// No flag.
    pub const fn empty() -> OpFlags {
        OpFlags(0)
    }

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: OpFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether any flag of `other` is set.
    pub const fn intersects(self, other: OpFlags) -> bool {
        self.0 & other.0 != 0
    }

    /// The names of the flags set.
    pub fn names(self) -> Vec<&'static str> {
        OpFlags::NAMES
            .iter()
            .filter(|(f, _)| self.contains(*f))
            .map(|(_, n)| *n)
            .collect()
    }
}

impl std::ops::BitOr for OpFlags {
    type Output = OpFlags;
    fn bitor(self, rhs: OpFlags) -> OpFlags {
        OpFlags(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for OpFlags {
    fn bitor_assign(&mut self, rhs: OpFlags) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for OpFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "OpFlags({})", self.names().join("|"))
    }
}

/// How many keys an op changed; the first few are named.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeSummary {
    /// Keys that did not exist before.
    pub added: u64,
    /// Keys whose value changed.
    pub modified: u64,
    /// Keys that no longer exist.
    pub removed: u64,
    /// The first [`ChangeSummary::NAMED`] changed keys, in key order.
    pub keys: Vec<Key>,
    /// How many of the changed keys are workspace files (`fs` keys); the others are objects
    /// (a command's output, a task, a review).
    pub files: u64,
}

impl ChangeSummary {
    /// How many keys a summary names at most.
    pub const NAMED: usize = 32;

    /// All changed keys.
    pub fn total(&self) -> u64 {
        self.added + self.modified + self.removed
    }

    /// How many of the changed keys are objects rather than files.
    pub fn objects(&self) -> u64 {
        self.total().saturating_sub(self.files)
    }
}

/// The record of the decision that let an operation through.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecisionRef {
    /// The policy version that decided.
    pub policy_version: u64,
    /// The rules that decided.
    pub rules: Vec<String>,
}

/// One immutable record of the operation log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    /// The hash of everything below: tamper-evident, and covers the parents' ids.
    pub id: OpId,
    /// Position in this environment's log (1 for the first op).
    pub seq: u64,
    /// The operations this one follows: one, two for a merge, none for the first.
    pub parents: Vec<OpId>,
    /// The root of the view this operation produced.
    pub view: Hash,
    /// The branch whose head it moved.
    pub branch: String,
    /// Who did it.
    pub actor: ActorId,
    /// Why.
    pub intent: Intent,
    /// The version the actor based the action on (for a rebased act, older than the parent).
    pub base_version: Option<OpId>,
    /// What changed relative to the first parent.
    pub summary: ChangeSummary,
    /// Capture, rollback, merge…
    pub flags: OpFlags,
    /// Wall-clock time of the commit, in milliseconds since the epoch.
    pub time_ms: i64,
    /// The authorization decision, when a policy decided.
    pub decision: Option<DecisionRef>,
    /// For a restore: the version whose view it brought back.
    pub restored_from: Option<OpId>,
    /// Effect ids this operation refers to.
    pub effects: Vec<u64>,
}

/// The hashed part of an operation (all but `id` and `seq`): field order is the hash format.
#[derive(Serialize)]
struct OpBody<'a> {
    parents: &'a [OpId],
    view: &'a Hash,
    branch: &'a str,
    actor: &'a ActorId,
    intent: &'a Intent,
    base_version: &'a Option<OpId>,
    summary: &'a ChangeSummary,
    flags: OpFlags,
    time_ms: i64,
    decision: &'a Option<DecisionRef>,
    restored_from: &'a Option<OpId>,
    effects: &'a [u64],
}

impl Operation {
    fn body(&self) -> OpBody<'_> {
        OpBody {
            parents: &self.parents,
            view: &self.view,
            branch: &self.branch,
            actor: &self.actor,
            intent: &self.intent,
            base_version: &self.base_version,
            summary: &self.summary,
            flags: self.flags,
            time_ms: self.time_ms,
            decision: &self.decision,
            restored_from: &self.restored_from,
            effects: &self.effects,
        }
    }

    /// Computes the id this record must have.
    pub fn compute_id(&self) -> OpId {
        crate::encoding::with_encoding(&self.body(), |bytes| {
            OpId(Hash::of(b"environment-op-v1", bytes))
        })
    }

    /// Calls `f` with the id this record must have and the record's stored encoding (its
    /// postcard encoding with that id). The encoding is the id, the sequence number, then the
    /// hashed part (`Operation`'s fields are `OpBody`'s after those two), so the hashed part is
    /// encoded once for both.
    pub(crate) fn sealed<R>(&self, f: impl FnOnce(OpId, &[u8]) -> R) -> R {
        let id = std::cell::Cell::new(Hash([0; 32]));
        crate::encoding::with_written(
            |buf| {
                buf.extend_from_slice(&[0; 32]);
                crate::encoding::varint(buf, self.seq);
                let body = buf.len();
                crate::encoding::encode_into(&self.body(), buf);
                let hash = Hash::of(b"environment-op-v1", &buf[body..]);
                buf[..32].copy_from_slice(&hash.0);
                id.set(hash);
            },
            |record| f(OpId(id.get()), record),
        )
    }

    /// An operation from its stored encoding (the record a store keeps, see
    /// [`crate::store::LogWrite::append`]).
    pub fn decode(record: &[u8]) -> crate::error::Result<Operation> {
        postcard::from_bytes(record).map_err(|e| crate::error::EnvError::Decode {
            what: "operation",
            detail: e.to_string(),
        })
    }

    /// Whether the id matches the record.
    pub fn is_intact(&self) -> bool {
        self.compute_id() == self.id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Operation ids chain the log, and records are stored as encoded: those written by earlier
    /// builds must hash and decode the same. These digests were computed by the build that
    /// introduced layout 4.
    #[test]
    fn operation_ids_stay_as_written() {
        let id = |s: &[u8]| OpId(Hash::of(b"test", s));
        let op = Operation {
            id: id(b"unused"),
            seq: 12,
            parents: vec![id(b"p1"), id(b"p2")],
            view: Hash::of(b"test", b"view"),
            branch: "main".into(),
            actor: ActorId::new("agent:coder-1").unwrap(),
            intent: Intent::new(IntentKind::Merge, "merge feature ✓"),
            base_version: Some(id(b"base")),
            summary: ChangeSummary {
                added: 1,
                modified: 2,
                removed: 3,
                keys: vec![
                    Key::fs("src/lib.rs").unwrap(),
                    Key::fs(vec![b'b', 0xff]).unwrap(),
                ],
                files: 2,
            },
            flags: OpFlags::MERGE | OpFlags::REBASED,
            time_ms: 1_700_000_000_000,
            decision: Some(DecisionRef {
                policy_version: 4,
                rules: vec!["allow-writers".into()],
            }),
            restored_from: Some(id(b"restored")),
            effects: vec![7, 1 << 40],
        };
        assert_eq!(
            op.compute_id().0.to_hex(),
            "999d8ff76d34f88eb9e1d81e0a15fd99298ba7476f12dd06f20446478a5df320"
        );
        let record = postcard::to_stdvec(&op).unwrap();
        assert_eq!(
            blake3::hash(&record).to_hex().as_str(),
            "7b78c7eadf7e6ae3830a196298a31b7449af1e09104823a577ab3e90ace4ae5b"
        );
        assert_eq!(postcard::from_bytes::<Operation>(&record).unwrap(), op);
        // The writer's encoding: the same record, with the id it must have.
        let (id, sealed) = op.sealed(|id, record| (id, record.to_vec()));
        assert_eq!(id, op.compute_id());
        assert_eq!(
            sealed,
            postcard::to_stdvec(&Operation { id, ..op }).unwrap()
        );
    }
}
