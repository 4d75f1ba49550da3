//! Events: subscribers see committed operations; the publisher gets every committed event
//! exactly through the outbox, even across a restart; refused acts emit nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use environment_core::{
    ActRequest, ActorId, EnvError, Event, EventFilter, Intent, Key, KeyPrefix, LocalEnvironment,
    OpFlags, OpId, Options, PublishError, Publisher, Value,
};

#[derive(Default)]
struct Recorder {
    seen: Mutex<Vec<OpId>>,
    fail: Mutex<usize>,
}

impl Publisher for Recorder {
    fn publish(&self, event: &Event) -> Result<(), PublishError> {
        let mut fail = self.fail.lock().unwrap();
        if *fail > 0 {
            *fail -= 1;
            return Err(PublishError {
                event: event.id,
                message: "bus down".into(),
            });
        }
        self.seen.lock().unwrap().push(event.id);
        Ok(())
    }
}

fn wait_for(rec: &Recorder, n: usize) -> Vec<OpId> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let seen = rec.seen.lock().unwrap().clone();
        if seen.len() >= n || Instant::now() > deadline {
            return seen;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn put(env: &LocalEnvironment, actor: &ActorId, key: &str) -> OpId {
    env.act_blocking(
        ActRequest::new(actor.clone(), Intent::edit("x"))
            .put(Key::fs(key).unwrap(), Value::file(key)),
    )
    .unwrap()
    .version
}

#[test]
fn subscribers_get_matching_committed_events_only() {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let a = ActorId::new("agent:a").unwrap();
    let b = ActorId::new("agent:b").unwrap();
    let mut all = env.subscribe(EventFilter::default());
    let mut only_src = env.subscribe(EventFilter {
        prefix: Some("fs:src".parse::<KeyPrefix>().unwrap()),
        ..EventFilter::default()
    });
    let mut only_setup = env.subscribe(EventFilter {
        kind: Some(environment_core::IntentKind::Setup),
        ..EventFilter::default()
    });
    let mut only_b = env.subscribe(EventFilter {
        actor: Some(b.clone()),
        ..EventFilter::default()
    });
    let base = env.head("main").unwrap();
    let v1 = put(&env, &a, "src/x");
    let v2 = put(&env, &b, "docs/y");
    // A refused act (stale, overlapping) emits nothing.
    let stale = env.act_blocking(
        ActRequest::new(a.clone(), Intent::edit("stale"))
            .base(base)
            .put(Key::fs("src/x").unwrap(), Value::file("z")),
    );
    assert!(matches!(stale, Err(EnvError::Conflict(_))));
    assert_eq!(all.try_recv().map(|e| e.id), Some(v1));
    assert_eq!(all.try_recv().map(|e| e.id), Some(v2));
    assert!(all.try_recv().is_none());
    assert_eq!(only_src.try_recv().map(|e| e.id), Some(v1));
    assert!(only_src.try_recv().is_none());
    assert!(only_setup.try_recv().is_none());
    assert_eq!(only_b.try_recv().map(|e| e.id), Some(v2));
    assert!(only_b.try_recv().is_none());
}

#[test]
fn publisher_gets_every_event_despite_failures_and_restarts() {
    let home = tempfile::tempdir().unwrap();
    let rec = Arc::new(Recorder::default());
    *rec.fail.lock().unwrap() = 3;
    let actor = ActorId::new("agent:a").unwrap();
    let mut expected = vec![];
    {
        let env = LocalEnvironment::open(
            home.path(),
            Options {
                publisher: Some(rec.clone()),
                ..Options::default()
            },
        )
        .unwrap();
        for i in 0..5 {
            expected.push(put(&env, &actor, &format!("f{i}")));
        }
        // The creation of the environment is the first event, then the five acts.
        let seen = wait_for(&rec, 6);
        assert_eq!(seen.len(), 6);
        assert_eq!(
            seen[seen.len() - 5..],
            expected[..],
            "in commit order, after retries"
        );
    }
    // Commit with a publisher that is down, close, reopen with a working one: delivered.
    let down = Arc::new(Recorder::default());
    *down.fail.lock().unwrap() = usize::MAX;
    {
        let env = LocalEnvironment::open(
            home.path(),
            Options {
                publisher: Some(down.clone()),
                ..Options::default()
            },
        )
        .unwrap();
        expected.push(put(&env, &actor, "late"));
    }
    let rec2 = Arc::new(Recorder::default());
    let env = LocalEnvironment::open(
        home.path(),
        Options {
            publisher: Some(rec2.clone()),
            ..Options::default()
        },
    )
    .unwrap();
    let seen = wait_for(&rec2, 1);
    assert!(
        seen.contains(expected.last().unwrap()),
        "the pending event was delivered after the restart"
    );
    assert!(down.seen.lock().unwrap().is_empty());
    let op = env.op(expected.last().unwrap()).unwrap();
    assert!(!op.flags.contains(OpFlags::ROLLBACK));
}
