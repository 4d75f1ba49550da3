//! The queue port: what a workspace asks of the queue through which agents and humans hand each
//! other work (publish, claim with a lease, settle, extend, dead letters, redrive, figures).
//! `environment-bus` implements it; the workspace service holds an `Arc<dyn Queue>` and never
//! the bus's own types. Receipts cross the port in their text form, as they cross every door.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::PortError;

/// The queue as the workspace service sees it. Every method blocks until its work is durable.
pub trait Queue: Send + Sync {
    /// Publishes a message to `topic`, creating the topic when it is new.
    fn publish(&self, topic: &str, payload: Vec<u8>, options: Publish)
    -> Result<Posted, PortError>;
    /// Leases up to `max` messages of `group` to `consumer` for `lease`, oldest first.
    fn claim(
        &self,
        group: &str,
        consumer: &str,
        max: u32,
        lease: Duration,
    ) -> Result<Vec<Lease>, PortError>;
    /// Who holds the lease `receipt` names, and in which group. A receipt that names nothing
    /// is not found; one settled, or lapsed and claimed again, is a conflict.
    fn holder(&self, receipt: &str) -> Result<Holder, PortError>;
    /// Settles the lease `receipt` names, as `consumer` (who must hold it).
    fn settle(&self, consumer: &str, receipt: &str, how: Settlement) -> Result<(), PortError>;
    /// Acks the lease `receipt` names, as `consumer`, and leases up to `max` further messages
    /// of `group` (the receipt's own) to it, in one step: a worker's cycle is then two
    /// operations, not three. A receipt of another group is invalid, and nothing is acked.
    fn ack_and_claim(
        &self,
        consumer: &str,
        receipt: &str,
        group: &str,
        max: u32,
        lease: Duration,
    ) -> Result<Vec<Lease>, PortError>;
    /// Extends the lease `receipt` names to `lease` from now.
    fn extend(&self, receipt: &str, lease: Duration) -> Result<(), PortError>;
    /// Subscribes `group` to `topics`, creating both when new.
    fn subscribe(&self, group: &str, topics: &[String]) -> Result<(), PortError>;
    /// The leases of `group` in flight now (every group's when `None`), in delivery order, after
    /// the delivery `after`.
    fn leases(
        &self,
        group: Option<&str>,
        after: Option<i64>,
        limit: u32,
    ) -> Result<Vec<LeaseInFlight>, PortError>;
    /// `group`'s dead letters, oldest message first, after the message `after`.
    fn dead_letters(
        &self,
        group: &str,
        after: Option<i64>,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, PortError>;
    /// Sends `group`'s dead letters back to the queue; returns how many.
    fn redrive(&self, group: &str) -> Result<u64, PortError>;
    /// Depth, leases and dead letters per topic and group.
    fn metrics(&self) -> Result<Vec<TopicMetrics>, PortError>;
    /// Removes what the retention lets go: deliveries acked longer ago than it, the messages
    /// all of whose deliveries are gone, and dedup ids past their window. Nothing unsettled
    /// and no dead letter is touched.
    fn purge(&self) -> Result<Purged, PortError>;
    /// Why the queue's own background work (its periodic purge) last failed, until a later
    /// run succeeds; `None` while it works or when there is none. A failure there is reported
    /// here, never only logged.
    fn upkeep_failure(&self) -> Option<PortError>;
}

/// What a purge removed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Purged {
    /// Acked deliveries.
    pub deliveries: u64,
    /// Messages (all their deliveries were gone).
    pub messages: u64,
    /// Expired dedup ids.
    pub dedup_ids: u64,
}

impl Purged {
    /// Whether nothing was removed.
    pub fn is_empty(&self) -> bool {
        *self == Purged::default()
    }
}

impl std::ops::AddAssign for Purged {
    fn add_assign(&mut self, o: Purged) {
        self.deliveries += o.deliveries;
        self.messages += o.messages;
        self.dedup_ids += o.dedup_ids;
    }
}

/// How to publish a message.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Publish {
    /// Messages with the same key are handled one at a time, in order.
    pub ordering_key: Option<String>,
    /// A second publish with the same id is accepted and not delivered again.
    pub dedup_id: Option<String>,
    /// Not deliverable before this much time has passed.
    pub delay: Option<Duration>,
    /// Who published it (the workspace's actor, never the caller's word).
    pub publisher: Option<String>,
    /// Ties the message to a conversation or a task.
    pub correlation_id: Option<String>,
}

/// A message published.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Posted {
    /// The message's id (for a duplicate, the id of the message it repeats).
    pub id: i64,
    /// Its dedup id was seen: it will not be delivered twice.
    pub duplicate: bool,
}

/// A message as delivered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// Its id.
    pub id: i64,
    /// Its topic.
    pub topic: String,
    /// Its body.
    pub payload: Vec<u8>,
    /// Its ordering key.
    pub ordering_key: Option<String>,
    /// Ties it to a conversation or a task.
    pub correlation_id: Option<String>,
    /// Who published it.
    pub publisher: Option<String>,
}

/// A message leased to a consumer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// What settles it, in text.
    pub receipt: String,
    /// The consumer group.
    pub group: String,
    /// The message.
    pub message: Message,
    /// Which delivery this is (1 is the first).
    pub attempt: u32,
    /// When the lease runs out, ms since the epoch.
    pub lease_until_ms: i64,
}

/// Who holds a lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holder {
    /// The consumer group the message was claimed from.
    pub group: String,
    /// The consumer that claimed it.
    pub consumer: String,
}

/// How a lease is settled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Settlement {
    /// Handled: not delivered again.
    Ack,
    /// Given back: delivered again later, or dead-lettered after the last attempt.
    Nack {
        /// No sooner than this from now (the queue's backoff when `None`).
        delay: Option<Duration>,
        /// Why the work failed.
        error: Option<String>,
    },
}

/// A lease in flight, as a board of the queue shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseInFlight {
    /// The delivery leased (the number before the dot of its receipt, which alone settles
    /// nothing): where the next page of leases starts.
    pub delivery: i64,
    /// The consumer group.
    pub group: String,
    /// The message's topic.
    pub topic: String,
    /// The message's id.
    pub message_id: i64,
    /// Who holds it.
    pub consumer: String,
    /// Which delivery this is (1 is the first).
    pub attempt: u32,
    /// When the message was published, ms since the epoch.
    pub published_at_ms: i64,
    /// When the lease runs out, ms since the epoch.
    pub lease_until_ms: i64,
}

/// A message a group gave up on, kept until redriven.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The message.
    pub message: Message,
    /// Deliveries tried.
    pub attempts: u32,
    /// The last error reported.
    pub last_error: Option<String>,
    /// When it died, ms since the epoch.
    pub dead_at_ms: i64,
}

/// Queue figures of one (topic, group) pair.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct GroupMetrics {
    /// The topic.
    pub topic: String,
    /// The group.
    pub group: String,
    /// Messages not yet acked, not leased and not dead (including delayed and key-blocked).
    pub depth: u64,
    /// Messages under an unexpired lease.
    pub in_flight: u64,
    /// Age (clock milliseconds) of the oldest message not yet acked or dead; 0 if none.
    pub oldest_age_ms: i64,
    /// Dead letters waiting for a redrive.
    pub dead_letters: u64,
    /// Claims beyond the first, summed over the retained deliveries.
    pub redeliveries: u64,
}

/// Figures of one topic.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TopicMetrics {
    /// The topic.
    pub topic: String,
    /// Messages retained (not yet purged).
    pub retained: u64,
    /// Per subscribed group.
    pub groups: Vec<GroupMetrics>,
}
