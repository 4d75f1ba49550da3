//! The arguments of the tools, as the JSON schemas a model reads. The workspace service parses
//! them (refusing unknown ones, with its contract text); these types only describe them.

use schemars::JsonSchema;

/// A tool's arguments: the fields given, then the credentials any call may present.
macro_rules! arguments {
    ($(#[$doc:meta])* $name:ident { $($(#[$f:meta])* $field:ident: $ty:ty,)* }) => {
        $(#[$doc])*
        #[derive(JsonSchema)]
        #[schemars(deny_unknown_fields)]
        #[allow(dead_code)]
        pub struct $name {
            $($(#[$f])* $field: $ty,)*
            /// The id of a granted approval to present with this call (see request_approval
            /// and approval_status); default: the one the server was started with.
            approval: Option<String>,
            /// A capability token to present with this call: it can only narrow what you may
            /// do; default: the one the server was started with.
            token: Option<String>,
        }
    };
}

arguments!(
    /// `exec`.
    ExecParams {
        /// The program and its arguments, e.g. ["cargo", "test"] (no shell: use
        /// ["sh", "-c", "…"] for one).
        command: Vec<String>,
        /// Why you run it, for the history (default: the command line).
        intent: Option<String>,
        /// The directory to run in, relative to the workspace (default its root).
        cwd: Option<String>,
        /// Text given on the command's standard input.
        stdin: Option<String>,
        /// Kill the command after this many seconds (it is recorded as timed out).
        timeout_secs: Option<u64>,
    }
);

arguments!(
    /// `queue_publish`.
    PublishParams {
        /// The topic, e.g. "task.created".
        topic: String,
        /// The message (text, often JSON).
        payload: String,
        /// Ordering key: messages with the same key are handled one at a time, in order.
        key: Option<String>,
        /// Dedup id: publishing it again is accepted but not delivered twice.
        dedup: Option<String>,
    }
);

arguments!(
    /// `queue_claim`.
    ClaimParams {
        /// The consumer group.
        group: String,
        /// How long the lease lasts, in seconds (default 60).
        lease_secs: Option<u64>,
        /// At most this many messages (default 1).
        max: Option<u32>,
    }
);

arguments!(
    /// A policy question about the server's actor.
    AccessParams {
        /// read, write, delete, execute, publish or consume (or an action the policy declares).
        action: String,
        /// "path:src/main.rs", "prefix:src", "branch:main", "topic:task.created",
        /// "program:cargo test", "service:https://…", or "environment".
        resource: String,
    }
);

arguments!(
    /// `what_may_i_do`.
    MayParams {
        /// Where to look, e.g. "prefix:src" (default: the whole workspace).
        resource: Option<String>,
    }
);

arguments!(
    /// `queue_extend`.
    ExtendParams {
        /// The receipt returned by queue_claim.
        receipt: String,
        /// How much longer the lease lasts, in seconds, from now.
        lease_secs: u64,
    }
);
