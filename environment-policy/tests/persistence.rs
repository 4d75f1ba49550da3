//! Reopening a stored policy keeps rules, schema, relations, delegations, approvals, quota
//! counters, token use counts, the token key and the version.
// Helpers outside #[test] functions panic on purpose: a broken fixture is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use common::*;
use environment_core::ManualClock;
use environment_policy::{ApprovalState, Delegation, GrantScope, Outcome, Policy, TokenLimits};

const RULES: &str = r#"
[schema]
actions = ["deploy"]
attributes = { ticket = "int" }

[[rule]]
id = "coders-write"
effect = "permit"
principal = "group:coders"
actions = ["write", "read"]
resource = { path = "src/**" }

[[rule]]
id = "deploy-with-approval"
effect = "permit"
principal = "group:coders"
actions = ["deploy"]
resource = { environment = true }
approval_from = ["role:maintainer"]

[[rule]]
id = "few-reads"
effect = "permit"
principal = "agent:reader"
actions = ["read"]
resource = { path = "docs/**" }
quota = { count = 1, window_secs = 3600 }
"#;

#[test]
fn reopen_keeps_everything() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("policy.db");
    let clock = ManualClock::new(10 * HOUR);
    let deploy = req(
        "agent:c",
        environment_core::Action::Custom("deploy".into()),
        environment_core::Resource::Environment,
    );
    let (version, rules, relations, approval_id, token) = {
        let p = Policy::open(&file, Arc::new(clock.clone())).unwrap();
        p.load_rules(RULES).unwrap();
        p.add_member("agent:c", "group:coders").unwrap();
        p.add_member("group:coders", "group:staff").unwrap();
        p.add_member("human:m", "role:maintainer").unwrap();
        p.delegate(Delegation {
            id: "c-to-sub".into(),
            from: "agent:c".into(),
            to: "agent:sub".into(),
            actions: vec!["read".into()],
            resources: vec![],
            expires_at: None,
        })
        .unwrap();
        let a = p.request_approval(&deploy).unwrap();
        p.grant(
            &a.id,
            "human:m",
            GrantScope {
                uses: 2,
                expires_at: None,
            },
        )
        .unwrap();
        let mut with_approval = deploy.clone();
        with_approval.context.approval = Some(a.id.clone());
        assert!(p.check(&with_approval).is_allowed());
        assert!(p.check(&read("agent:reader", "docs/a")).is_allowed());
        let token = p
            .issue_token(
                "agent:c",
                TokenLimits {
                    max_uses: Some(2),
                    ..Default::default()
                },
            )
            .unwrap();
        let mut r = write("agent:c", "src/x");
        r.context.token = Some(token.encode());
        assert!(p.check(&r).is_allowed());
        (p.version(), p.rules(), p.relations(), a.id, token)
    };
    let p = Policy::open(&file, Arc::new(clock.clone())).unwrap();
    assert_eq!(p.version(), version);
    assert_eq!(p.rules(), rules);
    assert_eq!(p.relations(), relations);
    assert!(p.is_member("agent:c", "group:staff"), "closure rebuilt");
    assert_eq!(p.delegations().len(), 1);
    assert!(p.evaluate(&read("agent:sub", "src/a")).is_allowed());
    // The approval had one use left.
    let a = p.approval(&approval_id).unwrap();
    assert!(matches!(
        a.state,
        ApprovalState::Granted { uses_left: 1, .. }
    ));
    let mut with_approval = deploy.clone();
    with_approval.context.approval = Some(approval_id.clone());
    assert!(p.check(&with_approval).is_allowed());
    assert_eq!(p.check(&with_approval).outcome(), Outcome::NeedsApproval);
    // The quota stays spent for this window.
    assert!(!p.check(&read("agent:reader", "docs/a")).is_allowed());
    // The token key survived (the token verifies) and so did its use count.
    let mut r = write("agent:c", "src/x");
    r.context.token = Some(token.encode());
    assert!(p.check(&r).is_allowed());
    assert!(
        !p.check(&r).is_allowed(),
        "two uses spent across the reopen"
    );
    // Changes keep bumping the stored version.
    let v = p.remove_member("group:coders", "group:staff").unwrap();
    drop(p);
    let p = Policy::open(&file, Arc::new(clock)).unwrap();
    assert_eq!(p.version(), v);
    assert!(!p.is_member("agent:c", "group:staff"));
}

#[test]
fn rule_files_round_trip() {
    let (p, _) = policy();
    p.load_rules(RULES).unwrap();
    let text = p.render_rules();
    let again = environment_policy::RuleFile::parse(&text).unwrap();
    assert_eq!(again, p.rules());
    assert_eq!(again.render(), text);
    let busy = r#"
[[rule]]
id = "everything \"quoted\""
effect = "forbid"
principal = "kind:agent"
actions = ["*"]
resource = { program = "git", args = ["push", "--force*", "..."] }
hours = "22:00-06:00"
branch = "release/**"
risk_min = "medium"
when = { operation = "merge", kind = "x" }
advice = "ask a human with role maintainer"

[[rule]]
id = "ep"
effect = "permit"
principal = "service:ci"
actions = ["execute"]
resource = { endpoint = "https://*.example.com:8443/v1/" }
risk_max = "low"

[[rule]]
id = "obj"
effect = "permit"
principal = "*"
actions = ["read"]
resource = { object = "review", key = "**" }
"#;
    let f = environment_policy::RuleFile::parse(busy).unwrap();
    assert_eq!(environment_policy::RuleFile::parse(&f.render()).unwrap(), f);
}

#[test]
fn every_change_bumps_the_version() {
    let (p, _) = policy();
    let mut last = p.version();
    let mut bumped = |v: u64| {
        assert!(v > last, "{v} after {last}");
        last = v;
    };
    bumped(p.load_rules(RULES).unwrap());
    bumped(p.add_member("agent:x", "group:coders").unwrap());
    bumped(p.remove_member("agent:x", "group:coders").unwrap());
    bumped(p.remove_rule("few-reads").unwrap());
    let d = p
        .delegate(Delegation {
            id: String::new(),
            from: "agent:a".into(),
            to: "agent:b".into(),
            actions: vec!["read".into()],
            resources: vec![],
            expires_at: None,
        })
        .unwrap();
    bumped(p.version());
    bumped(p.revoke_delegation(&d.id).unwrap());
    let v = p.version();
    assert_eq!(p.check(&read("agent:a", "x")).policy_version(), v);
    // A no-op is not a change.
    assert_eq!(p.remove_member("agent:x", "group:coders").unwrap(), v);
}
