//! Conditions: a small closed language (no loops) that narrows when a rule applies.

use std::collections::BTreeMap;
use std::fmt;

use environment_core::{AttrValue, Context, Risk};

use crate::glob::Glob;

/// A daily window in UTC, `HH:MM-HH:MM`; a window whose end is before its start wraps midnight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimeWindow {
    /// Minutes after midnight when the window opens.
    pub start_min: u16,
    /// Minutes after midnight when it closes (exclusive).
    pub end_min: u16,
}

impl TimeWindow {
    /// Parses `HH:MM-HH:MM`.
    pub fn parse(s: &str) -> Option<TimeWindow> {
        let (a, b) = s.split_once('-')?;
        let m = |t: &str| -> Option<u16> {
            let (h, m) = t.trim().split_once(':')?;
            let (h, m): (u16, u16) = (h.parse().ok()?, m.parse().ok()?);
            (h <= 24 && m < 60 && h * 60 + m <= 1440).then_some(h * 60 + m)
        };
        Some(TimeWindow {
            start_min: m(a)?,
            end_min: m(b)?,
        })
    }

    /// Whether the instant `now_ms` (Unix milliseconds) falls inside.
    pub fn contains(&self, now_ms: i64) -> bool {
        let minute = now_ms.div_euclid(60_000).rem_euclid(1440);
        let (s, e) = (i64::from(self.start_min), i64::from(self.end_min));
        if s <= e {
            s <= minute && minute < e
        } else {
            minute >= s || minute < e
        }
    }
}

impl fmt::Display for TimeWindow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:02}:{:02}-{:02}:{:02}",
            self.start_min / 60,
            self.start_min % 60,
            self.end_min / 60,
            self.end_min % 60
        )
    }
}

/// At most `count` allowed uses per actor in each fixed window of `window_secs`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quota {
    /// Allowed uses per window.
    pub count: u32,
    /// The window's length in seconds.
    pub window_secs: u64,
}

impl Quota {
    /// The window an instant falls in (its start, in ms).
    pub fn window_start(&self, now_ms: i64) -> i64 {
        let len = i64::try_from(self.window_secs.saturating_mul(1000))
            .unwrap_or(i64::MAX)
            .max(1);
        now_ms.div_euclid(len) * len
    }
}

/// The conditions of one rule; all must hold for the rule to apply.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Conditions {
    /// Only within this daily window (UTC).
    pub hours: Option<TimeWindow>,
    /// Only when the request's branch matches.
    pub branch: Option<Glob>,
    /// Only while the actor has uses left in the current window (permits only).
    pub quota: Option<Quota>,
    /// Only when the request's risk is at most this.
    pub risk_max: Option<Risk>,
    /// Only when the request's risk is at least this.
    pub risk_min: Option<Risk>,
    /// A permit that needs approval from one of these actors or groups first.
    pub approval_from: Vec<String>,
    /// Only when each context attribute equals the given value.
    pub attrs: BTreeMap<String, AttrValue>,
}

impl Conditions {
    /// Whether there is no condition at all.
    pub fn is_empty(&self) -> bool {
        *self == Conditions::default()
    }

    /// Whether the conditions that depend only on the request and the time hold (quota and
    /// approval are the engine's, since they need state).
    #[inline]
    pub(crate) fn hold(&self, ctx: &Context, now: &mut impl FnMut() -> i64) -> bool {
        if let Some(max) = self.risk_max
            && ctx.risk > max
        {
            return false;
        }
        if let Some(min) = self.risk_min
            && ctx.risk < min
        {
            return false;
        }
        if let Some(g) = &self.branch {
            match &ctx.branch {
                Some(b) if g.matches(b.as_bytes()) => {}
                _ => return false,
            }
        }
        if let Some(w) = &self.hours
            && !w.contains(now())
        {
            return false;
        }
        self.attrs.iter().all(|(k, v)| ctx.attrs.get(k) == Some(v))
    }

    /// A short rendering for explanations and reverse queries (`branch main, risk ≤ low`).
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(w) = &self.hours {
            parts.push(format!("between {w} UTC"));
        }
        if let Some(b) = &self.branch {
            parts.push(format!("on branch `{b}`"));
        }
        if let Some(q) = &self.quota {
            parts.push(format!("at most {} per {}s", q.count, q.window_secs));
        }
        if let Some(r) = &self.risk_max {
            parts.push(format!("risk at most {}", risk_name(*r)));
        }
        if let Some(r) = &self.risk_min {
            parts.push(format!("risk at least {}", risk_name(*r)));
        }
        if !self.approval_from.is_empty() {
            parts.push(format!(
                "after approval by {}",
                self.approval_from.join(" or ")
            ));
        }
        for (k, v) in &self.attrs {
            parts.push(format!("{k} = {}", attr_text(v)));
        }
        parts.join(", ")
    }
}

/// The name a rule file uses for a risk level.
pub fn risk_name(r: Risk) -> &'static str {
    match r {
        Risk::Low => "low",
        Risk::Medium => "medium",
        Risk::High => "high",
    }
}

/// The risk level with this name.
pub fn parse_risk(s: &str) -> Option<Risk> {
    match s {
        "low" => Some(Risk::Low),
        "medium" => Some(Risk::Medium),
        "high" => Some(Risk::High),
        _ => None,
    }
}

pub(crate) fn attr_text(v: &AttrValue) -> String {
    match v {
        AttrValue::Bool(b) => b.to_string(),
        AttrValue::Int(i) => i.to_string(),
        AttrValue::Str(s) => format!("{s:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows() {
        let w = TimeWindow::parse("09:00-17:00").unwrap();
        let h = |h: i64| h * 3_600_000;
        assert!(w.contains(h(9)));
        assert!(!w.contains(h(17)));
        let night = TimeWindow::parse("22:00-06:00").unwrap();
        assert!(night.contains(h(23)) && night.contains(h(24 + 5)) && !night.contains(h(12)));
        assert_eq!(night.to_string(), "22:00-06:00");
        assert!(TimeWindow::parse("25:00-01:00").is_none());
    }
}
