//! The queue port's test body, the one the SQLite bus runs, against PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use environment_core::{ManualClock, Queue};

#[test]
fn the_postgres_queue_behaves_as_the_port_says() {
    let Some(server) = common::fresh("port") else {
        return;
    };
    let clock = ManualClock::new(1_000_000);
    let queue = common::open(&server, common::config(&clock));
    let advance = |d: Duration| clock.advance(i64::try_from(d.as_millis()).unwrap());
    environment_conformance::queue_port::the_port_behaves(&queue, &advance);
}

/// The queue used from async code, on the runtime's own thread: opened, worked and dropped
/// there without blocking the runtime into a panic (the blocking client runs off it).
#[test]
fn the_queue_works_from_async_code() {
    let Some(server) = common::fresh("port_async") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let clock = ManualClock::new(1_000_000);
        let queue = common::open(&server, common::config(&clock));
        queue
            .create_group("workers", &["tasks"], Default::default())
            .unwrap();
        queue
            .publish("tasks", b"from async".to_vec(), Default::default())
            .unwrap();
        let leases = queue
            .claim("workers", "w", 1, Duration::from_secs(30))
            .unwrap();
        assert_eq!(leases[0].message.payload, b"from async");
        queue.ack("w", &leases[0].receipt).unwrap();
        drop(queue);
    });
}
