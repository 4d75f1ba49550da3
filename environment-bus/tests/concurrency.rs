//! Eight competing consumers on threads, ten thousand messages: each message is processed by
//! exactly one consumer at a time, keyed messages in order, and none is lost.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use environment_bus::{Bus, BusConfig, GroupOptions, NewMessage, PublishOptions};

const MESSAGES: usize = 10_000;
const CONSUMERS: usize = 8;
const KEYS: usize = 10;

fn payload(i: usize) -> Vec<u8> {
    (i as u64).to_le_bytes().to_vec()
}

fn index(p: &[u8]) -> usize {
    u64::from_le_bytes(p.try_into().unwrap()) as usize
}

#[test]
fn eight_consumers_ten_thousand_messages() {
    let dir = tempfile::tempdir().unwrap();
    let config = BusConfig {
        auto_purge: None,
        ..BusConfig::default()
    };
    let bus = Bus::open(dir.path().join("bus.db"), config).unwrap();
    bus.create_topic("work").wait().unwrap();
    bus.create_group("pool", &["work"], GroupOptions { max_attempts: 1000 })
        .wait()
        .unwrap();

    // Every fifth message carries one of ten ordering keys; its sequence within the key is
    // what the order check follows.
    let key_of = |i: usize| i.is_multiple_of(5).then_some((i / 5) % KEYS);
    let seq_in_key = |i: usize| i / 5 / KEYS;

    let producer = {
        let bus = bus.clone();
        std::thread::spawn(move || {
            for chunk in (0..MESSAGES).collect::<Vec<_>>().chunks(500) {
                let batch = chunk
                    .iter()
                    .map(|&i| {
                        let mut o = PublishOptions::default();
                        if let Some(k) = key_of(i) {
                            o = o.ordering_key(format!("key-{k}"));
                        }
                        NewMessage::new("work", payload(i)).with(o)
                    })
                    .collect();
                bus.publish_batch(batch).wait().unwrap();
            }
        })
    };

    let in_process = Arc::new(Mutex::new(HashSet::new()));
    let acked_by: Arc<Mutex<HashMap<usize, usize>>> = Arc::default();
    let key_next = Arc::new(Mutex::new(vec![0usize; KEYS]));
    let done = Arc::new(AtomicUsize::new(0));
    let consumers: Vec<_> = (0..CONSUMERS)
        .map(|c| {
            let bus = bus.clone();
            let in_process = in_process.clone();
            let acked_by = acked_by.clone();
            let key_next = key_next.clone();
            let done = done.clone();
            std::thread::spawn(move || {
                let name = format!("consumer-{c}");
                let mut n = 0usize;
                while done.load(Ordering::SeqCst) < MESSAGES {
                    let leases = bus
                        .claim("pool", &name, 16, Duration::from_secs(120))
                        .wait()
                        .unwrap();
                    if leases.is_empty() {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    for l in leases {
                        let i = index(&l.message.payload);
                        assert!(
                            in_process.lock().unwrap().insert(i),
                            "message {i} held by two consumers at once"
                        );
                        if let Some(k) = key_of(i) {
                            assert_eq!(
                                key_next.lock().unwrap()[k],
                                seq_in_key(i),
                                "key {k} out of order"
                            );
                        }
                        n += 1;
                        // Released before settling: until the settle commits nobody else can
                        // claim it, so a second holder would show up above.
                        in_process.lock().unwrap().remove(&i);
                        if n.is_multiple_of(20) {
                            bus.nack_with_delay(&l.receipt, Duration::ZERO)
                                .wait()
                                .unwrap();
                            continue;
                        }
                        if let Some(k) = key_of(i) {
                            key_next.lock().unwrap()[k] += 1;
                        }
                        bus.ack(&l.receipt).wait().unwrap();
                        *acked_by.lock().unwrap().entry(i).or_default() += 1;
                        done.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    producer.join().unwrap();
    for c in consumers {
        c.join().unwrap();
    }
    let acked = acked_by.lock().unwrap();
    assert_eq!(acked.len(), MESSAGES, "messages lost");
    assert!(acked.values().all(|&n| n == 1), "a message was acked twice");
    let m = bus.metrics().unwrap();
    assert_eq!((m[0].groups[0].depth, m[0].groups[0].in_flight), (0, 0));
    assert!(m[0].groups[0].redeliveries > 0);
}

#[test]
fn refusals_inside_a_group_commit_spare_their_neighbours() {
    let dir = tempfile::tempdir().unwrap();
    let config = BusConfig {
        auto_purge: None,
        ..BusConfig::default()
    };
    let bus = Bus::open(dir.path().join("bus.db"), config).unwrap();
    bus.create_topic("work").wait().unwrap();
    bus.create_group("pool", &["work"], GroupOptions::default())
        .wait()
        .unwrap();
    let forged: environment_bus::Receipt = "1.00000000deadbeef".parse().unwrap();
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let bus = bus.clone();
            std::thread::spawn(move || {
                for i in 0..100u8 {
                    // Sent without waiting, so they share group commits with other threads'.
                    let good = bus.publish("work", vec![t, i], PublishOptions::default());
                    let bad = bus.publish_batch(vec![
                        NewMessage::new("work", b"bad".to_vec()),
                        NewMessage::new("ghost", b"bad".to_vec()),
                    ]);
                    let stale = bus.ack(&forged);
                    let wrong_group = bus.claim("nobody", "c", 1, Duration::from_secs(1));
                    assert!(!good.wait().unwrap().duplicate);
                    assert!(bad.wait().is_err());
                    assert!(stale.wait().is_err());
                    assert!(wrong_group.wait().is_err());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut seen = HashSet::new();
    loop {
        let leases = bus
            .claim("pool", "c", 500, Duration::from_secs(60))
            .wait()
            .unwrap();
        if leases.is_empty() {
            break;
        }
        for l in leases {
            assert_ne!(
                l.message.payload, b"bad",
                "half of a refused batch was committed"
            );
            assert!(seen.insert(l.message.payload.clone()));
        }
    }
    assert_eq!(seen.len(), 400);
}

/// The writer wakes one waiting caller per group commit and leaves it to wake the others:
/// every caller must still get its answer however it waits — several commands outstanding on
/// one thread and waited for out of order, commands dropped unanswered, awaited ones.
#[test]
fn every_caller_of_a_group_commit_gets_its_answer() {
    let dir = tempfile::tempdir().unwrap();
    let config = BusConfig {
        auto_purge: None,
        ..BusConfig::default()
    };
    let bus = Bus::open(dir.path().join("bus.db"), config).unwrap();
    bus.create_topic("t").wait().unwrap();
    bus.create_group("g", &["t"], GroupOptions::default())
        .wait()
        .unwrap();
    let threads = 6u8;
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for t in 0..threads {
        let bus = bus.clone();
        let done = done_tx.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            for i in 0..200u8 {
                let a = bus.publish("t", vec![t, i], PublishOptions::default());
                let b = bus.publish("t", vec![t, i, 1], PublishOptions::default());
                let c = bus.claim("g", "c", 1, Duration::from_secs(60));
                match (t + i) % 4 {
                    0 => {
                        c.wait().unwrap();
                        b.wait().unwrap();
                        a.wait().unwrap();
                    }
                    1 => {
                        drop(a);
                        b.wait().unwrap();
                        drop(c);
                    }
                    2 => rt.block_on(async {
                        b.await.unwrap();
                        a.await.unwrap();
                        c.await.unwrap();
                    }),
                    _ => {
                        drop(b);
                        drop(c);
                        a.wait().unwrap();
                    }
                }
            }
            done.send(()).unwrap();
        });
    }
    for _ in 0..threads {
        done_rx
            .recv_timeout(Duration::from_secs(120))
            .expect("a caller was never answered");
    }
    // A command the writer takes after every one of theirs: once it is answered, the dropped
    // ones queued before it are carried out too (metrics read the database, not the queue).
    bus.create_topic("t").wait().unwrap();
    // Dropped or not, every publish was carried out.
    assert_eq!(
        bus.metrics().unwrap()[0].retained,
        2 * 200 * u64::from(threads)
    );
}
