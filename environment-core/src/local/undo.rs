//! Undo and redo, sequential as in jj: an undo steps back along a branch's log past the
//! operations already undone, a redo walks forward again through the undos not redone yet.
//!
//! Both are restores that record what they are in their intent ([`IntentKind::Undo`],
//! [`IntentKind::Redo`]); the walk reads those back. Walking back from the head along first
//! parents: a redo cancels the undo it redid, an undo not cancelled undoes the next operation
//! not undone. So after `A B C`, undo brings back B, undo again A, redo B, redo C, and undo
//! after a redo undoes what the redo brought back.

use std::borrow::Borrow;

use super::LocalEnvironment;
use crate::authz::ActorId;
use crate::error::{EnvError, Result};
use crate::op::{Intent, IntentKind, OpId, Operation};

/// What an undo or a redo of a branch does: restore `target`, recorded with `intent`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UndoStep {
    /// The version restored.
    pub target: OpId,
    /// The operation undone (for a redo: the undo redone).
    pub over: OpId,
    /// The intent to record the restore with (its kind says undo or redo).
    pub intent: Intent,
}

/// Which way a step goes.
#[derive(Clone, Copy)]
pub(crate) enum Way {
    Undo,
    Redo,
}

/// The step from `head` (read with `op`), or `None` when there is nothing to undo (the first
/// operation is reached) or to redo (an operation not undone is reached first).
pub(crate) fn step<O: Borrow<Operation>>(
    way: Way,
    head: OpId,
    mut op: impl FnMut(&OpId) -> Result<O>,
) -> Result<Option<UndoStep>> {
    // Redos not matched with their undo yet; undos not matched with what they undid yet.
    let (mut redos, mut undos) = (0u64, 0u64);
    let mut at = head;
    loop {
        let o = op(&at)?;
        let o: &Operation = o.borrow();
        let Some(parent) = o.parents.first().copied() else {
            return Ok(None);
        };
        match (&o.intent.kind, way) {
            (IntentKind::Redo, _) => redos += 1,
            (IntentKind::Undo, _) if redos > 0 => redos -= 1,
            (IntentKind::Undo, Way::Undo) => undos += 1,
            (IntentKind::Undo, Way::Redo) => {
                return Ok(Some(UndoStep {
                    target: parent,
                    over: o.id,
                    intent: Intent::new(IntentKind::Redo, format!("redo {}", o.id.short())),
                }));
            }
            (_, Way::Redo) => return Ok(None),
            (_, Way::Undo) if undos > 0 => undos -= 1,
            (_, Way::Undo) => {
                return Ok(Some(UndoStep {
                    target: parent,
                    over: o.id,
                    intent: Intent::new(IntentKind::Undo, format!("undo {}", o.id.short())),
                }));
            }
        }
        at = parent;
    }
}

impl LocalEnvironment {
    /// What an undo of `branch` would restore now: the version before the last operation not
    /// undone yet (undos and redos are stepped over as they cancel out). Every door that
    /// undoes in a live tree restores it with the intent given. Reading it is reading the
    /// branch's history.
    ///
    /// ```
    /// # use environment_core::{ActRequest, ActorId, Intent, Key, LocalEnvironment, MAIN, Options, Value};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let env = LocalEnvironment::open(dir.path(), Options::default())?;
    /// let ann = ActorId::new("human:ann")?;
    /// let before = env.head(MAIN)?;
    /// let edit = ActRequest::new(ann.clone(), Intent::edit("a")).put(Key::fs("a")?, Value::file("a"));
    /// let edited = env.act_blocking(edit)?.version;
    /// let step = env.undo_step(&ann, MAIN)?;
    /// assert_eq!((step.target, step.over), (before, edited));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn undo_step(&self, actor: &ActorId, branch: &str) -> Result<UndoStep> {
        self.step_of(actor, branch, Way::Undo)?
            .ok_or_else(|| EnvError::NothingToUndo(branch.into()))
    }

    /// What a redo of `branch` would restore now: the version the last undo not redone yet
    /// took away. [`EnvError::NothingToRedo`] when the head is not an undo (or every undo
    /// since the last other operation was redone).
    pub fn redo_step(&self, actor: &ActorId, branch: &str) -> Result<UndoStep> {
        self.step_of(actor, branch, Way::Redo)?
            .ok_or_else(|| EnvError::NothingToRedo(branch.into()))
    }

    fn step_of(&self, actor: &ActorId, branch: &str, way: Way) -> Result<Option<UndoStep>> {
        self.may_read_history(actor, branch)?;
        step(way, self.head(branch)?, |id| self.op(id))
    }
}
