//! `envctl log`, `refused`, `show`, `diff`: reading the history, through the workspace's door
//! (in process or through a running supervisor alike), rendered here.

use environment_core::json::{Change, HistoryLine};
use environment_workspace::patch::FileDiffParams;
use environment_workspace::versions::{DiffParams, HistoryParams, RefusedParams, ShowParams};
use serde_json::json;

use crate::door::Door;
use crate::failure::Outcome;
use crate::output::print_json;

/// A version id as a person reads it: its first 12 characters.
pub(super) fn short(version: &str) -> &str {
    match version.char_indices().nth(12) {
        Some((end, _)) => &version[..end],
        None => version,
    }
}

/// At most this many entries or changes are asked for at once (the service's limit).
const MOST: usize = 1000;

/// The history of a branch.
pub fn log(door: &Door, all: bool, branch: &str, limit: usize, json: bool) -> Outcome<()> {
    let history = door.request(HistoryParams {
        branch: Some(branch.to_owned()),
        all,
        limit: Some(limit.clamp(1, MOST)),
        from: None,
    })?;
    if json {
        let mut out = json!(history);
        out["all"] = json!(all);
        if matches!(door, Door::Socket(_)) {
            out["via"] = json!("supervisor");
        }
        print_json(&out);
    } else {
        for e in &history.entries {
            let (HistoryLine::Op { text, .. } | HistoryLine::Captures { text, .. }) = e;
            println!("{text}");
        }
    }
    Ok(())
}

/// The refused changes of a branch, newest first.
pub fn refused(door: &Door, branch: &str, limit: usize, json: bool) -> Outcome<()> {
    let list = door.request(RefusedParams {
        branch: Some(branch.to_owned()),
        limit: Some(limit.clamp(1, MOST)),
        after: None,
    })?;
    if json {
        print_json(&json!(list));
        return Ok(());
    }
    for c in &list.refused {
        println!(
            "#{} {} {} {} on {} at {} — {}",
            c.id,
            c.actor,
            c.change,
            c.path,
            c.branch,
            short(&c.head),
            c.reason.trim()
        );
    }
    Ok(())
}

/// One operation and what it changed.
pub fn show(door: &Door, spec: &str, json: bool) -> Outcome<()> {
    let shown = door.request(ShowParams {
        version: spec.to_owned(),
    })?;
    if json {
        print_json(&json!(shown));
        return Ok(());
    }
    let op = &shown.op;
    println!("op {} (#{} on {})", op.id, op.seq, op.branch);
    println!("actor:  {}", op.actor);
    println!("intent: {} — {}", op.intent.kind, op.intent.text);
    if !op.flags.is_empty() {
        println!("flags:  {}", op.flags.join(", "));
    }
    for p in &op.parents {
        println!("parent: {}", short(p));
    }
    if let Some(from) = &op.restored_from {
        println!("restored from: {}", short(from));
    }
    if !shown.marks.is_empty() {
        println!("marks:  {}", shown.marks.join(", "));
    }
    let flagged = |name: &str| op.flags.iter().any(|f| f == name);
    if flagged("merge") && flagged("conflicts") {
        println!("the merge left conflict objects");
    }
    let s = &op.summary;
    println!("changes: +{} ~{} -{}", s.added, s.modified, s.removed);
    for c in shown.changes.iter().flatten() {
        println!("  {} {}", letter(c), c.path);
    }
    Ok(())
}

fn letter(c: &Change) -> char {
    match c.change.as_str() {
        "added" => 'A',
        "removed" => 'D',
        _ => 'M',
    }
}

/// What changed between two versions (the first thousand changes listed, every one counted).
pub fn diff(door: &Door, from: &str, to: Option<&str>, stat: bool, json: bool) -> Outcome<()> {
    let d = door.request(DiffParams {
        from: from.to_owned(),
        to: to.map(str::to_owned),
        prefix: None,
        limit: Some(MOST),
        after: None,
    })?;
    if json {
        let mut out = json!({
            "from": d.from,
            "to": d.to,
            "added": d.added,
            "modified": d.modified,
            "removed": d.removed,
        });
        if !stat {
            out["changes"] = json!(d.changes);
            out["truncated"] = json!(d.truncated);
        }
        print_json(&out);
        return Ok(());
    }
    if !stat {
        for c in &d.changes {
            println!("{} {}", letter(c), c.path);
        }
        if d.changes.len() < d.total {
            println!("… and {} more", d.total - d.changes.len());
        }
    }
    println!(
        "{} path(s) changed: {} added, {} modified, {} removed ({} → {})",
        d.total,
        d.added,
        d.modified,
        d.removed,
        short(&d.from),
        short(&d.to)
    );
    Ok(())
}

/// How one file changed between two versions, as a unified diff.
pub fn file_diff(door: &Door, path: &str, from: &str, to: Option<&str>, json: bool) -> Outcome<()> {
    let diff = door.request(FileDiffParams {
        path: path.to_owned(),
        from: from.to_owned(),
        to: to.map(str::to_owned),
        context: None,
    })?;
    if json {
        print_json(&json!(diff));
    } else {
        println!("{diff}");
    }
    Ok(())
}
