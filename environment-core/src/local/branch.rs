//! Branches, marks, merges and restores: operations that move heads without new content.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;

use super::act::existing_head;
use super::{Inner, LocalEnvironment, OpDraft, Permit, validate_name};
use crate::authz::{Action, ActorId, Resource};
use crate::error::{EnvError, Result};
use crate::key::Key;
use crate::merge::{Conflict, ConflictSide, KeyConflict, MergeOutcome, merge_views};
use crate::op::{ChangeSummary, Intent, IntentKind, OpFlags, OpId, Operation};
use crate::store::{LogRead, LogWrite, Nodes};
use crate::tree::{self, TreeEdit};

impl LocalEnvironment {
    /// Creates branch `name` at `from`, recording a branch operation there.
    pub fn create_branch(&self, actor: &ActorId, name: &str, from: &OpId) -> Result<OpId> {
        validate_name(name)?;
        let permit = Permit::from(self.decide(
            actor,
            Action::Write,
            Resource::Branch(name.into()),
            Some(name),
            Some("branch"),
        )?);
        let (name, from, actor) = (name.to_owned(), *from, actor.clone());
        self.inner.write(false, move |inner, tx| {
            if tx.head(&name)?.is_some() {
                return Err(EnvError::BranchExists(name));
            }
            let (_, base_view) = inner.stored_op_in(tx, &from)?;
            tx.add_fork(&from)?;
            let op = inner.commit_op(
                tx,
                OpDraft {
                    parents: vec![from],
                    view: base_view,
                    branch: name.clone(),
                    actor,
                    intent: Intent::new(IntentKind::Setup, format!("create branch {name}")),
                    base_version: Some(from),
                    summary: ChangeSummary::default(),
                    flags: OpFlags::BRANCH,
                    permit,
                    restored_from: None,
                    effects: Vec::new(),
                },
                None,
            )?;
            Ok(op.id)
        })
    }

    /// Names `version` as `name`. Marks are never moved or dropped by retention.
    pub fn mark(&self, actor: &ActorId, name: &str, version: &OpId) -> Result<()> {
        validate_name(name)?;
        let permit = self.decide(
            actor,
            Action::Write,
            Resource::Environment,
            None,
            Some("mark"),
        )?;
        let (name, version, actor) = (name.to_owned(), *version, actor.clone());
        self.inner.write(false, move |inner, tx| {
            inner.op_in(tx, &version)?;
            if tx.head(&name)?.is_some() {
                return Err(EnvError::BranchExists(name));
            }
            if tx.mark(&name)?.is_some() {
                return Err(EnvError::MarkExists(name));
            }
            // Spent once nothing else can refuse it.
            inner.spend(&permit.spend)?;
            let now = inner.options.clock.now_ms();
            tx.add_mark(&name, &version, actor.as_str(), now)
        })
    }

    /// Every mark with its version, by name.
    pub fn marks(&self) -> Result<Vec<(String, OpId)>> {
        self.inner.read(|log| log.marks())
    }

    /// Makes `branch`'s view the one of `target` again, by appending a rollback operation:
    /// history is never rewritten. Besides the branch, `actor` must be allowed to write or
    /// delete every key the restore changes; a refused restore changes nothing.
    pub fn restore(
        &self,
        actor: &ActorId,
        branch: &str,
        target: &OpId,
        intent: Intent,
    ) -> Result<OpId> {
        let target = *target;
        let this = self.clone();
        self.write_branch(
            actor,
            branch,
            "restore",
            move |inner, tx, branch, actor, permit| {
                let check = |a: &[tree::Applied]| this.decide_applied(&actor, branch, "restore", a);
                inner.restore_in(
                    tx,
                    branch,
                    &target,
                    ByActor {
                        actor: actor.clone(),
                        permit,
                        authorized: &check,
                    },
                    intent,
                )
            },
        )
    }

    /// Like [`LocalEnvironment::restore`], for a restore that must also be made real outside
    /// the log (the files of a live tree): once the restore is authorized (the branch and every
    /// key it changes), `apply` runs, and the rollback operation is recorded only if it
    /// succeeds. A refused restore runs nothing, so a denied actor never touches the files.
    pub fn restore_applying<E: From<EnvError>>(
        &self,
        actor: &ActorId,
        branch: &str,
        target: &OpId,
        intent: Intent,
        apply: impl FnOnce() -> std::result::Result<(), E>,
    ) -> std::result::Result<OpId, E> {
        let branch_permit = self.decide_branch_write(actor, branch, "restore")?;
        let head = self.head(branch)?;
        let changes = self.inner.read(|log| {
            let (_, from) = self.inner.stored_op_in(log, &head)?;
            let (_, to) = self.inner.stored_op_in(log, target)?;
            tree::diff(&Nodes(log), &from, &to, None)
        })?;
        let applied: Vec<tree::Applied> = changes.into_iter().map(tree::Applied::from).collect();
        let permit = branch_permit.join(self.decide_applied(actor, branch, "restore", &applied)?);
        // The files are the work: what the restore consumes is spent before they change.
        self.inner.spend(&permit.spend)?;
        apply()?;
        let permit = permit.spent();
        let (target, this) = (*target, self.clone());
        Ok(self.record_branch_write(
            actor,
            branch,
            Permit::default(),
            move |inner, tx, branch, actor, _| {
                // Recorded on the head it was authorized at; a head that moved meanwhile (an
                // act through the API) is decided again for what the restore now changes
                // (already spent for).
                let kept = existing_head(tx, branch)? == head;
                let check = |a: &[tree::Applied]| {
                    if kept {
                        Ok(permit.clone())
                    } else {
                        Ok(this.decide_applied(&actor, branch, "restore", a)?.spent())
                    }
                };
                inner.restore_in(
                    tx,
                    branch,
                    &target,
                    ByActor {
                        actor: actor.clone(),
                        permit: Permit::default(),
                        authorized: &check,
                    },
                    intent,
                )
            },
        )?)
    }

    /// Undoes the last operation of `branch` not undone yet (see [`LocalEnvironment::undo_step`]):
    /// restores the version before it; `actor` must be allowed to change every key that brings
    /// back. Returns the new operation.
    pub fn undo(&self, actor: &ActorId, branch: &str) -> Result<OpId> {
        self.step_branch(actor, branch, super::undo::Way::Undo)
    }

    /// Redoes the last undo of `branch` not redone yet (see [`LocalEnvironment::redo_step`]).
    pub fn redo(&self, actor: &ActorId, branch: &str) -> Result<OpId> {
        self.step_branch(actor, branch, super::undo::Way::Redo)
    }

    fn step_branch(&self, actor: &ActorId, branch: &str, way: super::undo::Way) -> Result<OpId> {
        let this = self.clone();
        let (name, none): (&str, fn(&str) -> EnvError) = match way {
            super::undo::Way::Undo => ("undo", |b| EnvError::NothingToUndo(b.into())),
            super::undo::Way::Redo => ("redo", |b| EnvError::NothingToRedo(b.into())),
        };
        self.write_branch(
            actor,
            branch,
            name,
            move |inner, tx, branch, actor, permit| {
                let head_id = existing_head(tx, branch)?;
                let step = super::undo::step(way, head_id, |id| inner.op_in(tx, id))?
                    .ok_or_else(|| none(branch))?;
                let check = |a: &[tree::Applied]| this.decide_applied(&actor, branch, name, a);
                inner.restore_in(
                    tx,
                    branch,
                    &step.target,
                    ByActor {
                        actor: actor.clone(),
                        permit,
                        authorized: &check,
                    },
                    step.intent,
                )
            },
        )
    }

    /// Merges branch `source` into branch `target` (three-way, against their common ancestor).
    /// Keys changed differently on both sides become conflict objects ([`Conflict`]) in the
    /// merged view; the merge operation has both heads as parents.
    pub fn merge(
        &self,
        actor: &ActorId,
        source: &str,
        target: &str,
        intent: Intent,
    ) -> Result<MergeOutcome> {
        let source = source.to_owned();
        let this = self.clone();
        self.write_branch(
            actor,
            target,
            "merge",
            move |inner, tx, target, actor, permit| {
                let check = |a: &[tree::Applied]| this.decide_applied(&actor, target, "merge", a);
                inner.merge_in(
                    tx,
                    &source,
                    target,
                    ByActor {
                        actor: actor.clone(),
                        permit,
                        authorized: &check,
                    },
                    intent,
                )
            },
        )
    }

    /// Decides each key a branch operation changes (see
    /// [`LocalEnvironment::decide_changes`]): a key that keeps a value is written, one that
    /// loses it is deleted.
    fn decide_applied(
        &self,
        actor: &ActorId,
        branch: &str,
        operation: &str,
        applied: &[tree::Applied],
    ) -> Result<Permit> {
        let action = |a: &tree::Applied| {
            if a.after {
                Action::Write
            } else {
                Action::Delete
            }
        };
        self.decide_changes(
            actor,
            branch,
            Some(operation),
            applied.iter().map(|a| (action(a), &a.key)),
        )
    }

    /// Decides `operation` as a write on `branch`, then runs `work` in the writer with the
    /// permit, which the operation spends when it is recorded.
    fn write_branch<R: Send + 'static>(
        &self,
        actor: &ActorId,
        branch: &str,
        operation: &str,
        work: impl FnOnce(&Inner, &mut dyn LogWrite, &str, ActorId, Permit) -> Result<R>
        + Send
        + 'static,
    ) -> Result<R> {
        let permit = self.decide_branch_write(actor, branch, operation)?;
        self.record_branch_write(actor, branch, permit, work)
    }

    fn decide_branch_write(
        &self,
        actor: &ActorId,
        branch: &str,
        operation: &str,
    ) -> Result<Permit> {
        Ok(Permit::from(self.decide(
            actor,
            Action::Write,
            Resource::Branch(branch.into()),
            Some(branch),
            Some(operation),
        )?))
    }

    /// Runs `work` in the writer, already decided.
    fn record_branch_write<R: Send + 'static>(
        &self,
        actor: &ActorId,
        branch: &str,
        permit: Permit,
        work: impl FnOnce(&Inner, &mut dyn LogWrite, &str, ActorId, Permit) -> Result<R>
        + Send
        + 'static,
    ) -> Result<R> {
        let (branch, actor) = (branch.to_owned(), actor.clone());
        self.inner.write(false, move |inner, tx| {
            work(inner, tx, &branch, actor, permit)
        })
    }

    /// The closest common ancestor of two versions.
    pub fn common_ancestor(&self, a: &OpId, b: &OpId) -> Result<Option<OpId>> {
        self.inner
            .read(|log| self.inner.common_ancestor_in(log, a, b))
    }
}

/// Who records a branch operation, what let its branch write through, and the check every key
/// it changes must pass (the rules that allowed them are recorded with the operation, and what
/// they consume is spent with it).
struct ByActor<'a> {
    actor: ActorId,
    permit: Permit,
    authorized: &'a dyn Fn(&[tree::Applied]) -> Result<Permit>,
}

impl Inner {
    fn restore_in(
        &self,
        tx: &mut dyn LogWrite,
        branch: &str,
        target: &OpId,
        by: ByActor<'_>,
        intent: Intent,
    ) -> Result<OpId> {
        let head_id = existing_head(tx, branch)?;
        let (_, head_view) = self.stored_op_in(tx, &head_id)?;
        let (target_op, target_view) = self.stored_op_in(tx, target)?;
        if tx.is_dropped(target_op.seq)? {
            return Err(EnvError::VersionDropped(*target));
        }
        let changes = tree::diff(&Nodes(&*tx), &head_view, &target_view, None)?;
        let applied: Vec<tree::Applied> = changes.into_iter().map(tree::Applied::from).collect();
        let permit = by.permit.join((by.authorized)(&applied)?);
        let op = self.commit_op(
            tx,
            OpDraft {
                parents: vec![head_id],
                view: target_view,
                branch: branch.to_owned(),
                actor: by.actor,
                intent,
                base_version: Some(head_id),
                summary: super::act::summarize(&applied),
                flags: OpFlags::ROLLBACK,
                permit,
                restored_from: Some(*target),
                effects: Vec::new(),
            },
            Some(&head_id),
        )?;
        Ok(op.id)
    }

    fn merge_in(
        &self,
        tx: &mut dyn LogWrite,
        source: &str,
        target: &str,
        by: ByActor<'_>,
        intent: Intent,
    ) -> Result<MergeOutcome> {
        // Both heads are taken in name order (a shared store locks each as it is read), so two
        // merges of the same branches in opposite directions, on two machines, never wait on
        // each other in a cycle.
        let (ours_id, theirs_id) = if source < target {
            let theirs = existing_head(tx, source)?;
            (existing_head(tx, target)?, theirs)
        } else {
            (existing_head(tx, target)?, existing_head(tx, source)?)
        };
        let base_id = self
            .common_ancestor_in(tx, &ours_id, &theirs_id)?
            .ok_or_else(|| {
                EnvError::UnknownVersion(format!("no common ancestor of {source} and {target}"))
            })?;
        if base_id == theirs_id {
            return Ok(MergeOutcome {
                version: ours_id,
                conflicts: Vec::new(),
                noop: true,
            });
        }
        let (_, ours_view) = self.stored_op_in(tx, &ours_id)?;
        let (_, theirs_view) = self.stored_op_in(tx, &theirs_id)?;
        // A common ancestor thinned out by retention is replaced by its nearest kept ancestor:
        // an older base still merges correctly, at worst with more conflicts.
        let base_id = self.nearest_kept(tx, &base_id)?;
        let (_, base_view) = self.stored_op_in(tx, &base_id)?;
        let first_id = tx.next_node_id()?;
        let nodes = Nodes(&*tx);
        let mut edit = TreeEdit::new(&nodes, first_id);
        let mut resolve = |k: &KeyConflict| -> Result<crate::value::Value> {
            Ok(Conflict {
                key: k.key.clone(),
                base: k.base.clone(),
                ours: self.side(&*tx, &ours_id, &base_id, &k.key, k.ours.clone())?,
                theirs: self.side(&*tx, &theirs_id, &base_id, &k.key, k.theirs.clone())?,
            }
            .to_value())
        };
        let (view, conflicts) = merge_views(
            &mut edit,
            &base_view,
            &ours_view,
            &theirs_view,
            &mut resolve,
        )?;
        let changes = tree::diff(&edit, &ours_view, &view, None)?;
        let applied: Vec<tree::Applied> = changes.into_iter().map(tree::Applied::from).collect();
        let permit = by.permit.join((by.authorized)(&applied)?);
        let new = edit.into_new_nodes(&view);
        tx.put_nodes(crate::store::stored(new));
        let mut flags = OpFlags::MERGE;
        if !conflicts.is_empty() {
            flags |= OpFlags::CONFLICTS;
        }
        let op = self.commit_op(
            tx,
            OpDraft {
                parents: vec![ours_id, theirs_id],
                view,
                branch: target.to_owned(),
                actor: by.actor,
                intent,
                base_version: Some(ours_id),
                summary: super::act::summarize(&applied),
                flags,
                permit,
                restored_from: None,
                effects: Vec::new(),
            },
            Some(&ours_id),
        )?;
        Ok(MergeOutcome {
            version: op.id,
            conflicts: conflicts.into_iter().map(|c| c.key).collect(),
            noop: false,
        })
    }

    /// Who last changed `key` between `base` and `head` (first parents), and why.
    fn side(
        &self,
        log: &dyn LogRead,
        head: &OpId,
        base: &OpId,
        key: &Key,
        value: Option<crate::value::Value>,
    ) -> Result<ConflictSide> {
        let last = self.ops_that_changed(log, head, base, std::slice::from_ref(key))?;
        let op = last.first().map(|id| self.op_in(log, id)).transpose()?;
        Ok(ConflictSide {
            value,
            op: op.as_ref().map(|o| o.id),
            actor: op.as_ref().map(|o| o.actor.clone()),
            intent: op.as_ref().map(|o| o.intent.clone()),
        })
    }

    /// Breadth-first from both sides, newest first; the first op reached from both is the
    /// closest common ancestor.
    pub(crate) fn common_ancestor_in(
        &self,
        log: &dyn LogRead,
        a: &OpId,
        b: &OpId,
    ) -> Result<Option<OpId>> {
        let mut seen: BTreeMap<OpId, u8> = BTreeMap::new();
        let mut queue: VecDeque<(OpId, u8)> = VecDeque::from([(*a, 1), (*b, 2)]);
        let mut expanded: HashSet<(OpId, u8)> = HashSet::new();
        let mut best: Option<Arc<Operation>> = None;
        while let Some((id, side)) = queue.pop_front() {
            if !expanded.insert((id, side)) {
                continue;
            }
            let mask = seen.entry(id).or_insert(0);
            *mask |= side;
            let op = self.op_in(log, &id)?;
            if *mask == 3 {
                if best.as_ref().is_none_or(|b| op.seq > b.seq) {
                    best = Some(op.clone());
                }
                continue;
            }
            if let Some(b) = &best
                && op.seq < b.seq
            {
                continue;
            }
            for p in &op.parents {
                queue.push_back((*p, side));
            }
        }
        Ok(best.map(|o| o.id))
    }
}
