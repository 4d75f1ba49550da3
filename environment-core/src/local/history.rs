//! History for agents: the key nodes of a branch, with runs of automatic captures squashed.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::LocalEnvironment;
use super::branch::marks_in;
use crate::authz::{Action, ActorId, Resource};
use crate::error::Result;
use crate::op::{OpFlags, OpId, Operation};

/// What to include.
#[derive(Clone, Debug)]
pub struct HistoryOptions {
    /// Every operation, nothing squashed.
    pub all: bool,
    /// At most this many entries (newest first).
    pub limit: usize,
}

impl Default for HistoryOptions {
    fn default() -> HistoryOptions {
        HistoryOptions {
            all: false,
            limit: 50,
        }
    }
}

/// One line of history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HistoryEntry {
    /// An operation worth reading on its own.
    Op {
        /// The record.
        op: Arc<Operation>,
        /// Marks naming it.
        marks: Vec<String>,
        /// Other branches start here.
        fork_point: bool,
    },
    /// A run of automatic captures, squashed into one line.
    Captures {
        /// How many.
        count: usize,
        /// The newest.
        newest: OpId,
        /// The oldest.
        oldest: OpId,
        /// Keys changed, summed over the run.
        changed: u64,
        /// How many of them touched only quiet paths.
        quiet: usize,
        /// Time of the oldest, ms since the epoch.
        from_ms: i64,
        /// Time of the newest.
        to_ms: i64,
    },
}

impl HistoryEntry {
    /// The entry as JSON: an operation ([`Operation::to_json`] with `type` `op`, its marks and
    /// whether it is a fork point) or a run of squashed captures (`type` `captures`); both
    /// carry the one-line `text` an agent reads.
    pub fn to_json(&self) -> serde_json::Value {
        let mut v = match self {
            HistoryEntry::Op {
                op,
                marks,
                fork_point,
            } => {
                let mut v = op.to_json();
                v["type"] = "op".into();
                v["marks"] = serde_json::json!(marks);
                v["fork_point"] = (*fork_point).into();
                v
            }
            HistoryEntry::Captures {
                count,
                newest,
                oldest,
                changed,
                quiet,
                from_ms,
                to_ms,
            } => serde_json::json!({
                "type": "captures",
                "count": count,
                "newest": newest.to_string(),
                "oldest": oldest.to_string(),
                "changed": changed,
                "quiet": quiet,
                "from_ms": from_ms,
                "to_ms": to_ms,
            }),
        };
        v["text"] = self.to_string().into();
        v
    }
}

impl fmt::Display for HistoryEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HistoryEntry::Op {
                op,
                marks,
                fork_point,
            } => {
                write!(
                    f,
                    "{} #{} {} {}: {:?}",
                    op.id.short(),
                    op.seq,
                    op.actor,
                    op.intent.kind,
                    op.intent.text
                )?;
                let s = &op.summary;
                if s.total() > 0 {
                    write!(f, " (+{} ~{} -{}", s.added, s.modified, s.removed)?;
                    if s.files > 0 && s.objects() > 0 {
                        // A command's operation holds its files and its output objects: say
                        // how many files it changed.
                        let plural = |n: u64| if n == 1 { "" } else { "s" };
                        write!(
                            f,
                            "; {} file{} changed, {} object{}",
                            s.files,
                            plural(s.files),
                            s.objects(),
                            plural(s.objects())
                        )?;
                    }
                    if let Some(k) = s.keys.first() {
                        write!(f, "; {k}")?;
                        if s.total() > 1 {
                            write!(f, " …")?;
                        }
                    }
                    write!(f, ")")?;
                }
                let mut tags: Vec<String> = op
                    .flags
                    .names()
                    .into_iter()
                    .filter(|n| *n != "branch")
                    .map(str::to_owned)
                    .collect();
                if op.flags.contains(OpFlags::BRANCH) {
                    tags.push(format!("branch {}", op.branch));
                }
                if let Some(r) = &op.restored_from {
                    tags.push(format!("to {}", r.short()));
                }
                if *fork_point {
                    tags.push("fork point".into());
                }
                tags.extend(marks.iter().map(|m| format!("mark {m}")));
                if !tags.is_empty() {
                    write!(f, " [{}]", tags.join(", "))?;
                }
                Ok(())
            }
            HistoryEntry::Captures {
                count,
                newest,
                oldest,
                changed,
                quiet,
                ..
            } => {
                write!(
                    f,
                    "{}..{} {count} automatic capture(s), {changed} key change(s)",
                    oldest.short(),
                    newest.short()
                )?;
                if *quiet > 0 {
                    write!(f, " ({quiet} quiet)")?;
                }
                Ok(())
            }
        }
    }
}

impl LocalEnvironment {
    /// The history of `branch`, newest first, following first parents. By default only the key
    /// nodes — acts, commands, failures, rollbacks, merges, branch and fork points, marks — with
    /// each run of automatic captures squashed into one entry; `all` lists every operation.
    pub fn history(
        &self,
        actor: &ActorId,
        branch: &str,
        options: &HistoryOptions,
    ) -> Result<Vec<HistoryEntry>> {
        self.authorize(
            actor,
            Action::Read,
            Resource::Branch(branch.into()),
            Some(branch),
            Some("history"),
        )?;
        let head = self.head(branch)?;
        let dropped = self.inner.readers.with(super::retention::dropped_in)?;
        let (marks, forks) = self.inner.readers.with(|conn| {
            let marks = marks_in(conn)?;
            let mut stmt = conn.prepare_cached("SELECT op FROM forks")?;
            let forks: HashSet<Vec<u8>> = stmt
                .query_map([], |r| r.get::<_, Vec<u8>>(0))?
                .collect::<rusqlite::Result<_>>()?;
            Ok((marks, forks))
        })?;
        let mut out: Vec<HistoryEntry> = Vec::new();
        let mut cur = Some(head);
        while let Some(id) = cur {
            if out.len() >= options.limit {
                break;
            }
            let op = self.op(&id)?;
            cur = op.parents.first().copied();
            if dropped.contains(&op.id) {
                // Thinned out: its child is shown attached to the next kept ancestor.
                continue;
            }
            let op_marks: Vec<String> = marks
                .iter()
                .filter(|(_, m)| *m == op.id)
                .map(|(n, _)| n.clone())
                .collect();
            let fork_point = forks.contains(&op.id.0.0[..]);
            let squashable = !options.all
                && op.flags.intersects(OpFlags::AUTO_CAPTURE | OpFlags::QUIET)
                && !op
                    .flags
                    .intersects(OpFlags::FAILED | OpFlags::ROLLBACK | OpFlags::MERGE)
                && op_marks.is_empty()
                && !fork_point;
            if squashable {
                let quiet = usize::from(op.flags.contains(OpFlags::QUIET));
                if let Some(HistoryEntry::Captures {
                    count,
                    oldest,
                    changed,
                    quiet: q,
                    from_ms,
                    ..
                }) = out.last_mut()
                {
                    *count += 1;
                    *oldest = op.id;
                    *changed += op.summary.total();
                    *q += quiet;
                    *from_ms = op.time_ms;
                    continue;
                }
                out.push(HistoryEntry::Captures {
                    count: 1,
                    newest: op.id,
                    oldest: op.id,
                    changed: op.summary.total(),
                    quiet,
                    from_ms: op.time_ms,
                    to_ms: op.time_ms,
                });
                continue;
            }
            out.push(HistoryEntry::Op {
                op,
                marks: op_marks,
                fork_point,
            });
        }
        Ok(out)
    }
}
