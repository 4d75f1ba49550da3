//! A session: the workspace's actor with what one request presents (a capability token, a
//! granted approval). It builds the access request a use case is checked as and puts it to
//! the policy port.

use std::cell::Cell;

use environment_core::{
    AccessRequest, Action, ActorId, AttrValue, Cancel, Context, Credentials, Decision, EnvError,
    LocalEnvironment, OpId, Resource,
};

use super::error::ServiceError;
use super::workspace::{Caller, Counters, Workspace};

/// Authorizes the requests of one call as its caller's actor.
pub(super) struct Session<'a> {
    shared: &'a Workspace,
    /// Whom the call acts as.
    actor: &'a ActorId,
    token: Option<String>,
    /// A granted approval presented with the request.
    approval: Option<String>,
    /// Calls the request's command off (see [`environment_core::Cancel`]).
    cancel: Cancel,
    /// The trees were captured as the call began and nothing changed them since: the use
    /// case's own barrier need not capture again.
    captured: Cell<bool>,
}

impl<'a> Session<'a> {
    /// A session of `caller`'s: `token` presented (else the caller's default one).
    pub(super) fn new(
        shared: &'a Workspace,
        caller: &'a Caller,
        token: Option<String>,
        approval: Option<String>,
        cancel: Cancel,
    ) -> Session<'a> {
        Session {
            shared,
            actor: &caller.actor,
            token: token.or_else(|| caller.default_token.clone()),
            approval,
            cancel,
            captured: Cell::new(false),
        }
    }

    /// Captures what changed in the trees, as the call begins (see
    /// [`crate::Setup::capture_each_call`]).
    pub(super) fn capture_first(&self, why: &str) -> Result<(), ServiceError> {
        self.shared.capture(why).map_err(ServiceError::from)?;
        self.captured.set(true);
        Ok(())
    }

    /// A capture barrier of a use case: everything changed in the trees up to now is recorded
    /// before it goes on (unless the call's own capture just did, and nothing came since).
    pub(super) fn capture(&self, why: &str) -> Result<(), ServiceError> {
        if self.captured.replace(false) {
            return Ok(());
        }
        self.shared
            .capture(why)
            .map(drop)
            .map_err(ServiceError::from)
    }

    /// What calls the request's command off.
    pub(super) fn cancel(&self) -> &Cancel {
        &self.cancel
    }

    pub(super) fn shared(&self) -> &'a Workspace {
        self.shared
    }

    pub(super) fn actor(&self) -> &'a ActorId {
        self.actor
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
            actor: self.actor.clone(),
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
    ) -> Result<(), ServiceError> {
        self.decide(action, resource, operation, false)
    }

    /// [`Session::allow`] for a request that core asks again, identically, when it performs the
    /// operation through [`Session::env`] (or a tracker presenting [`Session::credentials`]):
    /// the session then only decides, and core's decision, made with the same token and
    /// approval, spends them with the operation, in its transaction. A refused or conflicting
    /// operation therefore spends nothing.
    pub(super) fn allow_rechecked(
        &self,
        action: Action,
        resource: Resource,
        operation: Option<&str>,
    ) -> Result<(), ServiceError> {
        self.decide(action, resource, operation, true)
    }

    /// [`Session::allow`] for a command the shell decides again when it starts the program,
    /// without this request's token or approval: those are spent here, and only a quota is left
    /// to the shell's check.
    pub(super) fn allow_command(
        &self,
        action: Action,
        resource: Resource,
        operation: Option<&str>,
    ) -> Result<(), ServiceError> {
        let only_decide = self.token.is_none() && self.approval.is_none();
        self.decide(action, resource, operation, only_decide)
    }

    fn decide(
        &self,
        action: Action,
        resource: Resource,
        operation: Option<&str>,
        dry_run: bool,
    ) -> Result<(), ServiceError> {
        let req = self.request(action, resource, operation);
        let decision = decide(self.shared, &req, dry_run);
        if decision.is_allowed() {
            return Ok(());
        }
        Counters::bump(&self.shared.counters.denied);
        Err(EnvError::NotAllowed(Box::new(decision)).into())
    }

    /// What this request presents: its token (or the workspace's default one) and approval.
    pub(super) fn credentials(&self) -> Credentials {
        Credentials {
            token: self.token.clone(),
            approval: self.approval.clone(),
        }
    }

    /// The environment as this request reaches it: core decides every operation with the
    /// request's credentials, and spends them with the operation.
    pub(super) fn env(&self) -> LocalEnvironment {
        let credentials = self.credentials();
        if credentials == Credentials::default() {
            self.shared.env.clone()
        } else {
            self.shared.env.presenting(credentials)
        }
    }

    pub(super) fn branch(&self) -> &str {
        &self.shared.branch
    }
}

/// Decides `req` through the policy port: spending what an allow consumes, or — with
/// `dry_run` — only deciding, for a request the operation itself will decide again and spend.
pub(super) fn decide(shared: &Workspace, req: &AccessRequest, dry_run: bool) -> Decision {
    if dry_run {
        shared.authorizer.decide(req)
    } else {
        shared.authorizer.authorize(req)
    }
}

/// The version a spec names (an id, a prefix, a mark, a branch, `…~N`).
pub(super) fn resolve(shared: &Workspace, spec: &str) -> Result<OpId, ServiceError> {
    shared.env.resolve(spec).map_err(ServiceError::from)
}
