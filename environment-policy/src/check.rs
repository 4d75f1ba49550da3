//! Deciding a request: the actor's principals, the candidate rules from the index, forbids over
//! permits, then quota, approval and delegation, and the capability token when one is presented.

use std::cell::Cell;
use std::sync::Arc;

use environment_core::{AccessRequest, Spend};

use crate::decision::{Decision, Hits, Outcome, Reason};
use crate::delegation::MAX_DELEGATION_DEPTH;
use crate::policy::{Policy, State, kind_id, lock, read};
use crate::relations::{ANYONE, EntityId};
use crate::resource::{Target, resource_label};
use crate::rule::{Effect, Rule};
use crate::ruleset::{Lookup, RuleSet};
use crate::schema::ActionId;
use crate::spend::quota_used;
use crate::token::{CapabilityToken, CompiledCaveat, TokenError};

/// What the rules of one actor say about a request.
#[derive(Default)]
struct Scan {
    forbids: Hits,
    permit: Option<u32>,
    quota: Hits,
    approval: Hits,
    near_miss: Option<u32>,
}

/// A decision before it is tied to a policy version and rule set.
struct Ruling {
    outcome: Outcome,
    reason: Reason,
    hits: Hits,
    /// What an allow consumes.
    spend: Vec<Spend>,
}

impl Ruling {
    fn deny(reason: Reason, hits: Hits) -> Ruling {
        Ruling {
            outcome: Outcome::Deny,
            reason,
            hits,
            spend: Vec::new(),
        }
    }

    fn allow(reason: Reason, hits: Hits, spend: Vec<Spend>) -> Ruling {
        Ruling {
            outcome: Outcome::Allow,
            reason,
            hits,
            spend,
        }
    }
}

impl Policy {
    /// Decides a request and spends at once what an allow consumes (a quota use, an approval
    /// use, a token use): for an action with no transaction of its own. The environment
    /// decides with [`Policy::evaluate`] and spends with the action instead.
    pub fn check(&self, req: &AccessRequest) -> Decision {
        let mut d = self.evaluate(req);
        if d.outcome == Outcome::Allow
            && let Err(reason) = self.spend_uses(&d.spend)
        {
            d.outcome = Outcome::Deny;
            d.reason = reason;
            d.spend.clear();
        }
        d
    }

    /// Decides a request without spending anything: an allow lists in its
    /// [`Decision::spend`] what it would consume, for [`Policy::spend_uses`].
    pub fn evaluate(&self, req: &AccessRequest) -> Decision {
        let live = self.refresh();
        self.evaluate_as_loaded(req, live.is_ok())
    }

    /// [`Policy::evaluate`] on the policy as last read from the store; `live` says whether
    /// that read succeeded (a refusal otherwise).
    pub(crate) fn evaluate_as_loaded(&self, req: &AccessRequest, live: bool) -> Decision {
        let st = read(&self.state);
        let rs = Arc::clone(&st.rules);
        let v = match (rs.schema.id_of(&req.action), Target::of(&req.resource)) {
            // Decided on rules that may have been revoked: refused instead.
            _ if !live => Ruling::deny(Reason::Unreadable, Hits::default()),
            (None, _) => Ruling::deny(Reason::UnknownAction, Hits::default()),
            (_, None) => Ruling::deny(Reason::UnknownResource, Hits::default()),
            (Some(action), Some(target)) => {
                let ev = Eval {
                    policy: self,
                    st: &st,
                    rs: &rs,
                    req,
                    target,
                    lookup: Lookup::of(&target),
                    action,
                    now: Cell::new(None),
                };
                match &req.context.token {
                    Some(t) => ev.with_token(t),
                    None => ev.decide(req.actor.as_str(), 0),
                }
            }
        };
        let version = st.version;
        drop(st);
        Decision {
            outcome: v.outcome,
            reason: v.reason,
            hits: v.hits,
            version,
            rules: rs,
            approval: None,
            spend: v.spend,
        }
    }

    /// The quota use `rule` would take for `actor` now, or when its next window opens.
    fn try_quota(&self, rule: &Rule, actor: &str, now: i64) -> std::result::Result<Spend, i64> {
        let Some(q) = rule.conditions.quota else {
            return Err(now);
        };
        match quota_used(
            &lock(&self.runtime),
            &rule.id,
            actor,
            q.count,
            q.window_secs,
            now,
        ) {
            Ok(_) => Ok(Spend::Quota {
                rule: rule.id.clone(),
                actor: actor.to_owned(),
                count: q.count,
                window_secs: q.window_secs,
            }),
            Err(Reason::QuotaExhausted { retry_at }) => Err(retry_at),
            Err(_) => Err(now),
        }
    }
}

/// One evaluation: the request, borrowed state, and the clock read at most once.
struct Eval<'a> {
    policy: &'a Policy,
    st: &'a State,
    rs: &'a RuleSet,
    req: &'a AccessRequest,
    target: Target<'a>,
    lookup: Lookup,
    action: ActionId,
    now: Cell<Option<i64>>,
}

impl Eval<'_> {
    fn now(&self) -> i64 {
        match self.now.get() {
            Some(n) => n,
            None => {
                let n = self.policy.clock.now_ms();
                self.now.set(Some(n));
                n
            }
        }
    }

    fn action_name(&self) -> &str {
        self.rs.schema.name(self.action)
    }

    fn scan(&self, actor: &str) -> Scan {
        let mut s = Scan::default();
        let rel = &self.st.relations;
        self.visit(ANYONE, &mut s);
        match rel.lookup(actor) {
            Some(id) => {
                let k = rel.kind_principal(id);
                if k != ANYONE {
                    self.visit(k, &mut s);
                }
                self.visit(id, &mut s);
                for g in rel.ancestors(id) {
                    self.visit(*g, &mut s);
                }
            }
            None => {
                if let Some(k) = kind_id(actor) {
                    self.visit(k, &mut s);
                }
            }
        }
        s
    }

    #[inline]
    fn visit(&self, principal: EntityId, s: &mut Scan) {
        let ctx = &self.req.context;
        let mut now = || self.now();
        self.rs
            .for_each_candidate(principal, self.action, self.lookup, |i| {
                let Some(r) = self.rs.rules.get(i as usize) else {
                    return;
                };
                let forbid = r.effect == Effect::Forbid;
                if !forbid && !s.forbids.is_empty() {
                    // A forbid already decided; permits cannot change that.
                    return;
                }
                if !r.resource.matches(&self.target, forbid) {
                    return;
                }
                if !r.conditions.hold(ctx, &mut now) {
                    if !forbid && s.near_miss.is_none() {
                        s.near_miss = Some(i);
                    }
                    return;
                }
                if forbid {
                    s.forbids.push(i);
                } else if !r.conditions.approval_from.is_empty() {
                    s.approval.push(i);
                } else if r.conditions.quota.is_some() {
                    s.quota.push(i);
                } else if s.permit.is_none() {
                    s.permit = Some(i);
                }
            });
    }

    fn decide(&self, actor: &str, depth: usize) -> Ruling {
        let s = self.scan(actor);
        if !s.forbids.is_empty() {
            return Ruling::deny(Reason::Forbidden, s.forbids);
        }
        if let Some(i) = s.permit {
            return Ruling::allow(Reason::Permitted, Hits::one(i), Vec::new());
        }
        let mut quota_block = None;
        for &i in s.quota.as_slice() {
            let Some(r) = self.rs.rule(i) else { continue };
            match self.policy.try_quota(r, actor, self.now()) {
                Ok(use_) => {
                    return Ruling::allow(Reason::Permitted, Hits::one(i), vec![use_]);
                }
                Err(retry_at) => quota_block = quota_block.or(Some((i, retry_at))),
            }
        }
        if !s.approval.is_empty() {
            if let Some(id) = &self.req.context.approval
                && lock(&self.policy.runtime)
                    .approvals
                    .get(id)
                    .is_some_and(|a| {
                        a.admits(
                            actor,
                            self.action_name(),
                            &resource_label(&self.req.resource),
                            self.now(),
                        )
                    })
            {
                let use_ = Spend::Approval { id: id.clone() };
                return Ruling::allow(Reason::Approved, s.approval, vec![use_]);
            }
            return Ruling {
                outcome: Outcome::NeedsApproval,
                reason: Reason::ApprovalRequired,
                hits: s.approval,
                spend: Vec::new(),
            };
        }
        if depth < MAX_DELEGATION_DEPTH {
            for d in &self.st.delegations {
                if d.to == actor && d.covers(self.action_name(), &self.target, self.now()) {
                    let v = self.decide(&d.from, depth + 1);
                    if v.outcome == Outcome::Allow {
                        let reason = Reason::Delegated {
                            delegation: d.id.clone(),
                        };
                        return Ruling::allow(reason, v.hits, v.spend);
                    }
                }
            }
        }
        if let Some((i, retry_at)) = quota_block {
            return Ruling::deny(Reason::QuotaExhausted { retry_at }, Hits::one(i));
        }
        Ruling::deny(
            Reason::NoPermit,
            s.near_miss.map(Hits::one).unwrap_or_default(),
        )
    }

    fn with_token(&self, text: &str) -> Ruling {
        let token_deny = |e| Ruling::deny(Reason::Token(e), Hits::default());
        let token = match CapabilityToken::decode(text) {
            Ok(t) => t,
            Err(e) => return token_deny(e),
        };
        let presenter = self.req.actor.as_str();
        let tags = match self.policy.verified_tags(&token, presenter) {
            Ok(t) => t,
            Err(e) => return token_deny(e),
        };
        for c in &token.caveats {
            match CompiledCaveat::new(c) {
                Ok(c) if c.admits(self.action_name(), &self.target) => {}
                Ok(_) => return token_deny(TokenError::OutOfScope),
                Err(e) => return token_deny(e),
            }
        }
        if token.principal != presenter {
            // The presenter's own forbids still bind it.
            let s = self.scan(presenter);
            if !s.forbids.is_empty() {
                return Ruling::deny(Reason::Forbidden, s.forbids);
            }
        }
        let mut v = self.decide(&token.principal, 0);
        if v.outcome == Outcome::Allow {
            match self.policy.token_uses(&token, &tags) {
                Ok(uses) => v.spend.extend(uses),
                Err(e) => return token_deny(e),
            }
        }
        v
    }
}
