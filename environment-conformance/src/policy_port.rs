//! Core's policy storage port (`environment_core::PolicyStore`), in test bodies that take a
//! way to open handles on one store: what one handle writes the others read, and a write made
//! on a state another handle moved is refused and changes nothing.

use environment_core::policy_store::{
    PolicyChange, PolicyRecord, PolicyRecords, PolicyStore, QuotaCount, Uses, Written,
};
use environment_core::{AccessRequest, Action, ActorId, Context, ManualClock, Resource};
use environment_policy::{GrantScope, Policy, Principal, ResourcePattern, Rule};

/// Opens one more handle on the store under test.
pub type Open<'a> = &'a dyn Fn() -> Box<dyn PolicyStore>;

fn record(id: &str, body: &str) -> PolicyRecord {
    PolicyRecord {
        id: id.to_owned(),
        body: body.to_owned(),
    }
}

fn quota(actor: &str, window: i64, used: u32) -> QuotaCount {
    QuotaCount {
        rule: "q".to_owned(),
        actor: actor.to_owned(),
        window,
        used,
    }
}

fn pair(m: &str, g: &str) -> (String, String) {
    (m.to_owned(), g.to_owned())
}

fn loaded(s: &mut dyn PolicyStore) -> PolicyRecords {
    let mut r = s.load().unwrap().1;
    r.relations.sort();
    r.quotas.sort_by(|a, b| a.actor.cmp(&b.actor));
    r.token_uses.sort();
    r
}

fn done(w: Written) {
    assert!(matches!(w, Written::Done { .. }), "{w:?}");
}

/// Everything the port promises, on two handles of one new, empty store.
pub fn the_port_behaves(open: Open<'_>) {
    let mut one = open();
    let mut two = open();

    // A new store: nothing in it, one token key for every handle.
    let fresh = loaded(&mut *one);
    assert_eq!(
        (fresh.version, &fresh.rules, fresh.relations.len()),
        (0, &None, 0)
    );
    assert_eq!(loaded(&mut *two).token_key, fresh.token_key);
    assert_ne!(fresh.token_key, [0; 32]);

    // Each kind of change makes the next version, and the other handle reads it.
    let seen_by_two = two.generation().unwrap();
    done(
        one.change(0, &PolicyChange::Rules("rules v1".into()))
            .unwrap(),
    );
    assert_ne!(
        two.generation().unwrap(),
        seen_by_two,
        "another handle's write moves the generation"
    );
    let changes = [
        PolicyChange::AddRelations(vec![pair("agent:a", "group:g"), pair("group:g", "role:r")]),
        PolicyChange::AddRelations(vec![pair("agent:a", "group:g")]),
        PolicyChange::RemoveRelation("group:g".into(), "role:r".into()),
        PolicyChange::PutDelegation(record("d2", "second")),
        PolicyChange::PutDelegation(record("d1", "first")),
        PolicyChange::PutDelegation(record("d3", "third")),
        PolicyChange::DeleteDelegation("d3".into()),
    ];
    for (i, c) in changes.iter().enumerate() {
        done(two.change(1 + i as u64, c).unwrap());
    }
    let now = loaded(&mut *one);
    assert_eq!(now.version, 1 + changes.len() as u64);
    assert_eq!(now.rules.as_deref(), Some("rules v1"));
    assert_eq!(now.relations, vec![pair("agent:a", "group:g")]);
    assert_eq!(
        now.delegations,
        vec![record("d2", "second"), record("d1", "first")],
        "delegations in the order they were made"
    );

    // A change made on a version that moved is refused, and changes nothing.
    let before = loaded(&mut *one);
    for stale in [0, 1, before.version + 1] {
        let w = one
            .change(stale, &PolicyChange::Rules("lost".into()))
            .unwrap();
        assert_eq!(w, Written::Stale, "a change on version {stale}");
    }
    assert_eq!(loaded(&mut *two), before);

    // A write with nobody else in between leaves the writer's generation where it says.
    let g = one.generation().unwrap();
    match one
        .change(before.version, &PolicyChange::Rules("rules v2".into()))
        .unwrap()
    {
        Written::Done { before, after } => {
            assert_eq!(before, g, "nobody wrote in between");
            assert_eq!(one.generation().unwrap(), after);
        }
        Written::Stale => panic!("a change on the current version is refused"),
    }

    approvals_behave(&mut *one, &mut *two);
    spends_behave(&mut *one, &mut *two);
}

/// Approvals: a new one only once by id, a decided one only over the record it was read as.
fn approvals_behave(one: &mut dyn PolicyStore, two: &mut dyn PolicyStore) {
    done(one.put_approval(None, &record("a1", "pending")).unwrap());
    assert_eq!(
        two.put_approval(None, &record("a1", "filed again"))
            .unwrap(),
        Written::Stale,
        "an id already filed"
    );
    done(
        two.put_approval(Some("pending"), &record("a1", "granted"))
            .unwrap(),
    );
    assert_eq!(
        one.put_approval(Some("pending"), &record("a1", "rejected"))
            .unwrap(),
        Written::Stale,
        "decided on a record another handle replaced"
    );
    assert_eq!(
        one.put_approval(Some("x"), &record("nobody", "y")).unwrap(),
        Written::Stale,
        "a record that is not there"
    );
    done(one.put_approval(None, &record("a0", "pending")).unwrap());
    assert_eq!(
        loaded(one).approvals,
        vec![record("a1", "granted"), record("a0", "pending")],
        "approvals in the order they were filed"
    );
}

/// Spends: every counter as read, or nothing of them.
fn spends_behave(one: &mut dyn PolicyStore, two: &mut dyn PolicyStore) {
    let first = Uses {
        quotas: vec![(None, quota("agent:a", 1000, 1))],
        approvals: vec![("granted".into(), record("a1", "used"))],
        tokens: vec![("t".into(), 0, 1)],
    };
    done(one.spend(&first).unwrap());
    let after_first = loaded(two);
    assert_eq!(after_first.quotas, vec![quota("agent:a", 1000, 1)]);
    assert_eq!(after_first.token_uses, vec![("t".to_owned(), 1)]);
    assert!(after_first.approvals.contains(&record("a1", "used")));

    // Each counter that moved refuses the whole spend, whichever it is.
    let fine_quota = (Some(quota("agent:a", 1000, 1)), quota("agent:a", 1000, 2));
    let fine_token = ("t".to_owned(), 1, 2);
    let stale = [
        // A count made as if there were none.
        Uses {
            quotas: vec![
                (None, quota("agent:b", 1000, 1)),
                (None, quota("agent:a", 1000, 1)),
            ],
            tokens: vec![],
            approvals: vec![],
        },
        // A count read in another window.
        Uses {
            quotas: vec![(Some(quota("agent:a", 0, 1)), quota("agent:a", 2000, 1))],
            tokens: vec![],
            approvals: vec![],
        },
        // A token use read before the last.
        Uses {
            quotas: vec![fine_quota.clone()],
            tokens: vec![("t".into(), 0, 1)],
            approvals: vec![],
        },
        // An approval read before its last use.
        Uses {
            quotas: vec![fine_quota.clone()],
            tokens: vec![fine_token.clone()],
            approvals: vec![("granted".into(), record("a1", "used again"))],
        },
    ];
    for (i, uses) in stale.iter().enumerate() {
        assert_eq!(two.spend(uses).unwrap(), Written::Stale, "stale spend {i}");
        assert_eq!(loaded(one), after_first, "stale spend {i} wrote something");
    }

    // On the counters as they are, the spend goes through: a new window replaces the old.
    done(
        two.spend(&Uses {
            quotas: vec![(Some(quota("agent:a", 1000, 1)), quota("agent:a", 2000, 1))],
            approvals: vec![("used".into(), record("a1", "used up"))],
            tokens: vec![fine_token],
        })
        .unwrap(),
    );
    let last = loaded(one);
    assert_eq!(last.quotas, vec![quota("agent:a", 2000, 1)]);
    assert_eq!(last.token_uses, vec![("t".to_owned(), 2)]);
    assert!(last.approvals.contains(&record("a1", "used up")));
}

const RACED: &str = r#"
[schema]
actions = ["deploy"]

[[rule]]
id = "deploys-need-ann"
effect = "permit"
principal = "agent:a"
actions = ["deploy"]
resource = { environment = true }
approval_from = ["human:ann"]

[[rule]]
id = "one-post-an-hour"
effect = "permit"
principal = "agent:a"
actions = ["execute"]
resource = { endpoint = "https://api.example.com/posts" }
quota = { count = 1, window_secs = 3600 }
"#;

/// Two policies on one store (two machines, or two processes on one file) race for the last
/// use of a quota and of an approval granted once, round after round: exactly one of them has
/// it each time. `clock` is both policies' clock.
pub fn the_last_use_is_had_once(one: &Policy, two: &Policy, clock: &ManualClock) {
    const HOUR: i64 = 3_600_000;
    one.load_rules(RACED).unwrap();
    let ask = |action: Action, resource: Resource| AccessRequest {
        actor: ActorId::new("agent:a").unwrap(),
        action,
        resource,
        context: Context::default(),
    };
    let post = ask(
        Action::Execute,
        Resource::Service("https://api.example.com/posts".into()),
    );
    let deploy = ask(Action::Custom("deploy".into()), Resource::Environment);
    let rounds = 60;
    let mut doubled = 0;
    let race = |what: &AccessRequest| {
        let barrier = std::sync::Barrier::new(2);
        let had = |p: &Policy| {
            barrier.wait();
            p.check(what).is_allowed()
        };
        std::thread::scope(|s| {
            let a = s.spawn(|| had(one));
            let b = s.spawn(|| had(two));
            (a.join().unwrap(), b.join().unwrap())
        })
    };
    for round in 0..rounds {
        // A quota of one use an hour: a new hour each round.
        clock.advance(HOUR);
        let (a, b) = race(&post);
        assert!(a || b, "round {round}: one of them has the quota's use");
        doubled += usize::from(a && b);
        // An approval granted for one use.
        let filed = one.request_approval(&deploy).unwrap();
        two.grant(&filed.id, "human:ann", GrantScope::once())
            .unwrap();
        let mut with = deploy.clone();
        with.context.approval = Some(filed.id.clone());
        let (a, b) = race(&with);
        assert!(a || b, "round {round}: one of them has the approval's use");
        doubled += usize::from(a && b);
    }
    assert_eq!(
        doubled,
        0,
        "a last use was had twice in {doubled} of {} races",
        2 * rounds
    );
}

/// The work of a writer that is killed mid-way: small changes without end, each one version
/// (a rule, a group in a group, an actor in a group), named after `tag` so that writers never
/// collide.
pub fn change_until_killed(p: &Policy, tag: &str) {
    for i in 0u64.. {
        let group = format!("group:g{}", i % 7);
        if i % 10 == 9 {
            let r = Rule::permit(
                &format!("r{tag}-{i}"),
                Principal::parse(&group).unwrap(),
                &["read"],
                ResourcePattern::path(&format!("p{i}/**")).unwrap(),
            );
            p.add_rule(r).unwrap();
        } else if i % 10 == 4 {
            p.add_member(&format!("group:g{tag}-{i}"), &group).unwrap();
        } else {
            p.add_member(&format!("agent:a{tag}-{i}"), &group).unwrap();
        }
    }
}

/// What holds once writers were killed: every change kept is whole and counted once (the
/// version is exactly the relations and rules that survived; a lost update between two
/// writers would count a version twice), the closure agrees with the relations, and the store
/// takes a change again. Returns the version after that change.
pub fn whole_after_kills(p: &Policy, round: u64) -> u64 {
    let relations = p.relations();
    let rules = p.rules().rules;
    assert_eq!(
        p.version() as usize,
        relations.len() + rules.len(),
        "round {round}: every kept change is whole, and only kept changes counted"
    );
    for (m, g) in &relations {
        assert!(p.is_member(m, g), "{m} in {g}");
    }
    p.add_member(&format!("agent:after-{round}"), "group:g0")
        .unwrap()
}
