//! History for agents: the key nodes of a branch, with runs of automatic captures squashed.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use super::{Inner, LocalEnvironment};
use crate::authz::{Action, ActorId, Resource};
use crate::error::Result;
use crate::hash::Hash;
use crate::history::{HistoryEntry, HistoryOptions};
use crate::op::{OpFlags, OpId, Operation};
use crate::store::LogRead;
use crate::tree::KeyChange;

impl LocalEnvironment {
    /// Authorizes reading `branch`'s history (its log, its refused changes, where an undo
    /// goes): a read of the branch.
    pub(crate) fn may_read_history(&self, actor: &ActorId, branch: &str) -> Result<()> {
        self.authorize(
            actor,
            Action::Read,
            Resource::Branch(branch.into()),
            Some(branch),
            Some("history"),
        )
        .map(drop)
    }

    /// The history of `branch`, newest first, following first parents. By default only the key
    /// nodes — acts, commands, failures, rollbacks, merges, branch and fork points, marks — with
    /// each run of automatic captures squashed into one entry; `all` lists every operation.
    ///
    /// A run of captures costs one step however long it is (each operation is recorded with a
    /// summary of the run it ends), so the default history costs what it shows, not the length
    /// of the log.
    ///
    /// ```
    /// use environment_core::{ActorId, HistoryOptions, LocalEnvironment, Options};
    /// let home = tempfile::tempdir()?;
    /// let env = LocalEnvironment::open(home.path(), Options::default())?;
    /// let me = ActorId::new("human:me")?;
    /// let history = env.history(&me, "main", &HistoryOptions::default())?;
    /// assert_eq!(history.len(), 1); // the operation that created the environment
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn history(
        &self,
        actor: &ActorId,
        branch: &str,
        options: &HistoryOptions,
    ) -> Result<Vec<HistoryEntry>> {
        self.may_read_history(actor, branch)?;
        let head = self.head(branch)?;
        // One reading for the whole walk: one consistent state.
        self.inner
            .read_snapshot(|log| self.history_in(log, head, options))
    }

    /// [`LocalEnvironment::history`] from `from` (included) back, instead of from the head: the
    /// next page of a history read in pages. `from` must be an operation of `branch`.
    pub fn history_from(
        &self,
        actor: &ActorId,
        branch: &str,
        from: &OpId,
        options: &HistoryOptions,
    ) -> Result<Vec<HistoryEntry>> {
        self.may_read_history(actor, branch)?;
        let start = self.op(from)?;
        if start.branch != branch {
            return Err(crate::error::EnvError::UnknownVersion(format!(
                "{} is not an operation of {branch}",
                from.short()
            )));
        }
        self.inner
            .read_snapshot(|log| self.history_in(log, *from, options))
    }

    fn history_in(
        &self,
        log: &dyn LogRead,
        head: OpId,
        options: &HistoryOptions,
    ) -> Result<Vec<HistoryEntry>> {
        let dropped = log.dropped_seqs()?;
        let marks = log.marks()?;
        let forks: HashSet<OpId> = log.forks()?;
        // The operations that end a squashed run or drop out of it, by sequence number: a run
        // summary whose range holds none of them squashes as it was recorded.
        // A mark or fork whose operation cannot be read here leaves no summary trusted.
        let mut breaks: BTreeSet<u64> = dropped.clone();
        let mut summaries = true;
        for id in marks.iter().map(|(_, id)| id).chain(&forks) {
            match self.inner.stored_op_in(log, id) {
                Ok((op, _)) => {
                    breaks.insert(op.seq);
                }
                Err(_) => summaries = false,
            }
        }
        let mut out: Vec<HistoryEntry> = Vec::new();
        let mut cur = Some(head);
        while let Some(id) = cur {
            // A reader sees only committed operations: they may fill the shared cache.
            let (op, view) = self.inner.stored_op_in(log, &id)?;
            self.inner.ops.insert(id, (op.clone(), view.id));
            cur = op.parents.first().copied();
            if dropped.contains(&op.seq) {
                // Thinned out: its child is shown attached to the next kept ancestor.
                continue;
            }
            let op_marks: Vec<String> = marks
                .iter()
                .filter(|(_, m)| *m == op.id)
                .map(|(n, _)| n.clone())
                .collect();
            let fork_point = forks.contains(&op.id);
            let captures = !options.all && squashes(&op) && op_marks.is_empty() && !fork_point;
            let joins_last = captures && matches!(out.last(), Some(HistoryEntry::Captures { .. }));
            // The limit counts entries, and the last one is whole: a run is never cut short.
            if out.len() >= options.limit && !joins_last {
                break;
            }
            if !captures {
                out.push(HistoryEntry::Op {
                    op,
                    marks: op_marks,
                    fork_point,
                });
                continue;
            }
            // The whole run this operation ends, when nothing inside it is marked, forked from
            // or dropped; else this operation alone, and the walk goes on to its parent.
            let run = summaries
                .then(|| CaptureRun::of(log, op.seq))
                .transpose()?
                .flatten()
                .filter(|r| breaks.range(r.start_seq..=op.seq).next().is_none())
                .unwrap_or_else(|| CaptureRun::after(None, &op));
            cur = run.before;
            if let Some(HistoryEntry::Captures {
                count,
                oldest,
                changed,
                quiet,
                from_ms,
                ..
            }) = out.last_mut()
            {
                *count += run.len as usize;
                *oldest = run.start;
                *changed += run.changed;
                *quiet += run.quiet as usize;
                *from_ms = run.from_ms;
                continue;
            }
            out.push(HistoryEntry::Captures {
                count: run.len as usize,
                newest: op.id,
                oldest: run.start,
                changed: run.changed,
                quiet: run.quiet as usize,
                from_ms: run.from_ms,
                to_ms: op.time_ms,
            });
        }
        Ok(out)
    }
}

/// One operation as a reader sees it: the record, the marks naming it and what it changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShownOp {
    /// The record.
    pub op: Arc<Operation>,
    /// Marks naming it.
    pub marks: Vec<String>,
    /// The keys it changed against its first parent; `None` when that cannot be said: the
    /// first operation has no parent, and a version retention dropped may have lost its
    /// content.
    pub changes: Option<Vec<KeyChange>>,
}

impl LocalEnvironment {
    /// One operation and what it changed, for `actor`: reading it is reading its branch, and
    /// its changes are a diff (so they need what [`diff`](LocalEnvironment::diff) needs).
    ///
    /// ```
    /// use environment_core::{ActorId, LocalEnvironment, Options};
    /// let home = tempfile::tempdir()?;
    /// let env = LocalEnvironment::open(home.path(), Options::default())?;
    /// let me = ActorId::new("human:me")?;
    /// let first = env.show(&me, &env.head("main")?)?;
    /// assert!(first.changes.is_none()); // nothing came before it
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn show(&self, actor: &ActorId, version: &OpId) -> Result<ShownOp> {
        let op = self.op(version)?;
        self.authorize(
            actor,
            Action::Read,
            Resource::Branch(op.branch.clone()),
            Some(&op.branch),
            Some("show"),
        )?;
        let changes = match op.parents.first() {
            Some(p) if !self.is_dropped(p)? && !self.is_dropped(version)? => {
                Some(self.diff(actor, p, version, None)?)
            }
            _ => None,
        };
        let marks = self
            .marks()?
            .into_iter()
            .filter(|(_, v)| v == version)
            .map(|(n, _)| n)
            .collect();
        Ok(ShownOp { op, marks, changes })
    }
}

/// Whether history squashes `op` into a run of automatic captures (unless it is marked or a
/// fork point, which only the walk knows).
fn squashes(op: &Operation) -> bool {
    op.flags.intersects(OpFlags::AUTO_CAPTURE | OpFlags::QUIET)
        && !op
            .flags
            .intersects(OpFlags::FAILED | OpFlags::ROLLBACK | OpFlags::MERGE)
}

/// The run of squashable captures an operation ends, along first parents: recorded with the
/// operation (`ops.run`) from its parent's, so that history squashes a run of any length in
/// one step. The summary is derived from the log and never the truth: when it is missing (an
/// operation recorded by an earlier build) or unreadable, or when a mark, a fork point or a
/// dropped operation lies in its range, history reads the operations one by one instead, with
/// the same result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CaptureRun {
    /// The run's oldest operation.
    start: OpId,
    start_seq: u64,
    /// The oldest operation's first parent, where the walk goes on.
    before: Option<OpId>,
    /// Operations in the run.
    len: u64,
    /// Key changes, summed over the run.
    changed: u64,
    /// How many of them touched only quiet paths.
    quiet: u64,
    /// Time of the oldest.
    from_ms: i64,
}

const RUN_FIXED: usize = 32 + 8 * 5;

impl CaptureRun {
    /// The run `op` ends, `prev` being the one its first parent ends (if that parent squashes).
    fn after(prev: Option<&CaptureRun>, op: &Operation) -> CaptureRun {
        let quiet = u64::from(op.flags.contains(OpFlags::QUIET));
        match prev {
            Some(p) => CaptureRun {
                len: p.len + 1,
                changed: p.changed + op.summary.total(),
                quiet: p.quiet + quiet,
                ..*p
            },
            None => CaptureRun {
                start: op.id,
                start_seq: op.seq,
                before: op.parents.first().copied(),
                len: 1,
                changed: op.summary.total(),
                quiet,
                from_ms: op.time_ms,
            },
        }
    }

    /// The run `op` will end once recorded, or `None` when it does not squash. Called in the
    /// writer's transaction, before `op` is sealed: see [`CaptureRun::sealed`].
    pub(crate) fn pending(
        inner: &Inner,
        log: &dyn LogRead,
        op: &Operation,
    ) -> Result<Option<CaptureRun>> {
        if !squashes(op) {
            return Ok(None);
        }
        let prev = match op.parents.first() {
            Some(parent) => {
                let (p, _) = inner.stored_op_in(log, parent)?;
                if squashes(&p) {
                    CaptureRun::of(log, p.seq)?
                } else {
                    None
                }
            }
            None => None,
        };
        Ok(Some(CaptureRun::after(prev.as_ref(), op)))
    }

    /// The record of a pending run once its operation's id is known (a run that starts with
    /// the operation names it as its oldest).
    pub(crate) fn sealed(mut self, id: &OpId) -> Vec<u8> {
        if self.len == 1 {
            self.start = *id;
        }
        self.encode()
    }

    /// The summary recorded with the operation `seq`, if any.
    fn of(log: &dyn LogRead, seq: u64) -> Result<Option<CaptureRun>> {
        Ok(log.capture_run(seq)?.and_then(|b| CaptureRun::decode(&b)))
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(RUN_FIXED + 32);
        b.extend_from_slice(&self.start.0.0);
        for n in [self.start_seq, self.len, self.changed, self.quiet] {
            b.extend_from_slice(&n.to_le_bytes());
        }
        b.extend_from_slice(&self.from_ms.to_le_bytes());
        if let Some(p) = &self.before {
            b.extend_from_slice(&p.0.0);
        }
        b
    }

    fn decode(b: &[u8]) -> Option<CaptureRun> {
        if b.len() != RUN_FIXED && b.len() != RUN_FIXED + 32 {
            return None;
        }
        let id =
            |at: usize| -> Option<OpId> { Some(OpId(Hash(b.get(at..at + 32)?.try_into().ok()?))) };
        let n = |at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
        };
        Some(CaptureRun {
            start: id(0)?,
            start_seq: n(32)?,
            len: n(40)?,
            changed: n(48)?,
            quiet: n(56)?,
            from_ms: n(64)? as i64,
            before: if b.len() > RUN_FIXED {
                Some(id(RUN_FIXED)?)
            } else {
                None
            },
        })
    }
}
