//! [`BusConfig`]: the knobs of a bus.

use std::sync::Arc;
use std::time::Duration;

use environment_core::{Clock, SystemClock};

use crate::types::{Backoff, Limits};

/// How a bus behaves. `Default` uses the system clock.
#[derive(Clone, Debug)]
pub struct BusConfig {
    /// Where time comes from: leases, delays, backoff, dedup windows and retention all read it.
    pub clock: Arc<dyn Clock>,
    /// Bounds on inputs.
    pub limits: Limits,
    /// Delays of bare nacks.
    pub backoff: Backoff,
    /// Dedup window of publishes that do not set one (5 minutes).
    pub dedup_window: Duration,
    /// Acked deliveries (and then their messages) are purged this long after the ack.
    pub retention: Duration,
    /// When set, the writer runs bounded purge steps this often (real time), between group
    /// commits, continuing step by step while there is work; otherwise purge only runs when
    /// [`Bus::purge`](crate::Bus::purge) is called.
    pub auto_purge: Option<Duration>,
    /// How long a waiting [`Consumer`](crate::Consumer) sleeps at most before looking again
    /// without a wake-up; only matters for messages published by another process (in-process
    /// publishes wake it at once).
    pub idle_recheck: Duration,
    /// How long a write waits for another connection holding the database's write lock.
    pub busy_timeout: Duration,
    /// Most commands per group commit.
    pub max_group_commit: usize,
    /// When set, a checkpointer thread moves the WAL into the database this often (real time),
    /// off the writer's commit path; otherwise SQLite checkpoints inside commits every 1000
    /// pages.
    pub checkpoint_every: Option<Duration>,
}

impl Default for BusConfig {
    fn default() -> BusConfig {
        BusConfig {
            clock: Arc::new(SystemClock),
            limits: Limits::default(),
            backoff: Backoff::default(),
            dedup_window: Duration::from_secs(300),
            retention: Duration::from_secs(3600),
            auto_purge: Some(Duration::from_secs(5)),
            idle_recheck: Duration::from_secs(1),
            busy_timeout: Duration::from_secs(10),
            max_group_commit: 512,
            checkpoint_every: Some(Duration::from_millis(100)),
        }
    }
}

impl BusConfig {
    /// The default configuration with another clock (a `ManualClock` in tests).
    pub fn with_clock(clock: Arc<dyn Clock>) -> BusConfig {
        BusConfig {
            clock,
            ..BusConfig::default()
        }
    }
}
