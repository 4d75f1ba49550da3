//! Branch heads, kept without a write per operation.
//!
//! A branch moves only by recording an operation on it, so its head is the latest operation of
//! the log on that branch. Writing that into a table on every act cost a statement, and a page
//! of its own in every commit. The `heads` table is a snapshot instead, complete up to the
//! sequence number in `meta.heads_seq`; the operations after it (each row of `ops` names its
//! branch) say where the branches went since. The writer settles the snapshot once it lags
//! [`SETTLE_EVERY`] operations behind, inside a group's transaction, so finding a head never
//! scans more rows of the log than that.

use std::collections::{BTreeMap, HashMap};

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{EnvError, Result};
use crate::op::OpId;

/// How far the snapshot may lag behind the log, in operations.
pub(crate) const SETTLE_EVERY: i64 = 256;

/// The sequence number up to which the `heads` table is complete (0 in an environment that has
/// not settled it yet: then every row of the log names its branch).
fn settled(conn: &Connection) -> Result<i64> {
    let value: Option<String> = conn
        .prepare_cached("SELECT value FROM meta WHERE name = 'heads_seq'")?
        .query_row([], |r| r.get(0))
        .optional()?;
    value.map_or(Ok(0), |v| {
        v.parse().map_err(|_| EnvError::Decode {
            what: "settled heads",
            detail: format!("{v:?} is not a sequence number"),
        })
    })
}

/// The head of `branch`, if the branch exists. Inside the write transaction this sees the
/// operations recorded earlier in it.
pub(crate) fn of(conn: &Connection, branch: &str) -> Result<Option<OpId>> {
    let since = settled(conn)?;
    let moved: Option<Vec<u8>> = conn
        .prepare_cached(
            "SELECT id FROM ops WHERE seq > ?1 AND branch = ?2 ORDER BY seq DESC LIMIT 1",
        )?
        .query_row(params![since, branch], |r| r.get(0))
        .optional()?;
    let id = match moved {
        Some(id) => Some(id),
        None => conn
            .prepare_cached("SELECT op FROM heads WHERE name = ?1")?
            .query_row([branch], |r| r.get(0))
            .optional()?,
    };
    id.map(|b| crate::local::op_id_from(&b)).transpose()
}

/// Every branch with its head, by name.
pub(crate) fn all(conn: &Connection) -> Result<BTreeMap<String, OpId>> {
    let mut heads = BTreeMap::new();
    let mut stmt = conn.prepare_cached("SELECT name, op FROM heads")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let op: Vec<u8> = row.get(1)?;
        heads.insert(row.get(0)?, crate::local::op_id_from(&op)?);
    }
    heads.extend(moved_since(conn, settled(conn)?)?);
    Ok(heads)
}

/// The last operation of each branch recorded after sequence number `since`.
fn moved_since(conn: &Connection, since: i64) -> Result<HashMap<String, OpId>> {
    let mut stmt = conn.prepare_cached("SELECT branch, id FROM ops WHERE seq > ?1 ORDER BY seq")?;
    let mut rows = stmt.query([since])?;
    let mut moved = HashMap::new();
    while let Some(row) = rows.next()? {
        let (branch, id): (String, Vec<u8>) = (row.get(0)?, row.get(1)?);
        set(&mut moved, &branch, crate::local::op_id_from(&id)?);
    }
    Ok(moved)
}

/// Moves `branch`'s head in `heads` to `id`, copying the name only for a branch not there yet.
pub(crate) fn set<S: std::hash::BuildHasher>(
    heads: &mut HashMap<String, OpId, S>,
    branch: &str,
    id: OpId,
) {
    match heads.get_mut(branch) {
        Some(head) => *head = id,
        None => {
            heads.insert(branch.to_owned(), id);
        }
    }
}

/// What the writer knows of the snapshot between groups.
#[derive(Default)]
pub(crate) struct Known {
    /// The sequence number the snapshot is complete to (read when `None`).
    seq: Option<i64>,
    /// The heads moved since, when the writer has seen every operation since: it settled the
    /// snapshot itself and no other connection has committed after. Settling then reads nothing
    /// from the log.
    moved: Option<HashMap<String, OpId>>,
}

impl Known {
    /// An operation this connection recorded on `branch`.
    pub fn record(&mut self, branch: &str, id: OpId) {
        if let Some(moved) = &mut self.moved {
            set(moved, branch, id);
        }
    }
}

/// Brings the snapshot up to `last_seq` (the log's last operation) if it lags [`SETTLE_EVERY`]
/// behind. Called by the writer at the end of a group, inside its transaction, with what it
/// knows of the snapshot, which is kept up to date.
pub(crate) fn settle(conn: &Connection, last_seq: i64, known: &mut Known) -> Result<()> {
    let since = match known.seq {
        Some(s) => s,
        None => settled(conn)?,
    };
    known.seq = Some(since);
    if last_seq - since < SETTLE_EVERY {
        return Ok(());
    }
    let mut upsert = conn.prepare_cached(
        "INSERT INTO heads(name, op) VALUES (?1, ?2) ON CONFLICT(name) DO UPDATE SET op = excluded.op",
    )?;
    let moved = match known.moved.take() {
        Some(moved) => moved,
        None => moved_since(conn, since)?,
    };
    for (branch, id) in moved {
        upsert.execute(params![branch, &id.0.0[..]])?;
    }
    conn.prepare_cached(
        "INSERT INTO meta(name, value) VALUES ('heads_seq', ?1)
         ON CONFLICT(name) DO UPDATE SET value = excluded.value",
    )?
    .execute([last_seq.to_string()])?;
    *known = Known {
        seq: Some(last_seq),
        moved: Some(HashMap::new()),
    };
    Ok(())
}
