//! The embedded store: the log's port ([`crate::store`]) over one SQLite database in the
//! environment's home (`env.db`), with one writer thread committing jobs in groups and a pool
//! of read connections. The effect log lives in the same database by default.

pub(crate) mod db;
mod effects;
pub(crate) mod heads;
mod log;
pub(crate) mod op_index;

use std::path::Path;
use std::sync::Arc;

use crate::checkpoint::Checkpointer;
use crate::effect::EffectStore;
use crate::error::{EnvError, Result};
use crate::store::{AfterCommit, Answer, LogStore, ReadJob, WriteJob};

pub(crate) use db::NodeCache;
use db::{ReadPool, Writer};
use log::{SqliteLog, SqliteTx};
use op_index::OpIndex;

/// The log in `env.db`.
pub(crate) struct EmbeddedStore {
    writer: Arc<Writer>,
    readers: Arc<ReadPool>,
    nodes: Arc<NodeCache>,
    index: Arc<OpIndex>,
    /// Checkpoints until the store closes.
    _checkpointer: Option<Checkpointer>,
}

impl EmbeddedStore {
    /// Opens (creating or migrating) the database at `path`. `nodes` caches decoded nodes for
    /// the readers; `after_commit` hears of every group committed.
    pub(crate) fn open(
        path: &Path,
        checkpoint_every: Option<std::time::Duration>,
        nodes: Arc<NodeCache>,
        after_commit: AfterCommit,
    ) -> Result<EmbeddedStore> {
        let conn = db::open_writer(path)?;
        let checkpointer = match checkpoint_every {
            Some(every) => {
                Some(
                    Checkpointer::start(&conn, path, every).map_err(|e| EnvError::Home {
                        path: path.to_path_buf(),
                        detail: format!("cannot start the checkpointer: {e}"),
                    })?,
                )
            }
            None => None,
        };
        Ok(EmbeddedStore {
            writer: Arc::new(Writer::start(conn, after_commit)?),
            readers: Arc::new(ReadPool::new(path.to_path_buf())),
            nodes,
            index: Arc::new(OpIndex::default()),
            _checkpointer: checkpointer,
        })
    }

    /// The effect log in the same database, written through the same writer.
    pub(crate) fn effects(&self) -> Arc<dyn EffectStore> {
        Arc::new(effects::EmbeddedEffects {
            writer: self.writer.clone(),
            readers: self.readers.clone(),
        })
    }

    fn job(
        &self,
        job: WriteJob,
    ) -> impl FnOnce(&rusqlite::Connection, &mut db::TxEffects) -> Result<Answer> + Send + 'static
    {
        let (nodes, index) = (self.nodes.clone(), self.index.clone());
        move |conn, fx| job(&mut SqliteTx::new(conn, fx, &nodes, &index))
    }
}

impl LogStore for EmbeddedStore {
    fn read(&self, snapshot: bool, f: &mut ReadJob<'_>) -> Result<()> {
        self.readers.with(|conn| {
            let log = SqliteLog::reading(conn, &self.nodes, &self.index);
            if !snapshot {
                return f(&log);
            }
            conn.execute_batch("BEGIN")?;
            let r = f(&log);
            let _ = conn.execute_batch("COMMIT");
            r
        })
    }

    fn write(&self, full_sync: bool, job: WriteJob) -> Result<Answer> {
        self.writer.run(full_sync, self.job(job))
    }

    fn submit(&self, job: WriteJob) -> tokio::sync::oneshot::Receiver<Result<Answer>> {
        self.writer.submit(false, self.job(job))
    }
}
