//! Acts: a request to change the environment, and what came of it. These are the types of
//! [`Environment::act`](crate::Environment::act), shared by every implementation.

use serde::{Deserialize, Serialize};

use crate::authz::{ActorId, Decision};
use crate::key::Key;
use crate::local::MAIN;
use crate::op::{ChangeSummary, Intent, OpFlags, OpId};
#[cfg(doc)]
use crate::value::INLINE_MAX;
use crate::value::Value;

/// One change an act makes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// Create or replace the value at a key. Inline content longer than [`INLINE_MAX`] is moved
    /// to the blob store; blob content must already be stored.
    Put(Key, Value),
    /// Remove the key (a no-op if it is absent).
    Delete(Key),
}

impl Change {
    /// The key changed.
    pub fn key(&self) -> &Key {
        match self {
            Change::Put(k, _) | Change::Delete(k) => k,
        }
    }
}

/// A request to change the environment.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActRequest {
    /// Who acts.
    pub actor: ActorId,
    /// The branch to change.
    pub branch: String,
    /// The version the actor read before deciding (`None`: whatever the head is).
    pub base: Option<OpId>,
    /// Why.
    pub intent: Intent,
    /// What to change; each key at most once.
    pub changes: Vec<Change>,
    /// Caller flags: only [`OpFlags::AUTO_CAPTURE`], [`OpFlags::QUIET`], [`OpFlags::COMMAND`] and
    /// [`OpFlags::FAILED`] are accepted; the others are the environment's to set.
    pub flags: OpFlags,
    /// Effect ids the operation refers to.
    pub effects: Vec<u64>,
    /// What a change the actor may not make does to the act.
    pub refusal: Refusal,
}

/// What an act does with a change its actor may not make.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Refusal {
    /// Refuses the whole act: nothing is recorded (the default, for an action asked for).
    #[default]
    Whole,
    /// Records the changes the actor may make as its operation and, in the same transaction,
    /// each other one as a [`RefusedChange`] with its decision, listed in
    /// [`Observation::refused`]. For changes already made in a tree (a command's files), which
    /// the caller then puts back to their value at the head. A change to a path (an `fs` key)
    /// that moved on the branch since the request's [`base`](ActRequest::base) is refused the
    /// same way ([`Verdict::Stale`](crate::Verdict::Stale)) rather than failing the act, unless
    /// it puts what the head holds already: then it is simply not recorded; so is a path the
    /// head's tree would leave without its directory. Other keys (the records of the command
    /// that made the changes) are written over the head.
    Record,
}

impl ActRequest {
    /// A request on `main` based on its current head, with no changes yet.
    pub fn new(actor: ActorId, intent: Intent) -> ActRequest {
        ActRequest {
            actor,
            branch: MAIN.to_owned(),
            base: None,
            intent,
            changes: Vec::new(),
            flags: OpFlags::empty(),
            effects: Vec::new(),
            refusal: Refusal::Whole,
        }
    }

    /// Records the changes the actor may not make as refused instead of refusing the act (see
    /// [`Refusal::Record`]).
    pub fn recording_refusals(mut self) -> ActRequest {
        self.refusal = Refusal::Record;
        self
    }

    /// On another branch.
    pub fn on(mut self, branch: impl Into<String>) -> ActRequest {
        self.branch = branch.into();
        self
    }

    /// Based on the version the actor read.
    pub fn base(mut self, version: OpId) -> ActRequest {
        self.base = Some(version);
        self
    }

    /// Puts a value.
    pub fn put(mut self, key: Key, value: Value) -> ActRequest {
        self.changes.push(Change::Put(key, value));
        self
    }

    /// Deletes a key.
    pub fn delete(mut self, key: Key) -> ActRequest {
        self.changes.push(Change::Delete(key));
        self
    }

    /// Adds flags.
    pub fn flags(mut self, flags: OpFlags) -> ActRequest {
        self.flags |= flags;
        self
    }
}

/// What an act returns: the version it produced and what happened on the way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Observation {
    /// The branch's head after the act: the new operation, or the unchanged head for a no-op.
    pub version: OpId,
    /// The new operation's position in the log.
    pub seq: u64,
    /// The branch.
    pub branch: String,
    /// The head had moved past the base version; the change touched other keys and was
    /// applied on top of the head.
    pub rebased: bool,
    /// Nothing changed (every value was already as requested); no operation was recorded.
    pub noop: bool,
    /// What changed.
    pub summary: ChangeSummary,
    /// The changes recorded as refused rather than made (only for [`Refusal::Record`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedChange>,
}

/// One change an actor made that was not recorded: the policy refused it, or the key had
/// changed on the branch since the version the change was made on (see [`Refusal::Record`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RefusedChange {
    /// Its position among the refused changes (increasing).
    pub id: u64,
    /// Who made it.
    pub actor: ActorId,
    /// The branch it was refused on.
    pub branch: String,
    /// The head it was refused against: the key's last allowed state is its value there.
    pub head: OpId,
    /// The key.
    pub key: Key,
    /// What the actor put there (`None`: it deleted the key).
    pub value: Option<Value>,
    /// Why the actor acted.
    pub intent: Intent,
    /// The decision that refused it (a deny, or an approval still needed).
    pub decision: Decision,
    /// When it was refused, in milliseconds since the epoch.
    pub time_ms: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trait's requests and answers travel as data: what is written reads back the same.
    #[test]
    fn an_act_request_and_its_port_types_round_trip_as_json() {
        let request = ActRequest::new(ActorId::new("agent:a").unwrap(), Intent::edit("why"))
            .on("feature")
            .put(Key::fs("a.txt").unwrap(), Value::file("x"))
            .delete(Key::fs("b.txt").unwrap())
            .recording_refusals();
        let text = serde_json::to_string(&request).unwrap();
        assert_eq!(serde_json::from_str::<ActRequest>(&text).unwrap(), request);
        let lease = crate::queue::Lease {
            receipt: "1.00000000000000ab".into(),
            group: "g".into(),
            message: crate::queue::Message {
                id: 1,
                topic: "t".into(),
                payload: vec![0, 255],
                ordering_key: None,
                correlation_id: Some("c".into()),
                publisher: Some("agent:a".into()),
            },
            attempt: 1,
            lease_until_ms: 2,
        };
        let text = serde_json::to_string(&lease).unwrap();
        assert_eq!(
            serde_json::from_str::<crate::queue::Lease>(&text).unwrap(),
            lease
        );
    }
}
