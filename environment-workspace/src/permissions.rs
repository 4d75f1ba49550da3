//! The policy methods: what the policy would decide and why, what the caller may do, and
//! approval requests. They describe the caller's own rights only.

use environment_core::{Action, EnvError, ErrorKind, Key, KeyPrefix, Namespace, Resource};
use environment_policy::ApprovalState;
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ServiceError;
use super::session::Session;

/// A resource as the policy methods name it: exactly one field set.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct ResourceParam {
    path: Option<String>,
    prefix: Option<String>,
    object: Option<String>,
    branch: Option<String>,
    topic: Option<String>,
    program: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    service: Option<String>,
    secret: Option<String>,
    environment: Option<bool>,
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExplainParams {
    action: String,
    resource: ResourceParam,
    #[serde(default)]
    operation: Option<String>,
}

pub(super) fn policy<'a>(
    g: &'a Session<'_>,
) -> Result<&'a environment_policy::Policy, ServiceError> {
    g.shared()
        .policy
        .as_deref()
        .ok_or_else(|| ServiceError::unavailable("a policy"))
}

pub(super) fn explain(g: &Session<'_>, p: ExplainParams) -> Result<Value, ServiceError> {
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
        return Ok(json!({
            "allowed": d.is_allowed(),
            "outcome": if d.is_allowed() { "allow" } else { "deny" },
            "rules": d.rules,
            "approvers": [],
            "policy_version": d.policy_version,
            "explanation": explanation,
        }));
    };
    // A dry run: explaining spends no quota, approval or token use.
    let d = policy.evaluate(&req);
    Ok(json!({
        "allowed": d.is_allowed(),
        "outcome": format!("{:?}", d.outcome()).to_lowercase(),
        "rules": d.rule_ids().collect::<Vec<_>>(),
        "approvers": d.approvers(),
        "policy_version": d.policy_version(),
        "explanation": d.explain(&req),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct WhatMayParams {
    resource: ResourceParam,
}

pub(super) fn what_may(g: &Session<'_>, p: WhatMayParams) -> Result<Value, ServiceError> {
    g.allow(
        Action::Read,
        Resource::Environment,
        Some("policy.what_may_i_do"),
    )?;
    let under = p.resource.resource()?;
    let Some(policy) = g.shared().policy.as_deref() else {
        // No rules to list: `policy: false` says so, and policy.explain still answers.
        return Ok(json!({ "policy": false, "permissions": [] }));
    };
    let perms = policy.what_may(g.shared().actor.as_str(), &under);
    Ok(json!({
        "policy": true,
        "permissions": perms.iter().map(|p| json!({
            "action": p.action,
            "rule": p.rule,
            "resource": p.resource,
            "conditions": p.conditions,
            "except": p.except,
            "via": p.via,
        })).collect::<Vec<_>>(),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ApprovalParams {
    action: String,
    resource: ResourceParam,
    #[serde(default)]
    operation: Option<String>,
}

/// Files the approval request for an action of the caller's that the policy holds for
/// approval. Nothing else gates it: the rule that asks for an approval lets the actor ask (as
/// the action itself would file the request), and a request the policy does not hold is
/// refused.
pub(super) fn approval_request(g: &Session<'_>, p: ApprovalParams) -> Result<Value, ServiceError> {
    let policy = policy(g)?;
    let req = g.request(
        action_of(&p.action)?,
        p.resource.resource()?,
        p.operation.as_deref(),
    );
    let a = policy.request_approval(&req).map_err(ServiceError::from)?;
    Ok(json!({
        "id": a.id,
        "state": a.state.name(),
        "from": a.from,
        "rules": a.rules,
        "action": a.action,
        "resource": a.resource,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ApprovalStatusParams {
    id: String,
}

/// Where an approval request of the caller's stands. Another actor's request is not found: the
/// caller learns nothing of what others asked.
pub(super) fn approval_status(
    g: &Session<'_>,
    p: ApprovalStatusParams,
) -> Result<Value, ServiceError> {
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
    let uses_left = match a.state {
        ApprovalState::Granted { uses_left, .. } => Some(uses_left),
        _ => None,
    };
    Ok(json!({
        "id": a.id,
        "state": a.state.name(),
        "uses_left": uses_left,
        "from": a.from,
        "action": a.action,
        "resource": a.resource,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DecideParams {
    id: String,
    #[serde(default)]
    uses: Option<u32>,
    #[serde(default)]
    expires_at_ms: Option<i64>,
}

/// Grants (for `uses` requests, default one, until `expires_at_ms` if given) or rejects a
/// pending approval request, as the workspace's actor. The policy decides who may: an actor the
/// request names as its approver (or a member of a group it names), never the one who asked.
pub(super) fn approval_decide(
    g: &Session<'_>,
    p: DecideParams,
    grant: bool,
) -> Result<Value, ServiceError> {
    let policy = policy(g)?;
    let approver = g.actor().as_str();
    let a = if grant {
        let scope = environment_policy::GrantScope {
            uses: p.uses.unwrap_or(1),
            expires_at: p.expires_at_ms,
        };
        policy.grant(&p.id, approver, scope)
    } else {
        if p.uses.is_some() || p.expires_at_ms.is_some() {
            return Err(ServiceError::invalid("a rejection takes only `id`"));
        }
        policy.reject(&p.id, approver)
    }
    .map_err(ServiceError::from)?;
    Ok(json!({
        "id": a.id,
        "state": a.state.name(),
        "actor": a.actor,
        "action": a.action,
        "resource": a.resource,
    }))
}
