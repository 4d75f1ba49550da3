//! Spending what allowed decisions consume: quota uses, approval uses and token uses. A
//! decision only lists its uses ([`Decision::spend`](crate::Decision::spend)); the environment
//! spends them with the action, once nothing else can refuse it, so a refused or conflicting
//! action spends nothing. A spend is all or nothing, checked again against the counters of the
//! moment (another action may have taken the last use since the decision), and durable before
//! it is granted.

use environment_core::Spend;

use crate::approval::ApprovalState;
use crate::condition::Quota;
use crate::decision::Reason;
use crate::policy::{Policy, Runtime, lock};

/// A quota's new count: (rule, actor) → (window, uses).
pub(crate) type QuotaCount = ((String, String), (i64, u32));
use crate::token::TokenError;

impl Policy {
    /// Spends `uses`, all of them or none: a use no longer available refuses with its reason
    /// (a quota filled or an approval used up since the decision), and so does a store that
    /// cannot record them (fail closed).
    pub fn spend_uses(&self, uses: &[Spend]) -> Result<(), Reason> {
        if uses.is_empty() {
            return Ok(());
        }
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
                    self.quota_left(&rt, u, now)?;
                    let window = quota(*count, *window_secs).window_start(now);
                    let used = used_in(&rt, rule, actor, window);
                    quotas.push(((rule.clone(), actor.clone()), (window, used + 1)));
                }
                Spend::Approval { id } => {
                    let mut a = rt
                        .approvals
                        .get(id)
                        .cloned()
                        .ok_or(Reason::ApprovalRequired)?;
                    match &mut a.state {
                        ApprovalState::Granted {
                            uses_left,
                            expires_at,
                            ..
                        } if *uses_left > 0 && expires_at.is_none_or(|e| now < e) => {
                            *uses_left -= 1;
                        }
                        _ => return Err(Reason::ApprovalRequired),
                    }
                    approvals.push(a);
                }
                Spend::TokenUse { tag, max } => {
                    let used = rt.token_uses.get(tag).copied().unwrap_or(0);
                    if used >= *max {
                        return Err(Reason::Token(TokenError::Exhausted { max: *max }));
                    }
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

    /// Whether a quota use is still available now (any other use passes).
    pub(crate) fn quota_left(&self, rt: &Runtime, u: &Spend, now: i64) -> Result<(), Reason> {
        if let Spend::Quota {
            rule,
            actor,
            count,
            window_secs,
        } = u
        {
            let q = quota(*count, *window_secs);
            let window = q.window_start(now);
            if used_in(rt, rule, actor, window) >= *count {
                let len = i64::try_from(window_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
                let retry_at = window.saturating_add(len);
                return Err(Reason::QuotaExhausted { retry_at });
            }
        }
        Ok(())
    }
}

fn quota(count: u32, window_secs: u64) -> Quota {
    Quota { count, window_secs }
}

/// How many uses of `rule`'s quota `actor` has had in `window`.
fn used_in(rt: &Runtime, rule: &str, actor: &str, window: i64) -> u32 {
    match rt.quotas.get(&(rule.to_owned(), actor.to_owned())) {
        Some((w, u)) if *w == window => *u,
        _ => 0,
    }
}
