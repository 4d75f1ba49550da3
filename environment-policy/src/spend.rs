//! Spending what allowed decisions consume: quota uses, approval uses and token uses. A
//! decision only lists its uses ([`Decision::spend`](crate::Decision::spend)); the environment
//! spends them with the action, once nothing else can refuse it, so a refused or conflicting
//! action spends nothing. A spend is all or nothing, checked again against the counters of the
//! moment (another action may have taken the last use since the decision), and durable before
//! it is granted.

use environment_core::Spend;
use environment_core::policy_store::{PolicyRecord, QuotaCount, Uses};

use crate::condition::Quota;
use crate::decision::Reason;
use crate::policy::{Policy, Runtime, lock};
use crate::token::TokenError;

impl Policy {
    /// Spends `uses`, all of them or none: a use no longer available refuses with its reason
    /// (a quota filled or an approval used up since the decision), and so does a store that
    /// cannot record them (fail closed). Counted against every use spent so far by any handle
    /// on the store: a count made on counters that moved in between is made again.
    pub fn spend_uses(&self, uses: &[Spend]) -> Result<(), Reason> {
        if uses.is_empty() {
            return Ok(());
        }
        for _ in 0..SPEND_ATTEMPTS {
            self.refresh().map_err(|_| Reason::Unreadable)?;
            if self.count_uses(uses)? {
                return Ok(());
            }
        }
        Err(Reason::NoPermit)
    }

    /// Counts `uses` on the counters memory holds: `false` when one of them moved in the store.
    fn count_uses(&self, uses: &[Spend]) -> Result<bool, Reason> {
        let now = self.clock.now_ms();
        let mut rt = lock(&self.runtime);
        // Checked and counted in one pass; nothing changes until the store has them all.
        let mut counted = Uses::default();
        let mut approvals = Vec::new();
        for u in uses {
            match u {
                Spend::Quota {
                    rule,
                    actor,
                    count,
                    window_secs,
                } => {
                    let (window, used) = quota_used(&rt, rule, actor, *count, *window_secs, now)?;
                    let key = (rule.clone(), actor.clone());
                    let before = rt.quotas.get(&key).map(|(w, u)| QuotaCount {
                        rule: rule.clone(),
                        actor: actor.clone(),
                        window: *w,
                        used: *u,
                    });
                    let after = QuotaCount {
                        rule: rule.clone(),
                        actor: actor.clone(),
                        window,
                        used: used + 1,
                    };
                    counted.quotas.push((before, after));
                }
                Spend::Approval { id } => {
                    let a = rt.approvals.get(id).and_then(|a| a.used_once(now));
                    let a = a.ok_or(Reason::ApprovalRequired)?;
                    let before = rt.approval_bodies.get(id).cloned().unwrap_or_default();
                    let body = serde_json::to_string(&a).map_err(|_| Reason::NoPermit)?;
                    let record = PolicyRecord {
                        id: id.clone(),
                        body,
                    };
                    counted.approvals.push((before, record));
                    approvals.push(a);
                }
                Spend::TokenUse { tag, max } => {
                    let used = token_used(&rt, tag, *max).map_err(Reason::Token)?;
                    counted.tokens.push((tag.clone(), used, used + 1));
                }
                // A use this build does not know cannot be counted: refused.
                _ => return Err(Reason::UnknownAction),
            }
        }
        let written = lock(&self.store)
            .spend(&counted)
            .map_err(|_| Reason::NoPermit)?;
        if !self.wrote(written) {
            return Ok(false);
        }
        for (_, q) in counted.quotas {
            rt.quotas.insert((q.rule, q.actor), (q.window, q.used));
        }
        for ((_, record), a) in counted.approvals.into_iter().zip(approvals) {
            rt.approval_bodies.insert(record.id, record.body);
            rt.approvals.insert(a.id.clone(), a);
        }
        for (tag, _, used) in counted.tokens {
            rt.token_uses.insert(tag, used);
        }
        Ok(true)
    }
}

/// How many times a spend is counted again on counters read anew before it is refused.
const SPEND_ATTEMPTS: usize = 32;

/// The current window of a quota and how many of its uses `actor` has had in it, or when the
/// next window opens if none is left.
pub(crate) fn quota_used(
    rt: &Runtime,
    rule: &str,
    actor: &str,
    count: u32,
    window_secs: u64,
    now: i64,
) -> Result<(i64, u32), Reason> {
    let window = Quota { count, window_secs }.window_start(now);
    let used = match rt.quotas.get(&(rule.to_owned(), actor.to_owned())) {
        Some((w, u)) if *w == window => *u,
        _ => 0,
    };
    if used >= count {
        let len = i64::try_from(window_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
        return Err(Reason::QuotaExhausted {
            retry_at: window.saturating_add(len),
        });
    }
    Ok((window, used))
}

/// How many uses a token caveat (by its tag) has had, or that it has none left.
pub(crate) fn token_used(rt: &Runtime, tag: &str, max: u32) -> Result<u32, TokenError> {
    let used = rt.token_uses.get(tag).copied().unwrap_or(0);
    if used >= max {
        return Err(TokenError::Exhausted { max });
    }
    Ok(used)
}
