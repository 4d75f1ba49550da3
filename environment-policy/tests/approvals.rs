//! Conditions that need state or time: approvals, quotas, time windows; and explanations.
// Helpers outside #[test] functions panic on purpose: a broken fixture is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use environment_core::{Action, AttrValue, Resource, Risk};
use environment_policy::{ApprovalState, GrantScope, Outcome, PolicyError, Reason};

const RULES: &str = r#"
[schema]
actions = ["deploy"]
attributes = { ticket = "int" }

[[rule]]
id = "deploy-needs-maintainer"
effect = "permit"
principal = "kind:agent"
actions = ["deploy"]
resource = { environment = true }
approval_from = ["role:maintainer"]

[[rule]]
id = "office-hours"
effect = "permit"
principal = "kind:agent"
actions = ["write"]
resource = { path = "src/**" }
hours = "09:00-17:00"
risk_max = "medium"

[[rule]]
id = "three-posts"
effect = "permit"
principal = "kind:agent"
actions = ["execute"]
resource = { endpoint = "https://api.example.com/posts" }
quota = { count = 3, window_secs = 3600 }

[[rule]]
id = "ticketed-merges"
effect = "permit"
principal = "kind:agent"
actions = ["write"]
resource = { branch = "main" }
when = { operation = "merge", ticket = 7 }

[[rule]]
id = "secrets-readonly"
effect = "forbid"
principal = "*"
actions = ["write", "delete"]
resource = { path = "secrets/**" }
advice = "ask a human with role maintainer"
"#;

fn setup() -> (environment_policy::Policy, environment_core::ManualClock) {
    let (p, clock) = policy();
    p.load_rules(RULES).unwrap();
    p.add_member("human:ann", "role:maintainer").unwrap();
    (p, clock)
}

fn deploy(who: &str) -> environment_core::AccessRequest {
    req(who, Action::Custom("deploy".into()), Resource::Environment)
}

#[test]
fn a_granted_approval_lets_exactly_that_request_through_once() {
    let (p, _) = setup();
    let d = p.check(&deploy("agent:a"));
    assert_eq!(d.outcome(), Outcome::NeedsApproval);
    assert_eq!(d.approvers(), ["role:maintainer"]);
    assert!(d.explain(&deploy("agent:a")).contains("role:maintainer"));
    let a = p.request_approval(&deploy("agent:a")).unwrap();
    assert_eq!(
        p.request_approval(&deploy("agent:a")).unwrap().id,
        a.id,
        "one pending request per action"
    );
    assert!(matches!(
        p.grant(&a.id, "agent:a", GrantScope::once()),
        Err(PolicyError::NotAnApprover { .. })
    ));
    assert!(matches!(
        p.grant(&a.id, "human:bob", GrantScope::once()),
        Err(PolicyError::NotAnApprover { .. })
    ));
    p.grant(&a.id, "human:ann", GrantScope::once()).unwrap();
    assert!(matches!(
        p.grant(&a.id, "human:ann", GrantScope::once()),
        Err(PolicyError::ApprovalNotPending { .. })
    ));
    let mut with = deploy("agent:a");
    with.context.approval = Some(a.id.clone());
    // Another actor cannot ride on it.
    let mut other = deploy("agent:b");
    other.context.approval = Some(a.id.clone());
    assert_eq!(p.check(&other).outcome(), Outcome::NeedsApproval);
    let ok = p.check(&with);
    assert!(ok.is_allowed());
    assert_eq!(*ok.reason(), Reason::Approved);
    assert_eq!(
        p.check(&with).outcome(),
        Outcome::NeedsApproval,
        "used once"
    );
}

#[test]
fn grants_can_carry_uses_and_expiry_and_rejections_stick() {
    let (p, clock) = setup();
    let a = p.request_approval(&deploy("agent:a")).unwrap();
    p.grant(
        &a.id,
        "human:ann",
        GrantScope {
            uses: 5,
            expires_at: Some(11 * HOUR),
        },
    )
    .unwrap();
    let mut with = deploy("agent:a");
    with.context.approval = Some(a.id.clone());
    assert!(p.check(&with).is_allowed());
    assert!(p.check(&with).is_allowed());
    clock.advance(HOUR);
    assert!(!p.check(&with).is_allowed(), "expired");
    let b = p.request_approval(&deploy("agent:b")).unwrap();
    let rejected = p.reject(&b.id, "human:ann").unwrap();
    assert!(matches!(rejected.state, ApprovalState::Rejected { .. }));
    let mut with = deploy("agent:b");
    with.context.approval = Some(b.id);
    assert!(!p.check(&with).is_allowed());
    assert_eq!(p.approvals().len(), 2);
}

#[test]
fn time_windows_and_risk_apply() {
    let (p, clock) = setup();
    clock.set(10 * HOUR);
    assert!(p.check(&write("agent:a", "src/x.rs")).is_allowed());
    let mut risky = write("agent:a", "src/x.rs");
    risky.context.risk = Risk::High;
    assert!(!p.check(&risky).is_allowed());
    clock.set(20 * HOUR);
    let d = p.check(&write("agent:a", "src/x.rs"));
    assert_eq!(d.outcome(), Outcome::Deny);
    let text = d.explain(&write("agent:a", "src/x.rs"));
    assert!(
        text.contains("rule `office-hours` permits") && text.contains("between 09:00-17:00 UTC"),
        "{text}"
    );
}

#[test]
fn quotas_count_per_window() {
    let (p, clock) = setup();
    let post = || {
        req(
            "agent:a",
            Action::Execute,
            Resource::Service("https://api.example.com/posts?x=1".into()),
        )
    };
    for _ in 0..3 {
        assert!(p.check(&post()).is_allowed());
    }
    // Dry runs see the quota but do not spend it.
    assert!(!p.evaluate(&post()).is_allowed());
    let d = p.check(&post());
    assert!(matches!(d.reason(), Reason::QuotaExhausted { .. }));
    assert!(
        p.check(&req(
            "agent:b",
            Action::Execute,
            Resource::Service("https://api.example.com/posts".into())
        ))
        .is_allowed(),
        "per actor"
    );
    clock.advance(HOUR);
    assert!(p.check(&post()).is_allowed(), "a new window");
    assert!(
        !p.check(&req(
            "agent:a",
            Action::Execute,
            Resource::Service("https://api.example.com/postsx".into())
        ))
        .is_allowed()
    );
}

#[test]
fn context_attributes_are_tested() {
    let (p, _) = setup();
    let mut merge = req("agent:a", Action::Write, Resource::Branch("main".into()));
    assert!(!p.check(&merge).is_allowed());
    merge
        .context
        .attrs
        .insert("operation".into(), AttrValue::Str("merge".into()));
    merge
        .context
        .attrs
        .insert("ticket".into(), AttrValue::Int(7));
    assert!(p.check(&merge).is_allowed());
    merge
        .context
        .attrs
        .insert("ticket".into(), AttrValue::Int(8));
    assert!(!p.check(&merge).is_allowed());
}

#[test]
fn explanations_name_the_rule_the_match_and_what_to_do() {
    let (p, _) = setup();
    let r = write("agent:a", "secrets/key.pem");
    let d = p.check(&r);
    assert_eq!(
        d.explain(&r),
        format!(
            "Denied by rule `secrets-readonly`: `secrets/key.pem` matches `secrets/**` (policy v{}). Next: do not retry; ask a human with role maintainer.",
            p.version()
        )
    );
    let r = read("agent:a", "elsewhere");
    let text = p.check(&r).explain(&r);
    assert!(
        text.contains("no rule permits") && text.contains("default deny"),
        "{text}"
    );
}

mod quota_model {
    use std::collections::HashMap;
    use std::sync::Arc;

    use environment_core::{Action, Clock, ManualClock, Resource};
    use environment_policy::Policy;
    use proptest::prelude::*;

    use super::common::{config, req};

    #[derive(Clone, Debug)]
    enum Step {
        Check(usize),
        DryRun(usize),
        Advance(i64),
        Reopen,
    }

    fn arb_steps() -> impl Strategy<Value = Vec<Step>> {
        prop::collection::vec(
            prop_oneof![
                6 => (0..3usize).prop_map(Step::Check),
                1 => (0..3usize).prop_map(Step::DryRun),
                2 => (0..90_000i64).prop_map(Step::Advance),
                1 => Just(Step::Reopen),
            ],
            1..60,
        )
    }

    proptest! {
        #![proptest_config(config(48))]

        /// A durable per-actor quota behaves like a counter per fixed window, across reopens;
        /// dry runs never spend it.
        #[test]
        fn quotas_match_a_counter_model(count in 1u32..4, window_secs in 1u64..120, steps in arb_steps()) {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("p.db");
            let clock = ManualClock::new(1_000_000);
            let open = || Policy::open(&file, Arc::new(clock.clone())).unwrap();
            let mut p = open();
            p.load_rules(&format!(
                "[[rule]]\nid = \"q\"\neffect = \"permit\"\nprincipal = \"*\"\nactions = [\"execute\"]\nresource = {{ service = \"mail\" }}\nquota = {{ count = {count}, window_secs = {window_secs} }}\n"
            )).unwrap();
            let mut used: HashMap<(usize, i64), u32> = HashMap::new();
            let window = |now: i64| now.div_euclid(window_secs as i64 * 1000);
            let request = |a: usize| req(&format!("agent:q{a}"), Action::Execute, Resource::Service("mail".into()));
            for s in steps {
                match s {
                    Step::Check(a) => {
                        let k = (a, window(clock.now_ms()));
                        let n = used.entry(k).or_insert(0);
                        let want = *n < count;
                        if want {
                            *n += 1;
                        }
                        prop_assert_eq!(p.check(&request(a)).is_allowed(), want);
                    }
                    Step::DryRun(a) => {
                        let n = used.get(&(a, window(clock.now_ms()))).copied().unwrap_or(0);
                        prop_assert_eq!(p.evaluate(&request(a)).is_allowed(), n < count);
                    }
                    Step::Advance(ms) => clock.advance(ms),
                    Step::Reopen => {
                        drop(p);
                        p = open();
                    }
                }
            }
        }
    }
}
