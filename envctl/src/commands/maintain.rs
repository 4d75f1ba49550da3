//! `envctl effects`, `gc`, `verify`, `status`: looking after the environment.

use environment_core::MAIN;
use environment_workspace::Method;
use serde_json::json;

use crate::door::Door;
use crate::failure::Outcome;
use crate::output::print_json;
use crate::progress::Progress;
use crate::target::probe;
use crate::workspace::{BUS_FILE, ROOTFS_DIR, SOCKET_FILE, Session};

/// The effect log, through the workspace's door.
pub fn effects(door: &mut Door, unfinished: bool, json: bool) -> Outcome<()> {
    let r = door.call(Method::EffectList, json!({ "unfinished": unfinished }))?;
    if json {
        print_json(&r);
        return Ok(());
    }
    let list = r["effects"].as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        println!("No {}effects.", if unfinished { "unfinished " } else { "" });
    }
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    for e in &list {
        println!(
            "#{} {} {} → {} ({}, {} attempt(s))",
            e["id"],
            text(&e["state"]),
            text(&e["key"]),
            text(&e["target"]),
            text(&e["actor"]),
            e["attempts"]
        );
    }
    Ok(())
}

/// Garbage collection of unreferenced content, through the workspace's door.
pub fn gc(door: &mut Door, json: bool) -> Outcome<()> {
    let progress = Progress::spinner("collecting unreferenced content");
    let r = door.call(Method::Gc, json!({}));
    progress.finish();
    let r = r?;
    if json {
        print_json(&r);
    } else {
        println!(
            "Removed {} blob(s) ({} bytes) and {} node(s); kept {} blob(s).",
            r["removed"], r["bytes_removed"], r["nodes_removed"], r["kept"]
        );
    }
    Ok(())
}

/// The integrity check, through the workspace's door.
pub fn verify(door: &mut Door, json: bool) -> Outcome<()> {
    let progress = Progress::spinner("verifying the stores");
    let r = door.call(Method::Verify, json!({}));
    progress.finish();
    let r = r?;
    if json {
        print_json(&r);
    } else {
        println!(
            "The environment is intact: {} operation(s), {} node(s), {} blob(s) checked.",
            r["ops"], r["nodes"], r["blobs"]
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
