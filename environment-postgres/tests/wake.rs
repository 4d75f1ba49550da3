//! A waiting claim is woken by another machine's commit, not by polling; a broken listening
//! connection reaches the waiting caller as an error, and the queue recovers from it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use environment_bus::{GroupOptions, NewMessage};
use environment_core::ErrorKind;
use environment_core::queue::Lease;
use environment_postgres::{PgError, PgQueue, PgQueueConfig};

/// Long enough that only a notification can end a wait within it.
fn config() -> PgQueueConfig {
    PgQueueConfig {
        idle_recheck: Duration::from_secs(600),
        ..PgQueueConfig::default()
    }
}

/// A claim of one message of `workers` waiting up to `wait` on its own thread, given time to
/// find the queue empty and sleep.
fn wait_for_one(queue: &PgQueue, wait: Duration) -> JoinHandle<Result<Vec<Lease>, PgError>> {
    let waiter = queue.clone();
    let waiting = std::thread::spawn(move || {
        waiter.claim_waiting("workers", "w", 1, Duration::from_secs(30), wait)
    });
    std::thread::sleep(Duration::from_millis(300));
    waiting
}

#[test]
fn a_waiting_claim_wakes_on_another_machines_publish() {
    let Some(server) = common::fresh("wake") else {
        return;
    };
    let waiter = common::open(&server, config());
    waiter
        .create_group("workers", &["jobs"], GroupOptions::default())
        .unwrap();
    let publisher = common::open(&server, config());
    let waiting = wait_for_one(&waiter, Duration::from_secs(120));
    let sent = publisher
        .publish_message(&NewMessage::new("jobs", b"wake up".to_vec()))
        .unwrap();
    let got = waiting.join().unwrap().unwrap();
    // The wait was 120 s and the recheck 600 s: only the notification could end it with a
    // lease.
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message.id, sent.id);
}

#[test]
fn a_waiting_claim_returns_empty_when_its_wait_passes() {
    let Some(server) = common::fresh("wake_timeout") else {
        return;
    };
    let queue = common::open(&server, config());
    queue
        .create_group("workers", &["jobs"], GroupOptions::default())
        .unwrap();
    let started = Instant::now();
    let got = queue
        .claim_waiting(
            "workers",
            "w",
            1,
            Duration::from_secs(30),
            Duration::from_millis(200),
        )
        .unwrap();
    assert!(got.is_empty());
    assert!(started.elapsed() >= Duration::from_millis(200));
}

#[test]
fn a_broken_listening_connection_reaches_the_waiting_caller() {
    let Some(server) = common::fresh("wake_broken") else {
        return;
    };
    // A name of its own, so that only this test's session is ended.
    let name = format!("wake-broken-{}", std::process::id());
    let queue = common::open(
        &server,
        PgQueueConfig {
            application_name: name.clone(),
            ..config()
        },
    );
    queue
        .create_group("workers", &["jobs"], GroupOptions::default())
        .unwrap();
    let waiting = wait_for_one(&queue, Duration::from_secs(120));
    // The operator (or a failover) ends the listening session.
    let mut admin = server.connect(postgres::NoTls).unwrap();
    let ended = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
             WHERE application_name = $1 AND pid <> pg_backend_pid()",
            &[&format!("{name}-listener")],
        )
        .unwrap();
    assert!(!ended.is_empty(), "no listening session to end");
    let err = waiting.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    // It reconnects by itself; a later wait is woken again.
    let deadline = Instant::now() + Duration::from_secs(30);
    let publisher = common::open(&server, config());
    loop {
        let waiting = wait_for_one(&queue, Duration::from_secs(60));
        publisher
            .publish_message(&NewMessage::new("jobs", b"again".to_vec()))
            .unwrap();
        match waiting.join().unwrap() {
            Ok(got) => {
                assert_eq!(got.len(), 1);
                break;
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Unavailable);
                assert!(
                    Instant::now() < deadline,
                    "the listener never came back: {e}"
                );
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
}
