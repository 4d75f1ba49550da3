//! What the queue accepts: names, texts, sizes and durations, checked before anything reaches
//! storage, so a refusal changes nothing. Every store of the queue (this bus, a queue shared on
//! a server) applies these same rules, so a caller meets the same refusals whichever keeps it.

use std::time::Duration;

use crate::bus::DeliveryStatus;
use crate::error::{BusError, Result};
use crate::types::{Limits, NewMessage, Receipt};

const NAME_RULE: &str = "1..=200 characters from [A-Za-z0-9._:/-]";

/// Longest ordering key, dedup id or header.
const MAX_TAG: usize = 512;
/// Longest nack error or terminate reason.
const MAX_REASON: usize = 4096;
/// Most attempts a group may allow.
const MAX_ATTEMPTS: u32 = 10_000;

/// How a receipt's holder settles its lease, its durations checked (see [`check_nack`],
/// [`check_lease`], [`check_reason`]): what every store of the queue applies.
#[derive(Debug, Clone)]
pub enum Settle {
    /// Handled: not delivered again.
    Ack,
    /// Given back, after `delay_ms` (the backoff when `None`), keeping `error`.
    Nack {
        /// The delay in milliseconds.
        delay_ms: Option<i64>,
        /// Why the work failed.
        error: Option<String>,
    },
    /// The lease runs `lease_ms` from now.
    Extend {
        /// The lease in milliseconds.
        lease_ms: i64,
    },
    /// Straight to the dead letters.
    Terminate {
        /// Why.
        reason: String,
    },
}

/// Milliseconds of a duration, saturating.
pub fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Topic, group and consumer names.
pub fn check_name(what: &'static str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 200
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(BusError::InvalidName {
            what,
            value: name.chars().take(200).collect(),
            rule: NAME_RULE,
        })
    }
}

/// Free text that is stored and indexed: keys, dedup ids, headers, errors.
pub fn check_text(what: &'static str, text: &str, max: usize) -> Result<()> {
    if text.is_empty() || text.len() > max || text.chars().any(char::is_control) {
        return Err(BusError::InvalidName {
            what,
            value: text.chars().take(200).collect(),
            rule: "non-empty, no control characters, within the length limit",
        });
    }
    Ok(())
}

/// A duration within `min..=max`, in milliseconds.
pub fn check_range(what: &'static str, d: Duration, min: Duration, max: Duration) -> Result<i64> {
    if d < min || d > max {
        return Err(BusError::OutOfRange {
            what,
            value: d.as_millis(),
            min: min.as_millis(),
            max: max.as_millis(),
        });
    }
    Ok(ms(d))
}

/// A message to publish: its topic, payload size, key, dedup id, window, delay and headers.
pub fn check_message(m: &NewMessage, limits: &Limits) -> Result<()> {
    check_name("topic", &m.topic)?;
    if m.payload.len() > limits.max_payload_bytes {
        return Err(BusError::PayloadTooLarge {
            size: m.payload.len(),
            limit: limits.max_payload_bytes,
        });
    }
    let o = &m.options;
    if let Some(k) = &o.ordering_key {
        check_text("ordering key", k, MAX_TAG)?;
    }
    if let Some(d) = &o.dedup_id {
        check_text("dedup id", d, MAX_TAG)?;
    }
    if let Some(w) = o.dedup_window {
        check_range(
            "dedup window",
            w,
            Duration::from_millis(1),
            limits.max_dedup_window,
        )?;
    }
    if let Some(d) = o.delay {
        check_range("delay", d, Duration::ZERO, limits.max_delay)?;
    }
    let h = &o.headers;
    for (what, v) in [
        ("actor header", &h.actor),
        ("correlation id header", &h.correlation_id),
        ("causing op header", &h.causing_op),
    ] {
        if let Some(v) = v {
            check_text(what, v, MAX_TAG)?;
        }
    }
    Ok(())
}

/// A claim of up to `max` messages of `group` by `consumer` for `lease`; returns the lease in
/// milliseconds.
pub fn check_claim(
    limits: &Limits,
    group: &str,
    consumer: &str,
    max: u32,
    lease: Duration,
) -> Result<i64> {
    check_name("consumer", consumer)?;
    if max == 0 || max > limits.max_claim {
        return Err(BusError::OutOfRange {
            what: "claim size",
            value: u128::from(max),
            min: 1,
            max: u128::from(limits.max_claim),
        });
    }
    let lease_ms = check_lease(limits, lease)?;
    check_name("group", group)?;
    Ok(lease_ms)
}

/// A lease's length (a claim's or an extension's), in milliseconds.
pub fn check_lease(limits: &Limits, lease: Duration) -> Result<i64> {
    check_range("lease", lease, Duration::from_millis(1), limits.max_lease)
}

/// A nack's delay (in milliseconds, `None` for the backoff) and error.
pub fn check_nack(
    limits: &Limits,
    delay: Option<Duration>,
    error: Option<&str>,
) -> Result<Option<i64>> {
    let delay_ms = delay
        .map(|d| check_range("delay", d, Duration::ZERO, limits.max_delay))
        .transpose()?;
    if let Some(e) = error {
        check_text("error", e, MAX_REASON)?;
    }
    Ok(delay_ms)
}

/// A terminate's reason.
pub fn check_reason(reason: &str) -> Result<()> {
    check_text("reason", reason, MAX_REASON)
}

/// A group to create: its name, most attempts and topics.
pub fn check_group<'a>(
    group: &str,
    max_attempts: u32,
    topics: impl IntoIterator<Item = &'a str>,
) -> Result<()> {
    check_name("group", group)?;
    if max_attempts == 0 || max_attempts > MAX_ATTEMPTS {
        return Err(BusError::OutOfRange {
            what: "max_attempts",
            value: u128::from(max_attempts),
            min: 1,
            max: u128::from(MAX_ATTEMPTS),
        });
    }
    for t in topics {
        check_name("topic", t)?;
    }
    Ok(())
}

/// A receipt against the delivery it names, as a store found it (`None`: no such delivery;
/// `lease` reads its state and lease token): it settles or extends only a delivery leased now
/// under its token. Returns what was found.
pub fn leased<T>(
    receipt: &Receipt,
    found: Option<T>,
    lease: impl FnOnce(&T) -> (i64, Option<i64>),
) -> Result<T> {
    let Some(row) = found else {
        return Err(BusError::UnknownReceipt {
            receipt: receipt.to_string(),
        });
    };
    let (state, token) = lease(&row);
    if state != i64::from(DeliveryStatus::Leased.code()) || token != Some(receipt.token()) {
        return Err(BusError::StaleReceipt { receipt: *receipt });
    }
    Ok(row)
}
