//! SQLite: the schema, the writer thread with group commit, and the pool of read connections.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread;

use rusqlite::{Connection, OpenFlags, OptionalExtension, params};

use crate::error::{EnvError, Result};
use crate::event::Event;
use crate::hash::Hash;
use crate::tree::{Node, NodeSource};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS nodes(hash BLOB PRIMARY KEY, data BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ops(seq INTEGER PRIMARY KEY, id BLOB NOT NULL UNIQUE, record BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS heads(name TEXT PRIMARY KEY, op BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS marks(name TEXT PRIMARY KEY, op BLOB NOT NULL, actor TEXT NOT NULL, time_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS forks(op BLOB PRIMARY KEY) WITHOUT ROWID;
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

/// Decoded nodes shared by every reader and the writer.
pub(crate) type NodeCache = quick_cache::sync::Cache<Hash, Arc<Node>>;

/// Nodes read through a connection, via the cache.
pub(crate) struct DbNodes<'a> {
    pub conn: &'a Connection,
    pub cache: &'a NodeCache,
}

impl NodeSource for DbNodes<'_> {
    fn node(&self, hash: &Hash) -> Result<Arc<Node>> {
        if let Some(n) = self.cache.get(hash) {
            return Ok(n);
        }
        let data: Option<Vec<u8>> = self
            .conn
            .prepare_cached("SELECT data FROM nodes WHERE hash = ?1")?
            .query_row([&hash.0[..]], |r| r.get(0))
            .optional()?;
        let data = data.ok_or_else(|| EnvError::Integrity {
            at: format!("node {hash}"),
            detail: "a view refers to a tree node that is not stored".into(),
        })?;
        let node = Arc::new(Node::decode(&data)?);
        self.cache.insert(*hash, node.clone());
        Ok(node)
    }
}

/// Inserts nodes (idempotent: content-addressed).
pub(crate) fn insert_nodes(conn: &Connection, nodes: &[(Hash, Arc<Node>, Vec<u8>)]) -> Result<()> {
    let mut stmt =
        conn.prepare_cached("INSERT OR IGNORE INTO nodes(hash, data) VALUES (?1, ?2)")?;
    for (h, _, bytes) in nodes {
        stmt.execute(params![&h.0[..], bytes])?;
    }
    Ok(())
}

/// What a job leaves for after its transaction commits.
#[derive(Default)]
pub(crate) struct TxEffects {
    /// Events to hand to subscribers and the outbox thread.
    pub events: Vec<Event>,
    /// Nodes to put in the cache.
    pub nodes: Vec<(Hash, Arc<Node>)>,
    /// Operations to put in the cache.
    pub ops: Vec<Arc<crate::op::Operation>>,
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
pub(crate) type AfterCommit = Box<dyn Fn(TxEffects) + Send>;

/// The single writer: owns the write connection; jobs arrive over a channel and are committed
/// in groups (one transaction for all jobs waiting, each in its own savepoint so one failure
/// does not undo the others).
pub(crate) struct Writer {
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    handle: Mutex<Option<thread::JoinHandle<()>>>,
}

/// Most jobs committed in one transaction.
const MAX_GROUP: usize = 256;

impl Writer {
    pub fn start(conn: Connection, after_commit: AfterCommit) -> Result<Writer> {
        let (tx, rx) = mpsc::channel::<Job>();
        let handle = thread::Builder::new()
            .name("environment-writer".into())
            .spawn(move || writer_loop(conn, rx, after_commit))
            .map_err(|e| EnvError::Home {
                path: PathBuf::new(),
                detail: format!("cannot start the writer thread: {e}"),
            })?;
        Ok(Writer {
            tx: Mutex::new(Some(tx)),
            handle: Mutex::new(Some(handle)),
        })
    }

    /// Runs `work` in the writer's transaction; the reply arrives once the transaction has
    /// committed (or with the error that prevented it). `full_sync` makes the commit durable
    /// against power loss, not only against a crash of the process.
    pub fn submit<R: Send + 'static>(
        &self,
        full_sync: bool,
        work: impl FnOnce(&Connection, &mut TxEffects) -> Result<R> + Send + 'static,
    ) -> tokio::sync::oneshot::Receiver<Result<R>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.submit_with(full_sync, work, move |r| {
            let _ = tx.send(r);
        });
        rx
    }

    /// Like [`Writer::submit`], waiting for the reply on this thread. Usable from inside an
    /// async runtime too (it blocks that thread, as any synchronous call does).
    pub fn run<R: Send + 'static>(
        &self,
        full_sync: bool,
        work: impl FnOnce(&Connection, &mut TxEffects) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.submit_with(full_sync, work, move |r| {
            let _ = tx.send(r);
        });
        rx.recv().map_err(|_| EnvError::Closed)?
    }

    fn submit_with<R: Send + 'static>(
        &self,
        full_sync: bool,
        work: impl FnOnce(&Connection, &mut TxEffects) -> Result<R> + Send + 'static,
        reply: impl FnOnce(Result<R>) + Send + 'static,
    ) {
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
        if let Ok(guard) = self.tx.lock()
            && let Some(tx) = guard.as_ref()
        {
            // A send error drops the job, and with it the reply: the caller sees Closed.
            let _ = tx.send(job);
        }
    }

    /// Stops taking jobs, finishes those queued and joins the thread.
    pub fn close(&self) {
        if let Ok(mut g) = self.tx.lock() {
            g.take();
        }
        if let Ok(mut h) = self.handle.lock()
            && let Some(h) = h.take()
        {
            let _ = h.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.close();
    }
}

fn writer_loop(conn: Connection, rx: mpsc::Receiver<Job>, after_commit: AfterCommit) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_GROUP {
            match rx.try_recv() {
                Ok(j) => batch.push(j),
                Err(_) => break,
            }
        }
        let full_sync = batch.iter().any(|j| j.full_sync);
        let mut finishers = Vec::with_capacity(batch.len());
        let mut effects = TxEffects::default();
        let began = (|| -> Result<()> {
            if full_sync {
                conn.pragma_update(None, "synchronous", "FULL")?;
            }
            conn.execute_batch("BEGIN IMMEDIATE")?;
            Ok(())
        })();
        if let Err(e) = began {
            for job in batch {
                let (_, fin) = (job.work)(None, &mut TxEffects::default());
                fin(Some(&e));
            }
            let _ = conn.execute_batch("ROLLBACK");
            continue;
        }
        for job in batch {
            let mut fx = TxEffects::default();
            let in_savepoint = conn.execute_batch("SAVEPOINT job").is_ok();
            let (work_ok, fin) = (job.work)(in_savepoint.then_some(&conn), &mut fx);
            if work_ok {
                let _ = conn.execute_batch("RELEASE job");
                effects.events.append(&mut fx.events);
                effects.nodes.append(&mut fx.nodes);
                effects.ops.append(&mut fx.ops);
            } else if in_savepoint {
                let _ = conn.execute_batch("ROLLBACK TO job; RELEASE job");
            }
            finishers.push(fin);
        }
        let committed = conn.execute_batch("COMMIT").map_err(EnvError::from);
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
}
