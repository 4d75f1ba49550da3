//! The tools: each one use case of the workspace service, under a name and with arguments a
//! model reads easily. A tool only renames its arguments into the service's; the service parses
//! them, decides, acts and answers, the same in process and through a supervisor's socket.

use std::sync::Arc;

use environment_workspace::{Method, ServiceError};
use rmcp::handler::server::common::schema_for_type;
use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use schemars::JsonSchema;
use serde_json::{Map, Value, json};

use super::params::*;

/// What a tool does to the workspace, for the client's annotations.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Effect {
    /// Reads only.
    Reads,
    /// Adds to the workspace (a mark, a message, a request) without losing anything.
    Adds,
    /// Changes the tree or settles work: what was there may go (history keeps it).
    Changes,
}

/// One tool.
pub(super) struct ToolSpec {
    /// The tool's name.
    pub name: &'static str,
    /// The use case it calls.
    pub method: Method,
    description: &'static str,
    effect: Effect,
    /// Whether calling it twice with the same arguments does what once does.
    idempotent: bool,
    /// Its arguments when they are not the use case's own (renamed for a model).
    input: Option<fn() -> Arc<JsonObject>>,
    /// Renames its arguments into the service's.
    pub adapt: fn(&mut Map<String, Value>) -> Result<(), ServiceError>,
}

fn keep(_: &mut Map<String, Value>) -> Result<(), ServiceError> {
    Ok(())
}

/// Moves argument `from` to `to`, scaled by `factor` when it is a number of seconds.
fn rename(
    args: &mut Map<String, Value>,
    from: &str,
    to: &str,
    factor: Option<u64>,
) -> Result<(), ServiceError> {
    let Some(v) = args.remove(from) else {
        return Ok(());
    };
    let v = match (factor, &v) {
        (_, Value::Null) | (None, _) => v,
        (Some(f), Value::Number(n)) if n.as_u64().is_some() => {
            json!(n.as_u64().unwrap_or_default().saturating_mul(f))
        }
        (Some(_), _) => {
            return Err(ServiceError::invalid(format!(
                "`{from}` must be a whole number of seconds"
            )));
        }
    };
    args.insert(to.to_owned(), v);
    Ok(())
}

fn exec_args(args: &mut Map<String, Value>) -> Result<(), ServiceError> {
    rename(args, "command", "argv", None)?;
    rename(args, "timeout_secs", "timeout_ms", Some(1000))
}

fn publish_args(args: &mut Map<String, Value>) -> Result<(), ServiceError> {
    rename(args, "key", "ordering_key", None)?;
    rename(args, "dedup", "dedup_id", None)
}

fn claim_args(args: &mut Map<String, Value>) -> Result<(), ServiceError> {
    rename(args, "lease_secs", "lease_ms", Some(1000))
}

fn input<T: JsonSchema + 'static>() -> Arc<JsonObject> {
    schema_for_type::<T>()
}

/// Every tool, in the order a client lists them.
pub(super) const TOOLS: &[ToolSpec] = &[
    ToolSpec {
        name: "status",
        method: Method::Status,
        description: "The workspace's state: your actor, the branch and its head (the version the files are at), how commands are sandboxed, and whether a policy and a queue are there.",
        effect: Effect::Reads,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "history",
        method: Method::History,
        description: "Read the history of the workspace, newest first: who changed what and why. Automatic captures are squashed unless all=true. Every entry's op id names a version for show, diff, read_file, restore and mark.",
        effect: Effect::Reads,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "refused",
        method: Method::Refused,
        description: "List the changes refused on the workspace, newest first: what a command or an agent changed that its actor may not change, put back to its state before and kept with the decision (the path, write or delete, who, why).",
        effect: Effect::Reads,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "show",
        method: Method::Show,
        description: "Show one operation of the history: actor, intent, flags and the paths it changed. A version is an op id or a unique prefix of 4+ hex digits, a mark, a branch or HEAD, optionally followed by ~N.",
        effect: Effect::Reads,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "diff",
        method: Method::Diff,
        description: "List the paths that differ between two versions (added, modified, removed); `to` defaults to the workspace as it is now.",
        effect: Effect::Reads,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "file_diff",
        method: Method::FileDiff,
        description: "Show how one file changed between two versions, as a unified diff (lines kept, removed, added, with context); a binary or very large file is compared by size and blake3 hash. `from` is a version (id prefix, mark, branch, HEAD~N); `to` defaults to the workspace as it is now.",
        effect: Effect::Reads,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "mark",
        method: Method::Mark,
        description: "Name a version (default: the workspace as it is now) so you can restore it later by that name, e.g. before a risky change. A name is taken once.",
        effect: Effect::Adds,
        idempotent: false,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "marks",
        method: Method::Marks,
        description: "List the marks (named versions) with the version each names.",
        effect: Effect::Reads,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "branches",
        method: Method::BranchList,
        description: "List the branches with their heads; the workspace's files are on `main`.",
        effect: Effect::Reads,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "branch",
        method: Method::BranchCreate,
        description: "Create a branch at a version (default: the workspace as it is now). The files stay on main; merge brings a branch's changes back.",
        effect: Effect::Adds,
        idempotent: false,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "merge",
        method: Method::Merge,
        description: "Merge a branch into main and write the result into the workspace's files; paths changed on both sides differently are listed as conflicts and keep main's content.",
        effect: Effect::Changes,
        idempotent: false,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "restore",
        method: Method::Restore,
        description: "Bring the workspace's files (and a managed root filesystem, when there is one) back to an earlier version; history is kept and the restore is appended to it. Use dry_run=true to see what would change.",
        effect: Effect::Changes,
        idempotent: false,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "undo",
        method: Method::Undo,
        description: "Undo the last operation not undone yet (its files go back to the version before it), whoever made it. Repeated undos step further back; redo walks forward again.",
        effect: Effect::Changes,
        idempotent: false,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "redo",
        method: Method::Redo,
        description: "Redo the last undo not redone yet (the files come back as they were before that undo). Refused when the last operation is not an undo.",
        effect: Effect::Changes,
        idempotent: false,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "exec",
        method: Method::Exec,
        description: "Run a command in the workspace (an argv list, no shell). Where the host allows it, the command runs in a sandbox that sees the workspace writable and the rest of the host read-only, without the environment's own files (status says how commands run here). Its file changes are recorded as one operation of yours; changes you may not make are put back and listed. Returns the exit status and the output (each stream cut at 32 KiB here, stored whole up to the limit). With timeout_secs, or when the call is cancelled, the command and everything it started are killed, and it is recorded as timed out or cancelled with what it changed until then.",
        effect: Effect::Changes,
        idempotent: false,
        input: Some(input::<ExecParams>),
        adapt: exec_args,
    },
    ToolSpec {
        name: "tournament",
        method: Method::Tournament,
        description: "Try several approaches side by side: each candidate script runs in a fork of the workspace with a sandbox of its own (the host read-only, no network), each fork is judged by the test script (exit 0 passes), and the winner's changes are adopted into the workspace as one operation of yours. The losers' branches stay in the history.",
        effect: Effect::Changes,
        idempotent: false,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "read_file",
        method: Method::FileRead,
        description: "Read a file of the workspace as it is now or at an earlier version: its text, or for a file that is not UTF-8 its bytes in base64 after a line `encoding: base64` (structured: `text` or `base64`).",
        effect: Effect::Reads,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "write_file",
        method: Method::FileWrite,
        description: "Write a whole text file in the workspace (created or replaced, with the directories it needs), recorded as one operation. A path below a file or through a symlink is refused and changes nothing.",
        effect: Effect::Changes,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "delete_file",
        method: Method::FileDelete,
        description: "Delete a file or a symlink of the workspace (not a directory), recorded as one operation; restore or undo brings it back.",
        effect: Effect::Changes,
        idempotent: false,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "list_files",
        method: Method::FileList,
        description: "List the files of the workspace (or under a directory) as it is now or at an earlier version, at most 10,000 (the total is given).",
        effect: Effect::Reads,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "queue_publish",
        method: Method::QueuePublish,
        description: "Publish a message to a queue topic for other agents or humans (e.g. task.created).",
        effect: Effect::Adds,
        idempotent: false,
        input: Some(input::<PublishParams>),
        adapt: publish_args,
    },
    ToolSpec {
        name: "queue_claim",
        method: Method::QueueClaim,
        description: "Claim (lease) messages of a consumer group; settle each with queue_ack when done or queue_nack to retry later.",
        effect: Effect::Adds,
        idempotent: false,
        input: Some(input::<ClaimParams>),
        adapt: claim_args,
    },
    ToolSpec {
        name: "queue_ack",
        method: Method::QueueAck,
        description: "Acknowledge a claimed message by its receipt: the work is done and it is not delivered again. With `next`, also claim up to that many further messages of the same group in the same step (ack what is done, take what is next).",
        effect: Effect::Changes,
        idempotent: false,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "queue_nack",
        method: Method::QueueNack,
        description: "Give a claimed message back by its receipt when the work failed; it is retried after a backoff.",
        effect: Effect::Changes,
        idempotent: false,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "queue_extend",
        method: Method::QueueExtend,
        description: "Extend the lease of a message you claimed and still work on, so it is not handed to another consumer.",
        effect: Effect::Adds,
        idempotent: true,
        input: Some(input::<ExtendParams>),
        adapt: claim_args,
    },
    ToolSpec {
        name: "queue_stats",
        method: Method::QueueStats,
        description: "How many messages wait, are leased and are dead, per topic and consumer group.",
        effect: Effect::Reads,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "queue_leases",
        method: Method::QueueLeases,
        description: "The leases in flight: who holds which message of a consumer group (or of every group), on which attempt, until when (ms since the epoch).",
        effect: Effect::Reads,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "policy_explain",
        method: Method::PolicyExplain,
        description: "Ask the policy whether you may do an action on a resource, and why (the rules that decide and what to do if refused).",
        effect: Effect::Reads,
        idempotent: true,
        input: Some(input::<AccessParams>),
        adapt: keep,
    },
    ToolSpec {
        name: "what_may_i_do",
        method: Method::PolicyWhatMayIDo,
        description: "List what you are allowed to do under a resource (default the whole workspace), so you can plan instead of probing.",
        effect: Effect::Reads,
        idempotent: true,
        input: Some(input::<MayParams>),
        adapt: keep,
    },
    ToolSpec {
        name: "request_approval",
        method: Method::ApprovalRequest,
        description: "File a request for a human to approve an action the policy allows only with approval. Once approval_status says granted, pass its id as `approval` with the call.",
        effect: Effect::Adds,
        idempotent: true,
        input: Some(input::<AccessParams>),
        adapt: keep,
    },
    ToolSpec {
        name: "approval_status",
        method: Method::ApprovalStatus,
        description: "Where one of your approval requests stands: pending, granted (with the uses left), used up or rejected.",
        effect: Effect::Reads,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "effects",
        method: Method::EffectList,
        description: "List the effects on the world outside (deploys, payments, messages) begun in this workspace, newest first, with where each stands; unfinished=true lists only those not settled.",
        effect: Effect::Reads,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "effect_begin",
        method: Method::EffectBegin,
        description: "Before acting on the world outside (a deploy, a payment, a message), record it under an idempotency key. Perform it only if the outcome is `new`, then call effect_complete or effect_fail; `already_done` gives the earlier result, and `in_flight` or `needs_reconciliation` mean do not perform it again.",
        effect: Effect::Adds,
        idempotent: true,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "effect_complete",
        method: Method::EffectComplete,
        description: "Record that an effect begun with effect_begin took effect, with its result.",
        effect: Effect::Adds,
        idempotent: false,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "effect_fail",
        method: Method::EffectFail,
        description: "Record that an effect begun with effect_begin failed without taking effect (it may then be begun again under a new key).",
        effect: Effect::Adds,
        idempotent: false,
        input: None,
        adapt: keep,
    },
    ToolSpec {
        name: "verify",
        method: Method::Verify,
        description: "Check that the workspace's history is intact: every operation and tree re-hashed, every stored file present (deep=true re-hashes them too).",
        effect: Effect::Reads,
        idempotent: true,
        input: None,
        adapt: keep,
    },
];

/// The tool named `name`.
pub(super) fn find(name: &str) -> Option<&'static ToolSpec> {
    TOOLS.iter().find(|t| t.name == name)
}

/// An object schema of the service's contract, as a tool's.
fn object(schema: Value) -> Arc<JsonObject> {
    match schema {
        Value::Object(o) => Arc::new(o),
        _ => Arc::new(JsonObject::new()),
    }
}

impl ToolSpec {
    /// The tool as a client lists it.
    pub(super) fn tool(&self) -> Tool {
        let annotations = ToolAnnotations::new()
            .read_only(self.effect == Effect::Reads)
            .destructive(self.effect == Effect::Changes)
            .idempotent(self.idempotent)
            .open_world(false);
        let contract = self.method.contract();
        let input = match self.input {
            Some(renamed) => renamed(),
            None => object(contract.params),
        };
        Tool::new(self.name, self.description, input)
            .with_annotations(annotations)
            .with_raw_output_schema(object(contract.result))
    }
}
