//! Effects: external side effects recorded before they happen, keyed for idempotency. These are
//! the types of the [`Environment`](crate::Environment)'s effect log.

use serde::{Deserialize, Serialize};

use crate::error::{EnvError, Result};

/// Where an effect stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum EffectState {
    /// Begun; its outcome is not known yet.
    InFlight,
    /// Performed; the result is recorded.
    Done,
    /// Failed without taking effect; a new `begin` with the same key may try again.
    Failed,
    /// It may or may not have happened (a timeout, a crash): reconcile before anything else.
    Unknown,
    /// Undone by a compensating action.
    Compensated,
}

impl EffectState {
    /// The state's stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            EffectState::InFlight => "in_flight",
            EffectState::Done => "done",
            EffectState::Failed => "failed",
            EffectState::Unknown => "unknown",
            EffectState::Compensated => "compensated",
        }
    }

    pub(crate) fn parse(s: &str) -> Result<EffectState> {
        Ok(match s {
            "in_flight" => EffectState::InFlight,
            "done" => EffectState::Done,
            "failed" => EffectState::Failed,
            "unknown" => EffectState::Unknown,
            "compensated" => EffectState::Compensated,
            other => {
                return Err(EnvError::Decode {
                    what: "effect state",
                    detail: other.to_owned(),
                });
            }
        })
    }

    pub(crate) fn may_become(self, to: EffectState) -> bool {
        use EffectState::*;
        matches!(
            (self, to),
            (InFlight, Done | Failed | Unknown)
                | (Unknown, Done | Failed | Compensated)
                | (Done, Compensated)
        )
    }
}

/// One effect's record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectRecord {
    /// Its id.
    pub id: u64,
    /// The idempotency key.
    pub key: String,
    /// What it acts on (a service, an endpoint).
    pub target: String,
    /// The request, as given.
    pub request: Vec<u8>,
    /// Where it stands.
    pub state: EffectState,
    /// The result of a done effect.
    pub result: Option<Vec<u8>>,
    /// The error of a failed one, or a note on an unknown or compensated one.
    pub note: Option<String>,
    /// How many times it was begun.
    pub attempts: u32,
    /// Who began it.
    pub actor: String,
    /// When it was first begun, ms since the epoch.
    pub created_ms: i64,
    /// When it last changed.
    pub updated_ms: i64,
}

/// What `begin` found.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum BeginOutcome {
    /// Perform the effect now, then complete or fail it.
    New(EffectRecord),
    /// It was performed already: here is its result. Do not perform it again.
    AlreadyDone(EffectRecord),
    /// Someone is performing it right now (or crashed while doing so). Do not perform it.
    InFlight(EffectRecord),
    /// It may have happened: reconcile with the target before anything else.
    NeedsReconciliation(EffectRecord),
    /// It happened and was compensated.
    Compensated(EffectRecord),
}

impl BeginOutcome {
    /// What `begin` found, by name: `new`, `already_done`, `in_flight`, `needs_reconciliation`
    /// or `compensated`.
    pub fn name(&self) -> &'static str {
        match self {
            BeginOutcome::New(_) => "new",
            BeginOutcome::AlreadyDone(_) => "already_done",
            BeginOutcome::InFlight(_) => "in_flight",
            BeginOutcome::NeedsReconciliation(_) => "needs_reconciliation",
            BeginOutcome::Compensated(_) => "compensated",
        }
    }

    /// The effect's record.
    pub fn record(&self) -> &EffectRecord {
        match self {
            BeginOutcome::New(r)
            | BeginOutcome::AlreadyDone(r)
            | BeginOutcome::InFlight(r)
            | BeginOutcome::NeedsReconciliation(r)
            | BeginOutcome::Compensated(r) => r,
        }
    }
}
