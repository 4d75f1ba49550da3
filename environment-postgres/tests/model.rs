//! The queue model of `environment-conformance`, the one the SQLite bus runs, against
//! PostgreSQL: random interleavings of publish, claim, settlements, clock moves, reopen and
//! redrive, checked step by step.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use environment_bus::{BusError, DeliveryStatus, GroupOptions, NewMessage, PublishOptions};
use environment_conformance::queue_model::{
    self, Claimed, GROUPS, ModelQueue, Refusal, Status, TOPIC,
};
use environment_core::ManualClock;
use environment_core::queue::Lease;
use environment_postgres::{PgError, PgQueue};
use proptest::prelude::*;

struct Subject {
    queue: Option<PgQueue>,
    server: postgres::Config,
    clock: ManualClock,
}

impl Subject {
    fn q(&self) -> &PgQueue {
        self.queue.as_ref().unwrap()
    }
}

fn claimed(leases: Vec<Lease>) -> Vec<Claimed> {
    leases
        .into_iter()
        .map(|l| Claimed {
            receipt: l.receipt,
            message: l.message.id,
            attempt: l.attempt,
        })
        .collect()
}

fn refusal<T>(r: Result<T, PgError>) -> Result<T, Refusal> {
    r.map_err(|e| match e {
        PgError::Refused(BusError::StaleReceipt { .. }) => Refusal::Stale,
        other => Refusal::Other(other.to_string()),
    })
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
        let m = NewMessage::new(TOPIC, vec![1, 2, 3]).with(o);
        let p = self.q().publish_message(&m).unwrap();
        (p.id, p.duplicate)
    }

    fn claim(&self, group: &str, consumer: &str, max: u32, lease: Duration) -> Vec<Claimed> {
        claimed(self.q().claim(group, consumer, max, lease).unwrap())
    }

    fn ack(&self, consumer: &str, receipt: &str) -> Result<(), Refusal> {
        refusal(self.q().ack(consumer, receipt))
    }

    fn ack_and_claim(
        &self,
        consumer: &str,
        receipt: &str,
        group: &str,
        max: u32,
        lease: Duration,
    ) -> Result<Vec<Claimed>, Refusal> {
        use environment_core::Queue;
        let next = self
            .q()
            .ack_and_claim(consumer, receipt, group, max, lease)
            .map_err(|e| match e.kind {
                environment_core::ErrorKind::Conflict => Refusal::Stale,
                _ => Refusal::Other(e.to_string()),
            });
        next.map(claimed)
    }

    fn nack(&self, consumer: &str, receipt: &str, delay: Option<Duration>) -> Result<(), Refusal> {
        refusal(self.q().nack(consumer, receipt, delay, None))
    }

    fn extend(&self, receipt: &str, lease: Duration) -> Result<(), Refusal> {
        refusal(self.q().extend(receipt, lease))
    }

    fn terminate(&self, receipt: &str, reason: &str) -> Result<(), Refusal> {
        refusal(self.q().terminate(receipt, reason))
    }

    fn redrive(&self, group: &str) -> u64 {
        use environment_core::Queue;
        self.q().redrive(group).unwrap()
    }

    fn status(&self, group: &str, message: i64) -> Option<Status> {
        self.q().status(group, message).unwrap().map(|s| match s {
            DeliveryStatus::Ready => Status::Ready,
            DeliveryStatus::Waiting => Status::Waiting,
            DeliveryStatus::Leased => Status::Leased,
            DeliveryStatus::Acked => Status::Acked,
            DeliveryStatus::Dead => Status::Dead,
            other => panic!("a state the model does not know: {other:?}"),
        })
    }

    fn dead_attempts(&self, group: &str, message: i64) -> u32 {
        self.q().dead_letter(group, message).unwrap().attempts
    }

    fn reopen(&mut self) {
        drop(self.queue.take());
        self.queue = Some(common::open(&self.server, common::config(&self.clock)));
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: queue_model::cases(),
        ..ProptestConfig::default()
    })]
    #[test]
    fn the_postgres_queue_behaves_like_the_model(steps in queue_model::steps()) {
        let Some(server) = common::fresh("model") else {
            return Ok(());
        };
        let clock = ManualClock::new(1_000_000);
        let queue = common::open(&server, common::config(&clock));
        for (g, max) in GROUPS {
            queue.create_group(g, &[TOPIC], GroupOptions { max_attempts: max }).unwrap();
        }
        let mut subject = Subject { queue: Some(queue), server, clock: clock.clone() };
        queue_model::run(steps, &clock, &mut subject)?;
    }
}
