//! Laws the policy must obey whatever the rules: adding a forbid or removing a permit never
//! turns a refusal into an allow, attenuation never widens, revocation propagates down
//! delegation chains.
// Helpers outside #[test] functions panic on purpose: a broken fixture is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use environment_core::Action;
use environment_policy::{
    Delegation, Effect, Outcome, Principal, ResourcePattern, Rule, RuleFile, TokenLimits,
};
use proptest::prelude::*;

proptest! {
    #![proptest_config(config(96))]

    /// 96 worlds × 48 requests.
    #[test]
    fn adding_a_forbid_never_allows_more(
        world in arb_world(16),
        extra in arb_rule(999),
        requests in prop::collection::vec(arb_request(), 48),
    ) {
        let (p, _) = world.build();
        let before: Vec<Outcome> = requests.iter().map(|r| p.evaluate(r).outcome()).collect();
        let forbid = Rule { effect: Effect::Forbid, ..extra };
        let mut forbid = forbid;
        forbid.conditions.approval_from.clear();
        forbid.conditions.quota = None;
        p.add_rule(forbid).unwrap();
        for (r, b) in requests.iter().zip(before) {
            let after = p.evaluate(r).outcome();
            if b != Outcome::Allow {
                prop_assert_ne!(after, Outcome::Allow, "{:?}", r);
            }
            if b == Outcome::Deny {
                prop_assert_eq!(after, Outcome::Deny, "{:?}", r);
            }
        }
    }

    /// 96 worlds × 48 requests.
    #[test]
    fn removing_a_permit_never_allows_more(
        world in arb_world(16),
        pick in any::<prop::sample::Index>(),
        requests in prop::collection::vec(arb_request(), 48),
    ) {
        let (p, _) = world.build();
        let permits: Vec<String> = world.rules.iter().filter(|r| r.effect == Effect::Permit).map(|r| r.id.clone()).collect();
        prop_assume!(!permits.is_empty());
        let before: Vec<Outcome> = requests.iter().map(|r| p.evaluate(r).outcome()).collect();
        p.remove_rule(pick.get(permits.as_slice()).as_str()).unwrap();
        for (r, b) in requests.iter().zip(before) {
            let after = p.evaluate(r).outcome();
            if b == Outcome::Deny {
                prop_assert_eq!(after, Outcome::Deny, "{:?}", r);
            }
        }
    }

    /// 96 worlds × 48 requests: whatever the attenuated token allows, its parent allows.
    #[test]
    fn attenuation_never_widens(
        world in arb_world(16),
        principal in prop::sample::select(&ACTORS[..]),
        paths in prop::option::of(prop::collection::vec(arb_glob(), 1..3)),
        narrower_paths in prop::option::of(prop::collection::vec(arb_glob(), 1..3)),
        actions in prop::option::of(prop::collection::vec(prop::sample::select(&ACTIONS[..]), 1..3)),
        requests in prop::collection::vec(arb_request(), 48),
    ) {
        let (p, _) = world.build();
        let parent = p.issue_token(principal, TokenLimits { paths, ..TokenLimits::default() }).unwrap();
        let child = p.attenuate_token(&parent, principal, TokenLimits {
            paths: narrower_paths,
            actions: actions.map(|v| v.into_iter().map(str::to_owned).collect()),
            ..TokenLimits::default()
        }).unwrap();
        for r in &requests {
            let mut r = r.clone();
            r.actor = actor(principal);
            r.context.token = Some(child.encode());
            let with_child = p.evaluate(&r).outcome();
            r.context.token = Some(parent.encode());
            let with_parent = p.evaluate(&r).outcome();
            r.context.token = None;
            let without = p.evaluate(&r).outcome();
            if with_child == Outcome::Allow {
                prop_assert_eq!(with_parent, Outcome::Allow, "{:?}", r);
            }
            if with_parent == Outcome::Allow {
                prop_assert_eq!(without, Outcome::Allow, "a token never adds rights: {:?}", r);
            }
        }
    }

    /// A chain A → B → … of random length: the end of the chain loses the right as soon as the
    /// head loses it, or any link is revoked.
    #[test]
    fn revocation_propagates_down_the_chain(len in 1usize..=3, cut in 0usize..4, how in 0u8..3) {
        let (p, _) = policy();
        let chain: Vec<String> = (0..=len).map(|i| format!("agent:c{i}")).collect();
        p.add_rule(Rule::permit("head-writes", Principal::parse(&chain[0]).unwrap(), &["write"], ResourcePattern::path("src/**").unwrap())).unwrap();
        p.add_member(&chain[0], "group:heads").unwrap();
        let mut ids = Vec::new();
        for w in chain.windows(2) {
            let d = p.delegate(Delegation {
                id: String::new(),
                from: w[0].clone(),
                to: w[1].clone(),
                actions: vec!["write".into()],
                resources: vec![ResourcePattern::path("src/**").unwrap()],
                expires_at: None,
            }).unwrap();
            ids.push(d.id);
        }
        let tail = chain.last().unwrap();
        let r = write(tail, "src/lib.rs");
        prop_assert_eq!(p.evaluate(&r).outcome(), Outcome::Allow);
        prop_assert_eq!(p.evaluate(&write(tail, "docs/x.md")).outcome(), Outcome::Deny, "narrowed to src/**");
        match how {
            0 => { p.remove_rule("head-writes").unwrap(); }
            1 => { p.revoke_delegation(&ids[cut % ids.len()]).unwrap(); }
            _ => {
                // A forbid on the head binds everyone who acts on its rights.
                p.add_rule(Rule::forbid("head-frozen", Principal::parse("group:heads").unwrap(), &["*"], ResourcePattern::Any)).unwrap();
            }
        }
        // Revoking link i cuts everyone after it; the others lose everything.
        let first_cut = if how == 1 { cut % ids.len() + 1 } else { 0 };
        for (i, who) in chain.iter().enumerate() {
            let want = if i < first_cut { Outcome::Allow } else { Outcome::Deny };
            prop_assert_eq!(p.evaluate(&write(who, "src/lib.rs")).outcome(), want, "{}", who);
        }
    }
}

#[test]
fn delegation_never_exceeds_the_delegator() {
    let (p, _) = policy();
    p.load_rules(
        r#"
        [[rule]]
        id = "lead-reads-src"
        effect = "permit"
        principal = "agent:lead"
        actions = ["read"]
        resource = { path = "src/**" }
        "#,
    )
    .unwrap();
    p.delegate(Delegation {
        id: "all".into(),
        from: "agent:lead".into(),
        to: "agent:sub".into(),
        actions: vec!["*".into()],
        resources: vec![],
        expires_at: None,
    })
    .unwrap();
    assert!(p.evaluate(&read("agent:sub", "src/a.rs")).is_allowed());
    assert!(!p.evaluate(&write("agent:sub", "src/a.rs")).is_allowed());
    assert!(!p.evaluate(&read("agent:sub", "docs/a.md")).is_allowed());
    let d = p.evaluate(&read("agent:sub", "src/a.rs"));
    assert_eq!(d.rule_ids().collect::<Vec<_>>(), ["lead-reads-src"]);
    assert!(
        d.explain(&read("agent:sub", "src/a.rs"))
            .contains("delegation `all`")
    );
}

#[test]
fn delegations_expire() {
    let (p, clock) = policy();
    p.add_rule(Rule::permit(
        "a-reads",
        Principal::parse("agent:a").unwrap(),
        &["read"],
        ResourcePattern::Any,
    ))
    .unwrap();
    p.delegate(Delegation {
        id: "short".into(),
        from: "agent:a".into(),
        to: "agent:b".into(),
        actions: vec!["read".into()],
        resources: vec![],
        expires_at: Some(11 * HOUR),
    })
    .unwrap();
    assert!(p.evaluate(&read("agent:b", "x")).is_allowed());
    clock.advance(HOUR);
    assert!(!p.evaluate(&read("agent:b", "x")).is_allowed());
}

#[test]
fn delegation_depth_is_bounded_and_cycles_refused() {
    let (p, _) = policy();
    let d = |from: &str, to: &str| Delegation {
        id: String::new(),
        from: from.into(),
        to: to.into(),
        actions: vec!["read".into()],
        resources: vec![],
        expires_at: None,
    };
    p.delegate(d("agent:a", "agent:b")).unwrap();
    p.delegate(d("agent:b", "agent:c")).unwrap();
    p.delegate(d("agent:c", "agent:d")).unwrap();
    assert!(
        p.delegate(d("agent:d", "agent:e")).is_err(),
        "a fourth link exceeds the bound"
    );
    assert!(p.delegate(d("agent:c", "agent:a")).is_err(), "a cycle");
    assert!(p.delegate(d("agent:a", "agent:a")).is_err(), "self");
    let _ = RuleFile::default();
    let _ = Action::Read;
}
