//! environment-policy: who may do what in an environment, decided in about a microsecond and
//! explained so that an agent can act on the answer.
//!
//! A [`Policy`] holds:
//! - **rules** ([`Rule`]): `permit` or `forbid` a principal (an actor, a group or role, a kind of
//!   actor, anyone) some actions on a typed resource ([`ResourcePattern`]: paths with
//!   segment-aware globs, objects, secrets, endpoints, services, programs with argument patterns,
//!   branches, topics), under conditions ([`Conditions`]: time window, branch, quota, risk,
//!   approval, context attributes). Default deny; any applicable forbid overrides every permit.
//!   Rules load from a TOML rule file ([`RuleFile`]) validated against a [`Schema`] with every
//!   problem reported at its line and column;
//! - **relations**: memberships in groups and roles, nested, with the transitive closure kept on
//!   write (a cycle is refused);
//! - **delegations** ([`Delegation`]): an actor lends a subset of its rights, evaluated live so
//!   they never exceed the delegator's and lapse with them;
//! - **approvals** ([`Approval`]): durable requests a human grants or rejects;
//! - **capability tokens** ([`CapabilityToken`]): rights intersected with limits, tamper-evident.
//!
//! Every change bumps the policy version; each [`Decision`] names it, with the rules that decided
//! and an explanation rendered only when asked. The policy implements environment-core's
//! [`Authorizer`](environment_core::Authorizer).
//!
//! In short: open with [`Policy::open`] (SQLite file), [`Policy::in_memory`], or
//! [`Policy::with_store`] (any store of core's [`PolicyStore`](environment_core::PolicyStore)
//! port, such as PostgreSQL for a policy several machines share); load rules with
//! [`Policy::load_rules`]; record memberships with [`Policy::add_member`]; decide with
//! [`Policy::check`] (spends quota, approval and token uses) or [`Policy::evaluate`] (a dry run);
//! plan with [`Policy::what_may`]; hand out rights with [`Policy::issue_token`] and
//! [`Policy::attenuate_token`] or [`Policy::delegate`]; let humans decide with
//! [`Policy::grant`] and [`Policy::reject`].
//!
//! Checks read memory: the compiled rules are indexed by principal, action and top-level
//! directory, and group membership is a precomputed closure, so a check costs a few lookups and
//! glob matches and does not allocate. The store is written when something changes, and read
//! live: each check (or each batch of an action's keys, through core's `decide_all`) first looks
//! at the store's generation and reloads when another process changed it, so a rule revoked
//! anywhere applies to the next request. Every write compares what it was made on (the
//! version, the counters, the approval's record) and is made again on what another process
//! wrote in between, so two processes never lose each other's change nor both have a last use.
//!
//! ```
//! use std::sync::Arc;
//! use environment_core::{AccessRequest, Action, ActorId, Context, Key, ManualClock, Resource};
//! use environment_policy::{Outcome, Policy};
//!
//! let policy = Policy::in_memory(Arc::new(ManualClock::new(0)))?;
//! policy.load_rules(r#"
//!     [[rule]]
//!     id = "coders-write-src"
//!     effect = "permit"
//!     principal = "group:coders"
//!     actions = ["read", "write"]
//!     resource = { path = "**" }
//!
//!     [[rule]]
//!     id = "secrets-readonly"
//!     effect = "forbid"
//!     principal = "*"
//!     actions = ["write", "delete"]
//!     resource = { path = "secrets/**" }
//!     advice = "ask a human with role maintainer"
//! "#)?;
//! policy.add_member("agent:coder-1", "group:coders")?;
//!
//! let request = |path: &str| AccessRequest {
//!     actor: ActorId::new("agent:coder-1").unwrap(),
//!     action: Action::Write,
//!     resource: Resource::Key(Key::fs(path).unwrap()),
//!     context: Context::default(),
//! };
//! assert!(policy.check(&request("src/main.rs")).is_allowed());
//!
//! let denied = policy.check(&request("secrets/key.pem"));
//! assert_eq!(denied.outcome(), Outcome::Deny);
//! assert_eq!(denied.rule_ids().collect::<Vec<_>>(), ["secrets-readonly"]);
//! assert!(denied.explain(&request("secrets/key.pem")).starts_with(
//!     "Denied by rule `secrets-readonly`: `secrets/key.pem` matches `secrets/**`"
//! ));
//! assert_eq!(denied.next_step(), "do not retry; ask a human with role maintainer");
//! # Ok::<(), environment_policy::PolicyError>(())
//! ```
#![warn(missing_docs)]

mod approval;
mod authorizer;
mod check;
mod condition;
mod decision;
mod delegation;
mod error;
mod format;
mod glob;
mod governance;
mod policy;
mod query;
mod relations;
mod resource;
mod rule;
mod ruleset;
mod schema;
mod spend;
mod store;
mod token;

pub use approval::{Approval, ApprovalState, GrantScope};
pub use condition::{Conditions, Quota, TimeWindow, parse_risk, risk_name};
pub use decision::{Decision, Outcome, Reason};
pub use delegation::{Delegation, MAX_DELEGATION_DEPTH};
pub use error::{PolicyError, Result};
pub use format::{LoadIssue, RuleFile};
pub use glob::{Glob, GlobError};
pub use policy::Policy;
pub use query::Permission;
pub use resource::{
    EndpointPattern, ResourceError, ResourceKind, ResourcePattern, ResourceSpec, resource_label,
};
pub use rule::{ActorKind, Effect, Principal, Rule, is_group};
pub use schema::{AttrType, BUILTIN_ACTIONS, BUILTIN_ATTRIBUTES, Schema};
pub use store::SqlitePolicyStore;
pub use token::{CapabilityToken, TokenError, TokenLimits};
