//! Commands answered by a running supervisor, through its control socket: while `envctl run`
//! holds the workspace, its captures and a command's changes must not race, so log, show,
//! diff, status and mark go through it (restore, undo, redo, merge and exec go through the
//! workspace's one door, `crate::door`, in process or through it alike). The others say they cannot
//! (exit 7) and do nothing.

use serde_json::{Value, json};

use crate::cli::{Cli, Command};
use crate::failure::{Failure, Outcome};
use crate::output::print_json;
use crate::target::{Remote, SupervisorAddr, supervisor_unavailable};

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn short(v: &Value) -> String {
    text(v).chars().take(12).collect()
}

/// Runs `cli`'s command through the supervisor at `addr`; returns the exit status.
pub fn run(addr: &SupervisorAddr, cli: &Cli) -> Outcome<i32> {
    let json = cli.json;
    let credentials = environment_core::Credentials {
        token: cli.token.clone(),
        approval: cli.approval.clone(),
    };
    match &cli.command {
        // Answered by the supervisor.
        Command::Log { .. }
        | Command::Show { .. }
        | Command::Diff { .. }
        | Command::Status
        | Command::Mark { name: Some(_), .. } => {}
        Command::Mark { name: None, .. } => {
            return Err(supervisor_unavailable(addr, "listing marks"));
        }
        Command::Run(_) => {
            return Err(supervisor_unavailable(addr, "another `run`")
                .hint("one supervisor per workspace: this one already runs an agent"));
        }
        Command::Branch { .. } => return Err(supervisor_unavailable(addr, "branch")),
        Command::Tournament(_) => return Err(supervisor_unavailable(addr, "tournament")),
        Command::Effects { .. } => return Err(supervisor_unavailable(addr, "effects")),
        Command::Policy(_) => return Err(supervisor_unavailable(addr, "policy")),
        Command::Queue(_) => return Err(supervisor_unavailable(addr, "queue")),
        Command::Gc => return Err(supervisor_unavailable(addr, "gc")),
        Command::Verify => return Err(supervisor_unavailable(addr, "verify")),
        Command::Refused { .. } => return Err(supervisor_unavailable(addr, "refused")),
        // Through the one door, before this (see `commands::rollback`).
        Command::Restore { .. }
        | Command::Undo { .. }
        | Command::Redo { .. }
        | Command::Merge { .. }
        | Command::Exec(_) => {
            return Err(Failure::other(
                "a rollback goes through the workspace's door",
            ));
        }
        Command::Init { .. } | Command::Mcp | Command::Demo { .. } | Command::Monitor { .. } => {
            return Err(supervisor_unavailable(addr, "this command"));
        }
    }
    let mut remote = Remote::connect(addr, &credentials)?;
    match &cli.command {
        Command::Log { all, branch, limit } => {
            let limit = (*limit).clamp(1, 1000);
            let r = remote.call(
                "history",
                json!({ "all": all, "branch": branch, "limit": limit }),
            )?;
            let r = remote_history(r);
            if json {
                print_json(&r);
            } else {
                for e in r["entries"].as_array().into_iter().flatten() {
                    println!("{}", text(&e["text"]));
                }
            }
        }
        Command::Show { version } => {
            let r = remote.call("show", json!({ "version": version }))?;
            if json {
                print_json(&r);
            } else {
                println!(
                    "{} {} {}: {}",
                    short(&r["id"]),
                    text(&r["actor"]),
                    text(&r["intent"]["kind"]),
                    text(&r["intent"]["text"])
                );
                for k in r["summary"]["keys"].as_array().into_iter().flatten() {
                    println!("  {}", text(k));
                }
            }
        }
        Command::Diff { from, to, stat } => {
            let mut p = json!({ "from": from });
            if let Some(t) = to {
                p["to"] = json!(t);
            }
            let r = remote.call("diff", p)?;
            let mut changes = r["changes"].as_array().cloned().unwrap_or_default();
            for c in &mut changes {
                c["path"] = c["key"].clone();
            }
            let count = |c: &str| changes.iter().filter(|x| x["change"] == c).count();
            let (a, m, d) = (count("added"), count("modified"), count("removed"));
            if json {
                let mut out = json!({
                    "from": r["from"], "to": r["to"],
                    "added": a, "modified": m, "removed": d,
                });
                if !stat {
                    out["changes"] = Value::Array(changes);
                }
                print_json(&out);
            } else {
                if !stat {
                    for c in &changes {
                        let letter = match c["change"].as_str() {
                            Some("added") => 'A',
                            Some("removed") => 'D',
                            _ => 'M',
                        };
                        println!("{letter} {}", text(&c["key"]));
                    }
                }
                println!("{a} added, {m} modified, {d} removed");
            }
        }
        Command::Status => {
            let r = remote.call("status", Value::Null)?;
            if json {
                print_json(&json!({ "supervisor": r, "socket": addr.socket }));
            } else {
                println!("supervisor: {}", addr.socket.display());
                for k in [
                    "workspace",
                    "sandbox",
                    "actor",
                    "branch",
                    "head",
                    "agent_pid",
                ] {
                    println!("  {k:<10} {}", text(&r[k]));
                }
                println!(
                    "  captures {} · rollbacks {}",
                    text(&r["captures"]),
                    text(&r["rollbacks"])
                );
            }
        }
        Command::Mark { name, version } => {
            let mut p = json!({ "name": name });
            if let Some(v) = version {
                p["version"] = json!(v);
            }
            let r = remote.call("mark", p)?;
            if json {
                print_json(&r);
            } else {
                println!("marked {} at {}", text(&r["name"]), short(&r["version"]));
            }
        }
        _ => return Err(Failure::other("unreachable command routing")),
    }
    Ok(0)
}

/// The supervisor's history entries with the field names of `envctl log --json`.
fn remote_history(mut r: Value) -> Value {
    r["via"] = json!("supervisor");
    r
}
