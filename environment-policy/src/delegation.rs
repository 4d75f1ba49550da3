//! Delegation: an actor hands a subset of its rights to another, for a while.
//!
//! A delegation stores only the limits; the rights themselves are the delegator's, evaluated at
//! the time of each request. So a delegated right can never exceed the delegator's, and taking a
//! right from the delegator takes it from everyone down the chain at once.

use serde::{Deserialize, Serialize};

use crate::error::{PolicyError, Result};
use environment_core::policy_store::{PolicyChange, PolicyRecord};

use crate::policy::{Policy, random_id, read, write};
use crate::resource::{ResourcePattern, Target};
use crate::rule::ActorKind;

/// The longest chain of delegations a request may follow (A → B → C → D is three).
pub const MAX_DELEGATION_DEPTH: usize = 3;

/// One delegation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegation {
    /// Its id (for revocation).
    pub id: String,
    /// Who delegates.
    pub from: String,
    /// Who receives.
    pub to: String,
    /// Which actions (`*` for all of the delegator's).
    pub actions: Vec<String>,
    /// Which resources; empty means all of the delegator's.
    pub resources: Vec<ResourcePattern>,
    /// When it lapses (ms), if ever.
    pub expires_at: Option<i64>,
}

impl Delegation {
    pub(crate) fn covers(&self, action: &str, target: &Target<'_>, now: i64) -> bool {
        self.expires_at.is_none_or(|e| now < e)
            && self.actions.iter().any(|a| a == "*" || a == action)
            && (self.resources.is_empty()
                || self.resources.iter().any(|r| r.matches(target, false)))
    }
}

impl Policy {
    /// Records a delegation (an empty id gets a fresh one); returns it as stored.
    pub fn delegate(&self, mut d: Delegation) -> Result<Delegation> {
        if d.id.is_empty() {
            d.id = random_id("dlg-");
        }
        self.retrying(|| self.add_delegation(&d))
    }

    /// Records `d` as the next version, checked against the delegations memory holds; `None`
    /// when the store moved past that version.
    fn add_delegation(&self, d: &Delegation) -> Result<Option<Delegation>> {
        let bad = |m: &str| Err(PolicyError::BadDelegation(m.to_owned()));
        if ActorKind::of(&d.from).is_none() || ActorKind::of(&d.to).is_none() {
            return bad("from and to must be actor ids (human:, agent:, service:)");
        }
        if d.from == d.to {
            return bad("an actor cannot delegate to itself");
        }
        if d.expires_at.is_some_and(|e| e <= self.clock.now_ms()) {
            return bad("already expired");
        }
        let mut st = write(&self.state);
        if d.actions.is_empty() {
            return bad("no actions");
        }
        for a in &d.actions {
            if a != "*" && !st.rules.schema.schema.knows_action(a) {
                return Err(PolicyError::BadDelegation(format!("unknown action `{a}`")));
            }
        }
        if st.delegations.iter().any(|x| x.id == d.id) {
            return bad("duplicate id");
        }
        // Depth of the chain that reaches `from`, and whether `to` is already upstream of it.
        let mut depth = 0;
        let mut frontier = vec![d.from.clone()];
        while !frontier.is_empty() {
            if frontier.contains(&d.to) {
                return bad("delegation cycle");
            }
            let next: Vec<String> = st
                .delegations
                .iter()
                .filter(|x| frontier.contains(&x.to))
                .map(|x| x.from.clone())
                .collect();
            if !next.is_empty() {
                depth += 1;
            }
            if depth >= MAX_DELEGATION_DEPTH {
                return Err(PolicyError::BadDelegation(format!(
                    "chain longer than {MAX_DELEGATION_DEPTH}"
                )));
            }
            frontier = next;
        }
        let body = serde_json::to_string(d).map_err(|e| PolicyError::Corrupt(e.to_string()))?;
        let change = PolicyChange::PutDelegation(PolicyRecord {
            id: d.id.clone(),
            body,
        });
        let Some(version) = self.change(&mut st, &change)? else {
            return Ok(None);
        };
        st.delegations.push(d.clone());
        st.version = version;
        Ok(Some(d.clone()))
    }

    /// Revokes a delegation; everything delegated onwards from it lapses with it.
    pub fn revoke_delegation(&self, id: &str) -> Result<u64> {
        self.retrying(|| {
            let mut st = write(&self.state);
            let Some(i) = st.delegations.iter().position(|d| d.id == id) else {
                return Err(PolicyError::UnknownDelegation(id.to_owned()));
            };
            let change = PolicyChange::DeleteDelegation(id.to_owned());
            let Some(version) = self.change(&mut st, &change)? else {
                return Ok(None);
            };
            st.delegations.remove(i);
            st.version = version;
            Ok(Some(version))
        })
    }

    /// Every delegation.
    pub fn delegations(&self) -> Vec<Delegation> {
        self.refresh_or_keep();
        read(&self.state).delegations.clone()
    }
}
