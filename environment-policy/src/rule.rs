//! Rules: permit or forbid, for a principal, some actions, a resource pattern, under conditions.

use std::fmt;

use crate::condition::Conditions;
use crate::resource::ResourcePattern;

/// Whether a rule allows or refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Effect {
    /// Allows, unless a forbid applies.
    Permit,
    /// Refuses, whatever permits say.
    Forbid,
}

impl Effect {
    /// `permit` or `forbid`.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::Permit => "permit",
            Effect::Forbid => "forbid",
        }
    }
}

/// The kinds of actors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ActorKind {
    /// A person.
    Human,
    /// An AI agent.
    Agent,
    /// A program acting on its own behalf.
    Service,
}

impl ActorKind {
    /// The kind of an id spelled `kind:name`, if it is an actor's.
    pub fn of(id: &str) -> Option<ActorKind> {
        match id.split_once(':')?.0 {
            "human" => Some(ActorKind::Human),
            "agent" => Some(ActorKind::Agent),
            "service" => Some(ActorKind::Service),
            _ => None,
        }
    }

    /// `human`, `agent` or `service`.
    pub fn as_str(self) -> &'static str {
        match self {
            ActorKind::Human => "human",
            ActorKind::Agent => "agent",
            ActorKind::Service => "service",
        }
    }
}

/// Whether an id names a group or a role (something that has members).
pub fn is_group(id: &str) -> bool {
    id.starts_with("group:") || id.starts_with("role:")
}

/// Whom a rule is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Principal {
    /// Everyone (`*`).
    Anyone,
    /// Every actor of a kind (`kind:agent`).
    Kind(ActorKind),
    /// One actor, or every member (transitively) of a group or role (`group:coders`).
    Entity(String),
}

impl Principal {
    /// Parses `*`, `kind:<human|agent|service>` or an entity id `kind:name`.
    pub fn parse(s: &str) -> Option<Principal> {
        if s == "*" {
            return Some(Principal::Anyone);
        }
        if let Some(k) = s.strip_prefix("kind:") {
            return ActorKind::of(&format!("{k}:x")).map(Principal::Kind);
        }
        let (kind, name) = s.split_once(':')?;
        let ok = !kind.is_empty()
            && !name.is_empty()
            && s.len() <= environment_core::authz::MAX_ACTOR_LEN
            && !s.chars().any(char::is_control);
        ok.then(|| Principal::Entity(s.to_owned()))
    }
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Principal::Anyone => f.write_str("*"),
            Principal::Kind(k) => write!(f, "kind:{}", k.as_str()),
            Principal::Entity(e) => f.write_str(e),
        }
    }
}

/// One rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// A unique name, quoted in decisions (`secrets-readonly`).
    pub id: String,
    /// Permit or forbid.
    pub effect: Effect,
    /// Whom it is about.
    pub principal: Principal,
    /// Action names (builtins or the schema's); `*` for every action.
    pub actions: Vec<String>,
    /// What it is about.
    pub resource: ResourcePattern,
    /// When it applies.
    pub conditions: Conditions,
    /// What an agent should do when this rule refuses it (`ask a human with role maintainer`).
    pub advice: Option<String>,
}

impl Rule {
    /// A permit without conditions.
    pub fn permit(
        id: &str,
        principal: Principal,
        actions: &[&str],
        resource: ResourcePattern,
    ) -> Rule {
        Rule::new(id, Effect::Permit, principal, actions, resource)
    }

    /// A forbid without conditions.
    pub fn forbid(
        id: &str,
        principal: Principal,
        actions: &[&str],
        resource: ResourcePattern,
    ) -> Rule {
        Rule::new(id, Effect::Forbid, principal, actions, resource)
    }

    fn new(
        id: &str,
        effect: Effect,
        principal: Principal,
        actions: &[&str],
        resource: ResourcePattern,
    ) -> Rule {
        Rule {
            id: id.to_owned(),
            effect,
            principal,
            actions: actions.iter().map(|a| (*a).to_owned()).collect(),
            resource,
            conditions: Conditions::default(),
            advice: None,
        }
    }

    /// The same rule with these conditions.
    pub fn with_conditions(mut self, conditions: Conditions) -> Rule {
        self.conditions = conditions;
        self
    }

    /// The same rule with advice for a refused agent.
    pub fn with_advice(mut self, advice: &str) -> Rule {
        self.advice = Some(advice.to_owned());
        self
    }

    /// Whether the rule names this action (or every action).
    pub fn names_action(&self, action: &str) -> bool {
        self.actions.iter().any(|a| a == "*" || a == action)
    }
}
