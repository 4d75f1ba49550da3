//! A queue's promises as a model: random interleavings of publish, claim, ack,
//! ack-and-claim-next, nack, extend, terminate, clock advances, reopen and redrive, checked step
//! by step against a simple in-memory model, then drained. Any store of the queue runs it
//! through [`ModelQueue`]: the SQLite bus and the PostgreSQL queue run the same steps.

use std::collections::HashMap;
use std::time::Duration;

use environment_core::{Clock, ManualClock};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// A delivery as the queue under test reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// Claimable now or after its delay or backoff.
    Ready,
    /// Behind an earlier message with the same ordering key.
    Waiting,
    /// Leased (the lease may have run out; the next claim decides).
    Leased,
    /// Acked.
    Acked,
    /// A dead letter.
    Dead,
}

/// Why a settlement was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The receipt was settled or claimed again since (nothing changed).
    Stale,
    /// Anything else: a failure of the test.
    Other(String),
}

/// A message leased by a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claimed {
    /// What settles it, in text.
    pub receipt: String,
    /// The message's id.
    pub message: i64,
    /// Which delivery this is (1 is the first).
    pub attempt: u32,
}

/// A queue under test. It was made with [`TOPIC`] and the groups of [`GROUPS`] (each with its
/// most attempts), the backoff [`BACKOFF_MS`], automatic purging off, and the model's clock.
pub trait ModelQueue {
    /// Publishes a message of three bytes to [`TOPIC`]; returns its id and whether it repeats
    /// an earlier dedup id.
    fn publish(
        &self,
        key: Option<String>,
        dedup: Option<(String, Duration)>,
        delay: Option<Duration>,
    ) -> (i64, bool);
    /// Leases up to `max` messages of `group` to `consumer`.
    fn claim(&self, group: &str, consumer: &str, max: u32, lease: Duration) -> Vec<Claimed>;
    /// Acks as `consumer`, the receipt's holder.
    fn ack(&self, consumer: &str, receipt: &str) -> Result<(), Refusal>;
    /// Acks as `consumer` and leases up to `max` more of `group`.
    fn ack_and_claim(
        &self,
        consumer: &str,
        receipt: &str,
        group: &str,
        max: u32,
        lease: Duration,
    ) -> Result<Vec<Claimed>, Refusal>;
    /// Gives the message back as `consumer`, after `delay` or the backoff.
    fn nack(&self, consumer: &str, receipt: &str, delay: Option<Duration>) -> Result<(), Refusal>;
    /// Extends the lease to `lease` from now.
    fn extend(&self, receipt: &str, lease: Duration) -> Result<(), Refusal>;
    /// Dead-letters the message at once.
    fn terminate(&self, receipt: &str, reason: &str) -> Result<(), Refusal>;
    /// Sends the group's dead letters back; returns how many.
    fn redrive(&self, group: &str) -> u64;
    /// The state of `message`'s delivery to `group`.
    fn status(&self, group: &str, message: i64) -> Option<Status>;
    /// The attempts of the dead letter `message` of `group`.
    fn dead_attempts(&self, group: &str, message: i64) -> u32;
    /// Closes the queue and opens it again on the same storage.
    fn reopen(&mut self);
}

/// The topic every message goes to.
pub const TOPIC: &str = "t";
/// The groups subscribed to [`TOPIC`], with their most attempts.
pub const GROUPS: [(&str, u32); 2] = [("g1", 3), ("g2", 2)];
/// The backoff of a bare nack: (base, max) in milliseconds.
pub const BACKOFF_MS: (i64, i64) = (1000, 8000);
/// The dedup window of every publish with a dedup id.
const DEDUP_WINDOW_MS: i64 = 10_000;

/// The range (inclusive, ms) a bare nack after `attempt` waits: the bus's full-jitter
/// exponential backoff, halved at the bottom.
fn backoff_bounds(attempt: u32) -> (i64, i64) {
    let (base, max) = BACKOFF_MS;
    let shift = attempt.saturating_sub(1).min(40);
    let full = base.saturating_mul(1i64 << shift).min(max);
    (full - full / 2, full)
}

/// How many cases the property runs: 48 keep a debug run within seconds; `PROPTEST_CASES`
/// raises it for a soak.
pub fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(48)
}

/// A run of up to 80 random steps.
pub fn steps() -> impl Strategy<Value = Vec<Step>> {
    proptest::collection::vec(step(), 1..80)
}

/// One step of a run.
#[derive(Clone, Debug)]
#[allow(missing_docs)]
pub enum Step {
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

/// One random step.
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
        receipt: String,
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
    receipts: Vec<(usize, i64, String, u8)>,
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

/// Checks a claim's `leases` (up to `max` of `group` to `consumer`, for `lease` ms at `now`)
/// against the model, and applies it: what a claim must, may and must not hand out.
#[allow(clippy::too_many_arguments)]
fn check_claim(
    m: &mut Model,
    bus: &dyn ModelQueue,
    group: usize,
    consumer: u8,
    max: u32,
    lease: u16,
    now: i64,
    leases: &[Claimed],
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
        if bus.status(gname, id) == Some(Status::Dead) {
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
        let id = l.message;
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
            receipt: l.receipt.clone(),
            until: now + i64::from(lease),
        };
        m.receipts.push((group, id, l.receipt.clone(), consumer));
    }
    if leases.len() < max as usize {
        // The claim saw everything due: what surely was due must have come out,
        // and what might have been due but did not is not due yet.
        let got: Vec<i64> = leases.iter().map(|l| l.message).collect();
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

/// Runs `steps` against `bus` (made as [`ModelQueue`] says, on `clock`), then drains it,
/// checking every answer against the model.
pub fn run(
    steps: Vec<Step>,
    clock: &ManualClock,
    bus: &mut dyn ModelQueue,
) -> Result<(), TestCaseError> {
    let mut m = Model::default();

    for s in steps {
        let now = clock.now_ms();
        match s {
            Step::Publish { key, dedup, delay } => {
                let (id, duplicate) = bus.publish(
                    key.map(|k| format!("k{k}")),
                    dedup.map(|d| {
                        (
                            format!("d{d}"),
                            Duration::from_millis(DEDUP_WINDOW_MS as u64),
                        )
                    }),
                    delay.map(|d| Duration::from_millis(u64::from(d))),
                );
                let expected_dup = dedup
                    .and_then(|d| m.dedup.get(&d))
                    .filter(|(_, exp)| *exp > now);
                match expected_dup {
                    Some((known, _)) => {
                        prop_assert!(duplicate, "dedup id not honoured");
                        prop_assert_eq!(id, *known);
                    }
                    None => {
                        prop_assert!(!duplicate, "a fresh publish was called a duplicate");
                        if let Some(d) = dedup {
                            m.dedup.insert(d, (id, now + DEDUP_WINDOW_MS));
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
                                id,
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
                let leases = bus.claim(
                    GROUPS[group].0,
                    &format!("c{consumer}"),
                    max,
                    Duration::from_millis(u64::from(lease)),
                );
                check_claim(&mut m, bus, group, consumer, max, lease, now, &leases)?;
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
                let (g, id, r, consumer) = m.receipts[i % m.receipts.len()].clone();
                let res = bus.ack_and_claim(
                    &format!("c{consumer}"),
                    &r,
                    GROUPS[g].0,
                    max,
                    Duration::from_millis(u64::from(lease)),
                );
                let current =
                    matches!(&m.groups[g][&id].st, St::Leased { receipt, .. } if *receipt == r);
                if current {
                    let leases = res.map_err(|e| TestCaseError::fail(format!("{e:?}")))?;
                    let key = m.groups[g][&id].key;
                    m.groups[g].get_mut(&id).unwrap().st = St::Acked;
                    m.promote(g, key);
                    check_claim(&mut m, bus, g, consumer, max, lease, now, &leases)?;
                } else {
                    prop_assert!(res == Err(Refusal::Stale), "{:?}", res);
                }
            }
            Step::Ack(i) => {
                let (g, id, r, consumer) = m.receipts[i % m.receipts.len()].clone();
                let res = bus.ack(&format!("c{consumer}"), &r);
                let current =
                    matches!(&m.groups[g][&id].st, St::Leased { receipt, .. } if *receipt == r);
                if current {
                    prop_assert!(res.is_ok(), "ack refused: {:?}", res);
                    let key = m.groups[g][&id].key;
                    m.groups[g].get_mut(&id).unwrap().st = St::Acked;
                    m.promote(g, key);
                } else {
                    prop_assert!(res == Err(Refusal::Stale), "{:?}", res);
                }
            }
            Step::Nack(i, delay) => {
                let (g, id, r, consumer) = m.receipts[i % m.receipts.len()].clone();
                let wait = delay.map(|d| Duration::from_millis(u64::from(d)));
                let res = bus.nack(&format!("c{consumer}"), &r, wait);
                let current =
                    matches!(&m.groups[g][&id].st, St::Leased { receipt, .. } if *receipt == r);
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
                                let (lo, hi) = backoff_bounds(d.attempts);
                                prop_assert!(lo > 0, "a bare nack may retry instantly");
                                St::Ready {
                                    lo: now + lo,
                                    hi: now + hi,
                                }
                            }
                        };
                    }
                } else {
                    prop_assert!(res == Err(Refusal::Stale), "{:?}", res);
                }
            }
            Step::Extend(i, lease) => {
                let (g, id, r, _) = m.receipts[i % m.receipts.len()].clone();
                let res = bus.extend(&r, Duration::from_millis(u64::from(lease)));
                let current =
                    matches!(&m.groups[g][&id].st, St::Leased { receipt, .. } if *receipt == r);
                if current {
                    prop_assert!(res.is_ok(), "extend refused: {:?}", res);
                    m.groups[g].get_mut(&id).unwrap().st = St::Leased {
                        receipt: r,
                        until: now + i64::from(lease),
                    };
                } else {
                    prop_assert!(res == Err(Refusal::Stale), "{:?}", res);
                }
            }
            Step::Terminate(i) => {
                let (g, id, r, _) = m.receipts[i % m.receipts.len()].clone();
                let res = bus.terminate(&r, "poison");
                let current =
                    matches!(&m.groups[g][&id].st, St::Leased { receipt, .. } if *receipt == r);
                if current {
                    prop_assert!(res.is_ok(), "terminate refused: {:?}", res);
                    let key = m.groups[g][&id].key;
                    m.groups[g].get_mut(&id).unwrap().st = St::Dead;
                    m.promote(g, key);
                } else {
                    prop_assert!(res == Err(Refusal::Stale), "{:?}", res);
                }
            }
            Step::Advance(ms) => clock.advance(i64::from(ms)),
            Step::Reopen => bus.reopen(),
            Step::Redrive(g) => {
                let n = bus.redrive(GROUPS[g].0);
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
            let leases = bus.claim(gname, "drain", 50, Duration::from_secs(60));
            if leases.is_empty() {
                break;
            }
            for l in leases {
                let d = m.groups[g].get_mut(&l.message).unwrap();
                prop_assert!(d.live(), "acked or dead message redelivered: {:?}", d.st);
                bus.ack("drain", &l.receipt).unwrap();
                d.st = St::Acked;
            }
        }
        for (id, d) in &mut m.groups[g] {
            match bus.status(gname, *id) {
                Some(Status::Acked) => {
                    prop_assert!(
                        matches!(d.st, St::Acked | St::Leased { .. } | St::Ready { .. }),
                        "{:?}",
                        d.st
                    );
                    prop_assert!(d.st == St::Acked || d.attempts < *max_attempts);
                }
                Some(Status::Dead) => {
                    let attempts = bus.dead_attempts(gname, *id);
                    prop_assert!(
                        d.st == St::Dead || d.attempts >= *max_attempts,
                        "dead too early: {:?} after {} attempts",
                        d.st,
                        d.attempts
                    );
                    prop_assert_eq!(attempts, d.attempts);
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
