//! `envctl effects`, `gc`, `verify`, `status`: looking after the environment.

use environment_workspace::Method;
use serde_json::json;

use crate::door::Door;
use crate::failure::Outcome;
use crate::output::print_json;
use crate::progress::Progress;
use crate::workspace::{ROOTFS_DIR, Workspace};

/// The effect log, through the workspace's door.
pub fn effects(door: &Door, unfinished: bool, json: bool) -> Outcome<()> {
    let mut r = door.call(Method::EffectList, json!({ "unfinished": unfinished }))?;
    // Every page.
    while let Some(after) = r["next"].as_u64() {
        let more = door.call(
            Method::EffectList,
            json!({ "unfinished": unfinished, "after": after }),
        )?;
        if let (Some(all), Some(page)) = (r["effects"].as_array_mut(), more["effects"].as_array()) {
            all.extend(page.iter().cloned());
        }
        r["next"] = more["next"].clone();
    }
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
pub fn gc(door: &Door, json: bool) -> Outcome<()> {
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
pub fn verify(door: &Door, json: bool) -> Outcome<()> {
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

/// Where the environment is and what it holds, through the workspace's door; `ws` is the
/// workspace when this process knows it (not through a socket named by `--socket`).
pub fn status(door: &Door, ws: Option<&Workspace>, json: bool) -> Outcome<()> {
    let r = door.call(Method::Status, json!({}))?;
    let supervisor = door.socket().map(|socket| {
        json!({
            "socket": socket.display().to_string(),
            "actor": r["agent"],
            "agent_pid": r["agent_pid"],
            "sandbox": r["sandbox"],
            "workspace": r["workspace"],
            "captures": r["captures"],
            "rollbacks": r["rollbacks"],
        })
    });
    let rootfs = ws
        .map(|w| w.home.join(ROOTFS_DIR))
        .filter(|r| r.is_dir())
        .map(|r| r.display().to_string());
    if json {
        print_json(&json!({
            "dir": ws.map(|w| w.dir.display().to_string()),
            "home": ws.map(|w| w.home.display().to_string()),
            "actor": r["actor"],
            "branch": r["branch"],
            "head": r["head"],
            "head_intent": r["head_intent"],
            "seq": r["seq"],
            "branches": r["branches"],
            "marks": r["marks"],
            "unfinished_effects": r["unfinished_effects"],
            "policy_version": r["policy_version"],
            "queue": r["queue"],
            "supervisor": supervisor.clone().unwrap_or(json!(false)),
            "rootfs": rootfs,
        }));
        return Ok(());
    }
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    if let Some(w) = ws {
        println!("workspace: {}", w.dir.display());
        println!("home:      {}", w.home.display());
    }
    println!(
        "head:      {} #{} ({}: {})",
        text(&r["head"]).chars().take(12).collect::<String>(),
        r["seq"],
        text(&r["head_actor"]),
        text(&r["head_intent"])
    );
    let names = |v: &serde_json::Value| {
        v.as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect::<Vec<_>>()
    };
    println!("branches:  {}", names(&r["branches"]).join(", "));
    println!("marks:     {}", names(&r["marks"]).len());
    println!("effects:   {} unfinished", r["unfinished_effects"]);
    match r["policy_version"].as_u64() {
        Some(v) => println!("policy:    loaded (version {v})"),
        None => println!("policy:    none loaded (every action is allowed)"),
    }
    match &supervisor {
        Some(s) => {
            println!("supervisor: running at {}", text(&s["socket"]));
            for k in ["actor", "agent_pid", "sandbox", "workspace"] {
                println!("  {k:<10} {}", text(&s[k]));
            }
            println!(
                "  captures {} · rollbacks {}",
                s["captures"], s["rollbacks"]
            );
        }
        None => println!("supervisor: not running"),
    }
    Ok(())
}
