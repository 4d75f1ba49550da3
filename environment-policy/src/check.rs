//! Deciding a request: the actor's principals, the candidate rules from the index, forbids over
//! permits, then quota, approval and delegation, and the capability token when one is presented.

use std::cell::Cell;
use std::sync::Arc;

use environment_core::{AccessRequest, Resource};

use crate::approval::ApprovalState;
use crate::decision::{Decision, Hits, Outcome, Reason};
use crate::delegation::MAX_DELEGATION_DEPTH;
use crate::policy::{Policy, State, kind_id, lock, read};
use crate::relations::{ANYONE, EntityId};
use crate::resource::{Target, resource_label};
use crate::rule::{Effect, Rule};
use crate::ruleset::{Lookup, RuleSet};
use crate::schema::ActionId;
use crate::token::{CapabilityToken, CompiledCaveat, TokenError};

/// Whether a decision spends what an allow consumes: dry runs (planning, explaining, reverse
/// queries, tests) must not eat an agent's quota or a human's one-time approval.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Decide only.
    Dry,
    /// Decide and spend what an allow spends (quota, approval uses, token uses).
    Commit,
}

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
}

impl Ruling {
    fn deny(reason: Reason, hits: Hits) -> Ruling {
        Ruling {
            outcome: Outcome::Deny,
            reason,
            hits,
        }
    }
}

impl Policy {
    /// Decides a request and spends what an allow spends: a quota use, an approval use, a token
    /// use. This is what the environment calls before acting.
    pub fn check(&self, req: &AccessRequest) -> Decision {
        self.run(req, Mode::Commit)
    }

    /// Decides a request without spending anything (a dry run: planning, tests, explanations).
    pub fn evaluate(&self, req: &AccessRequest) -> Decision {
        self.run(req, Mode::Dry)
    }

    fn run(&self, req: &AccessRequest, mode: Mode) -> Decision {
        let st = read(&self.state);
        let rs = Arc::clone(&st.rules);
        let v = match (rs.schema.id_of(&req.action), Target::of(&req.resource)) {
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
                    mode,
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
        }
    }

    fn try_quota(
        &self,
        rule: &Rule,
        actor: &str,
        now: i64,
        mode: Mode,
    ) -> std::result::Result<(), i64> {
        let Some(q) = rule.conditions.quota else {
            return Ok(());
        };
        let window = q.window_start(now);
        let next = window
            .saturating_add(i64::try_from(q.window_secs.saturating_mul(1000)).unwrap_or(i64::MAX));
        let mut rt = lock(&self.runtime);
        let key = (rule.id.clone(), actor.to_owned());
        let used = match rt.quotas.get(&key) {
            Some((w, u)) if *w == window => *u,
            _ => 0,
        };
        if used >= q.count {
            return Err(next);
        }
        if mode == Mode::Commit {
            // Fail closed: a use that cannot be recorded durably is not granted.
            lock(&self.store)
                .put_quota(&rule.id, actor, window, used + 1)
                .map_err(|_| next)?;
            rt.quotas.insert(key, (window, used + 1));
        }
        Ok(())
    }

    fn use_approval(
        &self,
        id: &str,
        actor: &str,
        action: &str,
        resource: &Resource,
        now: i64,
        mode: Mode,
    ) -> bool {
        let label = resource_label(resource);
        let mut rt = lock(&self.runtime);
        let Some(a) = rt.approvals.get(id) else {
            return false;
        };
        if !a.admits(actor, action, &label, now) {
            return false;
        }
        if mode == Mode::Commit {
            let mut a = a.clone();
            if let ApprovalState::Granted { uses_left, .. } = &mut a.state {
                *uses_left -= 1;
            }
            if lock(&self.store).put_approval(&a).is_err() {
                return false;
            }
            rt.approvals.insert(a.id.clone(), a);
        }
        true
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
    mode: Mode,
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
            return Ruling {
                outcome: Outcome::Allow,
                reason: Reason::Permitted,
                hits: Hits::one(i),
            };
        }
        let mut quota_block = None;
        for &i in s.quota.as_slice() {
            let Some(r) = self.rs.rule(i) else { continue };
            match self.policy.try_quota(r, actor, self.now(), self.mode) {
                Ok(()) => {
                    return Ruling {
                        outcome: Outcome::Allow,
                        reason: Reason::Permitted,
                        hits: Hits::one(i),
                    };
                }
                Err(retry_at) => quota_block = quota_block.or(Some((i, retry_at))),
            }
        }
        if !s.approval.is_empty() {
            if let Some(id) = &self.req.context.approval
                && self.policy.use_approval(
                    id,
                    actor,
                    self.action_name(),
                    &self.req.resource,
                    self.now(),
                    self.mode,
                )
            {
                return Ruling {
                    outcome: Outcome::Allow,
                    reason: Reason::Approved,
                    hits: s.approval,
                };
            }
            return Ruling {
                outcome: Outcome::NeedsApproval,
                reason: Reason::ApprovalRequired,
                hits: s.approval,
            };
        }
        if depth < MAX_DELEGATION_DEPTH {
            for d in &self.st.delegations {
                if d.to == actor && d.covers(self.action_name(), &self.target, self.now()) {
                    let v = self.decide(&d.from, depth + 1);
                    if v.outcome == Outcome::Allow {
                        return Ruling {
                            outcome: Outcome::Allow,
                            reason: Reason::Delegated {
                                delegation: d.id.clone(),
                            },
                            hits: v.hits,
                        };
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
        let v = self.decide(&token.principal, 0);
        if v.outcome == Outcome::Allow
            && self.mode == Mode::Commit
            && let Err(e) = self.policy.spend_token(&token, &tags)
        {
            return token_deny(e);
        }
        v
    }
}
