//! A background checkpointer for a SQLite database in WAL mode.
//!
//! Left to itself, SQLite checkpoints inside a commit once the WAL passes a threshold: the
//! committing thread copies pages back into the database and fsyncs it, and for a single writer
//! that is about a tenth of its time. A thread that checkpoints on a timer (PASSIVE: it never
//! waits for, nor blocks, a writer or a reader) takes that work off the commit path; the writer
//! keeps a high automatic threshold ([`BACKSTOP_PAGES`]) in case the thread falls behind.
//! The environment and the bus both use it.

use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

/// The automatic checkpoint threshold (in WAL pages) for a writer whose database has a
/// [`Checkpointer`]: reached only if the checkpointer falls behind.
pub const BACKSTOP_PAGES: i64 = 16_000;

/// Checkpoints a database every so often until dropped.
#[derive(Debug)]
pub struct Checkpointer {
    stop: Option<mpsc::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts checkpointing the database at `path` every `every`, on its own connection and
    /// thread, and raises the automatic threshold of `writer` (the database's write
    /// connection) to [`BACKSTOP_PAGES`].
    pub fn start(
        writer: &Connection,
        path: &Path,
        every: Duration,
    ) -> std::io::Result<Checkpointer> {
        writer
            .pragma_update(None, "wal_autocheckpoint", BACKSTOP_PAGES)
            .map_err(std::io::Error::other)?;
        let conn = Connection::open(path).map_err(std::io::Error::other)?;
        conn.busy_timeout(Duration::from_millis(100))
            .map_err(std::io::Error::other)?;
        let (stop, stopped) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name("sqlite-checkpointer".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    let r = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
                    if let Err(e) = r {
                        tracing::debug!(error = %e, "checkpoint skipped");
                    }
                }
            })?;
        Ok(Checkpointer {
            stop: Some(stop),
            handle: Some(handle),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
