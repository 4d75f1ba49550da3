//! The one error of the workspace service: a kind, a short message, and details whose
//! `for_agent` is the text for a language model.
//!
//! Every door maps the kind once (the control socket to its JSON-RPC codes, envctl to its exit
//! codes); the agent-facing text is rendered here or by the store that refused, never again by
//! a door.

use environment_core::{EnvError, ErrorKind, ForAgent, PortError, Verdict};
use environment_sandbox::SandboxError;
use serde_json::{Value, json};

/// The words that open every error's agent-facing text when the use case did not run at all.
pub const NOT_DONE: &str =
    "The action was NOT performed: nothing changed, and it must not be reported as done.";

/// What a use case of the service failed with. Its `data` is always an object with at least
/// `for_agent`: the text to put in a language model's context, which states first that the
/// action did not happen.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceError {
    kind: ErrorKind,
    /// A short description.
    pub message: String,
    /// `{"for_agent": "...", ...}` with details that depend on the kind.
    pub data: Value,
}

impl std::fmt::Display for ServiceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ServiceError {}

impl ServiceError {
    /// An error of `kind` with the standard agent-facing text built from `message` and `next`.
    pub fn new(kind: ErrorKind, message: impl Into<String>, next: &str) -> ServiceError {
        let message = message.into();
        let for_agent = format!("{NOT_DONE} Reason: {message}. Next: {next}");
        ServiceError::rendered(kind, message, for_agent)
    }

    /// An error of `kind` whose agent-facing text was rendered elsewhere (core's `ForAgent`).
    pub fn rendered(kind: ErrorKind, message: impl Into<String>, for_agent: String) -> Self {
        ServiceError {
            kind,
            message: message.into(),
            data: json!({ "for_agent": for_agent }),
        }
    }

    /// Parameters the use case does not take, or cannot read.
    pub fn invalid(detail: impl std::fmt::Display) -> ServiceError {
        ServiceError::new(
            ErrorKind::Invalid,
            format!("invalid params: {detail}"),
            "fix the parameters as the schema describes them and send the request again.",
        )
    }

    /// A capability this workspace was opened without (no policy, no queue, no shell).
    pub fn unavailable(what: &str) -> ServiceError {
        ServiceError::new(
            ErrorKind::Unavailable,
            format!("{what} is not configured in this workspace"),
            "use another method; this one is not available here.",
        )
    }

    /// A failure of the service itself.
    pub fn internal(message: impl Into<String>) -> ServiceError {
        ServiceError::new(ErrorKind::Internal, message, "report the error to a human.")
    }

    /// The kind of error.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Adds a field to `data`.
    pub fn with(mut self, key: &str, value: Value) -> ServiceError {
        if let Value::Object(m) = &mut self.data {
            m.insert(key.to_owned(), value);
        }
        self
    }

    /// The agent-facing text.
    pub fn for_agent(&self) -> Option<&str> {
        self.data.get("for_agent").and_then(Value::as_str)
    }
}

/// Core's errors, with the decision's verdict, rules and approval when the policy refused.
impl From<EnvError> for ServiceError {
    fn from(e: EnvError) -> ServiceError {
        let mut err = ServiceError::rendered(e.kind(), e.to_string(), e.for_agent());
        if let EnvError::NotAllowed(d) = &e {
            let (verdict, approval) = match &d.verdict {
                Verdict::Allow => ("allow", None),
                Verdict::NeedsApproval { request, .. } => ("needs_approval", request.clone()),
                _ => ("deny", None),
            };
            err = err
                .with("verdict", json!(verdict))
                .with("rules", json!(d.rules))
                .with("policy_version", json!(d.policy_version));
            if let Some(a) = approval {
                err = err.with("approval", json!(a));
            }
        }
        err
    }
}

impl From<SandboxError> for ServiceError {
    fn from(e: SandboxError) -> ServiceError {
        match e {
            SandboxError::Env(e) => e.into(),
            other => ServiceError::rendered(other.kind(), other.to_string(), other.for_agent()),
        }
    }
}

/// A port's failure (the governance, the queue), with the next step its adapter gave.
impl From<PortError> for ServiceError {
    fn from(e: PortError) -> ServiceError {
        ServiceError::new(e.kind, e.message, &e.next)
    }
}
