//! Tables (all prefixed `bus_`, so the bus can live in the environment's own database) and
//! connection settings.

use std::time::Duration;

use rusqlite::Connection;

use crate::bus::DeliveryStatus;
use crate::error::{BusError, Result, SqlContext};

/// Delivery states, stored as small integers (numbered by [`DeliveryStatus::code`]).
pub(crate) const READY: i64 = DeliveryStatus::Ready.code() as i64;
pub(crate) const LEASED: i64 = DeliveryStatus::Leased.code() as i64;
/// Behind an earlier live message with the same ordering key.
pub(crate) const WAITING: i64 = DeliveryStatus::Waiting.code() as i64;
pub(crate) const ACKED: i64 = DeliveryStatus::Acked.code() as i64;
pub(crate) const DEAD: i64 = DeliveryStatus::Dead.code() as i64;

pub(crate) const CAUSE_MAX_ATTEMPTS: i64 = 1;
pub(crate) const CAUSE_TERMINATED: i64 = 2;

/// One delivery row per (message, subscribed group): groups progress independently.
/// `due` is the moment the row becomes claimable — the publish delay or backoff for a ready row,
/// `lease_until + 1` for a leased one — and NULL for rows nobody may claim (waiting, acked,
/// dead), so a claim is one range scan of a small partial index.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS bus_topics(
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE IF NOT EXISTS bus_groups(
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    max_attempts INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS bus_subscriptions(
    topic_id INTEGER NOT NULL,
    group_id INTEGER NOT NULL,
    PRIMARY KEY(topic_id, group_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS bus_messages(
    id INTEGER PRIMARY KEY,
    topic_id INTEGER NOT NULL,
    payload BLOB NOT NULL,
    okey TEXT,
    dedup_id TEXT,
    actor TEXT,
    correlation_id TEXT,
    causing_op TEXT,
    published_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS bus_deliveries(
    id INTEGER PRIMARY KEY,
    msg_id INTEGER NOT NULL,
    group_id INTEGER NOT NULL,
    okey TEXT,
    state INTEGER NOT NULL,
    due INTEGER,
    visible_at INTEGER NOT NULL,
    lease_until INTEGER,
    token INTEGER,
    consumer TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    dead_cause INTEGER,
    finished_at INTEGER
);
CREATE INDEX IF NOT EXISTS bus_deliveries_due ON bus_deliveries(group_id, due)
    WHERE due IS NOT NULL;
CREATE INDEX IF NOT EXISTS bus_deliveries_key ON bus_deliveries(group_id, okey)
    WHERE okey IS NOT NULL AND state < 3;
CREATE INDEX IF NOT EXISTS bus_deliveries_msg ON bus_deliveries(msg_id);
DROP INDEX IF EXISTS bus_deliveries_acked;
CREATE INDEX IF NOT EXISTS bus_deliveries_dead ON bus_deliveries(group_id)
    WHERE state = 4;
CREATE TABLE IF NOT EXISTS bus_dedup(
    topic_id INTEGER NOT NULL,
    dedup_id TEXT NOT NULL,
    msg_id INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY(topic_id, dedup_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS bus_dedup_expiry ON bus_dedup(expires_at);
CREATE TABLE IF NOT EXISTS bus_meta(
    key TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO bus_meta(key, value) VALUES ('schema_version', 1);
";

/// The layout this code reads and writes. The bus keeps its own version row (not
/// `PRAGMA user_version`) because the file may belong to the environment.
const SCHEMA_VERSION: i64 = 1;

/// Creates the bus's tables in `conn` if they are missing, and drops the index of acked
/// deliveries that earlier versions kept (the purge finds them by its sweep now).
/// [`Bus::open`](crate::Bus::open) calls it; call it yourself only to prepare a database before
/// any bus opens it.
pub fn install(conn: &Connection) -> Result<()> {
    conn.execute_batch(SCHEMA).ctx("creating the bus tables")?;
    let version: i64 = conn
        .query_row(
            "SELECT value FROM bus_meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .ctx("reading the bus schema version")?;
    if version != SCHEMA_VERSION {
        return Err(BusError::Corrupt {
            detail: format!(
                "bus schema version {version}; this build reads version {SCHEMA_VERSION}"
            ),
        });
    }
    Ok(())
}

/// WAL so readers never block the writer; NORMAL because WAL with NORMAL loses no committed
/// transaction on a process crash (only, possibly, the last ones on power loss).
pub(crate) fn configure(conn: &Connection, busy: Duration) -> Result<()> {
    conn.busy_timeout(busy).ctx("setting busy_timeout")?;
    conn.pragma_update(None, "journal_mode", "WAL")
        .ctx("enabling WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")
        .ctx("setting synchronous=NORMAL")?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(())
}
