//! Refused changes: what an actor changed in a tree that it was not allowed to record.
//!
//! A command's writes happen before anyone can decide on them. The ones its actor may not make
//! are neither recorded as the actor's (the policy said no) nor laundered into the branch under
//! another actor: they are kept here, with the actor, the intent and the decision that refused
//! them, and their content stays in the blob store (garbage collection keeps it) so nothing the
//! actor did is lost. The tree is put back by whoever found the change (the sandbox's capture).

use std::collections::HashSet;

use serde::{Deserialize, Serialize};

use super::LocalEnvironment;
use crate::action::{Change, RefusedChange};
use crate::authz::{ActorId, Decision};
use crate::clock::Clock;
use crate::error::{EnvError, Result};
use crate::hash::Hash;
use crate::key::Key;
use crate::op::{Intent, OpId};
use crate::store::{LogRead, LogWrite};
use crate::value::{Content, Value};

/// What [`RefusedChange`] stores (all but the id, which is the row's).
#[derive(Serialize, Deserialize)]
struct Stored {
    actor: ActorId,
    branch: String,
    head: OpId,
    key: Key,
    value: Option<Value>,
    intent: Intent,
    decision: Decision,
    time_ms: i64,
}

/// A refused change not recorded yet.
pub(crate) struct Refused {
    pub key: Key,
    pub value: Option<Value>,
    pub decision: Decision,
}

impl Refused {
    /// `change`, refused by `decision`.
    pub(crate) fn of(change: Change, decision: Decision) -> Refused {
        let (key, value) = match change {
            Change::Put(k, v) => (k, Some(v)),
            Change::Delete(k) => (k, None),
        };
        Refused {
            key,
            value,
            decision,
        }
    }
}

/// Records `refused` in the writer's transaction, as changes of `actor` on `branch` refused
/// against `head`.
pub(crate) fn record(
    tx: &mut dyn LogWrite,
    actor: &ActorId,
    branch: &str,
    head: OpId,
    intent: &Intent,
    clock: &dyn Clock,
    refused: Vec<Refused>,
) -> Result<Vec<RefusedChange>> {
    if refused.is_empty() {
        return Ok(Vec::new());
    }
    let time_ms = clock.now_ms();
    let mut out = Vec::with_capacity(refused.len());
    for r in refused {
        let stored = Stored {
            actor: actor.clone(),
            branch: branch.to_owned(),
            head,
            key: r.key,
            value: r.value,
            intent: intent.clone(),
            decision: r.decision,
            time_ms,
        };
        let record = serde_json::to_vec(&stored).map_err(|e| EnvError::Decode {
            what: "refused change",
            detail: e.to_string(),
        })?;
        let id = tx.add_refused(actor.as_str(), time_ms, &record)?;
        out.push(stored.with_id(id));
    }
    Ok(out)
}

impl Stored {
    fn with_id(self, id: u64) -> RefusedChange {
        RefusedChange {
            id,
            actor: self.actor,
            branch: self.branch,
            head: self.head,
            key: self.key,
            value: self.value,
            intent: self.intent,
            decision: self.decision,
            time_ms: self.time_ms,
        }
    }
}

fn decode(id: u64, record: &[u8]) -> Result<RefusedChange> {
    let stored: Stored = serde_json::from_slice(record).map_err(|e| EnvError::Decode {
        what: "refused change",
        detail: format!("{id}: {e}"),
    })?;
    Ok(stored.with_id(id))
}

/// Adds the blobs refused changes hold to `live` and their chunk manifests to `manifests`.
pub(crate) fn held_blobs(
    log: &dyn LogRead,
    live: &mut HashSet<Hash>,
    manifests: &mut HashSet<Hash>,
) -> Result<()> {
    log.refused_before(u64::MAX, &mut |id, record| {
        let r = decode(id, record)?;
        match r.value.map(|v| v.content) {
            Some(Content::Blob(h)) => {
                live.insert(h);
            }
            Some(Content::Chunks(m)) => {
                manifests.insert(m);
            }
            Some(Content::Inline(_)) | None => {}
        }
        Ok(true)
    })
}

impl LocalEnvironment {
    /// The changes refused on `branch`, newest first, at most `limit`. Reading them is reading
    /// the branch's history.
    ///
    /// ```
    /// # use environment_core::{ActorId, LocalEnvironment, MAIN, Options};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let env = LocalEnvironment::open(dir.path(), Options::default())?;
    /// let refused = env.refused(&ActorId::new("human:ann")?, MAIN, 10)?;
    /// assert!(refused.is_empty()); // nothing was refused yet
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn refused(
        &self,
        actor: &ActorId,
        branch: &str,
        limit: usize,
    ) -> Result<Vec<RefusedChange>> {
        self.refused_before(actor, branch, None, limit)
    }

    /// [`LocalEnvironment::refused`] from before the refused change `before` (the id of the
    /// last one a caller has): the next page of the list.
    pub fn refused_before(
        &self,
        actor: &ActorId,
        branch: &str,
        before: Option<u64>,
        limit: usize,
    ) -> Result<Vec<RefusedChange>> {
        self.may_read_history(actor, branch)?;
        let before = before.unwrap_or(u64::MAX);
        self.inner.read(|log| {
            let mut out = Vec::new();
            if limit == 0 {
                return Ok(out);
            }
            log.refused_before(before, &mut |id, record| {
                let r = decode(id, record)?;
                if r.branch == branch {
                    out.push(r);
                }
                Ok(out.len() < limit)
            })?;
            Ok(out)
        })
    }
}

/// What an agent is told of the changes a command made that its actor may not make, from
/// their [`json::Refused`](crate::json::Refused) forms: what happened, in one sentence, and what
/// to do next; `None` when there are none. The same words whichever door the command came
/// through.
pub fn put_back_note(refused: &[crate::json::Refused]) -> Option<(String, String)> {
    let first = refused.first()?;
    const NAMED: usize = 5;
    let named: Vec<String> = refused
        .iter()
        .take(NAMED)
        .map(|r| format!("{} ({})", r.path, r.change))
        .collect();
    let more = match refused.len().saturating_sub(NAMED) {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    if refused.iter().all(|r| r.verdict == "stale") {
        let sentence = format!(
            "{} change(s) were NOT recorded: another working copy or an action changed the same \
             paths first ({}), so they were put back to the branch's version and kept as \
             refused changes: {}{more}",
            refused.len(),
            first.reason,
            named.join(", "),
        );
        let next = "read these paths again and redo the change on top of what they hold now";
        return Some((sentence, next.to_owned()));
    }
    let sentence = format!(
        "{} change(s) were NOT recorded: {} may not make them ({}), so they were put back to \
         their state before the command and kept as refused changes: {}{more}",
        refused.len(),
        first.actor,
        first.reason,
        named.join(", "),
    );
    let next = "leave these paths alone, or ask for a rule or an approval that allows them";
    Some((sentence, next.to_owned()))
}

/// Why a change was refused, in a few words (the decision's explanation is written for an
/// action asked for, and says more than a put-back change needs).
pub(crate) fn reason(d: &Decision) -> String {
    match &d.verdict {
        crate::authz::Verdict::NeedsApproval { from, .. } if !from.is_empty() => {
            format!("it needs an approval from {}", from.join(" or "))
        }
        crate::authz::Verdict::NeedsApproval { .. } => "it needs an approval".to_owned(),
        crate::authz::Verdict::Stale { by } => format!(
            "the branch changed it since the tree's version, by {}",
            by.iter()
                .map(|op| op.get(..12).unwrap_or(op))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ if d.rules.is_empty() => "no rule permits it".to_owned(),
        _ => format!("forbidden by {}", d.rules.join(", ")),
    }
}
