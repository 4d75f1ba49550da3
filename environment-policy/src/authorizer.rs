//! environment-core's `Authorizer` port, answered by the policy.
//!
//! Core's request maps onto the policy's model directly: the actor id is the principal (its
//! groups come from the relations), core's actions are the builtin actions (custom ones must be
//! declared in the schema), and core's resources become typed targets — `fs` keys are paths,
//! `obj` keys are objects (`kind/key`), prefixes are listings, a service string that parses as a
//! URL is an endpoint (else a named service), and branches, secrets, programs, topics and the
//! environment map to their kinds. The context's branch, risk and attributes feed conditions; its
//! token and approval are checked as such.

use environment_core::{AccessRequest, Authorizer, Decision as CoreDecision, Spend, Verdict};

use crate::decision::{Outcome, Reason};
use crate::policy::Policy;

impl Authorizer for Policy {
    /// Decides without spending: an allow lists what it consumes, which the environment spends
    /// with the action. A request that needs approval gets a durable approval request filed,
    /// named in the verdict, so a human can grant it and the agent can retry with its id.
    /// Explanations are rendered only for refusals.
    fn decide(&self, request: &AccessRequest) -> CoreDecision {
        let live = self.refresh().is_ok();
        self.decide_as_loaded(request, live)
    }

    /// The store is looked at once for all the requests.
    fn decide_all(&self, requests: &[AccessRequest]) -> Vec<CoreDecision> {
        let live = self.refresh().is_ok();
        requests
            .iter()
            .map(|r| self.decide_as_loaded(r, live))
            .collect()
    }

    fn spend(&self, uses: &[Spend]) -> Result<(), Box<CoreDecision>> {
        self.spend_uses(uses).map_err(|reason| {
            let explanation = match &reason {
                Reason::QuotaExhausted { retry_at } => format!(
                    "the quota that allowed this was used up by another action since it was \
                     decided; it opens again at {retry_at} (ms since the epoch)"
                ),
                Reason::ApprovalRequired => {
                    "the approval presented was used up or lapsed since this was decided".into()
                }
                Reason::Token(e) => format!("the capability token refused it: {e}"),
                _ => "what allowed this could not be recorded as used".into(),
            };
            Box::new(CoreDecision {
                verdict: Verdict::Deny,
                rules: Vec::new(),
                policy_version: self.version(),
                next: String::new(),
                explanation,
                spend: Vec::new(),
            })
        })
    }
}

impl Policy {
    /// Core's decision of `request` on the policy as last read (see
    /// [`Policy::evaluate_as_loaded`]), with an approval request filed when one is needed.
    fn decide_as_loaded(&self, request: &AccessRequest, live: bool) -> CoreDecision {
        let mut d = self.evaluate_as_loaded(request, live);
        if d.outcome() == Outcome::NeedsApproval
            && let Ok(a) = self.file_approval(request, &d)
        {
            d.approval = Some(a.id);
        }
        d.to_core(request)
    }
}
