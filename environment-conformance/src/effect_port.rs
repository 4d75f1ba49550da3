//! Core's effect log port (`environment_core::EffectStore`), in test bodies: what a store keeps,
//! and environments on one store (two processes, or two machines) racing to begin one effect.

use environment_core::{
    ActorId, BeginOutcome, Begun, EffectChange, EffectRecord, EffectState, EffectStore,
    LocalEnvironment, NewEffect,
};

fn new<'a>(key: &'a str, request: &'a [u8], now: i64) -> NewEffect<'a> {
    NewEffect {
        key,
        target: "svc",
        request,
        request_hash: NewEffect::hash_of("svc", request),
        actor: "agent:a",
        now,
    }
}

fn change(r: &EffectRecord, to: EffectState, now: i64) -> EffectChange<'static> {
    EffectChange {
        id: r.id,
        from: r.state,
        to,
        result: None,
        note: None,
        attempt: false,
        now,
    }
}

fn recorded(b: Begun) -> EffectRecord {
    match b {
        Begun::Recorded(r) => r,
        found => panic!("a new key is recorded: {found:?}"),
    }
}

/// Everything the port promises, on a store with no effect yet.
pub fn the_port_behaves(store: &dyn EffectStore) {
    let first = recorded(store.begin(&new("k1", b"one", 10)).unwrap());
    assert_eq!(
        (
            first.key.as_str(),
            first.target.as_str(),
            &first.request[..]
        ),
        ("k1", "svc", &b"one"[..])
    );
    assert_eq!((first.state, first.attempts), (EffectState::InFlight, 1));
    assert_eq!(
        (first.actor.as_str(), first.created_ms, first.updated_ms),
        ("agent:a", 10, 10)
    );

    // A key begun again is found, with whether the request is the same.
    for (request, same) in [(&b"one"[..], true), (&b"two"[..], false)] {
        match store.begin(&new("k1", request, 20)).unwrap() {
            Begun::Found {
                record,
                same_request,
            } => {
                assert_eq!(record, first, "found as it was");
                assert_eq!(same_request, same);
            }
            other => panic!("a key begun again is found: {other:?}"),
        }
    }

    // A change is made only from the state it was decided on.
    let mut done = change(&first, EffectState::Done, 30);
    done.result = Some(b"ok");
    let after = store.change(&done).unwrap().expect("made from in flight");
    assert_eq!(
        (after.state, after.result.as_deref(), after.updated_ms),
        (EffectState::Done, Some(&b"ok"[..]), 30)
    );
    assert_eq!(store.change(&done).unwrap(), None, "no longer in flight");
    let mut gone = change(&first, EffectState::Done, 30);
    gone.id = first.id + 1000;
    assert_eq!(store.change(&gone).unwrap(), None, "no such effect");
    // A note leaves the result as it was.
    let mut undone = change(&after, EffectState::Compensated, 40);
    undone.note = Some("rolled back");
    let undone = store.change(&undone).unwrap().unwrap();
    assert_eq!(
        (undone.result.as_deref(), undone.note.as_deref()),
        (Some(&b"ok"[..]), Some("rolled back"))
    );

    // A failed effect begun again counts an attempt.
    let second = recorded(store.begin(&new("k2", b"x", 50)).unwrap());
    let failed = store
        .change(&change(&second, EffectState::Failed, 60))
        .unwrap()
        .unwrap();
    let mut again = change(&failed, EffectState::InFlight, 70);
    again.attempt = true;
    let again = store.change(&again).unwrap().unwrap();
    assert_eq!((again.state, again.attempts), (EffectState::InFlight, 2));
    let third = recorded(store.begin(&new("k3", b"y", 80)).unwrap());
    store
        .change(&change(&third, EffectState::Unknown, 90))
        .unwrap()
        .unwrap();

    // Found by id and by key; listed oldest first, all or the unfinished ones.
    assert_eq!(store.by_id(first.id).unwrap().unwrap().key, "k1");
    assert_eq!(store.by_key("k2").unwrap().unwrap(), again);
    assert_eq!(store.by_key("nope").unwrap(), None);
    assert_eq!(store.by_id(first.id + 1000).unwrap(), None);
    let keys = |v: Vec<EffectRecord>| v.into_iter().map(|r| r.key).collect::<Vec<_>>();
    assert_eq!(keys(store.list(false).unwrap()), ["k1", "k2", "k3"]);
    assert_eq!(keys(store.list(true).unwrap()), ["k2", "k3"]);
    assert!(first.id < second.id && second.id < third.id, "ids grow");
}

/// Two environments on one effect log begin the same effect at once, round after round, and
/// begin a failed one again at once: one of them is told to perform it each time, the other
/// finds it in flight.
pub fn one_begin_wins(one: &LocalEnvironment, two: &LocalEnvironment) {
    let actor = ActorId::new("agent:racer").unwrap();
    let race = |key: &str| {
        let barrier = std::sync::Barrier::new(2);
        let begin = |env: &LocalEnvironment| {
            barrier.wait();
            env.effect_begin(&actor, key, "deploy", b"v1").unwrap()
        };
        std::thread::scope(|s| {
            let a = s.spawn(|| begin(one));
            let b = s.spawn(|| begin(two));
            [a.join().unwrap(), b.join().unwrap()]
        })
    };
    let news = |outcomes: &[BeginOutcome]| {
        outcomes
            .iter()
            .filter(|o| matches!(o, BeginOutcome::New(_)))
            .count()
    };
    for round in 0..30 {
        let key = format!("race-{round}");
        let outcomes = race(&key);
        assert_eq!(news(&outcomes), 1, "round {round}: {outcomes:?}");
        let id = outcomes[0].record().id;
        assert_eq!(outcomes[1].record().id, id, "one effect");
        one.effect_fail(&actor, id, "try again").unwrap();
        let outcomes = race(&key);
        assert_eq!(
            news(&outcomes),
            1,
            "round {round}, begun again: {outcomes:?}"
        );
        assert_eq!(two.effect(&key).unwrap().unwrap().attempts, 2);
    }
}
