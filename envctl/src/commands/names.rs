//! `envctl mark`, `branch`, `merge`: naming versions and joining lines of work.

use environment_workspace::Method;
use serde_json::{Value, json};

use crate::door::Door;
use crate::failure::{ExitCode, Outcome};
use crate::output::print_json;

/// Prints a list of names with the versions they name.
fn listing(list: &Value, key: &str, at: &str, json: bool) {
    let pairs: Vec<Value> = list[key]
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| json!({ "name": x["name"], "version": x[at] }))
        .collect();
    if json {
        print_json(&json!({ key: pairs }));
        return;
    }
    for p in &pairs {
        let v: String = p["version"]
            .as_str()
            .unwrap_or_default()
            .chars()
            .take(12)
            .collect();
        println!("{} {v}", p["name"].as_str().unwrap_or_default());
    }
}

/// Names a version (default the workspace as it is now), or lists the marks.
pub fn mark(door: &Door, name: Option<&str>, version: Option<&str>, json: bool) -> Outcome<()> {
    let Some(name) = name else {
        listing(
            &door.call(Method::Marks, json!({}))?,
            "marks",
            "version",
            json,
        );
        return Ok(());
    };
    let r = door.call(Method::Mark, json!({ "name": name, "version": version }))?;
    if json {
        print_json(&r);
    } else {
        let v: String = r["version"]
            .as_str()
            .unwrap_or_default()
            .chars()
            .take(12)
            .collect();
        println!("Marked {v} as {name}.");
    }
    Ok(())
}

/// Creates a branch at a version (default the workspace as it is now), or lists them.
pub fn branch(door: &Door, name: Option<&str>, version: Option<&str>, json: bool) -> Outcome<()> {
    let Some(name) = name else {
        listing(
            &door.call(Method::BranchList, json!({}))?,
            "branches",
            "head",
            json,
        );
        return Ok(());
    };
    let r = door.call(
        Method::BranchCreate,
        json!({ "name": name, "from": version }),
    )?;
    if json {
        print_json(&r);
    } else {
        let v: String = r["from"]
            .as_str()
            .unwrap_or_default()
            .chars()
            .take(12)
            .collect();
        println!("Created branch {name} at {v}.");
    }
    Ok(())
}

/// Merges `branch` into main through `door` and renders what the workspace service did: the
/// files written into the tree, and each conflict with both sides. Exits 5 when the merge
/// recorded conflict objects.
pub fn merge(door: &Door, branch: &str, json: bool) -> Outcome<i32> {
    let answer = door.call(Method::Merge, json!({ "source": branch }))?;
    let conflicts = answer["conflicts"].as_array().cloned().unwrap_or_default();
    let (written, removed) = (&answer["steps"]["writes"], &answer["steps"]["removals"]);
    if json {
        print_json(&json!({
            "branch": branch,
            "version": answer["version"],
            "noop": answer["noop"],
            "conflicts": conflicts,
            "written": written,
            "removed": removed,
        }));
    } else if answer["noop"] == true {
        println!("Nothing to merge: main already contains {branch}.");
    } else {
        let short: String = answer["version"]
            .as_str()
            .unwrap_or_default()
            .chars()
            .take(12)
            .collect();
        println!(
            "Merged {branch} into main as {short} ({written} path(s) written, {removed} removed)."
        );
        for c in &conflicts {
            let who = |side: &serde_json::Value| {
                format!(
                    "{} ({})",
                    side["actor"].as_str().unwrap_or("?"),
                    side["intent"].as_str().unwrap_or("")
                )
            };
            println!(
                "conflict {}: main's change by {} against {branch}'s by {}; the workspace keeps \
                 main's",
                c["path"].as_str().unwrap_or_default(),
                who(&c["ours"]),
                who(&c["theirs"])
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
