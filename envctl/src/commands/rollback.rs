//! `envctl restore` and `undo`: bring the workspace back to an earlier version.

use environment_core::{Action, Intent, IntentKind, MAIN, OpId, Resource};
use environment_sandbox::{RestorePlan, RestoreStep};
use serde_json::json;

use super::resolve;
use crate::failure::{Failure, Outcome};
use crate::output::print_json;
use crate::progress::Progress;
use crate::workspace::Session;

fn plan_json(plan: &RestorePlan, dry_run: bool, version: Option<OpId>) -> serde_json::Value {
    let (mut write, mut remove) = (Vec::new(), Vec::new());
    for step in &plan.steps {
        match step {
            RestoreStep::Write(k) => write.push(k.display_path()),
            RestoreStep::Remove(k) => remove.push(k.display_path()),
        }
    }
    let not_restored: Vec<_> = plan
        .not_restored
        .iter()
        .map(|(p, why)| json!({ "path": p.display().to_string(), "why": why }))
        .collect();
    json!({
        "from": plan.from.to_string(),
        "to": plan.to.to_string(),
        "dry_run": dry_run,
        "write": write,
        "remove": remove,
        "not_restored": not_restored,
        "ignored_removed": plan.ignored_removed,
        "version": version.map(|v| v.to_string()),
    })
}

/// Every step with `verbose`; otherwise what a person reads: the counts of paths written and
/// removed under each top-level entry (a venv restored away is one line, not 1,500).
fn print_plan(plan: &RestorePlan, verbose: bool) {
    if verbose {
        for step in &plan.steps {
            match step {
                RestoreStep::Write(k) => println!("write  {}", k.display_path()),
                RestoreStep::Remove(k) => println!("remove {}", k.display_path()),
            }
        }
        return;
    }
    // (written, removed, holds deeper paths) by the first component of the path.
    let mut by_top: std::collections::BTreeMap<String, (usize, usize, bool)> = Default::default();
    for step in &plan.steps {
        let (k, removed) = match step {
            RestoreStep::Write(k) => (k, false),
            RestoreStep::Remove(k) => (k, true),
        };
        let path = k.display_path();
        let (top, deeper) = match path.split_once('/') {
            Some((top, _)) => (top.to_owned(), true),
            None => (path.to_string(), false),
        };
        let counts = by_top.entry(top).or_default();
        counts.2 |= deeper;
        if removed {
            counts.1 += 1;
        } else {
            counts.0 += 1;
        }
    }
    for (top, (written, removed, deeper)) in by_top {
        let mut parts = Vec::new();
        if written > 0 {
            parts.push(format!("{written} written"));
        }
        if removed > 0 {
            parts.push(format!("{removed} removed"));
        }
        let slash = if deeper { "/" } else { "" };
        println!("  {top}{slash}: {}", parts.join(", "));
    }
}

/// Restores the workspace (and main) to `target`: previewed, then done.
pub fn restore_to(
    s: &Session,
    target: OpId,
    intent: Intent,
    dry_run: bool,
    verbose: bool,
    json: bool,
) -> Outcome<()> {
    // The tree is written before core records the rollback, and the preview is computed by
    // the capture service: ask first, so that a denied restore changes and shows nothing.
    if dry_run {
        s.precheck(Action::Read, Resource::Branch(MAIN.into()), "restore")?;
    } else {
        s.precheck(Action::Write, Resource::Branch(MAIN.into()), "restore")?;
    }
    let tracker = s.tracker()?;
    let plan = if dry_run {
        tracker.plan_restore_with(&s.others(), &target)?
    } else {
        let progress = Progress::spinner("restoring the workspace");
        let plan = tracker.restore_with(&s.others(), &s.actor, &target, intent);
        progress.finish();
        plan?
    };
    let version = if dry_run { None } else { Some(s.head()?) };
    if json {
        print_json(&plan_json(&plan, dry_run, version));
        return partial(&plan);
    }
    print_plan(&plan, verbose);
    let ignored = match plan.ignored_removed {
        0 => String::new(),
        n => format!(", and {n} ignored path(s) under the directories that go"),
    };
    match version {
        None => println!(
            "Dry run: restoring {} would write {} path(s) and remove {}{ignored}; nothing was \
             changed.",
            target.short(),
            plan.steps
                .iter()
                .filter(|s| matches!(s, RestoreStep::Write(_)))
                .count(),
            plan.steps
                .iter()
                .filter(|s| matches!(s, RestoreStep::Remove(_)))
                .count(),
        ),
        Some(v) => println!(
            "Restored the workspace to {} ({} path(s) changed{ignored}); the rollback is {}.",
            target.short(),
            plan.steps.len(),
            v.short()
        ),
    }
    partial(&plan)
}

/// A restore that could not write everything says what and fails: the tree is not exactly the
/// version there.
fn partial(plan: &RestorePlan) -> Outcome<()> {
    let Some((first, why)) = plan.not_restored.first() else {
        return Ok(());
    };
    let mut f = Failure::other(format!(
        "{} path(s) could not be restored (first: {}: {why}); the rest of the tree is the \
         version",
        plan.not_restored.len(),
        first.display()
    ))
    .hint("`--json` lists them; a device node needs the privilege to make one");
    f.partial = true;
    Err(f)
}

/// `envctl restore VERSION [--dry-run]`.
pub fn restore(s: &Session, spec: &str, dry_run: bool, verbose: bool, json: bool) -> Outcome<()> {
    let target = resolve(s, spec)?;
    let intent = Intent::new(IntentKind::Restore, format!("restore to {spec}"));
    restore_to(s, target, intent, dry_run, verbose, json)
}

/// `envctl undo` and `envctl redo`: main steps back past its last operation not undone yet,
/// or forward again past its last undo not redone yet (see `LocalEnvironment::undo_step`).
pub fn step(s: &Session, way: Way, verbose: bool, json: bool) -> Outcome<()> {
    let step = match way {
        Way::Undo => s.env.undo_step(&s.actor, MAIN)?,
        Way::Redo => s.env.redo_step(&s.actor, MAIN)?,
    };
    restore_to(s, step.target, step.intent, false, verbose, json)
}

/// Which way [`step`] goes.
#[derive(Clone, Copy, Debug)]
pub enum Way {
    /// `envctl undo`.
    Undo,
    /// `envctl redo`.
    Redo,
}
