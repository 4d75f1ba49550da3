//! The parameters of the tools, with the JSON schemas a model reads.

use schemars::JsonSchema;
use serde::Deserialize;

/// `history`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HistoryParams {
    /// List every operation instead of the key nodes (default false).
    #[serde(default)]
    pub all: bool,
    /// The branch (default "main").
    pub branch: Option<String>,
    /// At most this many entries, newest first (default 30).
    pub limit: Option<usize>,
}

/// `refused`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RefusedParams {
    /// At most this many, newest first (default 30, at most 1000).
    pub limit: Option<usize>,
}

/// A version.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VersionParams {
    /// An op id or unique prefix, a mark, a branch, or HEAD~N.
    pub version: String,
}

/// `diff`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiffParams {
    /// The older version.
    pub from: String,
    /// The newer version (default HEAD).
    pub to: Option<String>,
}

/// `mark`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MarkParams {
    /// The mark's name.
    pub name: String,
    /// The version to name (default HEAD).
    pub version: Option<String>,
}

/// `restore`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreParams {
    /// The version to bring the workspace back to.
    pub version: String,
    /// Only preview what would change (default false).
    #[serde(default)]
    pub dry_run: bool,
}

/// `exec`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecParams {
    /// The program and its arguments, e.g. ["cargo", "test"].
    pub command: Vec<String>,
    /// Why you run it, for the history (default: the command line).
    pub intent: Option<String>,
}

/// `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadParams {
    /// The path relative to the workspace.
    pub path: String,
    /// The version to read (default HEAD).
    pub version: Option<String>,
}

/// `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteParams {
    /// The path relative to the workspace.
    pub path: String,
    /// The whole new content (UTF-8 text).
    pub content: String,
    /// Why, for the history (default "write PATH").
    pub intent: Option<String>,
}

/// `list_files`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// A directory relative to the workspace (default: all).
    pub prefix: Option<String>,
    /// The version (default HEAD).
    pub version: Option<String>,
}

/// `queue_publish`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishParams {
    /// The topic, e.g. "task.created".
    pub topic: String,
    /// The message (text, often JSON).
    pub payload: String,
    /// Ordering key: messages with the same key are handled one at a time, in order.
    pub key: Option<String>,
    /// Dedup id: publishing it again is accepted but not delivered twice.
    pub dedup: Option<String>,
}

/// `queue_claim`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimParams {
    /// The consumer group.
    pub group: String,
    /// How long the lease lasts, in seconds (default 60).
    pub lease_secs: Option<u64>,
    /// At most this many messages (default 1).
    pub max: Option<u32>,
}

/// `queue_ack`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReceiptParams {
    /// The receipt returned by queue_claim.
    pub receipt: String,
}

/// `queue_nack`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NackParams {
    /// The receipt returned by queue_claim.
    pub receipt: String,
    /// Why the work failed.
    pub error: Option<String>,
}

/// A policy question about the configured actor.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AccessParams {
    /// read, write, delete, execute, publish or consume (or an action the policy declares).
    pub action: String,
    /// "path:src/main.rs", "prefix:src", "branch:main", "topic:task.created",
    /// "program:cargo test", "service:https://…", or "environment".
    pub resource: String,
}

/// `what_may_i_do`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MayParams {
    /// Where to look, e.g. "prefix:src" (default: the whole workspace).
    pub resource: Option<String>,
}
