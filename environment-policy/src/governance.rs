//! The policy behind core's governance port: the workspace service asks its questions and does
//! its administration through [`Governance`], in the port's types.

use environment_core::governance::{
    Approval as PortApproval, Explained, GrantScope as PortScope, Permission, PolicyChanged,
};
use environment_core::{AccessRequest, ActorId, ErrorKind, Governance, PortError, Resource};

use crate::approval::{Approval, ApprovalState, GrantScope};
use crate::decision::Outcome;
use crate::error::PolicyError;
use crate::format::RuleFile;
use crate::policy::Policy;

impl Governance for Policy {
    fn version(&self) -> u64 {
        Policy::version(self)
    }

    fn explain(&self, request: &AccessRequest) -> Explained {
        let d = self.evaluate(request);
        Explained {
            allowed: d.is_allowed(),
            outcome: match d.outcome() {
                Outcome::Allow => "allow",
                Outcome::Deny => "deny",
                Outcome::NeedsApproval => "needs_approval",
            }
            .to_owned(),
            rules: d.rule_ids().map(str::to_owned).collect(),
            approvers: d.approvers(),
            policy_version: d.policy_version(),
            explanation: d.explain(request),
        }
    }

    fn what_may(&self, actor: &ActorId, under: &Resource) -> Vec<Permission> {
        Policy::what_may(self, actor.as_str(), under)
    }

    fn request_approval(&self, request: &AccessRequest) -> Result<PortApproval, PortError> {
        Ok(Policy::request_approval(self, request)?.into())
    }

    fn approval(&self, id: &str) -> Option<PortApproval> {
        Policy::approval(self, id).map(PortApproval::from)
    }

    fn approvals(&self) -> Vec<PortApproval> {
        let mut all = Policy::approvals(self);
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        all.into_iter().map(PortApproval::from).collect()
    }

    fn grant(
        &self,
        id: &str,
        approver: &ActorId,
        scope: PortScope,
    ) -> Result<PortApproval, PortError> {
        let scope = GrantScope {
            uses: scope.uses,
            expires_at: scope.expires_at_ms,
        };
        Ok(Policy::grant(self, id, approver.as_str(), scope)?.into())
    }

    fn reject(&self, id: &str, approver: &ActorId) -> Result<PortApproval, PortError> {
        Ok(Policy::reject(self, id, approver.as_str())?.into())
    }

    fn check_rules(&self, rules: &str) -> Result<(), PortError> {
        RuleFile::parse(rules).map_err(PolicyError::Invalid)?;
        Ok(())
    }

    fn load_rules(&self, rules: &str) -> Result<PolicyChanged, PortError> {
        let version = Policy::load_rules(self, rules)?;
        Ok(PolicyChanged {
            version,
            rules: self.rules().rules.len(),
        })
    }

    fn add_member(&self, member: &str, group: &str) -> Result<u64, PortError> {
        Ok(Policy::add_member(self, member, group)?)
    }
}

impl From<Approval> for PortApproval {
    fn from(a: Approval) -> PortApproval {
        let uses_left = match a.state {
            ApprovalState::Granted { uses_left, .. } => Some(uses_left),
            _ => None,
        };
        PortApproval {
            state: a.state.name().to_owned(),
            id: a.id,
            actor: a.actor,
            from: a.from,
            rules: a.rules,
            action: a.action,
            resource: a.resource,
            uses_left,
            created_ms: a.created_at,
        }
    }
}

/// The policy's errors as the port reports them, each with what the caller can do next.
impl From<PolicyError> for PortError {
    fn from(e: PolicyError) -> PortError {
        let kind = e.kind();
        let next = match &e {
            PolicyError::NoApprovalNeeded(_) => {
                "act directly if it is allowed; if it is denied, an approval cannot help."
            }
            _ if matches!(kind, ErrorKind::Invalid | ErrorKind::NotFound) => {
                "fix the request and retry."
            }
            _ => "report the error to a human if it persists.",
        };
        PortError::new(kind, e.to_string(), next)
    }
}
