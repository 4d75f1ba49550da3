//! The values that cross the bus's API.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::BusError;

/// A message's id: its position in the bus's log of publishes (increasing in publish order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageId(pub i64);

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Proof of one claim of one delivery. A new receipt is issued on every claim, so a consumer
/// whose lease expired and was claimed by another cannot ack, nack or extend any more.
///
/// The text form (`Display`/`FromStr`) lets a receipt travel to another process.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Receipt {
    pub(crate) delivery: i64,
    pub(crate) token: i64,
}

impl Receipt {
    /// The receipt of `delivery` under the claim's random `token`: for stores of the queue
    /// that keep deliveries elsewhere and hand out the same receipts.
    pub fn new(delivery: i64, token: i64) -> Receipt {
        Receipt { delivery, token }
    }

    /// The delivery it names.
    pub fn delivery(&self) -> i64 {
        self.delivery
    }

    /// The token of the claim that handed it out.
    pub fn token(&self) -> i64 {
        self.token
    }
}

impl fmt::Display for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The token is random; it is printed as unsigned hex so receipts never start with '-'.
        write!(f, "{}.{:016x}", self.delivery, self.token as u64)
    }
}

impl fmt::Debug for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Receipt({self})")
    }
}

impl FromStr for Receipt {
    type Err = BusError;
    fn from_str(s: &str) -> Result<Receipt, BusError> {
        let bad = || BusError::UnknownReceipt {
            receipt: s.chars().take(200).collect(),
        };
        let (d, t) = s.split_once('.').ok_or_else(bad)?;
        if d.is_empty() || !d.bytes().all(|b| b.is_ascii_digit()) || t.len() != 16 {
            return Err(bad());
        }
        let delivery: i64 = d.parse().map_err(|_| bad())?;
        let token = u64::from_str_radix(t, 16).map_err(|_| bad())? as i64;
        Ok(Receipt { delivery, token })
    }
}

/// Who and what a message is about; stored with the message and returned with every lease.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers {
    /// The actor that published it.
    pub actor: Option<String>,
    /// Ties together the messages of one piece of work (a task's id, say).
    pub correlation_id: Option<String>,
    /// The environment operation that caused it.
    pub causing_op: Option<String>,
}

/// How to publish one message.
#[derive(Clone, Debug, Default)]
pub struct PublishOptions {
    /// Messages with the same key are delivered in publish order, one at a time per group.
    pub ordering_key: Option<String>,
    /// A second publish with the same id to the same topic within the dedup window is accepted
    /// and not delivered again, even if the first was acked meanwhile.
    pub dedup_id: Option<String>,
    /// The dedup window; `None` means [`BusConfig::dedup_window`](crate::BusConfig::dedup_window).
    pub dedup_window: Option<Duration>,
    /// Not deliverable before this much time has passed.
    pub delay: Option<Duration>,
    /// Actor, correlation id, causing op.
    pub headers: Headers,
}

impl PublishOptions {
    /// Sets the ordering key.
    pub fn ordering_key(mut self, key: impl Into<String>) -> Self {
        self.ordering_key = Some(key.into());
        self
    }
    /// Sets the dedup id.
    pub fn dedup_id(mut self, id: impl Into<String>) -> Self {
        self.dedup_id = Some(id.into());
        self
    }
    /// Sets the dedup window of this publish.
    pub fn dedup_window(mut self, window: Duration) -> Self {
        self.dedup_window = Some(window);
        self
    }
    /// Sets the delay.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }
    /// Sets the headers.
    pub fn headers(mut self, headers: Headers) -> Self {
        self.headers = headers;
        self
    }
}

/// One message of a batch publish.
#[derive(Clone, Debug)]
pub struct NewMessage {
    /// The topic.
    pub topic: String,
    /// The body; opaque to the bus.
    pub payload: Vec<u8>,
    /// Key, dedup, delay, headers.
    pub options: PublishOptions,
}

impl NewMessage {
    /// A message with default options.
    pub fn new(topic: impl Into<String>, payload: impl Into<Vec<u8>>) -> NewMessage {
        NewMessage {
            topic: topic.into(),
            payload: payload.into(),
            options: PublishOptions::default(),
        }
    }
    /// Replaces the options.
    pub fn with(mut self, options: PublishOptions) -> NewMessage {
        self.options = options;
        self
    }
}

/// The outcome of one publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Published {
    /// The message's id (for a duplicate: the id of the message it duplicates).
    pub id: MessageId,
    /// Whether the publish was a duplicate within the dedup window and so not delivered again.
    pub duplicate: bool,
}

/// A message as delivered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Its id.
    pub id: MessageId,
    /// Its topic.
    pub topic: String,
    /// Its body.
    pub payload: Vec<u8>,
    /// Its ordering key.
    pub ordering_key: Option<String>,
    /// Its dedup id.
    pub dedup_id: Option<String>,
    /// Its headers.
    pub headers: Headers,
    /// When it was published (clock milliseconds).
    pub published_at_ms: i64,
}

/// A claimed delivery: the message is the holder's until `lease_until_ms` (inclusive) or until
/// it is settled with the receipt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The proof of this claim.
    pub receipt: Receipt,
    /// The consumer group.
    pub group: String,
    /// The message.
    pub message: Message,
    /// Which attempt this is, from 1.
    pub attempt: u32,
    /// The lease holds while the clock reads at most this.
    pub lease_until_ms: i64,
}

/// Why a message is a dead letter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadCause {
    /// It was attempted `max_attempts` times without an ack.
    MaxAttempts,
    /// A consumer terminated it as poison.
    Terminated,
}

/// A message a group gave up on, kept until redriven.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    /// The group.
    pub group: String,
    /// The message.
    pub message: Message,
    /// How many times it was claimed.
    pub attempts: u32,
    /// The last error reported (a nack's error, a terminate's reason, or "lease expired").
    pub last_error: Option<String>,
    /// Why it died.
    pub cause: DeadCause,
    /// When it died (clock milliseconds).
    pub dead_at_ms: i64,
}

/// Retry delays after a bare nack: exponential from `base`, capped at `max`, with "equal
/// jitter" — a random point in the upper half, so a nack is never instant and retries of many
/// consumers do not synchronise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first attempt.
    pub base: Duration,
    /// The cap.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Backoff {
        Backoff {
            base: Duration::from_secs(1),
            max: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// The range (milliseconds, inclusive) the delay after attempt `attempt` (from 1) is drawn
    /// from.
    pub fn bounds_ms(&self, attempt: u32) -> (i64, i64) {
        let base = i64::try_from(self.base.as_millis())
            .unwrap_or(i64::MAX)
            .max(2);
        let max = i64::try_from(self.max.as_millis())
            .unwrap_or(i64::MAX)
            .max(base);
        let shift = attempt.saturating_sub(1).min(40);
        let full = base.saturating_mul(1i64 << shift).min(max);
        (full - full / 2, full)
    }
}

/// Settings of a consumer group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupOptions {
    /// After this many claims without an ack the message becomes a dead letter.
    pub max_attempts: u32,
}

impl Default for GroupOptions {
    fn default() -> GroupOptions {
        GroupOptions { max_attempts: 5 }
    }
}

/// Bounds on what callers may ask for; anything outside is refused with a typed error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload.
    pub max_payload_bytes: usize,
    /// Longest lease (claim or extend).
    pub max_lease: Duration,
    /// Longest publish or nack delay.
    pub max_delay: Duration,
    /// Longest dedup window.
    pub max_dedup_window: Duration,
    /// Most messages in one batch publish.
    pub max_batch: usize,
    /// Most messages in one claim.
    pub max_claim: u32,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_payload_bytes: 256 * 1024,
            max_lease: Duration::from_secs(12 * 3600),
            max_delay: Duration::from_secs(15 * 24 * 3600),
            max_dedup_window: Duration::from_secs(30 * 24 * 3600),
            max_batch: 10_000,
            max_claim: 1_000,
        }
    }
}

pub use environment_core::queue::{GroupMetrics, TopicMetrics};

/// What one purge pass removed: the queue port's own figures.
pub use environment_core::queue::Purged as PurgeReport;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_never_instant_and_capped() {
        let b = Backoff::default();
        assert_eq!(b.bounds_ms(1), (500, 1000));
        assert_eq!(b.bounds_ms(2), (1000, 2000));
        assert_eq!(b.bounds_ms(100), (150_000, 300_000));
        let tiny = Backoff {
            base: Duration::ZERO,
            max: Duration::ZERO,
        };
        assert!(tiny.bounds_ms(1).0 >= 1);
    }

    #[test]
    fn receipt_text_round_trips() {
        let r = Receipt {
            delivery: 42,
            token: -5,
        };
        let back: Receipt = r.to_string().parse().unwrap();
        assert_eq!(back, r);
        assert!("42".parse::<Receipt>().is_err());
        assert!("-1.0000000000000000".parse::<Receipt>().is_err());
        assert!("1.zz00000000000000".parse::<Receipt>().is_err());
    }
}

/// Who holds a lease (see [`crate::Bus::lease_holder`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseHolder {
    /// The consumer group the message was claimed from.
    pub group: String,
    /// The consumer that claimed it.
    pub consumer: String,
}
