//! Model-based test: random interleavings of publish, claim, ack, nack, extend, terminate,
//! clock advances and reopen, checked step by step against a simple in-memory model of the
//! queue's promises.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use environment_bus::{
    Backoff, Bus, BusConfig, BusError, DeliveryStatus, GroupOptions, MessageId, PublishOptions,
    Receipt,
};
use environment_core::{Clock, ManualClock};
use proptest::prelude::*;

const GROUPS: [(&str, u32); 2] = [("g1", 3), ("g2", 2)];
const TOPIC: &str = "t";
const DEDUP_WINDOW_MS: i64 = 10_000;

#[derive(Clone, Debug)]
enum Step {
    Publish {
        key: Option<u8>,
        dedup: Option<u8>,
        delay: Option<u16>,
    },
    Claim {
        group: usize,
        consumer: u8,
        max: u32,
        lease: u16,
    },
    Ack(usize),
    /// Acks a receipt and claims up to `max` more of its group, as its consumer, in one step.
    AckNext(usize, u32, u16),
    Nack(usize, Option<u16>),
    Extend(usize, u16),
    Terminate(usize),
    Advance(u16),
    Reopen,
    Redrive(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (
            proptest::option::of(0u8..3),
            proptest::option::of(0u8..6),
            proptest::option::of(0u16..3000),
        )
            .prop_map(|(key, dedup, delay)| Step::Publish { key, dedup, delay }),
        4 => (0usize..2, 0u8..3, 1u32..4, 100u16..5000)
            .prop_map(|(group, consumer, max, lease)| Step::Claim { group, consumer, max, lease }),
        3 => any::<usize>().prop_map(Step::Ack),
        2 => (any::<usize>(), 1u32..4, 100u16..5000).prop_map(|(i, max, lease)| Step::AckNext(i, max, lease)),
        2 => (any::<usize>(), proptest::option::of(0u16..3000)).prop_map(|(i, d)| Step::Nack(i, d)),
        1 => (any::<usize>(), 100u16..5000).prop_map(|(i, l)| Step::Extend(i, l)),
        1 => any::<usize>().prop_map(Step::Terminate),
        3 => (0u16..6000).prop_map(Step::Advance),
        1 => Just(Step::Reopen),
        1 => (0usize..2).prop_map(Step::Redrive),
    ]
}

#[derive(Clone, Debug, PartialEq)]
enum St {
    /// Claimable once the clock reaches `lo`; surely claimable from `hi`.
    Ready {
        lo: i64,
        hi: i64,
    },
    Waiting {
        visible_at: i64,
    },
    Leased {
        receipt: Receipt,
        until: i64,
    },
    Acked,
    Dead,
}

#[derive(Clone, Debug)]
struct Delivery {
    st: St,
    attempts: u32,
    key: Option<u8>,
    visible_at: i64,
}

impl Delivery {
    fn live(&self) -> bool {
        matches!(
            self.st,
            St::Ready { .. } | St::Waiting { .. } | St::Leased { .. }
        )
    }
}

#[derive(Default)]
struct Model {
    /// Per group: message id → delivery (BTreeMap order = publish order).
    groups: [std::collections::BTreeMap<i64, Delivery>; 2],
    dedup: HashMap<u8, (i64, i64)>,
    /// Receipts ever handed out: (group, message, receipt, consumer).
    receipts: Vec<(usize, i64, Receipt, u8)>,
    /// Keys with a redriven message: a redrive puts an old message back in line behind the
    /// key's current head, so strict publish order is only checked for the other keys.
    redriven: [std::collections::HashSet<u8>; 2],
}

impl Model {
    fn promote(&mut self, g: usize, key: Option<u8>) {
        let Some(k) = key else { return };
        let grp = &mut self.groups[g];
        if grp
            .values()
            .any(|d| d.key == Some(k) && matches!(d.st, St::Ready { .. } | St::Leased { .. }))
        {
            return;
        }
        if let Some(d) = grp
            .values_mut()
            .find(|d| d.key == Some(k) && matches!(d.st, St::Waiting { .. }))
        {
            d.st = St::Ready {
                lo: d.visible_at,
                hi: d.visible_at,
            };
        }
    }

    /// Whether `id` is the oldest live message of its key (or has no key).
    fn key_head(&self, g: usize, id: i64) -> bool {
        let d = &self.groups[g][&id];
        match d.key {
            None => true,
            Some(k) => !self.groups[g]
                .range(..id)
                .any(|(_, o)| o.key == Some(k) && o.live()),
        }
    }
}

fn open(path: &Path, clock: &ManualClock) -> Bus {
    let mut config = BusConfig::with_clock(Arc::new(clock.clone()));
    config.auto_purge = None;
    config.backoff = Backoff {
        base: Duration::from_millis(1000),
        max: Duration::from_millis(8000),
    };
    Bus::open(path, config).unwrap()
}

/// Checks a claim's `leases` (up to `max` of `group` to `consumer`, for `lease` ms at `now`)
/// against the model, and applies it: what a claim must, may and must not hand out.
#[allow(clippy::too_many_arguments)]
fn check_claim(
    m: &mut Model,
    bus: &Bus,
    group: usize,
    consumer: u8,
    max: u32,
    lease: u16,
    now: i64,
    leases: &[environment_bus::Lease],
) -> Result<(), TestCaseError> {
    let (gname, max_attempts) = GROUPS[group];
    // Expired final attempts the claim may have dead-lettered: read the truth.
    let ids: Vec<i64> = m.groups[group]
        .iter()
        .filter(|(_, d)| {
            matches!(d.st, St::Leased { until, .. } if until < now) && d.attempts >= max_attempts
        })
        .map(|(id, _)| *id)
        .collect();
    for id in ids {
        let st = bus.status(gname, MessageId(id)).unwrap();
        if st == Some(DeliveryStatus::Dead) {
            let key = m.groups[group][&id].key;
            m.groups[group].get_mut(&id).unwrap().st = St::Dead;
            m.promote(group, key);
        } else {
            prop_assert!(
                leases.len() == max as usize,
                "an exhausted expired lease survived a non-full claim"
            );
        }
    }
    prop_assert!(leases.len() <= max as usize);
    for l in leases {
        let id = l.message.id.0;
        prop_assert!(
            m.groups[group].contains_key(&id),
            "unknown message delivered"
        );
        let key = m.groups[group][&id].key;
        prop_assert!(
            m.key_head(group, id) || key.is_some_and(|k| m.redriven[group].contains(&k)),
            "ordering key delivered out of order"
        );
        if let Some(k) = key {
            let others_active = m.groups[group].iter().any(|(o, d)| {
                *o != id && d.key == Some(k) && matches!(d.st, St::Ready { .. } | St::Leased { .. })
            });
            prop_assert!(!others_active, "two messages of one key active at once");
        }
        let d = m.groups[group].get_mut(&id).unwrap();
        match d.st {
            St::Ready { lo, .. } => prop_assert!(lo <= now, "delivered before due"),
            St::Leased { until, .. } => {
                prop_assert!(until < now, "delivered while leased to another")
            }
            ref other => prop_assert!(false, "delivered in state {:?}", other),
        }
        prop_assert!(d.attempts < max_attempts, "delivered beyond max attempts");
        d.attempts += 1;
        prop_assert_eq!(l.attempt, d.attempts);
        d.st = St::Leased {
            receipt: l.receipt,
            until: now + i64::from(lease),
        };
        m.receipts.push((group, id, l.receipt, consumer));
    }
    if leases.len() < max as usize {
        // The claim saw everything due: what surely was due must have come out,
        // and what might have been due but did not is not due yet.
        let got: Vec<i64> = leases.iter().map(|l| l.message.id.0).collect();
        let ids: Vec<i64> = m.groups[group].keys().copied().collect();
        for id in ids {
            if got.contains(&id) {
                continue;
            }
            let d = m.groups[group].get_mut(&id).unwrap();
            match d.st {
                // Ready is always the head of its key in the model.
                St::Ready { lo, hi } => {
                    prop_assert!(hi > now, "a due message was not delivered (lost?)");
                    if lo <= now {
                        d.st = St::Ready { lo: now + 1, hi };
                    }
                }
                St::Leased { until, .. } => {
                    prop_assert!(until >= now, "an expired lease was not redelivered")
                }
                _ => {}
            }
        }
    }
    Ok(())
}

fn run(steps: Vec<Step>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bus.db");
    let clock = ManualClock::new(1_000_000);
    let mut bus = open(&path, &clock);
    bus.create_topic(TOPIC).wait().unwrap();
    for (g, max) in GROUPS {
        bus.create_group(g, &[TOPIC], GroupOptions { max_attempts: max })
            .wait()
            .unwrap();
    }
    let mut m = Model::default();
    let backoff = bus.config().backoff;

    for s in steps {
        let now = clock.now_ms();
        match s {
            Step::Publish { key, dedup, delay } => {
                let mut o = PublishOptions::default();
                if let Some(k) = key {
                    o = o.ordering_key(format!("k{k}"));
                }
                if let Some(d) = dedup {
                    o = o
                        .dedup_id(format!("d{d}"))
                        .dedup_window(Duration::from_millis(DEDUP_WINDOW_MS as u64));
                }
                if let Some(d) = delay {
                    o = o.delay(Duration::from_millis(u64::from(d)));
                }
                let p = bus.publish(TOPIC, vec![1, 2, 3], o).wait().unwrap();
                let expected_dup = dedup
                    .and_then(|d| m.dedup.get(&d))
                    .filter(|(_, exp)| *exp > now);
                match expected_dup {
                    Some((id, _)) => {
                        prop_assert!(p.duplicate, "dedup id not honoured");
                        prop_assert_eq!(p.id, MessageId(*id));
                    }
                    None => {
                        prop_assert!(!p.duplicate, "a fresh publish was called a duplicate");
                        if let Some(d) = dedup {
                            m.dedup.insert(d, (p.id.0, now + DEDUP_WINDOW_MS));
                        }
                        let visible_at = now + i64::from(delay.unwrap_or(0));
                        for g in 0..2 {
                            let busy = key.is_some()
                                && m.groups[g].values().any(|d| d.key == key && d.live());
                            let st = if busy {
                                St::Waiting { visible_at }
                            } else {
                                St::Ready {
                                    lo: visible_at,
                                    hi: visible_at,
                                }
                            };
                            m.groups[g].insert(
                                p.id.0,
                                Delivery {
                                    st,
                                    attempts: 0,
                                    key,
                                    visible_at,
                                },
                            );
                        }
                    }
                }
            }
            Step::Claim {
                group,
                consumer,
                max,
                lease,
            } => {
                let leases = bus
                    .claim(
                        GROUPS[group].0,
                        &format!("c{consumer}"),
                        max,
                        Duration::from_millis(u64::from(lease)),
                    )
                    .wait()
                    .unwrap();
                check_claim(&mut m, &bus, group, consumer, max, lease, now, &leases)?;
            }
            Step::Ack(i)
            | Step::AckNext(i, ..)
            | Step::Nack(i, _)
            | Step::Extend(i, _)
            | Step::Terminate(i)
                if m.receipts.is_empty() =>
            {
                let _ = i;
            }
            Step::AckNext(i, max, lease) => {
                let (g, id, r, consumer) = m.receipts[i % m.receipts.len()];
                let res = bus
                    .ack_and_claim(
                        &format!("c{consumer}"),
                        &r,
                        GROUPS[g].0,
                        max,
                        Duration::from_millis(u64::from(lease)),
                    )
                    .wait();
                let current =
                    matches!(m.groups[g][&id].st, St::Leased { receipt, .. } if receipt == r);
                if current {
                    let leases = res.map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                    let key = m.groups[g][&id].key;
                    m.groups[g].get_mut(&id).unwrap().st = St::Acked;
                    m.promote(g, key);
                    check_claim(&mut m, &bus, g, consumer, max, lease, now, &leases)?;
                } else {
                    prop_assert!(
                        matches!(res, Err(BusError::StaleReceipt { .. })),
                        "{:?}",
                        res
                    );
                }
            }
            Step::Ack(i) => {
                let (g, id, r, _) = m.receipts[i % m.receipts.len()];
                let res = bus.ack(&r).wait();
                let current =
                    matches!(m.groups[g][&id].st, St::Leased { receipt, .. } if receipt == r);
                if current {
                    prop_assert!(res.is_ok(), "ack refused: {:?}", res);
                    let key = m.groups[g][&id].key;
                    m.groups[g].get_mut(&id).unwrap().st = St::Acked;
                    m.promote(g, key);
                } else {
                    prop_assert!(
                        matches!(res, Err(BusError::StaleReceipt { .. })),
                        "{:?}",
                        res
                    );
                }
            }
            Step::Nack(i, delay) => {
                let (g, id, r, _) = m.receipts[i % m.receipts.len()];
                let res = match delay {
                    Some(d) => bus
                        .nack_with_delay(&r, Duration::from_millis(u64::from(d)))
                        .wait(),
                    None => bus.nack(&r).wait(),
                };
                let current =
                    matches!(m.groups[g][&id].st, St::Leased { receipt, .. } if receipt == r);
                if current {
                    prop_assert!(res.is_ok(), "nack refused: {:?}", res);
                    let d = m.groups[g].get_mut(&id).unwrap();
                    if d.attempts >= GROUPS[g].1 {
                        d.st = St::Dead;
                        let key = d.key;
                        m.promote(g, key);
                    } else {
                        d.st = match delay {
                            Some(x) => St::Ready {
                                lo: now + i64::from(x),
                                hi: now + i64::from(x),
                            },
                            None => {
                                let (lo, hi) = backoff.bounds_ms(d.attempts);
                                prop_assert!(lo > 0, "a bare nack may retry instantly");
                                St::Ready {
                                    lo: now + lo,
                                    hi: now + hi,
                                }
                            }
                        };
                    }
                } else {
                    prop_assert!(
                        matches!(res, Err(BusError::StaleReceipt { .. })),
                        "{:?}",
                        res
                    );
                }
            }
            Step::Extend(i, lease) => {
                let (g, id, r, _) = m.receipts[i % m.receipts.len()];
                let res = bus
                    .extend(&r, Duration::from_millis(u64::from(lease)))
                    .wait();
                let current =
                    matches!(m.groups[g][&id].st, St::Leased { receipt, .. } if receipt == r);
                if current {
                    prop_assert!(res.is_ok(), "extend refused: {:?}", res);
                    m.groups[g].get_mut(&id).unwrap().st = St::Leased {
                        receipt: r,
                        until: now + i64::from(lease),
                    };
                } else {
                    prop_assert!(
                        matches!(res, Err(BusError::StaleReceipt { .. })),
                        "{:?}",
                        res
                    );
                }
            }
            Step::Terminate(i) => {
                let (g, id, r, _) = m.receipts[i % m.receipts.len()];
                let res = bus.terminate(&r, "poison").wait();
                let current =
                    matches!(m.groups[g][&id].st, St::Leased { receipt, .. } if receipt == r);
                if current {
                    prop_assert!(res.is_ok(), "terminate refused: {:?}", res);
                    let key = m.groups[g][&id].key;
                    m.groups[g].get_mut(&id).unwrap().st = St::Dead;
                    m.promote(g, key);
                } else {
                    prop_assert!(
                        matches!(res, Err(BusError::StaleReceipt { .. })),
                        "{:?}",
                        res
                    );
                }
            }
            Step::Advance(ms) => clock.advance(i64::from(ms)),
            Step::Reopen => {
                drop(bus);
                bus = open(&path, &clock);
            }
            Step::Redrive(g) => {
                let n = bus.redrive(GROUPS[g].0, None).wait().unwrap();
                let dead: Vec<i64> = m.groups[g]
                    .iter()
                    .filter(|(_, d)| d.st == St::Dead)
                    .map(|(id, _)| *id)
                    .collect();
                prop_assert_eq!(n, dead.len() as u64);
                for id in dead {
                    let key = m.groups[g][&id].key;
                    let busy =
                        key.is_some() && m.groups[g].values().any(|d| d.key == key && d.live());
                    let d = m.groups[g].get_mut(&id).unwrap();
                    d.attempts = 0;
                    d.st = if busy {
                        St::Waiting {
                            visible_at: d.visible_at,
                        }
                    } else {
                        St::Ready { lo: now, hi: now }
                    };
                    if let Some(k) = key {
                        m.redriven[g].insert(k);
                    }
                }
            }
        }
    }

    // Drain: with time far ahead every lease has expired and every backoff passed; acking all
    // that comes out must leave every message acked or dead, with nothing acked redelivered.
    for (g, (gname, max_attempts)) in GROUPS.iter().enumerate() {
        for _round in 0..((*max_attempts as usize + 2) * 40) {
            clock.advance(3_600_000);
            let leases = bus
                .claim(gname, "drain", 50, Duration::from_secs(60))
                .wait()
                .unwrap();
            if leases.is_empty() {
                break;
            }
            for l in leases {
                let d = m.groups[g].get_mut(&l.message.id.0).unwrap();
                prop_assert!(d.live(), "acked or dead message redelivered: {:?}", d.st);
                bus.ack(&l.receipt).wait().unwrap();
                d.st = St::Acked;
            }
        }
        for (id, d) in &mut m.groups[g] {
            let st = bus.status(gname, MessageId(*id)).unwrap();
            match st {
                Some(DeliveryStatus::Acked) => {
                    prop_assert!(
                        matches!(d.st, St::Acked | St::Leased { .. } | St::Ready { .. }),
                        "{:?}",
                        d.st
                    );
                    prop_assert!(d.st == St::Acked || d.attempts < *max_attempts);
                }
                Some(DeliveryStatus::Dead) => {
                    let dl = bus.dead_letter(gname, MessageId(*id)).unwrap();
                    prop_assert!(
                        d.st == St::Dead || d.attempts >= *max_attempts,
                        "dead too early: {:?} after {} attempts",
                        d.st,
                        d.attempts
                    );
                    prop_assert_eq!(dl.attempts, d.attempts);
                }
                other => prop_assert!(
                    false,
                    "message {} left in {:?} (model {:?})",
                    id,
                    other,
                    d.st
                ),
            }
        }
    }
    Ok(())
}

proptest! {
    // 48 cases keep the debug run within a few seconds; PROPTEST_CASES raises it for a soak.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(48),
        ..ProptestConfig::default()
    })]
    #[test]
    fn queue_behaves_like_the_model(steps in proptest::collection::vec(step(), 1..80)) {
        run(steps)?;
    }
}
