//! Core's governance port (`environment_core::Governance`) as the workspace service uses it,
//! from one test body that takes any implementation: the policy here; a store shared by several
//! machines runs the same body.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use environment_core::governance::GrantScope;
use environment_core::{Action, ActorId, ErrorKind, Governance, Resource};

const RULES: &str = r#"
[schema]
actions = ["deploy"]

[[rule]]
id = "deploy-needs-maintainer"
effect = "permit"
principal = "kind:agent"
actions = ["deploy"]
resource = { environment = true }
approval_from = ["role:maintainer"]

[[rule]]
id = "writes-src"
effect = "permit"
principal = "kind:agent"
actions = ["write"]
resource = { path = "src/**" }
quota = { count = 1, window_secs = 3600 }
"#;

/// What every governance behind the port does, whatever keeps it (and `tick` moves its clock
/// on a millisecond). It starts with no rules.
fn the_port_behaves(g: &dyn Governance, tick: &dyn Fn()) {
    let agent = ActorId::new("agent:coder").unwrap();
    let ann = ActorId::new("human:ann").unwrap();

    // Rules that do not read are refused before anything changes; good ones are a version.
    let before = g.version();
    assert_eq!(
        g.check_rules("[[rule]] nonsense").unwrap_err().kind,
        ErrorKind::Invalid
    );
    assert_eq!(
        g.load_rules("[[rule]] nonsense").unwrap_err().kind,
        ErrorKind::Invalid
    );
    assert_eq!(g.version(), before);
    g.check_rules(RULES).unwrap();
    let loaded = g.load_rules(RULES).unwrap();
    assert!(loaded.version > before && loaded.rules == 2, "{loaded:?}");
    let member = g.add_member("human:ann", "role:maintainer").unwrap();
    assert!(member > loaded.version);

    // Explaining is a dry run: the one write the quota allows is still there afterwards.
    let write = req("agent:coder", Action::Write, path("src/a.rs"));
    for _ in 0..3 {
        let e = g.explain(&write);
        assert!(e.allowed && e.outcome == "allow", "{e:?}");
        assert_eq!(e.rules, ["writes-src"]);
    }
    assert!(g.decide(&write).is_allowed(), "explaining spent the quota");
    let denied = g.explain(&req("agent:coder", Action::Write, path("docs/a.md")));
    assert!(!denied.allowed && denied.outcome == "deny", "{denied:?}");

    // What the agent may do where, by rule.
    let may = g.what_may(&agent, &path("src/lib.rs"));
    assert!(
        may.iter()
            .any(|p| p.rule == "writes-src" && p.action == "write"),
        "{may:?}"
    );
    assert!(
        g.what_may(&agent, &path("docs/a.md"))
            .iter()
            .all(|p| p.action != "write")
    );

    // An approval: filed once for a held action, decided only by a named approver.
    let deploy = req(
        "agent:coder",
        Action::Custom("deploy".into()),
        Resource::Environment,
    );
    let held = g.explain(&deploy);
    assert_eq!(
        (held.outcome.as_str(), held.approvers.as_slice()),
        ("needs_approval", &["role:maintainer".to_owned()][..])
    );
    assert_eq!(
        g.request_approval(&write).unwrap_err().kind,
        ErrorKind::Conflict,
        "an allowed action needs no approval"
    );
    let asked = g.request_approval(&deploy).unwrap();
    assert_eq!(
        g.request_approval(&deploy).unwrap().id,
        asked.id,
        "filed once"
    );
    assert_eq!(
        (asked.state.as_str(), asked.actor.as_str()),
        ("pending", "agent:coder")
    );
    let once = GrantScope {
        uses: 1,
        expires_at_ms: None,
    };
    assert_eq!(
        g.grant(&asked.id, &agent, once).unwrap_err().kind,
        ErrorKind::Denied
    );
    assert_eq!(
        g.grant("apr-nothing", &ann, once).unwrap_err().kind,
        ErrorKind::NotFound
    );
    let granted = g.grant(&asked.id, &ann, once).unwrap();
    assert_eq!(
        (granted.state.as_str(), granted.uses_left),
        ("granted", Some(1))
    );
    assert_eq!(
        g.reject(&asked.id, &ann).unwrap_err().kind,
        ErrorKind::Conflict
    );
    assert_eq!(g.approval(&asked.id).unwrap(), granted);

    // The list is in a stable order, oldest first, so it can be paged.
    let other = req(
        "agent:other",
        Action::Custom("deploy".into()),
        Resource::Environment,
    );
    tick();
    let second = g.request_approval(&other).unwrap();
    let ids: Vec<String> = g.approvals().into_iter().map(|a| a.id).collect();
    assert_eq!(ids, [asked.id.clone(), second.id.clone()]);
    assert_eq!(g.approvals(), g.approvals());
    let rejected = g.reject(&second.id, &ann).unwrap();
    assert_eq!(rejected.state, "rejected");
}

#[test]
fn the_policy_behaves_as_the_port_says() {
    let (p, clock) = policy();
    the_port_behaves(&p, &|| clock.advance(1));
}
