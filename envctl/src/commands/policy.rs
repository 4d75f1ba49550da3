//! `envctl policy`: load rules, ask for decisions and their reasons, decide approvals — each a
//! use case of the workspace service, through its door (in process, or through a running
//! supervisor as this invocation's actor). Only a workspace's first rules are loaded on its
//! stores: there is no policy yet to decide who may.

use environment_workspace::permissions::{
    ApprovalListParams, ExplainParams, GrantParams, LoadParams, MemberParams, RejectParams,
    ResourceParam, WhatMayParams,
};
use serde_json::json;

use super::parse_actor;
use crate::cli::{ApprovalDecision, PolicyCommand};
use crate::door::Door;
use crate::failure::{ExitCode, Failure, Outcome};
use crate::output::print_json;
use crate::workspace::Workspace;

/// Runs a policy command; `ws` is the workspace this process knows (for a first load).
pub fn run(door: &Door, ws: Option<&Workspace>, cmd: &PolicyCommand, json: bool) -> Outcome<()> {
    match cmd {
        PolicyCommand::Load { file } => {
            let text = std::fs::read_to_string(file).map_err(|e| Failure::io("read", file, e))?;
            let changed = match ws {
                Some(ws) if door.socket().is_none() && ws.policy()?.is_none() => {
                    first_load(ws, &text)?
                }
                _ => door.request(LoadParams { rules: text })?,
            };
            if json {
                print_json(&json!({ "version": changed.version, "rules": changed.rules }));
            } else {
                println!(
                    "Loaded {} rule(s); the policy is at version {}.",
                    changed.rules, changed.version
                );
            }
            Ok(())
        }
        PolicyCommand::Check(q) | PolicyCommand::Explain(q) => {
            let d = door.request(ExplainParams {
                actor: Some(parse_actor(&q.actor)?.to_string()),
                action: q.action.clone(),
                resource: ResourceParam::from(q.resource.as_str()),
                operation: None,
            })?;
            let outcome = d.outcome.replace('_', " ");
            if json {
                print_json(&serde_json::to_value(&d).unwrap_or_default());
            } else if matches!(cmd, PolicyCommand::Explain(_)) {
                println!("{outcome}: {}", d.explanation);
            } else if d.rules.is_empty() {
                println!("{outcome} (rules: none)");
            } else {
                println!("{outcome} (rules: {})", d.rules.join(", "));
            }
            if d.allowed {
                return Ok(());
            }
            Err(Failure::new(
                ExitCode::Denied,
                format!("{} may not {} that", q.actor, q.action),
            )
            .hint("`envctl policy explain` says why"))
        }
        PolicyCommand::May {
            actor: who,
            resource,
        } => {
            let may = door.request(WhatMayParams {
                actor: Some(parse_actor(who)?.to_string()),
                resource: resource.as_deref().map(ResourceParam::from),
            })?;
            if !may.policy {
                return Err(
                    Failure::not_found("no policy is loaded in this environment")
                        .hint("load rules with `envctl policy load FILE`"),
                );
            }
            if json {
                print_json(&json!({ "actor": who, "permissions": may.permissions }));
            } else if may.permissions.is_empty() {
                println!("{who} may do nothing there.");
            }
            for p in may.permissions.iter().filter(|_| !json) {
                println!(
                    "{} {} (rule {}) {}",
                    p.action, p.resource, p.rule, p.conditions
                );
            }
            Ok(())
        }
        PolicyCommand::Member { member, group } => {
            let m = door.request(MemberParams {
                member: member.clone(),
                group: group.clone(),
            })?;
            if json {
                print_json(&serde_json::to_value(&m).unwrap_or_default());
            } else {
                println!(
                    "{} is now in {} (policy version {}).",
                    m.member, m.group, m.version
                );
            }
            Ok(())
        }
        PolicyCommand::Approvals { decision, id } => {
            let decided = match (decision, id) {
                (None, None) => None,
                (Some(ApprovalDecision::Grant), Some(id)) => Some(door.request(GrantParams {
                    id: id.clone(),
                    uses: None,
                    expires_at_ms: None,
                })?),
                (Some(ApprovalDecision::Reject), Some(id)) => {
                    Some(door.request(RejectParams { id: id.clone() })?)
                }
                _ => {
                    return Err(Failure::usage(
                        "an approval decision needs both grant|reject and an ID",
                    )
                    .hint("e.g. `envctl policy approvals grant ID`"));
                }
            };
            if let Some(a) = decided {
                if json {
                    print_json(&serde_json::to_value(&a).unwrap_or_default());
                } else {
                    println!("Approval {} is {}.", a.id, a.state);
                }
                return Ok(());
            }
            let mut list = door.request(ApprovalListParams::default())?;
            while let Some(after) = list.next.take() {
                let more = door.request(ApprovalListParams {
                    after: Some(after),
                    limit: None,
                })?;
                list.approvals.extend(more.approvals);
                list.next = more.next;
            }
            if json {
                print_json(&serde_json::to_value(&list).unwrap_or_default());
            } else if list.approvals.is_empty() {
                println!("No approval requests.");
            }
            for a in list.approvals.iter().filter(|_| !json) {
                println!(
                    "{} {} {} {} {} (from {})",
                    a.id,
                    a.state,
                    a.actor,
                    a.action,
                    a.resource,
                    a.from.join(" or ")
                );
            }
            Ok(())
        }
    }
}

/// A workspace's first rules, loaded on its stores: a file with issues creates no policy.
fn first_load(
    ws: &Workspace,
    text: &str,
) -> Outcome<environment_workspace::permissions::PolicyChanged> {
    if let Err(issues) = environment_policy::RuleFile::parse(text) {
        return Err(environment_policy::PolicyError::Invalid(issues).into());
    }
    let policy = ws.open_policy()?;
    // Only on a policy that is still empty: one loaded in between (on another machine sharing
    // it) decides who may load rules now.
    let version = policy.load_rules_on(0, text)?;
    Ok(environment_workspace::permissions::PolicyChanged {
        version,
        rules: policy.rules().rules.len(),
    })
}
