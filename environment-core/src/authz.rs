//! The `Authorizer` port: who may do what. Core asks; environment-policy answers.
//!
//! Core maps each of its operations onto one [`AccessRequest`]:
//! - `act`: [`Action::Write`] (put) or [`Action::Delete`] on [`Resource::Key`] for every changed key;
//! - `read`/`list`/`diff`/`history`: [`Action::Read`] on the key, the prefix or the branch;
//! - branch creation, merge, restore, undo, mark: [`Action::Write`] on [`Resource::Branch`], with the
//!   operation's name in the context attribute `operation`;
//! - effects: [`Action::Execute`] on [`Resource::Service`] (the effect's target);
//! - gc: [`Action::Delete`] on [`Resource::Environment`]; verify: [`Action::Read`] on it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::key::{Key, KeyPrefix};

/// The longest actor id accepted.
pub const MAX_ACTOR_LEN: usize = 128;

/// Who acts: a human, an agent or a service, spelled `kind:name` by convention
/// (`agent:coder-1`, `human:alice`).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "String")]
pub struct ActorId(String);

/// An actor id that is empty, too long, contains control characters, or spells a principal
/// that stands for many actors (`*`, `kind:agent`…).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid actor id {0:?}: it must be 1..=128 printable characters, and neither `*` nor \
     `kind:…` (those name every actor, or every actor of a kind, in a policy)"
)]
pub struct ActorIdError(pub String);

impl ActorId {
    /// Validates an actor id.
    pub fn new(id: impl Into<String>) -> Result<ActorId, ActorIdError> {
        let id = id.into();
        // A policy's principals `*` and `kind:agent` are spelled as ids: an actor named so
        // would be granted every rule written for all actors, or for a whole kind.
        let reserved = id == "*" || id.starts_with("kind:");
        if id.is_empty() || id.len() > MAX_ACTOR_LEN || id.chars().any(char::is_control) || reserved
        {
            return Err(ActorIdError(id));
        }
        Ok(ActorId(id))
    }

    /// The environment itself, as the author of its own bookkeeping operations.
    pub fn system() -> ActorId {
        ActorId("system:environment".to_owned())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ActorId {
    type Error = ActorIdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        ActorId::new(s)
    }
}

impl From<ActorId> for String {
    fn from(a: ActorId) -> String {
        a.0
    }
}

/// Written as its string, borrowed (an actor is encoded in every operation record).
impl Serialize for ActorId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl schemars::JsonSchema for ActorId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ActorId".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "An actor, `kind:name` (e.g. `agent:coder-1`, `human:alice`).",
        })
    }
}

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ActorId({})", self.0)
    }
}

/// What an actor wants to do.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Action {
    /// Read a key, a prefix, a branch's history.
    Read,
    /// Create or change.
    Write,
    /// Remove.
    Delete,
    /// Run a program or perform an external effect.
    Execute,
    /// Publish to a queue topic.
    Publish,
    /// Consume from a queue topic.
    Consume,
    /// Grant or reject an approval request.
    Approve,
    /// Hand rights to another actor.
    Delegate,
    /// An action declared by the policy's schema.
    Custom(String),
}

impl Action {
    /// The action a name stands for: one of the built-in names, else a custom action (the
    /// inverse of [`Action::as_str`]; callers decide which custom names they accept).
    pub fn named(name: &str) -> Action {
        match name {
            "read" => Action::Read,
            "write" => Action::Write,
            "delete" => Action::Delete,
            "execute" => Action::Execute,
            "publish" => Action::Publish,
            "consume" => Action::Consume,
            "approve" => Action::Approve,
            "delegate" => Action::Delegate,
            other => Action::Custom(other.to_owned()),
        }
    }

    /// The action's name as rules spell it.
    pub fn as_str(&self) -> &str {
        match self {
            Action::Read => "read",
            Action::Write => "write",
            Action::Delete => "delete",
            Action::Execute => "execute",
            Action::Publish => "publish",
            Action::Consume => "consume",
            Action::Approve => "approve",
            Action::Delegate => "delegate",
            Action::Custom(s) => s,
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an action is done to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Resource {
    /// One key: a workspace path (`fs`) or a domain object (`obj`).
    Key(Key),
    /// Everything under a prefix (listing, diffing).
    Prefix(KeyPrefix),
    /// A branch (history, merge, restore, marks).
    Branch(String),
    /// A secret, by reference name.
    Secret(String),
    /// An external service or network endpoint, as a URL or a target name.
    Service(String),
    /// A program to execute with its arguments.
    Program {
        /// The program (a path or a name looked up on `PATH`).
        program: String,
        /// Its arguments.
        args: Vec<String>,
    },
    /// A queue topic.
    Topic(String),
    /// The environment as a whole (gc, verify).
    Environment,
}

/// How risky an action is judged by the caller; conditions may depend on it.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum Risk {
    /// Routine.
    #[default]
    Low,
    /// Worth a second look.
    Medium,
    /// Destructive or hard to undo.
    High,
}

/// A value of a request attribute.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum AttrValue {
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A string.
    Str(String),
}

/// Everything about a request besides who, what and to what.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Context {
    /// The branch the action works on.
    pub branch: Option<String>,
    /// The caller's judgement of the action's risk.
    pub risk: Risk,
    /// Free attributes (`operation`, `kind`, …) that conditions may test.
    pub attrs: BTreeMap<String, AttrValue>,
    /// A serialized capability token presented with the request.
    pub token: Option<String>,
    /// The id of a granted approval presented with the request.
    pub approval: Option<String>,
}

/// One question for the [`Authorizer`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccessRequest {
    /// Who asks.
    pub actor: ActorId,
    /// What they want to do.
    pub action: Action,
    /// To what.
    pub resource: Resource,
    /// Under which circumstances.
    pub context: Context,
}

/// The answer's outcome.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Verdict {
    /// The action may happen.
    Allow,
    /// The action must not happen.
    Deny,
    /// A change made in a tree on top of a version the branch has moved past, to a key the
    /// branch changed since (in another working copy, or through the API): kept as a refused
    /// change, never laid over the newer value (see `Refusal::Record`).
    Stale {
        /// The operations that changed the key since (newest first, the first few).
        by: Vec<String>,
    },
    /// The action may happen once someone approves it.
    NeedsApproval {
        /// What must be approved, in words.
        what: String,
        /// Who may approve (actors or groups).
        from: Vec<String>,
        /// The id of the durable approval request, when one was filed.
        request: Option<String>,
    },
}

/// An answer with its reasons.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Allow, deny or needs approval.
    pub verdict: Verdict,
    /// The ids of the rules that decided it (empty for a default deny).
    pub rules: Vec<String>,
    /// The version of the policy that decided it.
    pub policy_version: u64,
    /// Why, in one sentence an LLM can act on (no final stop); may be empty for an allow.
    pub explanation: String,
    /// What to do next after a refusal, in a few words; empty when the decider has no advice
    /// (the door then gives its own).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub next: String,
    /// What an allow consumes (quota, approval and token uses), spent by
    /// [`Authorizer::spend`] with the action it allowed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spend: Vec<Spend>,
}

/// One use an allowed request consumes. A decision only lists its uses; they are spent with
/// the action (in its transaction, after every other check it can fail), so a refused or
/// conflicting action spends nothing.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Spend {
    /// One use of a rule's quota by an actor: at most `count` in each window of `window_secs`.
    Quota {
        /// The rule's id.
        rule: String,
        /// Whose quota.
        actor: String,
        /// Uses per window.
        count: u32,
        /// The window's length in seconds.
        window_secs: u64,
    },
    /// One use of a granted approval.
    Approval {
        /// The approval's id.
        id: String,
    },
    /// One use of a capability token's caveat, by the caveat's tag: at most `max`.
    TokenUse {
        /// The caveat's tag (hex).
        tag: String,
        /// Uses allowed.
        max: u32,
    },
}

impl Decision {
    /// An allow with no rule behind it (for [`AllowAll`]).
    pub fn allow_unconditionally() -> Decision {
        Decision {
            verdict: Verdict::Allow,
            rules: Vec::new(),
            policy_version: 0,
            next: String::new(),
            explanation: String::new(),
            spend: Vec::new(),
        }
    }

    /// Whether the action may happen now.
    pub fn is_allowed(&self) -> bool {
        matches!(self.verdict, Verdict::Allow)
    }
}

/// Decides whether an action may happen. Implementations must be fast (they sit on every action)
/// and must never allow by mistake: anything they cannot decide is a deny.
///
/// Deciding and spending are two steps: [`Authorizer::decide`] is pure (an allow lists what it
/// would consume), and [`Authorizer::spend`] consumes it, all or nothing. The environment decides
/// before its transaction and spends inside it, once every other check has passed.
pub trait Authorizer: Send + Sync {
    /// Decides one request, spending nothing.
    fn decide(&self, request: &AccessRequest) -> Decision;

    /// Decides several requests of one action (an act's keys), each as [`Authorizer::decide`]
    /// would, in order. An implementation may share work between them: a policy read live
    /// looks at its store once for all of them.
    fn decide_all(&self, requests: &[AccessRequest]) -> Vec<Decision> {
        requests.iter().map(|r| self.decide(r)).collect()
    }

    /// Spends the uses allowed decisions listed, all of them or none: a use no longer
    /// available (a quota filled by another action since) refuses with the returned decision.
    /// An authorizer whose decisions consume nothing need not implement it: by default any
    /// use listed is refused (it cannot be counted).
    fn spend(&self, uses: &[Spend]) -> Result<(), Box<Decision>> {
        if uses.is_empty() {
            return Ok(());
        }
        Err(Box::new(Decision {
            verdict: Verdict::Deny,
            rules: Vec::new(),
            policy_version: 0,
            next: String::new(),
            explanation: "this authorizer cannot count the uses its decision consumes".into(),
            spend: Vec::new(),
        }))
    }

    /// Decides and, for an allow, spends at once: for an action with no transaction of its own.
    fn authorize(&self, request: &AccessRequest) -> Decision {
        let decision = self.decide(request);
        if decision.is_allowed()
            && !decision.spend.is_empty()
            && let Err(refused) = self.spend(&decision.spend)
        {
            return *refused;
        }
        decision
    }
}

/// Allows everything. For an environment embedded by a single trusted program; anything shared
/// between actors should use environment-policy.
#[derive(Debug, Default, Clone, Copy)]
pub struct AllowAll;

impl Authorizer for AllowAll {
    fn decide(&self, _request: &AccessRequest) -> Decision {
        Decision::allow_unconditionally()
    }
}

/// The actor that records changes found in a tree which no request made (a person's editor, a
/// process outside every door): it witnesses what happened and decides nothing.
pub fn witness() -> ActorId {
    ActorId::new(WITNESS).unwrap_or_else(|_| ActorId::system())
}

const WITNESS: &str = "service:capture";

/// The one rule for captures, around the authorizer that decides everything else: the
/// [`witness`] reads the views it compares a tree with and records the keys it found changed
/// there (an act recorded as a capture, `operation` `capture`) whatever the policy says, since
/// refusing to record a change already on disk would only lose it. Nothing else is exempt: a
/// write of the witness's that is not a capture is decided like anyone's, and a capture
/// attributed to an agent (a supervised agent's changes are its acts) is decided as the
/// agent's. The workspace service refuses the witness as a caller, so no door lends it out.
pub struct WitnessRule(pub Arc<dyn Authorizer>);

impl WitnessRule {
    /// Whether `request` is the witness reading, or recording a change it found.
    fn exempt(request: &AccessRequest) -> bool {
        let capture = matches!(
            request.context.attrs.get("operation"),
            Some(AttrValue::Str(op)) if op == "capture"
        );
        request.actor.as_str() == WITNESS
            && match request.action {
                Action::Read => true,
                Action::Write | Action::Delete => {
                    capture && matches!(request.resource, Resource::Key(_))
                }
                _ => false,
            }
    }
}

impl Authorizer for WitnessRule {
    fn decide(&self, request: &AccessRequest) -> Decision {
        if WitnessRule::exempt(request) {
            return Decision::allow_unconditionally();
        }
        self.0.decide(request)
    }

    fn decide_all(&self, requests: &[AccessRequest]) -> Vec<Decision> {
        if requests.iter().any(WitnessRule::exempt) {
            return requests.iter().map(|r| self.decide(r)).collect();
        }
        self.0.decide_all(requests)
    }

    fn spend(&self, uses: &[Spend]) -> Result<(), Box<Decision>> {
        self.0.spend(uses)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Denies everything: the policy the witness's rule is tried against.
    struct DenyAll;

    impl Authorizer for DenyAll {
        fn decide(&self, _: &AccessRequest) -> Decision {
            Decision {
                verdict: Verdict::Deny,
                ..Decision::allow_unconditionally()
            }
        }
    }

    #[test]
    fn only_the_witness_recording_a_capture_is_exempt() {
        let rule = WitnessRule(Arc::new(DenyAll));
        let ask = |actor: ActorId, action: Action, operation: Option<&str>| {
            let mut context = Context::default();
            if let Some(op) = operation {
                context
                    .attrs
                    .insert("operation".into(), AttrValue::Str(op.into()));
            }
            let request = AccessRequest {
                actor,
                action,
                resource: Resource::Key(Key::fs("secrets/x").unwrap()),
                context,
            };
            let one = rule.decide(&request).is_allowed();
            let all = rule.decide_all(std::slice::from_ref(&request))[0].is_allowed();
            assert_eq!(one, all);
            one
        };
        let agent = ActorId::new("agent:coder").unwrap();
        // The witness records what it found, and reads the views it compares.
        assert!(ask(witness(), Action::Write, Some("capture")));
        assert!(ask(witness(), Action::Delete, Some("capture")));
        assert!(ask(witness(), Action::Read, None));
        // Anything else it asks for is the policy's to decide.
        assert!(!ask(witness(), Action::Write, None));
        assert!(!ask(witness(), Action::Write, Some("write")));
        assert!(!ask(witness(), Action::Execute, Some("capture")));
        // An agent's captures are its acts.
        assert!(!ask(agent.clone(), Action::Write, Some("capture")));
        assert!(!ask(agent, Action::Read, None));
    }

    #[test]
    fn an_action_is_named_by_what_it_spells() {
        for a in [
            Action::Read,
            Action::Write,
            Action::Delete,
            Action::Execute,
            Action::Publish,
            Action::Consume,
            Action::Approve,
            Action::Delegate,
            Action::Custom("deploy".into()),
        ] {
            assert_eq!(Action::named(a.as_str()), a);
        }
    }
}
