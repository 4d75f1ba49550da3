//! The queue port's test body, the one the SQLite bus runs, against PostgreSQL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use environment_core::ManualClock;

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
