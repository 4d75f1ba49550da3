//! The queue methods: publish, claim, ack, nack — the bus, through the session's authorization. The
//! publisher header is the connection's actor, and settling is authorized on the consumer group
//! a receipt was claimed from, not on what the caller says.

use std::time::Duration;

use environment_bus::{Headers, PublishOptions, Receipt};
use environment_core::{Action, ErrorKind, Resource};
use serde::Deserialize;
use serde_json::{Value, json};

use super::commands::bytes_json;
use super::error::ServiceError;
use super::session::Session;
use super::workspace::{Claimed, lock};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PublishParams {
    topic: String,
    payload: String,
    #[serde(default)]
    ordering_key: Option<String>,
    #[serde(default)]
    dedup_id: Option<String>,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    correlation_id: Option<String>,
}

pub(super) fn bus<'a>(g: &'a Session<'_>) -> Result<&'a environment_bus::Bus, ServiceError> {
    g.shared()
        .bus
        .as_ref()
        .ok_or_else(|| ServiceError::unavailable("the queue"))
}

pub(super) fn publish(g: &Session<'_>, p: PublishParams) -> Result<Value, ServiceError> {
    let bus = bus(g)?;
    g.allow(Action::Publish, Resource::Topic(p.topic.clone()), None)?;
    let mut opts = PublishOptions::default().headers(Headers {
        // Who published is the workspace's to say, not the caller's.
        actor: Some(g.shared().actor.to_string()),
        correlation_id: p.correlation_id,
        causing_op: None,
    });
    opts.ordering_key = p.ordering_key;
    opts.dedup_id = p.dedup_id;
    opts.delay = p.delay_ms.map(Duration::from_millis);
    let published = bus
        .publish_creating(&p.topic, p.payload.into_bytes(), opts)
        .wait()
        .map_err(ServiceError::from)?;
    Ok(json!({ "id": published.id.0, "duplicate": published.duplicate }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ClaimParams {
    group: String,
    #[serde(default)]
    consumer: Option<String>,
    #[serde(default)]
    max: Option<u32>,
    #[serde(default)]
    lease_ms: Option<u64>,
}

pub(super) fn claim(g: &Session<'_>, p: ClaimParams) -> Result<Value, ServiceError> {
    let bus = bus(g)?;
    g.allow(Action::Consume, Resource::Topic(p.group.clone()), None)?;
    let consumer = p.consumer.unwrap_or_else(|| g.shared().actor.to_string());
    let leases = bus
        .claim(
            &p.group,
            &consumer,
            p.max.unwrap_or(1),
            Duration::from_millis(p.lease_ms.unwrap_or(30_000)),
        )
        .wait()
        .map_err(ServiceError::from)?;
    let mut receipts = lock(&g.shared().receipts);
    let out: Vec<Value> = leases
        .iter()
        .map(|l| {
            let receipt = l.receipt.to_string();
            let claimed = Claimed {
                group: l.group.clone(),
                consumer: consumer.clone(),
            };
            receipts.insert(receipt.clone(), claimed);
            let (payload, base64) = bytes_json(&l.message.payload);
            json!({
                "receipt": receipt,
                "group": l.group,
                "topic": l.message.topic,
                "message_id": l.message.id.0,
                "payload": payload,
                "payload_base64": base64,
                "ordering_key": l.message.ordering_key,
                "correlation_id": l.message.headers.correlation_id,
                "publisher": l.message.headers.actor,
                "attempt": l.attempt,
                "lease_until_ms": l.lease_until_ms,
            })
        })
        .collect();
    Ok(json!({ "leases": out }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SettleParams {
    receipt: String,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    error: Option<String>,
}

/// Who may settle `receipt`, decided: the consumer group it was claimed from (the caller must
/// be allowed to consume it) and its holder (a receipt this workspace handed out keeps the
/// consumer named in its claim; one claimed elsewhere must be held by the caller's own
/// consumer). An unknown receipt is not found; a settled or lapsed one is a conflict.
fn holder(g: &Session<'_>, receipt: &str) -> Result<(Receipt, Claimed), ServiceError> {
    let bus = bus(g)?;
    let parsed: Receipt = receipt.parse().map_err(ServiceError::from)?;
    let held = bus.lease_holder(&parsed).map_err(ServiceError::from)?;
    let claimed = match lock(&g.shared().receipts).get(receipt).cloned() {
        Some(c) => c,
        None if held.consumer == g.shared().actor.as_str() => Claimed {
            group: held.group.clone(),
            consumer: held.consumer.clone(),
        },
        None => {
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
    Ok((parsed, claimed))
}

pub(super) fn settle(g: &Session<'_>, p: SettleParams, ack: bool) -> Result<Value, ServiceError> {
    let bus = bus(g)?;
    if ack && (p.delay_ms.is_some() || p.error.is_some()) {
        return Err(ServiceError::invalid(
            "`delay_ms` and `error` are for queue.nack",
        ));
    }
    let (receipt, claimed) = holder(g, &p.receipt)?;
    let pending = if ack {
        bus.ack_as(&claimed.consumer, &receipt)
    } else {
        bus.nack_as(
            &claimed.consumer,
            &receipt,
            p.delay_ms.map(Duration::from_millis),
            p.error.as_deref(),
        )
    };
    pending.wait().map_err(ServiceError::from)?;
    lock(&g.shared().receipts).remove(&p.receipt);
    Ok(json!({ "receipt": p.receipt, "settled": if ack { "ack" } else { "nack" } }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExtendParams {
    receipt: String,
    lease_ms: u64,
}

/// Extends a lease the caller holds, so long work is not handed to another consumer.
pub(super) fn extend(g: &Session<'_>, p: ExtendParams) -> Result<Value, ServiceError> {
    let bus = bus(g)?;
    let (receipt, _) = holder(g, &p.receipt)?;
    bus.extend(&receipt, Duration::from_millis(p.lease_ms))
        .wait()
        .map_err(ServiceError::from)?;
    Ok(json!({ "receipt": p.receipt, "lease_ms": p.lease_ms }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SubscribeParams {
    group: String,
    topics: Vec<String>,
}

/// Subscribes a consumer group to topics (creating both): a consume of each topic and of the
/// group, as claiming from it will be.
pub(super) fn subscribe(g: &Session<'_>, p: SubscribeParams) -> Result<Value, ServiceError> {
    let bus = bus(g)?;
    if p.topics.is_empty() {
        return Err(ServiceError::invalid("`topics` is empty"));
    }
    for t in p.topics.iter().chain(std::iter::once(&p.group)) {
        g.allow(Action::Consume, Resource::Topic(t.clone()), None)?;
    }
    for t in &p.topics {
        bus.create_topic(t).wait().map_err(ServiceError::from)?;
    }
    let names: Vec<&str> = p.topics.iter().map(String::as_str).collect();
    bus.create_group(&p.group, &names, environment_bus::GroupOptions::default())
        .wait()
        .map_err(ServiceError::from)?;
    Ok(json!({ "group": p.group, "topics": p.topics }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GroupParams {
    group: String,
    #[serde(default)]
    limit: Option<u32>,
}

/// A group's dead letters, oldest first: read by whoever may consume the group.
pub(super) fn dead_letters(g: &Session<'_>, p: GroupParams) -> Result<Value, ServiceError> {
    let bus = bus(g)?;
    g.allow(Action::Consume, Resource::Topic(p.group.clone()), None)?;
    let dead = bus
        .dead_letters(&p.group, p.limit.unwrap_or(100).clamp(1, 1000))
        .map_err(ServiceError::from)?;
    Ok(json!({
        "group": p.group,
        "dead": dead.iter().map(|d| {
            let (payload, base64) = bytes_json(&d.message.payload);
            json!({
                "message_id": d.message.id.0,
                "topic": d.message.topic,
                "attempts": d.attempts,
                "last_error": d.last_error,
                "dead_at_ms": d.dead_at_ms,
                "payload": payload,
                "payload_base64": base64,
            })
        }).collect::<Vec<_>>(),
    }))
}

/// Sends a group's dead letters back to the queue (whoever may consume the group may).
pub(super) fn redrive(g: &Session<'_>, p: GroupParams) -> Result<Value, ServiceError> {
    let bus = bus(g)?;
    if p.limit.is_some() {
        return Err(ServiceError::invalid("queue.redrive takes only `group`"));
    }
    g.allow(Action::Consume, Resource::Topic(p.group.clone()), None)?;
    let n = bus
        .redrive(&p.group, None)
        .wait()
        .map_err(ServiceError::from)?;
    Ok(json!({ "group": p.group, "redriven": n }))
}

/// Depth, leases and dead letters per topic and group: a read of the environment.
pub(super) fn stats(g: &Session<'_>) -> Result<Value, ServiceError> {
    let bus = bus(g)?;
    g.allow(Action::Read, Resource::Environment, Some("queue.stats"))?;
    let m = bus.metrics().map_err(ServiceError::from)?;
    Ok(json!({ "topics": m.iter().map(|t| json!({
        "topic": t.topic,
        "retained": t.retained,
        "groups": t.groups.iter().map(|g| json!({
            "group": g.group,
            "depth": g.depth,
            "in_flight": g.in_flight,
            "oldest_age_ms": g.oldest_age_ms,
            "dead_letters": g.dead_letters,
            "redeliveries": g.redeliveries,
        })).collect::<Vec<_>>(),
    })).collect::<Vec<_>>() }))
}
