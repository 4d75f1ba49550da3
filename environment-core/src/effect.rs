//! Effects: external side effects recorded before they happen, keyed for idempotency. These are
//! the types of the [`Environment`](crate::Environment)'s effect log, and its storage port
//! ([`EffectStore`]).

use serde::{Deserialize, Serialize};

use crate::error::{EnvError, PortError, Result};
use crate::hash::Hash;

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

    /// The state with this stored name.
    pub fn parse(s: &str) -> Result<EffectState> {
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

/// An effect about to be begun, as a store records it.
#[derive(Clone, Copy, Debug)]
pub struct NewEffect<'a> {
    /// The idempotency key.
    pub key: &'a str,
    /// What it acts on.
    pub target: &'a str,
    /// The request.
    pub request: &'a [u8],
    /// The hash of the target and the request: a key begun again with another is refused.
    pub request_hash: Hash,
    /// Who begins it.
    pub actor: &'a str,
    /// When (ms since the epoch).
    pub now: i64,
}

impl NewEffect<'_> {
    /// The hash a store keeps for `target` and `request`.
    pub fn hash_of(target: &str, request: &[u8]) -> Hash {
        Hash::of(
            b"environment-effect-request",
            &[target.as_bytes(), &[0], request].concat(),
        )
    }
}

/// What a store found when asked to begin an effect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Begun {
    /// No effect had the key: this one is recorded, in flight, at its first attempt.
    Recorded(EffectRecord),
    /// An effect has the key already: its record, and whether it was begun with the same
    /// target and request.
    Found {
        /// The effect with the key.
        record: EffectRecord,
        /// Whether its request hash is the one asked with.
        same_request: bool,
    },
}

/// A change of one effect's state, made only while it is still in `from`.
#[derive(Clone, Copy, Debug)]
pub struct EffectChange<'a> {
    /// The effect.
    pub id: u64,
    /// The state the change was decided on.
    pub from: EffectState,
    /// The state it moves to.
    pub to: EffectState,
    /// The result to record (kept as it was when `None`).
    pub result: Option<&'a [u8]>,
    /// The note to record (kept as it was when `None`).
    pub note: Option<&'a str>,
    /// Whether this is a new attempt (a failed effect begun again): counted.
    pub attempt: bool,
    /// When (ms since the epoch).
    pub now: i64,
}

/// Where the effect log is kept: in the environment's own database by default, or in a store
/// that several machines share. A store only keeps records; the environment decides who may
/// begin and settle effects and which changes of state are allowed. Every write is atomic and
/// durable once it returns: a begun effect is never begun twice, on any machine.
pub trait EffectStore: Send + Sync {
    /// Records `new` in flight, unless an effect has its key: then that one is found.
    fn begin(&self, new: &NewEffect<'_>) -> std::result::Result<Begun, PortError>;
    /// Makes `change` if the effect is still in `change.from`: its record after, or `None`
    /// when it is not (it moved, or there is no such effect).
    fn change(
        &self,
        change: &EffectChange<'_>,
    ) -> std::result::Result<Option<EffectRecord>, PortError>;
    /// The effect with this id.
    fn by_id(&self, id: u64) -> std::result::Result<Option<EffectRecord>, PortError>;
    /// The effect with this idempotency key.
    fn by_key(&self, key: &str) -> std::result::Result<Option<EffectRecord>, PortError>;
    /// Every effect, oldest first; only those in flight or unknown when `unfinished`.
    fn list(&self, unfinished: bool) -> std::result::Result<Vec<EffectRecord>, PortError>;
}
