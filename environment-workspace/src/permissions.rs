//! The policy methods: what the policy would decide and why, what the caller may do, and
//! approval requests. They describe the caller's own rights only.

use environment_core::governance::GrantScope;
pub use environment_core::governance::{Approval, Explained, Permission, PolicyChanged};
use environment_core::{
    Action, ActorId, EnvError, ErrorKind, Governance, Key, KeyPrefix, Namespace, Resource,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::error::ServiceError;
use super::session::Session;

/// A resource as the policy methods take it: the text people write, parsed here for every
/// door (the CLI, MCP and the web view send what was typed), or its fields.
///
/// ```
/// use environment_workspace::permissions::ResourceParam;
///
/// let typed: ResourceParam = serde_json::from_value(serde_json::json!("program:cargo test")).unwrap();
/// let fields: ResourceParam =
///     serde_json::from_value(serde_json::json!({ "program": "cargo", "args": ["test"] })).unwrap();
/// assert_eq!(typed.fields().unwrap(), fields.fields().unwrap());
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, JsonSchema)]
#[serde(untagged)]
pub enum ResourceParam {
    /// `path:GLOB` (or a bare path), `prefix:P`, `object:KIND/KEY`, `branch:B`, `topic:T`,
    /// `secret:S`, `service:URL`, `program:PROG ARGS…`, or `environment`.
    Text(String),
    /// Exactly one field set.
    Fields(ResourceFields),
}

impl From<&str> for ResourceParam {
    fn from(text: &str) -> ResourceParam {
        ResourceParam::Text(text.to_owned())
    }
}

/// A string is the text form, an object the fields: each with its own error (an untagged
/// enum would only say that nothing matched).
impl<'de> Deserialize<'de> for ResourceParam {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ResourceParam, D::Error> {
        struct Either;
        impl<'de> serde::de::Visitor<'de> for Either {
            type Value = ResourceParam;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a resource: text such as \"path:src/**\", \"program:cargo test\" or \
                     \"environment\", or an object with one of path, prefix, object, branch, \
                     topic, program (+ args), service, secret, environment",
                )
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<ResourceParam, E> {
                Ok(ResourceParam::Text(text.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<ResourceParam, A::Error> {
                ResourceFields::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(ResourceParam::Fields)
            }
        }
        d.deserialize_any(Either)
    }
}

impl ResourceParam {
    /// The fields, the text parsed.
    pub fn fields(self) -> Result<ResourceFields, ServiceError> {
        match self {
            ResourceParam::Text(text) => text.parse(),
            ResourceParam::Fields(f) => Ok(f),
        }
    }

    fn resource(self) -> Result<Resource, ServiceError> {
        self.fields()?.resource()
    }
}

/// A resource's fields: exactly one set (`args` goes with `program`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceFields {
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

impl std::str::FromStr for ResourceFields {
    type Err = ServiceError;

    /// A resource as people write it: `path:GLOB` (or a bare path), `prefix:P`,
    /// `object:KIND/KEY`, `branch:B`, `topic:T`, `secret:S`, `service:URL`,
    /// `program:PROG ARGS…`, or `environment`.
    fn from_str(text: &str) -> Result<ResourceFields, ServiceError> {
        let mut p = ResourceFields::default();
        if text == "environment" {
            p.environment = Some(true);
            return Ok(p);
        }
        let (kind, rest) = text.split_once(':').unwrap_or(("path", text));
        let rest = Some(rest.to_owned());
        match kind {
            "path" => p.path = rest,
            "prefix" => p.prefix = rest,
            "object" => p.object = rest,
            "branch" => p.branch = rest,
            "topic" => p.topic = rest,
            "secret" => p.secret = rest,
            "service" => p.service = rest,
            "environment" => p.environment = Some(true),
            "program" => {
                let mut words = text[kind.len() + 1..].split_whitespace().map(str::to_owned);
                p.program = words.next();
                p.args = words.collect();
                if p.program.is_none() {
                    return Err(ServiceError::invalid(
                        "a program resource needs a program: `program:NAME ARGS…`",
                    ));
                }
            }
            other => {
                return Err(ServiceError::invalid(format!(
                    "{other:?} is not a kind of resource: use path:, prefix:, object:, branch:, \
                     topic:, secret:, service:, program: or environment"
                )));
            }
        }
        Ok(p)
    }
}

impl ResourceFields {
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

/// Whom a policy question is about, once the caller may ask it: about themselves, a read of the
/// environment as `operation`; about anyone else, a read of its policy (`policy.inspect`).
fn asked_about(
    g: &Session<'_>,
    actor: Option<&str>,
    operation: &str,
) -> Result<ActorId, ServiceError> {
    let whom = match actor {
        None => g.actor().clone(),
        Some(a) => ActorId::new(a).map_err(ServiceError::invalid)?,
    };
    let operation = if &whom == g.actor() {
        operation
    } else {
        "policy.inspect"
    };
    g.allow(Action::Read, Resource::Environment, Some(operation))?;
    Ok(whom)
}

/// An action by name: a built-in one, or one a policy's schema declares (letters, digits, `-`
/// and `_`).
pub(super) fn action_of(name: &str) -> Result<Action, ServiceError> {
    let spelled = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !spelled {
        return Err(ServiceError::invalid(format!(
            "{name:?} is not an action: use read, write, delete, execute, publish, consume, \
             approve, delegate, or an action the rules' schema declares"
        )));
    }
    Ok(Action::named(name))
}

/// Explains what the policy would decide on an action of the workspace's actor, and why
/// (nothing is spent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExplainParams {
    /// Whose request (default: the caller's own). Asking about someone else is a read of the
    /// environment's policy (`policy.inspect`).
    #[serde(default)]
    pub actor: Option<String>,
    /// read, write, delete, execute, publish or consume (or an action the policy declares).
    pub action: String,
    /// What it is done to.
    pub resource: ResourceParam,
    /// The `operation` attribute of the request (e.g. `restore`).
    #[serde(default)]
    pub operation: Option<String>,
}

pub(super) fn policy<'a>(g: &'a Session<'_>) -> Result<&'a dyn Governance, ServiceError> {
    g.shared()
        .policy
        .as_deref()
        .ok_or_else(|| ServiceError::unavailable("a policy"))
}

pub(super) fn explain(g: &Session<'_>, p: ExplainParams) -> Result<Explained, ServiceError> {
    let whom = asked_about(g, p.actor.as_deref(), "policy.explain")?;
    let mut req = g.request(
        action_of(&p.action)?,
        p.resource.resource()?,
        p.operation.as_deref(),
    );
    req.actor = whom;
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
    Ok(policy.explain(&req))
}

/// Lists what the workspace's actor may do under a resource, by rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WhatMayParams {
    /// Whose rights (default: the caller's own; anyone else's is a `policy.inspect` read).
    #[serde(default)]
    pub actor: Option<String>,
    /// Where to look (default: the whole workspace).
    #[serde(default)]
    pub resource: Option<ResourceParam>,
}

/// What the actor may do.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Permissions {
    /// A policy is loaded (without one, every action is allowed and nothing is listed).
    pub policy: bool,
    /// By rule.
    pub permissions: Vec<Permission>,
}

pub(super) fn what_may(g: &Session<'_>, p: WhatMayParams) -> Result<Permissions, ServiceError> {
    let whom = asked_about(g, p.actor.as_deref(), "policy.what_may_i_do")?;
    let under = p
        .resource
        .unwrap_or_else(|| ResourceParam::from("prefix:"))
        .resource()?;
    let Some(policy) = g.shared().policy.as_deref() else {
        // No rules to list: `policy: false` says so, and policy.explain still answers.
        return Ok(Permissions {
            policy: false,
            permissions: Vec::new(),
        });
    };
    let perms = policy.what_may(&whom, &under);
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
    Ok(policy.request_approval(&req)?)
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
    Ok(a)
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
    let scope = GrantScope {
        uses: p.uses.unwrap_or(1),
        expires_at_ms: p.expires_at_ms,
    };
    Ok(policy(g)?.grant(&p.id, g.actor(), scope)?)
}

pub(super) fn approval_reject(g: &Session<'_>, p: RejectParams) -> Result<Approval, ServiceError> {
    Ok(policy(g)?.reject(&p.id, g.actor())?)
}

/// Replaces the policy's rules with a TOML rule file, as one new version: writing the
/// environment as a whole (`policy.load`). A file with issues changes nothing. A workspace
/// without a policy has none to replace: its first rules are loaded on its stores.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LoadParams {
    /// The rule file's text (TOML).
    pub rules: String,
}

pub(super) fn load(g: &Session<'_>, p: LoadParams) -> Result<PolicyChanged, ServiceError> {
    let policy = policy(g)?;
    // A file that does not read is refused as invalid before anyone is asked.
    policy.check_rules(&p.rules)?;
    g.allow(Action::Write, Resource::Environment, Some("policy.load"))?;
    Ok(policy.load_rules(&p.rules)?)
}

/// Adds an actor to a group or role of the policy: writing the environment as a whole
/// (`policy.member`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MemberParams {
    /// The actor (`kind:name`).
    pub member: String,
    /// The group (`group:…` or `role:…`).
    pub group: String,
}

/// A membership added.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Membership {
    /// The actor.
    pub member: String,
    /// The group.
    pub group: String,
    /// The policy's version now.
    pub version: u64,
}

pub(super) fn member(g: &Session<'_>, p: MemberParams) -> Result<Membership, ServiceError> {
    let policy = policy(g)?;
    g.allow(Action::Write, Resource::Environment, Some("policy.member"))?;
    let version = policy.add_member(&p.member, &p.group)?;
    Ok(Membership {
        member: p.member,
        group: p.group,
        version,
    })
}

/// Every approval request, pending and decided, a page at a time: a read of the environment
/// (`approval.list`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ApprovalListParams {
    /// The page after this request (the `next` of the previous page).
    #[serde(default)]
    pub after: Option<String>,
    /// At most this many (default and most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// Approval requests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Approvals {
    /// Oldest first.
    pub approvals: Vec<Approval>,
    /// Where the next page starts (`after`), when more follow.
    #[serde(default)]
    pub next: Option<String>,
}

pub(super) fn approval_list(
    g: &Session<'_>,
    p: ApprovalListParams,
) -> Result<Approvals, ServiceError> {
    let policy = policy(g)?;
    g.allow(Action::Read, Resource::Environment, Some("approval.list"))?;
    let all = policy.approvals();
    let limit = p.limit.unwrap_or(1000).min(1000);
    let (approvals, next) = super::page::page(all, |a| a.id.clone(), p.after.as_ref(), limit)?;
    Ok(Approvals { approvals, next })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_read_as_people_write_them() {
        let r = |t: &str| ResourceParam::from(t).resource();
        assert_eq!(
            r("src/main.rs").unwrap(),
            Resource::Key(Key::fs("src/main.rs").unwrap())
        );
        assert_eq!(
            r("program:cargo test --all").unwrap(),
            Resource::Program {
                program: "cargo".into(),
                args: vec!["test".into(), "--all".into()],
            }
        );
        assert_eq!(r("topic:t").unwrap(), Resource::Topic("t".into()));
        assert_eq!(r("environment").unwrap(), Resource::Environment);
        assert_eq!(
            r("prefix:").unwrap(),
            Resource::Prefix(KeyPrefix::all(Namespace::Fs))
        );
        for bad in [
            "path:../x",
            "path:/abs",
            "program:",
            "planet:mars",
            "prefix:a//b",
        ] {
            assert_eq!(r(bad).unwrap_err().kind(), ErrorKind::Invalid, "{bad}");
        }
    }

    #[test]
    fn actions_are_builtin_or_declared_names() {
        assert_eq!(action_of("write").unwrap(), Action::Write);
        assert_eq!(
            action_of("deploy").unwrap(),
            Action::Custom("deploy".into())
        );
        for bad in ["fly!", "", "a b"] {
            assert_eq!(action_of(bad).unwrap_err().kind(), ErrorKind::Invalid);
        }
    }
}
