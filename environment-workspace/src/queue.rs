//! The queue methods: publish, claim, ack, nack — the bus, through the session's authorization. The
//! publisher header is the connection's actor, and settling is authorized on the consumer group
//! a receipt was claimed from, not on what the caller says.

use std::time::Duration;

use environment_core::queue::{LeaseInFlight, Message, Publish, Settlement, TopicMetrics};
use environment_core::{Action, ErrorKind, Queue, Resource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::commands::Bytes;
use super::error::ServiceError;
use super::page::more_than;
use super::session::Session;
use super::versions::no_params;
use super::workspace::{Claimed as Claim, lock};

/// Publishes a message to a queue topic (creating it), with the workspace's actor as its
/// publisher.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishParams {
    /// The topic, e.g. "task.created".
    pub topic: String,
    /// The message (text, often JSON).
    pub payload: String,
    /// Messages with the same ordering key are handled one at a time, in order.
    #[serde(default)]
    pub ordering_key: Option<String>,
    /// Publishing the same dedup id again is accepted but not delivered twice.
    #[serde(default)]
    pub dedup_id: Option<String>,
    /// Deliver it no sooner than this many milliseconds from now.
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// Ties the message to a conversation or a task.
    #[serde(default)]
    pub correlation_id: Option<String>,
}

/// A message published.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Published {
    /// The message's id.
    pub id: i64,
    /// Its dedup id was seen: it will not be delivered twice.
    pub duplicate: bool,
}

/// How long a lease lasts when the caller does not say.
const LEASE_MS: u64 = 30_000;
/// How many receipts the workspace remembers before it forgets the long-lapsed ones.
const REMEMBERED: usize = 4096;
/// How long after its lease ran out a receipt is forgotten.
const FORGET_AFTER_MS: i64 = 3_600_000;

pub(super) fn bus<'a>(g: &'a Session<'_>) -> Result<&'a dyn Queue, ServiceError> {
    g.shared()
        .bus
        .as_deref()
        .ok_or_else(|| ServiceError::unavailable("the queue"))
}

pub(super) fn publish(g: &Session<'_>, p: PublishParams) -> Result<Published, ServiceError> {
    let bus = bus(g)?;
    g.allow(Action::Publish, Resource::Topic(p.topic.clone()), None)?;
    let options = Publish {
        ordering_key: p.ordering_key,
        dedup_id: p.dedup_id,
        delay: p.delay_ms.map(Duration::from_millis),
        // Who published is the workspace's to say, not the caller's.
        publisher: Some(g.actor().to_string()),
        correlation_id: p.correlation_id,
    };
    let posted = bus.publish(&p.topic, p.payload.into_bytes(), options)?;
    Ok(Published {
        id: posted.id,
        duplicate: posted.duplicate,
    })
}

/// Leases messages of a consumer group: each is the caller's until its lease runs out, to ack
/// when done or nack to retry later.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimParams {
    /// The consumer group.
    pub group: String,
    /// The consumer's name (default: the workspace's actor).
    #[serde(default)]
    pub consumer: Option<String>,
    /// At most this many messages (default 1).
    #[serde(default)]
    pub max: Option<u32>,
    /// How long the lease lasts (default 30 s).
    #[serde(default)]
    pub lease_ms: Option<u64>,
}

/// The leases handed out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Claimed {
    /// Oldest message first.
    pub leases: Vec<Lease>,
}

/// A message leased to the caller.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Lease {
    /// What settles it (queue.ack, queue.nack, queue.extend).
    pub receipt: String,
    /// The consumer group.
    pub group: String,
    /// The message's topic.
    pub topic: String,
    /// The message's id.
    pub message_id: i64,
    /// The message, when it is UTF-8 text.
    pub payload: Option<String>,
    /// The message in base64, when it is not.
    pub payload_base64: Option<String>,
    /// Its ordering key.
    pub ordering_key: Option<String>,
    /// Its correlation id.
    pub correlation_id: Option<String>,
    /// Who published it.
    pub publisher: Option<String>,
    /// Which delivery this is (1 is the first).
    pub attempt: u32,
    /// When the lease runs out, ms since the epoch.
    pub lease_until_ms: i64,
}

pub(super) fn claim(g: &Session<'_>, p: ClaimParams) -> Result<Claimed, ServiceError> {
    let bus = bus(g)?;
    g.allow(Action::Consume, Resource::Topic(p.group.clone()), None)?;
    let consumer = p.consumer.unwrap_or_else(|| g.actor().to_string());
    let leases = bus.claim(
        &p.group,
        &consumer,
        p.max.unwrap_or(1),
        Duration::from_millis(p.lease_ms.unwrap_or(LEASE_MS)),
    )?;
    Ok(Claimed {
        leases: handed_out(g, &consumer, leases),
    })
}

/// Leases handed to the caller, as `consumer`: each receipt remembered with its claim (only
/// the caller settles it), each message in the answer's form.
fn handed_out(
    g: &Session<'_>,
    consumer: &str,
    leases: Vec<environment_core::queue::Lease>,
) -> Vec<Lease> {
    let mut receipts = lock(&g.shared().receipts);
    if receipts.claims.len() >= receipts.forget_at.max(REMEMBERED)
        && let Some(first) = leases.first()
    {
        // Receipts whose leases ran out long ago (never settled here) are forgotten, so the
        // book does not grow with every lapsed claim (a new lease's end stands for now). An
        // extended lease still held past that is settled as its holder's own (see `holder`).
        let long_ago = first.lease_until_ms.saturating_sub(FORGET_AFTER_MS);
        receipts.claims.retain(|_, c| c.until_ms > long_ago);
        receipts.forget_at = 2 * receipts.claims.len();
    }
    leases
        .into_iter()
        .map(|l| {
            let claim = Claim {
                group: l.group.clone(),
                consumer: consumer.to_owned(),
                claimer: g.actor().clone(),
                until_ms: l.lease_until_ms,
            };
            receipts.claims.insert(l.receipt.clone(), claim);
            let Message {
                id,
                topic,
                payload,
                ordering_key,
                correlation_id,
                publisher,
            } = l.message;
            let payload = Bytes::of(&payload);
            Lease {
                receipt: l.receipt,
                group: l.group,
                topic,
                message_id: id,
                payload: payload.text,
                payload_base64: payload.base64,
                ordering_key,
                correlation_id,
                publisher,
                attempt: l.attempt,
                lease_until_ms: l.lease_until_ms,
            }
        })
        .collect()
}

/// Acknowledges a lease: the message was handled and is not delivered again.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AckParams {
    /// The receipt queue.claim gave.
    pub receipt: String,
    /// Also lease up to this many further messages of the same group, in the same step (a
    /// worker's cycle: ack what is done, take what is next).
    #[serde(default)]
    pub next: Option<u32>,
    /// How long the further leases last (default 30 s).
    #[serde(default)]
    pub lease_ms: Option<u64>,
}

/// Gives a lease back: the message is delivered again later (or dead-lettered after its last
/// attempt).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NackParams {
    /// The receipt queue.claim gave.
    pub receipt: String,
    /// Deliver it again no sooner than this many milliseconds from now.
    #[serde(default)]
    pub delay_ms: Option<u64>,
    /// Why the work failed.
    #[serde(default)]
    pub error: Option<String>,
}

/// A lease settled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Settled {
    /// The receipt.
    pub receipt: String,
    /// `ack` or `nack`.
    pub settled: String,
    /// The further leases an ack with `next` took (oldest first).
    #[serde(default)]
    pub leases: Vec<Lease>,
}

/// Who may settle `receipt`, decided: the consumer group it was claimed from (the caller must
/// be allowed to consume it) and its holder (a receipt this workspace handed out is settled
/// only by the actor whose claim it came from, as the consumer named there; one claimed
/// elsewhere must be held by the caller's own consumer). An unknown receipt is not found; a
/// settled or lapsed one is a conflict.
fn holder(g: &Session<'_>, receipt: &str) -> Result<Claim, ServiceError> {
    let held = bus(g)?.holder(receipt)?;
    let claimed = match lock(&g.shared().receipts).claims.get(receipt).cloned() {
        Some(c) if &c.claimer == g.actor() => c,
        None if held.consumer == g.actor().as_str() => Claim {
            group: held.group.clone(),
            consumer: held.consumer.clone(),
            claimer: g.actor().clone(),
            until_ms: 0,
        },
        _ => {
            return Err(ServiceError::new(
                ErrorKind::Denied,
                "the receipt is another consumer's",
                "settle only the receipts your own claims handed you.",
            ));
        }
    };
    if claimed.group != held.group || claimed.consumer != held.consumer {
        return Err(ServiceError::new(
            ErrorKind::Conflict,
            "the receipt's lease was claimed again since",
            "claim again; this lease is no longer yours.",
        ));
    }
    g.allow(
        Action::Consume,
        Resource::Topic(claimed.group.clone()),
        None,
    )?;
    Ok(claimed)
}

pub(super) fn ack(g: &Session<'_>, p: AckParams) -> Result<Settled, ServiceError> {
    let Some(max) = p.next.filter(|n| *n > 0) else {
        return settle(g, p.receipt, Settlement::Ack);
    };
    let bus = bus(g)?;
    let claim = holder(g, &p.receipt)?;
    let lease = Duration::from_millis(p.lease_ms.unwrap_or(LEASE_MS));
    let next = bus.ack_and_claim(&claim.consumer, &p.receipt, &claim.group, max, lease)?;
    lock(&g.shared().receipts).claims.remove(&p.receipt);
    Ok(Settled {
        receipt: p.receipt,
        settled: "ack".to_owned(),
        leases: handed_out(g, &claim.consumer, next),
    })
}

pub(super) fn nack(g: &Session<'_>, p: NackParams) -> Result<Settled, ServiceError> {
    let how = Settlement::Nack {
        delay: p.delay_ms.map(Duration::from_millis),
        error: p.error,
    };
    settle(g, p.receipt, how)
}

/// Settles the lease of `receipt` as its holder.
fn settle(g: &Session<'_>, receipt: String, how: Settlement) -> Result<Settled, ServiceError> {
    let bus = bus(g)?;
    let claim = holder(g, &receipt)?;
    let settled = match how {
        Settlement::Ack => "ack",
        Settlement::Nack { .. } => "nack",
    };
    bus.settle(&claim.consumer, &receipt, how)?;
    lock(&g.shared().receipts).claims.remove(&receipt);
    Ok(Settled {
        receipt,
        settled: settled.to_owned(),
        leases: Vec::new(),
    })
}

/// Extends a lease the caller holds, so long work is not handed to another consumer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendParams {
    /// The receipt queue.claim gave.
    pub receipt: String,
    /// How much longer the lease lasts, from now.
    pub lease_ms: u64,
}

/// A lease extended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Extended {
    /// The receipt.
    pub receipt: String,
    /// How much longer the lease lasts, from when it was extended.
    pub lease_ms: u64,
}

pub(super) fn extend(g: &Session<'_>, p: ExtendParams) -> Result<Extended, ServiceError> {
    let bus = bus(g)?;
    holder(g, &p.receipt)?;
    bus.extend(&p.receipt, Duration::from_millis(p.lease_ms))?;
    Ok(Extended {
        receipt: p.receipt,
        lease_ms: p.lease_ms,
    })
}

/// Subscribes a consumer group to topics (creating both): a consume of each topic and of the
/// group, as claiming from it will be.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SubscribeParams {
    /// The consumer group.
    pub group: String,
    /// The topics it reads (at least one).
    pub topics: Vec<String>,
}

/// A group subscribed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Subscribed {
    /// The consumer group.
    pub group: String,
    /// The topics it reads.
    pub topics: Vec<String>,
}

pub(super) fn subscribe(g: &Session<'_>, p: SubscribeParams) -> Result<Subscribed, ServiceError> {
    let bus = bus(g)?;
    if p.topics.is_empty() {
        return Err(ServiceError::invalid("`topics` is empty"));
    }
    for t in p.topics.iter().chain(std::iter::once(&p.group)) {
        g.allow(Action::Consume, Resource::Topic(t.clone()), None)?;
    }
    bus.subscribe(&p.group, &p.topics)?;
    Ok(Subscribed {
        group: p.group,
        topics: p.topics,
    })
}

/// A consumer group's dead letters, oldest first: read by whoever may consume the group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadParams {
    /// The consumer group.
    pub group: String,
    /// At most this many (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<u32>,
    /// The page after this message (the `next` of the previous page).
    #[serde(default)]
    pub after: Option<i64>,
}

/// A group's dead letters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadLetters {
    /// The consumer group.
    pub group: String,
    /// Oldest first.
    pub dead: Vec<DeadLetter>,
    /// Where the next page starts (`after`), when more follow.
    #[serde(default)]
    pub next: Option<i64>,
}

/// A message that ran out of attempts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeadLetter {
    /// The message's id.
    pub message_id: i64,
    /// Its topic.
    pub topic: String,
    /// Deliveries tried.
    pub attempts: u32,
    /// The last nack's error.
    pub last_error: Option<String>,
    /// When it died, ms since the epoch.
    pub dead_at_ms: i64,
    /// The message, when it is UTF-8 text.
    pub payload: Option<String>,
    /// The message in base64, when it is not.
    pub payload_base64: Option<String>,
}

pub(super) fn dead_letters(g: &Session<'_>, p: DeadParams) -> Result<DeadLetters, ServiceError> {
    let bus = bus(g)?;
    g.allow(Action::Consume, Resource::Topic(p.group.clone()), None)?;
    let limit = p.limit.unwrap_or(100).clamp(1, 1000);
    // One more than asked says whether another page follows.
    let mut dead = bus.dead_letters(&p.group, p.after, limit + 1)?;
    let next = more_than(&mut dead, limit as usize).then(|| dead.last().map(|d| d.message.id));
    let dead = dead
        .into_iter()
        .map(|d| {
            let payload = Bytes::of(&d.message.payload);
            DeadLetter {
                message_id: d.message.id,
                topic: d.message.topic,
                attempts: d.attempts,
                last_error: d.last_error,
                dead_at_ms: d.dead_at_ms,
                payload: payload.text,
                payload_base64: payload.base64,
            }
        })
        .collect();
    Ok(DeadLetters {
        group: p.group,
        dead,
        next: next.flatten(),
    })
}

/// Sends a consumer group's dead letters back to the queue (whoever may consume the group may).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RedriveParams {
    /// The consumer group.
    pub group: String,
}

/// Dead letters sent back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Redriven {
    /// The consumer group.
    pub group: String,
    /// How many.
    pub redriven: u64,
}

pub(super) fn redrive(g: &Session<'_>, p: RedriveParams) -> Result<Redriven, ServiceError> {
    let bus = bus(g)?;
    g.allow(Action::Consume, Resource::Topic(p.group.clone()), None)?;
    let n = bus.redrive(&p.group)?;
    Ok(Redriven {
        group: p.group,
        redriven: n,
    })
}

no_params! {
    /// Depth, leases and dead letters per topic and consumer group.
    StatsParams;
}

/// The queue's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Stats {
    /// Per topic.
    pub topics: Vec<TopicMetrics>,
}

/// Depth, leases and dead letters per topic and group: a read of the environment.
pub(super) fn stats(g: &Session<'_>, _: StatsParams) -> Result<Stats, ServiceError> {
    let bus = bus(g)?;
    g.allow(Action::Read, Resource::Environment, Some("queue.stats"))?;
    Ok(Stats {
        topics: bus.metrics()?,
    })
}

/// The leases in flight, for a board of the queue: who holds which message, on which attempt,
/// until when. Whoever may consume the group reads its leases; all groups' are a read of the
/// environment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LeasesParams {
    /// The consumer group (default: every group).
    #[serde(default)]
    pub group: Option<String>,
    /// At most this many (default 100, at most 1000).
    #[serde(default)]
    pub limit: Option<u32>,
    /// The page after this delivery (the `next` of the previous page).
    #[serde(default)]
    pub after: Option<i64>,
}

/// Leases in flight.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Leases {
    /// In delivery order.
    pub leases: Vec<LeaseInFlight>,
    /// Where the next page starts (`after`), when more follow.
    #[serde(default)]
    pub next: Option<i64>,
}

pub(super) fn leases(g: &Session<'_>, p: LeasesParams) -> Result<Leases, ServiceError> {
    let bus = bus(g)?;
    match &p.group {
        Some(group) => g.allow(Action::Consume, Resource::Topic(group.clone()), None)?,
        None => g.allow(Action::Read, Resource::Environment, Some("queue.leases"))?,
    }
    let limit = p.limit.unwrap_or(100).clamp(1, 1000);
    let mut leases = bus.leases(p.group.as_deref(), p.after, limit + 1)?;
    let next = more_than(&mut leases, limit as usize).then(|| leases.last().map(|l| l.delivery));
    Ok(Leases {
        leases,
        next: next.flatten(),
    })
}
