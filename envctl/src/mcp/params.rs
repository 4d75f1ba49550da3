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
    /// `status`, `undo`, `redo`, `marks`, `branches`.
    NoParams {}
);

arguments!(
    /// `history`.
    HistoryParams {
        /// List every operation instead of the key nodes (default false).
        all: Option<bool>,
        /// The branch (default "main").
        branch: Option<String>,
        /// At most this many entries, newest first (1 to 1000, default 50).
        limit: Option<usize>,
    }
);

arguments!(
    /// `refused`.
    RefusedParams {
        /// At most this many, newest first (1 to 1000, default 50).
        limit: Option<usize>,
    }
);

arguments!(
    /// `show`.
    VersionParams {
        /// A version: an op id or a unique prefix of 4+ hex digits, a mark, a branch, HEAD, any
        /// of these followed by ~N (N operations back).
        version: String,
    }
);

arguments!(
    /// `diff`.
    DiffParams {
        /// The older version (an op id prefix, a mark, a branch, HEAD~N).
        from: String,
        /// The newer version (default: the workspace as it is now).
        to: Option<String>,
        /// Only paths under this directory.
        prefix: Option<String>,
        /// At most this many changes listed (default 200, at most 1000); the total is given.
        limit: Option<usize>,
    }
);

arguments!(
    /// `mark`.
    MarkParams {
        /// The mark's name (letters, digits and -_./).
        name: String,
        /// The version to name (default: the workspace as it is now).
        version: Option<String>,
    }
);

arguments!(
    /// `branch`.
    BranchParams {
        /// The new branch's name (letters, digits and -_./).
        name: String,
        /// The version it starts at (default: the workspace as it is now).
        from: Option<String>,
    }
);

arguments!(
    /// `merge`.
    MergeParams {
        /// The branch to merge into the workspace's branch.
        source: String,
    }
);

arguments!(
    /// `restore`.
    RestoreParams {
        /// The version to bring the workspace back to (op id prefix, mark, branch, HEAD~N).
        version: String,
        /// Only preview what would change (default false).
        dry_run: Option<bool>,
        /// Why, for the history.
        intent: Option<String>,
    }
);

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
    /// `read_file`.
    ReadParams {
        /// The path relative to the workspace.
        path: String,
        /// The version to read (default: the workspace as it is now).
        version: Option<String>,
    }
);

arguments!(
    /// `write_file`.
    WriteParams {
        /// The path relative to the workspace.
        path: String,
        /// The whole new content (UTF-8 text).
        content: String,
        /// Why, for the history (default "write PATH").
        intent: Option<String>,
    }
);

arguments!(
    /// `delete_file`.
    DeleteParams {
        /// The path relative to the workspace (a file or a symlink, not a directory).
        path: String,
        /// Why, for the history (default "delete PATH").
        intent: Option<String>,
    }
);

arguments!(
    /// `list_files`.
    ListParams {
        /// A directory relative to the workspace (default: all).
        prefix: Option<String>,
        /// The version (default: the workspace as it is now).
        version: Option<String>,
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
    /// `queue_ack`.
    ReceiptParams {
        /// The receipt returned by queue_claim.
        receipt: String,
    }
);

arguments!(
    /// `queue_nack`.
    NackParams {
        /// The receipt returned by queue_claim.
        receipt: String,
        /// Why the work failed.
        error: Option<String>,
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
    /// `approval_status`.
    ApprovalParams {
        /// The approval request's id, as request_approval or a refusal gave it.
        id: String,
    }
);

arguments!(
    /// `effects`.
    EffectsParams {
        /// Only the effects not settled yet (default false).
        unfinished: Option<bool>,
    }
);

arguments!(
    /// `effect_begin`.
    EffectBeginParams {
        /// The idempotency key: the same key is never performed twice.
        key: String,
        /// The service or endpoint acted on, e.g. `https://deploy.example/v1`.
        target: String,
        /// What is asked of it (text, often JSON).
        request: Option<String>,
    }
);

arguments!(
    /// `effect_complete`.
    EffectCompleteParams {
        /// The effect's id, as effect_begin gave it.
        id: u64,
        /// What the effect returned (text).
        result: Option<String>,
    }
);

arguments!(
    /// `effect_fail`.
    EffectFailParams {
        /// The effect's id, as effect_begin gave it.
        id: u64,
        /// Why it failed (it did not take effect).
        error: String,
    }
);

arguments!(
    /// `verify`.
    VerifyParams {
        /// Re-hash every stored file too (slower; default false).
        deep: Option<bool>,
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

arguments!(
    /// `tournament`.
    TournamentParams {
        /// Shell scripts, one per candidate, e.g. ["pip install 'x<2'", "pip install 'x>=2'"].
        candidates: Vec<String>,
        /// The shell script that judges each candidate's tree (exit 0 passes), e.g. "pytest -q".
        test: String,
        /// The version every candidate starts from (default: the workspace as it is now).
        base: Option<String>,
        /// How many candidates run at once (default 4).
        jobs: Option<usize>,
        /// Run every candidate to its end; the first passer in candidate order wins (default:
        /// the first to pass in time).
        pick_all: Option<bool>,
    }
);
