//! `envctl restore`, `undo` and `redo`: bring the workspace back to an earlier version, through
//! the workspace service (in process, or the running supervisor's), rendered here.

use environment_workspace::Method;
use serde_json::{Value, json};

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
    let (method, params, dry_run) = match what {
        Rollback::Restore { version, dry_run } => (
            Method::Restore,
            json!({
                "version": version,
                "dry_run": dry_run,
                "intent": format!("restore to {version}"),
            }),
            *dry_run,
        ),
        Rollback::Undo => (Method::Undo, json!({}), false),
        Rollback::Redo => (Method::Redo, json!({}), false),
    };
    let progress = (!dry_run).then(|| Progress::spinner("restoring the workspace"));
    let answer = door.call(method, params);
    if let Some(p) = progress {
        p.finish();
    }
    let answer = answer?;
    let steps = &answer["steps"];
    if json {
        print_json(&json!({
            "from": answer["from"],
            "to": if dry_run { answer["to"].clone() } else { answer["restored_to"].clone() },
            "dry_run": dry_run,
            "write": steps["write"],
            "remove": steps["remove"],
            "writes": steps["writes"],
            "removals": steps["removals"],
            "not_restored": steps["not_restored"],
            "ignored_removed": steps["ignored_removed"],
            "version": answer["version"],
        }));
        return partial(steps);
    }
    print_plan(steps, verbose);
    let ignored = match steps["ignored_removed"].as_u64().unwrap_or(0) {
        0 => String::new(),
        n => format!(", and {n} ignored path(s) under the directories that go"),
    };
    let short = |v: &Value| {
        v.as_str()
            .unwrap_or_default()
            .chars()
            .take(12)
            .collect::<String>()
    };
    if dry_run {
        println!(
            "Dry run: restoring {} would write {} path(s) and remove {}{ignored}; nothing was \
             changed.",
            short(&answer["to"]),
            steps["writes"],
            steps["removals"],
        );
    } else {
        let changed =
            steps["writes"].as_u64().unwrap_or(0) + steps["removals"].as_u64().unwrap_or(0);
        println!(
            "Restored the workspace to {} ({changed} path(s) changed{ignored}); the rollback is {}.",
            short(&answer["restored_to"]),
            short(&answer["version"])
        );
    }
    partial(steps)
}

fn print_plan(steps: &Value, verbose: bool) {
    let listed = |key: &str| steps[key].as_array().cloned().unwrap_or_default();
    if verbose {
        for (key, verb) in [("write", "write "), ("remove", "remove")] {
            for p in listed(key) {
                println!("{verb} {}", p.as_str().unwrap_or_default());
            }
        }
        let shown = listed("write").len() + listed("remove").len();
        let total = steps["writes"].as_u64().unwrap_or(0) + steps["removals"].as_u64().unwrap_or(0);
        if (shown as u64) < total {
            println!("… and {} more path(s)", total - shown as u64);
        }
        return;
    }
    for top in listed("by_top") {
        let mut parts = Vec::new();
        for (key, what) in [("written", "written"), ("removed", "removed")] {
            match top[key].as_u64() {
                Some(0) | None => {}
                Some(n) => parts.push(format!("{n} {what}")),
            }
        }
        println!(
            "  {}: {}",
            top["top"].as_str().unwrap_or_default(),
            parts.join(", ")
        );
    }
}

/// A restore that could not write everything says what and fails: the tree is not exactly the
/// version there.
fn partial(steps: &Value) -> Outcome<()> {
    let missed = steps["not_restored"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let Some(first) = missed.first() else {
        return Ok(());
    };
    let mut f = Failure::other(format!(
        "{} path(s) could not be restored (first: {}: {}); the rest of the tree is the version",
        missed.len(),
        first["path"].as_str().unwrap_or_default(),
        first["why"].as_str().unwrap_or_default(),
    ))
    .hint("`--json` lists them; a device node needs the privilege to make one");
    f.partial = true;
    Err(f)
}
