//! The policy methods: what the policy would decide and why, what the caller may do, and
//! approval requests. They describe the caller's own rights only.

use environment_core::{Action, EnvError, ErrorKind, Key, KeyPrefix, Namespace, Resource};
use environment_policy::ApprovalState;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::error::ServiceError;
use super::session::Session;

/// A resource as the policy methods name it: exactly one field set (`args` goes with
/// `program`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceParam {
    /// A workspace path.
    #[serde(default)]
    pub path: Option<String>,
    /// A workspace directory and everything under it.
    #[serde(default)]
    pub prefix: Option<String>,
    /// An object key (outside the files).
    #[serde(default)]
    pub object: Option<String>,
    /// A branch.
    #[serde(default)]
    pub branch: Option<String>,
    /// A queue topic or consumer group.
    #[serde(default)]
    pub topic: Option<String>,
    /// A program, run with `args`.
    #[serde(default)]
    pub program: Option<String>,
    /// The program's arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// A service outside, e.g. `https://deploy.example/v1`.
    #[serde(default)]
    pub service: Option<String>,
    /// A secret, by name.
    #[serde(default)]
    pub secret: Option<String>,
    /// The environment as a whole.
    #[serde(default)]
    pub environment: Option<bool>,
}

impl ResourceParam {
    fn resource(self) -> Result<Resource, ServiceError> {
        let key = |e| ServiceError::from(EnvError::Key(e));
        let set = [
            self.path.is_some(),
            self.prefix.is_some(),
            self.object.is_some(),
            self.branch.is_some(),
            self.topic.is_some(),
            self.program.is_some(),
            self.service.is_some(),
            self.secret.is_some(),
            self.environment == Some(true),
        ];
        if set.iter().filter(|b| **b).count() != 1 {
            return Err(ServiceError::invalid(
                "`resource` names exactly one of path, prefix, object, branch, topic, program (+ args), service, secret, environment",
            ));
        }
        Ok(if let Some(p) = self.path {
            Resource::Key(Key::fs(p.into_bytes()).map_err(key)?)
        } else if let Some(p) = self.prefix {
            Resource::Prefix(KeyPrefix::new(Namespace::Fs, p.into_bytes()).map_err(key)?)
        } else if let Some(o) = self.object {
            Resource::Key(Key::obj(o.into_bytes()).map_err(key)?)
        } else if let Some(b) = self.branch {
            Resource::Branch(b)
        } else if let Some(t) = self.topic {
            Resource::Topic(t)
        } else if let Some(program) = self.program {
            Resource::Program {
                program,
                args: self.args,
            }
        } else if let Some(s) = self.service {
            Resource::Service(s)
        } else if let Some(s) = self.secret {
            Resource::Secret(s)
        } else {
            Resource::Environment
        })
    }
}

pub(super) fn action_of(name: &str) -> Result<Action, ServiceError> {
    if name.is_empty() {
        return Err(ServiceError::invalid("`action` is empty"));
    }
    Ok(Action::named(name))
}

/// Explains what the policy would decide on an action of the workspace's actor, and why
/// (nothing is spent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExplainParams {
    /// read, write, delete, execute, publish or consume (or an action the policy declares).
    pub action: String,
    /// What it is done to.
    pub resource: ResourceParam,
    /// The `operation` attribute of the request (e.g. `restore`).
    #[serde(default)]
    pub operation: Option<String>,
}

/// The policy's decision on a request, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Explained {
    /// It would be allowed.
    pub allowed: bool,
    /// `allow`, `deny` or `needsapproval`.
    pub outcome: String,
    /// The rules that decide.
    pub rules: Vec<String>,
    /// Who may approve it, when it needs an approval.
    pub approvers: Vec<String>,
    /// The policy's version.
    pub policy_version: u64,
    /// Why, in words.
    pub explanation: String,
}

pub(super) fn policy<'a>(
    g: &'a Session<'_>,
) -> Result<&'a environment_policy::Policy, ServiceError> {
    g.shared()
        .policy
        .as_deref()
        .ok_or_else(|| ServiceError::unavailable("a policy"))
}

pub(super) fn explain(g: &Session<'_>, p: ExplainParams) -> Result<Explained, ServiceError> {
    g.allow(Action::Read, Resource::Environment, Some("policy.explain"))?;
    let req = g.request(
        action_of(&p.action)?,
        p.resource.resource()?,
        p.operation.as_deref(),
    );
    let Some(policy) = g.shared().policy.as_deref() else {
        // No policy: the workspace's authorizer decides alone (without spending anything).
        let d = g.shared().authorizer.decide(&req);
        let explanation = match (d.is_allowed(), d.explanation.is_empty()) {
            (true, true) => {
                "Allowed: no policy is loaded here, so every action is allowed".to_owned()
            }
            _ => d.explanation.clone(),
        };
        return Ok(Explained {
            allowed: d.is_allowed(),
            outcome: if d.is_allowed() { "allow" } else { "deny" }.to_owned(),
            rules: d.rules,
            approvers: Vec::new(),
            policy_version: d.policy_version,
            explanation,
        });
    };
    // A dry run: explaining spends no quota, approval or token use.
    let d = policy.evaluate(&req);
    Ok(Explained {
        allowed: d.is_allowed(),
        outcome: format!("{:?}", d.outcome()).to_lowercase(),
        rules: d.rule_ids().map(str::to_owned).collect(),
        approvers: d.approvers(),
        policy_version: d.policy_version(),
        explanation: d.explain(&req),
    })
}

/// Lists what the workspace's actor may do under a resource, by rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WhatMayParams {
    /// Where to look.
    pub resource: ResourceParam,
}

/// What the actor may do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Permissions {
    /// A policy is loaded (without one, every action is allowed and nothing is listed).
    pub policy: bool,
    /// By rule.
    pub permissions: Vec<environment_policy::Permission>,
}

pub(super) fn what_may(g: &Session<'_>, p: WhatMayParams) -> Result<Permissions, ServiceError> {
    g.allow(
        Action::Read,
        Resource::Environment,
        Some("policy.what_may_i_do"),
    )?;
    let under = p.resource.resource()?;
    let Some(policy) = g.shared().policy.as_deref() else {
        // No rules to list: `policy: false` says so, and policy.explain still answers.
        return Ok(Permissions {
            policy: false,
            permissions: Vec::new(),
        });
    };
    let perms = policy.what_may(g.actor().as_str(), &under);
    Ok(Permissions {
        policy: true,
        permissions: perms,
    })
}

/// Files an approval request for an action of the workspace's actor that the policy holds for
/// approval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalParams {
    /// The action, as policy.explain takes it.
    pub action: String,
    /// What it is done to.
    pub resource: ResourceParam,
    /// The `operation` attribute of the request.
    #[serde(default)]
    pub operation: Option<String>,
}

/// An approval request and where it stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    /// Its id: present it with the request once granted.
    pub id: String,
    /// `pending`, `granted`, `rejected`, `expired` or `used`.
    pub state: String,
    /// Who asked.
    pub actor: String,
    /// Who may decide.
    pub from: Vec<String>,
    /// The rules that hold the action for approval.
    pub rules: Vec<String>,
    /// The action asked for.
    pub action: String,
    /// What it is done to.
    pub resource: String,
    /// Uses left, once granted.
    pub uses_left: Option<u32>,
}

impl From<environment_policy::Approval> for Approval {
    fn from(a: environment_policy::Approval) -> Approval {
        let uses_left = match a.state {
            ApprovalState::Granted { uses_left, .. } => Some(uses_left),
            _ => None,
        };
        Approval {
            state: a.state.name().to_owned(),
            id: a.id,
            actor: a.actor,
            from: a.from,
            rules: a.rules,
            action: a.action,
            resource: a.resource,
            uses_left,
        }
    }
}

/// Files the approval request for an action of the caller's that the policy holds for
/// approval. Nothing else gates it: the rule that asks for an approval lets the actor ask (as
/// the action itself would file the request), and a request the policy does not hold is
/// refused.
pub(super) fn approval_request(
    g: &Session<'_>,
    p: ApprovalParams,
) -> Result<Approval, ServiceError> {
    let policy = policy(g)?;
    let req = g.request(
        action_of(&p.action)?,
        p.resource.resource()?,
        p.operation.as_deref(),
    );
    let a = policy.request_approval(&req).map_err(ServiceError::from)?;
    Ok(Approval::from(a))
}

/// Where one of the workspace actor's approval requests stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalStatusParams {
    /// The approval request's id, as approval.request or a refusal gave it.
    pub id: String,
}

/// Where an approval request of the caller's stands. Another actor's request is not found: the
/// caller learns nothing of what others asked.
pub(super) fn approval_status(
    g: &Session<'_>,
    p: ApprovalStatusParams,
) -> Result<Approval, ServiceError> {
    let policy = policy(g)?;
    g.allow(Action::Read, Resource::Environment, Some("approval.status"))?;
    let a = policy
        .approval(&p.id)
        .filter(|a| a.actor == g.actor().as_str())
        .ok_or_else(|| {
            ServiceError::new(
                ErrorKind::NotFound,
                format!("there is no approval request {} of yours", p.id),
                "file one with approval.request.",
            )
        })?;
    Ok(Approval::from(a))
}

/// Grants a pending approval request, as the workspace's actor. The policy decides who may: an
/// actor the request names as its approver (or a member of a group it names), never the one
/// who asked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GrantParams {
    /// The approval request's id.
    pub id: String,
    /// For this many requests (default 1).
    #[serde(default)]
    pub uses: Option<u32>,
    /// Until then, ms since the epoch (default: no end).
    #[serde(default)]
    pub expires_at_ms: Option<i64>,
}

/// Rejects a pending approval request, as the workspace's actor (who may, as for a grant).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectParams {
    /// The approval request's id.
    pub id: String,
}

pub(super) fn approval_grant(g: &Session<'_>, p: GrantParams) -> Result<Approval, ServiceError> {
    let scope = environment_policy::GrantScope {
        uses: p.uses.unwrap_or(1),
        expires_at: p.expires_at_ms,
    };
    let a = policy(g)?
        .grant(&p.id, g.actor().as_str(), scope)
        .map_err(ServiceError::from)?;
    Ok(Approval::from(a))
}

pub(super) fn approval_reject(g: &Session<'_>, p: RejectParams) -> Result<Approval, ServiceError> {
    let a = policy(g)?
        .reject(&p.id, g.actor().as_str())
        .map_err(ServiceError::from)?;
    Ok(Approval::from(a))
}
