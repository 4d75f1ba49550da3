//! The effect log in the environment's own database, written through its writer.
//!
//! A `begin` is committed with `synchronous=FULL`: once it returns `Begun::Recorded`, the
//! record survives power loss as well as a crash, so no retry can perform the effect again.

use std::sync::Arc;

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::db::{ReadPool, Writer};
use crate::effect::{Begun, EffectChange, EffectRecord, EffectState, EffectStore, NewEffect};
use crate::error::{EnvError, PortError, Result};

fn record_from(row: &Row<'_>) -> rusqlite::Result<(EffectRecord, String)> {
    Ok((
        EffectRecord {
            id: row.get::<_, i64>(0)? as u64,
            key: row.get(1)?,
            target: row.get(2)?,
            request: row.get(3)?,
            state: EffectState::Failed,
            result: row.get(5)?,
            note: row.get(6)?,
            attempts: row.get::<_, i64>(7)? as u32,
            actor: row.get(8)?,
            created_ms: row.get(9)?,
            updated_ms: row.get(10)?,
        },
        row.get(4)?,
    ))
}

const COLUMNS: &str =
    "id, key, target, request, state, result, note, attempts, actor, created_ms, updated_ms";

fn query_one(
    conn: &Connection,
    where_: &str,
    p: impl rusqlite::Params,
) -> Result<Option<EffectRecord>> {
    let sql = format!("SELECT {COLUMNS} FROM effects WHERE {where_}");
    let found = conn
        .prepare_cached(&sql)?
        .query_row(p, record_from)
        .optional()?;
    found
        .map(|(mut r, state)| {
            r.state = EffectState::parse(&state)?;
            Ok(r)
        })
        .transpose()
}

/// The effect log in the environment's own database, written through its writer.
pub(crate) struct EmbeddedEffects {
    pub writer: Arc<Writer>,
    pub readers: Arc<ReadPool>,
}

/// An embedded store's failure as the port reports it.
fn port(e: EnvError) -> PortError {
    PortError::new(
        e.kind(),
        e.to_string(),
        "check the environment's disk; the effect log is in its database.",
    )
}

impl EffectStore for EmbeddedEffects {
    fn begin(&self, new: &NewEffect<'_>) -> std::result::Result<Begun, PortError> {
        let (key, target, request) = (
            new.key.to_owned(),
            new.target.to_owned(),
            new.request.to_vec(),
        );
        let (hash, actor, now) = (new.request_hash, new.actor.to_owned(), new.now);
        self.writer
            .run(true, move |conn, _| {
                if let Some(record) = query_one(conn, "key = ?1", [&key])? {
                    let stored: Vec<u8> = conn.query_row(
                        "SELECT request_hash FROM effects WHERE id = ?1",
                        [record.id as i64],
                        |r| r.get(0),
                    )?;
                    return Ok(Begun::Found {
                        record,
                        same_request: stored == hash.0,
                    });
                }
                conn.prepare_cached(
                    "INSERT INTO effects(key, target, request, request_hash, state, attempts, actor, created_ms, updated_ms)
                     VALUES (?1, ?2, ?3, ?4, 'in_flight', 1, ?5, ?6, ?6)",
                )?
                .execute(params![key, target, request, &hash.0[..], actor, now])?;
                let record = query_one(conn, "key = ?1", [&key])?.ok_or_else(|| {
                    EnvError::Integrity {
                        at: format!("effect {key}"),
                        detail: "inserted effect not found".into(),
                    }
                })?;
                Ok(Begun::Recorded(record))
            })
            .map_err(port)
    }

    fn change(
        &self,
        change: &EffectChange<'_>,
    ) -> std::result::Result<Option<EffectRecord>, PortError> {
        let (id, from, to, now) = (change.id as i64, change.from, change.to, change.now);
        let (result, note) = (
            change.result.map(<[u8]>::to_vec),
            change.note.map(str::to_owned),
        );
        let attempt = i64::from(change.attempt);
        self.writer
            .run(true, move |conn, _| {
                let changed = conn
                    .prepare_cached(
                        "UPDATE effects SET state = ?1, result = COALESCE(?2, result),
                             note = COALESCE(?3, note), attempts = attempts + ?4, updated_ms = ?5
                         WHERE id = ?6 AND state = ?7",
                    )?
                    .execute(params![
                        to.as_str(),
                        result,
                        note,
                        attempt,
                        now,
                        id,
                        from.as_str()
                    ])?;
                if changed == 0 {
                    return Ok(None);
                }
                query_one(conn, "id = ?1", [id])
            })
            .map_err(port)
    }

    fn by_id(&self, id: u64) -> std::result::Result<Option<EffectRecord>, PortError> {
        self.readers
            .with(|conn| query_one(conn, "id = ?1", [id as i64]))
            .map_err(port)
    }

    fn by_key(&self, key: &str) -> std::result::Result<Option<EffectRecord>, PortError> {
        self.readers
            .with(|conn| query_one(conn, "key = ?1", [key]))
            .map_err(port)
    }

    fn list(&self, unfinished: bool) -> std::result::Result<Vec<EffectRecord>, PortError> {
        let where_ = if unfinished {
            "state IN ('in_flight', 'unknown')"
        } else {
            "1"
        };
        self.readers
            .with(|conn| {
                let sql = format!("SELECT {COLUMNS} FROM effects WHERE {where_} ORDER BY id");
                let mut stmt = conn.prepare_cached(&sql)?;
                let rows = stmt.query_map([], record_from)?;
                let mut out = Vec::new();
                for row in rows {
                    let (mut r, state) = row?;
                    r.state = EffectState::parse(&state)?;
                    out.push(r);
                }
                Ok(out)
            })
            .map_err(port)
    }
}
