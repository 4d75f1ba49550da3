//! The method table of the control socket: each method's parameters, the access request it is
//! authorized as, and what it does.
//!
//! Every request is authorized through the `Authorizer` port as the connection's actor (with the
//! request's capability token, or the one the agent was given) *before* anything happens; a
//! refusal changes nothing. The mapping onto access requests follows core's own (so a rule
//! written for core's checks also governs the socket):
//!
//! | method | action | resource | `operation` |
//! |---|---|---|---|
//! | `history`, `status` | read | branch | method name |
//! | `show` | read | the op's branch | `show` |
//! | `diff` | read | the `fs` prefix, or the environment | — |
//! | `mark` | write | environment | `mark` |
//! | `restore`, `undo` | write | branch | `restore` |
//! | `restore` with `dry_run` | read | branch | `restore` |
//! | `exec`, `process.spawn`, `pty.open` | execute | program + args | `exec`, `spawn`, `pty` |
//! | `process.read`, `.wait`, `.list`; `pty.read`, `.attach`, `.list` | read | environment | method name |
//! | `process.signal`; `pty.write`, `.resize`, `.detach`, `.close` | write | environment | method name |
//! | `queue.publish` | publish | topic | — |
//! | `queue.claim`, `queue.ack`, `queue.nack` | consume | topic named as the consumer group | — |
//! | `policy.explain`, `policy.what_may_i_do` | read | environment | method name |
//! | `approval.request` | write | environment | `approval.request` |
//! | `gc` | delete | environment | `gc` |
//!
//! Every method also takes `token` (a capability token) and `approval` (the id of a granted
//! approval), which go into the request's context. Core re-checks the operations it performs
//! itself (history, mark, restore, gc…) as the same actor without them: an approval or a token
//! can narrow those, not widen them past the actor's own rules.

use std::time::Duration;

use base64::Engine as _;
use environment_bus::{BusError, Headers, PublishOptions, Receipt};
use environment_core::{
    AccessRequest, Action, AttrValue, Context, EnvError, ForAgent, HistoryEntry, HistoryOptions,
    Intent, IntentKind, Key, KeyChange, KeyPrefix, Namespace, OpId, Operation, Resource, Verdict,
};
use environment_policy::{ApprovalState, PolicyError};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::commands::{self, PtyOp};
use super::rpc::{
    CONFLICT, DENIED, INTERNAL_ERROR, INVALID_PARAMS, METHOD_NOT_FOUND, RpcError, UNAVAILABLE,
    UNKNOWN_VERSION,
};
use super::state::{Counters, Shared, lock};
use crate::error::SandboxError;
use crate::restore::RestoreStep;

/// The methods of the control socket, as the schema (`schema/control.json`) lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Method {
    /// The branch's history, key nodes first.
    History,
    /// One operation's record.
    Show,
    /// What changed between two versions.
    Diff,
    /// Names a version.
    Mark,
    /// Restores the workspace to a version (self-rollback); `dry_run` previews.
    Restore,
    /// Restores the workspace to the version before the last operation.
    Undo,
    /// The supervisor's state.
    Status,
    /// Publishes a message to a queue topic.
    QueuePublish,
    /// Leases messages of a consumer group.
    QueueClaim,
    /// Acknowledges a lease.
    QueueAck,
    /// Gives a lease back for a later retry.
    QueueNack,
    /// Explains the policy's decision on a request.
    PolicyExplain,
    /// Lists what the caller may do under a resource.
    PolicyWhatMayIDo,
    /// Files an approval request for an action that needs one.
    ApprovalRequest,
    /// Deletes unreferenced blobs (normally refused to agents).
    Gc,
    /// Runs a command to its end as a recorded operation.
    Exec,
    /// Starts a background process.
    ProcessSpawn,
    /// Reads a background process's output from an offset.
    ProcessRead,
    /// Waits (bounded) for a background process to end.
    ProcessWait,
    /// Signals a background process and everything it started.
    ProcessSignal,
    /// Lists the background processes.
    ProcessList,
    /// Opens a terminal session.
    PtyOpen,
    /// Types into a terminal session.
    PtyWrite,
    /// Reads a terminal session's output since the last read.
    PtyRead,
    /// Resizes a terminal session.
    PtyResize,
    /// Detaches from a terminal session (it keeps running).
    PtyDetach,
    /// Re-attaches to a terminal session, with the output since the last read.
    PtyAttach,
    /// Closes a terminal session.
    PtyClose,
    /// Lists the terminal sessions.
    PtyList,
}

impl Method {
    /// Every method, in schema order.
    pub const ALL: &'static [Method] = &[
        Method::History,
        Method::Show,
        Method::Diff,
        Method::Mark,
        Method::Restore,
        Method::Undo,
        Method::Status,
        Method::QueuePublish,
        Method::QueueClaim,
        Method::QueueAck,
        Method::QueueNack,
        Method::PolicyExplain,
        Method::PolicyWhatMayIDo,
        Method::ApprovalRequest,
        Method::Gc,
        Method::Exec,
        Method::ProcessSpawn,
        Method::ProcessRead,
        Method::ProcessWait,
        Method::ProcessSignal,
        Method::ProcessList,
        Method::PtyOpen,
        Method::PtyWrite,
        Method::PtyRead,
        Method::PtyResize,
        Method::PtyDetach,
        Method::PtyAttach,
        Method::PtyClose,
        Method::PtyList,
    ];

    /// The method's name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Method::History => "history",
            Method::Show => "show",
            Method::Diff => "diff",
            Method::Mark => "mark",
            Method::Restore => "restore",
            Method::Undo => "undo",
            Method::Status => "status",
            Method::QueuePublish => "queue.publish",
            Method::QueueClaim => "queue.claim",
            Method::QueueAck => "queue.ack",
            Method::QueueNack => "queue.nack",
            Method::PolicyExplain => "policy.explain",
            Method::PolicyWhatMayIDo => "policy.what_may_i_do",
            Method::ApprovalRequest => "approval.request",
            Method::Gc => "gc",
            Method::Exec => "exec",
            Method::ProcessSpawn => "process.spawn",
            Method::ProcessRead => "process.read",
            Method::ProcessWait => "process.wait",
            Method::ProcessSignal => "process.signal",
            Method::ProcessList => "process.list",
            Method::PtyOpen => "pty.open",
            Method::PtyWrite => "pty.write",
            Method::PtyRead => "pty.read",
            Method::PtyResize => "pty.resize",
            Method::PtyDetach => "pty.detach",
            Method::PtyAttach => "pty.attach",
            Method::PtyClose => "pty.close",
            Method::PtyList => "pty.list",
        }
    }

    /// The method with this wire name.
    pub fn from_name(name: &str) -> Option<Method> {
        Method::ALL.iter().copied().find(|m| m.name() == name)
    }
}

/// The published schema of the control socket (OpenRPC-style JSON).
pub const SCHEMA: &str = include_str!("../../schema/control.json");

/// Runs one call: parameters, authorization, then the method.
pub(crate) fn call(
    shared: &Shared,
    method: &str,
    mut params: Map<String, Value>,
) -> Result<Value, RpcError> {
    Counters::bump(&shared.counters.requests);
    let Some(m) = Method::from_name(method) else {
        let shown: String = method.chars().take(100).collect();
        return Err(RpcError::new(
            METHOD_NOT_FOUND,
            format!("method not found: {shown:?}"),
            "call one of the methods the control schema lists.",
        ));
    };
    let token = match params.remove("token") {
        None | Some(Value::Null) => shared.default_token.clone(),
        Some(Value::String(t)) => Some(t),
        Some(_) => return Err(RpcError::invalid_params("`token` must be a string")),
    };
    let approval = match params.remove("approval") {
        None | Some(Value::Null) => None,
        Some(Value::String(a)) => Some(a),
        Some(_) => return Err(RpcError::invalid_params("`approval` must be a string")),
    };
    let gate = Gate {
        shared,
        token,
        approval,
    };
    match m {
        Method::Exec => {
            let (c, own) = commands::split(params, commands::EXEC_FIELDS)?;
            return commands::exec(&gate, c, own);
        }
        Method::ProcessSpawn => {
            let (c, Empty {}) = commands::split(params, &[])?;
            return commands::spawn(&gate, c);
        }
        Method::PtyOpen => {
            let (c, own) = commands::split(params, commands::PTY_OPEN_FIELDS)?;
            return commands::pty_open(&gate, c, own);
        }
        _ => {}
    }
    let p = Value::Object(params);
    let pty = |op| -> Result<Value, RpcError> {
        commands::pty_call(&gate, op, m.name(), parse(p.clone())?)
    };
    match m {
        Method::History => history(&gate, parse(p)?),
        Method::Show => show(&gate, parse(p)?),
        Method::Diff => diff(&gate, parse(p)?),
        Method::Mark => mark(&gate, parse(p)?),
        Method::Restore => restore(&gate, parse(p)?),
        Method::Undo => {
            let _: Empty = parse(p)?;
            undo(&gate)
        }
        Method::Status => {
            let _: Empty = parse(p)?;
            status(&gate)
        }
        Method::QueuePublish => publish(&gate, parse(p)?),
        Method::QueueClaim => claim(&gate, parse(p)?),
        Method::QueueAck => settle(&gate, parse(p)?, true),
        Method::QueueNack => settle(&gate, parse(p)?, false),
        Method::PolicyExplain => explain(&gate, parse(p)?),
        Method::PolicyWhatMayIDo => what_may(&gate, parse(p)?),
        Method::ApprovalRequest => approval_request(&gate, parse(p)?),
        Method::Gc => {
            let _: Empty = parse(p)?;
            gc(&gate)
        }
        Method::ProcessRead => commands::process_read(&gate, parse(p)?),
        Method::ProcessWait => commands::process_wait(&gate, parse(p)?),
        Method::ProcessSignal => commands::process_signal(&gate, parse(p)?),
        Method::ProcessList => {
            let _: Empty = parse(p)?;
            commands::process_list(&gate)
        }
        Method::PtyWrite => pty(PtyOp::Write),
        Method::PtyRead => pty(PtyOp::Read),
        Method::PtyResize => pty(PtyOp::Resize),
        Method::PtyDetach => pty(PtyOp::Detach),
        Method::PtyAttach => pty(PtyOp::Attach),
        Method::PtyClose => pty(PtyOp::Close),
        Method::PtyList => {
            let _: Empty = parse(p)?;
            commands::pty_list(&gate)
        }
        // Dispatched above, with their command parameters taken apart.
        Method::Exec | Method::ProcessSpawn | Method::PtyOpen => Err(RpcError::new(
            INTERNAL_ERROR,
            "dispatch error",
            "report the error to a human.",
        )),
    }
}

fn parse<T: DeserializeOwned>(v: Value) -> Result<T, RpcError> {
    serde_json::from_value(v).map_err(RpcError::invalid_params)
}

/// Authorizes requests as the connection's actor.
pub(super) struct Gate<'a> {
    shared: &'a Shared,
    token: Option<String>,
    /// A granted approval presented with the request.
    approval: Option<String>,
}

impl<'a> Gate<'a> {
    pub(super) fn shared(&self) -> &'a Shared {
        self.shared
    }

    pub(super) fn actor(&self) -> &'a environment_core::ActorId {
        &self.shared.actor
    }

    fn request(
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
        if let Resource::Branch(b) = &resource {
            context.branch = Some(b.clone());
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
        let req = self.request(action, resource, operation);
        let decision = self.shared.authorizer.authorize(&req);
        if decision.is_allowed() {
            return Ok(());
        }
        Counters::bump(&self.shared.counters.denied);
        Err(env_error(EnvError::NotAllowed(Box::new(decision))))
    }

    fn branch(&self) -> &str {
        &self.shared.branch
    }
}

/// Renders core's errors with their documented codes.
pub(super) fn env_error(e: EnvError) -> RpcError {
    let code = match &e {
        EnvError::NotAllowed(_) => DENIED,
        EnvError::UnknownVersion(_)
        | EnvError::AmbiguousVersion { .. }
        | EnvError::VersionDropped(_)
        | EnvError::UnknownBranch(_) => UNKNOWN_VERSION,
        EnvError::Conflict(_)
        | EnvError::MarkExists(_)
        | EnvError::BranchExists(_)
        | EnvError::NothingToUndo(_) => CONFLICT,
        EnvError::Key(_)
        | EnvError::Actor(_)
        | EnvError::InvalidName { .. }
        | EnvError::ValueTooLarge { .. }
        | EnvError::RequestTooLarge(_)
        | EnvError::DuplicateKey(_)
        | EnvError::NoSuchProcess { .. }
        | EnvError::Exec { .. } => INVALID_PARAMS,
        EnvError::SecretUnavailable { .. } => UNAVAILABLE,
        EnvError::Unsupported(_) => UNAVAILABLE,
        _ => INTERNAL_ERROR,
    };
    let mut err = RpcError::rendered(code, e.to_string(), e.for_agent());
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

fn sandbox_error(e: SandboxError) -> RpcError {
    match e {
        SandboxError::Env(e) => env_error(e),
        SandboxError::Escape { .. } => {
            RpcError::rendered(INVALID_PARAMS, e.to_string(), e.for_agent())
        }
        other => RpcError::rendered(INTERNAL_ERROR, other.to_string(), other.for_agent()),
    }
}

fn bus_error(e: BusError) -> RpcError {
    let code = match &e {
        BusError::StaleReceipt { .. } => CONFLICT,
        BusError::UnknownTopic { .. }
        | BusError::UnknownGroup { .. }
        | BusError::InvalidName { .. }
        | BusError::PayloadTooLarge { .. }
        | BusError::OutOfRange { .. }
        | BusError::UnknownReceipt { .. } => INVALID_PARAMS,
        _ => INTERNAL_ERROR,
    };
    let next = match code {
        CONFLICT => "claim again; this lease is no longer yours.",
        INVALID_PARAMS => "fix the topic, group, receipt or sizes and retry.",
        _ => "report the error to a human if it persists.",
    };
    RpcError::new(code, e.to_string(), next)
}

fn policy_error(e: PolicyError) -> RpcError {
    let (code, next) = match &e {
        PolicyError::NoApprovalNeeded(_) => (
            CONFLICT,
            "act directly if it is allowed; if it is denied, an approval cannot help.",
        ),
        PolicyError::Invalid(_) | PolicyError::BadEntity(_) | PolicyError::Token(_) => {
            (INVALID_PARAMS, "fix the request and retry.")
        }
        _ => (
            INTERNAL_ERROR,
            "report the error to a human if it persists.",
        ),
    };
    RpcError::new(code, e.to_string(), next)
}

fn resolve(shared: &Shared, spec: &str) -> Result<OpId, RpcError> {
    shared.env.resolve(spec).map_err(env_error)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Empty {}

// ---- history, show, diff ------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryParams {
    #[serde(default)]
    branch: Option<String>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    limit: Option<usize>,
}

const MAX_HISTORY: usize = 1000;

fn history(g: &Gate<'_>, p: HistoryParams) -> Result<Value, RpcError> {
    let branch = p.branch.unwrap_or_else(|| g.branch().to_owned());
    let limit = p.limit.unwrap_or(50);
    if limit == 0 || limit > MAX_HISTORY {
        return Err(RpcError::invalid_params(format!(
            "`limit` must be 1..={MAX_HISTORY}"
        )));
    }
    g.allow(
        Action::Read,
        Resource::Branch(branch.clone()),
        Some("history"),
    )?;
    let entries = g
        .shared
        .env
        .history(
            &g.shared.actor,
            &branch,
            &HistoryOptions { all: p.all, limit },
        )
        .map_err(env_error)?;
    let head = g.shared.env.head(&branch).map_err(env_error)?;
    Ok(json!({
        "branch": branch,
        "head": head.to_string(),
        "entries": entries.iter().map(history_entry).collect::<Vec<_>>(),
    }))
}

fn history_entry(e: &HistoryEntry) -> Value {
    match e {
        HistoryEntry::Op {
            op,
            marks,
            fork_point,
        } => {
            let mut v = op_json(op);
            if let Value::Object(m) = &mut v {
                m.insert("type".into(), json!("op"));
                m.insert("marks".into(), json!(marks));
                m.insert("fork_point".into(), json!(fork_point));
                m.insert("text".into(), json!(e.to_string()));
            }
            v
        }
        HistoryEntry::Captures {
            count,
            newest,
            oldest,
            changed,
            quiet,
            from_ms,
            to_ms,
        } => json!({
            "type": "captures",
            "count": count,
            "newest": newest.to_string(),
            "oldest": oldest.to_string(),
            "changed": changed,
            "quiet": quiet,
            "from_ms": from_ms,
            "to_ms": to_ms,
            "text": e.to_string(),
        }),
    }
}

fn op_json(op: &Operation) -> Value {
    json!({
        "id": op.id.to_string(),
        "seq": op.seq,
        "parents": op.parents.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "branch": op.branch,
        "actor": op.actor.as_str(),
        "intent": { "kind": op.intent.kind.to_string(), "text": op.intent.text },
        "base_version": op.base_version.map(|v| v.to_string()),
        "summary": {
            "added": op.summary.added,
            "modified": op.summary.modified,
            "removed": op.summary.removed,
            "keys": op.summary.keys.iter().map(|k| k.display_path()).collect::<Vec<_>>(),
        },
        "flags": op.flags.names(),
        "time_ms": op.time_ms,
        "restored_from": op.restored_from.map(|v| v.to_string()),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ShowParams {
    version: String,
}

fn show(g: &Gate<'_>, p: ShowParams) -> Result<Value, RpcError> {
    let id = resolve(g.shared, &p.version)?;
    let op = g.shared.env.op(&id).map_err(env_error)?;
    g.allow(
        Action::Read,
        Resource::Branch(op.branch.clone()),
        Some("show"),
    )?;
    Ok(op_json(&op))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DiffParams {
    from: String,
    #[serde(default)]
    to: Option<String>,
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

const MAX_LISTED: usize = 1000;

fn diff(g: &Gate<'_>, p: DiffParams) -> Result<Value, RpcError> {
    let from = resolve(g.shared, &p.from)?;
    let to = match &p.to {
        Some(t) => resolve(g.shared, t)?,
        None => g.shared.env.head(g.branch()).map_err(env_error)?,
    };
    let prefix = match &p.prefix {
        Some(s) if !s.is_empty() => Some(
            KeyPrefix::new(Namespace::Fs, s.as_bytes().to_vec())
                .map_err(|e| env_error(EnvError::Key(e)))?,
        ),
        _ => None,
    };
    let limit = p.limit.unwrap_or(200).clamp(1, MAX_LISTED);
    let resource = match &prefix {
        Some(pre) => Resource::Prefix(pre.clone()),
        None => Resource::Environment,
    };
    g.allow(Action::Read, resource, None)?;
    let changes = g
        .shared
        .env
        .diff(&g.shared.actor, &from, &to, prefix.as_ref())
        .map_err(env_error)?;
    Ok(json!({
        "from": from.to_string(),
        "to": to.to_string(),
        "total": changes.len(),
        "truncated": changes.len() > limit,
        "changes": changes.iter().take(limit).map(change_json).collect::<Vec<_>>(),
    }))
}

fn change_json(c: &KeyChange) -> Value {
    let change = match (&c.before, &c.after) {
        (None, Some(_)) => "added",
        (Some(_), None) => "removed",
        _ => "modified",
    };
    let meta = c.after.as_ref().or(c.before.as_ref()).map(|v| &v.meta);
    json!({
        "key": key_text(&c.key),
        "change": change,
        "kind": meta.map(|m| format!("{:?}", m.kind).to_lowercase()),
        "size": c.after.as_ref().map(|v| v.meta.size),
    })
}

fn key_text(k: &Key) -> String {
    match k.namespace() {
        Namespace::Fs => k.display_path(),
        ns => format!("{}:{}", ns.as_str(), k.display_path()),
    }
}

// ---- mark, restore, undo, status ----------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MarkParams {
    name: String,
    #[serde(default)]
    version: Option<String>,
}

fn mark(g: &Gate<'_>, p: MarkParams) -> Result<Value, RpcError> {
    g.allow(Action::Write, Resource::Environment, Some("mark"))?;
    let version = match &p.version {
        Some(v) => resolve(g.shared, v)?,
        None => {
            // The mark names what is on disk now, not the last debounced capture.
            g.shared
                .capture("capture before a mark")
                .map_err(sandbox_error)?;
            g.shared.env.head(g.branch()).map_err(env_error)?
        }
    };
    g.shared
        .env
        .mark(&g.shared.actor, &p.name, &version)
        .map_err(env_error)?;
    Ok(json!({ "name": p.name, "version": version.to_string() }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RestoreParams {
    version: String,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    intent: Option<String>,
}

fn steps_json(steps: &[RestoreStep]) -> Value {
    let (mut write, mut remove) = (Vec::new(), Vec::new());
    for s in steps {
        match s {
            RestoreStep::Write(k) => write.push(key_text(k)),
            RestoreStep::Remove(k) => remove.push(key_text(k)),
        }
    }
    json!({
        "writes": write.len(),
        "removals": remove.len(),
        "write": write.into_iter().take(MAX_LISTED).collect::<Vec<_>>(),
        "remove": remove.into_iter().take(MAX_LISTED).collect::<Vec<_>>(),
    })
}

fn restore(g: &Gate<'_>, p: RestoreParams) -> Result<Value, RpcError> {
    let action = if p.dry_run {
        Action::Read
    } else {
        Action::Write
    };
    g.allow(
        action,
        Resource::Branch(g.branch().to_owned()),
        Some("restore"),
    )?;
    let target = resolve(g.shared, &p.version)?;
    let text = p
        .intent
        .unwrap_or_else(|| format!("restore to {} (asked by the agent)", p.version));
    restore_to(g, target, p.dry_run, text)
}

fn restore_to(g: &Gate<'_>, target: OpId, dry_run: bool, text: String) -> Result<Value, RpcError> {
    let shared = g.shared;
    if dry_run {
        let plan = shared
            .with_tracker(|t| t.plan_restore(&target))
            .map_err(sandbox_error)?;
        return Ok(json!({
            "dry_run": true,
            "from": plan.from.to_string(),
            "to": plan.to.to_string(),
            "steps": steps_json(&plan.steps),
        }));
    }
    let plan = shared
        .with_tracker(|t| {
            t.restore(
                &shared.actor,
                &target,
                Intent::new(IntentKind::Restore, text),
            )
        })
        .map_err(sandbox_error)?;
    Counters::bump(&shared.counters.rollbacks);
    let head = shared.env.head(g.branch()).map_err(env_error)?;
    Ok(json!({
        "dry_run": false,
        "version": head.to_string(),
        "from": plan.from.to_string(),
        "restored_to": plan.to.to_string(),
        "steps": steps_json(&plan.steps),
    }))
}

fn undo(g: &Gate<'_>) -> Result<Value, RpcError> {
    // Undo is a restore of the live tree, so it is authorized as one (core checks the same).
    g.allow(
        Action::Write,
        Resource::Branch(g.branch().to_owned()),
        Some("restore"),
    )?;
    g.shared
        .capture("capture before an undo")
        .map_err(sandbox_error)?;
    let head = g.shared.env.head(g.branch()).map_err(env_error)?;
    let op = g.shared.env.op(&head).map_err(env_error)?;
    let Some(parent) = op.parents.first().copied() else {
        return Err(env_error(EnvError::NothingToUndo(g.branch().to_owned())));
    };
    restore_to(g, parent, false, format!("undo {}", head.short()))
}

fn status(g: &Gate<'_>) -> Result<Value, RpcError> {
    g.allow(
        Action::Read,
        Resource::Branch(g.branch().to_owned()),
        Some("status"),
    )?;
    let s = g.shared;
    let head = s.env.head(g.branch()).map_err(env_error)?;
    let captures = s
        .with_tracker(|t| Ok(t.captures()))
        .map_err(sandbox_error)?;
    Ok(json!({
        "actor": s.actor.as_str(),
        "branch": g.branch(),
        "head": head.to_string(),
        "workspace": s.launcher.workspace_inside().display().to_string(),
        "sandbox": s.launcher.describe(),
        "agent_pid": *lock(&s.agent_pid),
        "captures": captures,
        "rollbacks": s.counters.rollbacks.load(std::sync::atomic::Ordering::Relaxed),
        "policy": s.policy.is_some(),
        "queue": s.bus.is_some(),
    }))
}

// ---- queue ---------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishParams {
    topic: String,
    payload: String,
    #[serde(default)]
    ordering_key: Option<String>,
    #[serde(default)]
    dedup_id: Option<String>,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    correlation_id: Option<String>,
}

fn bus<'a>(g: &'a Gate<'_>) -> Result<&'a environment_bus::Bus, RpcError> {
    g.shared
        .bus
        .as_ref()
        .ok_or_else(|| RpcError::unavailable("the queue"))
}

fn publish(g: &Gate<'_>, p: PublishParams) -> Result<Value, RpcError> {
    let bus = bus(g)?;
    g.allow(Action::Publish, Resource::Topic(p.topic.clone()), None)?;
    let mut opts = PublishOptions::default().headers(Headers {
        // Who published is the supervisor's to say, not the caller's.
        actor: Some(g.shared.actor.to_string()),
        correlation_id: p.correlation_id,
        causing_op: None,
    });
    opts.ordering_key = p.ordering_key;
    opts.dedup_id = p.dedup_id;
    opts.delay = p.delay_ms.map(Duration::from_millis);
    let published = bus
        .publish(&p.topic, p.payload.into_bytes(), opts)
        .wait()
        .map_err(bus_error)?;
    Ok(json!({ "id": published.id.0, "duplicate": published.duplicate }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClaimParams {
    group: String,
    #[serde(default)]
    consumer: Option<String>,
    #[serde(default)]
    max: Option<u32>,
    #[serde(default)]
    lease_ms: Option<u64>,
}

fn claim(g: &Gate<'_>, p: ClaimParams) -> Result<Value, RpcError> {
    let bus = bus(g)?;
    g.allow(Action::Consume, Resource::Topic(p.group.clone()), None)?;
    let consumer = p.consumer.unwrap_or_else(|| g.shared.actor.to_string());
    let leases = bus
        .claim(
            &p.group,
            &consumer,
            p.max.unwrap_or(1),
            Duration::from_millis(p.lease_ms.unwrap_or(30_000)),
        )
        .wait()
        .map_err(bus_error)?;
    let mut receipts = lock(&g.shared.receipts);
    let out: Vec<Value> = leases
        .iter()
        .map(|l| {
            let receipt = l.receipt.to_string();
            receipts.insert(receipt.clone(), l.group.clone());
            let (payload, base64) = match std::str::from_utf8(&l.message.payload) {
                Ok(s) => (Some(s.to_owned()), None),
                Err(_) => (
                    None,
                    Some(base64::engine::general_purpose::STANDARD.encode(&l.message.payload)),
                ),
            };
            json!({
                "receipt": receipt,
                "group": l.group,
                "topic": l.message.topic,
                "message_id": l.message.id.0,
                "payload": payload,
                "payload_base64": base64,
                "ordering_key": l.message.ordering_key,
                "correlation_id": l.message.headers.correlation_id,
                "publisher": l.message.headers.actor,
                "attempt": l.attempt,
                "lease_until_ms": l.lease_until_ms,
            })
        })
        .collect();
    Ok(json!({ "leases": out }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SettleParams {
    receipt: String,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    error: Option<String>,
}

fn settle(g: &Gate<'_>, p: SettleParams, ack: bool) -> Result<Value, RpcError> {
    let bus = bus(g)?;
    if ack && (p.delay_ms.is_some() || p.error.is_some()) {
        return Err(RpcError::invalid_params(
            "`delay_ms` and `error` are for queue.nack",
        ));
    }
    let Some(group) = lock(&g.shared.receipts).get(&p.receipt).cloned() else {
        return Err(RpcError::invalid_params(
            "unknown receipt: it was not handed out by queue.claim on this supervisor",
        ));
    };
    g.allow(Action::Consume, Resource::Topic(group), None)?;
    let receipt: Receipt = p.receipt.parse().map_err(bus_error)?;
    let pending = if ack {
        bus.ack(&receipt)
    } else {
        bus.nack_with_error(
            &receipt,
            p.delay_ms.map(Duration::from_millis),
            p.error.as_deref(),
        )
    };
    pending.wait().map_err(bus_error)?;
    lock(&g.shared.receipts).remove(&p.receipt);
    Ok(json!({ "receipt": p.receipt, "settled": if ack { "ack" } else { "nack" } }))
}

// ---- policy --------------------------------------------------------------------------------

/// A resource as the policy methods name it: exactly one field set.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ResourceParam {
    path: Option<String>,
    prefix: Option<String>,
    object: Option<String>,
    branch: Option<String>,
    topic: Option<String>,
    program: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    service: Option<String>,
    secret: Option<String>,
    environment: Option<bool>,
}

impl ResourceParam {
    fn resource(self) -> Result<Resource, RpcError> {
        let key = |e| env_error(EnvError::Key(e));
        let set = [
            self.path.is_some(),
            self.prefix.is_some(),
            self.object.is_some(),
            self.branch.is_some(),
            self.topic.is_some(),
            self.program.is_some(),
            self.service.is_some(),
            self.secret.is_some(),
            self.environment == Some(true),
        ];
        if set.iter().filter(|b| **b).count() != 1 {
            return Err(RpcError::invalid_params(
                "`resource` names exactly one of path, prefix, object, branch, topic, program (+ args), service, secret, environment",
            ));
        }
        Ok(if let Some(p) = self.path {
            Resource::Key(Key::fs(p.into_bytes()).map_err(key)?)
        } else if let Some(p) = self.prefix {
            Resource::Prefix(KeyPrefix::new(Namespace::Fs, p.into_bytes()).map_err(key)?)
        } else if let Some(o) = self.object {
            Resource::Key(Key::obj(o.into_bytes()).map_err(key)?)
        } else if let Some(b) = self.branch {
            Resource::Branch(b)
        } else if let Some(t) = self.topic {
            Resource::Topic(t)
        } else if let Some(program) = self.program {
            Resource::Program {
                program,
                args: self.args,
            }
        } else if let Some(s) = self.service {
            Resource::Service(s)
        } else if let Some(s) = self.secret {
            Resource::Secret(s)
        } else {
            Resource::Environment
        })
    }
}

fn action_of(name: &str) -> Result<Action, RpcError> {
    Ok(match name {
        "read" => Action::Read,
        "write" => Action::Write,
        "delete" => Action::Delete,
        "execute" => Action::Execute,
        "publish" => Action::Publish,
        "consume" => Action::Consume,
        "approve" => Action::Approve,
        "delegate" => Action::Delegate,
        "" => return Err(RpcError::invalid_params("`action` is empty")),
        other => Action::Custom(other.to_owned()),
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExplainParams {
    action: String,
    resource: ResourceParam,
    #[serde(default)]
    operation: Option<String>,
}

fn policy<'a>(g: &'a Gate<'_>) -> Result<&'a environment_policy::Policy, RpcError> {
    g.shared
        .policy
        .as_deref()
        .ok_or_else(|| RpcError::unavailable("a policy"))
}

fn explain(g: &Gate<'_>, p: ExplainParams) -> Result<Value, RpcError> {
    let policy = policy(g)?;
    g.allow(Action::Read, Resource::Environment, Some("policy.explain"))?;
    let req = g.request(
        action_of(&p.action)?,
        p.resource.resource()?,
        p.operation.as_deref(),
    );
    // A dry run: explaining spends no quota, approval or token use.
    let d = policy.evaluate(&req);
    Ok(json!({
        "allowed": d.is_allowed(),
        "outcome": format!("{:?}", d.outcome()).to_lowercase(),
        "rules": d.rule_ids().collect::<Vec<_>>(),
        "approvers": d.approvers(),
        "policy_version": d.policy_version(),
        "explanation": d.explain(&req),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WhatMayParams {
    resource: ResourceParam,
}

fn what_may(g: &Gate<'_>, p: WhatMayParams) -> Result<Value, RpcError> {
    let policy = policy(g)?;
    g.allow(
        Action::Read,
        Resource::Environment,
        Some("policy.what_may_i_do"),
    )?;
    let perms = policy.what_may(g.shared.actor.as_str(), &p.resource.resource()?);
    Ok(json!({
        "permissions": perms.iter().map(|p| json!({
            "action": p.action,
            "rule": p.rule,
            "resource": p.resource,
            "conditions": p.conditions,
            "except": p.except,
            "via": p.via,
        })).collect::<Vec<_>>(),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalParams {
    action: String,
    resource: ResourceParam,
    #[serde(default)]
    operation: Option<String>,
}

fn approval_request(g: &Gate<'_>, p: ApprovalParams) -> Result<Value, RpcError> {
    let policy = policy(g)?;
    g.allow(
        Action::Write,
        Resource::Environment,
        Some("approval.request"),
    )?;
    let req = g.request(
        action_of(&p.action)?,
        p.resource.resource()?,
        p.operation.as_deref(),
    );
    let a = policy.request_approval(&req).map_err(policy_error)?;
    Ok(json!({
        "id": a.id,
        "state": match a.state {
            ApprovalState::Pending => "pending",
            ApprovalState::Granted { .. } => "granted",
            ApprovalState::Rejected { .. } => "rejected",
            _ => "decided",
        },
        "from": a.from,
        "rules": a.rules,
        "action": a.action,
        "resource": a.resource,
    }))
}

// ---- upkeep --------------------------------------------------------------------------------

fn gc(g: &Gate<'_>) -> Result<Value, RpcError> {
    g.allow(Action::Delete, Resource::Environment, Some("gc"))?;
    let r = g.shared.env.gc(&g.shared.actor).map_err(env_error)?;
    Ok(json!({
        "kept": r.kept,
        "removed": r.removed,
        "bytes_removed": r.bytes_removed,
        "temp_removed": r.temp_removed,
        "nodes_removed": r.nodes_removed,
    }))
}
