//! Retention: thinning old versions out of the log without rewriting it.
//!
//! Dropping a version appends it to the `dropped` table: its record stays in the hash-chained
//! log (so `verify` still passes and history can still name it), its view is no longer kept, and
//! garbage collection reclaims the nodes and blobs only dropped views used. Readers see the
//! history re-attached around it: the next kept ancestor stands in for a dropped parent.
//! Branch heads, marks, fork points, merge parents, rollback targets and the first operation are
//! never dropped.

use std::collections::{BTreeMap, HashSet};

use rusqlite::{Connection, params};

use super::{Inner, LocalEnvironment, decode_op, op_id_from};
use crate::authz::{Action, ActorId, Resource};
use crate::error::{EnvError, Result};
use crate::op::{OpFlags, OpId};

impl LocalEnvironment {
    /// The versions retention must keep, each with the reason.
    pub fn protected_versions(&self) -> Result<BTreeMap<OpId, &'static str>> {
        self.inner.readers.with(protected_in)
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
        let (inner, ids, actor) = (self.inner.clone(), versions.to_vec(), actor.clone());
        let dropped = self.inner.writer.run(false, move |conn, _| {
            let protected = protected_in(conn)?;
            let now = inner.options.clock.now_ms();
            let mut n = 0;
            let mut stmt = conn.prepare_cached(
                "INSERT OR IGNORE INTO dropped(seq, actor, time_ms) VALUES (?1, ?2, ?3)",
            )?;
            for id in &ids {
                if let Some(why) = protected.get(id) {
                    return Err(EnvError::ProtectedVersion { id: *id, why });
                }
                let op = inner.op_in(conn, id)?;
                n += stmt.execute(params![op.seq as i64, actor.as_str(), now])?;
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
        self.inner.readers.with(|conn| seq_dropped(conn, op.seq))
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

/// Whether the operation at `seq` was dropped.
pub(crate) fn seq_dropped(conn: &Connection, seq: u64) -> Result<bool> {
    Ok(conn
        .prepare_cached("SELECT 1 FROM dropped WHERE seq = ?1")?
        .exists([seq as i64])?)
}

/// Every dropped operation's id.
pub(crate) fn dropped_in(conn: &Connection) -> Result<HashSet<OpId>> {
    let mut stmt = conn.prepare_cached("SELECT o.id FROM dropped d JOIN ops o ON o.seq = d.seq")?;
    let rows = stmt.query_map([], |r| r.get::<_, Vec<u8>>(0))?;
    let mut out = HashSet::new();
    for r in rows {
        out.insert(op_id_from(&r?)?);
    }
    Ok(out)
}

/// The versions that must be kept, with why.
pub(crate) fn protected_in(conn: &Connection) -> Result<BTreeMap<OpId, &'static str>> {
    let mut out = BTreeMap::new();
    for op in crate::heads::all(conn)?.into_values() {
        out.entry(op).or_insert("a branch head");
    }
    for (sql, why) in [
        ("SELECT op FROM marks", "a mark"),
        ("SELECT op FROM forks", "a fork point"),
    ] {
        let mut stmt = conn.prepare_cached(sql)?;
        let rows = stmt.query_map([], |r| r.get::<_, Vec<u8>>(0))?;
        for r in rows {
            out.entry(op_id_from(&r?)?).or_insert(why);
        }
    }
    let mut stmt = conn.prepare_cached("SELECT record FROM ops")?;
    let rows = stmt.query_map([], |r| r.get::<_, Vec<u8>>(0))?;
    for r in rows {
        let op = decode_op(&r?)?;
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
    }
    Ok(out)
}

impl Inner {
    /// The nearest ancestor of `id` (itself included, first parents) whose content is kept.
    pub(crate) fn nearest_kept(&self, conn: &Connection, id: &OpId) -> Result<OpId> {
        let mut cur = self.op_in(conn, id)?;
        while seq_dropped(conn, cur.seq)? {
            let Some(p) = cur.parents.first() else { break };
            cur = self.op_in(conn, p)?;
        }
        Ok(cur.id)
    }
}
