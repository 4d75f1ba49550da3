//! The queue's two stores side by side in one run: the embedded SQLite bus and the PostgreSQL
//! queue (a local server named by `ENVIRONMENT_TEST_POSTGRES`), publish → claim → ack one
//! message at a time from 1 and 8 clients, in batches of 100, and the 8-client row again with
//! ack-and-claim-next (a worker's cycle in two operations). Without a server the PostgreSQL
//! rows are skipped with the reason (under `CI=true` that fails).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main};
use environment_bus::{Bus, BusConfig, GroupOptions, NewMessage, Receipt};
use environment_core::Queue;
use environment_core::queue::{Publish, Settlement};
use environment_postgres::{PgQueue, PgQueueConfig};

const LEASE: Duration = Duration::from_secs(60);
const CLIENTS: u64 = 8;

/// What the rows need of a store beyond the port: its batch operations.
trait Store: Queue + Clone + Send + 'static {
    fn publish_100(&self);
    fn ack_all(&self, consumer: &str, receipts: &[String]);
}

impl Store for Bus {
    fn publish_100(&self) {
        let batch = (0..100)
            .map(|_| NewMessage::new("t", vec![7u8; 64]))
            .collect();
        self.publish_batch(batch).wait().unwrap();
    }
    fn ack_all(&self, _consumer: &str, receipts: &[String]) {
        let receipts: Vec<Receipt> = receipts.iter().map(|r| r.parse().unwrap()).collect();
        for r in self.ack_many(&receipts).wait().unwrap() {
            r.unwrap();
        }
    }
}

impl Store for PgQueue {
    fn publish_100(&self) {
        let batch: Vec<_> = (0..100)
            .map(|_| NewMessage::new("t", vec![7u8; 64]))
            .collect();
        self.publish_batch(&batch).unwrap();
    }
    fn ack_all(&self, consumer: &str, receipts: &[String]) {
        let receipts: Vec<&str> = receipts.iter().map(String::as_str).collect();
        for r in self.ack_many(consumer, &receipts).unwrap() {
            r.unwrap();
        }
    }
}

/// One message through its life: publish, claim, ack (three transactions).
fn round_trip(q: &impl Store, consumer: &str) {
    q.publish("t", vec![7u8; 64], Publish::default()).unwrap();
    for l in q.claim("g", consumer, 1, LEASE).unwrap() {
        q.settle(consumer, &l.receipt, Settlement::Ack).unwrap();
    }
}

/// 100 messages: one batch publish, one claim of 100, one batch ack.
fn round_trip_100(q: &impl Store, consumer: &str) {
    q.publish_100();
    let leases = q.claim("g", consumer, 100, LEASE).unwrap();
    let receipts: Vec<String> = leases.into_iter().map(|l| l.receipt).collect();
    q.ack_all(consumer, &receipts);
}

/// `iters` cycles spread over [`CLIENTS`] threads.
fn clients<S: Store>(q: &S, iters: u64, cycle: fn(&S, &str, u64)) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for c in 0..CLIENTS {
            let q = q.clone();
            let n = iters / CLIENTS + u64::from(c < iters % CLIENTS);
            s.spawn(move || cycle(&q, &format!("c{c}"), n));
        }
    });
    start.elapsed()
}

/// A worker's cycle in two operations: publish, then ack what it holds and claim the next.
fn ack_next_cycles(q: &impl Store, consumer: &str, n: u64) {
    let mut held: Option<String> = None;
    for _ in 0..n {
        q.publish("t", vec![7u8; 64], Publish::default()).unwrap();
        let next = match &held {
            Some(r) => q.ack_and_claim(consumer, r, "g", 1, LEASE),
            None => q.claim("g", consumer, 1, LEASE),
        };
        held = next.unwrap().pop().map(|l| l.receipt);
    }
    if let Some(r) = held {
        q.settle(consumer, &r, Settlement::Ack).unwrap();
    }
}

fn rows<S: Store>(g: &mut BenchmarkGroup<'_, WallTime>, store: &str, open: &dyn Fn() -> S) {
    let q = open();
    g.throughput(Throughput::Elements(1));
    g.bench_function(format!("{store}/publish_claim_ack_1_client"), |b| {
        b.iter(|| round_trip(&q, "c"))
    });
    g.bench_function(format!("{store}/publish_claim_ack_8_clients"), |b| {
        b.iter_custom(|iters| clients(&q, iters, |q, c, n| (0..n).for_each(|_| round_trip(q, c))))
    });
    g.bench_function(format!("{store}/publish_ackclaimnext_8_clients"), |b| {
        b.iter_custom(|iters| clients(&q, iters, ack_next_cycles))
    });
    g.throughput(Throughput::Elements(100));
    g.bench_function(
        format!("{store}/publish_claim_ack_batch100_1_client"),
        |b| b.iter(|| round_trip_100(&q, "c")),
    );
    g.bench_function(
        format!("{store}/publish_claim_ack_batch100_8_clients"),
        |b| {
            b.iter_custom(|iters| {
                clients(&q, iters, |q, c, n| {
                    (0..n).for_each(|_| round_trip_100(q, c))
                })
            })
        },
    );
}

fn stores(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut g = c.benchmark_group("queue");
    let sqlite = || {
        let config = BusConfig {
            auto_purge: None,
            ..BusConfig::default()
        };
        let bus = Bus::open(dir.path().join("bus.db"), config).unwrap();
        bus.create_topic("t").wait().unwrap();
        bus.create_group("g", &["t"], GroupOptions::default())
            .wait()
            .unwrap();
        bus
    };
    rows(&mut g, "sqlite", &sqlite);
    if environment_conformance::prerequisite::postgres().is_some() {
        let postgres = || {
            let server = environment_benches::postgres_schema("bench_queue").unwrap();
            let config = PgQueueConfig {
                pool_size: CLIENTS as u32 + 1,
                auto_purge: None,
                ..PgQueueConfig::default()
            };
            let q = PgQueue::open(server, config).unwrap();
            q.create_group("g", &["t"], GroupOptions::default())
                .unwrap();
            q
        };
        rows(&mut g, "postgres", &postgres);
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = stores
}
criterion_main!(benches);
