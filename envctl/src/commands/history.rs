//! `envctl log`, `show`, `diff`: reading the history.

use environment_core::{HistoryOptions, OpFlags, ShownOp};
use serde_json::json;

use super::resolve;
use crate::failure::Outcome;
use crate::output::{change_json, change_letter, counts, print_json};
use crate::workspace::Session;

/// The history of a branch.
pub fn log(s: &Session, all: bool, branch: &str, limit: usize, json: bool) -> Outcome<()> {
    let entries = s
        .env
        .history(&s.actor, branch, &HistoryOptions { all, limit })?;
    if json {
        print_json(&json!({
            "branch": branch,
            "all": all,
            "entries": entries.iter().map(environment_core::HistoryEntry::to_json).collect::<Vec<_>>(),
        }));
    } else {
        for e in &entries {
            println!("{e}");
        }
    }
    Ok(())
}

/// The refused changes of a branch, newest first.
pub fn refused(s: &Session, branch: &str, limit: usize, json: bool) -> Outcome<()> {
    let refused = s.env.refused(&s.actor, branch, limit)?;
    if json {
        print_json(&json!({
            "branch": branch,
            "refused": refused.iter().map(environment_core::RefusedChange::to_json).collect::<Vec<_>>(),
        }));
        return Ok(());
    }
    for r in &refused {
        let change = if r.value.is_some() { "write" } else { "delete" };
        println!(
            "#{} {} {change} {} on {} at {} — {}",
            r.id,
            r.actor,
            r.key.display_path(),
            r.branch,
            r.head.short(),
            r.decision.explanation.trim()
        );
    }
    Ok(())
}

/// One operation and what it changed.
pub fn show(s: &Session, spec: &str, json: bool) -> Outcome<()> {
    let id = resolve(s, spec)?;
    let ShownOp { op, marks, changes } = s.env.show(&s.actor, &id)?;
    let changes = changes.unwrap_or_default();
    if json {
        let mut j = op.to_json();
        j["marks"] = json!(marks);
        j["changes"] = json!(changes.iter().map(change_json).collect::<Vec<_>>());
        print_json(&j);
        return Ok(());
    }
    println!("op {} (#{} on {})", op.id, op.seq, op.branch);
    println!("actor:  {}", op.actor);
    println!("intent: {} — {}", op.intent.kind, op.intent.text);
    let flags = op.flags.names();
    if !flags.is_empty() {
        println!("flags:  {}", flags.join(", "));
    }
    for p in &op.parents {
        println!("parent: {}", p.short());
    }
    if let Some(r) = op.restored_from {
        println!("restored from: {}", r.short());
    }
    if !marks.is_empty() {
        println!("marks:  {}", marks.join(", "));
    }
    if op.flags.contains(OpFlags::MERGE) && op.flags.contains(OpFlags::CONFLICTS) {
        println!("the merge left conflict objects");
    }
    let s_ = &op.summary;
    println!("changes: +{} ~{} -{}", s_.added, s_.modified, s_.removed);
    for c in &changes {
        println!("  {} {}", change_letter(c), c.key.display_path());
    }
    Ok(())
}

/// What changed between two versions.
pub fn diff(s: &Session, from: &str, to: Option<&str>, stat: bool, json: bool) -> Outcome<()> {
    let a = resolve(s, from)?;
    let b = resolve(s, to.unwrap_or("HEAD"))?;
    let changes = s.env.diff(&s.actor, &a, &b, None)?;
    let (added, modified, removed) = counts(&changes);
    if json {
        let mut j = json!({
            "from": a.to_string(),
            "to": b.to_string(),
            "added": added,
            "modified": modified,
            "removed": removed,
        });
        if !stat {
            j["changes"] = json!(changes.iter().map(change_json).collect::<Vec<_>>());
        }
        print_json(&j);
        return Ok(());
    }
    if !stat {
        for c in &changes {
            println!("{} {}", change_letter(c), c.key.display_path());
        }
    }
    println!(
        "{} path(s) changed: {added} added, {modified} modified, {removed} removed ({} → {})",
        changes.len(),
        a.short(),
        b.short()
    );
    Ok(())
}
