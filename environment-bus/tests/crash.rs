//! Crash test: producer and consumer processes are SIGKILLed at random points, again and
//! again. After reopening, every message the producer recorded as published is either acked
//! exactly once according to the consumer application's own record, or still pending/dead —
//! never lost — and a final drain acks every one exactly once.
//!
//! Odd-numbered messages are published with `publish_in` inside the producer application's
//! own transaction (transactional outbox); the consumer records its work and acks with
//! `ack_in` in one transaction, which is what makes "exactly once" checkable.
//!
//! The children are this test binary re-executed with `BUS_CRASH_ROLE` set, running
//! [`crash_child`]; without the variable that test does nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use environment_bus::{
    Bus, BusConfig, BusError, DeliveryStatus, GroupOptions, MessageId, PublishOptions,
};
use environment_core::{Clock, ManualClock, SystemClock};
use rand::Rng;
use rusqlite::{Connection, TransactionBehavior, params};

const TOTAL: usize = 1000;
const MIN_KILLS: usize = 50;

fn config(clock: Arc<dyn Clock>) -> BusConfig {
    let mut c = BusConfig::with_clock(clock);
    c.auto_purge = None;
    c
}

fn app_conn(db: &Path) -> Connection {
    let c = Connection::open(db).unwrap();
    c.busy_timeout(Duration::from_secs(30)).unwrap();
    c
}

/// The consumer application: its record of processed work and the ack commit together.
/// Returns how many it processed.
fn consume_some(bus: &Bus, app: &mut Connection, lease: Duration) -> usize {
    let leases = bus.claim("workers", "c", 4, lease).wait().unwrap();
    let mut rng = rand::rng();
    let n = leases.len();
    for l in leases {
        if rng.random_ratio(1, 20) {
            // A transient failure: retry soon.
            match bus.nack_with_delay(&l.receipt, Duration::ZERO).wait() {
                Ok(()) | Err(BusError::StaleReceipt { .. }) => continue,
                Err(e) => panic!("{e}"),
            }
        }
        let i = u64::from_le_bytes(l.message.payload.as_slice().try_into().unwrap());
        let tx = app
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        tx.execute(
            "INSERT INTO app_done(i, n) VALUES (?1, 1) ON CONFLICT(i) DO UPDATE SET n = n + 1",
            params![i as i64],
        )
        .unwrap();
        match bus.ack_in(&tx, &l.receipt) {
            Ok(()) => tx.commit().unwrap(),
            // Our lease ran out and someone else has it now: our record must not stay.
            Err(BusError::StaleReceipt { .. }) => tx.rollback().unwrap(),
            Err(e) => panic!("{e}"),
        }
    }
    n
}

/// The producer's record. Each line is written with one `write` call, so a kill leaves at
/// most a torn last line (without its newline), which is ignored here and fenced off by the
/// next producer.
fn read_log(path: &Path) -> Vec<(usize, i64)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.split_inclusive('\n')
        .filter_map(|l| l.strip_suffix('\n'))
        .filter_map(|l| {
            let (i, id) = l.split_once(' ')?;
            Some((i.parse().ok()?, id.parse().ok()?))
        })
        .collect()
}

#[test]
fn crash_child() {
    let Ok(role) = std::env::var("BUS_CRASH_ROLE") else {
        return;
    };
    let db = PathBuf::from(std::env::var("BUS_CRASH_DB").unwrap());
    let bus = Bus::open(&db, config(Arc::new(SystemClock))).unwrap();
    match role.as_str() {
        "producer" => {
            let log_path = db.with_extension("published");
            let start = read_log(&log_path)
                .iter()
                .map(|(i, _)| i + 1)
                .max()
                .unwrap_or(0);
            let mut log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .unwrap();
            let text = std::fs::read_to_string(&log_path).unwrap();
            if !text.is_empty() && !text.ends_with('\n') {
                log.write_all(b"\n").unwrap();
            }
            let mut rng = rand::rng();
            let mut app = app_conn(&db);
            for i in start..TOTAL {
                let o = PublishOptions::default().dedup_id(format!("m-{i}"));
                let payload = (i as u64).to_le_bytes().to_vec();
                let p = if i % 2 == 1 {
                    // Transactional outbox: the application's state change and the message
                    // commit together or not at all.
                    let tx = app
                        .transaction_with_behavior(TransactionBehavior::Immediate)
                        .unwrap();
                    tx.execute("INSERT OR IGNORE INTO produced(i) VALUES (?1)", [i as i64])
                        .unwrap();
                    let p = bus.publish_in(&tx, "work", payload, o).unwrap();
                    tx.commit().unwrap();
                    bus.wake();
                    p
                } else {
                    bus.publish("work", payload, o).wait().unwrap()
                };
                // Recorded only after the bus said yes: a kill in between leaves a message
                // the log does not know, which the restarted producer's dedup id absorbs.
                log.write_all(format!("{i} {}\n", p.id.0).as_bytes())
                    .unwrap();
                // Paced so that producers are still at work when the kills come.
                if rng.random_ratio(1, 2) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }
        "consumer" => {
            let mut app = app_conn(&db);
            loop {
                if consume_some(&bus, &mut app, Duration::from_millis(300)) == 0 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
        other => panic!("unknown role {other}"),
    }
}

fn spawn(role: &str, db: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
        .env("BUS_CRASH_ROLE", role)
        .env("BUS_CRASH_DB", db)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// SIGKILL if still running; true if that killed something.
fn kill(child: &mut Child) -> bool {
    let running = matches!(child.try_wait(), Ok(None));
    let _ = child.kill();
    let _ = child.wait();
    running
}

#[test]
fn killed_producers_and_consumers_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("env.db");
    {
        let bus = Bus::open(&db, config(Arc::new(SystemClock))).unwrap();
        bus.create_topic("work").wait().unwrap();
        bus.create_group(
            "workers",
            &["work"],
            GroupOptions {
                max_attempts: 10_000,
            },
        )
        .wait()
        .unwrap();
        app_conn(&db)
            .execute_batch(
                "CREATE TABLE app_done(i INTEGER PRIMARY KEY, n INTEGER NOT NULL);
                 CREATE TABLE produced(i INTEGER PRIMARY KEY);",
            )
            .unwrap();
    }

    let mut rng = rand::rng();
    let mut kills = 0;
    let mut rounds = 0;
    while kills < MIN_KILLS && rounds < 400 {
        rounds += 1;
        let mut producer = spawn("producer", &db);
        let mut consumer = spawn("consumer", &db);
        // Kill the two at different random moments.
        std::thread::sleep(Duration::from_millis(rng.random_range(5..60)));
        if rng.random_bool(0.5) {
            kills += usize::from(kill(&mut producer));
            std::thread::sleep(Duration::from_millis(rng.random_range(0..30)));
            kills += usize::from(kill(&mut consumer));
        } else {
            kills += usize::from(kill(&mut consumer));
            std::thread::sleep(Duration::from_millis(rng.random_range(0..30)));
            kills += usize::from(kill(&mut producer));
        }
    }
    assert!(kills >= MIN_KILLS, "only {kills} kills in {rounds} rounds");

    // Let one producer finish undisturbed so the drain below has the full set.
    let status = spawn("producer", &db).wait().unwrap();
    assert!(status.success());
    let log = read_log(&db.with_extension("published"));
    let mut published: Vec<usize> = log.iter().map(|(i, _)| *i).collect();
    published.sort_unstable();
    published.dedup();
    assert_eq!(published, (0..TOTAL).collect::<Vec<_>>());

    // After the crashes: each logged message is in the bus; acked exactly when the
    // application recorded it, and recorded at most once.
    let bus = Bus::open(&db, config(Arc::new(SystemClock))).unwrap();
    let mut app = app_conn(&db);
    let done = |app: &Connection, i: usize| -> Option<i64> {
        app.query_row("SELECT n FROM app_done WHERE i = ?1", [i as i64], |r| {
            r.get(0)
        })
        .ok()
    };
    let (mut acked, mut pending) = (0, 0);
    for (i, id) in &log {
        let st = bus.status("workers", MessageId(*id)).unwrap();
        match (st, done(&app, *i)) {
            (Some(DeliveryStatus::Acked), Some(1)) => acked += 1,
            (Some(DeliveryStatus::Ready | DeliveryStatus::Leased | DeliveryStatus::Dead), None) => {
                pending += 1
            }
            other => panic!("message {i} (id {id}): {other:?}"),
        }
    }
    drop(bus);

    // Drain with the clock an hour ahead: every lease a killed consumer held has expired.
    let now = SystemClock.now_ms();
    let clock = ManualClock::new(now + 3_600_000);
    let bus = Bus::open(&db, config(Arc::new(clock))).unwrap();
    let mut idle = 0;
    while idle < 3 {
        if consume_some(&bus, &mut app, Duration::from_secs(600)) == 0 {
            idle += 1;
        } else {
            idle = 0;
        }
    }
    for i in 0..TOTAL {
        assert_eq!(
            done(&app, i),
            Some(1),
            "message {i} not processed exactly once"
        );
        if i % 2 == 1 {
            let produced: bool = app
                .query_row(
                    "SELECT EXISTS(SELECT 1 FROM produced WHERE i = ?1)",
                    [i as i64],
                    |r| r.get(0),
                )
                .unwrap();
            assert!(
                produced,
                "outbox message {i} delivered without its state change"
            );
        }
    }
    let m = bus.metrics().unwrap();
    assert_eq!((m[0].groups[0].depth, m[0].groups[0].in_flight), (0, 0));
    eprintln!(
        "{kills} kills in {rounds} rounds; {acked} acked and {pending} pending before the drain"
    );
}
