//! `envctl restore`, `undo` and `redo`: bring the workspace back to an earlier version, through
//! the workspace service (in process, or the running supervisor's), rendered here.

use environment_workspace::versions::{Plan, RedoParams, RestoreParams, UndoParams};
use serde_json::json;

use super::history::short;
use crate::door::Door;
use crate::failure::{Failure, Outcome};
use crate::output::print_json;
use crate::progress::Progress;

/// Which use case a rollback command is.
#[derive(Clone, Debug)]
pub enum Rollback {
    /// `envctl restore VERSION [--dry-run]`.
    Restore {
        /// The version.
        version: String,
        /// Only the plan.
        dry_run: bool,
    },
    /// `envctl undo`.
    Undo,
    /// `envctl redo`.
    Redo,
}

/// Runs `what` through `door` and renders its answer: every path with `verbose`, else the
/// counts under each top-level entry (a venv restored away is one line, not 1,500).
pub fn run(door: &Door, what: &Rollback, verbose: bool, json: bool) -> Outcome<()> {
    let dry_run = matches!(what, Rollback::Restore { dry_run: true, .. });
    let progress = (!dry_run).then(|| Progress::spinner("restoring the workspace"));
    let answer = match what {
        Rollback::Restore { version, dry_run } => door.request(RestoreParams {
            version: version.clone(),
            dry_run: *dry_run,
            intent: Some(format!("restore to {version}")),
        }),
        Rollback::Undo => door.request(UndoParams {}),
        Rollback::Redo => door.request(RedoParams {}),
    };
    if let Some(p) = progress {
        p.finish();
    }
    let answer = answer?;
    let steps = &answer.steps;
    if json {
        print_json(&json!({
            "from": answer.from,
            "to": if dry_run { &answer.to } else { &answer.restored_to },
            "dry_run": dry_run,
            "write": steps.write,
            "remove": steps.remove,
            "writes": steps.writes,
            "removals": steps.removals,
            "not_restored": steps.not_restored,
            "ignored_removed": steps.ignored_removed,
            "version": answer.version,
        }));
        return partial(steps);
    }
    print_plan(steps, verbose);
    let ignored = match steps.ignored_removed {
        0 => String::new(),
        n => format!(", and {n} ignored path(s) under the directories that go"),
    };
    let version = |v: &Option<String>| short(v.as_deref().unwrap_or_default()).to_owned();
    if dry_run {
        println!(
            "Dry run: restoring {} would write {} path(s) and remove {}{ignored}; nothing was \
             changed.",
            version(&answer.to),
            steps.writes,
            steps.removals,
        );
    } else {
        let changed = steps.writes + steps.removals;
        println!(
            "Restored the workspace to {} ({changed} path(s) changed{ignored}); the rollback is {}.",
            version(&answer.restored_to),
            version(&answer.version)
        );
    }
    partial(steps)
}

fn print_plan(steps: &Plan, verbose: bool) {
    if verbose {
        for p in &steps.write {
            println!("write  {p}");
        }
        for p in &steps.remove {
            println!("remove {p}");
        }
        let shown = steps.write.len() + steps.remove.len();
        let total = steps.writes + steps.removals;
        if shown < total {
            println!("… and {} more path(s)", total - shown);
        }
        return;
    }
    for top in &steps.by_top {
        let mut parts = Vec::new();
        for (n, what) in [(top.written, "written"), (top.removed, "removed")] {
            if n > 0 {
                parts.push(format!("{n} {what}"));
            }
        }
        println!("  {}: {}", top.top, parts.join(", "));
    }
}

/// A restore that could not write everything says what and fails: the tree is not exactly the
/// version there.
fn partial(steps: &Plan) -> Outcome<()> {
    let missed = &steps.not_restored;
    let Some(first) = missed.first() else {
        return Ok(());
    };
    let mut f = Failure::other(format!(
        "{} path(s) could not be restored (first: {}: {}); the rest of the tree is the version",
        missed.len(),
        first.path,
        first.why,
    ))
    .hint("`--json` lists them; a device node needs the privilege to make one");
    f.partial = true;
    Err(f)
}
