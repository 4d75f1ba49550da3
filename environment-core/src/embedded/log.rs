//! The log's port ([`crate::store`]) over the environment's SQLite
//! database. A reader reads through a pooled read connection; the writer's jobs run in its
//! open group transaction, and see what the jobs before them wrote there (kept in memory by
//! [`crate::db`], so that the hot path reads nothing back).

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, params};

use super::db::{self, DbNodes, NodeCache, TxEffects};
use super::op_index::OpIndex;
use crate::error::Result;
use crate::hash::Hash;
use crate::local::{decode_op, op_id_from};
use crate::op::{OpId, Operation};
use crate::store::{LogRead, LogRow, LogWrite, NodeVisitor, StoredNode, StoredOp};
use crate::tree::{NodeId, NodeSource, Ptr};

/// A reading of the database: through a read connection, or inside the writer's transaction.
pub(crate) struct SqliteLog<'a> {
    conn: &'a Connection,
    nodes: DbNodes<'a>,
    index: &'a OpIndex,
}

impl<'a> SqliteLog<'a> {
    /// A reader's view: committed rows only, so nodes read may fill the shared cache.
    pub(crate) fn reading(conn: &'a Connection, cache: &'a NodeCache, index: &'a OpIndex) -> Self {
        SqliteLog {
            conn,
            nodes: DbNodes {
                conn,
                cache,
                fill_cache: true,
            },
            index,
        }
    }

    /// The writer's view inside its open transaction: it sees rows a rollback would free, so
    /// it reads through without filling the cache.
    fn writing(conn: &'a Connection, cache: &'a NodeCache, index: &'a OpIndex) -> Self {
        SqliteLog {
            conn,
            nodes: DbNodes {
                conn,
                cache,
                fill_cache: false,
            },
            index,
        }
    }
}

/// One job of the writer's group transaction.
pub(crate) struct SqliteTx<'a> {
    log: SqliteLog<'a>,
    fx: &'a mut TxEffects,
}

impl<'a> SqliteTx<'a> {
    pub(crate) fn new(
        conn: &'a Connection,
        fx: &'a mut TxEffects,
        cache: &'a NodeCache,
        index: &'a OpIndex,
    ) -> Self {
        SqliteTx {
            log: SqliteLog::writing(conn, cache, index),
            fx,
        }
    }
}

/// Rows of (name, operation id).
fn named_ops(conn: &Connection, sql: &str) -> Result<Vec<(String, OpId)>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (name, op) = row?;
        out.push((name, op_id_from(&op)?));
    }
    Ok(out)
}

/// Operation ids, one per row of `sql`.
fn op_ids(conn: &Connection, sql: &str) -> Result<HashSet<OpId>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map([], |r| r.get::<_, Vec<u8>>(0))?;
    let mut out = HashSet::new();
    for r in rows {
        out.insert(op_id_from(&r?)?);
    }
    Ok(out)
}

impl LogRead for SqliteLog<'_> {
    fn node(&self, ptr: &Ptr) -> Result<StoredNode> {
        self.nodes.node(ptr).map(StoredNode)
    }

    fn head(&self, branch: &str) -> Result<Option<OpId>> {
        // Where the writer's open transaction last moved it, else where the log says.
        db::head(self.conn, branch)
    }

    fn heads(&self) -> Result<BTreeMap<String, OpId>> {
        super::heads::all(self.conn)
    }

    fn find_op(&self, id: &OpId) -> Result<Option<StoredOp>> {
        // The writer's jobs find the operations of the jobs before them in the same
        // transaction in memory (elsewhere there are none).
        if let Some(found) = db::pending_op(id) {
            return Ok(Some(found));
        }
        let conn = self.conn;
        let key = &id.0.0[..];
        let found = self.index.find(conn, key, key, |seq| {
            let row: Option<(Vec<u8>, NodeId, Vec<u8>)> = conn
                .prepare_cached("SELECT id, root, record FROM ops WHERE seq = ?1")?
                .query_row([seq], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()?;
            Ok(row.and_then(|(at, root, record)| (at == key).then_some((root, record))))
        })?;
        match found.into_iter().next() {
            Some((root, record)) => Ok(Some((Arc::new(decode_op(&record)?), root))),
            None => Ok(None),
        }
    }

    fn op_ids_between(&self, lo: &[u8], hi: &[u8]) -> Result<Vec<OpId>> {
        let conn = self.conn;
        let found = self.index.find(conn, lo, hi, |seq| {
            let id: Option<Vec<u8>> = conn
                .prepare_cached("SELECT id FROM ops WHERE seq = ?1")?
                .query_row([seq], |r| r.get(0))
                .optional()?;
            Ok(id.filter(|id| (lo..=hi).contains(&&id[..])))
        })?;
        found.iter().map(|id| op_id_from(id)).collect()
    }

    fn has_ops(&self) -> Result<bool> {
        Ok(self
            .conn
            .prepare_cached("SELECT 1 FROM ops LIMIT 1")?
            .exists([])?)
    }

    fn first_op(&self) -> Result<Option<OpId>> {
        let id: Option<Vec<u8>> = self
            .conn
            .prepare_cached("SELECT id FROM ops ORDER BY seq LIMIT 1")?
            .query_row([], |r| r.get(0))
            .optional()?;
        id.map(|id| op_id_from(&id)).transpose()
    }

    fn capture_run(&self, seq: u64) -> Result<Option<Vec<u8>>> {
        let bytes: Option<Option<Vec<u8>>> = self
            .conn
            .prepare_cached("SELECT run FROM ops WHERE seq = ?1")?
            .query_row([seq as i64], |r| r.get(0))
            .optional()?;
        Ok(bytes.flatten())
    }

    fn each_op(&self, f: &mut dyn FnMut(LogRow<'_>) -> Result<()>) -> Result<()> {
        let mut stmt = self
            .conn
            .prepare("SELECT seq, id, root, record FROM ops ORDER BY seq")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let (seq, id, root, record): (i64, Vec<u8>, NodeId, Vec<u8>) =
                (row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?);
            f(LogRow {
                seq: seq as u64,
                id: &id,
                root,
                record: &record,
            })?;
        }
        Ok(())
    }

    fn each_kept_op(&self, f: &mut dyn FnMut(Operation, NodeId) -> Result<()>) -> Result<()> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT root, record FROM ops WHERE seq NOT IN (SELECT seq FROM dropped)",
        )?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            f(decode_op(&row.get::<_, Vec<u8>>(1)?)?, row.get(0)?)?;
        }
        Ok(())
    }

    fn marks(&self) -> Result<Vec<(String, OpId)>> {
        named_ops(self.conn, "SELECT name, op FROM marks ORDER BY name")
    }

    fn mark(&self, name: &str) -> Result<Option<OpId>> {
        let op: Option<Vec<u8>> = self
            .conn
            .prepare_cached("SELECT op FROM marks WHERE name = ?1")?
            .query_row([name], |r| r.get(0))
            .optional()?;
        op.map(|b| op_id_from(&b)).transpose()
    }

    fn forks(&self) -> Result<HashSet<OpId>> {
        op_ids(self.conn, "SELECT op FROM forks")
    }

    fn dropped_seqs(&self) -> Result<BTreeSet<u64>> {
        let mut stmt = self.conn.prepare_cached("SELECT seq FROM dropped")?;
        let rows = stmt.query_map([], |r| r.get::<_, i64>(0))?;
        let mut out = BTreeSet::new();
        for r in rows {
            out.insert(r? as u64);
        }
        Ok(out)
    }

    fn is_dropped(&self, seq: u64) -> Result<bool> {
        Ok(self
            .conn
            .prepare_cached("SELECT 1 FROM dropped WHERE seq = ?1")?
            .exists([seq as i64])?)
    }

    fn dropped_ids(&self) -> Result<HashSet<OpId>> {
        op_ids(
            self.conn,
            "SELECT o.id FROM dropped d JOIN ops o ON o.seq = d.seq",
        )
    }

    fn refused_before(
        &self,
        before: u64,
        f: &mut dyn FnMut(u64, &[u8]) -> Result<bool>,
    ) -> Result<()> {
        let before = i64::try_from(before).unwrap_or(i64::MAX);
        let mut stmt = self
            .conn
            .prepare_cached("SELECT id, record FROM refused WHERE id < ?1 ORDER BY id DESC")?;
        let mut rows = stmt.query([before])?;
        while let Some(row) = rows.next()? {
            let (id, record): (i64, Vec<u8>) = (row.get(0)?, row.get(1)?);
            if !f(id as u64, &record)? {
                break;
            }
        }
        Ok(())
    }

    fn blob_pins(&self) -> Result<Vec<Hash>> {
        let mut stmt = self.conn.prepare_cached("SELECT hash FROM blob_pins")?;
        let pins = stmt.query_map([], |r| r.get::<_, Vec<u8>>(0))?;
        let mut out = Vec::new();
        for p in pins {
            out.extend(Hash::from_slice(&p?));
        }
        Ok(out)
    }

    fn outbox(&self, limit: usize) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT seq, event FROM outbox ORDER BY seq LIMIT ?1")?;
        let rows = stmt.query_map([limit as i64], |r| {
            Ok((r.get::<_, i64>(0)? as u64, r.get(1)?))
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    fn each_node(&self, f: &mut NodeVisitor<'_>) -> Result<()> {
        db::each_node(self.conn, f)
    }

    fn check_indexes(&self, seqs: &std::collections::HashMap<OpId, u64>) -> Result<()> {
        super::op_index::check(self.conn, seqs)
    }
}

/// The writer's transaction reads as its log does.
macro_rules! read_through {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $out:ty;)*) => {
        $(fn $name(&self, $($arg: $ty),*) -> $out { self.log.$name($($arg),*) })*
    };
}

impl LogRead for SqliteTx<'_> {
    read_through! {
        node(ptr: &Ptr) -> Result<StoredNode>;
        head(branch: &str) -> Result<Option<OpId>>;
        heads() -> Result<BTreeMap<String, OpId>>;
        find_op(id: &OpId) -> Result<Option<StoredOp>>;
        op_ids_between(lo: &[u8], hi: &[u8]) -> Result<Vec<OpId>>;
        has_ops() -> Result<bool>;
        first_op() -> Result<Option<OpId>>;
        capture_run(seq: u64) -> Result<Option<Vec<u8>>>;
        each_op(f: &mut dyn FnMut(LogRow<'_>) -> Result<()>) -> Result<()>;
        each_kept_op(f: &mut dyn FnMut(Operation, NodeId) -> Result<()>) -> Result<()>;
        marks() -> Result<Vec<(String, OpId)>>;
        mark(name: &str) -> Result<Option<OpId>>;
        forks() -> Result<HashSet<OpId>>;
        dropped_seqs() -> Result<BTreeSet<u64>>;
        is_dropped(seq: u64) -> Result<bool>;
        dropped_ids() -> Result<HashSet<OpId>>;
        refused_before(before: u64, f: &mut dyn FnMut(u64, &[u8]) -> Result<bool>) -> Result<()>;
        blob_pins() -> Result<Vec<Hash>>;
        outbox(limit: usize) -> Result<Vec<(u64, Vec<u8>)>>;
        each_node(f: &mut NodeVisitor<'_>) -> Result<()>;
        check_indexes(seqs: &std::collections::HashMap<OpId, u64>) -> Result<()>;
    }
}

impl LogWrite for SqliteTx<'_> {
    fn next_node_id(&self) -> Result<NodeId> {
        db::next_node_id(self.log.conn)
    }

    fn next_seq(&self) -> Result<u64> {
        Ok(db::next_seq(self.log.conn)? as u64)
    }

    fn put_nodes(&mut self, nodes: Vec<(Ptr, StoredNode)>) {
        db::insert_nodes(&nodes);
        self.fx
            .nodes
            .extend(nodes.into_iter().map(|(ptr, node)| (ptr.id, node)));
    }

    fn append(
        &mut self,
        op: Arc<Operation>,
        record: &[u8],
        root: NodeId,
        run: Option<Vec<u8>>,
    ) -> Result<()> {
        let conn = self.log.conn;
        let seq = op.seq as i64;
        let nodes = db::store_op_nodes(conn, seq, record.len())?;
        conn.prepare_cached(
            "INSERT INTO ops(seq, id, root, record, branch, nodes, run) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )?
        .execute(params![
            seq,
            &op.id.0.0[..],
            root,
            record,
            op.branch,
            nodes,
            run,
        ])?;
        self.fx.ops.push((op, root));
        Ok(())
    }

    fn queue_event(&mut self, event: Vec<u8>) -> Result<()> {
        self.log
            .conn
            .prepare_cached("INSERT INTO outbox(event) VALUES (?1)")?
            .execute([event])?;
        Ok(())
    }

    fn remove_events(&mut self, positions: &[u64]) -> Result<()> {
        let mut stmt = self
            .log
            .conn
            .prepare_cached("DELETE FROM outbox WHERE seq = ?1")?;
        for s in positions {
            stmt.execute([*s as i64])?;
        }
        Ok(())
    }

    fn add_fork(&mut self, op: &OpId) -> Result<()> {
        self.log
            .conn
            .prepare_cached("INSERT OR IGNORE INTO forks(op) VALUES (?1)")?
            .execute([&op.0.0[..]])?;
        Ok(())
    }

    fn add_mark(&mut self, name: &str, op: &OpId, actor: &str, time_ms: i64) -> Result<()> {
        self.log
            .conn
            .prepare_cached("INSERT INTO marks(name, op, actor, time_ms) VALUES (?1, ?2, ?3, ?4)")?
            .execute(params![name, &op.0.0[..], actor, time_ms])?;
        Ok(())
    }

    fn drop_version(&mut self, seq: u64, actor: &str, time_ms: i64) -> Result<bool> {
        let n = self
            .log
            .conn
            .prepare_cached(
                "INSERT OR IGNORE INTO dropped(seq, actor, time_ms) VALUES (?1, ?2, ?3)",
            )?
            .execute(params![seq as i64, actor, time_ms])?;
        Ok(n > 0)
    }

    fn add_refused(&mut self, actor: &str, time_ms: i64, record: &[u8]) -> Result<u64> {
        let conn = self.log.conn;
        conn.prepare_cached("INSERT INTO refused(actor, time_ms, record) VALUES (?1, ?2, ?3)")?
            .execute(params![actor, time_ms, record])?;
        Ok(conn.last_insert_rowid() as u64)
    }

    fn pin_blob(&mut self, hash: &Hash, owner: &str, pinned: bool) -> Result<()> {
        let sql = if pinned {
            "INSERT OR IGNORE INTO blob_pins(hash, owner) VALUES (?1, ?2)"
        } else {
            "DELETE FROM blob_pins WHERE hash = ?1 AND owner = ?2"
        };
        self.log
            .conn
            .prepare_cached(sql)?
            .execute(params![&hash.0[..], owner])?;
        Ok(())
    }

    fn delete_nodes(&mut self, dead: &HashSet<NodeId>) -> Result<()> {
        db::delete_nodes(self.log.conn, dead)?;
        for id in dead {
            self.log.nodes.cache.remove(id);
        }
        Ok(())
    }
}
