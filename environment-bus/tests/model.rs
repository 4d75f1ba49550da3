//! The queue model of `environment-conformance` run against the SQLite bus: random
//! interleavings of its operations, reopen included, checked step by step.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use environment_bus::{
    Backoff, Bus, BusConfig, BusError, DeliveryStatus, GroupOptions, Lease, MessageId,
    PublishOptions, Receipt,
};
use environment_conformance::queue_model::{
    self, BACKOFF_MS, Claimed, GROUPS, ModelQueue, Refusal, Status, TOPIC,
};
use environment_core::ManualClock;
use proptest::prelude::*;

struct Subject {
    bus: Option<Bus>,
    path: PathBuf,
    clock: ManualClock,
}

fn open(path: &Path, clock: &ManualClock) -> Bus {
    let mut config = BusConfig::with_clock(Arc::new(clock.clone()));
    config.auto_purge = None;
    config.backoff = Backoff {
        base: Duration::from_millis(BACKOFF_MS.0 as u64),
        max: Duration::from_millis(BACKOFF_MS.1 as u64),
    };
    Bus::open(path, config).unwrap()
}

fn receipt(text: &str) -> Receipt {
    text.parse().unwrap()
}

fn claimed(leases: Vec<Lease>) -> Vec<Claimed> {
    leases
        .into_iter()
        .map(|l| Claimed {
            receipt: l.receipt.to_string(),
            message: l.message.id.0,
            attempt: l.attempt,
        })
        .collect()
}

fn refusal<T>(r: Result<T, BusError>) -> Result<T, Refusal> {
    r.map_err(|e| match e {
        BusError::StaleReceipt { .. } => Refusal::Stale,
        other => Refusal::Other(other.to_string()),
    })
}

impl Subject {
    fn bus(&self) -> &Bus {
        self.bus.as_ref().unwrap()
    }
}

impl ModelQueue for Subject {
    fn publish(
        &self,
        key: Option<String>,
        dedup: Option<(String, Duration)>,
        delay: Option<Duration>,
    ) -> (i64, bool) {
        let mut o = PublishOptions::default();
        if let Some(k) = key {
            o = o.ordering_key(k);
        }
        if let Some((id, window)) = dedup {
            o = o.dedup_id(id).dedup_window(window);
        }
        if let Some(d) = delay {
            o = o.delay(d);
        }
        let p = self.bus().publish(TOPIC, vec![1, 2, 3], o).wait().unwrap();
        (p.id.0, p.duplicate)
    }

    fn claim(&self, group: &str, consumer: &str, max: u32, lease: Duration) -> Vec<Claimed> {
        claimed(
            self.bus()
                .claim(group, consumer, max, lease)
                .wait()
                .unwrap(),
        )
    }

    fn ack(&self, consumer: &str, r: &str) -> Result<(), Refusal> {
        refusal(self.bus().ack_as(consumer, &receipt(r)).wait())
    }

    fn ack_and_claim(
        &self,
        consumer: &str,
        r: &str,
        group: &str,
        max: u32,
        lease: Duration,
    ) -> Result<Vec<Claimed>, Refusal> {
        let next = self
            .bus()
            .ack_and_claim(consumer, &receipt(r), group, max, lease)
            .wait();
        refusal(next).map(claimed)
    }

    fn nack(&self, consumer: &str, r: &str, delay: Option<Duration>) -> Result<(), Refusal> {
        refusal(
            self.bus()
                .nack_as(consumer, &receipt(r), delay, None)
                .wait(),
        )
    }

    fn extend(&self, r: &str, lease: Duration) -> Result<(), Refusal> {
        refusal(self.bus().extend(&receipt(r), lease).wait())
    }

    fn terminate(&self, r: &str, reason: &str) -> Result<(), Refusal> {
        refusal(self.bus().terminate(&receipt(r), reason).wait())
    }

    fn redrive(&self, group: &str) -> u64 {
        self.bus().redrive(group, None).wait().unwrap()
    }

    fn status(&self, group: &str, message: i64) -> Option<Status> {
        self.bus()
            .status(group, MessageId(message))
            .unwrap()
            .map(|s| match s {
                DeliveryStatus::Ready => Status::Ready,
                DeliveryStatus::Waiting => Status::Waiting,
                DeliveryStatus::Leased => Status::Leased,
                DeliveryStatus::Acked => Status::Acked,
                DeliveryStatus::Dead => Status::Dead,
                other => panic!("a state the model does not know: {other:?}"),
            })
    }

    fn dead_attempts(&self, group: &str, message: i64) -> u32 {
        self.bus()
            .dead_letter(group, MessageId(message))
            .unwrap()
            .attempts
    }

    fn reopen(&mut self) {
        drop(self.bus.take());
        self.bus = Some(open(&self.path, &self.clock));
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: queue_model::cases(),
        ..ProptestConfig::default()
    })]
    #[test]
    fn queue_behaves_like_the_model(steps in queue_model::steps()) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bus.db");
        let clock = ManualClock::new(1_000_000);
        let bus = open(&path, &clock);
        bus.create_topic(TOPIC).wait().unwrap();
        for (g, max) in GROUPS {
            bus.create_group(g, &[TOPIC], GroupOptions { max_attempts: max })
                .wait()
                .unwrap();
        }
        let mut subject = Subject { bus: Some(bus), path, clock: clock.clone() };
        queue_model::run(steps, &clock, &mut subject)?;
    }
}
