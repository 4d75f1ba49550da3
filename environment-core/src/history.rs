//! History for agents: the key nodes of a branch, with runs of automatic captures squashed into
//! one line. These are the types of [`Environment::history`](crate::Environment::history).

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::op::{OpFlags, OpId, Operation};

/// What to include.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
