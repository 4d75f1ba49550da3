//! The crate's error types.

use environment_core::ErrorKind;

use crate::format::LoadIssue;
use crate::token::TokenError;

/// Everything that can go wrong when changing or loading a policy. A refused change changes
/// nothing: neither the in-memory policy nor the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// Rules or a schema that do not validate; every problem found, with its location.
    #[error("invalid policy ({} problem(s)): {}", .0.len(), render_issues(.0))]
    Invalid(Vec<LoadIssue>),
    /// The store failed (it could not be read or written).
    #[error("{0}")]
    Store(#[from] environment_core::PortError),
    /// Other handles on the store kept changing what this change was made on: it was made
    /// again on what they wrote this many times, and did not get through.
    #[error("the policy kept changing under this change ({0} attempts); try again")]
    Contended(usize),
    /// A change made only on one version found the policy at another.
    #[error("the policy is at version {current}, not {expected}: it changed in between")]
    VersionMoved {
        /// The version the change was made on.
        expected: u64,
        /// The version the policy is at.
        current: u64,
    },
    /// The store holds something this version cannot read.
    #[error("policy store is corrupt: {0}")]
    Corrupt(String),
    /// The membership would make a group contain itself.
    #[error("adding `{member}` to `{group}` would make a cycle")]
    Cycle {
        /// The would-be member.
        member: String,
        /// The group.
        group: String,
    },
    /// Members can only be added to `group:` or `role:` entities.
    #[error("`{0}` is not a group or role (ids start with group: or role:)")]
    NotAGroup(String),
    /// An id that is not `kind:name`, or one of the reserved principals.
    #[error("bad entity id `{0}`")]
    BadEntity(String),
    /// No rule with this id.
    #[error("no rule `{0}`")]
    UnknownRule(String),
    /// No approval with this id.
    #[error("no approval request `{0}`")]
    UnknownApproval(String),
    /// The approval was already decided.
    #[error("approval request `{id}` is {state}, not pending")]
    ApprovalNotPending {
        /// The approval.
        id: String,
        /// Its state.
        state: &'static str,
    },
    /// The approver is not among those the rule names (or is the requester).
    #[error("`{approver}` may not decide approval request `{id}`")]
    NotAnApprover {
        /// The approval.
        id: String,
        /// Who tried.
        approver: String,
    },
    /// The request does not need an approval (it is allowed or plainly denied).
    #[error("this request does not need approval: {0}")]
    NoApprovalNeeded(String),
    /// No delegation with this id.
    #[error("no delegation `{0}`")]
    UnknownDelegation(String),
    /// A delegation that is malformed or would exceed the chain bound.
    #[error("bad delegation: {0}")]
    BadDelegation(String),
    /// A capability token problem.
    #[error(transparent)]
    Token(#[from] TokenError),
}

fn render_issues(issues: &[LoadIssue]) -> String {
    issues
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, PolicyError>;

impl PolicyError {
    /// What kind of failure it is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            PolicyError::Invalid(_)
            | PolicyError::BadEntity(_)
            | PolicyError::NotAGroup(_)
            | PolicyError::BadDelegation(_)
            | PolicyError::Token(_) => ErrorKind::Invalid,
            PolicyError::UnknownRule(_)
            | PolicyError::UnknownApproval(_)
            | PolicyError::UnknownDelegation(_) => ErrorKind::NotFound,
            PolicyError::Cycle { .. }
            | PolicyError::ApprovalNotPending { .. }
            | PolicyError::NoApprovalNeeded(_) => ErrorKind::Conflict,
            PolicyError::NotAnApprover { .. } => ErrorKind::Denied,
            PolicyError::Corrupt(_) => ErrorKind::Corrupt,
            PolicyError::Store(e) => e.kind,
            PolicyError::Contended(_) | PolicyError::VersionMoved { .. } => ErrorKind::Conflict,
        }
    }
}
