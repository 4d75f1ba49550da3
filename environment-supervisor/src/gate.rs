//! The gate every request on the socket passes: the access request a method is checked as, put
//! to the policy port as the connection's actor, with the request's token and approval.

use environment_core::{
    AccessRequest, Action, AttrValue, Context, Decision, EnvError, OpId, Resource,
};

use super::rpc::{RpcError, env_error};
use super::state::{Counters, Shared};

/// Authorizes the requests of one call as the connection's actor.
pub(super) struct Gate<'a> {
    shared: &'a Shared,
    token: Option<String>,
    /// A granted approval presented with the request.
    approval: Option<String>,
}

impl<'a> Gate<'a> {
    pub(super) fn new(
        shared: &'a Shared,
        token: Option<String>,
        approval: Option<String>,
    ) -> Gate<'a> {
        Gate {
            shared,
            token,
            approval,
        }
    }

    pub(super) fn shared(&self) -> &'a Shared {
        self.shared
    }

    pub(super) fn actor(&self) -> &'a environment_core::ActorId {
        &self.shared.actor
    }

    pub(super) fn request(
        &self,
        action: Action,
        resource: Resource,
        operation: Option<&str>,
    ) -> AccessRequest {
        let mut context = Context {
            token: self.token.clone(),
            approval: self.approval.clone(),
            ..Context::default()
        };
        match &resource {
            Resource::Branch(b) => context.branch = Some(b.clone()),
            // As the shell asks when it runs the program.
            Resource::Program { .. } => context.branch = Some(self.shared.branch.clone()),
            _ => {}
        }
        if let Some(op) = operation {
            context
                .attrs
                .insert("operation".into(), AttrValue::Str(op.into()));
        }
        AccessRequest {
            actor: self.shared.actor.clone(),
            action,
            resource,
            context,
        }
    }

    /// Asks the policy port; anything but an allow is a `DENIED` error carrying the agent-facing
    /// text, and nothing happens.
    pub(super) fn allow(
        &self,
        action: Action,
        resource: Resource,
        operation: Option<&str>,
    ) -> Result<(), RpcError> {
        self.decide(action, resource, operation, false)
    }

    /// [`Gate::allow`] for a request that core (or the shell) asks again, identically, when it
    /// performs the operation: the gate then only evaluates, so a quota is spent once, by the
    /// check that goes with the work. A token or an approval is spent here, since the second
    /// check does not carry them.
    pub(super) fn allow_rechecked(
        &self,
        action: Action,
        resource: Resource,
        operation: Option<&str>,
    ) -> Result<(), RpcError> {
        self.decide(action, resource, operation, true)
    }

    fn decide(
        &self,
        action: Action,
        resource: Resource,
        operation: Option<&str>,
        rechecked: bool,
    ) -> Result<(), RpcError> {
        let req = self.request(action, resource, operation);
        let dry_run = rechecked && self.token.is_none() && self.approval.is_none();
        let decision = decide(self.shared, &req, dry_run);
        if decision.is_allowed() {
            return Ok(());
        }
        Counters::bump(&self.shared.counters.denied);
        Err(env_error(EnvError::NotAllowed(Box::new(decision))))
    }

    pub(super) fn branch(&self) -> &str {
        &self.shared.branch
    }
}

/// Decides `req` through the policy port: spending what an allow consumes, or — with
/// `dry_run` — only deciding, for a request the operation itself will decide again and spend.
pub(super) fn decide(shared: &Shared, req: &AccessRequest, dry_run: bool) -> Decision {
    if dry_run {
        shared.authorizer.decide(req)
    } else {
        shared.authorizer.authorize(req)
    }
}

/// The version a spec names (an id, a prefix, a mark, a branch, `…~N`).
pub(super) fn resolve(shared: &Shared, spec: &str) -> Result<OpId, RpcError> {
    shared.env.resolve(spec).map_err(env_error)
}
