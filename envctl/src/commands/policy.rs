//! `envctl policy`: load rules, ask for decisions and their reasons, decide approvals.

use environment_core::{
    AccessRequest, Action, ActorId, Context, Key, KeyPrefix, MAIN, Namespace, Resource,
};
use environment_policy::{Approval, ApprovalState, GrantScope, Outcome as Verdict, Policy};
use serde_json::json;

use super::parse_actor;
use crate::cli::{ApprovalDecision, PolicyCommand};
use crate::failure::{ExitCode, Failure, Outcome};
use crate::output::print_json;
use crate::workspace::Workspace;

/// Parses an action name.
pub fn parse_action(s: &str) -> Outcome<Action> {
    let custom_ok = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    match Action::named(s) {
        Action::Custom(_) if !custom_ok => Err(Failure::usage(format!("{s:?} is not an action"))
            .hint(
                "use read, write, delete, execute, publish, consume, approve, delegate, or an \
                 action the rules' schema declares",
            )),
        action => Ok(action),
    }
}

/// Parses a resource: `path:P` (or a bare path), `prefix:P`, `object:KIND/KEY`, `branch:B`,
/// `topic:T`, `secret:S`, `service:URL`, `program:PROG ARGS...`, `environment`.
pub fn parse_resource(s: &str) -> Outcome<Resource> {
    let bad_key = |e: environment_core::KeyError| {
        Failure::usage(format!("{s:?} is not a valid path: {e}"))
            .hint("use a relative path without `.`, `..` or empty segments")
    };
    if s == "environment" {
        return Ok(Resource::Environment);
    }
    let (kind, rest) = s.split_once(':').unwrap_or(("path", s));
    Ok(match kind {
        "path" => Resource::Key(Key::fs(rest).map_err(bad_key)?),
        "prefix" if rest.is_empty() => Resource::Prefix(KeyPrefix::all(Namespace::Fs)),
        "prefix" => Resource::Prefix(KeyPrefix::new(Namespace::Fs, rest).map_err(bad_key)?),
        "object" => Resource::Key(Key::obj(rest).map_err(bad_key)?),
        "branch" => Resource::Branch(rest.to_owned()),
        "topic" => Resource::Topic(rest.to_owned()),
        "secret" => Resource::Secret(rest.to_owned()),
        "service" => Resource::Service(rest.to_owned()),
        "program" => {
            let mut words = rest.split_whitespace().map(str::to_owned);
            let program = words.next().ok_or_else(|| {
                Failure::usage("a program resource needs a program: `program:NAME ARGS...`")
            })?;
            Resource::Program {
                program,
                args: words.collect(),
            }
        }
        "environment" => Resource::Environment,
        other => {
            return Err(
                Failure::usage(format!("{other:?} is not a kind of resource")).hint(
                    "use path:, prefix:, object:, branch:, topic:, secret:, service:, program: or \
                 environment",
                ),
            );
        }
    })
}

/// The request a question stands for.
pub fn request(actor: ActorId, action: Action, resource: Resource) -> AccessRequest {
    AccessRequest {
        actor,
        action,
        resource,
        context: Context {
            branch: Some(MAIN.to_owned()),
            ..Context::default()
        },
    }
}

fn verdict_name(v: Verdict) -> &'static str {
    match v {
        Verdict::Allow => "allow",
        Verdict::Deny => "deny",
        Verdict::NeedsApproval => "needs approval",
        _ => "other",
    }
}

/// An approval's state in words.
pub fn state_name(s: &ApprovalState) -> &'static str {
    match s {
        ApprovalState::Pending => "pending",
        ApprovalState::Granted { uses_left: 0, .. } => "used up",
        ApprovalState::Granted { .. } => "granted",
        ApprovalState::Rejected { .. } => "rejected",
        #[allow(unreachable_patterns)]
        _ => "decided",
    }
}

fn approval_json(a: &Approval) -> serde_json::Value {
    json!({
        "id": a.id,
        "actor": a.actor,
        "action": a.action,
        "resource": a.resource,
        "rules": a.rules,
        "from": a.from,
        "state": state_name(&a.state),
        "created_at": a.created_at,
    })
}

/// Once a policy is loaded, changing it (rules, memberships) is writing the environment as a
/// whole: only an actor the policy lets do that may.
fn may_administer(policy: &Policy, actor: &ActorId) -> Outcome<()> {
    let req = request(actor.clone(), Action::Write, Resource::Environment);
    let d = policy.evaluate(&req);
    if d.is_allowed() {
        return Ok(());
    }
    Err(environment_core::EnvError::NotAllowed(Box::new(d.to_core(&req))).into())
}

fn require_policy(ws: &Workspace) -> Outcome<Policy> {
    if !ws.has_policy() {
        return Err(
            Failure::not_found("no policy is loaded in this environment")
                .hint("load rules with `envctl policy load FILE`"),
        );
    }
    ws.open_policy()
}

/// Runs a policy command.
pub fn run(ws: &Workspace, actor: &ActorId, cmd: &PolicyCommand, json: bool) -> Outcome<()> {
    match cmd {
        PolicyCommand::Load { file } => {
            let text = std::fs::read_to_string(file).map_err(|e| Failure::io("read", file, e))?;
            // Validate before creating the store, so a bad file leaves no policy behind.
            if let Err(issues) = environment_policy::RuleFile::parse(&text) {
                return Err(environment_policy::PolicyError::Invalid(issues).into());
            }
            let existed = ws.has_policy();
            let policy = ws.open_policy()?;
            if existed {
                may_administer(&policy, actor)?;
            }
            let version = policy.load_rules(&text)?;
            let rules = policy.rules().rules.len();
            if json {
                print_json(&json!({"version": version, "rules": rules}));
            } else {
                println!("Loaded {rules} rule(s); the policy is at version {version}.");
            }
            Ok(())
        }
        PolicyCommand::Check(q) | PolicyCommand::Explain(q) => {
            let explain = matches!(cmd, PolicyCommand::Explain(_));
            let req = request(
                parse_actor(&q.actor)?,
                parse_action(&q.action)?,
                parse_resource(&q.resource)?,
            );
            if !ws.has_policy() {
                if json {
                    print_json(&json!({"outcome": "allow", "policy": false}));
                } else {
                    println!("allow: no policy is loaded, so every action is allowed.");
                }
                return Ok(());
            }
            let policy = ws.open_policy()?;
            let d = policy.evaluate(&req);
            let text = d.explain(&req);
            let rules: Vec<&str> = d.rule_ids().collect();
            if json {
                print_json(&json!({
                    "outcome": verdict_name(d.outcome()),
                    "rules": rules,
                    "approvers": d.approvers(),
                    "policy_version": d.policy_version(),
                    "explanation": text,
                }));
            } else if explain {
                println!("{}: {text}", verdict_name(d.outcome()));
            } else {
                println!(
                    "{} (rules: {})",
                    verdict_name(d.outcome()),
                    if rules.is_empty() {
                        "none".to_owned()
                    } else {
                        rules.join(", ")
                    }
                );
            }
            if d.is_allowed() {
                Ok(())
            } else {
                Err(Failure::new(
                    ExitCode::Denied,
                    format!("{} may not {} that", q.actor, q.action),
                )
                .hint("`envctl policy explain` says why"))
            }
        }
        PolicyCommand::May {
            actor: who,
            resource,
        } => {
            let who = parse_actor(who)?;
            let under = match resource {
                Some(r) => parse_resource(r)?,
                None => Resource::Prefix(KeyPrefix::all(Namespace::Fs)),
            };
            let perms = require_policy(ws)?.what_may(who.as_str(), &under);
            if json {
                let list: Vec<_> = perms
                    .iter()
                    .map(|p| {
                        json!({"action": p.action, "rule": p.rule, "resource": p.resource,
                               "conditions": p.conditions, "except": p.except, "via": p.via})
                    })
                    .collect();
                print_json(&json!({"actor": who.as_str(), "permissions": list}));
            } else if perms.is_empty() {
                println!("{who} may do nothing there.");
            } else {
                for p in &perms {
                    println!(
                        "{} {} (rule {}) {}",
                        p.action, p.resource, p.rule, p.conditions
                    );
                }
            }
            Ok(())
        }
        PolicyCommand::Member { member, group } => {
            let policy = require_policy(ws)?;
            may_administer(&policy, actor)?;
            let version = policy.add_member(member, group)?;
            if json {
                print_json(&json!({"member": member, "group": group, "version": version}));
            } else {
                println!("{member} is now in {group} (policy version {version}).");
            }
            Ok(())
        }
        PolicyCommand::Approvals { decision, id } => {
            let policy = require_policy(ws)?;
            let decided = match (decision, id) {
                (None, None) => None,
                (Some(d), Some(id)) => Some(match d {
                    ApprovalDecision::Grant => {
                        policy.grant(id, actor.as_str(), GrantScope::once())?
                    }
                    ApprovalDecision::Reject => policy.reject(id, actor.as_str())?,
                }),
                _ => {
                    return Err(Failure::usage(
                        "an approval decision needs both grant|reject and an ID",
                    )
                    .hint("e.g. `envctl policy approvals grant ID`"));
                }
            };
            if let Some(a) = decided {
                if json {
                    print_json(&approval_json(&a));
                } else {
                    println!("Approval {} is {}.", a.id, state_name(&a.state));
                }
                return Ok(());
            }
            let list = policy.approvals();
            if json {
                print_json(
                    &json!({"approvals": list.iter().map(approval_json).collect::<Vec<_>>()}),
                );
            } else if list.is_empty() {
                println!("No approval requests.");
            } else {
                for a in &list {
                    println!(
                        "{} {} {} {} {} (from {})",
                        a.id,
                        state_name(&a.state),
                        a.actor,
                        a.action,
                        a.resource,
                        a.from.join(" or ")
                    );
                }
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_parse_by_kind_and_bare_paths_are_paths() {
        assert_eq!(
            parse_resource("src/main.rs").unwrap(),
            Resource::Key(Key::fs("src/main.rs").unwrap())
        );
        assert_eq!(
            parse_resource("path:a/b").unwrap(),
            Resource::Key(Key::fs("a/b").unwrap())
        );
        assert_eq!(
            parse_resource("program:cargo test --all").unwrap(),
            Resource::Program {
                program: "cargo".into(),
                args: vec!["test".into(), "--all".into()]
            }
        );
        assert_eq!(
            parse_resource("topic:task.created").unwrap(),
            Resource::Topic("task.created".into())
        );
        assert_eq!(
            parse_resource("environment").unwrap(),
            Resource::Environment
        );
        for bad in [
            "path:../x",
            "path:/abs",
            "program:",
            "planet:mars",
            "prefix:a//b",
        ] {
            let f = parse_resource(bad).unwrap_err();
            assert_eq!(f.code, ExitCode::Usage, "{bad}");
        }
    }

    #[test]
    fn actions_are_builtin_or_declared_names() {
        assert_eq!(parse_action("write").unwrap(), Action::Write);
        assert_eq!(
            parse_action("deploy").unwrap(),
            Action::Custom("deploy".into())
        );
        assert_eq!(parse_action("fly!").unwrap_err().code, ExitCode::Usage);
        assert_eq!(parse_action("").unwrap_err().code, ExitCode::Usage);
    }
}
