//! `envctl log`, `refused`, `show`, `diff`: reading the history, through the workspace's door
//! (in process or through a running supervisor alike), rendered here.

use environment_workspace::Method;
use serde_json::{Value, json};

use crate::door::Door;
use crate::failure::Outcome;
use crate::output::print_json;

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

fn short(v: &Value) -> String {
    text(v).chars().take(12).collect()
}

/// At most this many entries or changes are asked for at once (the service's limit).
const MOST: usize = 1000;

/// The history of a branch.
pub fn log(door: &Door, all: bool, branch: &str, limit: usize, json: bool) -> Outcome<()> {
    let mut r = door.call(
        Method::History,
        json!({ "all": all, "branch": branch, "limit": limit.clamp(1, MOST) }),
    )?;
    if json {
        r["all"] = json!(all);
        if matches!(door, Door::Socket(_)) {
            r["via"] = json!("supervisor");
        }
        print_json(&r);
    } else {
        for e in r["entries"].as_array().into_iter().flatten() {
            println!("{}", text(&e["text"]));
        }
    }
    Ok(())
}

/// The refused changes of a branch, newest first.
pub fn refused(door: &Door, branch: &str, limit: usize, json: bool) -> Outcome<()> {
    let r = door.call(
        Method::Refused,
        json!({ "branch": branch, "limit": limit.clamp(1, MOST) }),
    )?;
    if json {
        print_json(&r);
        return Ok(());
    }
    for c in r["refused"].as_array().into_iter().flatten() {
        println!(
            "#{} {} {} {} on {} at {} — {}",
            c["id"],
            text(&c["actor"]),
            text(&c["change"]),
            text(&c["path"]),
            text(&c["branch"]),
            short(&c["head"]),
            text(&c["reason"]).trim()
        );
    }
    Ok(())
}

/// One operation and what it changed.
pub fn show(door: &Door, spec: &str, json: bool) -> Outcome<()> {
    let op = door.call(Method::Show, json!({ "version": spec }))?;
    if json {
        print_json(&op);
        return Ok(());
    }
    println!(
        "op {} (#{} on {})",
        text(&op["id"]),
        op["seq"],
        text(&op["branch"])
    );
    println!("actor:  {}", text(&op["actor"]));
    println!(
        "intent: {} — {}",
        text(&op["intent"]["kind"]),
        text(&op["intent"]["text"])
    );
    let names = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .map(|x| text(x).to_owned())
            .collect()
    };
    let flags = names(&op["flags"]);
    if !flags.is_empty() {
        println!("flags:  {}", flags.join(", "));
    }
    for p in op["parents"].as_array().into_iter().flatten() {
        println!("parent: {}", short(p));
    }
    if op["restored_from"].is_string() {
        println!("restored from: {}", short(&op["restored_from"]));
    }
    let marks = names(&op["marks"]);
    if !marks.is_empty() {
        println!("marks:  {}", marks.join(", "));
    }
    if flags.iter().any(|f| f == "merge") && flags.iter().any(|f| f == "conflicts") {
        println!("the merge left conflict objects");
    }
    let s = &op["summary"];
    println!(
        "changes: +{} ~{} -{}",
        s["added"], s["modified"], s["removed"]
    );
    for c in op["changes"].as_array().into_iter().flatten() {
        println!("  {} {}", letter(c), text(&c["path"]));
    }
    Ok(())
}

fn letter(c: &Value) -> char {
    match text(&c["change"]) {
        "added" => 'A',
        "removed" => 'D',
        _ => 'M',
    }
}

/// What changed between two versions (the first thousand changes listed, every one counted).
pub fn diff(door: &Door, from: &str, to: Option<&str>, stat: bool, json: bool) -> Outcome<()> {
    let r = door.call(
        Method::Diff,
        json!({ "from": from, "to": to, "limit": MOST }),
    )?;
    if json {
        let mut out = json!({
            "from": r["from"],
            "to": r["to"],
            "added": r["added"],
            "modified": r["modified"],
            "removed": r["removed"],
        });
        if !stat {
            out["changes"] = r["changes"].clone();
            out["truncated"] = r["truncated"].clone();
        }
        print_json(&out);
        return Ok(());
    }
    if !stat {
        let listed = r["changes"].as_array().cloned().unwrap_or_default();
        for c in &listed {
            println!("{} {}", letter(c), text(&c["path"]));
        }
        let total = r["total"].as_u64().unwrap_or(0);
        if (listed.len() as u64) < total {
            println!("… and {} more", total - listed.len() as u64);
        }
    }
    println!(
        "{} path(s) changed: {} added, {} modified, {} removed ({} → {})",
        r["total"],
        r["added"],
        r["modified"],
        r["removed"],
        short(&r["from"]),
        short(&r["to"])
    );
    Ok(())
}
