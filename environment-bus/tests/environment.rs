//! The bus in the environment's own database, fed by the environment's `Publisher` port: every
//! committed operation's event arrives once, in commit order, also across a reopen that may
//! offer events again.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use environment_bus::{Bus, BusConfig, EventPublisher, GroupOptions};
use environment_core::{
    ActRequest, ActorId, Event, Intent, Key, LocalEnvironment, OpId, Options, Value,
};

/// Claims and acks events until `n` arrived or a generous deadline passed (the outbox drains
/// on its own thread).
fn collect(bus: &Bus, n: usize) -> Vec<OpId> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while seen.len() < n && Instant::now() < deadline {
        let leases = bus
            .claim("watchers", "w", 10, Duration::from_secs(60))
            .wait()
            .unwrap();
        if leases.is_empty() {
            std::thread::sleep(Duration::from_millis(5));
        }
        for l in leases {
            let e: Event = serde_json::from_slice(&l.message.payload).unwrap();
            seen.push(e.id);
            bus.ack(&l.receipt).wait().unwrap();
        }
    }
    seen
}

fn put(env: &LocalEnvironment, key: &str) -> OpId {
    let actor = ActorId::new("agent:a").unwrap();
    env.act_blocking(
        ActRequest::new(actor, Intent::edit("x")).put(Key::fs(key).unwrap(), Value::file(key)),
    )
    .unwrap()
    .version
}

#[test]
fn committed_operations_reach_the_bus_in_the_environments_own_database() {
    let home = tempfile::tempdir().unwrap();
    // The environment creates its database; the bus then adds its `bus_*` tables to it.
    drop(LocalEnvironment::open(home.path(), Options::default()).unwrap());
    let bus = Bus::open(home.path().join("env.db"), BusConfig::default()).unwrap();
    bus.create_topic("env.ops").wait().unwrap();
    bus.create_group("watchers", &["env.ops"], GroupOptions::default())
        .wait()
        .unwrap();
    let options = || Options {
        publisher: Some(Arc::new(EventPublisher::new(bus.clone(), "env.ops"))),
        ..Options::default()
    };

    let mut expected = Vec::new();
    {
        let env = LocalEnvironment::open(home.path(), options()).unwrap();
        for i in 0..5 {
            expected.push(put(&env, &format!("f{i}")));
        }
        let seen = collect(&bus, 5);
        assert_eq!(seen, expected, "every act's event once, in commit order");
    }
    // Reopen: whatever the outbox offers again is absorbed by the op-id dedup.
    let env = LocalEnvironment::open(home.path(), options()).unwrap();
    expected.push(put(&env, "g"));
    let seen = collect(&bus, 1);
    assert_eq!(seen, expected[5..]);
    drop(env);
    assert!(
        bus.claim("watchers", "w", 10, Duration::from_secs(60))
            .wait()
            .unwrap()
            .is_empty()
    );
}
