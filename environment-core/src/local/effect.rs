//! The effect log: external side effects recorded before they happen, keyed for idempotency.
//!
//! `begin` is committed with `synchronous=FULL`: once it returns [`BeginOutcome::New`], the
//! record survives power loss as well as a crash, so no retry can perform the effect again.

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{Inner, LocalEnvironment};
use crate::authz::{Action, ActorId, Resource};
use crate::effect::{BeginOutcome, EffectRecord, EffectState};
use crate::error::{EnvError, Result};
use crate::hash::Hash;

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

/// The longest idempotency key or target accepted.
pub const MAX_EFFECT_KEY: usize = 512;

impl LocalEnvironment {
    /// Records that `actor` is about to perform an effect on `target`, unless the key was seen.
    /// Reusing a key with a different request is refused.
    pub fn effect_begin(
        &self,
        actor: &ActorId,
        key: &str,
        target: &str,
        request: &[u8],
    ) -> Result<BeginOutcome> {
        if key.is_empty() || key.len() > MAX_EFFECT_KEY || target.len() > MAX_EFFECT_KEY {
            return Err(EnvError::RequestTooLarge(format!(
                "idempotency keys and targets have 1 to {MAX_EFFECT_KEY} bytes"
            )));
        }
        if request.len() as u64 > self.inner.options.max_value_bytes {
            return Err(EnvError::RequestTooLarge(format!(
                "an effect request of {} bytes",
                request.len()
            )));
        }
        let permit = self.decide(
            actor,
            Action::Execute,
            Resource::Service(target.into()),
            None,
            Some("effect"),
        )?;
        let inner = self.inner.clone();
        let (actor, key, target, request) = (
            actor.clone(),
            key.to_owned(),
            target.to_owned(),
            request.to_vec(),
        );
        self.inner.writer.run(true, move |conn, _| {
            inner.spend(&permit.spend)?;
            inner.begin_in(conn, &actor, &key, &target, &request)
        })
    }

    /// Records an effect's result, as `actor`: authorized as the effect's beginning was
    /// (execute on its target), so only who may perform an effect on a target may say how it
    /// ended.
    pub fn effect_complete(&self, actor: &ActorId, id: u64, result: &[u8]) -> Result<EffectRecord> {
        self.effect_transition(actor, id, EffectState::Done, Some(result.to_vec()), None)
    }

    /// Records that an effect failed without taking effect (authorized as
    /// [`effect_complete`](LocalEnvironment::effect_complete)).
    pub fn effect_fail(&self, actor: &ActorId, id: u64, error: &str) -> Result<EffectRecord> {
        self.effect_transition(actor, id, EffectState::Failed, None, Some(error.to_owned()))
    }

    /// Records that an effect's outcome is unknown (it may have happened).
    pub fn effect_mark_unknown(
        &self,
        actor: &ActorId,
        id: u64,
        note: &str,
    ) -> Result<EffectRecord> {
        self.effect_transition(actor, id, EffectState::Unknown, None, Some(note.to_owned()))
    }

    /// Records that a done (or unknown) effect was undone by a compensating action.
    pub fn effect_compensate(&self, actor: &ActorId, id: u64, note: &str) -> Result<EffectRecord> {
        self.effect_transition(
            actor,
            id,
            EffectState::Compensated,
            None,
            Some(note.to_owned()),
        )
    }

    fn effect_transition(
        &self,
        actor: &ActorId,
        id: u64,
        to: EffectState,
        result: Option<Vec<u8>>,
        note: Option<String>,
    ) -> Result<EffectRecord> {
        // An effect's target never changes: the check can read it before the transaction.
        let target = self
            .inner
            .readers
            .with(|conn| query_one(conn, "id = ?1", [id as i64]))?
            .ok_or(EnvError::UnknownEffect(id))?
            .target;
        let permit = self.decide(
            actor,
            Action::Execute,
            Resource::Service(target),
            None,
            Some("effect"),
        )?;
        let inner = self.inner.clone();
        self.inner.writer.run(true, move |conn, _| {
            let rec = query_one(conn, "id = ?1", [id as i64])?.ok_or(EnvError::UnknownEffect(id))?;
            if !rec.state.may_become(to) {
                return Err(EnvError::InvalidEffectTransition {
                    id,
                    from: rec.state.as_str(),
                    to: to.as_str(),
                });
            }
            inner.spend(&permit.spend)?;
            let now = inner.options.clock.now_ms();
            conn.prepare_cached(
                "UPDATE effects SET state = ?1, result = COALESCE(?2, result), note = COALESCE(?3, note), updated_ms = ?4 WHERE id = ?5",
            )?
            .execute(params![to.as_str(), result, note, now, id as i64])?;
            query_one(conn, "id = ?1", [id as i64])?.ok_or(EnvError::UnknownEffect(id))
        })
    }

    /// The effect with this idempotency key.
    pub fn effect(&self, key: &str) -> Result<Option<EffectRecord>> {
        self.inner
            .readers
            .with(|conn| query_one(conn, "key = ?1", [key]))
    }

    /// Effects that are in flight or unknown: after a restart, these need reconciliation.
    pub fn effects_unfinished(&self) -> Result<Vec<EffectRecord>> {
        self.effects_where("state IN ('in_flight', 'unknown')")
    }

    /// Every effect, oldest first.
    pub fn effects(&self) -> Result<Vec<EffectRecord>> {
        self.effects_where("1")
    }

    fn effects_where(&self, where_: &str) -> Result<Vec<EffectRecord>> {
        self.inner.readers.with(|conn| {
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
    }
}

impl Inner {
    fn begin_in(
        &self,
        conn: &Connection,
        actor: &ActorId,
        key: &str,
        target: &str,
        request: &[u8],
    ) -> Result<BeginOutcome> {
        let request_hash = Hash::of(
            b"environment-effect-request",
            &[target.as_bytes(), &[0], request].concat(),
        );
        let now = self.options.clock.now_ms();
        if let Some(rec) = query_one(conn, "key = ?1", [key])? {
            let stored: Vec<u8> = conn.query_row(
                "SELECT request_hash FROM effects WHERE id = ?1",
                [rec.id as i64],
                |r| r.get(0),
            )?;
            if stored != request_hash.0 {
                return Err(EnvError::IdempotencyKeyReused {
                    key: key.to_owned(),
                });
            }
            return Ok(match rec.state {
                EffectState::Done => BeginOutcome::AlreadyDone(rec),
                EffectState::InFlight => BeginOutcome::InFlight(rec),
                EffectState::Unknown => BeginOutcome::NeedsReconciliation(rec),
                EffectState::Compensated => BeginOutcome::Compensated(rec),
                EffectState::Failed => {
                    conn.execute(
                        "UPDATE effects SET state = 'in_flight', attempts = attempts + 1, updated_ms = ?1 WHERE id = ?2",
                        params![now, rec.id as i64],
                    )?;
                    let rec = query_one(conn, "id = ?1", [rec.id as i64])?
                        .ok_or(EnvError::UnknownEffect(rec.id))?;
                    BeginOutcome::New(rec)
                }
            });
        }
        conn.prepare_cached(
            "INSERT INTO effects(key, target, request, request_hash, state, attempts, actor, created_ms, updated_ms)
             VALUES (?1, ?2, ?3, ?4, 'in_flight', 1, ?5, ?6, ?6)",
        )?
        .execute(params![key, target, request, &request_hash.0[..], actor.as_str(), now])?;
        let rec = query_one(conn, "key = ?1", [key])?.ok_or_else(|| EnvError::Integrity {
            at: format!("effect {key}"),
            detail: "inserted effect not found".into(),
        })?;
        Ok(BeginOutcome::New(rec))
    }
}
