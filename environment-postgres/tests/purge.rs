//! The background purge of the shared queue: what retention lets go goes without anyone
//! calling `purge`, and a purge that fails is reported by the queue until one succeeds.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use environment_bus::GroupOptions;
use environment_core::{ManualClock, Queue, queue::Publish};
use environment_postgres::{PgQueue, PgQueueConfig};

const LEASE: Duration = Duration::from_secs(30);
/// The clock is advanced by twice this (2,000 ms) past an ack.
const RETENTION: Duration = Duration::from_secs(1);

/// Messages the queue still keeps, over every topic.
fn retained(q: &PgQueue) -> u64 {
    Queue::metrics(q).unwrap().iter().map(|t| t.retained).sum()
}

/// Publishes, claims and acks one message; its delivery is then purged after the retention.
fn handled(q: &PgQueue) {
    Queue::publish(q, "jobs", b"done".to_vec(), Publish::default()).unwrap();
    let lease = Queue::claim(q, "workers", "w", 1, LEASE)
        .unwrap()
        .pop()
        .unwrap();
    Queue::settle(
        q,
        "w",
        &lease.receipt,
        environment_core::queue::Settlement::Ack,
    )
    .unwrap();
}

/// Waits up to ten seconds for `ready`.
fn eventually(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready() {
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_queue_purges_in_the_background_and_reports_a_failed_purge() {
    let Some(server) = common::fresh("purge") else {
        return;
    };
    let clock = ManualClock::new(1_000_000);
    let config = PgQueueConfig {
        retention: RETENTION,
        auto_purge: Some(Duration::from_millis(50)),
        ..common::config(&clock)
    };
    let q = common::open(&server, config);
    q.create_group("workers", &["jobs"], GroupOptions::default())
        .unwrap();

    handled(&q);
    assert_eq!(retained(&q), 1, "kept within its retention");
    clock.advance(2_000);
    eventually("the acked message is purged", || retained(&q) == 0);
    assert_eq!(Queue::upkeep_failure(&q), None);

    // An operator's mistake: a table the purge needs is gone. The purge fails whole (nothing
    // is removed) and the queue says so.
    let mut admin = server.connect(postgres::NoTls).unwrap();
    admin
        .batch_execute("ALTER TABLE bus_dedup RENAME TO bus_dedup_away")
        .unwrap();
    handled(&q);
    clock.advance(2_000);
    eventually("the failed purge is reported", || {
        Queue::upkeep_failure(&q).is_some()
    });
    assert_eq!(retained(&q), 1, "a failed purge removed nothing");

    admin
        .batch_execute("ALTER TABLE bus_dedup_away RENAME TO bus_dedup")
        .unwrap();
    eventually("the next purge succeeds and clears the report", || {
        Queue::upkeep_failure(&q).is_none()
    });
    eventually("the message is purged", || retained(&q) == 0);
}

#[test]
fn a_queue_without_background_purge_keeps_what_it_acked_until_purged() {
    let Some(server) = common::fresh("nopurge") else {
        return;
    };
    let clock = ManualClock::new(1_000_000);
    let config = PgQueueConfig {
        retention: RETENTION,
        auto_purge: None,
        ..common::config(&clock)
    };
    let q = common::open(&server, config);
    q.create_group("workers", &["jobs"], GroupOptions::default())
        .unwrap();
    handled(&q);
    clock.advance(2_000);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(retained(&q), 1, "nothing purged in the background");
    assert_eq!(q.purge().unwrap().messages, 1);
    assert_eq!(retained(&q), 0);
}
