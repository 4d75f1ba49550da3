//! The stat cache: what each captured path looked like on disk, so a rescan re-reads only what
//! differs. Persisted next to the environment, updated only after the capture it describes has
//! committed (a stale entry costs a re-hash; a premature one would hide a change).

use std::collections::HashMap;
use std::path::Path;

use rusqlite::{Connection, params};

use crate::error::Result;

/// What `lstat` said of a path when it was captured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatEntry {
    /// Size in bytes.
    pub size: u64,
    /// Modification time, ns.
    pub mtime_ns: i64,
    /// Change time, ns: moves on every write and every `utime`, so a same-size edit with the
    /// mtime put back is still seen.
    pub ctime_ns: i64,
    /// Inode number.
    pub ino: u64,
    /// Full mode, file type included.
    pub mode: u32,
}

impl StatEntry {
    /// The entry for a stat.
    pub fn of(st: &rustix::fs::Stat) -> StatEntry {
        StatEntry {
            size: st.st_size as u64,
            mtime_ns: crate::fsops::mtime_ns(st),
            ctime_ns: crate::fsops::ctime_ns(st),
            ino: st.st_ino,
            mode: st.st_mode,
        }
    }
}

/// The cache of one tracked root.
pub struct StatCache {
    conn: Connection,
    scope: String,
    entries: HashMap<Vec<u8>, StatEntry>,
}

impl std::fmt::Debug for StatCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatCache")
            .field("scope", &self.scope)
            .field("entries", &self.entries.len())
            .finish()
    }
}

impl StatCache {
    /// Opens the cache of `scope` (one tracked root on one branch) in `db`.
    pub fn open(db: &Path, scope: &str) -> Result<StatCache> {
        let conn = Connection::open(db)?;
        conn.busy_timeout(std::time::Duration::from_secs(30))?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS stat_cache(scope TEXT NOT NULL, path BLOB NOT NULL, size INTEGER NOT NULL,
                 mtime_ns INTEGER NOT NULL, ctime_ns INTEGER NOT NULL, ino INTEGER NOT NULL, mode INTEGER NOT NULL,
                 PRIMARY KEY(scope, path)) WITHOUT ROWID;
             CREATE TABLE IF NOT EXISTS restore_intent(scope TEXT PRIMARY KEY, target TEXT NOT NULL, started_ms INTEGER NOT NULL);",
        )?;
        let mut entries = HashMap::new();
        {
            let mut stmt = conn.prepare(
                "SELECT path, size, mtime_ns, ctime_ns, ino, mode FROM stat_cache WHERE scope = ?1",
            )?;
            let mut rows = stmt.query([scope])?;
            while let Some(r) = rows.next()? {
                entries.insert(
                    r.get::<_, Vec<u8>>(0)?,
                    StatEntry {
                        size: r.get::<_, i64>(1)? as u64,
                        mtime_ns: r.get(2)?,
                        ctime_ns: r.get(3)?,
                        ino: r.get::<_, i64>(4)? as u64,
                        mode: r.get::<_, i64>(5)? as u32,
                    },
                );
            }
        }
        Ok(StatCache {
            conn,
            scope: scope.to_owned(),
            entries,
        })
    }

    /// The entry of a path.
    pub fn get(&self, path: &[u8]) -> Option<&StatEntry> {
        self.entries.get(path)
    }

    /// Every cached path.
    pub fn paths(&self) -> impl Iterator<Item = &Vec<u8>> {
        self.entries.keys()
    }

    /// Records new entries (`None` removes), in one transaction.
    pub fn update(&mut self, changes: Vec<(Vec<u8>, Option<StatEntry>)>) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let tx = self.conn.transaction()?;
        {
            let mut put = tx.prepare_cached(
                "INSERT OR REPLACE INTO stat_cache(scope, path, size, mtime_ns, ctime_ns, ino, mode) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?;
            let mut del =
                tx.prepare_cached("DELETE FROM stat_cache WHERE scope = ?1 AND path = ?2")?;
            for (path, entry) in &changes {
                match entry {
                    Some(e) => put.execute(params![
                        self.scope,
                        path,
                        e.size as i64,
                        e.mtime_ns,
                        e.ctime_ns,
                        e.ino as i64,
                        e.mode as i64
                    ])?,
                    None => del.execute(params![self.scope, path])?,
                };
            }
        }
        tx.commit()?;
        for (path, entry) in changes {
            match entry {
                Some(e) => self.entries.insert(path, e),
                None => self.entries.remove(&path),
            };
        }
        Ok(())
    }

    /// Records that a restore to `target` has started (cleared when it finishes): an
    /// interrupted restore is visible on reopen.
    pub fn begin_restore(&self, target: &str, now_ms: i64) -> Result<()> {
        self.conn.execute(
            "INSERT OR REPLACE INTO restore_intent(scope, target, started_ms) VALUES (?1, ?2, ?3)",
            params![self.scope, target, now_ms],
        )?;
        Ok(())
    }

    /// Clears the restore intent.
    pub fn end_restore(&self) -> Result<()> {
        self.conn
            .execute("DELETE FROM restore_intent WHERE scope = ?1", [&self.scope])?;
        Ok(())
    }

    /// The target of a restore that started and never finished.
    pub fn interrupted_restore(&self) -> Result<Option<String>> {
        use rusqlite::OptionalExtension;
        Ok(self
            .conn
            .query_row(
                "SELECT target FROM restore_intent WHERE scope = ?1",
                [&self.scope],
                |r| r.get(0),
            )
            .optional()?)
    }
}
