//! The JSON forms every door shows of core's records: ids and hashes as hex text, keys as
//! escaped paths, bytes as lossy text. Each is a type with a schema, so an answer that holds
//! one is described by the same code that writes it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::authz::Verdict;
use crate::local::{EffectRecord, HistoryEntry, RefusedChange};
use crate::op::{OpId, Operation};
use crate::tree::KeyChange;
use crate::value::Value;

fn ids(v: &[OpId]) -> Vec<String> {
    v.iter().map(ToString::to_string).collect()
}

/// An operation of the log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Op {
    /// The operation's id (hex).
    pub id: String,
    /// Its position in the log (1 is the first).
    pub seq: u64,
    /// The operations it follows (two for a merge).
    pub parents: Vec<String>,
    /// The branch it was recorded on.
    pub branch: String,
    /// Who did it.
    pub actor: String,
    /// Why.
    pub intent: OpIntent,
    /// The version the actor saw when it began, if it said.
    pub base_version: Option<String>,
    /// What changed.
    pub summary: OpSummary,
    /// Its flags (`capture`, `restore`, `undo`…).
    pub flags: Vec<String>,
    /// When, in ms since the epoch.
    pub time_ms: i64,
    /// The version a restore brought back.
    pub restored_from: Option<String>,
    /// The effects performed in it.
    pub effects: Vec<u64>,
    /// The policy's decision that let it through, when a policy decided.
    pub decision: Option<OpDecision>,
}

/// The decision that let an operation through.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpDecision {
    /// The policy's version then.
    pub policy_version: u64,
    /// The rules that allowed it.
    pub rules: Vec<String>,
}

/// Why an operation was done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpIntent {
    /// `edit`, `capture`, `restore`, `merge`, `command`…
    pub kind: String,
    /// In the actor's words.
    pub text: String,
}

/// What an operation changed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OpSummary {
    /// Keys added.
    pub added: u64,
    /// Keys modified.
    pub modified: u64,
    /// Keys removed.
    pub removed: u64,
    /// Files among them.
    pub files: u64,
    /// The first keys changed, as paths.
    pub keys: Vec<String>,
}

impl From<&Operation> for Op {
    fn from(op: &Operation) -> Op {
        Op {
            id: op.id.to_string(),
            seq: op.seq,
            parents: ids(&op.parents),
            branch: op.branch.clone(),
            actor: op.actor.as_str().to_owned(),
            intent: OpIntent {
                kind: op.intent.kind.to_string(),
                text: op.intent.text.clone(),
            },
            base_version: op.base_version.map(|v| v.to_string()),
            summary: OpSummary {
                added: op.summary.added,
                modified: op.summary.modified,
                removed: op.summary.removed,
                files: op.summary.files,
                keys: op.summary.keys.iter().map(|k| k.display_path()).collect(),
            },
            flags: op.flags.names().into_iter().map(str::to_owned).collect(),
            time_ms: op.time_ms,
            restored_from: op.restored_from.map(|v| v.to_string()),
            effects: op.effects.clone(),
            decision: op.decision.as_ref().map(|d| OpDecision {
                policy_version: d.policy_version,
                rules: d.rules.clone(),
            }),
        }
    }
}

/// One line of a branch's history: an operation worth reading on its own, or a run of
/// automatic captures squashed; both carry the line an agent reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum HistoryLine {
    /// An operation, its marks, and whether a branch forks there.
    Op {
        /// The operation.
        #[serde(flatten)]
        op: Box<Op>,
        /// The marks that name it.
        marks: Vec<String>,
        /// A branch starts here.
        fork_point: bool,
        /// The line as an agent reads it.
        text: String,
    },
    /// A run of automatic captures.
    Captures {
        /// How many.
        count: usize,
        /// The newest's id.
        newest: String,
        /// The oldest's id.
        oldest: String,
        /// Keys changed over the run.
        changed: u64,
        /// Captures that changed nothing.
        quiet: usize,
        /// Time of the oldest, ms since the epoch.
        from_ms: i64,
        /// Time of the newest.
        to_ms: i64,
        /// The line as an agent reads it.
        text: String,
    },
}

impl From<&HistoryEntry> for HistoryLine {
    fn from(e: &HistoryEntry) -> HistoryLine {
        let text = e.to_string();
        match e {
            HistoryEntry::Op {
                op,
                marks,
                fork_point,
            } => HistoryLine::Op {
                op: Box::new(Op::from(&**op)),
                marks: marks.clone(),
                fork_point: *fork_point,
                text,
            },
            HistoryEntry::Captures {
                count,
                newest,
                oldest,
                changed,
                quiet,
                from_ms,
                to_ms,
            } => HistoryLine::Captures {
                count: *count,
                newest: newest.to_string(),
                oldest: oldest.to_string(),
                changed: *changed,
                quiet: *quiet,
                from_ms: *from_ms,
                to_ms: *to_ms,
                text,
            },
        }
    }
}

/// A key's change between two versions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Change {
    /// The key, as a path.
    pub path: String,
    /// Its namespace (`fs` for workspace files).
    pub namespace: String,
    /// `added`, `removed` or `modified`.
    pub change: String,
    /// What was there before (none when added).
    pub before: Option<Entry>,
    /// What is there after (none when removed).
    pub after: Option<Entry>,
}

/// A stored entry's kind, size and mode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// `file`, `dir`, `symlink`…
    pub kind: String,
    /// In bytes.
    pub size: u64,
    /// The Unix mode bits.
    pub mode: u32,
}

impl From<&Value> for Entry {
    fn from(v: &Value) -> Entry {
        Entry {
            kind: format!("{:?}", v.meta.kind).to_lowercase(),
            size: v.meta.size,
            mode: v.meta.mode,
        }
    }
}

impl From<&KeyChange> for Change {
    fn from(c: &KeyChange) -> Change {
        Change {
            path: c.key.display_path(),
            namespace: c.key.namespace().as_str().to_owned(),
            change: c.change().to_owned(),
            before: c.before.as_ref().map(Entry::from),
            after: c.after.as_ref().map(Entry::from),
        }
    }
}

/// A change the actor made that its rules did not allow: put back in the tree, kept here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Refused {
    /// Its id.
    pub id: u64,
    /// The path, escaped.
    pub path: String,
    /// `write` or `delete`.
    pub change: String,
    /// Who made it.
    pub actor: String,
    /// On which branch.
    pub branch: String,
    /// The branch's head when it was refused.
    pub head: String,
    /// `deny`, `needs approval`, or `stale` (the branch changed the path since the version the
    /// change was made on).
    pub verdict: String,
    /// Why, in a few words.
    pub reason: String,
    /// The rules that decided.
    pub rules: Vec<String>,
    /// When, in ms since the epoch.
    pub time_ms: i64,
}

impl From<&RefusedChange> for Refused {
    fn from(r: &RefusedChange) -> Refused {
        Refused {
            id: r.id,
            path: r.key.display_path(),
            change: if r.value.is_some() { "write" } else { "delete" }.to_owned(),
            actor: r.actor.as_str().to_owned(),
            branch: r.branch.clone(),
            head: r.head.to_string(),
            verdict: match r.decision.verdict {
                Verdict::NeedsApproval { .. } => "needs approval",
                Verdict::Stale { .. } => "stale",
                _ => "deny",
            }
            .to_owned(),
            reason: crate::local::refused_reason(&r.decision),
            rules: r.decision.rules.clone(),
            time_ms: r.time_ms,
        }
    }
}

/// An effect on the world outside, as its log holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Effect {
    /// Its id.
    pub id: u64,
    /// The idempotency key.
    pub key: String,
    /// The service acted on.
    pub target: String,
    /// `pending`, `in_flight`, `done`, `failed`…
    pub state: String,
    /// Who began it.
    pub actor: String,
    /// How many times it was begun.
    pub attempts: u32,
    /// A note on its state.
    pub note: Option<String>,
    /// What was asked (lossy text).
    pub request: String,
    /// What it returned (lossy text).
    pub result: Option<String>,
    /// When it was begun, ms since the epoch.
    pub created_ms: i64,
    /// When it last changed.
    pub updated_ms: i64,
}

impl From<&EffectRecord> for Effect {
    fn from(e: &EffectRecord) -> Effect {
        Effect {
            id: e.id,
            key: e.key.clone(),
            target: e.target.clone(),
            state: e.state.as_str().to_owned(),
            actor: e.actor.clone(),
            attempts: e.attempts,
            note: e.note.clone(),
            request: String::from_utf8_lossy(&e.request).into_owned(),
            result: e
                .result
                .as_ref()
                .map(|r| String::from_utf8_lossy(r).into_owned()),
            created_ms: e.created_ms,
            updated_ms: e.updated_ms,
        }
    }
}
