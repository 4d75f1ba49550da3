//! The bus behind core's queue port: the workspace service publishes, claims and settles through
//! [`Queue`], in the port's types.

use std::time::Duration;

use environment_core::queue::{
    DeadLetter, Holder, Lease, LeaseInFlight, Message, Posted, Publish, Purged, Settlement,
    TopicMetrics,
};
use environment_core::{ErrorKind, PortError, Queue};

use crate::bus::Bus;
use crate::error::BusError;
use crate::types::{self, GroupOptions, Headers, MessageId, NewMessage, PublishOptions, Receipt};

impl Queue for Bus {
    fn publish(&self, topic: &str, payload: Vec<u8>, o: Publish) -> Result<Posted, PortError> {
        let m = NewMessage::from_port(topic, payload, o);
        let p = self
            .publish_creating(&m.topic, m.payload, m.options)
            .wait()?;
        Ok(Posted {
            id: p.id.0,
            duplicate: p.duplicate,
        })
    }

    fn claim(
        &self,
        group: &str,
        consumer: &str,
        max: u32,
        lease: Duration,
    ) -> Result<Vec<Lease>, PortError> {
        Ok(leases(
            Bus::claim(self, group, consumer, max, lease).wait()?,
        ))
    }

    fn ack_and_claim(
        &self,
        consumer: &str,
        receipt: &str,
        group: &str,
        max: u32,
        lease: Duration,
    ) -> Result<Vec<Lease>, PortError> {
        let receipt: Receipt = receipt.parse()?;
        let next = Bus::ack_and_claim(self, consumer, &receipt, group, max, lease).wait()?;
        Ok(leases(next))
    }

    fn holder(&self, receipt: &str) -> Result<Holder, PortError> {
        let held = self.lease_holder(&receipt.parse::<Receipt>()?)?;
        Ok(Holder {
            group: held.group,
            consumer: held.consumer,
        })
    }

    fn settle(&self, consumer: &str, receipt: &str, how: Settlement) -> Result<(), PortError> {
        let receipt: Receipt = receipt.parse()?;
        let pending = match how {
            Settlement::Ack => self.ack_as(consumer, &receipt),
            Settlement::Nack { delay, error } => {
                self.nack_as(consumer, &receipt, delay, error.as_deref())
            }
        };
        Ok(pending.wait()?)
    }

    fn extend(&self, receipt: &str, lease: Duration) -> Result<(), PortError> {
        Ok(Bus::extend(self, &receipt.parse()?, lease).wait()?)
    }

    fn subscribe(&self, group: &str, topics: &[String]) -> Result<(), PortError> {
        for t in topics {
            self.create_topic(t).wait()?;
        }
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        Ok(self
            .create_group(group, &names, GroupOptions::default())
            .wait()?)
    }

    fn leases(
        &self,
        group: Option<&str>,
        after: Option<i64>,
        limit: u32,
    ) -> Result<Vec<LeaseInFlight>, PortError> {
        Ok(Bus::leases(self, group, after, limit)?)
    }

    fn dead_letters(
        &self,
        group: &str,
        after: Option<i64>,
        limit: u32,
    ) -> Result<Vec<DeadLetter>, PortError> {
        let dead = self.dead_letters_after(group, after.map(MessageId), limit)?;
        Ok(dead
            .into_iter()
            .map(|d| DeadLetter {
                message: message(d.message),
                attempts: d.attempts,
                last_error: d.last_error,
                dead_at_ms: d.dead_at_ms,
            })
            .collect())
    }

    fn redrive(&self, group: &str) -> Result<u64, PortError> {
        Ok(Bus::redrive(self, group, None).wait()?)
    }

    fn metrics(&self) -> Result<Vec<TopicMetrics>, PortError> {
        Ok(Bus::metrics(self)?)
    }

    fn purge(&self) -> Result<Purged, PortError> {
        Ok(Bus::purge(self)?)
    }

    fn upkeep_failure(&self) -> Option<PortError> {
        Bus::upkeep_failure(self).map(PortError::from)
    }
}

impl NewMessage {
    /// A message as the port publishes it (the store's dedup window).
    pub fn from_port(topic: &str, payload: Vec<u8>, o: Publish) -> NewMessage {
        let options = PublishOptions {
            ordering_key: o.ordering_key,
            dedup_id: o.dedup_id,
            dedup_window: None,
            delay: o.delay,
            headers: Headers {
                actor: o.publisher,
                correlation_id: o.correlation_id,
                causing_op: None,
            },
        };
        NewMessage {
            topic: topic.to_owned(),
            payload,
            options,
        }
    }
}

fn leases(leases: Vec<types::Lease>) -> Vec<Lease> {
    leases
        .into_iter()
        .map(|l| Lease {
            receipt: l.receipt.to_string(),
            group: l.group,
            message: message(l.message),
            attempt: l.attempt,
            lease_until_ms: l.lease_until_ms,
        })
        .collect()
}

fn message(m: types::Message) -> Message {
    Message {
        id: m.id.0,
        topic: m.topic,
        payload: m.payload,
        ordering_key: m.ordering_key,
        correlation_id: m.headers.correlation_id,
        publisher: m.headers.actor,
    }
}

/// The bus's errors as the port reports them, each with what the caller can do next.
impl From<BusError> for PortError {
    fn from(e: BusError) -> PortError {
        let kind = e.kind();
        let next = match kind {
            ErrorKind::Conflict => "claim again; this lease is no longer yours.",
            ErrorKind::Denied => "settle only the receipts your own claims handed you.",
            ErrorKind::Invalid | ErrorKind::NotFound => {
                "fix the topic, group, receipt or sizes and retry."
            }
            _ => "report the error to a human if it persists.",
        };
        PortError::new(kind, e.to_string(), next)
    }
}
