//! [`SqlitePolicyStore`]: the policy's storage port in a SQLite file beside one environment.
//!
//! Every write is one `BEGIN IMMEDIATE` transaction that first reads what the write was made
//! on (the version, the counters, the approval's record) and writes nothing when it moved: the
//! file's write lock makes the read and the write one step for every process on the file.
//! The generation is SQLite's `data_version`, which moves whenever another connection commits.
//! WAL keeps readers of the file (tools, backups) unblocked.

use std::path::Path;

use environment_core::policy_store::{
    PolicyChange, PolicyRecord, PolicyRecords, PolicyStore, QuotaCount, Uses, Written,
};
use environment_core::{ErrorKind, PortError};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS relations (member TEXT NOT NULL, grp TEXT NOT NULL,
    PRIMARY KEY (member, grp)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS delegations (id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS approvals (id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS quotas (rule TEXT NOT NULL, actor TEXT NOT NULL,
    window INTEGER NOT NULL, used INTEGER NOT NULL, PRIMARY KEY (rule, actor)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS token_uses (tag TEXT PRIMARY KEY, used INTEGER NOT NULL) WITHOUT ROWID;
";

/// A policy store in a SQLite file (or in memory).
///
/// ```
/// use environment_core::PolicyStore;
/// use environment_policy::SqlitePolicyStore;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = tempfile::tempdir()?;
/// let mut store = SqlitePolicyStore::open(&dir.path().join("policy.db"))?;
/// let (_generation, records) = store.load()?;
/// assert_eq!(records.version, 0);
/// # Ok(()) }
/// ```
pub struct SqlitePolicyStore {
    conn: Connection,
}

/// The store's failures as the port reports them.
fn failed(e: rusqlite::Error) -> PortError {
    PortError::new(
        ErrorKind::Internal,
        format!("policy store: {e}"),
        "check the policy file's disk and permissions, then retry.",
    )
}

fn corrupt(what: &str) -> PortError {
    PortError::new(
        ErrorKind::Corrupt,
        format!("policy store is corrupt: {what}"),
        "restore the policy file from a backup.",
    )
}

type Tx<'a> = rusqlite::Transaction<'a>;

impl SqlitePolicyStore {
    /// Opens (or creates) the store in the file at `path`.
    pub fn open(path: &Path) -> Result<SqlitePolicyStore, PortError> {
        let conn = Connection::open(path).map_err(failed)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(failed)?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(failed)?;
        SqlitePolicyStore::init(conn)
    }

    /// A store in memory, for tests and throwaway environments.
    pub fn in_memory() -> Result<SqlitePolicyStore, PortError> {
        SqlitePolicyStore::init(Connection::open_in_memory().map_err(failed)?)
    }

    fn init(conn: Connection) -> Result<SqlitePolicyStore, PortError> {
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(failed)?;
        conn.execute_batch(SCHEMA).map_err(failed)?;
        Ok(SqlitePolicyStore { conn })
    }

    /// Runs `f` in one immediate transaction, committed when it writes (`Some`) and rolled
    /// back when what it was made on moved (`None`).
    fn write(
        &mut self,
        f: impl FnOnce(&Tx<'_>) -> Result<Option<()>, PortError>,
    ) -> Result<Written, PortError> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(failed)?;
        // Nobody else can commit until this does, and this connection's own commit does not
        // move it: the generation before and after the write.
        let generation = data_version(&tx)?;
        match f(&tx)? {
            Some(()) => {
                tx.commit().map_err(failed)?;
                Ok(Written::Done {
                    before: generation,
                    after: generation,
                })
            }
            None => Ok(Written::Stale),
        }
    }
}

fn data_version(conn: &Connection) -> Result<i64, PortError> {
    conn.prepare_cached("PRAGMA data_version")
        .and_then(|mut s| s.query_row([], |r| r.get(0)))
        .map_err(failed)
}

fn meta(conn: &Connection, key: &str) -> Result<Option<Vec<u8>>, PortError> {
    conn.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .optional()
        .map_err(failed)
}

fn version(conn: &Connection) -> Result<u64, PortError> {
    match meta(conn, "version")? {
        Some(v) => String::from_utf8(v)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| corrupt("version")),
        None => Ok(0),
    }
}

fn records(conn: &Connection, sql: &str) -> Result<Vec<PolicyRecord>, PortError> {
    let mut stmt = conn.prepare(sql).map_err(failed)?;
    let rows = stmt
        .query_map([], |r| {
            Ok(PolicyRecord {
                id: r.get(0)?,
                body: r.get(1)?,
            })
        })
        .map_err(failed)?;
    rows.collect::<rusqlite::Result<_>>().map_err(failed)
}

/// The token key, made by the first handle that finds none (another may make it at the same
/// time: the first one written is everyone's).
fn token_key(conn: &Connection) -> Result<[u8; 32], PortError> {
    if meta(conn, "token_key")?.is_none() {
        let key: [u8; 32] = rand::random();
        conn.execute(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('token_key', ?1)",
            [&key[..]],
        )
        .map_err(failed)?;
    }
    let key = meta(conn, "token_key")?.ok_or_else(|| corrupt("token key"))?;
    <[u8; 32]>::try_from(key.as_slice()).map_err(|_| corrupt("token key"))
}

fn apply(tx: &Tx<'_>, change: &PolicyChange) -> rusqlite::Result<()> {
    match change {
        PolicyChange::Rules(text) => tx
            .execute(
                "INSERT INTO meta (key, value) VALUES ('rules', ?1)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [text.as_bytes()],
            )
            .map(drop),
        PolicyChange::AddRelations(pairs) => {
            let mut stmt =
                tx.prepare("INSERT OR IGNORE INTO relations (member, grp) VALUES (?1, ?2)")?;
            for (m, g) in pairs {
                stmt.execute(params![m, g])?;
            }
            Ok(())
        }
        PolicyChange::RemoveRelation(member, group) => tx
            .execute(
                "DELETE FROM relations WHERE member = ?1 AND grp = ?2",
                params![member, group],
            )
            .map(drop),
        PolicyChange::PutDelegation(d) => tx
            .execute(
                "INSERT INTO delegations (id, body) VALUES (?1, ?2)",
                params![d.id, d.body],
            )
            .map(drop),
        PolicyChange::DeleteDelegation(id) => tx
            .execute("DELETE FROM delegations WHERE id = ?1", [id])
            .map(drop),
    }
}

/// Whether every counter of `uses` still holds what it was read as.
fn unmoved(tx: &Tx<'_>, uses: &Uses) -> Result<bool, PortError> {
    for (before, after) in &uses.quotas {
        let now: Option<(i64, u32)> = tx
            .prepare_cached("SELECT window, used FROM quotas WHERE rule = ?1 AND actor = ?2")
            .and_then(|mut s| {
                s.query_row(params![after.rule, after.actor], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()
            })
            .map_err(failed)?;
        if now != before.as_ref().map(|b| (b.window, b.used)) {
            return Ok(false);
        }
    }
    for (before, after) in &uses.approvals {
        let now: Option<String> = tx
            .prepare_cached("SELECT body FROM approvals WHERE id = ?1")
            .and_then(|mut s| s.query_row([&after.id], |r| r.get(0)).optional())
            .map_err(failed)?;
        if now.as_deref() != Some(before.as_str()) {
            return Ok(false);
        }
    }
    for (tag, before, _) in &uses.tokens {
        let now: Option<u32> = tx
            .prepare_cached("SELECT used FROM token_uses WHERE tag = ?1")
            .and_then(|mut s| s.query_row([tag], |r| r.get(0)).optional())
            .map_err(failed)?;
        if now.unwrap_or(0) != *before {
            return Ok(false);
        }
    }
    Ok(true)
}

fn count(tx: &Tx<'_>, uses: &Uses) -> rusqlite::Result<()> {
    for (_, q) in &uses.quotas {
        tx.prepare_cached(
            "INSERT INTO quotas (rule, actor, window, used) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (rule, actor) DO UPDATE SET window = excluded.window, used = excluded.used",
        )?
        .execute(params![q.rule, q.actor, q.window, q.used])?;
    }
    for (_, a) in &uses.approvals {
        tx.prepare_cached("UPDATE approvals SET body = ?2 WHERE id = ?1")?
            .execute(params![a.id, a.body])?;
    }
    for (tag, _, used) in &uses.tokens {
        tx.prepare_cached(
            "INSERT INTO token_uses (tag, used) VALUES (?1, ?2)
             ON CONFLICT (tag) DO UPDATE SET used = excluded.used",
        )?
        .execute(params![tag, used])?;
    }
    Ok(())
}

impl PolicyStore for SqlitePolicyStore {
    fn generation(&mut self) -> Result<i64, PortError> {
        data_version(&self.conn)
    }

    fn load(&mut self) -> Result<(i64, PolicyRecords), PortError> {
        // Made outside the snapshot: a write of its own.
        let token_key = token_key(&self.conn)?;
        let tx = self.conn.transaction().map_err(failed)?;
        let generation = data_version(&tx)?;
        let rules = match meta(&tx, "rules")? {
            Some(v) => Some(String::from_utf8(v).map_err(|_| corrupt("rules"))?),
            None => None,
        };
        let relations = tx
            .prepare("SELECT member, grp FROM relations")
            .and_then(|mut s| {
                s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(failed)?;
        let quotas = tx
            .prepare("SELECT rule, actor, window, used FROM quotas")
            .and_then(|mut s| {
                s.query_map([], |r| {
                    Ok(QuotaCount {
                        rule: r.get(0)?,
                        actor: r.get(1)?,
                        window: r.get(2)?,
                        used: r.get(3)?,
                    })
                })?
                .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(failed)?;
        let token_uses = tx
            .prepare("SELECT tag, used FROM token_uses")
            .and_then(|mut s| {
                s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<rusqlite::Result<Vec<_>>>()
            })
            .map_err(failed)?;
        let loaded = PolicyRecords {
            version: version(&tx)?,
            rules,
            relations,
            delegations: records(&tx, "SELECT id, body FROM delegations ORDER BY rowid")?,
            approvals: records(&tx, "SELECT id, body FROM approvals ORDER BY rowid")?,
            quotas,
            token_uses,
            token_key,
        };
        tx.commit().map_err(failed)?;
        Ok((generation, loaded))
    }

    fn change(&mut self, expected: u64, change: &PolicyChange) -> Result<Written, PortError> {
        self.write(|tx| {
            if version(tx)? != expected {
                return Ok(None);
            }
            apply(tx, change).map_err(failed)?;
            tx.execute(
                "INSERT INTO meta (key, value) VALUES ('version', ?1)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [(expected + 1).to_string().into_bytes()],
            )
            .map_err(failed)?;
            Ok(Some(()))
        })
    }

    fn put_approval(
        &mut self,
        before: Option<&str>,
        record: &PolicyRecord,
    ) -> Result<Written, PortError> {
        self.write(|tx| {
            let changed = match before {
                None => tx.execute(
                    "INSERT OR IGNORE INTO approvals (id, body) VALUES (?1, ?2)",
                    params![record.id, record.body],
                ),
                Some(before) => tx.execute(
                    "UPDATE approvals SET body = ?2 WHERE id = ?1 AND body = ?3",
                    params![record.id, record.body, before],
                ),
            }
            .map_err(failed)?;
            Ok((changed == 1).then_some(()))
        })
    }

    fn spend(&mut self, uses: &Uses) -> Result<Written, PortError> {
        self.write(|tx| {
            if !unmoved(tx, uses)? {
                return Ok(None);
            }
            count(tx, uses).map_err(failed)?;
            Ok(Some(()))
        })
    }
}
