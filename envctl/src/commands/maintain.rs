//! `envctl effects`, `gc`, `verify`, `status`: looking after the environment.

use environment_core::{EffectRecord, MAIN};
use serde_json::json;

use crate::failure::Outcome;
use crate::output::print_json;
use crate::progress::Progress;
use crate::target::probe;
use crate::workspace::{BUS_FILE, ROOTFS_DIR, SOCKET_FILE, Session};

fn effect_json(e: &EffectRecord) -> serde_json::Value {
    json!({
        "id": e.id,
        "key": e.key,
        "target": e.target,
        "state": e.state.as_str(),
        "actor": e.actor,
        "attempts": e.attempts,
        "note": e.note,
        "request": String::from_utf8_lossy(&e.request),
        "result": e.result.as_ref().map(|r| String::from_utf8_lossy(r).into_owned()),
        "created_ms": e.created_ms,
        "updated_ms": e.updated_ms,
    })
}

/// The effect log.
pub fn effects(s: &Session, unfinished: bool, json: bool) -> Outcome<()> {
    let list = if unfinished {
        s.env.effects_unfinished()?
    } else {
        s.env.effects()?
    };
    if json {
        print_json(&json!({"effects": list.iter().map(effect_json).collect::<Vec<_>>()}));
        return Ok(());
    }
    if list.is_empty() {
        println!("No {}effects.", if unfinished { "unfinished " } else { "" });
    }
    for e in &list {
        println!(
            "#{} {} {} → {} ({}, {} attempt(s))",
            e.id,
            e.state.as_str(),
            e.key,
            e.target,
            e.actor,
            e.attempts
        );
    }
    Ok(())
}

/// Garbage collection of unreferenced content.
pub fn gc(s: &Session, json: bool) -> Outcome<()> {
    let progress = Progress::spinner("collecting unreferenced content");
    let report = s.env.gc(&s.actor);
    progress.finish();
    let r = report?;
    if json {
        print_json(&json!({
            "kept": r.kept,
            "removed": r.removed,
            "bytes_removed": r.bytes_removed,
            "temp_removed": r.temp_removed,
            "nodes_removed": r.nodes_removed,
        }));
    } else {
        println!(
            "Removed {} blob(s) ({} bytes) and {} node(s); kept {} blob(s).",
            r.removed, r.bytes_removed, r.nodes_removed, r.kept
        );
    }
    Ok(())
}

/// The integrity check.
pub fn verify(s: &Session, json: bool) -> Outcome<()> {
    let progress = Progress::spinner("verifying the stores");
    let report = s.env.verify(&s.actor);
    progress.finish();
    let r = report?;
    if json {
        print_json(&json!({"ok": true, "ops": r.ops, "nodes": r.nodes, "blobs": r.blobs}));
    } else {
        println!(
            "The environment is intact: {} operation(s), {} node(s), {} blob(s) checked.",
            r.ops, r.nodes, r.blobs
        );
    }
    Ok(())
}

/// Where the environment is and what it holds.
pub fn status(s: &Session, json: bool) -> Outcome<()> {
    let head = s.head()?;
    let op = s.env.op(&head)?;
    let branches = s.env.branches()?;
    let marks = s.env.marks()?;
    let unfinished = s.env.effects_unfinished()?.len();
    let policy = s.policy.as_ref().map(|p| p.version());
    let socket = s.ws.home.join(SOCKET_FILE);
    let supervisor = socket.exists() && probe(&socket).is_ok();
    let rootfs = s.ws.home.join(ROOTFS_DIR);
    let queue = s.ws.home.join(BUS_FILE).exists();
    if json {
        print_json(&json!({
            "dir": s.ws.dir.display().to_string(),
            "home": s.ws.home.display().to_string(),
            "actor": s.actor.as_str(),
            "branch": MAIN,
            "head": head.to_string(),
            "head_intent": op.intent.text,
            "seq": op.seq,
            "branches": branches.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            "marks": marks.iter().map(|(n, _)| n).collect::<Vec<_>>(),
            "unfinished_effects": unfinished,
            "policy_version": policy,
            "queue": queue,
            "supervisor": supervisor,
            "rootfs": rootfs.is_dir().then(|| rootfs.display().to_string()),
        }));
        return Ok(());
    }
    println!("workspace: {}", s.ws.dir.display());
    println!("home:      {}", s.ws.home.display());
    println!(
        "head:      {} #{} ({}: {})",
        head.short(),
        op.seq,
        op.actor,
        op.intent.text
    );
    println!(
        "branches:  {}",
        branches
            .iter()
            .map(|(n, _)| n.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("marks:     {}", marks.len());
    println!("effects:   {unfinished} unfinished");
    match policy {
        Some(v) => println!("policy:    loaded (version {v})"),
        None => println!("policy:    none loaded (every action is allowed)"),
    }
    println!(
        "supervisor: {}",
        if supervisor { "running" } else { "not running" }
    );
    Ok(())
}
