//! Several machines (each its own queue and pool) claiming from one group at once: every
//! message is leased to one of them at a time, a key's messages one at a time and in publish
//! order, and every message is handled exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use environment_bus::{GroupOptions, NewMessage, PublishOptions};
use environment_postgres::PgQueueConfig;

const MESSAGES: i64 = 240;
const KEYS: i64 = 6;
const MACHINES: usize = 4;

#[test]
fn machines_claiming_at_once_share_the_work_without_overlap() {
    let Some(server) = common::fresh("concurrency") else {
        return;
    };
    let config = || PgQueueConfig {
        pool_size: 2,
        ..PgQueueConfig::default()
    };
    let publisher = common::open(&server, config());
    publisher
        .create_group("workers", &["jobs"], GroupOptions::default())
        .unwrap();
    // Every other message has an ordering key.
    let mut key_of = HashMap::new();
    for i in 0..MESSAGES {
        let mut o = PublishOptions::default();
        let key = (i % 2 == 0).then(|| format!("k{}", (i / 2) % KEYS));
        if let Some(k) = &key {
            o = o.ordering_key(k.clone());
        }
        let m = NewMessage::new("jobs", i.to_le_bytes().to_vec()).with(o);
        let id = publisher.publish_message(&m).unwrap().id;
        key_of.insert(id, key);
    }
    let key_of = Arc::new(key_of);
    // Who holds each key now, and the order each key's messages were handled in.
    let holding: Arc<Mutex<HashSet<String>>> = Arc::default();
    let handled: Arc<Mutex<Vec<i64>>> = Arc::default();
    let workers: Vec<_> = (0..MACHINES)
        .map(|w| {
            let queue = common::open(&server, config());
            let (key_of, holding, handled) = (key_of.clone(), holding.clone(), handled.clone());
            std::thread::spawn(move || {
                let me = format!("machine-{w}");
                let mut idle = 0;
                while idle < 20 {
                    let leases = queue
                        .claim("workers", &me, 3, Duration::from_secs(120))
                        .unwrap();
                    if leases.is_empty() {
                        idle += 1;
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                    idle = 0;
                    for l in leases {
                        let key = key_of[&l.message.id].clone();
                        if let Some(k) = &key {
                            assert!(
                                holding.lock().unwrap().insert(k.clone()),
                                "two messages of {k} leased at once"
                            );
                        }
                        handled.lock().unwrap().push(l.message.id);
                        if let Some(k) = &key {
                            holding.lock().unwrap().remove(k);
                        }
                        queue.ack(&me, &l.receipt).unwrap();
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let handled = handled.lock().unwrap().clone();
    let unique: HashSet<i64> = handled.iter().copied().collect();
    assert_eq!(unique.len(), handled.len(), "a message was handled twice");
    assert_eq!(
        handled.len() as i64,
        MESSAGES,
        "a message was never handled"
    );
    // Per key, in publish (id) order.
    for k in 0..KEYS {
        let key = Some(format!("k{k}"));
        let order: Vec<i64> = handled
            .iter()
            .copied()
            .filter(|id| key_of[id] == key)
            .collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(order, sorted, "key k{k} was handled out of order");
    }
}
