//! How results are printed: lines for a person, or one JSON document with `--json`.

use serde_json::Value as Json;

/// Prints `value` as pretty JSON on stdout.
pub fn print_json(value: &Json) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}
