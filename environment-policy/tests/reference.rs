//! The engine against a naive reference evaluator, on random rule sets, relation graphs,
//! delegations, tokens and requests.
// Helpers outside #[test] functions panic on purpose: a broken fixture is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::reference::Model;
use common::*;
use environment_policy::{Outcome, Reason, TokenLimits};
use proptest::prelude::*;

fn arb_limits() -> impl Strategy<Value = TokenLimits> {
    (
        prop::option::weighted(
            0.4,
            prop::collection::vec(prop::sample::select(&ACTIONS[..]), 1..3),
        ),
        prop::option::weighted(0.5, prop::collection::vec(arb_glob(), 1..3)),
        prop::option::weighted(
            0.2,
            prop::collection::vec(prop::sample::select(&["cargo", "g*"][..]), 1..2),
        ),
        prop::option::weighted(
            0.2,
            prop::sample::select(&[5 * HOUR, 15 * HOUR, 25 * HOUR][..]),
        ),
        prop::option::weighted(0.2, prop::sample::select(&ACTORS[..])),
    )
        .prop_map(
            |(actions, paths, programs, expires_at, bearer)| TokenLimits {
                actions: actions.map(|v| v.into_iter().map(str::to_owned).collect()),
                paths,
                programs: programs.map(|v| v.into_iter().map(str::to_owned).collect()),
                expires_at,
                bearer: bearer.map(str::to_owned),
                ..TokenLimits::default()
            },
        )
}

proptest! {
    #![proptest_config(config(256))]

    /// 256 worlds × 64 requests: every decision agrees with the reference, and a forbid-decided
    /// deny names only forbids the reference also finds applicable.
    #[test]
    fn engine_agrees_with_reference(world in arb_world(24), requests in prop::collection::vec(arb_request(), 64)) {
        let (p, clock) = world.build();
        let model = Model::of(&p, clock_now(&clock));
        for r in &requests {
            let d = p.evaluate(r);
            let want = model.decide(r.actor.as_str(), r, 0);
            prop_assert_eq!(d.outcome(), want, "request {:?}\nrules:\n{}\nrelations {:?}\ndelegations {:?}", r, p.render_rules(), model.relations, model.delegations);
            if *d.reason() == Reason::Forbidden {
                let forbids = model.forbids(r.actor.as_str(), r);
                for id in d.rule_ids() {
                    prop_assert!(forbids.iter().any(|f| f == id), "rule {} is not an applicable forbid", id);
                }
            }
            prop_assert_eq!(d.policy_version(), p.version());
        }
    }

    /// 128 worlds × 64 requests carrying a (possibly attenuated) token.
    #[test]
    fn tokens_agree_with_reference(
        world in arb_world(12),
        principal in prop::sample::select(&ACTORS[..]),
        first in arb_limits(),
        second in prop::option::of(arb_limits()),
        requests in prop::collection::vec((arb_request(), prop::bool::weighted(0.7)), 64),
    ) {
        let (p, clock) = world.build();
        let model = Model::of(&p, clock_now(&clock));
        let Ok(mut token) = p.issue_token(principal, first) else { return Ok(()); };
        if let Some(limits) = second {
            let bearer = token.bearer().to_owned();
            // Attenuating an expired token is refused; the original stays in play.
            if let Ok(t) = p.attenuate_token(&token, &bearer, limits) {
                token = t;
            }
        }
        let text = token.encode();
        for (r, by_bearer) in &requests {
            let mut r = r.clone();
            if *by_bearer {
                r.actor = actor(token.bearer());
            }
            r.context.token = Some(text.clone());
            let got = p.evaluate(&r).outcome();
            let want = model.decide_with_token(&r, &token);
            prop_assert_eq!(got, want, "request {:?} token {:?}\nrules:\n{}", r, token, p.render_rules());
        }
    }
}

fn clock_now(c: &environment_core::ManualClock) -> i64 {
    use environment_core::Clock;
    c.now_ms()
}

/// A hand-written world the reference and the engine must also agree on, including groups nested
/// several levels and a delegation chain.
#[test]
fn nested_groups_and_chains_agree() {
    let (p, clock) = policy();
    p.load_rules(
        r#"
        [[rule]]
        id = "top-reads"
        effect = "permit"
        principal = "role:r1"
        actions = ["read"]
        resource = { path = "src/**" }
        "#,
    )
    .unwrap();
    for (m, g) in [
        ("agent:a0", "group:g0"),
        ("group:g0", "group:g1"),
        ("group:g1", "group:g2"),
        ("group:g2", "role:r0"),
        ("role:r0", "role:r1"),
    ] {
        p.add_member(m, g).unwrap();
    }
    let model = Model::of(&p, clock_now(&clock));
    for who in ACTORS {
        let r = read(who, "src/a/b.rs");
        assert_eq!(p.evaluate(&r).outcome(), model.decide(who, &r, 0), "{who}");
    }
    assert_eq!(
        p.evaluate(&read("agent:a0", "src/a/b.rs")).outcome(),
        Outcome::Allow
    );
}

/// One change to the membership graph.
#[derive(Clone, Debug)]
enum Change {
    Add(usize, usize),
    Remove(usize, usize),
}

fn arb_changes() -> impl Strategy<Value = Vec<Change>> {
    let n = ACTORS.len() + GROUPS.len();
    prop::collection::vec(
        prop_oneof![
            3 => (0..n, 0..GROUPS.len()).prop_map(|(m, g)| Change::Add(m, g)),
            1 => (0..n, 0..GROUPS.len()).prop_map(|(m, g)| Change::Remove(m, g)),
        ],
        1..40,
    )
}

proptest! {
    #![proptest_config(config(128))]

    /// The closure kept on write agrees with a walk of the stored relations after every add and
    /// remove (128 sequences of up to 40 changes, each followed by 50 membership questions), and
    /// an add is refused as a cycle exactly when the group is already inside the member.
    #[test]
    fn closure_agrees_with_a_graph_walk(changes in arb_changes()) {
        let (p, _) = policy();
        let names: Vec<&str> = ACTORS.iter().chain(GROUPS.iter()).copied().collect();
        for c in changes {
            let before = Model { rules: vec![], relations: p.relations(), delegations: vec![], now: 0 };
            match c {
                Change::Add(m, g) => {
                    let (m, g) = (names[m], GROUPS[g]);
                    let cycle = m == g || before.groups(g).contains(m);
                    let r = p.add_member(m, g);
                    prop_assert_eq!(r.is_err(), cycle, "{} in {}: {:?}", m, g, r);
                }
                Change::Remove(m, g) => {
                    p.remove_member(names[m], GROUPS[g]).unwrap();
                }
            }
            let model = Model { rules: vec![], relations: p.relations(), delegations: vec![], now: 0 };
            for who in &names {
                let groups = model.groups(who);
                prop_assert_eq!(p.groups_of(who), groups.iter().cloned().collect::<Vec<_>>());
                for g in GROUPS {
                    prop_assert_eq!(p.is_member(who, g), *who == g || groups.contains(g), "{} in {}", who, g);
                }
            }
        }
    }
}
