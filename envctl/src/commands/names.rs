//! `envctl mark`, `branch`, `merge`: naming versions and joining lines of work.

use environment_core::{Action, Conflict, Intent, IntentKind, MAIN, Resource};
use environment_sandbox::RestoreStep;
use serde_json::json;

use super::resolve;
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

/// Merges `branch` into main and writes the result into the workspace. Exits 5 when the merge
/// recorded conflict objects.
pub fn merge(s: &Session, branch: &str, json: bool) -> Outcome<i32> {
    s.precheck(Action::Write, Resource::Branch(MAIN.into()), "merge")?;
    let before = s.head()?;
    let outcome = s.env.merge(
        &s.actor,
        branch,
        MAIN,
        Intent::new(IntentKind::Merge, format!("merge {branch} into {MAIN}")),
    )?;
    let mut plan = s.tracker()?.sync_from(&before)?;
    for t in s.others() {
        plan.steps.extend(t.sync_from(&before)?.steps);
    }
    let mut conflicts = Vec::new();
    for key in &outcome.conflicts {
        let c = s
            .env
            .read_unchecked(key, &outcome.version)?
            .and_then(|v| Conflict::from_value(&v));
        let side = |side: Option<&environment_core::ConflictSide>| {
            side.map(|x| {
                json!({
                    "actor": x.actor.as_ref().map(|a| a.as_str().to_owned()),
                    "intent": x.intent.as_ref().map(|i| i.text.clone()),
                    "op": x.op.map(|o| o.to_string()),
                    "deleted": x.value.is_none(),
                })
            })
        };
        conflicts.push(json!({
            "path": key.display_path(),
            "ours": side(c.as_ref().map(|c| &c.ours)),
            "theirs": side(c.as_ref().map(|c| &c.theirs)),
        }));
    }
    let written = plan
        .steps
        .iter()
        .filter(|p| matches!(p, RestoreStep::Write(_)))
        .count();
    let removed = plan.steps.len() - written;
    if json {
        print_json(&json!({
            "branch": branch,
            "version": outcome.version.to_string(),
            "noop": outcome.noop,
            "conflicts": conflicts,
            "written": written,
            "removed": removed,
        }));
    } else if outcome.noop {
        println!("Nothing to merge: main already contains {branch}.");
    } else {
        println!(
            "Merged {branch} into main as {} ({written} path(s) written, {removed} removed).",
            outcome.version.short()
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
