//! [`PgEffectStore`]: core's effect log port on PostgreSQL, so that an effect begun on one
//! machine is found, not begun again, on every other: the idempotency key is unique in the
//! table, a begin is an insert that does nothing when the key is taken, and a change of state
//! is an update made only from the state it was decided on. Each is one statement, a
//! transaction of its own: a write whose session ends before its answer is reported, not
//! made again.

use std::sync::Mutex;

use environment_core::{
    Begun, EffectChange, EffectRecord, EffectState, EffectStore, NewEffect, PortError,
};
use postgres::Row;

use crate::connection::{PgStoreConfig, Session};
use crate::error::{PgError, Result};
use crate::migrate::Migration;

/// The component's name in `environment_migrations`.
const COMPONENT: &str = "effects";

/// The effect log's migrations, in order.
const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "the effect log",
    sql: "
CREATE TABLE effect_log(
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key TEXT NOT NULL UNIQUE,
    target TEXT NOT NULL,
    request BYTEA NOT NULL,
    request_hash BYTEA NOT NULL,
    state TEXT NOT NULL
        CHECK (state IN ('in_flight', 'done', 'failed', 'unknown', 'compensated')),
    result BYTEA,
    note TEXT,
    attempts BIGINT NOT NULL CHECK (attempts > 0),
    actor TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL
);
CREATE INDEX effect_log_open ON effect_log(id) WHERE state IN ('in_flight', 'unknown');
",
}];

/// An effect log in a PostgreSQL database, shared by every machine that opens it.
///
/// ```no_run
/// use std::sync::Arc;
/// use environment_core::{LocalEnvironment, Options};
/// use environment_postgres::{PgEffectStore, PgStoreConfig};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let effects = PgEffectStore::connect("host=/run/postgresql user=env dbname=env", PgStoreConfig::default())?;
/// let env = LocalEnvironment::open(
///     "/tmp/env",
///     Options { effects: Some(Arc::new(effects)), ..Options::default() },
/// )?;
/// # let _ = env;
/// # Ok(()) }
/// ```
pub struct PgEffectStore {
    session: Mutex<Session>,
}

impl std::fmt::Debug for PgEffectStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgEffectStore").finish_non_exhaustive()
    }
}

fn record(row: &Row) -> Result<EffectRecord> {
    let state: &str = row.get(4);
    let id: i64 = row.get(0);
    let attempts: i64 = row.get(7);
    let bad = |what: &str| PgError::Schema(format!("effect {id}: {what}"));
    Ok(EffectRecord {
        id: u64::try_from(id).map_err(|_| bad("a negative id"))?,
        key: row.get(1),
        target: row.get(2),
        request: row.get(3),
        state: EffectState::parse(state).map_err(|_| bad("an unknown state"))?,
        result: row.get(5),
        note: row.get(6),
        attempts: u32::try_from(attempts).map_err(|_| bad("an attempt count out of range"))?,
        actor: row.get(8),
        created_ms: row.get(9),
        updated_ms: row.get(10),
    })
}

fn id_of(id: u64) -> i64 {
    // Ids come from an identity column: one past its range names no effect.
    i64::try_from(id).unwrap_or(-1)
}

impl PgEffectStore {
    /// Connects with a libpq-style connection string (`host=… user=… dbname=…`, or a
    /// `postgresql://` URL) and brings the schema up to date.
    pub fn connect(params: &str, config: PgStoreConfig) -> Result<PgEffectStore> {
        let address = crate::ServerAddress::parse(params)?;
        PgEffectStore::open(address.config, config.reading(address.ca_file))
    }

    /// Opens the store on `server`, migrating its schema.
    pub fn open(server: postgres::Config, config: PgStoreConfig) -> Result<PgEffectStore> {
        let session = Session::open(server, &config, COMPONENT, MIGRATIONS)?;
        Ok(PgEffectStore {
            session: Mutex::new(session),
        })
    }

    fn call<T: Send>(
        &self,
        work: impl FnOnce(&mut Session) -> Result<T> + Send,
    ) -> std::result::Result<T, PortError> {
        let mut session = self
            .session
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        session.call(work).map_err(PortError::from)
    }

    fn one(&self, sql: &'static str, key: &(dyn postgres::types::ToSql + Sync)) -> Outcome {
        self.call(|s| s.read(sql, &[key])?.first().map(record).transpose())
    }
}

type Outcome = std::result::Result<Option<EffectRecord>, PortError>;

impl EffectStore for PgEffectStore {
    fn begin(&self, new: &NewEffect<'_>) -> std::result::Result<Begun, PortError> {
        let found = |row: &Row| -> Result<Begun> {
            let stored: &[u8] = row.get(11);
            Ok(Begun::Found {
                record: record(row)?,
                same_request: stored == new.request_hash.0,
            })
        };
        const FIND: &str = "SELECT id, key, target, request, state, result, note, attempts, \
             actor, created_ms, updated_ms, request_hash FROM effect_log WHERE key = $1";
        self.call(|s| {
            // A retry (the common case of a key seen before) is one read.
            if let Some(row) = s.read(FIND, &[&new.key])?.first() {
                return found(row);
            }
            let inserted = s.write(
                "INSERT INTO effect_log(key, target, request, request_hash, state, attempts,
                     actor, created_ms, updated_ms)
                 VALUES ($1, $2, $3, $4, 'in_flight', 1, $5, $6, $6)
                 ON CONFLICT (key) DO NOTHING
                 RETURNING id, key, target, request, state, result, note, attempts, actor,
                     created_ms, updated_ms",
                &[
                    &new.key,
                    &new.target,
                    &new.request,
                    &&new.request_hash.0[..],
                    &new.actor,
                    &new.now,
                ],
            )?;
            if let Some(row) = inserted.first() {
                return Ok(Begun::Recorded(record(row)?));
            }
            // Another machine recorded it between the two statements.
            let rows = s.read(FIND, &[&new.key])?;
            let row = rows
                .first()
                .ok_or_else(|| PgError::Schema(format!("effect {:?} vanished", new.key)))?;
            found(row)
        })
    }

    fn change(&self, change: &EffectChange<'_>) -> Outcome {
        self.call(|s| {
            let rows = s.write(
                "UPDATE effect_log SET state = $1, result = COALESCE($2, result),
                     note = COALESCE($3, note), attempts = attempts + $4, updated_ms = $5
                 WHERE id = $6 AND state = $7
                 RETURNING id, key, target, request, state, result, note, attempts, actor,
                     created_ms, updated_ms",
                &[
                    &change.to.as_str(),
                    &change.result,
                    &change.note,
                    &i64::from(change.attempt),
                    &change.now,
                    &id_of(change.id),
                    &change.from.as_str(),
                ],
            )?;
            rows.first().map(record).transpose()
        })
    }

    fn by_id(&self, id: u64) -> Outcome {
        self.one(
            "SELECT id, key, target, request, state, result, note, attempts, actor, created_ms,
                 updated_ms FROM effect_log WHERE id = $1",
            &id_of(id),
        )
    }

    fn by_key(&self, key: &str) -> Outcome {
        self.one(
            "SELECT id, key, target, request, state, result, note, attempts, actor, created_ms,
                 updated_ms FROM effect_log WHERE key = $1",
            &key,
        )
    }

    fn list(&self, unfinished: bool) -> std::result::Result<Vec<EffectRecord>, PortError> {
        let sql = if unfinished {
            "SELECT id, key, target, request, state, result, note, attempts, actor, created_ms,
                 updated_ms FROM effect_log WHERE state IN ('in_flight', 'unknown') ORDER BY id"
        } else {
            "SELECT id, key, target, request, state, result, note, attempts, actor, created_ms,
                 updated_ms FROM effect_log ORDER BY id"
        };
        self.call(|s| s.read(sql, &[])?.iter().map(record).collect())
    }
}
