//! `envctl mark`, `branch`, `merge`: naming versions and joining lines of work.

use environment_workspace::Method;
use serde_json::json;

use super::resolve;
use crate::door::Door;
use crate::failure::{ExitCode, Outcome};
use crate::output::print_json;
use crate::workspace::Session;

fn listing(pairs: &[(String, environment_core::OpId)], what: &str, json: bool) {
    if json {
        let list: Vec<_> = pairs
            .iter()
            .map(|(n, v)| json!({"name": n, "version": v.to_string()}))
            .collect();
        print_json(&json!({ what: list }));
    } else {
        for (n, v) in pairs {
            println!("{n} {}", v.short());
        }
    }
}

/// Names a version, or lists the marks.
pub fn mark(s: &Session, name: Option<&str>, version: Option<&str>, json: bool) -> Outcome<()> {
    let Some(name) = name else {
        listing(&s.env.marks()?, "marks", json);
        return Ok(());
    };
    let v = resolve(s, version.unwrap_or("HEAD"))?;
    s.env.mark(&s.actor, name, &v)?;
    if json {
        print_json(&json!({"mark": name, "version": v.to_string()}));
    } else {
        println!("Marked {} as {name}.", v.short());
    }
    Ok(())
}

/// Creates a branch, or lists them.
pub fn branch(s: &Session, name: Option<&str>, version: Option<&str>, json: bool) -> Outcome<()> {
    let Some(name) = name else {
        listing(&s.env.branches()?, "branches", json);
        return Ok(());
    };
    let v = resolve(s, version.unwrap_or("HEAD"))?;
    let head = s.env.create_branch(&s.actor, name, &v)?;
    if json {
        print_json(&json!({"branch": name, "from": v.to_string(), "head": head.to_string()}));
    } else {
        println!("Created branch {name} at {}.", v.short());
    }
    Ok(())
}

/// Merges `branch` into main through `door` and renders what the workspace service did: the
/// files written into the tree, and each conflict with both sides. Exits 5 when the merge
/// recorded conflict objects.
pub fn merge(door: &mut Door, branch: &str, json: bool) -> Outcome<i32> {
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
