//! The methods on versions: history, show, diff, mark, restore (self-rollback), undo, status,
//! and the upkeep an agent normally may not call (gc).

use environment_core::{
    Action, Conflict, ConflictSide, EnvError, HistoryEntry, HistoryOptions, Intent, IntentKind,
    Key, KeyChange, KeyPrefix, Namespace, OpId, RefusedChange, Resource,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ServiceError;
use super::session::{Session, resolve};
use super::workspace::{Counters, lock};
use std::collections::BTreeMap;

use environment_sandbox::restore::{RestorePlan, RestoreStep};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct HistoryParams {
    #[serde(default)]
    branch: Option<String>,
    #[serde(default)]
    all: bool,
    #[serde(default)]
    limit: Option<usize>,
}

const MAX_HISTORY: usize = 1000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RefusedParams {
    #[serde(default)]
    branch: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

/// A read of `branch`'s history of at most `limit` entries (default 50): the limit checked,
/// the read authorized (core asks again).
fn history_read(
    g: &Session<'_>,
    branch: &str,
    limit: Option<usize>,
) -> Result<usize, ServiceError> {
    let limit = limit.unwrap_or(50);
    if limit == 0 || limit > MAX_HISTORY {
        return Err(ServiceError::invalid(format!(
            "`limit` must be 1..={MAX_HISTORY}"
        )));
    }
    g.allow_rechecked(
        Action::Read,
        Resource::Branch(branch.to_owned()),
        Some("history"),
    )?;
    Ok(limit)
}

/// The changes refused on a branch (default the workspace's), newest first (read as its
/// history is).
pub(super) fn refused(g: &Session<'_>, p: RefusedParams) -> Result<Value, ServiceError> {
    let branch = p.branch.unwrap_or_else(|| g.branch().to_owned());
    let limit = history_read(g, &branch, p.limit)?;
    let refused = g
        .env()
        .refused(g.actor(), &branch, limit)
        .map_err(ServiceError::from)?;
    Ok(json!({
        "branch": branch,
        "refused": refused.iter().map(RefusedChange::to_json).collect::<Vec<_>>(),
    }))
}

pub(super) fn history(g: &Session<'_>, p: HistoryParams) -> Result<Value, ServiceError> {
    let branch = p.branch.unwrap_or_else(|| g.branch().to_owned());
    let limit = history_read(g, &branch, p.limit)?;
    let entries = g
        .env()
        .history(
            &g.shared().actor,
            &branch,
            &HistoryOptions { all: p.all, limit },
        )
        .map_err(ServiceError::from)?;
    let head = g.env().head(&branch).map_err(ServiceError::from)?;
    Ok(json!({
        "branch": branch,
        "head": head.to_string(),
        "entries": entries.iter().map(HistoryEntry::to_json).collect::<Vec<_>>(),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ShowParams {
    version: String,
}

pub(super) fn show(g: &Session<'_>, p: ShowParams) -> Result<Value, ServiceError> {
    let id = resolve(g.shared(), &p.version)?;
    let op = g.env().op(&id).map_err(ServiceError::from)?;
    // Core asks the same when it shows the operation (the changes are a diff, asked there).
    g.allow_rechecked(
        Action::Read,
        Resource::Branch(op.branch.clone()),
        Some("show"),
    )?;
    let shown = g.env().show(g.actor(), &id).map_err(ServiceError::from)?;
    let mut j = shown.op.to_json();
    j["marks"] = json!(shown.marks);
    if let Some(changes) = &shown.changes {
        j["changes"] = json!(changes.iter().map(KeyChange::to_json).collect::<Vec<_>>());
    }
    Ok(j)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DiffParams {
    from: String,
    #[serde(default)]
    to: Option<String>,
    #[serde(default)]
    prefix: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

const MAX_LISTED: usize = 1000;

pub(super) fn diff(g: &Session<'_>, p: DiffParams) -> Result<Value, ServiceError> {
    let from = resolve(g.shared(), &p.from)?;
    let to = match &p.to {
        Some(t) => resolve(g.shared(), t)?,
        None => g.env().head(g.branch()).map_err(ServiceError::from)?,
    };
    let prefix = match &p.prefix {
        Some(s) if !s.is_empty() => Some(
            KeyPrefix::new(Namespace::Fs, s.as_bytes().to_vec())
                .map_err(|e| ServiceError::from(EnvError::Key(e)))?,
        ),
        _ => None,
    };
    let limit = p.limit.unwrap_or(200).clamp(1, MAX_LISTED);
    let resource = match &prefix {
        Some(pre) => Resource::Prefix(pre.clone()),
        None => Resource::Environment,
    };
    g.allow_rechecked(Action::Read, resource, None)?;
    let changes = g
        .env()
        .diff(&g.shared().actor, &from, &to, prefix.as_ref())
        .map_err(ServiceError::from)?;
    let count = |what: &str| changes.iter().filter(|c| c.change() == what).count();
    Ok(json!({
        "from": from.to_string(),
        "to": to.to_string(),
        "total": changes.len(),
        "added": count("added"),
        "modified": count("modified"),
        "removed": count("removed"),
        "truncated": changes.len() > limit,
        "changes": changes.iter().take(limit).map(KeyChange::to_json).collect::<Vec<_>>(),
    }))
}

pub(super) fn key_text(k: &Key) -> String {
    match k.namespace() {
        Namespace::Fs => k.display_path(),
        ns => format!("{}:{}", ns.as_str(), k.display_path()),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MarkParams {
    name: String,
    #[serde(default)]
    version: Option<String>,
}

pub(super) fn mark(g: &Session<'_>, p: MarkParams) -> Result<Value, ServiceError> {
    g.allow_rechecked(Action::Write, Resource::Environment, Some("mark"))?;
    let version = match &p.version {
        Some(v) => resolve(g.shared(), v)?,
        None => {
            // The mark names what is on disk now, not the last debounced capture.
            g.capture("capture before a mark")?;
            g.env().head(g.branch()).map_err(ServiceError::from)?
        }
    };
    g.env()
        .mark(&g.shared().actor, &p.name, &version)
        .map_err(ServiceError::from)?;
    Ok(json!({ "name": p.name, "version": version.to_string() }))
}

/// Every mark with its version, by name.
pub(super) fn marks(g: &Session<'_>) -> Result<Value, ServiceError> {
    g.allow(Action::Read, Resource::Environment, Some("marks"))?;
    let marks = g.env().marks().map_err(ServiceError::from)?;
    Ok(json!({
        "marks": marks
            .iter()
            .map(|(name, v)| json!({ "name": name, "version": v.to_string() }))
            .collect::<Vec<_>>(),
    }))
}

/// Every branch with its head, by name.
pub(super) fn branches(g: &Session<'_>) -> Result<Value, ServiceError> {
    g.allow(Action::Read, Resource::Environment, Some("branch.list"))?;
    let branches = g.env().branches().map_err(ServiceError::from)?;
    Ok(json!({
        "branches": branches
            .iter()
            .map(|(name, head)| json!({ "name": name, "head": head.to_string() }))
            .collect::<Vec<_>>(),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BranchParams {
    name: String,
    #[serde(default)]
    from: Option<String>,
}

/// Creates a branch at a version (default the head, after a capture of what changed): a line
/// of work to try something on and merge back, the tree staying on the workspace's branch.
pub(super) fn branch_create(g: &Session<'_>, p: BranchParams) -> Result<Value, ServiceError> {
    // Core asks the same again when it creates the branch.
    g.allow_rechecked(
        Action::Write,
        Resource::Branch(p.name.clone()),
        Some("branch"),
    )?;
    let from = match &p.from {
        Some(v) => resolve(g.shared(), v)?,
        None => {
            g.capture("capture before a branch")?;
            g.env().head(g.branch()).map_err(ServiceError::from)?
        }
    };
    let version = g
        .env()
        .create_branch(g.actor(), &p.name, &from)
        .map_err(ServiceError::from)?;
    Ok(json!({ "name": p.name, "from": from.to_string(), "version": version.to_string() }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RestoreParams {
    version: String,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    intent: Option<String>,
}

/// What a restore (or a merge written into the tree) did or would do: the counts, the first
/// paths written and removed, the counts under each top-level entry (a directory of thousands
/// of files is one line), what could not be restored and why (the tree then differs from the
/// version there), and how many ignored paths went with the directories removed.
pub(super) fn plan_json(plan: &RestorePlan) -> Value {
    let (mut write, mut remove) = (Vec::new(), Vec::new());
    // (written, removed, holds deeper paths) by the first component of the path.
    let mut by_top: BTreeMap<String, (u64, u64, bool)> = BTreeMap::new();
    for s in &plan.steps {
        let (k, removed) = match s {
            RestoreStep::Write(k) => (k, false),
            RestoreStep::Remove(k) => (k, true),
        };
        let path = key_text(k);
        let (top, deeper) = match path.split_once('/') {
            Some((top, _)) => (top.to_owned(), true),
            None => (path.clone(), false),
        };
        let counts = by_top.entry(top).or_default();
        counts.2 |= deeper;
        if removed {
            counts.1 += 1;
            remove.push(path);
        } else {
            counts.0 += 1;
            write.push(path);
        }
    }
    json!({
        "writes": write.len(),
        "removals": remove.len(),
        "write": write.into_iter().take(MAX_LISTED).collect::<Vec<_>>(),
        "remove": remove.into_iter().take(MAX_LISTED).collect::<Vec<_>>(),
        "by_top": by_top
            .into_iter()
            .map(|(top, (written, removed, deeper))| {
                let top = if deeper { format!("{top}/") } else { top };
                json!({ "top": top, "written": written, "removed": removed })
            })
            .collect::<Vec<_>>(),
        "not_restored": plan
            .not_restored
            .iter()
            .map(|(p, why)| json!({ "path": p.display().to_string(), "why": why }))
            .collect::<Vec<_>>(),
        "ignored_removed": plan.ignored_removed,
    })
}

pub(super) fn restore(g: &Session<'_>, p: RestoreParams) -> Result<Value, ServiceError> {
    let action = if p.dry_run {
        Action::Read
    } else {
        Action::Write
    };
    // Core asks again for a restore, not for a preview (which reads as the capture actor).
    let resource = Resource::Branch(g.branch().to_owned());
    if p.dry_run {
        g.allow(action, resource, Some("restore"))?;
    } else {
        g.allow_rechecked(action, resource, Some("restore"))?;
    }
    let target = resolve(g.shared(), &p.version)?;
    let text = p
        .intent
        .unwrap_or_else(|| format!("restore to {} (asked by the agent)", p.version));
    restore_to(g, target, p.dry_run, Intent::new(IntentKind::Restore, text))
}

pub(super) fn restore_to(
    g: &Session<'_>,
    target: OpId,
    dry_run: bool,
    intent: Intent,
) -> Result<Value, ServiceError> {
    let shared = g.shared();
    if dry_run {
        let plan = shared.plan_restore(&target).map_err(ServiceError::from)?;
        return Ok(json!({
            "dry_run": true,
            "from": plan.from.to_string(),
            "to": plan.to.to_string(),
            "steps": plan_json(&plan),
        }));
    }
    let plan = shared
        .restore(&shared.actor, &g.credentials(), &target, intent)
        .map_err(ServiceError::from)?;
    Counters::bump(&shared.counters.rollbacks);
    let head = g.env().head(g.branch()).map_err(ServiceError::from)?;
    Ok(json!({
        "dry_run": false,
        "version": head.to_string(),
        "from": plan.from.to_string(),
        "restored_to": plan.to.to_string(),
        "steps": plan_json(&plan),
    }))
}

/// Which way [`step`] goes.
#[derive(Clone, Copy)]
pub(super) enum Way {
    Undo,
    Redo,
}

/// Undoes the last operation not undone yet, or redoes the last undo not redone yet, in every
/// tracked tree: core says what to restore, the restore writes it.
pub(super) fn step(g: &Session<'_>, way: Way) -> Result<Value, ServiceError> {
    // A restore of the live tree, so it is authorized as one (core checks the same).
    g.allow_rechecked(
        Action::Write,
        Resource::Branch(g.branch().to_owned()),
        Some("restore"),
    )?;
    g.capture("capture before an undo or a redo")?;
    let env = &g.env();
    let step = match way {
        Way::Undo => env.undo_step(g.actor(), g.branch()),
        Way::Redo => env.redo_step(g.actor(), g.branch()),
    }
    .map_err(ServiceError::from)?;
    restore_to(g, step.target, false, step.intent)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MergeParams {
    source: String,
}

/// Merges a branch into the workspace's and writes the result into every tracked tree.
pub(super) fn merge(g: &Session<'_>, p: MergeParams) -> Result<Value, ServiceError> {
    // Core checks the same again when it records the merge.
    g.allow_rechecked(
        Action::Write,
        Resource::Branch(g.branch().to_owned()),
        Some("merge"),
    )?;
    let shared = g.shared();
    // Automatic captures wait while the head moves under the tree; what changed before is
    // captured first, so the tree and the head agree on where the merge starts.
    let _hold = shared
        .with_tracker(|t| t.hold())
        .map_err(ServiceError::from)?;
    g.capture("capture before a merge")?;
    let before = g.env().head(g.branch()).map_err(ServiceError::from)?;
    let intent = Intent::new(IntentKind::Merge, format!("merge {}", p.source));
    let outcome = g
        .env()
        .merge(&shared.actor, &p.source, g.branch(), intent)
        .map_err(ServiceError::from)?;
    let plan = shared.sync_from(&before).map_err(ServiceError::from)?;
    let mut conflicts = Vec::with_capacity(outcome.conflicts.len());
    for key in &outcome.conflicts {
        let c = shared
            .env
            .read_unchecked(key, &outcome.version)
            .map_err(ServiceError::from)?
            .and_then(|v| Conflict::from_value(&v));
        conflicts.push(json!({
            "path": key.display_path(),
            "ours": c.as_ref().map(|c| side_json(&c.ours)),
            "theirs": c.as_ref().map(|c| side_json(&c.theirs)),
        }));
    }
    Ok(json!({
        "source": p.source,
        "version": outcome.version.to_string(),
        "noop": outcome.noop,
        "conflicts": conflicts,
        "steps": plan_json(&plan),
    }))
}

/// One side of a merge conflict: who changed the path, why, in which operation, and whether
/// the change was a deletion.
fn side_json(side: &ConflictSide) -> Value {
    json!({
        "actor": side.actor.as_ref().map(|a| a.as_str().to_owned()),
        "intent": side.intent.as_ref().map(|i| i.text.clone()),
        "op": side.op.map(|o| o.to_string()),
        "deleted": side.value.is_none(),
    })
}

pub(super) fn status(g: &Session<'_>) -> Result<Value, ServiceError> {
    g.allow(
        Action::Read,
        Resource::Branch(g.branch().to_owned()),
        Some("status"),
    )?;
    let s = g.shared();
    let head = s.env.head(g.branch()).map_err(ServiceError::from)?;
    let op = s.env.op(&head).map_err(ServiceError::from)?;
    let captures = s
        .with_tracker(|t| Ok(t.captures()))
        .map_err(ServiceError::from)?;
    let names = |list: Vec<(String, OpId)>| list.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    Ok(json!({
        "actor": s.actor.as_str(),
        "branch": g.branch(),
        "head": head.to_string(),
        "seq": op.seq,
        "head_actor": op.actor.as_str(),
        "head_intent": op.intent.text,
        "branches": names(s.env.branches().map_err(ServiceError::from)?),
        "marks": names(s.env.marks().map_err(ServiceError::from)?),
        "unfinished_effects": s.env.effects_unfinished().map_err(ServiceError::from)?.len(),
        "policy_version": s.policy.as_ref().map(|p| p.version()),
        "workspace": s.launcher.as_ref().map(|l| l.workspace_inside().display().to_string()),
        "sandbox": s.launcher.as_ref().map(|l| l.describe()),
        "agent_pid": *lock(&s.agent_pid),
        "captures": captures,
        "rollbacks": s.counters.rollbacks.load(std::sync::atomic::Ordering::Relaxed),
        "policy": s.policy.is_some(),
        "queue": s.bus.is_some(),
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct VerifyParams {
    #[serde(default)]
    deep: bool,
}

/// Re-hashes every operation and tree node and checks every referenced blob is there (with
/// `deep`, re-hashes the blobs too): a read of the environment, which core decides.
pub(super) fn verify(g: &Session<'_>, p: VerifyParams) -> Result<Value, ServiceError> {
    let env = g.env();
    let r = if p.deep {
        env.verify_deep(g.actor())
    } else {
        env.verify(g.actor())
    }
    .map_err(ServiceError::from)?;
    Ok(json!({ "ok": true, "deep": p.deep, "ops": r.ops, "nodes": r.nodes, "blobs": r.blobs }))
}

pub(super) fn gc(g: &Session<'_>) -> Result<Value, ServiceError> {
    g.allow_rechecked(Action::Delete, Resource::Environment, Some("gc"))?;
    let r = g.env().gc(&g.shared().actor).map_err(ServiceError::from)?;
    Ok(json!({
        "kept": r.kept,
        "removed": r.removed,
        "bytes_removed": r.bytes_removed,
        "temp_removed": r.temp_removed,
        "nodes_removed": r.nodes_removed,
    }))
}
