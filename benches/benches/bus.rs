//! environment-bus benches: publish → claim → ack one at a time, in batches of 100, with 8
//! concurrent clients (group commit; and with ack-and-claim-next, a cycle of two operations), the raw single-row SQLite transaction rate and the raw
//! group-commit rate of 8 threads measured in the same run (for the ratios), and the
//! publish-to-claim wake-up latency of a waiting consumer.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use environment_bus::{Bus, BusConfig, GroupOptions, NewMessage, PublishOptions};

const LEASE: Duration = Duration::from_secs(60);

fn open_bus(dir: &tempfile::TempDir, name: &str) -> Bus {
    let config = BusConfig {
        auto_purge: None,
        ..BusConfig::default()
    };
    let bus = Bus::open(dir.path().join(name), config).unwrap();
    bus.create_topic("t").wait().unwrap();
    bus.create_group("g", &["t"], GroupOptions::default())
        .wait()
        .unwrap();
    bus
}

/// One message through its whole life, three transactions.
fn round_trip(bus: &Bus, consumer: &str) {
    bus.publish("t", vec![7u8; 64], PublishOptions::default())
        .wait()
        .unwrap();
    let leases = bus.claim("g", consumer, 1, LEASE).wait().unwrap();
    for l in &leases {
        bus.ack(&l.receipt).wait().unwrap();
    }
}

/// `n` messages published, claimed and acked in batches of (up to) 100.
fn round_trip_batches(bus: &Bus, consumer: &str, n: u64) {
    let mut left = n;
    while left > 0 {
        let k = left.min(100);
        let batch = (0..k)
            .map(|_| NewMessage::new("t", vec![7u8; 64]))
            .collect();
        bus.publish_batch(batch).wait().unwrap();
        let leases = bus.claim("g", consumer, k as u32, LEASE).wait().unwrap();
        let receipts: Vec<_> = leases.iter().map(|l| l.receipt).collect();
        for r in bus.ack_many(&receipts).wait().unwrap() {
            r.unwrap();
        }
        left -= k;
    }
}

/// A database of one table, set up as the bus's (WAL, synchronous=NORMAL), for the raw rows.
fn raw_table(dir: &tempfile::TempDir, name: &str) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(dir.path().join(name)).unwrap();
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    conn.pragma_update(None, "synchronous", "NORMAL").unwrap();
    conn.execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, v BLOB)")
        .unwrap();
    conn
}

fn insert_row(conn: &rusqlite::Connection, payload: &[u8]) {
    conn.prepare_cached("INSERT INTO t(v) VALUES (?1)")
        .unwrap()
        .execute([payload])
        .unwrap();
}

fn sqlite_raw(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let conn = raw_table(&dir, "raw.db");
    let payload = vec![7u8; 64];
    let mut g = c.benchmark_group("bus");
    g.throughput(Throughput::Elements(1));
    g.bench_function("sqlite_raw_single_row_txn", |b| {
        b.iter(|| {
            conn.execute_batch("BEGIN IMMEDIATE").unwrap();
            insert_row(&conn, &payload);
            conn.execute_batch("COMMIT").unwrap();
        })
    });
    g.finish();
}

/// The ceiling of the 8-client rows on this machine: 8 threads each hand a single-row insert to
/// one writer thread, which commits everything queued in one transaction and then wakes the
/// senders. Group commit with nothing else in it; a message through the bus takes three such
/// operations (publish, claim, ack), each doing more than one insert.
fn sqlite_group_commit(c: &mut Criterion) {
    /// One sender's wait for its commit.
    #[derive(Default)]
    struct Slot {
        done: Mutex<bool>,
        ready: Condvar,
    }
    #[derive(Default)]
    struct Queue {
        waiting: Mutex<(Vec<Arc<Slot>>, bool)>,
        ready: Condvar,
    }
    let dir = tempfile::tempdir().unwrap();
    let conn = Mutex::new(raw_table(&dir, "group.db"));
    let mut g = c.benchmark_group("bus");
    g.throughput(Throughput::Elements(1));
    g.bench_function("sqlite_raw_group_commit_8_threads", |b| {
        b.iter_custom(|iters| {
            let queue = Queue::default();
            let start = Instant::now();
            std::thread::scope(|s| {
                s.spawn(|| {
                    let conn = conn.lock().unwrap();
                    let payload = vec![7u8; 64];
                    loop {
                        let group = {
                            let mut w = queue.waiting.lock().unwrap();
                            while w.0.is_empty() && !w.1 {
                                w = queue.ready.wait(w).unwrap();
                            }
                            if w.0.is_empty() {
                                return;
                            }
                            std::mem::take(&mut w.0)
                        };
                        conn.prepare_cached("BEGIN IMMEDIATE")
                            .unwrap()
                            .execute([])
                            .unwrap();
                        for _ in &group {
                            insert_row(&conn, &payload);
                        }
                        conn.prepare_cached("COMMIT").unwrap().execute([]).unwrap();
                        for slot in group {
                            *slot.done.lock().unwrap() = true;
                            slot.ready.notify_one();
                        }
                    }
                });
                let clients: Vec<_> = (0..8u64)
                    .map(|c| {
                        let queue = &queue;
                        s.spawn(move || {
                            for _ in 0..iters / 8 + u64::from(c < iters % 8) {
                                let slot = Arc::new(Slot::default());
                                queue.waiting.lock().unwrap().0.push(slot.clone());
                                queue.ready.notify_one();
                                let mut done = slot.done.lock().unwrap();
                                while !*done {
                                    done = slot.ready.wait(done).unwrap();
                                }
                            }
                        })
                    })
                    .collect();
                for c in clients {
                    c.join().unwrap();
                }
                let elapsed = start.elapsed();
                queue.waiting.lock().unwrap().1 = true;
                queue.ready.notify_one();
                elapsed
            })
        })
    });
    g.finish();
}

fn one_client(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut g = c.benchmark_group("bus");
    let bus = open_bus(&dir, "single.db");
    g.throughput(Throughput::Elements(1));
    g.bench_function("publish_claim_ack_single", |b| {
        b.iter(|| round_trip(&bus, "c"))
    });
    let bus = open_bus(&dir, "batch.db");
    g.throughput(Throughput::Elements(100));
    g.bench_function("publish_claim_ack_batch100", |b| {
        b.iter(|| round_trip_batches(&bus, "c", 100))
    });
    g.finish();
}

/// `iters` messages spread over 8 client threads; each client works one message (or one batch
/// of 100) at a time and the writer's group commit merges their transactions.
fn eight_clients(bus: &Bus, iters: u64, per_iter: u64, batch: bool) -> Duration {
    let clients = 8u64;
    let start = Instant::now();
    std::thread::scope(|s| {
        for c in 0..clients {
            let bus = bus.clone();
            let n = iters / clients + u64::from(c < iters % clients);
            s.spawn(move || {
                let name = format!("c{c}");
                for _ in 0..n {
                    if batch {
                        round_trip_batches(&bus, &name, per_iter);
                    } else {
                        round_trip(&bus, &name);
                    }
                }
            });
        }
    });
    start.elapsed()
}

/// [`eight_clients`] one message at a time, each worker's cycle two operations: it publishes,
/// then acks what it holds and claims the next in one step (ack-and-claim-next).
fn eight_clients_ack_next(bus: &Bus, iters: u64) -> Duration {
    let clients = 8u64;
    let start = Instant::now();
    std::thread::scope(|s| {
        for c in 0..clients {
            let bus = bus.clone();
            let n = iters / clients + u64::from(c < iters % clients);
            s.spawn(move || {
                let name = format!("n{c}");
                let mut held = None;
                for _ in 0..n {
                    bus.publish("t", vec![7u8; 64], PublishOptions::default())
                        .wait()
                        .unwrap();
                    let next = match &held {
                        Some(receipt) => bus.ack_and_claim(&name, receipt, "g", 1, LEASE),
                        None => bus.claim("g", &name, 1, LEASE),
                    };
                    held = next.wait().unwrap().first().map(|l| l.receipt);
                }
                if let Some(receipt) = held {
                    bus.ack(&receipt).wait().unwrap();
                }
            });
        }
    });
    start.elapsed()
}

fn concurrent(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut g = c.benchmark_group("bus");
    let bus = open_bus(&dir, "c8.db");
    g.throughput(Throughput::Elements(1));
    g.bench_function("publish_claim_ack_8_clients_single", |b| {
        b.iter_custom(|iters| eight_clients(&bus, iters, 1, false))
    });
    let bus = open_bus(&dir, "c8n.db");
    g.bench_function("publish_ackclaimnext_8_clients_single", |b| {
        b.iter_custom(|iters| eight_clients_ack_next(&bus, iters))
    });
    let bus = open_bus(&dir, "c8b.db");
    g.throughput(Throughput::Elements(100));
    g.bench_function("publish_claim_ack_8_clients_batch100", |b| {
        b.iter_custom(|iters| eight_clients(&bus, iters, 100, true))
    });
    g.finish();
}

/// From the start of a publish to the lease in the hands of a consumer that was already
/// waiting in `next()`.
fn wake_latency(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let config = BusConfig {
        auto_purge: None,
        // An hour: only the wake-up can explain a prompt claim.
        idle_recheck: Duration::from_secs(3600),
        ..BusConfig::default()
    };
    let bus = Bus::open(dir.path().join("wake.db"), config).unwrap();
    bus.create_topic("t").wait().unwrap();
    bus.create_group("g", &["t"], GroupOptions::default())
        .wait()
        .unwrap();
    let consumer = Arc::new(bus.consumer("g", "waiter", LEASE).unwrap());
    let mut g = c.benchmark_group("bus");
    g.throughput(Throughput::Elements(1));
    g.bench_function("wake_latency_publish_to_claim", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let consumer = consumer.clone();
                    let waiter = tokio::spawn(async move {
                        let lease = consumer.next().await.unwrap();
                        (Instant::now(), lease)
                    });
                    // Give the consumer time to find the queue empty and park.
                    tokio::time::sleep(Duration::from_micros(300)).await;
                    let start = Instant::now();
                    bus.publish("t", vec![1u8; 64], PublishOptions::default())
                        .await
                        .unwrap();
                    let (got, lease) = waiter.await.unwrap();
                    total += got.duration_since(start);
                    bus.ack(&lease.receipt).await.unwrap();
                }
                total
            })
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    targets = sqlite_raw, sqlite_group_commit, one_client, concurrent, wake_latency
}
criterion_main!(benches);
