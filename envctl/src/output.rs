//! How results are printed: lines for a person, or one JSON document with `--json`.

use environment_core::{HistoryEntry, KeyChange, Operation, Value};
use serde_json::{Value as Json, json};

/// Prints `value` as pretty JSON on stdout.
pub fn print_json(value: &Json) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

/// An operation as JSON.
pub fn op_json(op: &Operation) -> Json {
    json!({
        "id": op.id.to_string(),
        "seq": op.seq,
        "parents": op.parents.iter().map(|p| p.to_string()).collect::<Vec<_>>(),
        "branch": op.branch,
        "actor": op.actor.as_str(),
        "kind": op.intent.kind.to_string(),
        "intent": op.intent.text,
        "flags": op.flags.names(),
        "added": op.summary.added,
        "modified": op.summary.modified,
        "removed": op.summary.removed,
        "keys": op.summary.keys.iter().map(|k| k.display_path()).collect::<Vec<_>>(),
        "time_ms": op.time_ms,
        "restored_from": op.restored_from.map(|r| r.to_string()),
        "base_version": op.base_version.map(|r| r.to_string()),
        "effects": op.effects,
    })
}

/// A history entry as JSON.
pub fn history_json(e: &HistoryEntry) -> Json {
    match e {
        HistoryEntry::Op {
            op,
            marks,
            fork_point,
        } => {
            let mut j = op_json(op);
            j["type"] = json!("op");
            j["marks"] = json!(marks);
            j["fork_point"] = json!(fork_point);
            j
        }
        HistoryEntry::Captures {
            count,
            newest,
            oldest,
            changed,
            quiet,
            from_ms,
            to_ms,
        } => json!({
            "type": "captures",
            "count": count,
            "newest": newest.to_string(),
            "oldest": oldest.to_string(),
            "changed": changed,
            "quiet": quiet,
            "from_ms": from_ms,
            "to_ms": to_ms,
        }),
    }
}

/// The letter of a change: `A`dded, `M`odified, `D`eleted.
pub fn change_letter(c: &KeyChange) -> char {
    match (&c.before, &c.after) {
        (None, _) => 'A',
        (_, None) => 'D',
        _ => 'M',
    }
}

fn value_json(v: &Option<Value>) -> Json {
    match v {
        None => Json::Null,
        Some(v) => json!({
            "kind": format!("{:?}", v.meta.kind).to_lowercase(),
            "size": v.meta.size,
            "mode": v.meta.mode,
        }),
    }
}

/// A change as JSON.
pub fn change_json(c: &KeyChange) -> Json {
    json!({
        "path": c.key.display_path(),
        "namespace": c.key.namespace().as_str(),
        "change": match change_letter(c) { 'A' => "added", 'D' => "removed", _ => "modified" },
        "before": value_json(&c.before),
        "after": value_json(&c.after),
    })
}

/// Counts of added, modified and removed keys.
pub fn counts(changes: &[KeyChange]) -> (usize, usize, usize) {
    let mut n = (0, 0, 0);
    for c in changes {
        match change_letter(c) {
            'A' => n.0 += 1,
            'D' => n.2 += 1,
            _ => n.1 += 1,
        }
    }
    n
}
