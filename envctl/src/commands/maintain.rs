//! `envctl effects`, `gc`, `verify`, `status`: looking after the environment.

use environment_workspace::effects::ListParams;
use environment_workspace::versions::{GcParams, StatusParams, VerifyParams};
use serde_json::json;

use super::history::short;
use crate::door::Door;
use crate::failure::Outcome;
use crate::output::print_json;
use crate::progress::Progress;
use crate::workspace::{ROOTFS_DIR, Workspace};

/// The effect log, through the workspace's door.
pub fn effects(door: &Door, unfinished: bool, json: bool) -> Outcome<()> {
    let effects = door.every(
        |after| ListParams {
            unfinished,
            after,
            limit: None,
        },
        |page| (page.effects, page.next),
    )?;
    if json {
        print_json(&json!({ "effects": effects, "next": null }));
        return Ok(());
    }
    if effects.is_empty() {
        println!("No {}effects.", if unfinished { "unfinished " } else { "" });
    }
    for e in &effects {
        println!(
            "#{} {} {} → {} ({}, {} attempt(s))",
            e.id, e.state, e.key, e.target, e.actor, e.attempts
        );
    }
    Ok(())
}

/// Garbage collection of unreferenced content, through the workspace's door.
pub fn gc(door: &Door, json: bool) -> Outcome<()> {
    let progress = Progress::spinner("collecting unreferenced content");
    let r = door.request(GcParams {});
    progress.finish();
    let r = r?;
    if json {
        print_json(&json!(r));
    } else {
        print!(
            "Removed {} blob(s) ({} bytes) and {} node(s); kept {} blob(s)",
            r.removed, r.bytes_removed, r.nodes_removed, r.kept
        );
        match r.queue {
            Some(q) => println!(
                "; purged {} acked deliveries, {} message(s) and {} dedup id(s) from the queue.",
                q.deliveries, q.messages, q.dedup_ids
            ),
            None => println!("."),
        }
    }
    Ok(())
}

/// The integrity check, through the workspace's door.
pub fn verify(door: &Door, json: bool) -> Outcome<()> {
    let progress = Progress::spinner("verifying the stores");
    let r = door.request(VerifyParams::default());
    progress.finish();
    let r = r?;
    if json {
        print_json(&json!(r));
    } else {
        println!(
            "The environment is intact: {} operation(s), {} node(s), {} blob(s) checked.",
            r.ops, r.nodes, r.blobs
        );
    }
    Ok(())
}

/// Where the environment is and what it holds, through the workspace's door; `ws` is the
/// workspace when this process knows it (not through a socket named by `--socket`).
pub fn status(door: &Door, ws: Option<&Workspace>, json: bool) -> Outcome<()> {
    let r = door.request(StatusParams {})?;
    let socket = door.socket().map(|s| s.display().to_string());
    let rootfs = ws
        .map(|w| w.home.join(ROOTFS_DIR))
        .filter(|r| r.is_dir())
        .map(|r| r.display().to_string());
    // Which parts live in a shared database rather than in the home (never where: the file
    // is its owner's to read).
    let shared = match ws {
        Some(w) => crate::stores::Stores::read(&w.home)?.shared(),
        None => Vec::new(),
    };
    if json {
        let supervisor = match &socket {
            Some(socket) => json!({
                "socket": socket,
                "actor": r.agent,
                "agent_pid": r.agent_pid,
                "sandbox": r.sandbox,
                "workspace": r.workspace,
                "captures": r.captures,
                "rollbacks": r.rollbacks,
            }),
            None => json!(false),
        };
        print_json(&json!({
            "dir": ws.map(|w| w.dir.display().to_string()),
            "home": ws.map(|w| w.home.display().to_string()),
            "actor": r.actor,
            "branch": r.branch,
            "head": r.head,
            "head_intent": r.head_intent,
            "seq": r.seq,
            "branches": r.branches,
            "marks": r.marks,
            "unfinished_effects": r.unfinished_effects,
            "policy_version": r.policy_version,
            "queue": r.queue,
            "queue_upkeep_failure": r.queue_upkeep_failure,
            "supervisor": supervisor,
            "rootfs": rootfs,
            "shared": shared,
        }));
        return Ok(());
    }
    if let Some(w) = ws {
        println!("workspace: {}", w.dir.display());
        println!("home:      {}", w.home.display());
    }
    println!(
        "head:      {} #{} ({}: {})",
        short(&r.head),
        r.seq,
        r.head_actor,
        r.head_intent
    );
    println!("branches:  {}", r.branches.join(", "));
    println!("marks:     {}", r.marks.len());
    println!("effects:   {} unfinished", r.unfinished_effects);
    match r.policy_version {
        Some(v) => println!("policy:    loaded (version {v})"),
        None => println!("policy:    none loaded (every action is allowed)"),
    }
    if let Some(why) = &r.queue_upkeep_failure {
        println!("queue:     its background purge fails: {why}");
    }
    if !shared.is_empty() {
        println!(
            "shared:    {} (PostgreSQL, see stores.toml)",
            shared.join(", ")
        );
    }
    match &socket {
        Some(socket) => {
            println!("supervisor: running at {socket}");
            // The pid's row stays blank, as this report has always printed it; `--json` has
            // the pid.
            for (k, v) in [
                ("actor", Some(r.agent.as_str())),
                ("agent_pid", None),
                ("sandbox", r.sandbox.as_deref()),
                ("workspace", r.workspace.as_deref()),
            ] {
                println!("  {k:<10} {}", v.unwrap_or_default());
            }
            println!("  captures {} · rollbacks {}", r.captures, r.rollbacks);
        }
        None => println!("supervisor: not running"),
    }
    Ok(())
}
