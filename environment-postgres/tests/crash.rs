//! Crash test: producer and consumer processes on one PostgreSQL queue are SIGKILLed at random
//! points, again and again. Every message the producer recorded as published is there
//! afterwards, once (a retried publish repeats its dedup id), with one delivery, and a final
//! drain acks every one.
//!
//! The children are this test binary re-executed with `PG_CRASH_ROLE` set, running
//! [`crash_child`]; without the variable that test does nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use environment_bus::{GroupOptions, NewMessage, PublishOptions};
use environment_postgres::{PgQueue, PgQueueConfig};
use rand::Rng;

const ROUNDS: usize = 12;

fn open(server: &str) -> PgQueue {
    let cfg = PgQueueConfig {
        pool_size: 2,
        ..PgQueueConfig::default()
    };
    PgQueue::open(server.parse().unwrap(), cfg).unwrap()
}

/// What the producer recorded as published, in order.
fn produced(log: &Path) -> Vec<u64> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect()
}

#[test]
fn crash_child() {
    let (Ok(role), Ok(server), Ok(log)) = (
        std::env::var("PG_CRASH_ROLE"),
        std::env::var("PG_CRASH_SERVER"),
        std::env::var("PG_CRASH_LOG"),
    ) else {
        return;
    };
    let queue = open(&server);
    match role.as_str() {
        "producer" => {
            // Goes on after the last recorded message; the one killed between its publish and
            // its record is published again under the same dedup id.
            let mut next = produced(Path::new(&log)).last().map_or(0, |i| i + 1);
            let mut record = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .unwrap();
            loop {
                let o = PublishOptions::default()
                    .dedup_id(format!("m{next}"))
                    .dedup_window(Duration::from_secs(24 * 3600));
                let m = NewMessage::new("work", next.to_le_bytes().to_vec()).with(o);
                queue.publish_message(&m).unwrap();
                // One write call: `writeln!` writes the number and the newline separately, and
                // a kill between them joined two numbers into one line for the next run.
                record.write_all(format!("{next}\n").as_bytes()).unwrap();
                next += 1;
            }
        }
        "consumer" => loop {
            let leases = queue
                .claim("workers", "c", 4, Duration::from_millis(300))
                .unwrap();
            for l in leases {
                // A settlement that lost its lease to a lapse is refused, never applied twice.
                let _ = queue.ack("c", &l.receipt);
            }
        },
        other => panic!("unknown role {other}"),
    }
}

fn spawn(role: &str, server: &str, log: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
        .env("PG_CRASH_ROLE", role)
        .env("PG_CRASH_SERVER", server)
        .env("PG_CRASH_LOG", log)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

#[test]
fn killed_producers_and_consumers_lose_nothing() {
    let Some(server) = common::fresh("crash") else {
        return;
    };
    // The children reach the same schema through a connection string.
    let url = format!(
        "{} options='{}'",
        environment_conformance::prerequisite::postgres().unwrap(),
        server.get_options().unwrap()
    );
    let queue = open(&url);
    queue
        .create_group(
            "workers",
            &["work"],
            GroupOptions {
                max_attempts: 10_000,
            },
        )
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("produced");
    let mut rng = rand::rng();
    for _ in 0..ROUNDS {
        let mut producer = spawn("producer", &url, &log);
        let mut consumer = spawn("consumer", &url, &log);
        std::thread::sleep(Duration::from_millis(rng.random_range(150..600)));
        for child in [&mut producer, &mut consumer] {
            assert!(
                matches!(child.try_wait(), Ok(None)),
                "a child died on its own: {:?}",
                child.try_wait()
            );
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }
    let produced = produced(&log);
    assert!(
        produced.len() > ROUNDS,
        "the producer hardly ran: {}",
        produced.len()
    );

    // Drain what is left: every lease of the killed consumer has lapsed after 300 ms.
    let mut idle = 0;
    while idle < 3 {
        let leases = queue
            .claim_waiting(
                "workers",
                "drain",
                100,
                Duration::from_secs(60),
                Duration::from_millis(500),
            )
            .unwrap();
        idle = if leases.is_empty() { idle + 1 } else { 0 };
        for l in leases {
            queue.ack("drain", &l.receipt).unwrap();
        }
    }
    let mut client = server.connect(postgres::NoTls).unwrap();
    let rows = client
        .query(
            "SELECT m.dedup_id, COUNT(d.id), COUNT(d.id) FILTER (WHERE d.state = 3)
             FROM bus_messages m LEFT JOIN bus_deliveries d ON d.msg_id = m.id
             GROUP BY m.id, m.dedup_id",
            &[],
        )
        .unwrap();
    let mut seen = std::collections::HashMap::new();
    for r in &rows {
        let (dedup, deliveries, acked): (String, i64, i64) = (r.get(0), r.get(1), r.get(2));
        assert_eq!(
            (deliveries, acked),
            (1, 1),
            "message {dedup}: a delivery lost or doubled"
        );
        *seen.entry(dedup).or_insert(0) += 1;
    }
    for i in produced {
        assert_eq!(
            seen.get(&format!("m{i}")),
            Some(&1),
            "message {i} lost or published twice"
        );
    }
}
