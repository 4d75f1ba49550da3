//! The effect log: external side effects recorded before they happen, keyed for idempotency.
//! The use cases (who may begin or settle an effect, which changes of state are allowed) are
//! written here once, over the [`EffectStore`] port; `embedded::EmbeddedEffects` keeps the log
//! in the environment's database.

use std::sync::Arc;

use super::LocalEnvironment;
use crate::authz::{Action, ActorId, Resource};
use crate::effect::{
    BeginOutcome, Begun, EffectChange, EffectRecord, EffectState, EffectStore, NewEffect,
};
use crate::error::{EnvError, Result};

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
        self.inner.spend(&permit.spend)?;
        let store = &self.inner.effects;
        let new = NewEffect {
            key,
            target,
            request,
            request_hash: NewEffect::hash_of(target, request),
            actor: actor.as_str(),
            now: self.inner.options.clock.now_ms(),
        };
        loop {
            let (record, same_request) = match store.begin(&new).map_err(EnvError::Store)? {
                Begun::Recorded(r) => return Ok(BeginOutcome::New(r)),
                Begun::Found {
                    record,
                    same_request,
                } => (record, same_request),
            };
            if !same_request {
                return Err(EnvError::IdempotencyKeyReused {
                    key: key.to_owned(),
                });
            }
            return Ok(match record.state {
                EffectState::Done => BeginOutcome::AlreadyDone(record),
                EffectState::InFlight => BeginOutcome::InFlight(record),
                EffectState::Unknown => BeginOutcome::NeedsReconciliation(record),
                EffectState::Compensated => BeginOutcome::Compensated(record),
                // A failed effect is begun again: one of the machines asking at once does it,
                // the others find it in flight.
                EffectState::Failed => {
                    let again = EffectChange {
                        id: record.id,
                        from: EffectState::Failed,
                        to: EffectState::InFlight,
                        result: None,
                        note: None,
                        attempt: true,
                        now: new.now,
                    };
                    match store.change(&again).map_err(EnvError::Store)? {
                        Some(r) => BeginOutcome::New(r),
                        None => continue,
                    }
                }
            });
        }
    }

    /// Records an effect's result, as `actor`: authorized as the effect's beginning was
    /// (execute on its target), so only who may perform an effect on a target may say how it
    /// ended.
    pub fn effect_complete(&self, actor: &ActorId, id: u64, result: &[u8]) -> Result<EffectRecord> {
        self.effect_transition(actor, id, EffectState::Done, Some(result), None)
    }

    /// Records that an effect failed without taking effect (authorized as
    /// [`effect_complete`](LocalEnvironment::effect_complete)).
    pub fn effect_fail(&self, actor: &ActorId, id: u64, error: &str) -> Result<EffectRecord> {
        self.effect_transition(actor, id, EffectState::Failed, None, Some(error))
    }

    /// Records that an effect's outcome is unknown (it may have happened).
    pub fn effect_mark_unknown(
        &self,
        actor: &ActorId,
        id: u64,
        note: &str,
    ) -> Result<EffectRecord> {
        self.effect_transition(actor, id, EffectState::Unknown, None, Some(note))
    }

    /// Records that a done (or unknown) effect was undone by a compensating action.
    pub fn effect_compensate(&self, actor: &ActorId, id: u64, note: &str) -> Result<EffectRecord> {
        self.effect_transition(actor, id, EffectState::Compensated, None, Some(note))
    }

    fn effect_transition(
        &self,
        actor: &ActorId,
        id: u64,
        to: EffectState,
        result: Option<&[u8]>,
        note: Option<&str>,
    ) -> Result<EffectRecord> {
        let store = &self.inner.effects;
        let found = |id| {
            store
                .by_id(id)
                .map_err(EnvError::Store)?
                .ok_or(EnvError::UnknownEffect(id))
        };
        // An effect's target never changes: the check can read it first.
        let mut record = found(id)?;
        let permit = self.decide(
            actor,
            Action::Execute,
            Resource::Service(record.target.clone()),
            None,
            Some("effect"),
        )?;
        let refused = |r: &EffectRecord| EnvError::InvalidEffectTransition {
            id,
            from: r.state.as_str(),
            to: to.as_str(),
        };
        if !record.state.may_become(to) {
            return Err(refused(&record));
        }
        self.inner.spend(&permit.spend)?;
        loop {
            let change = EffectChange {
                id,
                from: record.state,
                to,
                result,
                note,
                attempt: false,
                now: self.inner.options.clock.now_ms(),
            };
            if let Some(r) = store.change(&change).map_err(EnvError::Store)? {
                return Ok(r);
            }
            // Settled in between (by another process or machine): decided again on its state.
            record = found(id)?;
            if !record.state.may_become(to) {
                return Err(refused(&record));
            }
        }
    }

    /// The store the effect log is kept in: the environment's database, or the one
    /// [`Options::effects`](super::Options::effects) named.
    pub fn effect_store(&self) -> &Arc<dyn EffectStore> {
        &self.inner.effects
    }

    /// The effect with this idempotency key.
    pub fn effect(&self, key: &str) -> Result<Option<EffectRecord>> {
        self.inner.effects.by_key(key).map_err(EnvError::Store)
    }

    /// Effects that are in flight or unknown: after a restart, these need reconciliation.
    pub fn effects_unfinished(&self) -> Result<Vec<EffectRecord>> {
        self.inner.effects.list(true).map_err(EnvError::Store)
    }

    /// Every effect, oldest first.
    pub fn effects(&self) -> Result<Vec<EffectRecord>> {
        self.inner.effects.list(false).map_err(EnvError::Store)
    }
}
