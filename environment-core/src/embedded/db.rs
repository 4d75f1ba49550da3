//! SQLite: the schema, the writer thread with group commit, and the pool of read connections.

use std::cell::RefCell;
use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use foldhash::{HashMap, HashMapExt};
use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use super::{heads, op_index};
use crate::error::{EnvError, Result};
use crate::hash::Hash;
use crate::op::{OpId, Operation};
use crate::store::{AfterCommit, CommittedNodes, CommittedOps, StoredNode};
use crate::tree::{Node, NodeId, NodeSource, Ptr, block};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes(id INTEGER PRIMARY KEY, hash BLOB NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS node_blocks(first INTEGER PRIMARY KEY, last INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS ops(seq INTEGER PRIMARY KEY, id BLOB NOT NULL, root INTEGER NOT NULL, record BLOB NOT NULL, branch TEXT, nodes BLOB, run BLOB);
CREATE TABLE IF NOT EXISTS heads(name TEXT PRIMARY KEY, op BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS marks(name TEXT PRIMARY KEY, op BLOB NOT NULL, actor TEXT NOT NULL, time_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS forks(op BLOB PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dropped(seq INTEGER PRIMARY KEY, actor TEXT NOT NULL, time_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS effects(
    id INTEGER PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    target TEXT NOT NULL,
    request BLOB NOT NULL,
    request_hash BLOB NOT NULL,
    state TEXT NOT NULL,
    result BLOB,
    note TEXT,
    attempts INTEGER NOT NULL,
    actor TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS effects_open ON effects(state) WHERE state IN ('in_flight', 'unknown');
CREATE TABLE IF NOT EXISTS outbox(seq INTEGER PRIMARY KEY, event BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS refused(id INTEGER PRIMARY KEY AUTOINCREMENT, actor TEXT NOT NULL, time_ms INTEGER NOT NULL, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS blob_pins(hash BLOB NOT NULL, owner TEXT NOT NULL, PRIMARY KEY(hash, owner)) WITHOUT ROWID;
";

/// The storage layout this build writes (`meta.schema`): earlier ones are migrated on open, a
/// later one is refused (this build would not know how to keep it consistent).
const LAYOUT: i64 = 4;

/// Opens the write connection and creates the schema.
pub(crate) fn open_writer(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(30))?;
    check_layout(&conn, path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    tune(&conn)?;
    // The writer's own page cache stays small. After a B-tree rebalance has renumbered pages,
    // SQLite's commit scans the whole hash table of the cache, so a large cache makes commits
    // slower; the writer's reads of pages not in the WAL come through the memory map anyway.
    conn.pragma_update(None, "cache_size", -8192)?;
    // Checkpoints fsync; a larger WAL makes them rarer, so their cost spreads over more commits.
    conn.pragma_update(None, "wal_autocheckpoint", 8192)?;
    conn.execute_batch(SCHEMA)?;
    conn.execute_batch(op_index::SCHEMA)?;
    migrate(&conn)?;
    conn.execute(
        "INSERT OR IGNORE INTO meta(name, value) VALUES ('schema', ?1)",
        [LAYOUT.to_string()],
    )?;
    Ok(conn)
}

/// Refuses, before anything is written, an environment stored in a later layout than this
/// build's.
fn check_layout(conn: &Connection, path: &Path) -> Result<()> {
    let has_meta = conn
        .prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'")?
        .exists([])?;
    if !has_meta {
        return Ok(());
    }
    let layout: Option<i64> = conn
        .query_row(
            "SELECT CAST(value AS INTEGER) FROM meta WHERE name = 'schema'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    match layout {
        Some(found) if found > LAYOUT => Err(EnvError::Home {
            path: path.to_path_buf(),
            detail: format!(
                "it is stored in layout {found}, written by a newer version; this build reads \
                 layouts up to {LAYOUT}, so it opened nothing and changed nothing"
            ),
        }),
        _ => Ok(()),
    }
}

/// Brings an environment written by an earlier layout to this one, in one transaction:
/// - layout 1 indexed operations by a B-tree over their ids (a `UNIQUE` column), which
///   [`op_index`] replaces;
/// - layout 2 kept the operations no index run covers in a table of their own, `op_tail`; they
///   are now read from the end of the log.
fn migrate(conn: &Connection) -> Result<()> {
    let exists = |sql: &str| conn.prepare(sql)?.exists([]);
    let old_index = exists(
        "SELECT 1 FROM sqlite_master WHERE type = 'index' AND tbl_name = 'ops'
         AND name LIKE 'sqlite_autoindex_ops%'",
    )?;
    let tail_table =
        exists("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'op_tail'")?;
    let no_branch = !exists("SELECT 1 FROM pragma_table_info('ops') WHERE name = 'branch'")?;
    let no_nodes = !exists("SELECT 1 FROM pragma_table_info('ops') WHERE name = 'nodes'")?;
    let no_run = !exists("SELECT 1 FROM pragma_table_info('ops') WHERE name = 'run'")?;
    if !old_index && !tail_table && !no_branch && !no_nodes && !no_run {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE")?;
    let r = (|| -> Result<()> {
        if old_index {
            conn.execute_batch(
                "CREATE TABLE ops_v2(seq INTEGER PRIMARY KEY, id BLOB NOT NULL, root INTEGER NOT NULL, record BLOB NOT NULL);
                 INSERT INTO ops_v2 SELECT seq, id, root, record FROM ops;
                 DROP TABLE ops;
                 ALTER TABLE ops_v2 RENAME TO ops;",
            )?;
            op_index::rebuild(conn)?;
        }
        conn.execute_batch("DROP TABLE IF EXISTS op_tail")?;
        if no_branch {
            // Layout 4 finds heads from the log (see `heads`): the `heads` table, exact until
            // now, becomes the snapshot as of the last operation, and only later rows need to
            // name their branch.
            conn.execute_batch(
                "ALTER TABLE ops ADD COLUMN branch TEXT;
                 INSERT INTO meta(name, value)
                     SELECT 'heads_seq', CAST(COALESCE(MAX(seq), 0) AS TEXT) FROM ops
                     WHERE true
                 ON CONFLICT(name) DO UPDATE SET value = excluded.value;",
            )?;
        }
        if no_nodes {
            // Layout 4 stores the nodes an operation creates with it, under ids that name it;
            // those written before stay in `node_blocks` (and `nodes`), under theirs, which
            // were counted up from 1 and are far below (see `block::OP_NODES`).
            conn.execute_batch("ALTER TABLE ops ADD COLUMN nodes BLOB")?;
        }
        if no_run {
            // The summary of the run of captures an operation ends (see `CaptureRun`): derived
            // from the log, so it stays empty for the operations recorded before (and for those
            // an earlier build of this layout records), which history then reads one by one.
            conn.execute_batch("ALTER TABLE ops ADD COLUMN run BLOB")?;
        }
        conn.execute(
            "INSERT INTO meta(name, value) VALUES ('schema', ?1)
                 ON CONFLICT(name) DO UPDATE SET value = ?1",
            [LAYOUT.to_string()],
        )?;
        Ok(())
    })();
    match r {
        Ok(()) => Ok(conn.execute_batch("COMMIT")?),
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            Err(e)
        }
    }
}

fn open_reader(path: &Path) -> Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(30))?;
    tune(&conn)?;
    Ok(conn)
}

/// Page cache and memory map: tree nodes are read far more often than written, and a read that
/// misses SQLite's small default cache costs a system call.
fn tune(conn: &Connection) -> Result<()> {
    conn.pragma_update(None, "cache_size", -65536)?;
    conn.pragma_update(None, "mmap_size", 1i64 << 30)?;
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    // Every statement of the write path stays prepared (the default cache of 16 evicts some).
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}

/// Read-only connections, reused.
pub(crate) struct ReadPool {
    path: PathBuf,
    idle: Mutex<Vec<Connection>>,
}

impl ReadPool {
    pub fn new(path: PathBuf) -> ReadPool {
        ReadPool {
            path,
            idle: Mutex::new(Vec::new()),
        }
    }

    pub fn with<R>(&self, f: impl FnOnce(&Connection) -> Result<R>) -> Result<R> {
        let conn = match self.idle.lock().ok().and_then(|mut v| v.pop()) {
            Some(c) => c,
            None => open_reader(&self.path)?,
        };
        let r = f(&conn);
        if let Ok(mut v) = self.idle.lock()
            && v.len() < 16
        {
            v.push(conn);
        }
        r
    }
}

/// Decoded nodes shared by every reader and the writer, by row id.
pub(crate) type NodeCache = quick_cache::sync::Cache<NodeId, Arc<Node>>;

/// Nodes read through a connection, via the cache.
pub(crate) struct DbNodes<'a> {
    pub conn: &'a Connection,
    pub cache: &'a NodeCache,
    /// Whether nodes read may enter the shared cache. The writer's reads can see rows of its
    /// open transaction, whose ids a rollback would free for reuse: only committed rows may be
    /// cached, so the writer reads through without filling the cache.
    pub fill_cache: bool,
}

/// What the open write transaction has written so far, for the jobs after the one that wrote
/// it: only the thread holding the write connection runs jobs, so this is that transaction's.
/// Reading it back from memory saves each job a round of queries and decoding on the hot path.
/// It lives from `BEGIN` to the end of the group; what it knows of the latest state goes on to
/// the next group when no other connection has committed in between (see [`Carried`]).
#[derive(Default)]
struct Pending {
    /// Nodes written by the jobs that succeeded so far.
    nodes: HashMap<NodeId, Arc<Node>>,
    /// Operations recorded by the jobs already done, with their root node.
    ops: HashMap<OpId, (Arc<Operation>, NodeId)>,
    /// The running job's new nodes (id, hash, node) in id order, written with its operation
    /// (see [`store_op_nodes`]).
    unflushed: Vec<(NodeId, Hash, Arc<Node>)>,
    latest: Latest,
}

/// What the writer knows of the database's latest state without reading it.
#[derive(Default)]
struct Latest {
    /// Branch heads moved by this connection's committed groups and by the jobs of the open
    /// one that succeeded (heads move only by recording an operation, so this is exact).
    heads: HashMap<String, OpId>,
    /// The sequence number of the next operation, once known; it moves only when a job that
    /// recorded an operation succeeds, so the log has no gap where a job failed.
    next_seq: Option<i64>,
    /// The last sequence number the operation index covers with runs, once known.
    indexed: Option<i64>,
    /// What is known of the `heads` snapshot (see `heads`).
    snapshot: heads::Known,
}

/// What a committed group knew of the database's latest state, for the next group on the same
/// connection. SQLite's `data_version` tells whether another connection has committed since:
/// only then must the next group read it again.
#[derive(Default)]
struct Carried {
    data_version: Option<i64>,
    latest: Latest,
}

thread_local! {
    static PENDING: RefCell<Pending> = RefCell::new(Pending::default());
}

/// Starts a group's memory of its transaction (just begun), from what the previous group on
/// this connection left if nothing was committed by others since.
fn begin_pending(conn: &Connection, carried: &mut Carried) -> Result<()> {
    let version: i64 = conn
        .prepare_cached("PRAGMA data_version")?
        .query_row([], |r| r.get(0))?;
    let last = std::mem::take(carried);
    let pending = Pending {
        latest: if last.data_version == Some(version) {
            last.latest
        } else {
            Latest::default()
        },
        ..Pending::default()
    };
    PENDING.with(|p| *p.borrow_mut() = pending);
    carried.data_version = Some(version);
    Ok(())
}

/// Ends a group's memory of its transaction; what it knew goes on to the next group if it
/// committed (a rollback leaves nothing to carry).
fn end_pending(carried: &mut Carried, committed: bool) {
    let p = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if committed {
        carried.latest = p.latest;
    } else {
        *carried = Carried::default();
    }
}

/// An operation recorded earlier in the open transaction, with its root node.
pub(crate) fn pending_op(id: &OpId) -> Option<(Arc<Operation>, NodeId)> {
    PENDING.with(|p| p.borrow().ops.get(id).cloned())
}

/// The head of `branch` as the open write transaction sees it: where this connection last moved
/// it (kept in memory, see [`Latest`]), else where the log says. Called by the writer inside its
/// transaction.
pub(crate) fn head(conn: &Connection, branch: &str) -> Result<Option<OpId>> {
    match PENDING.with(|p| p.borrow().latest.heads.get(branch).copied()) {
        Some(h) => Ok(Some(h)),
        None => heads::of(conn, branch),
    }
}

impl NodeSource for DbNodes<'_> {
    fn node(&self, ptr: &Ptr) -> Result<Arc<Node>> {
        if let Some(n) = self.cache.get(&ptr.id) {
            return Ok(n);
        }
        if let Some(n) = pending_node(ptr.id)? {
            return Ok(n);
        }
        let data = stored_node(self.conn, ptr.id)?.ok_or_else(|| EnvError::Integrity {
            at: format!("node {} (#{})", ptr.hash, ptr.id),
            detail: "a view refers to a tree node that is not stored".into(),
        })?;
        let node = Arc::new(Node::decode(&data)?);
        if self.fill_cache {
            self.cache.insert(ptr.id, node.clone());
        }
        Ok(node)
    }
}

/// A node the open transaction created, not yet written (only the writing thread has any).
fn pending_node(id: NodeId) -> Result<Option<Arc<Node>>> {
    PENDING.with(|p| {
        let p = p.borrow();
        if let Some(n) = p.nodes.get(&id) {
            return Ok(Some(n.clone()));
        }
        Ok(p.unflushed
            .binary_search_by_key(&id, |(at, _, _)| *at)
            .ok()
            .map(|i| p.unflushed[i].2.clone()))
    })
}

/// The id the next new node gets: the first of those of the operation the running job will
/// record (see [`block::first_of_op`]). Called by the writer inside its transaction.
pub(crate) fn next_node_id(conn: &Connection) -> Result<NodeId> {
    Ok(block::first_of_op(next_seq(conn)?))
}

/// The sequence number the next operation gets. Called by the writer inside its transaction.
pub(crate) fn next_seq(conn: &Connection) -> Result<i64> {
    if let Some(seq) = PENDING.with(|p| p.borrow().latest.next_seq) {
        return Ok(seq);
    }
    Ok(conn
        .prepare_cached("SELECT COALESCE(MAX(seq), 0) + 1 FROM ops")?
        .query_row([], |r| r.get(0))?)
}

/// Keeps the running job's new nodes until it records its operation, which stores them.
pub(crate) fn insert_nodes(nodes: &[(Ptr, StoredNode)]) {
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        p.unflushed
            .extend(nodes.iter().map(|(ptr, n)| (ptr.id, ptr.hash, n.0.clone())));
        // A block lists its nodes in id order.
        p.unflushed.sort_unstable_by_key(|(id, _, _)| *id);
    });
}

/// The most bytes an operation's row (its record and nodes, and the other columns) should
/// take: SQLite keeps a row of up to 4,061 bytes on its 4 KiB page, and moves the rest of a
/// longer one to overflow pages.
const ROW_MAX: usize = 4000;

/// What an operation's row takes besides its record and its nodes (the other columns and the
/// row's header), at most.
const ROW_OVERHEAD: usize = 128;

/// Stores the nodes the running job created for operation `seq`, whose record takes `record`
/// bytes, and returns the block for the operation's row. They go there when the row stays
/// within [`ROW_MAX`]: an act's nodes (the path from its keys to the root) then cost its commit
/// no B-tree insert of their own. Otherwise (`None`, also when it created none) they go to
/// `node_blocks`, cut as ever so that reading one node never decodes much more. Refused, before
/// writing, if the nodes do not fit the operation's ids.
pub(crate) fn store_op_nodes(
    conn: &Connection,
    seq: i64,
    record: usize,
) -> Result<Option<Vec<u8>>> {
    let nodes = PENDING.with(|p| std::mem::take(&mut p.borrow_mut().unflushed));
    let (Some(first), Some(last)) = (nodes.first(), nodes.last()) else {
        return Ok(None);
    };
    if first.0 < block::first_of_op(seq) || last.0 > block::last_of_op(seq) {
        return Err(EnvError::RequestTooLarge(format!(
            "one operation may create at most {} tree nodes",
            block::last_of_op(seq) - block::first_of_op(seq) + 1
        )));
    }
    let data = block::encode_one(nodes.iter().map(|(id, h, n)| (*id, *h, &**n)));
    if record + ROW_OVERHEAD + data.len() <= ROW_MAX {
        return Ok(Some(data));
    }
    // Too large for the row: the same encodings, cut into blocks.
    let entries: Vec<block::Stored<'_>> = block::entries(first.0, &data).collect::<Result<_>>()?;
    insert_blocks(conn, entries)?;
    Ok(None)
}

/// Brings the operation index and the heads snapshot up to `last_seq` where they lag too far
/// behind, with what the writer knows of them.
fn tidy_indexes(conn: &Connection, last_seq: i64) -> Result<()> {
    let (mut indexed, mut snapshot) = PENDING.with(|p| {
        let latest = &mut p.borrow_mut().latest;
        (latest.indexed, std::mem::take(&mut latest.snapshot))
    });
    let tidied = op_index::compact(conn, last_seq, &mut indexed)
        .and_then(|()| heads::settle(conn, last_seq, &mut snapshot));
    PENDING.with(|p| {
        let latest = &mut p.borrow_mut().latest;
        latest.indexed = indexed;
        latest.snapshot = snapshot;
    });
    tidied
}

fn insert_blocks<'a>(
    conn: &Connection,
    nodes: impl IntoIterator<Item = block::Stored<'a>>,
) -> Result<()> {
    let mut stmt =
        conn.prepare_cached("INSERT INTO node_blocks(first, last, data) VALUES (?1, ?2, ?3)")?;
    for (first, last, data) in block::encode(nodes) {
        stmt.execute(params![first, last, data])?;
    }
    Ok(())
}

/// The block whose id range holds `id`, as its `first`, `last` and data.
fn block_holding(conn: &Connection, id: NodeId) -> Result<Option<(NodeId, NodeId, Vec<u8>)>> {
    // Only the nearest block can hold it (a condition on `last` in the query would make SQLite
    // walk every block below when none does).
    let nearest: Option<(NodeId, NodeId, Vec<u8>)> = conn
        .prepare_cached(
            "SELECT first, last, data FROM node_blocks WHERE first <= ?1 ORDER BY first DESC LIMIT 1",
        )?
        .query_row([id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .optional()?;
    Ok(nearest.filter(|(_, last, _)| *last >= id))
}

/// The block stored in operation `seq`'s row, if it has one.
fn op_row_nodes(conn: &Connection, seq: i64) -> Result<Option<Vec<u8>>> {
    let data: Option<Option<Vec<u8>>> = conn
        .prepare_cached("SELECT nodes FROM ops WHERE seq = ?1")?
        .query_row([seq], |r| r.get(0))
        .optional()?;
    Ok(data.flatten())
}

/// The encoding of stored node `id`: in the row of the operation that created it, or (for
/// earlier layouts) in the block whose range holds it or in a row of its own.
fn stored_node(conn: &Connection, id: NodeId) -> Result<Option<Vec<u8>>> {
    if let Some(seq) = block::op_holding(id)
        && let Some(data) = op_row_nodes(conn, seq)?
        && let Some((_, bytes)) = block::find(seq, &data, id)?
    {
        return Ok(Some(bytes.to_vec()));
    }
    if let Some((first, _, data)) = block_holding(conn, id)?
        && let Some((_, bytes)) = block::find(first, &data, id)?
    {
        return Ok(Some(bytes.to_vec()));
    }
    Ok(conn
        .prepare_cached("SELECT data FROM nodes WHERE id = ?1")?
        .query_row([id], |r| r.get(0))
        .optional()?)
}

/// Calls `f` with every stored node: its id, recorded hash and encoding.
pub(crate) fn each_node(
    conn: &Connection,
    mut f: impl FnMut(NodeId, &[u8], &[u8]) -> Result<()>,
) -> Result<()> {
    let mut stmt = conn.prepare_cached("SELECT id, hash, data FROM nodes")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let (id, hash, data): (NodeId, Vec<u8>, Vec<u8>) = (row.get(0)?, row.get(1)?, row.get(2)?);
        f(id, &hash, &data)?;
    }
    // The blocks of earlier layouts, by their first id; those of operations, by sequence
    // number (`entries` names the block in an error by that number).
    for sql in [
        "SELECT first, data FROM node_blocks",
        "SELECT seq, nodes FROM ops WHERE nodes IS NOT NULL",
    ] {
        let mut stmt = conn.prepare_cached(sql)?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let (at, data): (i64, Vec<u8>) = (row.get(0)?, row.get(1)?);
            for entry in block::entries(at, &data) {
                let (id, hash, bytes) = entry?;
                f(id, &hash.0, bytes)?;
            }
        }
    }
    Ok(())
}

/// Deletes the nodes in `dead`: only the blocks that hold some of them are read, and a block
/// keeping some of its nodes is rewritten with them alone.
pub(crate) fn delete_nodes(conn: &Connection, dead: &HashSet<NodeId>) -> Result<()> {
    let mut by_op: HashMap<i64, Vec<NodeId>> = HashMap::new();
    let mut ids = Vec::new();
    for &id in dead {
        match block::op_holding(id) {
            Some(seq) => by_op.entry(seq).or_default().push(id),
            None => ids.push(id),
        }
    }
    for (seq, of_op) in by_op {
        let Some(data) = op_row_nodes(conn, seq)? else {
            ids.extend(of_op);
            continue;
        };
        let entries: Vec<block::Stored<'_>> = block::entries(seq, &data).collect::<Result<_>>()?;
        // Those past the row's block are in `node_blocks`.
        ids.extend(
            of_op
                .iter()
                .filter(|id| !entries.iter().any(|(at, _, _)| at == *id)),
        );
        let kept: Vec<block::Stored<'_>> = entries
            .into_iter()
            .filter(|(id, _, _)| !dead.contains(id))
            .collect();
        let kept = (!kept.is_empty()).then(|| block::encode_one(kept));
        conn.prepare_cached("UPDATE ops SET nodes = ?1 WHERE seq = ?2")?
            .execute(params![kept, seq])?;
    }
    ids.sort_unstable();
    let mut del = conn.prepare_cached("DELETE FROM nodes WHERE id = ?1")?;
    let mut rest = &ids[..];
    while let Some(&id) = rest.first() {
        let Some((first, last, data)) = block_holding(conn, id)? else {
            del.execute([id])?;
            rest = &rest[1..];
            continue;
        };
        // Every dead id this block's range covers is in it (rows of their own predate all
        // blocks, so their ids lie below every block's range) and is handled with it.
        rest = &rest[rest.partition_point(|i| *i <= last)..];
        let kept: Vec<block::Stored<'_>> = block::entries(first, &data)
            .filter(|e| !matches!(e, Ok((id, _, _)) if dead.contains(id)))
            .collect::<Result<_>>()?;
        conn.prepare_cached("DELETE FROM node_blocks WHERE first = ?1")?
            .execute([first])?;
        insert_blocks(conn, kept)?;
    }
    Ok(())
}

/// What a job leaves for after its transaction commits.
#[derive(Default)]
pub(crate) struct TxEffects {
    /// Nodes to put in the cache.
    pub nodes: CommittedNodes,
    /// Operations (with their root node) to announce and put in the cache.
    pub ops: CommittedOps,
}

type Finisher = Box<dyn FnOnce(Option<&EnvError>) + Send>;
/// Runs the job in the open transaction (`None`: the transaction could not be opened, so the job
/// must not run) and returns whether it succeeded plus what to do once the commit is decided.
type Work = Box<dyn FnOnce(Option<&Connection>, &mut TxEffects) -> (bool, Finisher) + Send>;

struct Job {
    work: Work,
    full_sync: bool,
}

impl Job {
    /// A job that runs `work` and hands its outcome (or why it did not commit) to `reply`.
    fn new<R: Send + 'static>(
        full_sync: bool,
        work: impl FnOnce(&Connection, &mut TxEffects) -> Result<R> + Send + 'static,
        reply: impl FnOnce(Result<R>) + Send + 'static,
    ) -> Job {
        Job {
            full_sync,
            work: Box::new(move |conn, fx| {
                let outcome = conn.map(|c| work(c, fx));
                let ok = matches!(outcome, Some(Ok(_)));
                let finisher: Finisher = Box::new(move |commit_err| {
                    reply(match (outcome, commit_err) {
                        (_, Some(EnvError::CommitFailed(why))) => {
                            Err(EnvError::CommitFailed(why.clone()))
                        }
                        (_, Some(e)) => Err(EnvError::CommitFailed(e.to_string())),
                        (Some(r), None) => r,
                        (None, None) => Err(EnvError::CommitFailed("the job did not run".into())),
                    });
                });
                (ok, finisher)
            }),
        }
    }
}

/// The single writer: one write connection, one queue of jobs, committed in groups (one
/// transaction for all jobs waiting; a job refused before it writes does not undo the others, see
/// [`commit_group`]).
///
/// Whoever holds the connection commits for everyone queued: a synchronous caller queues its job
/// and takes the connection itself (no hand-off to another thread when it is alone, and a free
/// ride in the next group when it is not); asynchronous callers queue and wake the writer thread,
/// so no async worker ever waits on SQLite. One connection, one transaction at a time, in queue
/// order: the single-writer discipline, without a context switch on the sequential path.
pub(crate) struct Writer {
    shared: Arc<Shared>,
    thread: Mutex<Option<thread::JoinHandle<()>>>,
}

/// The write connection, with what its last group knew.
struct Held {
    conn: Connection,
    carried: Carried,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    conn: Mutex<Held>,
    after_commit: AfterCommit,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    closed: bool,
    /// The writer thread waits for a job. While it is busy it looks at the queue when done, so
    /// waking it then would be a wasted system call.
    idle: bool,
}

/// Most jobs committed in one transaction.
const MAX_GROUP: usize = 256;

impl Writer {
    pub fn start(conn: Connection, after_commit: AfterCommit) -> Result<Writer> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            conn: Mutex::new(Held {
                conn,
                carried: Carried::default(),
            }),
            after_commit,
        });
        let for_thread = shared.clone();
        let handle = thread::Builder::new()
            .name("environment-writer".into())
            .spawn(move || background(&for_thread))
            .map_err(|e| EnvError::Home {
                path: PathBuf::new(),
                detail: format!("cannot start the writer thread: {e}"),
            })?;
        Ok(Writer {
            shared,
            thread: Mutex::new(Some(handle)),
        })
    }

    /// Queues `work` for the writer thread; the reply arrives once its transaction has committed
    /// (or with the error that prevented it). `full_sync` makes the commit durable against power
    /// loss, not only against a crash of the process.
    pub fn submit<R: Send + 'static>(
        &self,
        full_sync: bool,
        work: impl FnOnce(&Connection, &mut TxEffects) -> Result<R> + Send + 'static,
    ) -> tokio::sync::oneshot::Receiver<Result<R>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        if let Some(true) = self.enqueue(full_sync, work, move |r| {
            let _ = tx.send(r);
        }) {
            self.shared.wake.notify_one();
        }
        rx
    }

    /// Runs `work` and waits for its commit, committing on this thread when the connection is
    /// free. Usable from inside an async runtime too (it blocks that thread, as any synchronous
    /// call does).
    pub fn run<R: Send + 'static>(
        &self,
        full_sync: bool,
        work: impl FnOnce(&Connection, &mut TxEffects) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let (tx, rx) = mpsc::sync_channel(1);
        if self
            .enqueue(full_sync, work, move |r| {
                let _ = tx.send(r);
            })
            .is_some()
        {
            // Our job is queued before we take the connection, so whoever holds it next —
            // this thread or one ahead of it — commits it.
            drain(&self.shared);
        }
        rx.recv().map_err(|_| EnvError::Closed)?
    }

    /// Queues a job: `None` if the writer is closed (the job is dropped, and its reply with it),
    /// else whether the writer thread waits for it.
    fn enqueue<R: Send + 'static>(
        &self,
        full_sync: bool,
        work: impl FnOnce(&Connection, &mut TxEffects) -> Result<R> + Send + 'static,
        reply: impl FnOnce(Result<R>) + Send + 'static,
    ) -> Option<bool> {
        let job = Job::new(full_sync, work, reply);
        let mut q = self.shared.queue.lock().ok()?;
        if q.closed {
            return None;
        }
        q.jobs.push_back(job);
        Some(q.idle)
    }

    /// Stops taking jobs, commits those queued and joins the writer thread.
    pub fn close(&self) {
        if let Ok(mut q) = self.shared.queue.lock() {
            q.closed = true;
        }
        self.shared.wake.notify_all();
        if let Ok(mut h) = self.thread.lock()
            && let Some(h) = h.take()
        {
            let _ = h.join();
        }
        drain(&self.shared);
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.close();
    }
}

/// How long the writer thread waits for the callers its last group answered to come back with
/// their next jobs. They come back within tens of microseconds: waiting for them makes groups as
/// large as the callers are many, so every commit's cost (its locks and the pages it writes) is
/// shared by more of them, and the writer runs the jobs that are back while it waits (see
/// [`Feed`]). With eight callers, this raised acts per second by a fifth over committing
/// whatever was queued first.
const LINGER: std::time::Duration = std::time::Duration::from_micros(50);

/// The jobs of one group: those queued when it begins, then (on the writer thread) those that
/// arrive while it runs. Jobs already queued are always taken, up to [`MAX_GROUP`]; more are
/// waited for while fewer than `expected` have run and [`LINGER`] has not passed since the
/// group began.
struct Feed<'a> {
    queued: std::vec::IntoIter<Job>,
    more: Option<More<'a>>,
    /// Whether the group commits durably (chosen before it begins: see [`More::next`]).
    full_sync: bool,
    taken: usize,
}

/// Where a group's later jobs come from, and how long it waits for them.
struct More<'a> {
    shared: &'a Shared,
    expected: usize,
    until: std::time::Instant,
}

impl<'a> Feed<'a> {
    fn new(queued: Vec<Job>, more: Option<More<'a>>) -> Feed<'a> {
        Feed {
            full_sync: queued.iter().any(|j| j.full_sync),
            queued: queued.into_iter(),
            more,
            taken: 0,
        }
    }

    fn next(&mut self) -> Option<Job> {
        let job = match self.queued.next() {
            Some(job) => Some(job),
            None if self.taken < MAX_GROUP => {
                let (full_sync, taken) = (self.full_sync, self.taken);
                self.more.as_mut().and_then(|m| m.next(full_sync, taken))
            }
            None => None,
        };
        self.taken += usize::from(job.is_some());
        job
    }
}

impl More<'_> {
    fn next(&mut self, full_sync: bool, taken: usize) -> Option<Job> {
        loop {
            {
                let mut q = self.shared.queue.lock().ok()?;
                if let Some(front) = q.jobs.front() {
                    // A job asking for a durable commit waits for the next group: the setting
                    // cannot change inside a transaction.
                    return (full_sync || !front.full_sync)
                        .then(|| q.jobs.pop_front())
                        .flatten();
                }
                if q.closed {
                    return None;
                }
            }
            if taken >= self.expected || std::time::Instant::now() >= self.until {
                return None;
            }
            thread::yield_now();
        }
    }
}

/// Yields for up to [`LINGER`] while no job is queued: the callers the last group answered are
/// about to come back, and waking this thread from its sleep would cost them a system call.
fn linger(shared: &Shared) {
    let until = std::time::Instant::now() + LINGER;
    while std::time::Instant::now() < until {
        match shared.queue.lock() {
            Ok(q) if q.jobs.is_empty() && !q.closed => {}
            _ => return,
        }
        thread::yield_now();
    }
}

/// The writer thread: commits what asynchronous callers queue, one group at a time, and
/// replies to them (handing the replies to a thread of their own was measured slower: the
/// extra wake-up cost more than the replies).
fn background(shared: &Shared) {
    // As many jobs as the last group had: its callers, back with their next.
    let mut expected = 1;
    loop {
        linger(shared);
        let batch = {
            let Ok(mut q) = shared.queue.lock() else {
                return;
            };
            q.idle = true;
            while q.jobs.is_empty() && !q.closed {
                q = match shared.wake.wait(q) {
                    Ok(q) => q,
                    Err(_) => return,
                };
            }
            q.idle = false;
            if q.jobs.is_empty() && q.closed {
                return;
            }
            take_group(&mut q)
        };
        let more = More {
            shared,
            expected,
            until: std::time::Instant::now() + LINGER,
        };
        let mut held = lock_conn(shared);
        let Held { conn, carried } = &mut *held;
        expected = commit_group(
            conn,
            carried,
            Feed::new(batch, Some(more)),
            &shared.after_commit,
        );
    }
}

/// The write connection. A panic inside a job is a bug, not a reason to stop writing: take the
/// connection back.
fn lock_conn(shared: &Shared) -> std::sync::MutexGuard<'_, Held> {
    shared
        .conn
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn take_group(q: &mut Queue) -> Vec<Job> {
    let n = q.jobs.len().min(MAX_GROUP);
    q.jobs.drain(..n).collect()
}

/// Takes the connection and commits groups until the queue is empty.
fn drain(shared: &Shared) {
    let mut held = lock_conn(shared);
    let Held { conn, carried } = &mut *held;
    loop {
        let batch: Vec<Job> = {
            let Ok(mut q) = shared.queue.lock() else {
                return;
            };
            take_group(&mut q)
        };
        if batch.is_empty() {
            return;
        }
        commit_group(conn, carried, Feed::new(batch, None), &shared.after_commit);
    }
}

/// Runs one statement through the statement cache (transaction control is run for every
/// commit: parsing it each time would show in the profile).
fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

/// Commits `batch` in one transaction. Jobs run without savepoints (a savepoint per job copies
/// every page it touches to a sub-journal, a large part of an act's cost): a job that fails
/// before writing anything — every refusal of an act does — leaves the transaction as it was.
/// A job that fails after writing spoils it: the transaction rolls back, the jobs that ran before
/// it fail with it (nothing of theirs happened either), and the rest run in a new transaction.
fn commit_group(
    conn: &Connection,
    carried: &mut Carried,
    mut jobs: Feed<'_>,
    after_commit: &AfterCommit,
) -> usize {
    let full_sync = jobs.full_sync;
    let began = (|| -> Result<()> {
        if full_sync {
            conn.pragma_update(None, "synchronous", "FULL")?;
        }
        exec(conn, "BEGIN IMMEDIATE")?;
        begin_pending(conn, carried)
    })();
    if let Err(e) = began {
        end_pending(carried, false);
        // Only the jobs already taken from the queue: the others wait for the next group.
        for job in jobs.queued.by_ref() {
            let (_, fin) = (job.work)(None, &mut TxEffects::default());
            fin(Some(&e));
        }
        let _ = conn.execute_batch("ROLLBACK");
        return jobs.taken;
    }
    // Each finisher with whether its job succeeded (a failed job reports its own error).
    let mut finishers: Vec<(bool, Finisher)> = Vec::with_capacity(jobs.queued.len());
    let mut effects = TxEffects::default();
    while let Some(job) = jobs.next() {
        let mut fx = TxEffects::default();
        let changes_before = conn.total_changes();
        let (work_ok, fin) = (job.work)(Some(conn), &mut fx);
        // Nodes a job made and did not record with an operation (it was refused) are not
        // written, and their ids go to the next job's operation.
        PENDING.with(|p| p.borrow_mut().unflushed.clear());
        // SQLite ends the transaction itself after some errors (disk full, I/O): what follows
        // would run outside any transaction, so that counts as spoiled too.
        let spoiled = (!work_ok && conn.total_changes() != changes_before) || conn.is_autocommit();
        if spoiled {
            end_pending(carried, false);
            let _ = exec(conn, "ROLLBACK");
            if full_sync {
                let _ = conn.pragma_update(None, "synchronous", "NORMAL");
            }
            let err = EnvError::CommitFailed(
                "another action committed with this one failed partway, and everything in the \
                 transaction was rolled back"
                    .into(),
            );
            fin(work_ok.then_some(&err));
            for (ok, fin) in finishers {
                fin(ok.then_some(&err));
            }
            // The jobs after it run in a new transaction.
            return commit_group(conn, carried, jobs, after_commit);
        }
        if work_ok {
            PENDING.with(|p| {
                let mut p = p.borrow_mut();
                p.nodes
                    .extend(fx.nodes.iter().map(|(id, n)| (*id, n.0.clone())));
                for (op, root) in &fx.ops {
                    p.ops.insert(op.id, (op.clone(), *root));
                    heads::set(&mut p.latest.heads, &op.branch, op.id);
                    p.latest.snapshot.record(&op.branch, op.id);
                    p.latest.next_seq = Some(op.seq as i64 + 1);
                }
            });
            effects.nodes.append(&mut fx.nodes);
            effects.ops.append(&mut fx.ops);
        }
        finishers.push((work_ok, fin));
    }
    // The group's last operation, if it recorded any.
    let last_seq = PENDING
        .with(|p| p.borrow().latest.next_seq)
        .map(|next| next - 1);
    let any_ok = finishers.iter().any(|(ok, _)| *ok);
    let committed = if any_ok {
        match last_seq {
            Some(seq) => tidy_indexes(conn, seq),
            None => Ok(()),
        }
        .and_then(|()| exec(conn, "COMMIT").map_err(EnvError::from))
    } else {
        exec(conn, "ROLLBACK").map_err(EnvError::from)
    };
    end_pending(carried, any_ok && committed.is_ok());
    if full_sync {
        let _ = conn.pragma_update(None, "synchronous", "NORMAL");
    }
    match committed {
        Ok(()) => {
            let TxEffects { nodes, ops } = effects;
            (after_commit.announce)(&ops);
            for (_, fin) in finishers {
                fin(None);
            }
            (after_commit.remember)(nodes, ops);
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            for (_, fin) in finishers {
                fin(Some(&e));
            }
        }
    }
    jobs.taken
}

#[cfg(test)]
mod tests {
    use super::*;

    type Replies = Arc<Mutex<Vec<(u8, Result<()>)>>>;

    /// A job that stores `name` in `meta`, then fails if `fail` says so (`Some(true)`: after
    /// writing, `Some(false)`: before).
    fn job(replies: &Replies, name: u8, fail: Option<bool>) -> Job {
        let replies = replies.clone();
        Job::new(
            false,
            move |conn, _| {
                if fail == Some(false) {
                    return Err(EnvError::UnknownBranch(name.to_string()));
                }
                conn.execute(
                    "INSERT INTO meta(name, value) VALUES (?1, 'x')",
                    [name.to_string()],
                )?;
                if fail == Some(true) {
                    return Err(EnvError::UnknownBranch(name.to_string()));
                }
                Ok(())
            },
            move |r| replies.lock().unwrap().push((name, r)),
        )
    }

    fn stored(conn: &Connection) -> Vec<String> {
        let mut stmt = conn
            .prepare("SELECT name FROM meta WHERE name != 'schema' ORDER BY name")
            .unwrap();
        stmt.query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    }

    fn outcomes(replies: &Replies) -> Vec<(u8, &'static str)> {
        let mut v: Vec<(u8, &'static str)> = replies
            .lock()
            .unwrap()
            .iter()
            .map(|(n, r)| {
                let what = match r {
                    Ok(()) => "ok",
                    Err(EnvError::UnknownBranch(_)) => "own error",
                    Err(EnvError::CommitFailed(why)) if !why.contains("could not commit") => {
                        "rolled back"
                    }
                    Err(_) => "other",
                };
                (*n, what)
            })
            .collect();
        v.sort();
        v
    }

    /// Commits jobs 1, 2 and 3 in one group, job 2 failing as `fail` says (after writing if
    /// true); returns what was stored and how each job ended. No transaction is left open.
    fn group_of_three(fail: bool) -> (Vec<String>, Vec<(u8, &'static str)>) {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_writer(&dir.path().join("db")).unwrap();
        let replies = Replies::default();
        let batch = vec![
            job(&replies, 1, None),
            job(&replies, 2, Some(fail)),
            job(&replies, 3, None),
        ];
        commit_group(
            &conn,
            &mut Carried::default(),
            Feed::new(batch, None),
            &AfterCommit {
                announce: Box::new(|_| {}),
                remember: Box::new(|_, _| {}),
            },
        );
        assert!(conn.is_autocommit(), "no transaction is left open");
        (stored(&conn), outcomes(&replies))
    }

    #[test]
    fn callers_are_answered_after_the_events_and_before_the_caches() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_writer(&dir.path().join("db")).unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let (o1, o2, o3) = (order.clone(), order.clone(), order.clone());
        let after = AfterCommit {
            announce: Box::new(move |_| o1.lock().unwrap().push("announced")),
            remember: Box::new(move |_, _| o2.lock().unwrap().push("remembered")),
        };
        let job = Job::new(
            false,
            |conn, _| Ok(conn.execute("INSERT INTO meta(name, value) VALUES ('x', 'y')", [])?),
            move |r: Result<usize>| {
                assert_eq!(r.unwrap(), 1);
                o3.lock().unwrap().push("answered");
            },
        );
        commit_group(
            &conn,
            &mut Carried::default(),
            Feed::new(vec![job], None),
            &after,
        );
        assert_eq!(
            *order.lock().unwrap(),
            ["announced", "answered", "remembered"]
        );
    }

    /// Jobs that arrive while a group runs join it, as many as it expects; one that asks for
    /// a durable commit waits for a group of its own.
    #[test]
    fn a_group_takes_the_jobs_that_arrive_while_it_runs() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_writer(&dir.path().join("db")).unwrap();
        let commits = Arc::new(Mutex::new(0));
        let counted = commits.clone();
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            conn: Mutex::new(Held {
                conn: Connection::open_in_memory().unwrap(),
                carried: Carried::default(),
            }),
            after_commit: AfterCommit {
                announce: Box::new(|_| {}),
                remember: Box::new(|_, _| {}),
            },
        });
        let replies = Replies::default();
        let queue = shared.clone();
        let (r2, r3) = (replies.clone(), replies.clone());
        // The first job queues a second while it runs, then a durable third.
        let first = Job::new(
            false,
            move |conn, _| {
                let mut q = queue.queue.lock().unwrap();
                q.jobs.push_back(job(&r2, 2, None));
                let mut durable = job(&r3, 3, None);
                durable.full_sync = true;
                q.jobs.push_back(durable);
                Ok(conn.execute("INSERT INTO meta(name, value) VALUES ('1', 'x')", [])?)
            },
            |r| assert_eq!(r.unwrap(), 1),
        );
        let more = More {
            shared: &shared,
            expected: 3,
            until: std::time::Instant::now() + std::time::Duration::from_secs(60),
        };
        let after = AfterCommit {
            announce: Box::new(move |_| *counted.lock().unwrap() += 1),
            remember: Box::new(|_, _| {}),
        };
        let taken = commit_group(
            &conn,
            &mut Carried::default(),
            Feed::new(vec![first], Some(more)),
            &after,
        );
        assert_eq!(taken, 2);
        assert_eq!(*commits.lock().unwrap(), 1, "one transaction");
        assert_eq!(stored(&conn), ["1", "2"]);
        assert_eq!(outcomes(&replies), [(2, "ok")]);
        let left = shared.queue.lock().unwrap().jobs.len();
        assert_eq!(left, 1, "the durable job waits for the next group");
    }

    #[test]
    fn nodes_past_their_operations_ids_are_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open_writer(&dir.path().join("db")).unwrap();
        let seq = 5;
        let node = Arc::new(Node::Leaf(Vec::new()));
        let new: Vec<(Ptr, StoredNode)> = [block::first_of_op(seq), block::last_of_op(seq) + 1]
            .into_iter()
            .map(|id| {
                let ptr = Ptr {
                    hash: node.hash(),
                    id,
                };
                (ptr, StoredNode(node.clone()))
            })
            .collect();
        insert_nodes(&new);
        assert!(matches!(
            store_op_nodes(&conn, seq, 0),
            Err(EnvError::RequestTooLarge(_))
        ));
        let blocks: i64 = conn
            .query_row("SELECT COUNT(*) FROM node_blocks", [], |r| r.get(0))
            .unwrap();
        assert_eq!(blocks, 0);
        // Within the operation's ids, the node goes to its row.
        insert_nodes(&new[..1]);
        assert!(store_op_nodes(&conn, seq, 0).unwrap().is_some());
    }

    #[test]
    fn a_job_refused_before_writing_leaves_the_others_of_its_group_committed() {
        let (stored, outcomes) = group_of_three(false);
        assert_eq!(stored, ["1", "3"]);
        assert_eq!(outcomes, [(1, "ok"), (2, "own error"), (3, "ok")]);
    }

    #[test]
    fn a_job_failing_after_writing_commits_nothing_of_it_nor_of_the_jobs_before_it() {
        let (stored, outcomes) = group_of_three(true);
        assert_eq!(stored, ["3"]);
        assert_eq!(outcomes, [(1, "rolled back"), (2, "own error"), (3, "ok")]);
    }
}
