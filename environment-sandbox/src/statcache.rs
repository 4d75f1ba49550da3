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
    /// Link count: more than one for a file with hard links (whose other paths the cache
    /// finds by inode).
    pub links: u64,
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
            links: st.st_nlink,
            mode: st.st_mode,
        }
    }
}

/// The cache of one tracked root. Its entries are read from disk only when a rescan needs them
/// all: a capture of a few dirty paths never loads the cache of the whole tree.
///
/// It also keeps the version it *covers*: one whose every key has an entry, so that a rescan
/// at that version finds every recorded path that is gone among the cache's entries and need
/// not list the version. A rescan that listed the head and found every key here sets it; a
/// capture whose operation follows that version moves it along (it writes an entry for every
/// key it changes); any other update forgets it. The loaded entries keep their own, read with
/// them: another process's updates reach the disk, not them.
pub struct StatCache {
    conn: Connection,
    scope: String,
    entries: std::cell::OnceCell<HashMap<Vec<u8>, StatEntry>>,
    /// The version the loaded entries cover.
    loaded_covers: std::cell::RefCell<Option<String>>,
}

impl std::fmt::Debug for StatCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatCache")
            .field("scope", &self.scope)
            .field("loaded", &self.entries.get().map(HashMap::len))
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
             CREATE TABLE IF NOT EXISTS restore_intent(scope TEXT PRIMARY KEY, target TEXT NOT NULL, started_ms INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS stat_cache_covers(scope TEXT PRIMARY KEY, version TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS tree_holds(scope TEXT PRIMARY KEY, version TEXT NOT NULL);",
        )?;
        // Added later, so older caches get them: link counts (every entry counting one link),
        // with an index of the hard-linked entries only (one of every entry would double the
        // cost of each capture's update); and what a restore meant to do, so that a crash
        // mid-way can be finished.
        add_column(&conn, "stat_cache", "links", "INTEGER NOT NULL DEFAULT 1")?;
        conn.execute_batch(
            "CREATE INDEX IF NOT EXISTS stat_cache_links ON stat_cache(scope, ino) WHERE links > 1",
        )?;
        for column in ["from_version", "actor", "intent"] {
            add_column(&conn, "restore_intent", column, "TEXT")?;
        }
        Ok(StatCache {
            conn,
            scope: scope.to_owned(),
            entries: std::cell::OnceCell::new(),
            loaded_covers: std::cell::RefCell::new(None),
        })
    }

    /// Every entry, by path: the whole cache, loaded once (for rescans, which share it between
    /// threads).
    pub fn all(&self) -> Result<&HashMap<Vec<u8>, StatEntry>> {
        if let Some(e) = self.entries.get() {
            return Ok(e);
        }
        let mut entries = HashMap::new();
        // One read transaction: the version covered is the one these entries cover.
        let tx = self.conn.unchecked_transaction()?;
        let covers = stored_covers(&tx, &self.scope)?;
        {
            let mut stmt = tx.prepare(
                "SELECT path, size, mtime_ns, ctime_ns, ino, mode, links FROM stat_cache WHERE scope = ?1",
            )?;
            let mut rows = stmt.query([&self.scope])?;
            while let Some(r) = rows.next()? {
                entries.insert(r.get::<_, Vec<u8>>(0)?, entry_at(r, 1)?);
            }
        }
        tx.finish()?;
        *self.loaded_covers.borrow_mut() = covers;
        Ok(self.entries.get_or_init(|| entries))
    }

    /// Whether the loaded entries ([`StatCache::all`]) have an entry for every key of
    /// `version`.
    pub fn covers(&self, version: &str) -> bool {
        self.entries.get().is_some() && self.loaded_covers.borrow().as_deref() == Some(version)
    }

    /// Records that the cache has an entry for every key of `version` (a rescan listed it and
    /// found them all among the loaded entries).
    pub fn set_covers(&self, version: &str) -> Result<()> {
        store_covers(&self.conn, &self.scope, Some(version))?;
        *self.loaded_covers.borrow_mut() = Some(version.to_owned());
        Ok(())
    }

    /// The entry of one path, without loading the whole cache (for captures of a few paths).
    pub fn lookup(&self, path: &[u8]) -> Result<Option<StatEntry>> {
        use rusqlite::OptionalExtension;
        if let Some(e) = self.entries.get() {
            return Ok(e.get(path).copied());
        }
        let mut stmt = self.conn.prepare_cached(
            "SELECT size, mtime_ns, ctime_ns, ino, mode, links FROM stat_cache WHERE scope = ?1 AND path = ?2",
        )?;
        Ok(stmt
            .query_row(params![self.scope, path], |r| entry_at(r, 0))
            .optional()?)
    }

    /// The cached paths of inode `ino` recorded with several links: the other links of a
    /// hard-linked file.
    pub fn paths_with_ino(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        let mut stmt = self.conn.prepare_cached(
            "SELECT path FROM stat_cache WHERE scope = ?1 AND ino = ?2 AND links > 1",
        )?;
        let rows = stmt.query_map(params![self.scope, ino as i64], |r| r.get(0))?;
        Ok(rows.collect::<std::result::Result<_, _>>()?)
    }

    /// The cached paths of any of `inodes`, whatever their link count when cached: one look at
    /// the whole cache (in memory when loaded), for links just made.
    pub fn paths_of_inodes(
        &self,
        inodes: &std::collections::BTreeSet<u64>,
    ) -> Result<Vec<Vec<u8>>> {
        if let Some(e) = self.entries.get() {
            return Ok(e
                .iter()
                .filter(|(_, s)| inodes.contains(&s.ino))
                .map(|(p, _)| p.clone())
                .collect());
        }
        let mut stmt = self
            .conn
            .prepare_cached("SELECT path, ino FROM stat_cache WHERE scope = ?1")?;
        let rows = stmt.query_map([&self.scope], |r| {
            Ok((r.get::<_, Vec<u8>>(0)?, r.get::<_, i64>(1)? as u64))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (path, ino) = row?;
            if inodes.contains(&ino) {
                out.push(path);
            }
        }
        Ok(out)
    }

    /// Whether nothing of this root was ever captured.
    pub fn is_empty(&self) -> Result<bool> {
        use rusqlite::OptionalExtension;
        Ok(self
            .conn
            .query_row(
                "SELECT 1 FROM stat_cache WHERE scope = ?1 LIMIT 1",
                [&self.scope],
                |_| Ok(()),
            )
            .optional()?
            .is_none())
    }

    /// Records new entries (`None` removes), in one transaction; the version covered is
    /// forgotten (see [`StatCache::update_after`]).
    pub fn update(&mut self, changes: Vec<(Vec<u8>, Option<StatEntry>)>) -> Result<()> {
        self.update_after(changes, None)
    }

    /// The version the tree holds: the one its last capture, restore or sync left it at (the
    /// branch's head, unless others moved it since). `None` before the first is recorded.
    pub fn holds(&self) -> Result<Option<String>> {
        use rusqlite::OptionalExtension;
        Ok(self
            .conn
            .query_row(
                "SELECT version FROM tree_holds WHERE scope = ?1",
                [&self.scope],
                |r| r.get(0),
            )
            .optional()?)
    }

    /// Records that the tree holds `to`, if the record still says `from` (another tracker of
    /// the same tree may have moved it meanwhile).
    pub fn move_holds(&self, from: &str, to: &str) -> Result<()> {
        if from != to {
            self.conn.execute(
                "UPDATE tree_holds SET version = ?3 WHERE scope = ?1 AND version = ?2",
                params![self.scope, from, to],
            )?;
        }
        Ok(())
    }

    /// Records that the tree holds `version`.
    pub fn set_holds(&self, version: &str) -> Result<()> {
        self.conn.execute(
            "INSERT OR REPLACE INTO tree_holds(scope, version) VALUES (?1, ?2)",
            params![self.scope, version],
        )?;
        Ok(())
    }

    /// Records new entries (`None` removes), in one transaction. `moved`: the entries are those
    /// of every key an operation from the first version to the second changed (or the two are
    /// one version, nothing recorded), so a cache that covered the first covers the second;
    /// `None` forgets the version covered.
    pub fn update_after(
        &mut self,
        changes: Vec<(Vec<u8>, Option<StatEntry>)>,
        moved: Option<(&str, &str)>,
    ) -> Result<()> {
        // Nothing written: what was covered still is (the entries are the same).
        if changes.is_empty() && moved.is_none_or(|(from, to)| from == to) {
            return Ok(());
        }
        let tx = self.conn.transaction()?;
        {
            let mut put = tx.prepare_cached(
                "INSERT OR REPLACE INTO stat_cache(scope, path, size, mtime_ns, ctime_ns, ino, mode, links) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
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
                        e.mode as i64,
                        e.links as i64
                    ])?,
                    None => del.execute(params![self.scope, path])?,
                };
            }
        }
        let stored = stored_covers(&tx, &self.scope)?;
        let next = |covered: Option<&str>| match moved {
            Some((from, to)) if covered == Some(from) => Some(to.to_owned()),
            _ => None,
        };
        store_covers(&tx, &self.scope, next(stored.as_deref()).as_deref())?;
        tx.commit()?;
        let loaded = next(self.loaded_covers.borrow().as_deref());
        *self.loaded_covers.borrow_mut() = loaded;
        if let Some(entries) = self.entries.get_mut() {
            for (path, entry) in changes {
                match entry {
                    Some(e) => entries.insert(path, e),
                    None => entries.remove(&path),
                };
            }
        }
        Ok(())
    }

    /// Records that a restore has started (cleared when it finishes): an interrupted restore
    /// is finished from this record when the tree is opened again.
    pub fn begin_restore(&self, intent: &RestoreIntent, now_ms: i64) -> Result<()> {
        self.conn.execute(
            "INSERT OR REPLACE INTO restore_intent(scope, target, started_ms, from_version, actor, intent)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                self.scope,
                intent.target,
                now_ms,
                intent.from,
                intent.actor,
                intent.intent
            ],
        )?;
        Ok(())
    }

    /// Clears the restore intent.
    pub fn end_restore(&self) -> Result<()> {
        self.conn
            .execute("DELETE FROM restore_intent WHERE scope = ?1", [&self.scope])?;
        Ok(())
    }

    /// The record of a restore that started and never finished.
    pub fn interrupted_restore(&self) -> Result<Option<RestoreIntent>> {
        use rusqlite::OptionalExtension;
        Ok(self
            .conn
            .query_row(
                "SELECT target, from_version, actor, intent FROM restore_intent WHERE scope = ?1",
                [&self.scope],
                |r| {
                    Ok(RestoreIntent {
                        target: r.get(0)?,
                        from: r.get(1)?,
                        actor: r.get(2)?,
                        intent: r.get(3)?,
                    })
                },
            )
            .optional()?)
    }
}

/// The version the stored entries cover, if one is recorded.
fn stored_covers(conn: &Connection, scope: &str) -> Result<Option<String>> {
    use rusqlite::OptionalExtension;
    Ok(conn
        .query_row(
            "SELECT version FROM stat_cache_covers WHERE scope = ?1",
            [scope],
            |r| r.get(0),
        )
        .optional()?)
}

/// Records the version the stored entries cover (`None`: none is known).
fn store_covers(conn: &Connection, scope: &str, version: Option<&str>) -> Result<()> {
    match version {
        Some(v) => conn.execute(
            "INSERT OR REPLACE INTO stat_cache_covers(scope, version) VALUES (?1, ?2)",
            params![scope, v],
        )?,
        None => conn.execute("DELETE FROM stat_cache_covers WHERE scope = ?1", [scope])?,
    };
    Ok(())
}

/// Adds `column` to `table` unless it is there (a cache made by an earlier version).
fn add_column(conn: &Connection, table: &str, column: &str, decl: &str) -> Result<()> {
    let known: bool = conn.query_row(
        &format!("SELECT count(*) > 0 FROM pragma_table_info('{table}') WHERE name = ?1"),
        [column],
        |r| r.get(0),
    )?;
    if !known {
        conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))?;
    }
    Ok(())
}

/// The entry in a row's columns `size, mtime_ns, ctime_ns, ino, mode, links` from `first` on.
fn entry_at(r: &rusqlite::Row<'_>, first: usize) -> rusqlite::Result<StatEntry> {
    Ok(StatEntry {
        size: r.get::<_, i64>(first)? as u64,
        mtime_ns: r.get(first + 1)?,
        ctime_ns: r.get(first + 2)?,
        ino: r.get::<_, i64>(first + 3)? as u64,
        mode: r.get::<_, i64>(first + 4)? as u32,
        links: r.get::<_, i64>(first + 5)? as u64,
    })
}

/// What a restore that started meant to do, recorded before its first write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreIntent {
    /// The version the tree is being brought to.
    pub target: String,
    /// The version the tree held when it began, for a sync (which records no operation).
    pub from: Option<String>,
    /// Who restores, for a restore that records a rollback operation once the tree is written.
    pub actor: Option<String>,
    /// The rollback operation's intent.
    pub intent: Option<String>,
}
