//! Three-way merge of views: a pure function of the base, ours and theirs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::authz::ActorId;
use crate::error::Result;
use crate::key::Key;
use crate::op::{Intent, OpId};
use crate::tree::{self, NodeSource, Ptr, Put, TreeEdit};
use crate::value::Value;

/// A key changed differently on both sides of a merge, before it is turned into a conflict object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KeyConflict {
    pub key: Key,
    pub base: Option<Value>,
    pub ours: Option<Value>,
    pub theirs: Option<Value>,
}

/// One side of a conflict: its value and who put it there, why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConflictSide {
    /// The side's value (`None`: deleted).
    pub value: Option<Value>,
    /// The operation that last changed the key on this side.
    pub op: Option<OpId>,
    /// Its actor.
    pub actor: Option<ActorId>,
    /// Its intent.
    pub intent: Option<Intent>,
}

/// The content of a conflict object: a key changed differently on both sides of a merge. It is
/// data, not an error: the merge commits with it in place, and an act that writes the key
/// resolves it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    /// The key.
    pub key: Key,
    /// The common ancestor's value.
    pub base: Option<Value>,
    /// The side merged into.
    pub ours: ConflictSide,
    /// The side merged from.
    pub theirs: ConflictSide,
}

impl Conflict {
    /// Reads a conflict object's content.
    pub fn from_value(v: &Value) -> Option<Conflict> {
        match &v.content {
            crate::value::Content::Inline(b) => serde_json::from_slice(b).ok(),
            crate::value::Content::Blob(_) | crate::value::Content::Chunks(_) => None,
        }
    }

    /// The conflict as a value of kind [`crate::EntryKind::Conflict`].
    pub fn to_value(&self) -> Value {
        Value::with_kind(
            crate::value::EntryKind::Conflict,
            serde_json::to_vec(self).unwrap_or_default(),
        )
    }
}

/// Merges `theirs` into `ours` against `base`. One-sided changes are taken; identical changes
/// merge; different changes on both sides become whatever `resolve` makes of them (a conflict
/// object). Returns the merged root and the conflicts.
pub(crate) fn merge_views(
    edit: &mut TreeEdit<'_>,
    base: &Ptr,
    ours: &Ptr,
    theirs: &Ptr,
    resolve: &mut dyn FnMut(&KeyConflict) -> Result<Value>,
) -> Result<(Ptr, Vec<KeyConflict>)> {
    if base == theirs || ours == theirs {
        return Ok((*ours, Vec::new()));
    }
    if base == ours {
        return Ok((*theirs, Vec::new()));
    }
    let src: &dyn NodeSource = edit;
    let ours_changed: BTreeMap<Key, Option<Value>> = tree::diff(src, base, ours, None)?
        .into_iter()
        .map(|c| (c.key, c.after))
        .collect();
    let mut puts: Vec<Put> = Vec::new();
    let mut conflicts = Vec::new();
    for c in tree::diff(src, base, theirs, None)? {
        match ours_changed.get(&c.key) {
            None => puts.push((c.key, c.after)),
            Some(o) if *o == c.after => {}
            Some(o) => {
                let k = KeyConflict {
                    key: c.key.clone(),
                    base: c.before,
                    ours: o.clone(),
                    theirs: c.after,
                };
                puts.push((c.key, Some(resolve(&k)?)));
                conflicts.push(k);
            }
        }
    }
    let (root, _) = tree::apply(edit, ours, &puts)?;
    Ok((root, conflicts))
}

/// What a merge did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeOutcome {
    /// The merge operation (or the unchanged head when there was nothing to merge).
    pub version: OpId,
    /// The keys that became conflict objects.
    pub conflicts: Vec<Key>,
    /// Nothing to merge: the source was already contained in the target.
    pub noop: bool,
}
