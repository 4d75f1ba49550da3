//! The writer's inbox: clients queue commands here and the writer takes everything queued as
//! its next group commit, in one lock. A client pays for a wake-up only when the writer sleeps.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::writer::Work;

pub(crate) struct Inbox {
    state: Mutex<State>,
    ready: Condvar,
    /// The queue's length, readable without the lock while the writer spins.
    count: AtomicUsize,
}

struct State {
    queue: Vec<Box<dyn Work>>,
    closed: bool,
    /// The writer sleeps on `ready`: only then does a client pay for a notify syscall.
    writer_asleep: bool,
}

/// What [`Inbox::take`] found.
pub(crate) enum Taken {
    /// Commands were moved into the batch.
    Work,
    /// Nothing arrived before `idle_until`.
    Idle,
    /// Closed and drained: the writer stops.
    Closed,
}

impl Inbox {
    pub(crate) fn new() -> Inbox {
        Inbox {
            state: Mutex::new(State {
                queue: Vec::new(),
                closed: false,
                writer_asleep: false,
            }),
            ready: Condvar::new(),
            count: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding the lock in a way that leaves the queue half-changed.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues a command; gives it back if the writer stopped.
    pub(crate) fn send(&self, work: Box<dyn Work>) -> Result<(), Box<dyn Work>> {
        let notify = {
            let mut st = self.lock();
            if st.closed {
                return Err(work);
            }
            st.queue.push(work);
            self.count.store(st.queue.len(), Ordering::Release);
            std::mem::replace(&mut st.writer_asleep, false)
        };
        if notify {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// No more commands are accepted; the writer drains what is queued and stops.
    pub(crate) fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        st.writer_asleep = false;
        drop(st);
        self.ready.notify_one();
    }

    /// Commands still queued when the writer gave up (it died): dropping them answers
    /// `WriterStopped`.
    pub(crate) fn close_and_drain(&self) -> Vec<Box<dyn Work>> {
        let mut st = self.lock();
        st.closed = true;
        std::mem::take(&mut st.queue)
    }

    /// Moves up to `max` queued commands into `batch`. With none queued, first yields for up
    /// to `spin` (a client working one command at a time sends its next one right after its
    /// answer, and catching it saves a sleep and a wake-up), then sleeps until one arrives or
    /// `idle_until` (forever if `None`).
    ///
    /// It does not wait for more than are there: waiting for the clients just answered to
    /// come back made groups fuller but the bus slower, since a straggler holds up everyone.
    pub(crate) fn take(
        &self,
        batch: &mut Vec<Box<dyn Work>>,
        max: usize,
        spin: Duration,
        idle_until: Option<Instant>,
    ) -> Taken {
        let spin_until = Instant::now() + spin;
        while self.count.load(Ordering::Acquire) == 0 && Instant::now() < spin_until {
            std::thread::yield_now();
        }
        let mut st = self.lock();
        loop {
            if !st.queue.is_empty() {
                let n = st.queue.len().min(max.max(1));
                batch.extend(st.queue.drain(..n));
                self.count.store(st.queue.len(), Ordering::Release);
                st.writer_asleep = false;
                return Taken::Work;
            }
            if st.closed {
                return Taken::Closed;
            }
            st.writer_asleep = true;
            st = match idle_until {
                Some(until) => {
                    let now = Instant::now();
                    if now >= until {
                        st.writer_asleep = false;
                        return Taken::Idle;
                    }
                    self.ready
                        .wait_timeout(st, until - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => self.ready.wait(st).unwrap_or_else(|e| e.into_inner()),
            };
        }
    }
}
