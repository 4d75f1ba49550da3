//! The SQLite store: rules, relations, delegations, approvals, quota counters and token use
//! counts. Checks read the in-memory policy; the store is written on each change (in the same
//! critical section, before memory changes), read at open, and read again whenever another
//! process has committed to it since (see `Policy::refresh`).
//!
//! Writes are rare and small, so one connection behind the policy's lock serves as the single
//! writer; WAL keeps readers of the file (tools, backups) unblocked.

use std::path::Path;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::approval::Approval;
use crate::delegation::Delegation;
use crate::error::{PolicyError, Result};

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

pub(crate) struct Store {
    conn: Connection,
}

/// Everything read back at open.
pub(crate) struct Loaded {
    pub version: u64,
    pub rules: Option<String>,
    pub relations: Vec<(String, String)>,
    pub delegations: Vec<Delegation>,
    pub approvals: Vec<Approval>,
    pub quotas: Vec<(String, String, i64, u32)>,
    pub token_uses: Vec<(String, u32)>,
    pub token_key: [u8; 32],
}

impl Store {
    pub(crate) fn open(path: &Path) -> Result<Store> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        Store::init(conn)
    }

    pub(crate) fn in_memory() -> Result<Store> {
        Store::init(Connection::open_in_memory()?)
    }

    fn init(conn: Connection) -> Result<Store> {
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        conn.execute_batch(SCHEMA)?;
        Ok(Store { conn })
    }

    /// A number that changes whenever another connection (another process) commits to the
    /// store: memory is brought up to date when it moved.
    pub(crate) fn data_version(&self) -> Result<i64> {
        Ok(self
            .conn
            .prepare_cached("PRAGMA data_version")?
            .query_row([], |r| r.get(0))?)
    }

    fn meta(&self, key: &str) -> Result<Option<Vec<u8>>> {
        Ok(self
            .conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()?)
    }

    pub(crate) fn load(&mut self) -> Result<Loaded> {
        let version = match self.meta("version")? {
            Some(v) => String::from_utf8(v)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| PolicyError::Corrupt("version".into()))?,
            None => 0,
        };
        let rules = match self.meta("rules")? {
            Some(v) => {
                Some(String::from_utf8(v).map_err(|_| PolicyError::Corrupt("rules".into()))?)
            }
            None => None,
        };
        let token_key = match self.meta("token_key")? {
            Some(v) => <[u8; 32]>::try_from(v.as_slice())
                .map_err(|_| PolicyError::Corrupt("token key".into()))?,
            None => {
                let key: [u8; 32] = rand::random();
                self.conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('token_key', ?1)",
                    [&key[..]],
                )?;
                key
            }
        };
        let mut stmt = self.conn.prepare("SELECT member, grp FROM relations")?;
        let relations = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let delegations = self
            .bodies("SELECT body FROM delegations ORDER BY rowid")?
            .iter()
            .map(|b| {
                serde_json::from_str(b)
                    .map_err(|e| PolicyError::Corrupt(format!("delegation: {e}")))
            })
            .collect::<Result<Vec<Delegation>>>()?;
        let approvals = self
            .bodies("SELECT body FROM approvals ORDER BY rowid")?
            .iter()
            .map(|b| {
                serde_json::from_str(b).map_err(|e| PolicyError::Corrupt(format!("approval: {e}")))
            })
            .collect::<Result<Vec<Approval>>>()?;
        let mut stmt = self
            .conn
            .prepare("SELECT rule, actor, window, used FROM quotas")?;
        let quotas = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        let mut stmt = self.conn.prepare("SELECT tag, used FROM token_uses")?;
        let token_uses = stmt
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(Loaded {
            version,
            rules,
            relations,
            delegations,
            approvals,
            quotas,
            token_uses,
            token_key,
        })
    }

    fn bodies(&self, sql: &str) -> Result<Vec<String>> {
        let mut stmt = self.conn.prepare(sql)?;
        let rows = stmt
            .query_map([], |r| r.get(0))?
            .collect::<rusqlite::Result<Vec<String>>>()?;
        Ok(rows)
    }

    /// Runs one change and the version bump in one transaction.
    fn change(
        &mut self,
        version: u64,
        f: impl FnOnce(&rusqlite::Transaction<'_>) -> rusqlite::Result<()>,
    ) -> Result<()> {
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)?;
        f(&tx)?;
        tx.execute(
            "INSERT INTO meta (key, value) VALUES ('version', ?1)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            [version.to_string().into_bytes()],
        )?;
        tx.commit()?;
        Ok(())
    }

    pub(crate) fn save_rules(&mut self, version: u64, text: &str) -> Result<()> {
        self.change(version, |tx| {
            tx.execute(
                "INSERT INTO meta (key, value) VALUES ('rules', ?1)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [text.as_bytes()],
            )
            .map(drop)
        })
    }

    pub(crate) fn add_relation(&mut self, version: u64, member: &str, group: &str) -> Result<()> {
        self.change(version, |tx| {
            tx.execute(
                "INSERT OR IGNORE INTO relations (member, grp) VALUES (?1, ?2)",
                params![member, group],
            )
            .map(drop)
        })
    }

    pub(crate) fn add_relations(&mut self, version: u64, pairs: &[(&str, &str)]) -> Result<()> {
        self.change(version, |tx| {
            let mut stmt =
                tx.prepare("INSERT OR IGNORE INTO relations (member, grp) VALUES (?1, ?2)")?;
            for (m, g) in pairs {
                stmt.execute(params![m, g])?;
            }
            Ok(())
        })
    }

    pub(crate) fn remove_relation(
        &mut self,
        version: u64,
        member: &str,
        group: &str,
    ) -> Result<()> {
        self.change(version, |tx| {
            tx.execute(
                "DELETE FROM relations WHERE member = ?1 AND grp = ?2",
                params![member, group],
            )
            .map(drop)
        })
    }

    pub(crate) fn put_delegation(&mut self, version: u64, d: &Delegation) -> Result<()> {
        let body = serde_json::to_string(d).map_err(|e| PolicyError::Corrupt(e.to_string()))?;
        self.change(version, |tx| {
            tx.execute(
                "INSERT INTO delegations (id, body) VALUES (?1, ?2)",
                params![d.id, body],
            )
            .map(drop)
        })
    }

    pub(crate) fn delete_delegation(&mut self, version: u64, id: &str) -> Result<()> {
        self.change(version, |tx| {
            tx.execute("DELETE FROM delegations WHERE id = ?1", [id])
                .map(drop)
        })
    }

    pub(crate) fn put_approval(&mut self, a: &Approval) -> Result<()> {
        let body = serde_json::to_string(a).map_err(|e| PolicyError::Corrupt(e.to_string()))?;
        self.conn.execute(
            "INSERT INTO approvals (id, body) VALUES (?1, ?2)
             ON CONFLICT (id) DO UPDATE SET body = excluded.body",
            params![a.id, body],
        )?;
        Ok(())
    }

    pub(crate) fn put_quota(
        &mut self,
        rule: &str,
        actor: &str,
        window: i64,
        used: u32,
    ) -> Result<()> {
        self.conn.execute(
            "INSERT INTO quotas (rule, actor, window, used) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (rule, actor) DO UPDATE SET window = excluded.window, used = excluded.used",
            params![rule, actor, window, used],
        )?;
        Ok(())
    }

    pub(crate) fn put_token_use(&mut self, tag: &str, used: u32) -> Result<()> {
        self.conn.execute(
            "INSERT INTO token_uses (tag, used) VALUES (?1, ?2)
             ON CONFLICT (tag) DO UPDATE SET used = excluded.used",
            params![tag, used],
        )?;
        Ok(())
    }

    /// Records the uses of one spend in one transaction: every counter or none.
    pub(crate) fn spend(
        &mut self,
        quotas: &[crate::spend::QuotaCount],
        approvals: &[Approval],
        tokens: &[(String, u32)],
    ) -> Result<()> {
        self.conn.execute_batch("SAVEPOINT spend")?;
        let written = (|| {
            for ((rule, actor), (window, used)) in quotas {
                self.put_quota(rule, actor, *window, *used)?;
            }
            for a in approvals {
                self.put_approval(a)?;
            }
            for (tag, used) in tokens {
                self.put_token_use(tag, *used)?;
            }
            Ok(())
        })();
        match written {
            Ok(()) => Ok(self.conn.execute_batch("RELEASE spend")?),
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK TO spend; RELEASE spend");
                Err(e)
            }
        }
    }
}
