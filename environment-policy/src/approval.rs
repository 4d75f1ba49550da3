//! Approval requests: durable objects that a human (or an authorized actor) grants or rejects.

use serde::{Deserialize, Serialize};

use environment_core::AccessRequest;

use crate::decision::{Decision, Outcome};
use crate::error::{PolicyError, Result};
use environment_core::policy_store::PolicyRecord;

use crate::policy::{Policy, Runtime, lock, random_id, read};
use crate::resource::resource_label;

/// What has become of an approval request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum ApprovalState {
    /// Waiting for a decision.
    Pending,
    /// Granted: the exact request may pass `uses_left` more times until `expires_at`.
    Granted {
        /// Who granted it.
        by: String,
        /// When (ms).
        at: i64,
        /// How many more times the request may pass.
        uses_left: u32,
        /// When the grant lapses (ms), if ever.
        expires_at: Option<i64>,
    },
    /// Rejected.
    Rejected {
        /// Who rejected it.
        by: String,
        /// When (ms).
        at: i64,
    },
}

impl ApprovalState {
    /// Its name: pending, granted, used up or rejected.
    pub fn name(&self) -> &'static str {
        match self {
            ApprovalState::Pending => "pending",
            ApprovalState::Granted { uses_left: 0, .. } => "used up",
            ApprovalState::Granted { .. } => "granted",
            ApprovalState::Rejected { .. } => "rejected",
        }
    }
}

/// One request for approval, tied to exactly one actor, action and resource.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Approval {
    /// Its id, presented back in `Context::approval`.
    pub id: String,
    /// Who asked.
    pub actor: String,
    /// The action.
    pub action: String,
    /// The resource (see [`crate::resource_label`]).
    pub resource: String,
    /// The rules that asked for approval.
    pub rules: Vec<String>,
    /// Who may decide (actors or groups).
    pub from: Vec<String>,
    /// When it was filed (ms).
    pub created_at: i64,
    /// Its state.
    pub state: ApprovalState,
}

/// What a grant allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrantScope {
    /// How many times the approved request may pass.
    pub uses: u32,
    /// When the grant lapses (ms), if ever.
    pub expires_at: Option<i64>,
}

impl GrantScope {
    /// Exactly once, without expiry.
    pub fn once() -> GrantScope {
        GrantScope {
            uses: 1,
            expires_at: None,
        }
    }
}

impl Default for GrantScope {
    fn default() -> GrantScope {
        GrantScope::once()
    }
}

impl Approval {
    /// Whether it lets this request through at `now`.
    pub(crate) fn admits(&self, actor: &str, action: &str, resource: &str, now: i64) -> bool {
        self.actor == actor
            && self.action == action
            && self.resource == resource
            && self.usable(now)
    }

    /// Whether it is granted with a use left at `now`.
    pub(crate) fn usable(&self, now: i64) -> bool {
        matches!(&self.state, ApprovalState::Granted { uses_left, expires_at, .. }
            if *uses_left > 0 && expires_at.is_none_or(|e| now < e))
    }

    /// The same approval with one use spent, if it has one at `now`.
    pub(crate) fn used_once(&self, now: i64) -> Option<Approval> {
        let mut a = self.clone();
        match &mut a.state {
            ApprovalState::Granted { uses_left, .. } if self.usable(now) => *uses_left -= 1,
            _ => return None,
        }
        Some(a)
    }
}

impl Policy {
    /// Files (or finds the pending) approval request for a request that needs one.
    pub fn request_approval(&self, req: &AccessRequest) -> Result<Approval> {
        let d = self.evaluate(req);
        if d.outcome() != Outcome::NeedsApproval {
            return Err(PolicyError::NoApprovalNeeded(d.explain(req)));
        }
        self.file_approval(req, &d)
    }

    pub(crate) fn file_approval(&self, req: &AccessRequest, d: &Decision) -> Result<Approval> {
        let label = resource_label(&req.resource);
        self.retrying(|| {
            let mut rt = lock(&self.runtime);
            if let Some(a) = rt.approvals.values().find(|a| {
                a.state == ApprovalState::Pending
                    && a.actor == req.actor.as_str()
                    && a.action == req.action.as_str()
                    && a.resource == label
            }) {
                return Ok(Some(a.clone()));
            }
            let a = Approval {
                id: random_id("apr-"),
                actor: req.actor.to_string(),
                action: req.action.to_string(),
                resource: label.clone(),
                rules: d.rule_ids().map(str::to_owned).collect(),
                from: d.approvers(),
                created_at: self.clock.now_ms(),
                state: ApprovalState::Pending,
            };
            self.put_approval(&mut rt, None, a)
        })
    }

    /// Records `a`, new (`before` is `None`) or replacing the record memory holds; `None` when
    /// the store's record is no longer that one.
    pub(crate) fn put_approval(
        &self,
        rt: &mut Runtime,
        before: Option<&str>,
        a: Approval,
    ) -> Result<Option<Approval>> {
        let record = PolicyRecord {
            id: a.id.clone(),
            body: serde_json::to_string(&a).map_err(|e| PolicyError::Corrupt(e.to_string()))?,
        };
        let w = lock(&self.store).put_approval(before, &record)?;
        if !self.wrote(w) {
            return Ok(None);
        }
        rt.approval_bodies.insert(record.id, record.body);
        rt.approvals.insert(a.id.clone(), a.clone());
        Ok(Some(a))
    }

    /// Grants a pending approval; `approver` must be (in) one of those it names and not the
    /// requester.
    pub fn grant(&self, id: &str, approver: &str, scope: GrantScope) -> Result<Approval> {
        let now = self.clock.now_ms();
        self.decide_approval(id, approver, |by| ApprovalState::Granted {
            by,
            at: now,
            uses_left: scope.uses.max(1),
            expires_at: scope.expires_at,
        })
    }

    /// Rejects a pending approval.
    pub fn reject(&self, id: &str, approver: &str) -> Result<Approval> {
        let now = self.clock.now_ms();
        self.decide_approval(id, approver, |by| ApprovalState::Rejected { by, at: now })
    }

    fn decide_approval(
        &self,
        id: &str,
        approver: &str,
        state: impl Fn(String) -> ApprovalState,
    ) -> Result<Approval> {
        self.retrying(|| {
            let st = read(&self.state);
            let mut rt = lock(&self.runtime);
            let a = rt
                .approvals
                .get(id)
                .ok_or_else(|| PolicyError::UnknownApproval(id.to_owned()))?;
            if a.state != ApprovalState::Pending {
                return Err(PolicyError::ApprovalNotPending {
                    id: id.to_owned(),
                    state: a.state.name(),
                });
            }
            let who = st.relations.lookup(approver);
            let authorized = approver != a.actor
                && a.from.iter().any(|f| {
                    f == approver
                        || match (who, st.relations.lookup(f)) {
                            (Some(w), Some(g)) => st.relations.is_in(w, g),
                            _ => false,
                        }
                });
            if !authorized {
                return Err(PolicyError::NotAnApprover {
                    id: id.to_owned(),
                    approver: approver.to_owned(),
                });
            }
            let mut a = a.clone();
            a.state = state(approver.to_owned());
            let before = rt.approval_bodies.get(id).cloned();
            self.put_approval(&mut rt, Some(before.as_deref().unwrap_or_default()), a)
        })
    }

    /// One approval request.
    pub fn approval(&self, id: &str) -> Option<Approval> {
        self.refresh_or_keep();
        lock(&self.runtime).approvals.get(id).cloned()
    }

    /// Every approval request.
    pub fn approvals(&self) -> Vec<Approval> {
        self.refresh_or_keep();
        lock(&self.runtime).approvals.values().cloned().collect()
    }
}
