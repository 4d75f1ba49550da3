//! The documented behaviours one by one, through the public API.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use environment_bus::{
    Bus, BusConfig, BusError, DeadCause, DeliveryStatus, EventPublisher, GroupOptions, Headers,
    NewMessage, PublishOptions,
};
use environment_core::{
    ActorId, ChangeSummary, Clock, Event, Hash, Intent, IntentKind, ManualClock, OpFlags, OpId,
    Publisher,
};

const LEASE: Duration = Duration::from_secs(30);

fn setup() -> (tempfile::TempDir, ManualClock, Bus) {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let mut config = BusConfig::with_clock(Arc::new(clock.clone()));
    config.auto_purge = None;
    let bus = Bus::open(dir.path().join("bus.db"), config).unwrap();
    bus.create_topic("tasks").wait().unwrap();
    bus.create_group("workers", &["tasks"], GroupOptions { max_attempts: 3 })
        .wait()
        .unwrap();
    (dir, clock, bus)
}

fn publish(bus: &Bus, payload: &str, o: PublishOptions) -> environment_bus::MessageId {
    bus.publish("tasks", payload.as_bytes().to_vec(), o)
        .wait()
        .unwrap()
        .id
}

#[test]
fn every_group_sees_every_message_and_consumers_compete() {
    let (_d, _c, bus) = setup();
    bus.create_group("auditors", &["tasks"], GroupOptions::default())
        .wait()
        .unwrap();
    for i in 0..4 {
        publish(&bus, &format!("m{i}"), PublishOptions::default());
    }
    let a = bus.claim("workers", "a", 2, LEASE).wait().unwrap();
    let b = bus.claim("workers", "b", 10, LEASE).wait().unwrap();
    assert_eq!((a.len(), b.len()), (2, 2));
    assert!(
        a.iter()
            .all(|l| b.iter().all(|m| m.message.id != l.message.id))
    );
    let audit = bus.claim("auditors", "x", 10, LEASE).wait().unwrap();
    assert_eq!(audit.len(), 4);
}

#[test]
fn dedup_holds_after_ack_and_expires_with_its_window() {
    let (_d, clock, bus) = setup();
    let o = PublishOptions::default().dedup_id("op-1");
    let first = bus
        .publish("tasks", b"x".to_vec(), o.clone())
        .wait()
        .unwrap();
    let l = bus.claim("workers", "a", 1, LEASE).wait().unwrap();
    bus.ack(&l[0].receipt).wait().unwrap();
    clock.advance(60_000);
    let again = bus
        .publish("tasks", b"x".to_vec(), o.clone())
        .wait()
        .unwrap();
    assert!(again.duplicate);
    assert_eq!(again.id, first.id);
    assert!(
        bus.claim("workers", "a", 1, LEASE)
            .wait()
            .unwrap()
            .is_empty()
    );
    // The default window is 5 minutes; a purge in between must not forget the id early.
    bus.purge().unwrap();
    assert!(
        bus.publish("tasks", b"x".to_vec(), o.clone())
            .wait()
            .unwrap()
            .duplicate
    );
    clock.advance(5 * 60_000);
    let fresh = bus.publish("tasks", b"x".to_vec(), o).wait().unwrap();
    assert!(!fresh.duplicate);
    assert_eq!(bus.claim("workers", "a", 5, LEASE).wait().unwrap().len(), 1);
}

#[test]
fn delay_holds_a_message_back() {
    let (_d, clock, bus) = setup();
    publish(
        &bus,
        "later",
        PublishOptions::default().delay(Duration::from_secs(10)),
    );
    assert!(
        bus.claim("workers", "a", 1, LEASE)
            .wait()
            .unwrap()
            .is_empty()
    );
    clock.advance(10_000);
    assert_eq!(bus.claim("workers", "a", 1, LEASE).wait().unwrap().len(), 1);
}

#[test]
fn headers_travel_with_the_message() {
    let (_d, _c, bus) = setup();
    let h = Headers {
        actor: Some("planner".into()),
        correlation_id: Some("task-7".into()),
        causing_op: Some("abc".into()),
    };
    publish(&bus, "x", PublishOptions::default().headers(h.clone()));
    let l = bus.claim("workers", "a", 1, LEASE).wait().unwrap();
    assert_eq!(l[0].message.headers, h);
}

#[test]
fn ordering_key_is_exclusive_and_in_publish_order() {
    let (_d, _c, bus) = setup();
    for i in 0..3 {
        publish(
            &bus,
            &format!("k{i}"),
            PublishOptions::default().ordering_key("repo"),
        );
    }
    publish(&bus, "free", PublishOptions::default());
    let a = bus.claim("workers", "a", 10, LEASE).wait().unwrap();
    let payloads: Vec<_> = a.iter().map(|l| l.message.payload.clone()).collect();
    assert_eq!(payloads, vec![b"k0".to_vec(), b"free".to_vec()]);
    assert!(
        bus.claim("workers", "b", 10, LEASE)
            .wait()
            .unwrap()
            .is_empty()
    );
    bus.ack(&a[0].receipt).wait().unwrap();
    let b = bus.claim("workers", "b", 10, LEASE).wait().unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].message.payload, b"k1");
}

#[test]
fn bare_nack_backs_off_and_explicit_delay_is_exact() {
    let (_d, clock, bus) = setup();
    publish(&bus, "x", PublishOptions::default());
    let l = bus.claim("workers", "a", 1, LEASE).wait().unwrap();
    bus.nack(&l[0].receipt).wait().unwrap();
    assert!(
        bus.claim("workers", "a", 1, LEASE)
            .wait()
            .unwrap()
            .is_empty()
    );
    clock.advance(1_000); // the first backoff is at most the 1 s base
    let l = bus.claim("workers", "a", 1, LEASE).wait().unwrap();
    assert_eq!(l[0].attempt, 2);
    bus.nack_with_delay(&l[0].receipt, Duration::ZERO)
        .wait()
        .unwrap();
    assert_eq!(
        bus.claim("workers", "a", 1, LEASE).wait().unwrap()[0].attempt,
        3
    );
}

#[test]
fn stale_receipts_are_refused_and_change_nothing() {
    let (_d, clock, bus) = setup();
    publish(&bus, "x", PublishOptions::default());
    let first = bus
        .claim("workers", "a", 1, Duration::from_secs(1))
        .wait()
        .unwrap();
    clock.advance(1_001);
    let second = bus.claim("workers", "b", 1, LEASE).wait().unwrap();
    assert_ne!(first[0].receipt, second[0].receipt);
    for r in [
        bus.ack(&first[0].receipt).wait(),
        bus.nack(&first[0].receipt).wait(),
        bus.extend(&first[0].receipt, LEASE).wait(),
        bus.terminate(&first[0].receipt, "late").wait(),
    ] {
        assert!(matches!(r, Err(BusError::StaleReceipt { .. })), "{r:?}");
    }
    let id = second[0].message.id;
    assert_eq!(
        bus.status("workers", id).unwrap(),
        Some(DeliveryStatus::Leased)
    );
    bus.ack(&second[0].receipt).wait().unwrap();
    assert_eq!(
        bus.status("workers", id).unwrap(),
        Some(DeliveryStatus::Acked)
    );
}

#[test]
fn extend_keeps_a_lease_alive() {
    let (_d, clock, bus) = setup();
    publish(&bus, "x", PublishOptions::default());
    let l = bus
        .claim("workers", "a", 1, Duration::from_secs(1))
        .wait()
        .unwrap();
    clock.advance(900);
    bus.extend(&l[0].receipt, Duration::from_secs(10))
        .wait()
        .unwrap();
    clock.advance(5_000);
    assert!(
        bus.claim("workers", "b", 1, LEASE)
            .wait()
            .unwrap()
            .is_empty()
    );
    bus.ack(&l[0].receipt).wait().unwrap();
}

#[test]
fn crashes_count_as_attempts_then_dead_letter_and_redrive() {
    let (_d, clock, bus) = setup();
    let id = publish(&bus, "poison", PublishOptions::default());
    for attempt in 1..=3 {
        let l = bus
            .claim("workers", "a", 1, Duration::from_secs(1))
            .wait()
            .unwrap();
        assert_eq!(l[0].attempt, attempt);
        clock.advance(1_001); // the consumer "crashed": the lease just runs out
    }
    assert!(
        bus.claim("workers", "a", 1, LEASE)
            .wait()
            .unwrap()
            .is_empty()
    );
    let dead = bus.dead_letter("workers", id).unwrap();
    assert_eq!(dead.attempts, 3);
    assert_eq!(dead.cause, DeadCause::MaxAttempts);
    assert_eq!(dead.last_error.as_deref(), Some("lease expired"));
    assert_eq!(bus.dead_letters("workers", 10).unwrap().len(), 1);
    assert_eq!(bus.redrive("workers", Some(id)).wait().unwrap(), 1);
    let l = bus.claim("workers", "a", 1, LEASE).wait().unwrap();
    assert_eq!(l[0].attempt, 1);
    bus.terminate(&l[0].receipt, "bad input").wait().unwrap();
    let dead = bus.dead_letter("workers", id).unwrap();
    assert_eq!(dead.cause, DeadCause::Terminated);
    assert_eq!(dead.last_error.as_deref(), Some("bad input"));
}

#[test]
fn nack_at_the_limit_dead_letters_with_the_error() {
    let (_d, _c, bus) = setup();
    let id = publish(&bus, "x", PublishOptions::default());
    for _ in 0..3 {
        let l = bus.claim("workers", "a", 1, LEASE).wait().unwrap();
        bus.nack_with_error(&l[0].receipt, Some(Duration::ZERO), Some("compile failed"))
            .wait()
            .unwrap();
    }
    let dead = bus.dead_letter("workers", id).unwrap();
    assert_eq!(dead.last_error.as_deref(), Some("compile failed"));
}

#[test]
fn metrics_count_depth_flight_dead_and_redeliveries() {
    let (_d, clock, bus) = setup();
    for i in 0..5 {
        publish(&bus, &format!("{i}"), PublishOptions::default());
    }
    clock.advance(2_000);
    let l = bus
        .claim("workers", "a", 2, Duration::from_secs(1))
        .wait()
        .unwrap();
    bus.terminate(&l[0].receipt, "no").wait().unwrap();
    clock.advance(1_001);
    let l2 = bus.claim("workers", "a", 10, LEASE).wait().unwrap();
    assert_eq!(l2.len(), 4);
    assert_eq!(l2.iter().filter(|l| l.attempt == 2).count(), 1);
    publish(
        &bus,
        "late",
        PublishOptions::default().delay(Duration::from_secs(10)),
    );
    let m = bus.metrics().unwrap();
    let g = &m[0].groups[0];
    assert_eq!(m[0].retained, 6);
    assert_eq!(
        (g.depth, g.in_flight, g.dead_letters, g.redeliveries),
        (1, 4, 1, 1)
    );
    assert_eq!(g.oldest_age_ms, 3_001);
}

#[test]
fn purge_removes_old_acked_messages_only() {
    let (_d, clock, bus) = setup();
    publish(&bus, "a", PublishOptions::default());
    publish(&bus, "b", PublishOptions::default());
    let l = bus.claim("workers", "a", 1, LEASE).wait().unwrap();
    bus.ack(&l[0].receipt).wait().unwrap();
    assert_eq!(bus.purge().unwrap().messages, 0);
    clock.advance(3_600_001);
    let r = bus.purge().unwrap();
    assert_eq!((r.deliveries, r.messages), (1, 1));
    assert_eq!(bus.status("workers", l[0].message.id).unwrap(), None);
    assert_eq!(bus.claim("workers", "a", 5, LEASE).wait().unwrap().len(), 1);
}

/// Acked deliveries are found by the purge's sweep over messages: spread over more messages
/// than one step examines, with a second group that has acked only some of them.
#[test]
fn purge_finds_acked_deliveries_across_steps_and_groups() {
    let (_d, clock, bus) = setup();
    bus.create_group("auditors", &["tasks"], GroupOptions::default())
        .wait()
        .unwrap();
    let ids: Vec<_> = (0..1200)
        .map(|i| publish(&bus, &format!("m{i}"), PublishOptions::default()))
        .collect();
    // Workers ack every message; auditors ack the first 900 and keep the rest.
    let mut acked = 0;
    while acked < 1200 {
        for l in bus.claim("workers", "w", 100, LEASE).wait().unwrap() {
            bus.ack(&l.receipt).wait().unwrap();
            acked += 1;
        }
    }
    for l in bus.claim("auditors", "a", 900, LEASE).wait().unwrap() {
        bus.ack(&l.receipt).wait().unwrap();
    }
    clock.advance(3_600_001);
    let r = bus.purge().unwrap();
    assert_eq!((r.deliveries, r.messages), (1200 + 900, 900));
    assert_eq!(bus.status("workers", ids[1100]).unwrap(), None);
    assert_eq!(
        bus.status("auditors", ids[1100]).unwrap(),
        Some(DeliveryStatus::Ready)
    );
    assert_eq!(bus.status("auditors", ids[10]).unwrap(), None);
    let left = bus.claim("auditors", "a", 1000, LEASE).wait().unwrap();
    assert_eq!(left.len(), 300);
    assert_eq!(bus.purge().unwrap().deliveries, 0, "nothing left to purge");
}

/// A database from before acked deliveries were found by the sweep loses their index on open.
#[test]
fn the_index_of_acked_deliveries_is_dropped_on_open() {
    let (dir, _c, bus) = setup();
    drop(bus);
    let path = dir.path().join("bus.db");
    let count = || -> i64 {
        rusqlite::Connection::open(&path)
            .unwrap()
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE name = 'bus_deliveries_acked'",
                [],
                |r| r.get(0),
            )
            .unwrap()
    };
    rusqlite::Connection::open(&path)
        .unwrap()
        .execute_batch(
            "CREATE INDEX bus_deliveries_acked ON bus_deliveries(finished_at) WHERE state = 3",
        )
        .unwrap();
    assert_eq!(count(), 1);
    let bus = Bus::open(&path, BusConfig::default()).unwrap();
    assert_eq!(count(), 0);
    drop(bus);
}

#[test]
fn purge_sweeps_unsubscribed_messages_and_keeps_live_ones() {
    let (_d, clock, bus) = setup();
    bus.create_topic("lonely").wait().unwrap();
    for i in 0..1200 {
        bus.publish(
            "lonely",
            vec![1u8],
            PublishOptions::default().dedup_id(format!("l{i}")),
        )
        .wait()
        .unwrap();
    }
    let live = publish(&bus, "live", PublishOptions::default());
    clock.advance(3_600_001);
    let r = bus.purge().unwrap();
    assert_eq!(r.messages, 1200);
    assert_eq!(
        bus.status("workers", live).unwrap(),
        Some(DeliveryStatus::Ready)
    );
    let m = bus.metrics().unwrap();
    let retained: u64 = m.iter().map(|t| t.retained).sum();
    assert_eq!(retained, 1);
    // Dedup ids expired with their 5-minute window and went too.
    assert_eq!(r.dedup_ids, 1200);
}

#[test]
fn publish_and_ack_inside_a_callers_transaction() {
    let (dir, _c, bus) = setup();
    let mut conn = rusqlite::Connection::open(dir.path().join("bus.db")).unwrap();
    conn.busy_timeout(Duration::from_secs(10)).unwrap();
    conn.execute_batch("CREATE TABLE app(x TEXT)").unwrap();

    // Rolled back: neither the state change nor the message exist.
    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("INSERT INTO app VALUES ('lost')", []).unwrap();
    bus.publish_in(&tx, "tasks", b"lost".to_vec(), PublishOptions::default())
        .unwrap();
    drop(tx);
    assert!(
        bus.claim("workers", "a", 5, LEASE)
            .wait()
            .unwrap()
            .is_empty()
    );

    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("INSERT INTO app VALUES ('kept')", []).unwrap();
    bus.publish_in(&tx, "tasks", b"kept".to_vec(), PublishOptions::default())
        .unwrap();
    // A refusal inside the transaction leaves the caller's own writes alone.
    assert!(matches!(
        bus.publish_in(&tx, "nope", b"x".to_vec(), PublishOptions::default()),
        Err(BusError::UnknownTopic { .. })
    ));
    tx.commit().unwrap();
    bus.wake();
    let l = bus.claim("workers", "a", 5, LEASE).wait().unwrap();
    assert_eq!(l.len(), 1);

    let tx = conn
        .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .unwrap();
    tx.execute("INSERT INTO app VALUES ('done')", []).unwrap();
    bus.ack_in(&tx, &l[0].receipt).unwrap();
    tx.commit().unwrap();
    assert_eq!(
        bus.status("workers", l[0].message.id).unwrap(),
        Some(DeliveryStatus::Acked)
    );
    let n: i64 = conn
        .query_row("SELECT COUNT(*) FROM app", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 2);
}

#[test]
fn batch_publish_is_all_or_nothing() {
    let (_d, _c, bus) = setup();
    let ok = bus
        .publish_batch(vec![
            NewMessage::new("tasks", "a"),
            NewMessage::new("tasks", "b"),
        ])
        .wait()
        .unwrap();
    assert_eq!(ok.len(), 2);
    let bad = bus
        .publish_batch(vec![
            NewMessage::new("tasks", "c"),
            NewMessage::new("ghost", "d"),
        ])
        .wait();
    assert!(matches!(bad, Err(BusError::UnknownTopic { .. })));
    assert_eq!(
        bus.claim("workers", "a", 10, LEASE).wait().unwrap().len(),
        2
    );
}

#[test]
fn state_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bus.db");
    let clock = ManualClock::new(0);
    let open = || {
        let mut c = BusConfig::with_clock(Arc::new(clock.clone()));
        c.auto_purge = None;
        Bus::open(&path, c).unwrap()
    };
    let bus = open();
    bus.create_topic("t").wait().unwrap();
    bus.create_group("g", &["t"], GroupOptions::default())
        .wait()
        .unwrap();
    bus.publish("t", b"x".to_vec(), PublishOptions::default())
        .wait()
        .unwrap();
    let l = bus.claim("g", "a", 1, LEASE).wait().unwrap();
    drop(bus);
    let bus = open();
    bus.ack(&l[0].receipt).wait().unwrap();
}

fn event(n: u8) -> Event {
    Event {
        id: OpId(Hash::of(b"test", &[n])),
        seq: u64::from(n),
        branch: "main".into(),
        actor: ActorId::new("planner").unwrap(),
        intent: Intent::new(IntentKind::Plan, "plan"),
        flags: OpFlags::default(),
        summary: ChangeSummary::default(),
        time_ms: 0,
    }
}

#[test]
fn event_publisher_is_idempotent_on_the_op_id() {
    let (_d, _c, bus) = setup();
    bus.create_topic("env.ops").wait().unwrap();
    bus.create_group("watchers", &["env.ops"], GroupOptions::default())
        .wait()
        .unwrap();
    let publisher = EventPublisher::new(bus.clone(), "env.ops");
    let p: &dyn Publisher = &publisher;
    p.publish(&event(1)).unwrap();
    p.publish(&event(2)).unwrap();
    p.publish(&event(1)).unwrap(); // offered again after a "crash"
    let l = bus.claim("watchers", "w", 10, LEASE).wait().unwrap();
    // Ordered by branch: only the first is out until it is acked.
    assert_eq!(l.len(), 1);
    let e: Event = serde_json::from_slice(&l[0].message.payload).unwrap();
    assert_eq!(e, event(1));
    assert_eq!(l[0].message.headers.actor.as_deref(), Some("planner"));
    assert_eq!(l[0].message.dedup_id, Some(event(1).id.to_string()));
    bus.ack(&l[0].receipt).wait().unwrap();
    let l = bus.claim("watchers", "w", 10, LEASE).wait().unwrap();
    assert_eq!(l.len(), 1);
    bus.ack(&l[0].receipt).wait().unwrap();
    assert!(
        bus.claim("watchers", "w", 10, LEASE)
            .wait()
            .unwrap()
            .is_empty()
    );

    let unknown = EventPublisher::new(bus.clone(), "nowhere");
    let err = unknown.publish(&event(3)).unwrap_err();
    assert_eq!(err.event, event(3).id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_consumer_is_woken_by_a_publish() {
    let dir = tempfile::tempdir().unwrap();
    let config = BusConfig {
        // Long enough that only the wake-up can explain a prompt delivery.
        idle_recheck: Duration::from_secs(3600),
        ..BusConfig::default()
    };
    let bus = Bus::open(dir.path().join("bus.db"), config).unwrap();
    bus.create_topic("t").await.unwrap();
    bus.create_group("g", &["t"], GroupOptions::default())
        .await
        .unwrap();
    let consumer = bus.consumer("g", "c", LEASE).unwrap();
    let waiter = tokio::spawn(async move { consumer.next().await });
    tokio::time::sleep(Duration::from_millis(20)).await;
    bus.publish("t", b"hello".to_vec(), PublishOptions::default())
        .await
        .unwrap();
    let lease = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the consumer was not woken")
        .unwrap()
        .unwrap();
    assert_eq!(lease.message.payload, b"hello");
    bus.ack(&lease.receipt).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_published_message_wakes_a_waiting_consumer() {
    let dir = tempfile::tempdir().unwrap();
    let config = BusConfig {
        idle_recheck: Duration::from_secs(3600),
        ..BusConfig::default()
    };
    let bus = Bus::open(dir.path().join("bus.db"), config).unwrap();
    bus.create_topic("t").await.unwrap();
    bus.create_group("g", &["t"], GroupOptions::default())
        .await
        .unwrap();
    let waiters: Vec<_> = (0..4)
        .map(|i| {
            let c = bus.consumer("g", &format!("c{i}"), LEASE).unwrap();
            tokio::spawn(async move { c.next().await })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let batch = (0..4).map(|i| NewMessage::new("t", vec![i])).collect();
    bus.publish_batch(batch).await.unwrap();
    let mut got = Vec::new();
    for w in waiters {
        let lease = tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("a consumer was not woken")
            .unwrap()
            .unwrap();
        got.push(lease.message.payload[0]);
    }
    got.sort_unstable();
    assert_eq!(got, vec![0, 1, 2, 3]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_consumer_wakes_when_a_delayed_message_falls_due() {
    let dir = tempfile::tempdir().unwrap();
    let config = BusConfig {
        idle_recheck: Duration::from_secs(3600),
        ..BusConfig::default()
    };
    let bus = Bus::open(dir.path().join("bus.db"), config).unwrap();
    bus.create_topic("t").await.unwrap();
    bus.create_group("g", &["t"], GroupOptions::default())
        .await
        .unwrap();
    bus.publish(
        "t",
        b"later".to_vec(),
        PublishOptions::default().delay(Duration::from_millis(50)),
    )
    .await
    .unwrap();
    let consumer = bus.consumer("g", "c", LEASE).unwrap();
    // Nobody publishes again: only the claim's own "next due" hint can end the wait.
    let lease = tokio::time::timeout(Duration::from_secs(60), consumer.next())
        .await
        .expect("the consumer slept past the due time")
        .unwrap();
    assert_eq!(lease.message.payload, b"later");
}

#[test]
fn the_manual_clock_drives_every_decision() {
    let (_d, clock, bus) = setup();
    let before = clock.now_ms();
    publish(&bus, "x", PublishOptions::default());
    let l = bus
        .claim("workers", "a", 1, Duration::from_millis(5))
        .wait()
        .unwrap();
    assert_eq!(l[0].lease_until_ms, before + 5);
    assert_eq!(l[0].message.published_at_ms, before);
}

#[test]
fn only_the_claimer_settles_as_a_consumer() {
    let (_d, _c, bus) = setup();
    let id = publish(&bus, "m", PublishOptions::default());
    let lease = bus.claim("workers", "agent:a", 1, LEASE).wait().unwrap();
    let r = lease[0].receipt;
    for refused in [
        bus.ack_as("agent:b", &r).wait(),
        bus.nack_as("agent:b", &r, Some(Duration::ZERO), Some("not mine"))
            .wait(),
    ] {
        assert!(
            matches!(refused, Err(BusError::NotYourReceipt { .. })),
            "{refused:?}"
        );
    }
    // Nothing changed: still leased to agent:a (no one else can claim it), and its receipt
    // still settles it.
    assert_eq!(
        bus.status("workers", id).unwrap(),
        Some(DeliveryStatus::Leased)
    );
    assert!(
        bus.claim("workers", "agent:b", 1, LEASE)
            .wait()
            .unwrap()
            .is_empty()
    );
    bus.ack_as("agent:a", &r).wait().unwrap();
    assert!(matches!(
        bus.ack_as("agent:a", &r).wait(),
        Err(BusError::StaleReceipt { .. })
    ));
    assert_eq!(
        bus.status("workers", id).unwrap(),
        Some(DeliveryStatus::Acked)
    );
}

#[test]
fn ack_and_claim_next_is_one_step_of_a_worker_and_refuses_whole() {
    let (_d, _c, bus) = setup();
    bus.create_topic("other").wait().unwrap();
    bus.create_group("elsewhere", &["other"], GroupOptions::default())
        .wait()
        .unwrap();
    for job in ["one", "two", "three"] {
        publish(&bus, job, PublishOptions::default());
    }
    let first = bus.claim("workers", "a", 1, LEASE).wait().unwrap();
    let next = bus
        .ack_and_claim("a", &first[0].receipt, "workers", 1, LEASE)
        .wait()
        .unwrap();
    assert_eq!(next[0].message.payload, b"two");
    assert_eq!(
        bus.status("workers", first[0].message.id).unwrap(),
        Some(DeliveryStatus::Acked)
    );
    // Another consumer's receipt, or a receipt of another group: refused, nothing acked and
    // nothing claimed.
    assert!(matches!(
        bus.ack_and_claim("b", &next[0].receipt, "workers", 1, LEASE)
            .wait(),
        Err(BusError::NotYourReceipt { .. })
    ));
    assert!(matches!(
        bus.ack_and_claim("a", &next[0].receipt, "elsewhere", 1, LEASE)
            .wait(),
        Err(BusError::OtherGroup { .. })
    ));
    assert_eq!(
        bus.status("workers", next[0].message.id).unwrap(),
        Some(DeliveryStatus::Leased)
    );
    // The lease still holds: the worker goes on, and the last message comes with the ack.
    let last = bus
        .ack_and_claim("a", &next[0].receipt, "workers", 5, LEASE)
        .wait()
        .unwrap();
    assert_eq!(last.len(), 1);
    assert_eq!(last[0].message.payload, b"three");
    let none = bus
        .ack_and_claim("a", &last[0].receipt, "workers", 5, LEASE)
        .wait()
        .unwrap();
    assert!(none.is_empty());
    // A settled receipt again is stale.
    assert!(matches!(
        bus.ack_and_claim("a", &last[0].receipt, "workers", 1, LEASE)
            .wait(),
        Err(BusError::StaleReceipt { .. })
    ));
}

/// The automatic purge's failure is kept for whoever reports on the bus until a purge
/// succeeds, and a failed step removes nothing.
#[test]
fn a_failed_background_purge_is_reported_until_one_succeeds() {
    use environment_core::Queue;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bus.db");
    let clock = ManualClock::new(1_000_000);
    let mut config = BusConfig::with_clock(Arc::new(clock.clone()));
    config.auto_purge = Some(Duration::from_millis(20));
    config.retention = Duration::from_secs(1);
    let bus = Bus::open(&path, config).unwrap();
    bus.create_topic("tasks").wait().unwrap();
    bus.create_group("workers", &["tasks"], GroupOptions::default())
        .wait()
        .unwrap();
    let retained = || -> u64 {
        Queue::metrics(&bus)
            .unwrap()
            .iter()
            .map(|t| t.retained)
            .sum()
    };
    let eventually = |what: &str, ready: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !ready() {
            assert!(std::time::Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // Another process on the file refuses every delete of a delivery.
    let other = rusqlite::Connection::open(&path).unwrap();
    other
        .execute_batch(
            "CREATE TRIGGER no_purge BEFORE DELETE ON bus_deliveries
             BEGIN SELECT RAISE(ABORT, 'deliveries are kept'); END;",
        )
        .unwrap();
    publish(&bus, "done", PublishOptions::default());
    let lease = bus.claim("workers", "w", 1, LEASE).wait().unwrap();
    bus.ack(&lease[0].receipt).wait().unwrap();
    clock.advance(2_000);
    eventually("the failed purge is reported", &|| {
        Queue::upkeep_failure(&bus).is_some()
    });
    assert_eq!(retained(), 1, "a failed purge removed nothing");

    other.execute_batch("DROP TRIGGER no_purge").unwrap();
    eventually("the report is cleared", &|| {
        Queue::upkeep_failure(&bus).is_none()
    });
    eventually("the message is purged", &|| retained() == 0);
}
