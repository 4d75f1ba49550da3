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

pub(super) fn settle(g: &Session<'_>, p: SettleParams, ack: bool) -> Result<Value, ServiceError> {
    let bus = bus(g)?;
    if ack && (p.delay_ms.is_some() || p.error.is_some()) {
        return Err(ServiceError::invalid(
            "`delay_ms` and `error` are for queue.nack",
        ));
    }
    let Some(claimed) = lock(&g.shared().receipts).get(&p.receipt).cloned() else {
        return Err(ServiceError::new(
            ErrorKind::NotFound,
            "unknown receipt: it was not handed out by queue.claim in this workspace, or it was \
             settled already",
            "settle the receipts your own claims hand you, once each.",
        ));
    };
    g.allow(Action::Consume, Resource::Topic(claimed.group), None)?;
    let receipt: Receipt = p.receipt.parse().map_err(ServiceError::from)?;
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
