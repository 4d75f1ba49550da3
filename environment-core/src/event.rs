//! Events: every committed operation is announced to in-process subscribers and, through the
//! [`Publisher`] port, to a bus.
//!
//! Delivery goes through an outbox written in the operation's own transaction, so a committed op
//! never loses its event (it is delivered after a crash, on reopen) and an aborted op never emits
//! one. Delivery to a [`Publisher`] is at least once; [`Event::id`] is the idempotency key.

use serde::{Deserialize, Serialize};

use crate::authz::ActorId;
use crate::key::{Key, KeyPrefix};
use crate::op::{ChangeSummary, Intent, IntentKind, OpFlags, OpId, Operation};

/// The announcement of one committed operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// The operation's id; also the idempotency key of the event.
    pub id: OpId,
    /// The operation's position in the log.
    pub seq: u64,
    /// The branch whose head moved.
    pub branch: String,
    /// Who acted.
    pub actor: ActorId,
    /// Why.
    pub intent: Intent,
    /// Capture, rollback, merge…
    pub flags: OpFlags,
    /// What changed (the first keys named, all counted).
    pub summary: ChangeSummary,
    /// Commit time, milliseconds since the epoch.
    pub time_ms: i64,
}

impl From<&Operation> for Event {
    fn from(op: &Operation) -> Event {
        Event {
            id: op.id,
            seq: op.seq,
            branch: op.branch.clone(),
            actor: op.actor.clone(),
            intent: op.intent.clone(),
            flags: op.flags,
            summary: op.summary.clone(),
            time_ms: op.time_ms,
        }
    }
}

/// Selects the events a subscriber receives; every set field must match.
#[derive(Clone, Debug, Default)]
pub struct EventFilter {
    /// Only this branch.
    pub branch: Option<String>,
    /// Only this actor.
    pub actor: Option<ActorId>,
    /// Only operations with all of these flags.
    pub flags: Option<OpFlags>,
    /// Only operations whose intent is of this kind.
    pub kind: Option<IntentKind>,
    /// Only operations that changed a key under this prefix (judged on the named keys).
    pub prefix: Option<KeyPrefix>,
}

impl EventFilter {
    /// Whether `event` passes.
    pub fn matches(&self, event: &Event) -> bool {
        self.branch.as_ref().is_none_or(|b| *b == event.branch)
            && self.actor.as_ref().is_none_or(|a| *a == event.actor)
            && self.flags.is_none_or(|f| event.flags.contains(f))
            && self.kind.as_ref().is_none_or(|k| *k == event.intent.kind)
            && self
                .prefix
                .as_ref()
                .is_none_or(|p| event.summary.keys.iter().any(|k: &Key| k.starts_with(p)))
    }
}

/// A publisher that refused or failed; the event stays in the outbox and is offered again.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("publishing event {event} failed: {message}")]
pub struct PublishError {
    /// The event's id.
    pub event: OpId,
    /// What went wrong.
    pub message: String,
}

/// Sends committed operations' events outside the process (a bus, a webhook). Called from the
/// environment's outbox thread, never while a transaction is open. Must be idempotent on
/// [`Event::id`]: after a crash an event may be offered again.
pub trait Publisher: Send + Sync {
    /// Publishes one event.
    fn publish(&self, event: &Event) -> Result<(), PublishError>;
}
