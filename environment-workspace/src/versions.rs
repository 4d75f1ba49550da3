//! The methods on versions: history, show, diff, mark, restore (self-rollback), undo, status,
//! and the upkeep an agent normally may not call (gc).

use environment_core::{
    Action, Conflict, ConflictSide, EnvError, HistoryEntry, HistoryOptions, Intent, IntentKind,
    Key, KeyPrefix, Namespace, OpId, Resource, json, queue::Purged,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::error::ServiceError;
use super::session::{Session, resolve};
use super::workspace::{Counters, lock};
use std::collections::BTreeMap;

use environment_sandbox::restore::{RestorePlan, RestoreStep};

/// A use case that takes no parameters (but the credentials every request may present).
macro_rules! no_params {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub struct $name {}
    )*};
}
pub(crate) use no_params;

/// The branch's history, newest first: key nodes, with runs of automatic captures squashed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HistoryParams {
    /// The branch (default: the workspace's).
    #[serde(default)]
    pub branch: Option<String>,
    /// Every operation, nothing squashed (default false).
    #[serde(default)]
    pub all: bool,
    /// At most this many entries, newest first (1 to 1000, default 50).
    #[serde(default)]
    #[schemars(range(min = 1, max = 1000))]
    pub limit: Option<usize>,
    /// The page that starts at this version (the `next` of the previous page; default: the
    /// head).
    #[serde(default)]
    pub from: Option<String>,
}

/// A branch's history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct History {
    /// The branch.
    pub branch: String,
    /// Its head.
    pub head: String,
    /// Newest first.
    pub entries: Vec<json::HistoryLine>,
    /// Where the next page starts (`from`), when more follow.
    #[serde(default)]
    pub next: Option<String>,
}

const MAX_HISTORY: usize = 1000;

/// The changes refused on a branch, newest first: what an actor changed that its rules did not
/// allow, put back in the tree.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RefusedParams {
    /// The branch (default: the workspace's).
    #[serde(default)]
    pub branch: Option<String>,
    /// At most this many, newest first (1 to 1000, default 50).
    #[serde(default)]
    #[schemars(range(min = 1, max = 1000))]
    pub limit: Option<usize>,
    /// The page after this refused change (the `next` of the previous page).
    #[serde(default)]
    pub after: Option<u64>,
}

/// The changes refused on a branch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RefusedList {
    /// The branch.
    pub branch: String,
    /// Newest first.
    pub refused: Vec<json::Refused>,
    /// Where the next page starts (`after`), when more may follow.
    #[serde(default)]
    pub next: Option<u64>,
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
pub(super) fn refused(g: &Session<'_>, p: RefusedParams) -> Result<RefusedList, ServiceError> {
    let branch = p.branch.unwrap_or_else(|| g.branch().to_owned());
    let limit = history_read(g, &branch, p.limit)?;
    // One more than asked says whether another page follows.
    let mut refused = g
        .env()
        .refused_before(g.actor(), &branch, p.after, limit + 1)
        .map_err(ServiceError::from)?;
    let more = super::page::more_than(&mut refused, limit);
    Ok(RefusedList {
        branch,
        next: more.then(|| refused.last().map(|r| r.id)).flatten(),
        refused: refused.iter().map(json::Refused::from).collect(),
    })
}

pub(super) fn history(g: &Session<'_>, p: HistoryParams) -> Result<History, ServiceError> {
    let branch = p.branch.unwrap_or_else(|| g.branch().to_owned());
    let limit = history_read(g, &branch, p.limit)?;
    let options = HistoryOptions { all: p.all, limit };
    let env = g.env();
    let entries = match &p.from {
        None => env.history(g.actor(), &branch, &options),
        Some(from) => env.history_from(g.actor(), &branch, &resolve(g.shared(), from)?, &options),
    }
    .map_err(ServiceError::from)?;
    // A full page goes on where its oldest operation's first parent is.
    let oldest = match entries.last() {
        Some(HistoryEntry::Op { op, .. }) if entries.len() >= limit => Some(op.id),
        Some(HistoryEntry::Captures { oldest, .. }) if entries.len() >= limit => Some(*oldest),
        _ => None,
    };
    let next = match oldest {
        Some(id) => env
            .op(&id)
            .map_err(ServiceError::from)?
            .parents
            .first()
            .map(ToString::to_string),
        None => None,
    };
    let head = env.head(&branch).map_err(ServiceError::from)?;
    Ok(History {
        branch,
        head: head.to_string(),
        entries: entries.iter().map(json::HistoryLine::from).collect(),
        next,
    })
}

/// One operation's record, its marks, and what it changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShowParams {
    /// A version: an op id or a unique prefix of 4+ hex digits, a mark, a branch, HEAD, any of
    /// these followed by ~N (N operations back).
    pub version: String,
}

/// An operation, its marks and its changes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Shown {
    /// The operation.
    #[serde(flatten)]
    pub op: json::Op,
    /// The marks that name it.
    pub marks: Vec<String>,
    /// What it changed (absent when it cannot be told, as for the first operation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changes: Option<Vec<json::Change>>,
}

pub(super) fn show(g: &Session<'_>, p: ShowParams) -> Result<Shown, ServiceError> {
    let id = resolve(g.shared(), &p.version)?;
    let op = g.env().op(&id).map_err(ServiceError::from)?;
    // Core asks the same when it shows the operation (the changes are a diff, asked there).
    g.allow_rechecked(
        Action::Read,
        Resource::Branch(op.branch.clone()),
        Some("show"),
    )?;
    let shown = g.env().show(g.actor(), &id).map_err(ServiceError::from)?;
    Ok(Shown {
        op: json::Op::from(&*shown.op),
        marks: shown.marks,
        changes: shown
            .changes
            .map(|c| c.iter().map(json::Change::from).collect()),
    })
}

/// What changed between two versions, counted by kind.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiffParams {
    /// The older version (an op id prefix, a mark, a branch, HEAD~N).
    pub from: String,
    /// The newer version (default: the branch's head).
    #[serde(default)]
    pub to: Option<String>,
    /// Only paths under this directory.
    #[serde(default)]
    pub prefix: Option<String>,
    /// At most this many changes listed (default 200, at most 1000); the counts are of all.
    #[serde(default)]
    pub limit: Option<usize>,
    /// The page after this change (the `next` of the previous page: `namespace:path`).
    #[serde(default)]
    pub after: Option<String>,
}

/// What changed between two versions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Diff {
    /// The older version's id.
    pub from: String,
    /// The newer version's id.
    pub to: String,
    /// Every change.
    pub total: usize,
    /// Keys added.
    pub added: usize,
    /// Keys modified.
    pub modified: usize,
    /// Keys removed.
    pub removed: usize,
    /// More changes follow the ones listed.
    pub truncated: bool,
    /// The changes of this page, by path.
    pub changes: Vec<json::Change>,
    /// Where the next page starts (`after`), when more follow.
    #[serde(default)]
    pub next: Option<String>,
}

const MAX_LISTED: usize = 1000;

pub(super) fn diff(g: &Session<'_>, p: DiffParams) -> Result<Diff, ServiceError> {
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
        .diff(g.actor(), &from, &to, prefix.as_ref())
        .map_err(ServiceError::from)?;
    let count = |what: &str| changes.iter().filter(|c| c.change() == what).count();
    let (total, added, modified, removed) = (
        changes.len(),
        count("added"),
        count("modified"),
        count("removed"),
    );
    let listed: Vec<json::Change> = changes.iter().map(json::Change::from).collect();
    let (changes, next) = super::page::page(listed, key_of, p.after.as_ref(), limit)?;
    Ok(Diff {
        from: from.to_string(),
        to: to.to_string(),
        total,
        added,
        modified,
        removed,
        truncated: next.is_some(),
        changes,
        next,
    })
}

/// A listed change's cursor: its namespace and path (`fs:src/a.rs`), so a file whose name
/// looks like another namespace's key is not mistaken for it.
fn key_of(c: &json::Change) -> String {
    format!("{}:{}", c.namespace, c.path)
}

pub(super) fn key_text(k: &Key) -> String {
    match k.namespace() {
        Namespace::Fs => k.display_path(),
        ns => format!("{}:{}", ns.as_str(), k.display_path()),
    }
}

/// Names a version (default: the workspace as it is now).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MarkParams {
    /// The mark's name (letters, digits and -_./).
    pub name: String,
    /// The version to name (default: the workspace as it is now).
    #[serde(default)]
    pub version: Option<String>,
}

/// A mark and the version it names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Marked {
    /// The mark.
    pub name: String,
    /// The version's id.
    pub version: String,
}

pub(super) fn mark(g: &Session<'_>, p: MarkParams) -> Result<Marked, ServiceError> {
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
        .mark(g.actor(), &p.name, &version)
        .map_err(ServiceError::from)?;
    Ok(Marked {
        name: p.name,
        version: version.to_string(),
    })
}

/// Lists the marks, by name, a page at a time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MarksParams {
    /// The page after this mark (the `next` of the previous page).
    #[serde(default)]
    pub after: Option<String>,
    /// At most this many (default and most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// Lists the branches and their heads, by name, a page at a time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchListParams {
    /// The page after this branch (the `next` of the previous page).
    #[serde(default)]
    pub after: Option<String>,
    /// At most this many (default and most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

no_params! {
    /// Undoes the last operation not undone yet, in every tracked tree (sequential: a second
    /// undo steps further back, skipping undos).
    UndoParams;
    /// Redoes the last undo not redone yet.
    RedoParams;
    /// The workspace's state: the branch, its head, the sandbox, the agent, the stores.
    StatusParams;
    /// Deletes unreferenced blobs and tree nodes (normally refused to agents).
    GcParams;
}

/// Every mark.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Marks {
    /// By name.
    pub marks: Vec<Marked>,
    /// Where the next page starts (`after`), when more follow.
    #[serde(default)]
    pub next: Option<String>,
}

/// The marks with their versions, by name.
pub(super) fn marks(g: &Session<'_>, p: MarksParams) -> Result<Marks, ServiceError> {
    g.allow(Action::Read, Resource::Environment, Some("marks"))?;
    let all: Vec<Marked> = g
        .env()
        .marks()
        .map_err(ServiceError::from)?
        .into_iter()
        .map(|(name, v)| Marked {
            name,
            version: v.to_string(),
        })
        .collect();
    let limit = p.limit.unwrap_or(1000).min(1000);
    let (marks, next) = super::page::page_sorted(all, |m| m.name.clone(), p.after.as_ref(), limit);
    Ok(Marks { marks, next })
}

/// A branch and its head.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchHead {
    /// The branch.
    pub name: String,
    /// Its head's id.
    pub head: String,
}

/// Every branch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Branches {
    /// By name.
    pub branches: Vec<BranchHead>,
    /// Where the next page starts (`after`), when more follow.
    #[serde(default)]
    pub next: Option<String>,
}

/// The branches with their heads, by name.
pub(super) fn branches(g: &Session<'_>, p: BranchListParams) -> Result<Branches, ServiceError> {
    g.allow(Action::Read, Resource::Environment, Some("branch.list"))?;
    let all: Vec<BranchHead> = g
        .env()
        .branches()
        .map_err(ServiceError::from)?
        .into_iter()
        .map(|(name, head)| BranchHead {
            name,
            head: head.to_string(),
        })
        .collect();
    let limit = p.limit.unwrap_or(1000).min(1000);
    let (branches, next) =
        super::page::page_sorted(all, |b| b.name.clone(), p.after.as_ref(), limit);
    Ok(Branches { branches, next })
}

/// Creates a branch at a version: a line of work to try something on and merge back, the tree
/// staying on the workspace's branch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchParams {
    /// The new branch's name (letters, digits and -_./).
    pub name: String,
    /// The version it starts at (default: the workspace as it is now).
    #[serde(default)]
    pub from: Option<String>,
}

/// A branch created.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BranchCreated {
    /// The branch.
    pub name: String,
    /// The version it starts at.
    pub from: String,
    /// The operation that created it.
    pub version: String,
}

/// Creates a branch at a version (default the head, after a capture of what changed): a line
/// of work to try something on and merge back, the tree staying on the workspace's branch.
pub(super) fn branch_create(
    g: &Session<'_>,
    p: BranchParams,
) -> Result<BranchCreated, ServiceError> {
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
    Ok(BranchCreated {
        name: p.name,
        from: from.to_string(),
        version: version.to_string(),
    })
}

/// Restores the workspace to a version, in every tracked tree (self-rollback, recorded as a
/// new operation); `dry_run` previews.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreParams {
    /// The version to bring the workspace back to (op id prefix, mark, branch, HEAD~N).
    pub version: String,
    /// Only preview what would change (default false).
    #[serde(default)]
    pub dry_run: bool,
    /// Why, for the history.
    #[serde(default)]
    pub intent: Option<String>,
}

/// What a restore did or would do, or what a merge wrote into the tree.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Paths written.
    pub writes: usize,
    /// Paths removed.
    pub removals: usize,
    /// The first paths written.
    pub write: Vec<String>,
    /// The first paths removed.
    pub remove: Vec<String>,
    /// The counts under each top-level entry (a directory ends in `/`).
    pub by_top: Vec<TopCount>,
    /// What could not be restored, and why: the tree differs from the version there.
    pub not_restored: Vec<NotRestored>,
    /// Ignored paths removed with the directories that held them.
    pub ignored_removed: u64,
}

/// The paths written and removed under one top-level entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TopCount {
    /// The entry (a directory ends in `/`).
    pub top: String,
    /// Paths written under it.
    pub written: u64,
    /// Paths removed under it.
    pub removed: u64,
}

/// A path a restore could not bring back.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NotRestored {
    /// The path on disk.
    pub path: String,
    /// Why.
    pub why: String,
}

/// What a restore, an undo or a redo did (or, as a preview, would do).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Restored {
    /// Only a preview: nothing changed.
    pub dry_run: bool,
    /// The operation that recorded the restore (absent in a preview).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The version the tree was at.
    pub from: String,
    /// The version a preview would restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// The version restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_to: Option<String>,
    /// What was (or would be) written and removed.
    pub steps: Plan,
}

/// What a restore (or a merge written into the tree) did or would do: the counts, the first
/// paths written and removed, the counts under each top-level entry (a directory of thousands
/// of files is one line), what could not be restored and why (the tree then differs from the
/// version there), and how many ignored paths went with the directories removed.
pub(super) fn plan_of(plan: &RestorePlan) -> Plan {
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
    Plan {
        writes: write.len(),
        removals: remove.len(),
        write: write.into_iter().take(MAX_LISTED).collect(),
        remove: remove.into_iter().take(MAX_LISTED).collect(),
        by_top: by_top
            .into_iter()
            .map(|(top, (written, removed, deeper))| TopCount {
                top: if deeper { format!("{top}/") } else { top },
                written,
                removed,
            })
            .collect(),
        not_restored: plan
            .not_restored
            .iter()
            .map(|(p, why)| NotRestored {
                path: p.display().to_string(),
                why: why.clone(),
            })
            .collect(),
        ignored_removed: plan.ignored_removed,
    }
}

pub(super) fn restore(g: &Session<'_>, p: RestoreParams) -> Result<Restored, ServiceError> {
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
) -> Result<Restored, ServiceError> {
    let shared = g.shared();
    if dry_run {
        let plan = shared.plan_restore(&target).map_err(ServiceError::from)?;
        return Ok(Restored {
            dry_run: true,
            version: None,
            from: plan.from.to_string(),
            to: Some(plan.to.to_string()),
            restored_to: None,
            steps: plan_of(&plan),
        });
    }
    let plan = shared
        .restore(g.actor(), &g.credentials(), &target, intent)
        .map_err(ServiceError::from)?;
    Counters::bump(&shared.counters.rollbacks);
    let head = g.env().head(g.branch()).map_err(ServiceError::from)?;
    Ok(Restored {
        dry_run: false,
        version: Some(head.to_string()),
        from: plan.from.to_string(),
        to: None,
        restored_to: Some(plan.to.to_string()),
        steps: plan_of(&plan),
    })
}

pub(super) fn undo(g: &Session<'_>, _: UndoParams) -> Result<Restored, ServiceError> {
    step(g, Way::Undo)
}

pub(super) fn redo(g: &Session<'_>, _: RedoParams) -> Result<Restored, ServiceError> {
    step(g, Way::Redo)
}

/// Which way [`step`] goes.
#[derive(Clone, Copy)]
enum Way {
    Undo,
    Redo,
}

/// Undoes the last operation not undone yet, or redoes the last undo not redone yet, in every
/// tracked tree: core says what to restore, the restore writes it.
fn step(g: &Session<'_>, way: Way) -> Result<Restored, ServiceError> {
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

/// Merges a branch into the workspace's branch and writes the result into every tracked tree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeParams {
    /// The branch to merge into the workspace's branch.
    pub source: String,
}

/// What a merge did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Merged {
    /// The branch merged.
    pub source: String,
    /// The workspace branch's head after it.
    pub version: String,
    /// Nothing to merge.
    pub noop: bool,
    /// The paths both sides changed, with both sides.
    pub conflicts: Vec<MergeConflict>,
    /// What was written into the tree.
    pub steps: Plan,
}

/// A path both sides of a merge changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeConflict {
    /// The path.
    pub path: String,
    /// The workspace branch's side.
    pub ours: Option<MergeSide>,
    /// The merged branch's side.
    pub theirs: Option<MergeSide>,
}

/// One side of a merge conflict: who changed the path, why, in which operation, and whether
/// the change was a deletion.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MergeSide {
    /// Who changed it.
    pub actor: Option<String>,
    /// Why.
    pub intent: Option<String>,
    /// In which operation.
    pub op: Option<String>,
    /// The change was a deletion.
    pub deleted: bool,
}

/// Merges a branch into the workspace's and writes the result into every tracked tree.
pub(super) fn merge(g: &Session<'_>, p: MergeParams) -> Result<Merged, ServiceError> {
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
    let intent = Intent::new(IntentKind::Merge, format!("merge {}", p.source));
    let outcome = g
        .env()
        .merge(g.actor(), &p.source, g.branch(), intent)
        .map_err(ServiceError::from)?;
    let plan = shared.sync().map_err(ServiceError::from)?;
    let mut conflicts = Vec::with_capacity(outcome.conflicts.len());
    for key in &outcome.conflicts {
        let c = shared
            .env
            .read_unchecked(key, &outcome.version)
            .map_err(ServiceError::from)?
            .and_then(|v| Conflict::from_value(&v));
        conflicts.push(MergeConflict {
            path: key.display_path(),
            ours: c.as_ref().map(|c| MergeSide::from(&c.ours)),
            theirs: c.as_ref().map(|c| MergeSide::from(&c.theirs)),
        });
    }
    Ok(Merged {
        source: p.source,
        version: outcome.version.to_string(),
        noop: outcome.noop,
        conflicts,
        steps: plan_of(&plan),
    })
}

impl From<&ConflictSide> for MergeSide {
    fn from(side: &ConflictSide) -> MergeSide {
        MergeSide {
            actor: side.actor.as_ref().map(|a| a.as_str().to_owned()),
            intent: side.intent.as_ref().map(|i| i.text.clone()),
            op: side.op.map(|o| o.to_string()),
            deleted: side.value.is_none(),
        }
    }
}

/// The workspace's state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Status {
    /// Whom the caller acts as.
    pub actor: String,
    /// The workspace's own actor (a supervised agent's), whom its own requests act as.
    pub agent: String,
    /// The workspace's branch.
    pub branch: String,
    /// Its head.
    pub head: String,
    /// The head's position in the log.
    pub seq: u64,
    /// Who recorded the head.
    pub head_actor: String,
    /// Why.
    pub head_intent: String,
    /// Every branch, by name.
    pub branches: Vec<String>,
    /// Every mark, by name.
    pub marks: Vec<String>,
    /// Effects begun and not settled.
    pub unfinished_effects: usize,
    /// The loaded policy's version.
    pub policy_version: Option<u64>,
    /// The workspace's path as the agent sees it.
    pub workspace: Option<String>,
    /// How commands are confined.
    pub sandbox: Option<String>,
    /// The supervised agent's pid.
    pub agent_pid: Option<u32>,
    /// Automatic captures so far.
    pub captures: u64,
    /// Restores so far.
    pub rollbacks: u64,
    /// A policy is loaded.
    pub policy: bool,
    /// A queue is configured.
    pub queue: bool,
    /// Why the queue's background purge last failed, until one succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_upkeep_failure: Option<String>,
}

pub(super) fn status(g: &Session<'_>, _: StatusParams) -> Result<Status, ServiceError> {
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
    Ok(Status {
        actor: g.actor().as_str().to_owned(),
        agent: s.actor.as_str().to_owned(),
        branch: g.branch().to_owned(),
        head: head.to_string(),
        seq: op.seq,
        head_actor: op.actor.as_str().to_owned(),
        head_intent: op.intent.text.clone(),
        branches: names(s.env.branches().map_err(ServiceError::from)?),
        marks: names(s.env.marks().map_err(ServiceError::from)?),
        unfinished_effects: s
            .env
            .effects_unfinished()
            .map_err(ServiceError::from)?
            .len(),
        policy_version: s.policy.as_ref().map(|p| p.version()),
        workspace: s
            .launcher
            .as_ref()
            .map(|l| l.workspace_inside().display().to_string()),
        sandbox: s.launcher.as_ref().map(|l| l.describe()),
        agent_pid: *lock(&s.agent_pid),
        captures,
        rollbacks: s
            .counters
            .rollbacks
            .load(std::sync::atomic::Ordering::Relaxed),
        policy: s.policy.is_some(),
        queue: s.bus.is_some(),
        queue_upkeep_failure: s
            .bus
            .as_ref()
            .and_then(|q| q.upkeep_failure())
            .map(|e| e.to_string()),
    })
}

/// Checks the stores' integrity: every operation and tree node re-hashed, every referenced
/// blob present (with `deep`, re-hashed too).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerifyParams {
    /// Re-hash every stored file too (slower; default false).
    #[serde(default)]
    pub deep: bool,
}

/// What an integrity check covered (it found nothing wrong: damage is an error).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Verified {
    /// Always true: damage is a `corrupt` error, not an answer.
    pub ok: bool,
    /// The blobs were re-hashed too.
    pub deep: bool,
    /// Operations checked.
    pub ops: u64,
    /// Tree nodes checked.
    pub nodes: u64,
    /// Blobs checked.
    pub blobs: u64,
}

/// What a garbage collection removed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Collected {
    /// Blobs still referenced.
    pub kept: u64,
    /// Blobs deleted.
    pub removed: u64,
    /// Bytes of content removed.
    pub bytes_removed: u64,
    /// Temporary files of dead writers removed.
    pub temp_removed: u64,
    /// Tree nodes only dropped versions used, removed.
    pub nodes_removed: u64,
    /// What the queue's retention let go (when there is a queue): acked messages, their
    /// deliveries and expired dedup ids.
    pub queue: Option<Purged>,
}

/// Re-hashes every operation and tree node and checks every referenced blob is there (with
/// `deep`, re-hashes the blobs too): a read of the environment, which core decides.
pub(super) fn verify(g: &Session<'_>, p: VerifyParams) -> Result<Verified, ServiceError> {
    let env = g.env();
    let r = if p.deep {
        env.verify_deep(g.actor())
    } else {
        env.verify(g.actor())
    }
    .map_err(ServiceError::from)?;
    Ok(Verified {
        ok: true,
        deep: p.deep,
        ops: r.ops,
        nodes: r.nodes,
        blobs: r.blobs,
    })
}

pub(super) fn gc(g: &Session<'_>, _: GcParams) -> Result<Collected, ServiceError> {
    g.allow_rechecked(Action::Delete, Resource::Environment, Some("gc"))?;
    // The queue first: a purge that fails then leaves the report of nothing removed true.
    let queue = match g.shared().bus.as_deref() {
        Some(q) => Some(q.purge()?),
        None => None,
    };
    let r = g.env().gc(g.actor()).map_err(ServiceError::from)?;
    Ok(Collected {
        kept: r.kept,
        removed: r.removed,
        bytes_removed: r.bytes_removed,
        temp_removed: r.temp_removed,
        nodes_removed: r.nodes_removed,
        queue,
    })
}
