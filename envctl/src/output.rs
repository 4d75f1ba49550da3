//! How results are printed: lines for a person, or one JSON document with `--json`.

use environment_core::{KeyChange, Value};
use serde_json::{Value as Json, json};

/// Prints `value` as pretty JSON on stdout.
pub fn print_json(value: &Json) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
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
