//! `envctl mark`, `branch`, `merge`: naming versions and joining lines of work.

use environment_workspace::versions::{
    BranchListParams, BranchParams, MarkParams, MarksParams, MergeParams, MergeSide,
};
use serde_json::{Value, json};

use super::history::short;
use crate::door::Door;
use crate::failure::{ExitCode, Outcome};
use crate::output::print_json;

/// Prints a list of names with the versions they name, as `key` in JSON.
fn listing<'a>(key: &str, pairs: impl Iterator<Item = (&'a str, &'a str)>, json: bool) {
    if json {
        let pairs: Vec<Value> = pairs
            .map(|(name, version)| json!({ "name": name, "version": version }))
            .collect();
        print_json(&json!({ key: pairs }));
        return;
    }
    for (name, version) in pairs {
        println!("{name} {}", short(version));
    }
}

/// Names a version (default the workspace as it is now), or lists the marks.
pub fn mark(door: &Door, name: Option<&str>, version: Option<&str>, json: bool) -> Outcome<()> {
    let Some(name) = name else {
        let marks = door.every(
            |after| MarksParams { after, limit: None },
            |page| (page.marks, page.next),
        )?;
        let pairs = marks.iter().map(|m| (&*m.name, &*m.version));
        listing("marks", pairs, json);
        return Ok(());
    };
    let marked = door.request(MarkParams {
        name: name.to_owned(),
        version: version.map(str::to_owned),
    })?;
    if json {
        print_json(&json!(marked));
    } else {
        println!("Marked {} as {name}.", short(&marked.version));
    }
    Ok(())
}

/// Creates a branch at a version (default the workspace as it is now), or lists them.
pub fn branch(door: &Door, name: Option<&str>, version: Option<&str>, json: bool) -> Outcome<()> {
    let Some(name) = name else {
        let branches = door.every(
            |after| BranchListParams { after, limit: None },
            |page| (page.branches, page.next),
        )?;
        let pairs = branches.iter().map(|b| (&*b.name, &*b.head));
        listing("branches", pairs, json);
        return Ok(());
    };
    let created = door.request(BranchParams {
        name: name.to_owned(),
        from: version.map(str::to_owned),
    })?;
    if json {
        print_json(&json!(created));
    } else {
        println!("Created branch {name} at {}.", short(&created.from));
    }
    Ok(())
}

/// Merges `branch` into main through `door` and renders what the workspace service did: the
/// files written into the tree, and each conflict with both sides. Exits 5 when the merge
/// recorded conflict objects.
pub fn merge(door: &Door, branch: &str, json: bool) -> Outcome<i32> {
    let merged = door.request(MergeParams {
        source: branch.to_owned(),
    })?;
    let conflicts = &merged.conflicts;
    let (written, removed) = (merged.steps.writes, merged.steps.removals);
    if json {
        print_json(&json!({
            "branch": branch,
            "version": merged.version,
            "noop": merged.noop,
            "conflicts": conflicts,
            "written": written,
            "removed": removed,
        }));
    } else if merged.noop {
        println!("Nothing to merge: main already contains {branch}.");
    } else {
        println!(
            "Merged {branch} into main as {} ({written} path(s) written, {removed} removed).",
            short(&merged.version)
        );
        for c in conflicts {
            let who = |side: &Option<MergeSide>| {
                let side = side.as_ref();
                format!(
                    "{} ({})",
                    side.and_then(|s| s.actor.as_deref()).unwrap_or("?"),
                    side.and_then(|s| s.intent.as_deref()).unwrap_or("")
                )
            };
            println!(
                "conflict {}: main's change by {} against {branch}'s by {}; the workspace keeps \
                 main's",
                c.path,
                who(&c.ours),
                who(&c.theirs)
            );
        }
    }
    if conflicts.is_empty() {
        Ok(0)
    } else {
        eprintln!(
            "envctl: the merge is recorded with {} conflict object(s).\nhint: edit each \
             conflicting path into its resolved form; the next command captures it, which \
             resolves the conflict",
            conflicts.len()
        );
        Ok(ExitCode::Conflict.status())
    }
}
