//! Retention: thinning old versions out of the log without rewriting it.
//!
//! Dropping a version appends it to the `dropped` table: its record stays in the hash-chained
//! log (so `verify` still passes and history can still name it), its view is no longer kept, and
//! garbage collection reclaims the nodes and blobs only dropped views used. Readers see the
//! history re-attached around it: the next kept ancestor stands in for a dropped parent.
//! Branch heads, marks, fork points, merge parents, rollback targets and the first operation are
//! never dropped.

use std::collections::BTreeMap;

use super::{Inner, LocalEnvironment, decode_op};
use crate::authz::{Action, ActorId, Resource};
use crate::error::{EnvError, Result};
use crate::op::{OpFlags, OpId};
use crate::store::LogRead;

impl LocalEnvironment {
    /// The versions retention must keep, each with the reason.
    pub fn protected_versions(&self) -> Result<BTreeMap<OpId, &'static str>> {
        self.inner.read(protected_in)
    }

    /// Drops `versions`: their records stay, their content goes at the next [`gc`]. Refuses
    /// (changing nothing) if any is protected or unknown. Returns how many were newly dropped.
    ///
    /// [`gc`]: LocalEnvironment::gc
    pub fn drop_versions(&self, actor: &ActorId, versions: &[OpId]) -> Result<usize> {
        self.authorize(
            actor,
            Action::Delete,
            Resource::Environment,
            None,
            Some("retention"),
        )?;
        let (ids, actor) = (versions.to_vec(), actor.clone());
        let dropped = self.inner.write(false, move |inner, tx| {
            let protected = protected_in(&*tx)?;
            let now = inner.options.clock.now_ms();
            let mut n = 0;
            for id in &ids {
                if let Some(why) = protected.get(id) {
                    return Err(EnvError::ProtectedVersion { id: *id, why });
                }
                let op = inner.op_in(tx, id)?;
                n += usize::from(tx.drop_version(op.seq, actor.as_str(), now)?);
            }
            Ok(n)
        })?;
        if let Ok(mut set) = self.inner.dropped.write() {
            set.extend(versions.iter().copied());
        }
        Ok(dropped)
    }

    /// Whether `version` was dropped by retention.
    pub fn is_dropped(&self, version: &OpId) -> Result<bool> {
        if self
            .inner
            .dropped
            .read()
            .map(|s| s.contains(version))
            .unwrap_or(false)
        {
            return Ok(true);
        }
        let op = self.op(version)?;
        self.inner.read(|log| log.is_dropped(op.seq))
    }

    /// `e`, or [`EnvError::VersionDropped`] when the read of `versions` that failed with it
    /// failed because one of them was dropped by another process or machine (which this one
    /// had not heard of, and whose collection may have removed its tree already).
    pub(crate) fn dropped_or(&self, e: EnvError, versions: &[&OpId]) -> EnvError {
        if !matches!(e, EnvError::Integrity { .. }) {
            return e;
        }
        for version in versions {
            if let Ok(true) = self.is_dropped(version) {
                if let Ok(mut set) = self.inner.dropped.write() {
                    set.insert(**version);
                }
                return EnvError::VersionDropped(**version);
            }
        }
        e
    }

    /// Fails with [`EnvError::VersionDropped`] if `version`'s content is no longer kept.
    pub(crate) fn check_kept(&self, version: &OpId) -> Result<()> {
        if self
            .inner
            .dropped
            .read()
            .map(|s| s.contains(version))
            .unwrap_or(false)
        {
            return Err(EnvError::VersionDropped(*version));
        }
        Ok(())
    }
}

/// The versions that must be kept, with why.
pub(crate) fn protected_in(log: &dyn LogRead) -> Result<BTreeMap<OpId, &'static str>> {
    let mut out = BTreeMap::new();
    for op in log.heads()?.into_values() {
        out.entry(op).or_insert("a branch head");
    }
    for (_, op) in log.marks()? {
        out.entry(op).or_insert("a mark");
    }
    for op in log.forks()? {
        out.entry(op).or_insert("a fork point");
    }
    log.each_op(&mut |row| {
        let op = decode_op(row.record)?;
        if op.flags.contains(OpFlags::INIT) {
            out.entry(op.id).or_insert("the first operation");
        }
        if op.flags.contains(OpFlags::MERGE) {
            for p in &op.parents {
                out.entry(*p).or_insert("a merge parent");
            }
        }
        if let Some(t) = op.restored_from {
            out.entry(t).or_insert("a rollback target");
        }
        Ok(())
    })?;
    Ok(out)
}

impl Inner {
    /// The nearest ancestor of `id` (itself included, first parents) whose content is kept.
    pub(crate) fn nearest_kept(&self, log: &dyn LogRead, id: &OpId) -> Result<OpId> {
        let mut cur = self.op_in(log, id)?;
        while log.is_dropped(cur.seq)? {
            let Some(p) = cur.parents.first() else { break };
            cur = self.op_in(log, p)?;
        }
        Ok(cur.id)
    }
}
