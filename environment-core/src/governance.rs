//! The governance port: the questions a workspace asks of its policy and the administration it
//! does through it (explain a decision, list what an actor may do, file, grant and reject
//! approval requests, load rules, add members). `environment-policy` implements it; the
//! workspace service holds an `Arc<dyn Governance>` and never the policy's own types.
//!
//! A governance is also the [`Authorizer`] whose pure decision every action goes through, so
//! one value answers both the use cases about the policy and the checks of every other one.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::authz::{AccessRequest, ActorId, Authorizer, Resource};
use crate::error::PortError;

/// The policy as the workspace service sees it.
pub trait Governance: Authorizer {
    /// The policy's current version (bumped by every change of rules or relations).
    fn version(&self) -> u64;
    /// Why `request` would be allowed, held or refused: a dry run that spends nothing.
    fn explain(&self, request: &AccessRequest) -> Explained;
    /// The permits that reach `under` for `actor`, with their conditions and exceptions.
    fn what_may(&self, actor: &ActorId, under: &Resource) -> Vec<Permission>;
    /// Files (or finds the pending) approval request for `request`, which the policy must hold
    /// for approval.
    fn request_approval(&self, request: &AccessRequest) -> Result<Approval, PortError>;
    /// One approval request.
    fn approval(&self, id: &str) -> Option<Approval>;
    /// Every approval request, oldest first.
    fn approvals(&self) -> Vec<Approval>;
    /// Grants a pending approval request as `approver`, who must be one it names (or in a
    /// group it names) and not the one who asked.
    fn grant(&self, id: &str, approver: &ActorId, scope: GrantScope)
    -> Result<Approval, PortError>;
    /// Rejects a pending approval request as `approver` (who may, as for a grant).
    fn reject(&self, id: &str, approver: &ActorId) -> Result<Approval, PortError>;
    /// Whether a rule file (TOML) reads, without loading it.
    fn check_rules(&self, rules: &str) -> Result<(), PortError>;
    /// Replaces the rules with a rule file (TOML), as one new version; a file with issues
    /// changes nothing.
    fn load_rules(&self, rules: &str) -> Result<PolicyChanged, PortError>;
    /// Records `member ∈ group` (a group or role); returns the policy's version.
    fn add_member(&self, member: &str, group: &str) -> Result<u64, PortError>;
}

/// What a grant allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantScope {
    /// How many times the approved request may pass (at least once).
    pub uses: u32,
    /// When the grant lapses, ms since the epoch, if ever.
    pub expires_at_ms: Option<i64>,
}

/// A decision explained.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Explained {
    /// Whether the action would be allowed now.
    pub allowed: bool,
    /// `allow`, `deny` or `needs_approval`.
    pub outcome: String,
    /// The rules that decided it.
    pub rules: Vec<String>,
    /// Who may approve it, when it needs an approval.
    pub approvers: Vec<String>,
    /// The policy's version.
    pub policy_version: u64,
    /// Why, in words.
    pub explanation: String,
}

/// A permission: a permit that reaches a resource for an actor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Permission {
    /// The action.
    pub action: String,
    /// The permit that grants it.
    pub rule: String,
    /// The permit's resource pattern.
    pub resource: String,
    /// Its conditions, in words (empty when none).
    pub conditions: String,
    /// Forbids that may carve exceptions out of it.
    pub except: Vec<String>,
    /// The delegation it comes through, when it is another actor's right lent to this one.
    pub via: Option<String>,
}

/// An approval request and where it stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Approval {
    /// Its id: present it with the request once granted.
    pub id: String,
    /// `pending`, `granted`, `used up` or `rejected`.
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
    /// When it was filed, ms since the epoch.
    pub created_ms: i64,
}

/// The policy after a change of its rules.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyChanged {
    /// Its version now.
    pub version: u64,
    /// Its rules.
    pub rules: usize,
}
