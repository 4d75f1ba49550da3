//! Input validation: everything is checked before a command reaches the writer, so a refusal
//! changes nothing.

use std::time::Duration;

use super::ms;
use crate::error::{BusError, Result};
use crate::types::{Limits, NewMessage};

const NAME_RULE: &str = "1..=200 characters from [A-Za-z0-9._:/-]";

/// Topic, group and consumer names.
pub(crate) fn check_name(what: &'static str, name: &str) -> Result<()> {
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

/// Free text that is stored and indexed: keys, dedup ids, headers.
pub(crate) fn check_text(what: &'static str, text: &str, max: usize) -> Result<()> {
    if text.is_empty() || text.len() > max || text.chars().any(char::is_control) {
        return Err(BusError::InvalidName {
            what,
            value: text.chars().take(200).collect(),
            rule: "non-empty, no control characters, within the length limit",
        });
    }
    Ok(())
}

pub(crate) fn check_range(
    what: &'static str,
    d: Duration,
    min: Duration,
    max: Duration,
) -> Result<i64> {
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

pub(crate) fn check_message(m: &NewMessage, limits: &Limits) -> Result<()> {
    check_name("topic", &m.topic)?;
    if m.payload.len() > limits.max_payload_bytes {
        return Err(BusError::PayloadTooLarge {
            size: m.payload.len(),
            limit: limits.max_payload_bytes,
        });
    }
    let o = &m.options;
    if let Some(k) = &o.ordering_key {
        check_text("ordering key", k, 512)?;
    }
    if let Some(d) = &o.dedup_id {
        check_text("dedup id", d, 512)?;
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
            check_text(what, v, 512)?;
        }
    }
    Ok(())
}
