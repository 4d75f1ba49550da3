//! [`PgLogStore`]: core's log port on PostgreSQL, so that several machines record into one
//! log: the operations, the branch heads, marks, fork points, dropped versions, refused
//! changes, blob pins, the outbox and the tree nodes.
//!
//! - Operations are appended with a sequence number taken from a sequence when the job starts
//!   to record: numbers may have gaps (a job that failed), and a later number never has an
//!   earlier parent.
//! - A job that reads a branch's head locks it (`SELECT … FOR UPDATE`) until it commits: two
//!   machines acting on one branch take turns there, so the second rebases on the first or
//!   conflicts with it, as two processes on one machine do. The head then moves by an
//!   `UPDATE … WHERE op = $read`.
//! - Nodes are stored by id with their hash; a job's ids come from a block of 2^20 taken from
//!   a sequence, so machines never give one id twice and an id is never reused.
//! - Each job is one transaction (`READ COMMITTED`); a reading of one consistent state is a
//!   `REPEATABLE READ` one.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, OnceLock, Weak, mpsc};

use environment_core::store::{
    AfterCommit, Answer, CommittedNodes, CommittedOps, LogRead, LogRow, LogStore, LogWrite, NodeId,
    NodeVisitor, Ptr, ReadJob, StoredNode, StoredOp, WriteJob,
};
use environment_core::{EnvError, Hash, OpId, Operation, PortError};
use postgres::{IsolationLevel, Row, Statement, Transaction};

use crate::connection::blocking;
use crate::error::{PgContext, PgError};
use crate::migrate::{Migration, migrate};
use crate::queue::session::{Session, Sessions};
use crate::server::Server;
use crate::statements::{Params, Statements, statements};

/// The component's name in `environment_migrations`.
const COMPONENT: &str = "log";

/// The log's migrations, in order.
const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "the log",
    sql: "
CREATE SEQUENCE log_seq;
CREATE SEQUENCE log_node_blocks;
CREATE TABLE log_ops(
    seq BIGINT PRIMARY KEY,
    id BYTEA NOT NULL UNIQUE CHECK (length(id) = 32),
    root BIGINT NOT NULL,
    record BYTEA NOT NULL,
    branch TEXT NOT NULL,
    run BYTEA
);
CREATE TABLE log_heads(name TEXT PRIMARY KEY, op BYTEA NOT NULL);
CREATE TABLE log_nodes(id BIGINT PRIMARY KEY, hash BYTEA NOT NULL, data BYTEA NOT NULL);
CREATE TABLE log_marks(
    name TEXT PRIMARY KEY,
    op BYTEA NOT NULL,
    actor TEXT NOT NULL,
    time_ms BIGINT NOT NULL
);
CREATE TABLE log_forks(op BYTEA PRIMARY KEY);
CREATE TABLE log_dropped(seq BIGINT PRIMARY KEY, actor TEXT NOT NULL, time_ms BIGINT NOT NULL);
CREATE TABLE log_refused(
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    actor TEXT NOT NULL,
    time_ms BIGINT NOT NULL,
    record BYTEA NOT NULL
);
CREATE TABLE log_blob_pins(hash BYTEA NOT NULL, owner TEXT NOT NULL, PRIMARY KEY(hash, owner));
CREATE TABLE log_outbox(
    pos BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event BYTEA NOT NULL
);
",
}];

/// How many ids one job's block of node ids holds (2^20, as an embedded operation's).
const NODE_BLOCK_BITS: u32 = 20;

/// Rows read per page by the walks over a whole table (the integrity check, collection).
const PAGE: i64 = 1000;

/// Decoded nodes by id (ids are never reused, so an entry never goes stale).
type NodeCache = quick_cache::sync::Cache<NodeId, StoredNode>;

type Pool = r2d2::Pool<Sessions>;

struct Shared {
    /// Taken out only when the store is dropped (see `Drop for Shared`).
    pool: Option<Pool>,
    nodes: NodeCache,
    after_commit: AfterCommit,
    /// The queue of asynchronous callers' write jobs, to the threads that run them (started
    /// on the first; they end when the store is dropped and the queue with it).
    writers: OnceLock<mpsc::Sender<Submitted>>,
}

/// How many threads commit asynchronous callers' write jobs: more would mostly wait on the
/// same branch head's row lock, and a burst of callers must not start a thread each.
const WRITERS: usize = 4;

/// A write job and where its answer goes.
type Submitted = (WriteJob, tokio::sync::oneshot::Sender<LogResult<Answer>>);

/// Starts the writer threads of the store `shared` and gives their queue. A thread holds the
/// store only while it runs a job, so dropping the last handle drops the queue and ends them.
fn start_writers(shared: Weak<Shared>) -> mpsc::Sender<Submitted> {
    let (queue, jobs) = mpsc::channel::<Submitted>();
    let jobs = Arc::new(Mutex::new(jobs));
    for _ in 0..WRITERS {
        let (jobs, shared) = (jobs.clone(), shared.clone());
        // A thread that cannot start leaves the others; with none, callers are told the store
        // closed (their replies are dropped).
        let _ = std::thread::Builder::new()
            .name("log-write".into())
            .spawn(move || {
                loop {
                    let next = match jobs.lock() {
                        Ok(jobs) => jobs.recv(),
                        Err(_) => return,
                    };
                    let Ok((job, reply)) = next else { return };
                    let Some(shared) = shared.upgrade() else {
                        return;
                    };
                    let _ = reply.send(PgLogStore { shared }.run_job(job));
                }
            });
    }
    queue
}

/// Closing a connection blocks on it: the pool's connections close off an async runtime, as
/// every call runs.
impl Drop for Shared {
    fn drop(&mut self) {
        let pool = self.pool.take();
        blocking(move || drop(pool));
    }
}

/// The log of an environment in a PostgreSQL database, shared by every machine that opens
/// it; open an environment on it with [`PgLogStore::opener`].
#[derive(Clone)]
pub struct PgLogStore {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PgLogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgLogStore").finish_non_exhaustive()
    }
}

/// What a failure of the database is, as the log's port reports it.
fn failed(e: PgError) -> EnvError {
    EnvError::Store(PortError::from(e))
}

trait Logged<T> {
    /// The port's error for a failed statement, saying what was being done.
    fn doing(self, what: &'static str) -> environment_core::error::Result<T>;
}

impl<T> Logged<T> for Result<T, postgres::Error> {
    fn doing(self, what: &'static str) -> environment_core::error::Result<T> {
        self.ctx(what).map_err(failed)
    }
}

type LogResult<T> = environment_core::error::Result<T>;

fn op_id(bytes: &[u8]) -> LogResult<OpId> {
    Hash::from_slice(bytes)
        .map(OpId)
        .ok_or_else(|| EnvError::Integrity {
            at: "the log".into(),
            detail: format!("an operation id of {} bytes", bytes.len()),
        })
}

impl PgLogStore {
    /// Connects to the database a libpq connection string names (its `sslrootcert`, if any,
    /// names the CA file) and migrates the log's tables; `after_commit` hears of every job
    /// committed through this handle.
    pub fn connect(
        params: &str,
        config: &crate::PgStoreConfig,
        after_commit: AfterCommit,
    ) -> crate::Result<PgLogStore> {
        let address = crate::ServerAddress::parse(params)?;
        let config = config.clone().reading(address.ca_file);
        PgLogStore::open(address.config, &config, after_commit)
    }

    /// [`PgLogStore::connect`] with a parsed configuration.
    pub fn open(
        mut server: postgres::Config,
        config: &crate::PgStoreConfig,
        after_commit: AfterCommit,
    ) -> crate::Result<PgLogStore> {
        server.application_name(&config.application_name);
        server.connect_timeout(config.connect_timeout);
        let server = Server::new(server, config.ca_file.as_deref())?;
        let pool = r2d2::Pool::builder()
            .max_size(16)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .connection_timeout(config.connect_timeout)
            .build(Sessions { server })?;
        let shared = Shared {
            pool: Some(pool),
            nodes: NodeCache::new(200_000),
            after_commit,
            writers: OnceLock::new(),
        };
        blocking(|| {
            let mut session = shared.pool()?.get()?;
            migrate(&mut session.client, COMPONENT, MIGRATIONS).map(drop)
        })?;
        Ok(PgLogStore {
            shared: Arc::new(shared),
        })
    }

    /// What opens an environment on this database's log: for
    /// [`Options::log_store`](environment_core::Options::log_store).
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use environment_core::{LocalEnvironment, Options};
    /// use environment_postgres::{PgEffectStore, PgLogStore, PgStoreConfig};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let at = "host=/run/postgresql user=env dbname=env";
    /// let config = PgStoreConfig::default();
    /// let env = LocalEnvironment::open(
    ///     "/tmp/env-home",
    ///     Options {
    ///         log_store: Some(PgLogStore::opener(at, &config)?),
    ///         effects: Some(Arc::new(PgEffectStore::connect(at, config.clone())?)),
    ///         ..Options::default()
    ///     },
    /// )?;
    /// # let _ = env;
    /// # Ok(()) }
    /// ```
    pub fn opener(
        params: &str,
        config: &crate::PgStoreConfig,
    ) -> crate::Result<environment_core::local::OpenLogStore> {
        let address = crate::ServerAddress::parse(params)?;
        let config = config.clone().reading(address.ca_file);
        Ok(PgLogStore::opener_on(address.config, &config))
    }

    /// [`PgLogStore::opener`] with a parsed configuration.
    pub fn opener_on(
        server: postgres::Config,
        config: &crate::PgStoreConfig,
    ) -> environment_core::local::OpenLogStore {
        let config = config.clone();
        Arc::new(move |after_commit| {
            let store = PgLogStore::open(server.clone(), &config, after_commit).map_err(failed)?;
            Ok(Arc::new(store) as Arc<dyn LogStore>)
        })
    }

    /// A pooled session; one the server ended is left behind (the pool drops it), and
    /// another taken.
    fn session(&self) -> LogResult<r2d2::PooledConnection<Sessions>> {
        let pool = self.shared.pool().map_err(failed)?;
        for _ in 0..=pool.max_size() {
            let session = pool.get().map_err(|e| failed(e.into()))?;
            if !session.client.is_closed() {
                return Ok(session);
            }
        }
        Err(failed(PgError::Unreachable(
            "every session to the server was closed".into(),
        )))
    }

    /// Runs a write job in a transaction of its own and, once it has committed, tells what
    /// it recorded.
    fn run_job(&self, job: WriteJob) -> LogResult<Answer> {
        let mut session = self.session()?;
        let Session { client, statements } = &mut *session;
        let mut tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::ReadCommitted)
            .start()
            .doing("starting a write")?;
        let (answer, ops, nodes) = {
            let mut on = OnTx {
                tx: &mut tx,
                statements,
            };
            let mut writing = Writing::new(&mut on, &self.shared.nodes);
            let answer = job(&mut writing);
            let (ops, nodes) = writing.recorded();
            (answer, ops, nodes)
        };
        let answer = answer?;
        tx.commit().doing("committing")?;
        (self.shared.after_commit.announce)(&ops);
        (self.shared.after_commit.remember)(nodes, ops);
        Ok(answer)
    }
}

impl Shared {
    fn pool(&self) -> crate::Result<&Pool> {
        self.pool
            .as_ref()
            .ok_or_else(|| PgError::Unreachable("the log's store is closed".into()))
    }
}

impl LogStore for PgLogStore {
    fn read(&self, snapshot: bool, f: &mut ReadJob<'_>) -> LogResult<()> {
        blocking(|| {
            let mut session = self.session()?;
            if !snapshot {
                let reading = Reading::new(&mut *session, &self.shared.nodes);
                return f(&reading);
            }
            let Session { client, statements } = &mut *session;
            let mut tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()
                .doing("starting a reading")?;
            let done = {
                let mut on = OnTx {
                    tx: &mut tx,
                    statements,
                };
                let reading = Reading::new(&mut on, &self.shared.nodes);
                f(&reading)
            };
            tx.commit().doing("ending a reading")?;
            done
        })
    }

    fn write(&self, _full_sync: bool, job: WriteJob) -> LogResult<Answer> {
        // Every commit is durable on the server (`synchronous_commit` is the server's to set).
        blocking(|| self.run_job(job))
    }

    fn submit(&self, job: WriteJob) -> tokio::sync::oneshot::Receiver<LogResult<Answer>> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let queue = self
            .shared
            .writers
            .get_or_init(|| start_writers(Arc::downgrade(&self.shared)));
        // With no writer thread left the reply is dropped, and the caller is told the store
        // closed.
        let _ = queue.send((job, reply));
        answer
    }
}

/// A transaction with the session's statements.
struct OnTx<'t, 'c> {
    tx: &'t mut Transaction<'c>,
    statements: &'t mut HashMap<&'static str, Statement>,
}

impl Statements for OnTx<'_, '_> {
    statements!(this => *this.tx, *this.statements);
}

/// A reading: on a bare session, or in a transaction.
struct Reading<'a> {
    db: RefCell<&'a mut (dyn Statements + 'a)>,
    nodes: &'a NodeCache,
}

impl<'a> Reading<'a> {
    fn new(db: &'a mut (dyn Statements + 'a), nodes: &'a NodeCache) -> Reading<'a> {
        Reading {
            db: RefCell::new(db),
            nodes,
        }
    }

    fn query(
        &self,
        sql: &'static str,
        params: Params<'_>,
        what: &'static str,
    ) -> LogResult<Vec<Row>> {
        self.db.borrow_mut().query(sql, params).doing(what)
    }

    fn query_opt(
        &self,
        sql: &'static str,
        params: Params<'_>,
        what: &'static str,
    ) -> LogResult<Option<Row>> {
        self.db.borrow_mut().query_opt(sql, params).doing(what)
    }

    fn execute(&self, sql: &'static str, params: Params<'_>, what: &'static str) -> LogResult<u64> {
        self.db.borrow_mut().execute(sql, params).doing(what)
    }

    fn ids(&self, sql: &'static str, what: &'static str) -> LogResult<HashSet<OpId>> {
        self.query(sql, &[], what)?
            .iter()
            .map(|r| op_id(r.get(0)))
            .collect()
    }

    /// Calls `f` with every row of `sql` (which takes the last key seen as `$1` and returns
    /// the key first, at most [`PAGE`] rows in key order), a page at a time.
    fn paged(
        &self,
        sql: &'static str,
        what: &'static str,
        mut f: impl FnMut(&Row) -> LogResult<()>,
    ) -> LogResult<()> {
        let mut after = i64::MIN;
        loop {
            let rows = self.query(sql, &[&after, &PAGE], what)?;
            for row in &rows {
                f(row)?;
            }
            match rows.last() {
                Some(last) if rows.len() as i64 == PAGE => after = last.get(0),
                _ => return Ok(()),
            }
        }
    }
}

impl LogRead for Reading<'_> {
    fn node(&self, ptr: &Ptr) -> LogResult<StoredNode> {
        if let Some(node) = self.nodes.get(&ptr.id) {
            return Ok(node);
        }
        let row = self.query_opt(
            "SELECT data FROM log_nodes WHERE id = $1",
            &[&ptr.id],
            "reading a tree node",
        )?;
        let Some(row) = row else {
            return Err(EnvError::Integrity {
                at: format!("node {} (#{})", ptr.hash, ptr.id),
                detail: "a view refers to a tree node that is not stored".into(),
            });
        };
        let node = StoredNode::decode(row.get(0))?;
        // Ids are never reused: a node read here stays what it is, committed or not.
        self.nodes.insert(ptr.id, node.clone());
        Ok(node)
    }

    fn head(&self, branch: &str) -> LogResult<Option<OpId>> {
        self.query_opt(
            "SELECT op FROM log_heads WHERE name = $1",
            &[&branch],
            "reading a head",
        )?
        .map(|r| op_id(r.get(0)))
        .transpose()
    }

    fn heads(&self) -> LogResult<BTreeMap<String, OpId>> {
        self.query("SELECT name, op FROM log_heads", &[], "reading the heads")?
            .iter()
            .map(|r| Ok((r.get(0), op_id(r.get(1))?)))
            .collect()
    }

    fn find_op(&self, id: &OpId) -> LogResult<Option<StoredOp>> {
        let row = self.query_opt(
            "SELECT root, record FROM log_ops WHERE id = $1",
            &[&&id.0.0[..]],
            "reading an operation",
        )?;
        row.map(|r| Ok((Arc::new(Operation::decode(r.get(1))?), r.get(0))))
            .transpose()
    }

    fn op_ids_between(&self, lo: &[u8], hi: &[u8]) -> LogResult<Vec<OpId>> {
        self.query(
            "SELECT id FROM log_ops WHERE id BETWEEN $1 AND $2 ORDER BY id",
            &[&lo, &hi],
            "finding operations by prefix",
        )?
        .iter()
        .map(|r| op_id(r.get(0)))
        .collect()
    }

    fn has_ops(&self) -> LogResult<bool> {
        Ok(self
            .query_opt(
                "SELECT 1 FROM log_ops LIMIT 1",
                &[],
                "looking for operations",
            )?
            .is_some())
    }

    fn first_op(&self) -> LogResult<Option<OpId>> {
        self.query_opt(
            "SELECT id FROM log_ops ORDER BY seq LIMIT 1",
            &[],
            "reading the first operation",
        )?
        .map(|r| op_id(r.get(0)))
        .transpose()
    }

    fn capture_run(&self, seq: u64) -> LogResult<Option<Vec<u8>>> {
        Ok(self
            .query_opt(
                "SELECT run FROM log_ops WHERE seq = $1",
                &[&(seq as i64)],
                "reading a capture run",
            )?
            .and_then(|r| r.get(0)))
    }

    fn each_op(&self, f: &mut dyn FnMut(LogRow<'_>) -> LogResult<()>) -> LogResult<()> {
        self.paged(
            "SELECT seq, id, root, record FROM log_ops WHERE seq > $1 ORDER BY seq LIMIT $2",
            "reading the log",
            |r| {
                f(LogRow {
                    seq: r.get::<_, i64>(0) as u64,
                    id: r.get(1),
                    root: r.get(2),
                    record: r.get(3),
                })
            },
        )
    }

    fn each_kept_op(&self, f: &mut dyn FnMut(Operation, NodeId) -> LogResult<()>) -> LogResult<()> {
        self.paged(
            "SELECT o.seq, o.root, o.record FROM log_ops o WHERE o.seq > $1
             AND NOT EXISTS (SELECT 1 FROM log_dropped d WHERE d.seq = o.seq)
             ORDER BY o.seq LIMIT $2",
            "reading the kept versions",
            |r| f(Operation::decode(r.get(2))?, r.get(1)),
        )
    }

    fn marks(&self) -> LogResult<Vec<(String, OpId)>> {
        self.query(
            "SELECT name, op FROM log_marks ORDER BY name",
            &[],
            "reading the marks",
        )?
        .iter()
        .map(|r| Ok((r.get(0), op_id(r.get(1))?)))
        .collect()
    }

    fn mark(&self, name: &str) -> LogResult<Option<OpId>> {
        self.query_opt(
            "SELECT op FROM log_marks WHERE name = $1",
            &[&name],
            "reading a mark",
        )?
        .map(|r| op_id(r.get(0)))
        .transpose()
    }

    fn forks(&self) -> LogResult<HashSet<OpId>> {
        self.ids("SELECT op FROM log_forks", "reading the fork points")
    }

    fn dropped_seqs(&self) -> LogResult<BTreeSet<u64>> {
        Ok(self
            .query(
                "SELECT seq FROM log_dropped",
                &[],
                "reading the dropped versions",
            )?
            .iter()
            .map(|r| r.get::<_, i64>(0) as u64)
            .collect())
    }

    fn is_dropped(&self, seq: u64) -> LogResult<bool> {
        Ok(self
            .query_opt(
                "SELECT 1 FROM log_dropped WHERE seq = $1",
                &[&(seq as i64)],
                "reading a dropped version",
            )?
            .is_some())
    }

    fn dropped_ids(&self) -> LogResult<HashSet<OpId>> {
        self.ids(
            "SELECT o.id FROM log_dropped d JOIN log_ops o ON o.seq = d.seq",
            "reading the dropped versions",
        )
    }

    fn refused_before(
        &self,
        before: u64,
        f: &mut dyn FnMut(u64, &[u8]) -> LogResult<bool>,
    ) -> LogResult<()> {
        let mut before = i64::try_from(before).unwrap_or(i64::MAX);
        loop {
            let rows = self.query(
                "SELECT id, record FROM log_refused WHERE id < $1 ORDER BY id DESC LIMIT $2",
                &[&before, &PAGE],
                "reading refused changes",
            )?;
            for r in &rows {
                before = r.get(0);
                if !f(before as u64, r.get(1))? {
                    return Ok(());
                }
            }
            if (rows.len() as i64) < PAGE {
                return Ok(());
            }
        }
    }

    fn blob_pins(&self) -> LogResult<Vec<Hash>> {
        Ok(self
            .query(
                "SELECT DISTINCT hash FROM log_blob_pins",
                &[],
                "reading the blob pins",
            )?
            .iter()
            .filter_map(|r| Hash::from_slice(r.get(0)))
            .collect())
    }

    fn outbox(&self, limit: usize) -> LogResult<Vec<(u64, Vec<u8>)>> {
        Ok(self
            .query(
                "SELECT pos, event FROM log_outbox ORDER BY pos LIMIT $1",
                &[&(limit as i64)],
                "reading the outbox",
            )?
            .iter()
            .map(|r| (r.get::<_, i64>(0) as u64, r.get(1)))
            .collect())
    }

    fn each_node(&self, f: &mut NodeVisitor<'_>) -> LogResult<()> {
        self.paged(
            "SELECT id, hash, data FROM log_nodes WHERE id > $1 ORDER BY id LIMIT $2",
            "reading the tree nodes",
            |r| f(r.get(0), r.get(1), r.get(2)),
        )
    }

    fn check_indexes(&self, _seqs: &std::collections::HashMap<OpId, u64>) -> LogResult<()> {
        // The table's own unique index on the id is the only one: nothing to compare.
        Ok(())
    }
}

/// One job's transaction, with what it has done so far.
struct Writing<'a> {
    read: Reading<'a>,
    /// The sequence number of the operation it records, once taken.
    seq: Cell<Option<u64>>,
    /// The first id of its block of node ids, once taken.
    first_node: Cell<Option<NodeId>>,
    /// Nodes put and not yet written (they are written with the operation).
    unwritten: Vec<(Ptr, StoredNode)>,
    /// The heads it read (and locked), and those it moved.
    heads: RefCell<HashMap<String, Option<OpId>>>,
    ops: CommittedOps,
    nodes: CommittedNodes,
}

impl<'a> Writing<'a> {
    fn new(tx: &'a mut (dyn Statements + 'a), nodes: &'a NodeCache) -> Writing<'a> {
        Writing {
            read: Reading::new(tx, nodes),
            seq: Cell::new(None),
            first_node: Cell::new(None),
            unwritten: Vec::new(),
            heads: RefCell::new(HashMap::new()),
            ops: Vec::new(),
            nodes: Vec::new(),
        }
    }

    fn recorded(self) -> (CommittedOps, CommittedNodes) {
        (self.ops, self.nodes)
    }

    fn next_value(&self, sql: &'static str, what: &'static str) -> LogResult<i64> {
        let rows = self.read.query(sql, &[], what)?;
        rows.first()
            .map(|r| r.get(0))
            .ok_or_else(|| failed(PgError::Schema(format!("{what}: no value"))))
    }

    /// Writes the nodes put since the last operation, checking they are the job's own ids.
    fn write_nodes(&mut self) -> LogResult<()> {
        if self.unwritten.is_empty() {
            return Ok(());
        }
        let first = self.next_node_id()?;
        let last = first + (1 << NODE_BLOCK_BITS) - 1;
        if self
            .unwritten
            .iter()
            .any(|(p, _)| p.id < first || p.id > last)
        {
            return Err(EnvError::RequestTooLarge(format!(
                "one operation may create at most {} tree nodes",
                1u64 << NODE_BLOCK_BITS
            )));
        }
        let ids: Vec<i64> = self.unwritten.iter().map(|(p, _)| p.id).collect();
        let hashes: Vec<&[u8]> = self.unwritten.iter().map(|(p, _)| &p.hash.0[..]).collect();
        let data: Vec<Vec<u8>> = self.unwritten.iter().map(|(_, n)| n.encode()).collect();
        self.read.execute(
            "INSERT INTO log_nodes(id, hash, data)
             SELECT * FROM unnest($1::BIGINT[], $2::BYTEA[], $3::BYTEA[])",
            &[&ids, &hashes, &data],
            "writing tree nodes",
        )?;
        self.nodes
            .extend(self.unwritten.drain(..).map(|(p, n)| (p.id, n)));
        Ok(())
    }
}

impl LogRead for Writing<'_> {
    fn node(&self, ptr: &Ptr) -> LogResult<StoredNode> {
        if let Some((_, n)) = self.unwritten.iter().find(|(p, _)| p.id == ptr.id) {
            return Ok(n.clone());
        }
        self.read.node(ptr)
    }

    fn head(&self, branch: &str) -> LogResult<Option<OpId>> {
        if let Some(known) = self.heads.borrow().get(branch) {
            return Ok(*known);
        }
        // Locked until the job commits: nobody else moves it meanwhile.
        let head = self
            .read
            .query_opt(
                "SELECT op FROM log_heads WHERE name = $1 FOR UPDATE",
                &[&branch],
                "locking a head",
            )?
            .map(|r| op_id(r.get(0)))
            .transpose()?;
        self.heads.borrow_mut().insert(branch.to_owned(), head);
        Ok(head)
    }

    fn has_ops(&self) -> LogResult<bool> {
        // Machines opening a new log at once take turns, so only one creates it.
        self.read.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || '.log_init', 0))",
            &[],
            "taking the log's first turn",
        )?;
        self.read.has_ops()
    }

    fn heads(&self) -> LogResult<BTreeMap<String, OpId>> {
        self.read.heads()
    }
    fn find_op(&self, id: &OpId) -> LogResult<Option<StoredOp>> {
        self.read.find_op(id)
    }
    fn op_ids_between(&self, lo: &[u8], hi: &[u8]) -> LogResult<Vec<OpId>> {
        self.read.op_ids_between(lo, hi)
    }
    fn first_op(&self) -> LogResult<Option<OpId>> {
        self.read.first_op()
    }
    fn capture_run(&self, seq: u64) -> LogResult<Option<Vec<u8>>> {
        self.read.capture_run(seq)
    }
    fn each_op(&self, f: &mut dyn FnMut(LogRow<'_>) -> LogResult<()>) -> LogResult<()> {
        self.read.each_op(f)
    }
    fn each_kept_op(&self, f: &mut dyn FnMut(Operation, NodeId) -> LogResult<()>) -> LogResult<()> {
        self.read.each_kept_op(f)
    }
    fn marks(&self) -> LogResult<Vec<(String, OpId)>> {
        self.read.marks()
    }
    fn mark(&self, name: &str) -> LogResult<Option<OpId>> {
        self.read.mark(name)
    }
    fn forks(&self) -> LogResult<HashSet<OpId>> {
        self.read.forks()
    }
    fn dropped_seqs(&self) -> LogResult<BTreeSet<u64>> {
        self.read.dropped_seqs()
    }
    fn is_dropped(&self, seq: u64) -> LogResult<bool> {
        self.read.is_dropped(seq)
    }
    fn dropped_ids(&self) -> LogResult<HashSet<OpId>> {
        self.read.dropped_ids()
    }
    fn refused_before(
        &self,
        before: u64,
        f: &mut dyn FnMut(u64, &[u8]) -> LogResult<bool>,
    ) -> LogResult<()> {
        self.read.refused_before(before, f)
    }
    fn blob_pins(&self) -> LogResult<Vec<Hash>> {
        self.read.blob_pins()
    }
    fn outbox(&self, limit: usize) -> LogResult<Vec<(u64, Vec<u8>)>> {
        self.read.outbox(limit)
    }
    fn each_node(&self, f: &mut NodeVisitor<'_>) -> LogResult<()> {
        self.read.each_node(f)
    }
    fn check_indexes(&self, seqs: &std::collections::HashMap<OpId, u64>) -> LogResult<()> {
        self.read.check_indexes(seqs)
    }
}

impl LogWrite for Writing<'_> {
    fn next_node_id(&self) -> LogResult<NodeId> {
        if let Some(first) = self.first_node.get() {
            return Ok(first);
        }
        let block = self.next_value(
            "SELECT nextval('log_node_blocks')",
            "taking a block of node ids",
        )?;
        let first = block << NODE_BLOCK_BITS;
        self.first_node.set(Some(first));
        Ok(first)
    }

    fn next_seq(&self) -> LogResult<u64> {
        if let Some(seq) = self.seq.get() {
            return Ok(seq);
        }
        let seq = self.next_value("SELECT nextval('log_seq')", "taking a sequence number")? as u64;
        self.seq.set(Some(seq));
        Ok(seq)
    }

    fn put_nodes(&mut self, nodes: Vec<(Ptr, StoredNode)>) {
        self.unwritten.extend(nodes);
    }

    fn append(
        &mut self,
        op: Arc<Operation>,
        record: &[u8],
        root: NodeId,
        run: Option<Vec<u8>>,
    ) -> LogResult<()> {
        self.write_nodes()?;
        self.read.execute(
            "INSERT INTO log_ops(seq, id, root, record, branch, run) VALUES ($1, $2, $3, $4, $5, $6)",
            &[
                &(op.seq as i64),
                &&op.id.0.0[..],
                &root,
                &record,
                &op.branch,
                &run,
            ],
            "appending an operation",
        )?;
        let read = self.head(&op.branch)?;
        let moved = match read {
            Some(was) => self.read.execute(
                "UPDATE log_heads SET op = $2 WHERE name = $1 AND op = $3",
                &[&op.branch, &&op.id.0.0[..], &&was.0.0[..]],
                "moving a head",
            )?,
            None => self.read.execute(
                "INSERT INTO log_heads(name, op) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                &[&op.branch, &&op.id.0.0[..]],
                "creating a head",
            )?,
        };
        match (moved, read) {
            (0, None) => return Err(EnvError::BranchExists(op.branch.clone())),
            // A head read is locked until the job commits: it cannot have moved.
            (0, Some(_)) => {
                return Err(EnvError::CommitFailed(format!(
                    "the head of {} moved while this operation held it; nothing was recorded",
                    op.branch
                )));
            }
            _ => {}
        }
        self.heads
            .borrow_mut()
            .insert(op.branch.clone(), Some(op.id));
        // The next operation of the job, if any, takes numbers of its own.
        self.seq.set(None);
        self.first_node.set(None);
        self.ops.push((op, root));
        Ok(())
    }

    fn queue_event(&mut self, event: Vec<u8>) -> LogResult<()> {
        self.read
            .execute(
                "INSERT INTO log_outbox(event) VALUES ($1)",
                &[&event],
                "queueing an event",
            )
            .map(drop)
    }

    fn remove_events(&mut self, positions: &[u64]) -> LogResult<()> {
        let positions: Vec<i64> = positions.iter().map(|p| *p as i64).collect();
        self.read
            .execute(
                "DELETE FROM log_outbox WHERE pos = ANY($1)",
                &[&positions],
                "removing published events",
            )
            .map(drop)
    }

    fn add_fork(&mut self, op: &OpId) -> LogResult<()> {
        self.read
            .execute(
                "INSERT INTO log_forks(op) VALUES ($1) ON CONFLICT DO NOTHING",
                &[&&op.0.0[..]],
                "noting a fork point",
            )
            .map(drop)
    }

    fn add_mark(&mut self, name: &str, op: &OpId, actor: &str, time_ms: i64) -> LogResult<()> {
        let added = self.read.execute(
            "INSERT INTO log_marks(name, op, actor, time_ms) VALUES ($1, $2, $3, $4)
             ON CONFLICT (name) DO NOTHING",
            &[&name, &&op.0.0[..], &actor, &time_ms],
            "adding a mark",
        )?;
        if added == 0 {
            return Err(EnvError::MarkExists(name.to_owned()));
        }
        Ok(())
    }

    fn drop_version(&mut self, seq: u64, actor: &str, time_ms: i64) -> LogResult<bool> {
        Ok(self.read.execute(
            "INSERT INTO log_dropped(seq, actor, time_ms) VALUES ($1, $2, $3)
             ON CONFLICT DO NOTHING",
            &[&(seq as i64), &actor, &time_ms],
            "dropping a version",
        )? > 0)
    }

    fn add_refused(&mut self, actor: &str, time_ms: i64, record: &[u8]) -> LogResult<u64> {
        let rows = self.read.query(
            "INSERT INTO log_refused(actor, time_ms, record) VALUES ($1, $2, $3) RETURNING id",
            &[&actor, &time_ms, &record],
            "keeping a refused change",
        )?;
        rows.first()
            .map(|r| r.get::<_, i64>(0) as u64)
            .ok_or_else(|| failed(PgError::Schema("a refused change got no id".into())))
    }

    fn pin_blob(&mut self, hash: &Hash, owner: &str, pinned: bool) -> LogResult<()> {
        let sql = if pinned {
            "INSERT INTO log_blob_pins(hash, owner) VALUES ($1, $2) ON CONFLICT DO NOTHING"
        } else {
            "DELETE FROM log_blob_pins WHERE hash = $1 AND owner = $2"
        };
        self.read
            .execute(sql, &[&&hash.0[..], &owner], "changing a blob pin")
            .map(drop)
    }

    fn delete_nodes(&mut self, dead: &HashSet<NodeId>) -> LogResult<()> {
        let ids: Vec<i64> = dead.iter().copied().collect();
        self.read.execute(
            "DELETE FROM log_nodes WHERE id = ANY($1)",
            &[&ids],
            "deleting tree nodes",
        )?;
        for id in dead {
            self.read.nodes.remove(id);
        }
        Ok(())
    }
}
