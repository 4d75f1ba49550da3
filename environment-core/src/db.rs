//! SQLite: the schema, the writer thread with group commit, and the pool of read connections.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::thread;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::error::{EnvError, Result};
use crate::event::Event;
use crate::tree::{NewNode, Node, NodeId, NodeSource, Ptr};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes(id INTEGER PRIMARY KEY, hash BLOB NOT NULL, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS ops(seq INTEGER PRIMARY KEY, id BLOB NOT NULL UNIQUE, root INTEGER NOT NULL, record BLOB NOT NULL);
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
CREATE TABLE IF NOT EXISTS blob_pins(hash BLOB NOT NULL, owner TEXT NOT NULL, PRIMARY KEY(hash, owner)) WITHOUT ROWID;
";

/// Opens the write connection and creates the schema.
pub(crate) fn open_writer(path: &Path) -> Result<Connection> {
    let conn = Connection::open(path)?;
    conn.busy_timeout(std::time::Duration::from_secs(30))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    tune(&conn)?;
    // Checkpoints fsync; a larger WAL makes them rarer, so their cost spreads over more commits.
    conn.pragma_update(None, "wal_autocheckpoint", 8192)?;
    conn.execute_batch(SCHEMA)?;
    conn.execute(
        "INSERT OR IGNORE INTO meta(name, value) VALUES ('schema', '1')",
        [],
    )?;
    Ok(conn)
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

thread_local! {
    /// Nodes written by the jobs already done in the open transaction, for the jobs after them:
    /// only the thread holding the write connection runs jobs, so this is that transaction's.
    static IN_FLIGHT: std::cell::RefCell<std::collections::HashMap<NodeId, Arc<Node>>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

impl NodeSource for DbNodes<'_> {
    fn node(&self, ptr: &Ptr) -> Result<Arc<Node>> {
        if let Some(n) = self.cache.get(&ptr.id) {
            return Ok(n);
        }
        if !self.fill_cache
            && let Some(n) = IN_FLIGHT.with(|m| m.borrow().get(&ptr.id).cloned())
        {
            return Ok(n);
        }
        let data: Option<Vec<u8>> = self
            .conn
            .prepare_cached("SELECT data FROM nodes WHERE id = ?1")?
            .query_row([ptr.id], |r| r.get(0))
            .optional()?;
        let data = data.ok_or_else(|| EnvError::Integrity {
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

/// The row id the next stored node gets: above every id ever used, including those of nodes
/// garbage collection removed (kept in `meta` as a high-water mark), so an id is never reused.
pub(crate) fn next_node_id(conn: &Connection) -> Result<NodeId> {
    Ok(conn
        .prepare_cached(
            "SELECT MAX(COALESCE((SELECT MAX(id) FROM nodes), 0),
                        COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE name = 'node_high_water'), 0)) + 1",
        )?
        .query_row([], |r| r.get(0))?)
}

/// Stores new nodes under their allocated ids.
pub(crate) fn insert_nodes(conn: &Connection, nodes: &[NewNode]) -> Result<()> {
    let mut stmt = conn.prepare_cached("INSERT INTO nodes(id, hash, data) VALUES (?1, ?2, ?3)")?;
    for n in nodes {
        stmt.execute(params![n.ptr.id, &n.ptr.hash.0[..], n.bytes])?;
    }
    Ok(())
}

/// What a job leaves for after its transaction commits.
#[derive(Default)]
pub(crate) struct TxEffects {
    /// Events to hand to subscribers and the outbox thread.
    pub events: Vec<Event>,
    /// Nodes to put in the cache.
    pub nodes: Vec<(NodeId, Arc<Node>)>,
    /// Operations (with their root node) to put in the cache.
    pub ops: Vec<(Arc<crate::op::Operation>, NodeId)>,
}

type Finisher = Box<dyn FnOnce(Option<&EnvError>) + Send>;
/// Runs the job in the open transaction (`None`: the transaction could not be opened, so the job
/// must not run) and returns whether it succeeded plus what to do once the commit is decided.
type Work = Box<dyn FnOnce(Option<&Connection>, &mut TxEffects) -> (bool, Finisher) + Send>;

struct Job {
    work: Work,
    full_sync: bool,
}

/// Called after every commit with what the committed jobs left.
pub(crate) type AfterCommit = Box<dyn Fn(TxEffects) + Send + Sync>;

/// The single writer: one write connection, one queue of jobs, committed in groups (one
/// transaction for all jobs waiting, each in its own savepoint so one failure does not undo the
/// others).
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

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
    conn: Mutex<Connection>,
    after_commit: AfterCommit,
}

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    closed: bool,
}

/// Most jobs committed in one transaction.
const MAX_GROUP: usize = 256;

impl Writer {
    pub fn start(conn: Connection, after_commit: AfterCommit) -> Result<Writer> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
            conn: Mutex::new(conn),
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
        if self.enqueue(full_sync, work, move |r| {
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
        if self.enqueue(full_sync, work, move |r| {
            let _ = tx.send(r);
        }) {
            // Our job is queued before we take the connection, so whoever holds it next —
            // this thread or one ahead of it — commits it.
            drain(&self.shared);
        }
        rx.recv().map_err(|_| EnvError::Closed)?
    }

    /// Queues a job; false if the writer is closed (the job is dropped, and its reply with it).
    fn enqueue<R: Send + 'static>(
        &self,
        full_sync: bool,
        work: impl FnOnce(&Connection, &mut TxEffects) -> Result<R> + Send + 'static,
        reply: impl FnOnce(Result<R>) + Send + 'static,
    ) -> bool {
        let job = Job {
            full_sync,
            work: Box::new(move |conn, fx| {
                let outcome = conn.map(|c| work(c, fx));
                let ok = matches!(outcome, Some(Ok(_)));
                let finisher: Finisher = Box::new(move |commit_err| {
                    reply(match (outcome, commit_err) {
                        (_, Some(e)) => Err(EnvError::CommitFailed(e.to_string())),
                        (Some(r), None) => r,
                        (None, None) => Err(EnvError::CommitFailed("the job did not run".into())),
                    });
                });
                (ok, finisher)
            }),
        };
        let Ok(mut q) = self.shared.queue.lock() else {
            return false;
        };
        if q.closed {
            return false;
        }
        q.jobs.push_back(job);
        true
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

/// The writer thread: commits what asynchronous callers queue.
fn background(shared: &Shared) {
    loop {
        {
            let Ok(mut q) = shared.queue.lock() else {
                return;
            };
            while q.jobs.is_empty() && !q.closed {
                q = match shared.wake.wait(q) {
                    Ok(q) => q,
                    Err(_) => return,
                };
            }
            if q.jobs.is_empty() && q.closed {
                return;
            }
        }
        drain(shared);
    }
}

/// Takes the connection and commits groups until the queue is empty.
fn drain(shared: &Shared) {
    // A panic inside a job is a bug, not a reason to stop writing: take the connection back.
    let conn = shared
        .conn
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    loop {
        let batch: Vec<Job> = {
            let Ok(mut q) = shared.queue.lock() else {
                return;
            };
            let n = q.jobs.len().min(MAX_GROUP);
            q.jobs.drain(..n).collect()
        };
        if batch.is_empty() {
            return;
        }
        commit_group(&conn, batch, &shared.after_commit);
    }
}

/// Runs one statement through the statement cache (transaction control is run for every
/// commit: parsing it each time would show in the profile).
fn exec(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(drop)
}

fn commit_group(conn: &Connection, batch: Vec<Job>, after_commit: &AfterCommit) {
    let full_sync = batch.iter().any(|j| j.full_sync);
    let began = (|| -> Result<()> {
        if full_sync {
            conn.pragma_update(None, "synchronous", "FULL")?;
        }
        exec(conn, "BEGIN IMMEDIATE")?;
        Ok(())
    })();
    if let Err(e) = began {
        for job in batch {
            let (_, fin) = (job.work)(None, &mut TxEffects::default());
            fin(Some(&e));
        }
        let _ = conn.execute_batch("ROLLBACK");
        return;
    }
    // A job alone needs no savepoint: if it fails, the whole transaction rolls back.
    let alone = batch.len() == 1;
    let mut finishers = Vec::with_capacity(batch.len());
    let mut effects = TxEffects::default();
    let mut any_ok = false;
    for job in batch {
        let mut fx = TxEffects::default();
        let in_savepoint = alone || exec(conn, "SAVEPOINT job").is_ok();
        let (work_ok, fin) = (job.work)(in_savepoint.then_some(conn), &mut fx);
        if work_ok {
            if !alone {
                let _ = exec(conn, "RELEASE job");
                IN_FLIGHT.with(|m| m.borrow_mut().extend(fx.nodes.iter().cloned()));
            }
            any_ok = true;
            effects.events.append(&mut fx.events);
            effects.nodes.append(&mut fx.nodes);
            effects.ops.append(&mut fx.ops);
        } else if in_savepoint && !alone {
            let _ = conn.execute_batch("ROLLBACK TO job; RELEASE job");
        }
        finishers.push(fin);
    }
    IN_FLIGHT.with(|m| m.borrow_mut().clear());
    let committed = if any_ok {
        exec(conn, "COMMIT").map_err(EnvError::from)
    } else {
        exec(conn, "ROLLBACK").map_err(EnvError::from)
    };
    if full_sync {
        let _ = conn.pragma_update(None, "synchronous", "NORMAL");
    }
    match committed {
        Ok(()) => {
            after_commit(effects);
            for fin in finishers {
                fin(None);
            }
        }
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            for fin in finishers {
                fin(Some(&e));
            }
        }
    }
}
