//! [`Pending`]: the answer to a command sent to the writer thread, awaitable from async code or
//! waited for from plain threads.

use std::future::{Future, IntoFuture};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::error::{BusError, Result};

struct State<T> {
    value: Option<Result<T>>,
    waker: Option<Waker>,
    /// A thread sleeps on the condvar; only then is a (syscall-costing) notify needed.
    sleeping: bool,
    /// Other callers of the same group commit that this one wakes once it has its answer.
    relay: Vec<Bell>,
    /// The `Pending` was dropped: nobody will pick up a relay here.
    gone: bool,
}

struct Slot<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    /// Set with the value; lets a waiter spin briefly without taking the lock.
    answered: AtomicBool,
    /// A thread is inside [`Pending::wait`]: it will take its answer (and any relay) soon,
    /// so it may carry the relay of its group commit.
    waiting: AtomicBool,
}

/// How long [`Pending::wait`] yields before sleeping on the condvar. A command's round trip
/// is tens of microseconds; sleeping and being woken costs about as much again, so a short
/// spin roughly halves the latency of one-at-a-time callers.
/// Only one waiter at a time spins: with many clients the writer is busy anyway, and their
/// spinning would take the CPU it needs.
const SPIN: Duration = Duration::from_micros(200);
static SPINNING: AtomicUsize = AtomicUsize::new(0);

impl<T> Slot<T> {
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        // A panic while holding this lock cannot leave the slot half-written, so a poisoned
        // lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An operation handed to the bus's writer thread. `.await` it in async code (it never blocks
/// the executor) or call [`Pending::wait`] on a plain thread.
#[must_use = "the operation's outcome (and any error) is in the Pending"]
pub struct Pending<T> {
    slot: Arc<Slot<T>>,
    /// Dropping it abandons the slot; off once the slot moved into a [`PendingFuture`].
    owns_slot: bool,
}

/// The writer's end. Dropping it unanswered (the writer died) answers `WriterStopped`, so no
/// caller waits forever.
pub(crate) struct Answer<T> {
    slot: Option<Arc<Slot<T>>>,
}

pub(crate) fn pair<T>() -> (Answer<T>, Pending<T>) {
    let slot = Arc::new(Slot {
        state: Mutex::new(State {
            value: None,
            waker: None,
            sleeping: false,
            relay: Vec::new(),
            gone: false,
        }),
        ready: Condvar::new(),
        answered: AtomicBool::new(false),
        waiting: AtomicBool::new(false),
    });
    (
        Answer {
            slot: Some(slot.clone()),
        },
        Pending {
            slot,
            owns_slot: true,
        },
    )
}

impl<T> Pending<T> {
    /// A pending that is already answered.
    pub(crate) fn done(value: Result<T>) -> Pending<T> {
        let (answer, pending) = pair();
        answer.send(value);
        pending
    }

    /// Blocks the calling thread until the writer answers. Do not call it on an async
    /// executor's thread; `.await` instead.
    pub fn wait(self) -> Result<T> {
        self.slot.waiting.store(true, Ordering::Release);
        if SPINNING.fetch_add(1, Ordering::AcqRel) == 0 {
            let start = Instant::now();
            while !self.slot.answered.load(Ordering::Acquire) && start.elapsed() < SPIN {
                std::thread::yield_now();
            }
        }
        SPINNING.fetch_sub(1, Ordering::AcqRel);
        let mut st = self.slot.lock();
        loop {
            if let Some(v) = st.value.take() {
                let relay = std::mem::take(&mut st.relay);
                drop(st);
                ring_each(relay);
                return v;
            }
            st.sleeping = true;
            st = self.slot.ready.wait(st).unwrap_or_else(|e| e.into_inner());
            st.sleeping = false;
        }
    }
}

/// The wake-up owed to one answered caller of a group commit. The writer wakes one caller per
/// group and hands it the others' bells: waking a sleeping thread costs the waker several
/// microseconds, and the writer's time is what bounds the bus's throughput.
pub(crate) struct Bell {
    ring: Arc<dyn Ring>,
    caller: Caller,
}

/// How the caller behind a bell waits for its answer.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// In [`Pending::wait`] and not asleep (yet): the cheapest relay carrier.
    Spinning,
    /// Asleep in [`Pending::wait`].
    Sleeping,
    /// An async task; it is not made a carrier, since it may be woken and not poll this
    /// future for a while.
    Task,
}

trait Ring: Send + Sync {
    /// Wakes the caller and leaves it `relay` to ring; gives `relay` back if the caller
    /// dropped its `Pending`.
    fn ring(&self, relay: Vec<Bell>) -> std::result::Result<(), Vec<Bell>>;
}

impl<T: Send> Ring for Slot<T> {
    fn ring(&self, relay: Vec<Bell>) -> std::result::Result<(), Vec<Bell>> {
        let (waker, sleeping) = {
            let mut st = self.lock();
            if st.gone {
                return Err(relay);
            }
            st.relay.extend(relay);
            (st.waker.take(), st.sleeping)
        };
        if sleeping {
            self.ready.notify_one();
        }
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }
}

/// Wakes the callers of a group commit: one thread in [`Pending::wait`] directly (a spinning
/// one if there is, which costs no syscall), and that one wakes the rest. Only a caller that
/// is waiting for this very answer may carry the relay: a thread holding several `Pending`s
/// may be asleep on another one.
pub(crate) fn ring_group(mut bells: Vec<Bell>) {
    loop {
        let at = bells
            .iter()
            .position(|b| b.caller == Caller::Spinning)
            .or_else(|| bells.iter().position(|b| b.caller == Caller::Sleeping));
        let Some(at) = at else {
            // Only tasks: wake each here.
            return ring_each(bells);
        };
        let carrier = bells.swap_remove(at);
        match carrier.ring.ring(bells) {
            Ok(()) => return,
            Err(rest) => bells = rest,
        }
    }
}

/// A relay carrier's duty, done as soon as it has its own answer.
fn ring_each(relay: Vec<Bell>) {
    for b in relay {
        // A caller that dropped its `Pending` needs no wake-up.
        let _ = b.ring.ring(Vec::new());
    }
}

impl<T: Send + 'static> Answer<T> {
    /// Stores the answer without waking the caller; the returned bell does that. A caller
    /// that is not waiting yet finds the answer when it looks, and needs no bell.
    pub(crate) fn set(mut self, value: Result<T>) -> Option<Bell> {
        let slot = self.slot.take()?;
        let caller = {
            let mut st = slot.lock();
            st.value = Some(value);
            slot.answered.store(true, Ordering::Release);
            if st.gone {
                return None;
            }
            // A thread goes to sleep only after checking for the value under this lock, so
            // `sleeping` is exact here; `waiting` may be missed by a thread just entering
            // `wait`, which then finds the answer itself.
            if st.sleeping {
                Caller::Sleeping
            } else if slot.waiting.load(Ordering::Acquire) {
                Caller::Spinning
            } else if st.waker.is_some() {
                Caller::Task
            } else {
                return None;
            }
        };
        Some(Bell { ring: slot, caller })
    }
}

impl<T> Answer<T> {
    pub(crate) fn send(mut self, value: Result<T>) {
        if let Some(slot) = self.slot.take() {
            let (waker, sleeping) = {
                let mut st = slot.lock();
                st.value = Some(value);
                slot.answered.store(true, Ordering::Release);
                (st.waker.take(), st.sleeping)
            };
            if sleeping {
                slot.ready.notify_one();
            }
            if let Some(w) = waker {
                w.wake();
            }
        }
    }
}

impl<T> Drop for Answer<T> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            Answer { slot: Some(slot) }.send(Err(BusError::WriterStopped));
        }
    }
}

impl<T> Slot<T> {
    /// The caller is gone: any relay left here is rung now.
    fn abandon(&self) {
        let relay = {
            let mut st = self.lock();
            st.gone = true;
            std::mem::take(&mut st.relay)
        };
        ring_each(relay);
    }
}

impl<T> Drop for Pending<T> {
    fn drop(&mut self) {
        if self.owns_slot {
            self.slot.abandon();
        }
    }
}

impl<T> Drop for PendingFuture<T> {
    fn drop(&mut self) {
        self.slot.abandon();
    }
}

/// The future of a [`Pending`].
pub struct PendingFuture<T> {
    slot: Arc<Slot<T>>,
}

impl<T> Future for PendingFuture<T> {
    type Output = Result<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let mut st = self.slot.lock();
        match st.value.take() {
            Some(v) => {
                let relay = std::mem::take(&mut st.relay);
                drop(st);
                ring_each(relay);
                Poll::Ready(v)
            }
            None => {
                st.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl<T> IntoFuture for Pending<T> {
    type Output = Result<T>;
    type IntoFuture = PendingFuture<T>;
    fn into_future(mut self) -> PendingFuture<T> {
        self.owns_slot = false;
        PendingFuture {
            slot: self.slot.clone(),
        }
    }
}

impl<T> std::fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pending")
    }
}

impl<T> std::fmt::Debug for PendingFuture<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PendingFuture")
    }
}
