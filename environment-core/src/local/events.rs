//! Delivery of events: in-process subscribers, and the outbox drained into the `Publisher`.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::Inner;
use crate::error::Result;
use crate::event::{Event, EventFilter};
use crate::store::CommittedOps;

/// Receives the events of committed operations that pass its filter, in commit order.
#[derive(Debug)]
pub struct Subscription {
    rx: UnboundedReceiver<Event>,
}

impl Subscription {
    /// The next event; `None` once the environment is gone.
    pub async fn recv(&mut self) -> Option<Event> {
        self.rx.recv().await
    }

    /// The next event if one is waiting.
    pub fn try_recv(&mut self) -> Option<Event> {
        self.rx.try_recv().ok()
    }

    /// Waits for the next event on this thread (not from async code).
    pub fn blocking_recv(&mut self) -> Option<Event> {
        self.rx.blocking_recv()
    }
}

pub(crate) struct Hub {
    subscribers: Mutex<Vec<(EventFilter, UnboundedSender<Event>)>>,
    has_publisher: bool,
    wake: Mutex<Option<mpsc::Sender<()>>>,
}

impl Hub {
    pub fn new(has_publisher: bool) -> Hub {
        Hub {
            subscribers: Mutex::new(Vec::new()),
            has_publisher,
            wake: Mutex::new(None),
        }
    }

    pub fn has_publisher(&self) -> bool {
        self.has_publisher
    }

    pub fn subscribe(&self, filter: EventFilter) -> Subscription {
        let (tx, rx) = unbounded_channel();
        if let Ok(mut subs) = self.subscribers.lock() {
            subs.push((filter, tx));
        }
        Subscription { rx }
    }

    /// Called by the writer after a commit, with the operations it recorded. Their events are
    /// made only when someone subscribes.
    pub fn deliver(&self, ops: &CommittedOps) {
        if ops.is_empty() {
            return;
        }
        if let Ok(mut subs) = self.subscribers.lock()
            && !subs.is_empty()
        {
            let events: Vec<Event> = ops.iter().map(|(op, _)| Event::from(&**op)).collect();
            subs.retain(|(filter, tx)| {
                events
                    .iter()
                    .filter(|e| filter.matches(e))
                    .all(|e| tx.send(e.clone()).is_ok())
            });
        }
        if self.has_publisher
            && let Ok(w) = self.wake.lock()
            && let Some(w) = w.as_ref()
        {
            let _ = w.send(());
        }
    }
}

/// Starts the thread that hands outbox rows to the publisher and deletes them once accepted.
/// It holds only a weak reference: it ends when the environment is dropped.
pub(crate) fn start_outbox(inner: &Arc<Inner>) {
    if !inner.hub.has_publisher() {
        return;
    }
    let (tx, rx) = mpsc::channel();
    if let Ok(mut w) = inner.hub.wake.lock() {
        *w = Some(tx.clone());
    }
    // Drain whatever a previous process committed but did not publish.
    let _ = tx.send(());
    drop(tx);
    let weak = Arc::downgrade(inner);
    let _ = std::thread::Builder::new()
        .name("environment-outbox".into())
        .spawn(move || outbox_loop(weak, rx));
}

fn outbox_loop(weak: Weak<Inner>, rx: mpsc::Receiver<()>) {
    let mut backoff = Duration::from_millis(50);
    loop {
        let woken = rx.recv_timeout(backoff);
        if matches!(woken, Err(mpsc::RecvTimeoutError::Disconnected)) {
            return;
        }
        let Some(inner) = weak.upgrade() else { return };
        backoff = match drain(&inner) {
            Ok(true) => Duration::from_secs(3600),
            _ => (backoff * 2).min(Duration::from_secs(30)),
        };
    }
}

/// Publishes pending events in order; returns whether the outbox is now empty.
fn drain(inner: &Arc<Inner>) -> Result<bool> {
    let Some(publisher) = inner.options.publisher.clone() else {
        return Ok(true);
    };
    loop {
        let rows = inner.read(|log| log.outbox(256))?;
        if rows.is_empty() {
            return Ok(true);
        }
        let mut done = Vec::new();
        let mut failed = false;
        for (seq, bytes) in rows {
            let Ok(event) = serde_json::from_slice::<Event>(&bytes) else {
                // An undecodable row would block the outbox forever; it cannot be published.
                tracing::error!(seq, "dropping an undecodable outbox row");
                done.push(seq);
                continue;
            };
            match publisher.publish(&event) {
                Ok(()) => done.push(seq),
                Err(e) => {
                    tracing::warn!(error = %e, "publisher refused an event; will retry");
                    failed = true;
                    break;
                }
            }
        }
        if !done.is_empty() {
            inner.write(false, move |_, tx| tx.remove_events(&done))?;
        }
        if failed {
            return Ok(false);
        }
    }
}
