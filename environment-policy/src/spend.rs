//! Spending what allowed decisions consume: quota uses, approval uses and token uses. A
//! decision only lists its uses ([`Decision::spend`](crate::Decision::spend)); the environment
//! spends them with the action, once nothing else can refuse it, so a refused or conflicting
//! action spends nothing. A spend is all or nothing, checked again against the counters of the
//! moment (another action may have taken the last use since the decision), and durable before
//! it is granted.

use environment_core::Spend;

use crate::condition::Quota;
use crate::decision::Reason;
use crate::policy::{Policy, Runtime, lock};
use crate::token::TokenError;

/// A quota's new count: (rule, actor) → (window, uses).
pub(crate) type QuotaCount = ((String, String), (i64, u32));

impl Policy {
    /// Spends `uses`, all of them or none: a use no longer available refuses with its reason
    /// (a quota filled or an approval used up since the decision), and so does a store that
    /// cannot record them (fail closed).
    pub fn spend_uses(&self, uses: &[Spend]) -> Result<(), Reason> {
        if uses.is_empty() {
            return Ok(());
        }
        // Counted against every use spent so far, in any process.
        self.refresh().map_err(|_| Reason::Unreadable)?;
        let now = self.clock.now_ms();
        let mut rt = lock(&self.runtime);
        // Checked and counted in one pass; nothing changes until the store has them all.
        let mut quotas: Vec<QuotaCount> = Vec::new();
        let mut approvals = Vec::new();
        let mut tokens = Vec::new();
        for u in uses {
            match u {
                Spend::Quota {
                    rule,
                    actor,
                    count,
                    window_secs,
                } => {
                    let (window, used) = quota_used(&rt, rule, actor, *count, *window_secs, now)?;
                    quotas.push(((rule.clone(), actor.clone()), (window, used + 1)));
                }
                Spend::Approval { id } => {
                    let a = rt.approvals.get(id).and_then(|a| a.used_once(now));
                    approvals.push(a.ok_or(Reason::ApprovalRequired)?);
                }
                Spend::TokenUse { tag, max } => {
                    let used = token_used(&rt, tag, *max).map_err(Reason::Token)?;
                    tokens.push((tag.clone(), used + 1));
                }
                // A use this build does not know cannot be counted: refused.
                _ => return Err(Reason::UnknownAction),
            }
        }
        lock(&self.store)
            .spend(&quotas, &approvals, &tokens)
            .map_err(|_| Reason::NoPermit)?;
        rt.quotas.extend(quotas);
        for a in approvals {
            rt.approvals.insert(a.id.clone(), a);
        }
        rt.token_uses.extend(tokens);
        Ok(())
    }
}

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
