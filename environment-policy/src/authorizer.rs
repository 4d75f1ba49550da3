//! environment-core's `Authorizer` port, answered by the policy.
//!
//! Core's request maps onto the policy's model directly: the actor id is the principal (its
//! groups come from the relations), core's actions are the builtin actions (custom ones must be
//! declared in the schema), and core's resources become typed targets — `fs` keys are paths,
//! `obj` keys are objects (`kind/key`), prefixes are listings, a service string that parses as a
//! URL is an endpoint (else a named service), and branches, secrets, programs, topics and the
//! environment map to their kinds. The context's branch, risk and attributes feed conditions; its
//! token and approval are checked as such.

use environment_core::{AccessRequest, Authorizer, Decision as CoreDecision};

use crate::decision::Outcome;
use crate::policy::Policy;

impl Authorizer for Policy {
    /// Decides and spends (quota, approval and token uses). A request that needs approval gets a
    /// durable approval request filed, named in the verdict, so a human can grant it and the
    /// agent can retry with its id. Explanations are rendered only for refusals.
    fn authorize(&self, request: &AccessRequest) -> CoreDecision {
        let mut d = self.check(request);
        if d.outcome() == Outcome::NeedsApproval
            && let Ok(a) = self.file_approval(request, &d)
        {
            d.approval = Some(a.id);
        }
        d.to_core(request)
    }
}
