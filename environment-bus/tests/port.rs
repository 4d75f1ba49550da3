//! Core's queue port (`environment_core::Queue`) as the workspace service uses it: the body in
//! `environment-conformance`, run against the SQLite bus (the PostgreSQL queue runs it too).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use environment_bus::{Bus, BusConfig};
use environment_core::ManualClock;

#[test]
fn the_bus_behaves_as_the_port_says() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_000_000);
    let mut config = BusConfig::with_clock(Arc::new(clock.clone()));
    config.auto_purge = None;
    let bus = Bus::open(dir.path().join("bus.db"), config).unwrap();
    let advance = |d: Duration| clock.advance(i64::try_from(d.as_millis()).unwrap());
    environment_conformance::queue_port::the_port_behaves(&bus, &advance);
}
