//! Decisions: the verdict, the rules behind it, the policy version, and an explanation rendered
//! only when someone asks for it (so the check itself never formats text).

use std::sync::Arc;

use environment_core::{AccessRequest, Spend, Verdict};

use crate::resource::resource_short;
use crate::rule::Rule;
use crate::ruleset::RuleSet;
use crate::token::TokenError;

/// The outcome of a check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The action may happen.
    Allow,
    /// It must not.
    Deny,
    /// It may happen once someone approves it.
    NeedsApproval,
}

/// Why the outcome is what it is.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// A permit applied and no forbid did.
    Permitted,
    /// A permit applied through a granted approval.
    Approved,
    /// Allowed because another actor delegated the right (the rules are the delegator's).
    Delegated {
        /// The delegation followed first.
        delegation: String,
    },
    /// A forbid applied.
    Forbidden,
    /// No permit applied (default deny); `rules` names a permit whose conditions did not hold.
    NoPermit,
    /// The action is not declared in the schema.
    UnknownAction,
    /// The resource is of a kind the policy cannot judge (an unparsable URL, say).
    UnknownResource,
    /// The only applicable permits have spent their quota for this window.
    QuotaExhausted {
        /// When the next window opens (ms).
        retry_at: i64,
    },
    /// A permit applies once approved.
    ApprovalRequired,
    /// The presented capability token refused the request.
    Token(TokenError),
    /// The policy store could not be read to bring the policy up to date: refused (fail
    /// closed) rather than decided on rules that may have been revoked.
    Unreadable,
}

/// Up to four rule indices, inline (a check must not allocate).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Hits {
    idx: [u32; 4],
    len: u8,
}

impl Hits {
    pub(crate) fn push(&mut self, i: u32) {
        if usize::from(self.len) < self.idx.len() && !self.as_slice().contains(&i) {
            self.idx[usize::from(self.len)] = i;
            self.len += 1;
        }
    }
    pub(crate) fn one(i: u32) -> Hits {
        let mut h = Hits::default();
        h.push(i);
        h
    }
    pub(crate) fn as_slice(&self) -> &[u32] {
        &self.idx[..usize::from(self.len)]
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A decision. Cheap to make; call [`Decision::explain`] for the text.
#[derive(Clone)]
pub struct Decision {
    pub(crate) outcome: Outcome,
    pub(crate) reason: Reason,
    pub(crate) hits: Hits,
    pub(crate) version: u64,
    pub(crate) rules: Arc<RuleSet>,
    pub(crate) approval: Option<String>,
    /// What an allow consumes, for [`Policy::spend_uses`](crate::Policy::spend_uses).
    pub(crate) spend: Vec<Spend>,
}

impl std::fmt::Debug for Decision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Decision")
            .field("outcome", &self.outcome)
            .field("reason", &self.reason)
            .field("rules", &self.rule_ids().collect::<Vec<_>>())
            .field("policy_version", &self.version)
            .field("approval", &self.approval)
            .field("spend", &self.spend)
            .finish()
    }
}

impl Decision {
    /// Allow, deny or needs approval.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// What an allow consumes (quota, approval and token uses), not yet spent.
    pub fn spend(&self) -> &[Spend] {
        &self.spend
    }

    /// Whether the action may happen now.
    pub fn is_allowed(&self) -> bool {
        self.outcome == Outcome::Allow
    }

    /// Why.
    pub fn reason(&self) -> &Reason {
        &self.reason
    }

    /// The policy version that decided.
    pub fn policy_version(&self) -> u64 {
        self.version
    }

    /// The ids of the rules that decided: the forbids that applied (up to four), the permit that
    /// allowed or asks for approval, or for a default deny a permit whose conditions did not
    /// hold (none when no permit came close).
    pub fn rule_ids(&self) -> impl Iterator<Item = &str> + '_ {
        self.hits
            .as_slice()
            .iter()
            .filter_map(|i| self.rules.rule(*i))
            .map(|r| r.id.as_str())
    }

    /// Who may approve, for [`Outcome::NeedsApproval`].
    pub fn approvers(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        if self.outcome != Outcome::NeedsApproval {
            return out;
        }
        for i in self.hits.as_slice() {
            if let Some(r) = self.rules.rule(*i) {
                for a in &r.conditions.approval_from {
                    if !out.contains(a) {
                        out.push(a.clone());
                    }
                }
            }
        }
        out
    }

    /// The id of the approval request filed for this decision, if one was.
    pub fn approval_request(&self) -> Option<&str> {
        self.approval.as_deref()
    }

    /// A short text an LLM can act on: what was decided, by which rule and why, then what to do
    /// next for a refusal. The parts are [`Decision::reason_for`] and [`Decision::next_step`].
    pub fn explain(&self, req: &AccessRequest) -> String {
        let reason = self.reason_for(req);
        match self.next_step() {
            next if next.is_empty() => format!("{reason}."),
            next => format!("{reason}. Next: {next}."),
        }
    }

    /// What was decided, by which rule and why, in one sentence without a final stop, the
    /// policy version included; nothing about what to do next (see [`Decision::next_step`]).
    pub fn reason_for(&self, req: &AccessRequest) -> String {
        let what = format!(
            "`{}` {} `{}`",
            req.actor,
            req.action,
            resource_short(&req.resource)
        );
        let ids = || {
            self.rule_ids()
                .map(|id| format!("`{id}`"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let v = self.version;
        let reason = match (&self.outcome, &self.reason) {
            (Outcome::Allow, Reason::Approved) => {
                format!("Allowed by rule {} with a granted approval", ids())
            }
            (Outcome::Allow, Reason::Delegated { delegation }) => format!(
                "Allowed through delegation `{delegation}` by rule {}",
                ids()
            ),
            (Outcome::Allow, _) => format!("Allowed by rule {}", ids()),
            (_, Reason::Forbidden) => {
                let matched = self.first_rule().map_or(String::new(), |r| {
                    format!(
                        ": `{}` matches `{}`",
                        resource_short(&req.resource),
                        r.resource
                    )
                });
                format!("Denied by rule {}{matched}", ids())
            }
            (_, Reason::NoPermit) => match self.first_rule() {
                Some(r) => format!(
                    "Denied: rule `{}` permits {what} only {}, which does not hold now",
                    r.id,
                    r.conditions.describe()
                ),
                None => format!("Denied: no rule permits {what} (default deny)"),
            },
            (_, Reason::UnknownAction) => format!(
                "Denied: action `{}` is not declared in the policy schema",
                req.action
            ),
            (_, Reason::Unreadable) => {
                "Denied: the policy store could not be read, so no rule can be trusted".to_owned()
            }
            (_, Reason::UnknownResource) => format!(
                "Denied: the policy cannot judge resource `{}`",
                resource_short(&req.resource)
            ),
            (_, Reason::QuotaExhausted { .. }) => {
                format!(
                    "Denied by rule {}: its quota is used up for this window",
                    ids()
                )
            }
            (_, Reason::Token(e)) => format!("Denied: {e}"),
            (Outcome::NeedsApproval, _) => {
                let filed = self.approval.as_ref().map_or(String::new(), |id| {
                    format!("; approval request `{id}` is filed")
                });
                format!(
                    "Needs approval: rule {} permits {what} once {} approves{filed}",
                    ids(),
                    self.approvers().join(" or ")
                )
            }
            (_, _) => format!("Denied {what}"),
        };
        format!("{reason} (policy v{v})")
    }

    /// What to do next after a refusal, in a few words an LLM can act on (the rule's own
    /// advice when it has one); empty for an allow.
    pub fn next_step(&self) -> String {
        let advice = |default: &str| {
            self.first_rule()
                .and_then(|r| r.advice.clone())
                .unwrap_or_else(|| default.to_owned())
        };
        match (&self.outcome, &self.reason) {
            (Outcome::Allow, _) => String::new(),
            (_, Reason::Forbidden) => {
                format!(
                    "do not retry; {}",
                    advice("ask a human to change the policy if it is needed")
                )
            }
            (_, Reason::NoPermit) if self.first_rule().is_some() => {
                format!(
                    "do not retry as is; {}",
                    advice("meet the condition or ask a human")
                )
            }
            (_, Reason::NoPermit) => "do not retry; ask what you may do under this resource, or \
                                     ask a human for access"
                .to_owned(),
            (_, Reason::UnknownAction) => "do not retry; use an action the schema declares".into(),
            (_, Reason::Unreadable) => {
                "retry once the store is readable, or ask a human to check it".into()
            }
            (_, Reason::UnknownResource) => "name the resource another way, or ask a human".into(),
            (_, Reason::QuotaExhausted { retry_at }) => {
                format!("retry after {retry_at} ms since the epoch, or ask a human")
            }
            (_, Reason::Token(_)) => {
                "do not retry with this token; ask the agent that gave it for a new one".into()
            }
            (Outcome::NeedsApproval, _) if self.approval.is_some() => {
                "retry with the approval once it is granted; do not retry before".into()
            }
            (Outcome::NeedsApproval, _) => format!(
                "request approval from {}, then retry with it once granted",
                self.approvers().join(" or ")
            ),
            (_, _) => "ask a human whether it should be allowed".into(),
        }
    }

    /// The rule that decided first, if any.
    fn first_rule(&self) -> Option<&Rule> {
        self.hits
            .as_slice()
            .first()
            .and_then(|i| self.rules.rule(*i))
    }

    /// The decision in core's terms, with its explanation rendered unless it is an allow.
    pub fn to_core(&self, req: &AccessRequest) -> environment_core::Decision {
        let verdict = match self.outcome {
            Outcome::Allow => Verdict::Allow,
            Outcome::Deny => Verdict::Deny,
            Outcome::NeedsApproval => Verdict::NeedsApproval {
                what: format!(
                    "{} {} {}",
                    req.actor,
                    req.action,
                    resource_short(&req.resource)
                ),
                from: self.approvers(),
                request: self.approval.clone(),
            },
        };
        environment_core::Decision {
            verdict,
            rules: self.rule_ids().map(str::to_owned).collect(),
            policy_version: self.version,
            explanation: if self.outcome == Outcome::Allow {
                String::new()
            } else {
                self.reason_for(req)
            },
            next: self.next_step(),
            spend: self.spend.clone(),
        }
    }
}
