//! Versioned migrations: each store names its component and lists its steps in order; a step
//! runs once per database, in one transaction with its record, under a lock that makes two
//! machines opening a new database at once take turns.

use postgres::Client;

use crate::error::{PgContext, PgError, Result};

/// One step of a component's schema.
#[derive(Clone, Copy, Debug)]
pub struct Migration {
    /// Its place in the component's order, from 1.
    pub version: i32,
    /// What it does, recorded with it.
    pub name: &'static str,
    /// The statements.
    pub sql: &'static str,
}

/// Every transaction that migrates takes this advisory lock first ("envmigr" in ASCII).
const LOCK: i64 = 0x0065_6e76_6d69_6772;

/// Brings `component`'s schema to the last of `steps`, applying those the database lacks, in
/// order; returns how many it applied. A database migrated by a newer build (a version this
/// build does not list) is refused, and nothing is applied.
pub fn migrate(client: &mut Client, component: &str, steps: &[Migration]) -> Result<usize> {
    let mut tx = client.transaction().ctx("starting a migration")?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK])
        .ctx("locking the migrations")?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS environment_migrations(
            component TEXT NOT NULL,
            version INT NOT NULL,
            name TEXT NOT NULL,
            applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
            PRIMARY KEY(component, version)
        )",
    )
    .ctx("creating the migrations table")?;
    let have: Option<i32> = tx
        .query_one(
            "SELECT MAX(version) FROM environment_migrations WHERE component = $1",
            &[&component],
        )
        .ctx("reading the schema version")?
        .get(0);
    let have = have.unwrap_or(0);
    let known = steps.last().map_or(0, |m| m.version);
    if have > known {
        return Err(PgError::Schema(format!(
            "{component} is at version {have}; this build knows versions up to {known}"
        )));
    }
    let mut applied = 0;
    for step in steps.iter().filter(|m| m.version > have) {
        tx.batch_execute(step.sql).ctx("applying a migration")?;
        tx.execute(
            "INSERT INTO environment_migrations(component, version, name) VALUES ($1, $2, $3)",
            &[&component, &step.version, &step.name],
        )
        .ctx("recording a migration")?;
        applied += 1;
    }
    tx.commit().ctx("committing a migration")?;
    Ok(applied)
}
