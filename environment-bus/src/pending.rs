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
}

struct Slot<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    /// Set with the value; lets a waiter spin briefly without taking the lock.
    answered: AtomicBool,
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
        }),
        ready: Condvar::new(),
        answered: AtomicBool::new(false),
    });
    (
        Answer {
            slot: Some(slot.clone()),
        },
        Pending { slot },
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
                return v;
            }
            st.sleeping = true;
            st = self.slot.ready.wait(st).unwrap_or_else(|e| e.into_inner());
            st.sleeping = false;
        }
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

/// The future of a [`Pending`].
pub struct PendingFuture<T> {
    slot: Arc<Slot<T>>,
}

impl<T> Future for PendingFuture<T> {
    type Output = Result<T>;
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let mut st = self.slot.lock();
        match st.value.take() {
            Some(v) => Poll::Ready(v),
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
    fn into_future(self) -> PendingFuture<T> {
        PendingFuture { slot: self.slot }
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
