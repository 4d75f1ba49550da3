//! Wake-ups across machines: one connection per process listens on the queue's channel, and
//! each notification (a commit that made messages claimable) moves a generation counter that
//! waiting claims watch. A waiter reads the generation before it claims, so a notification
//! that lands between its claim and its sleep still wakes it.
//!
//! The listening connection breaking is reported to every waiter, not only logged: a consumer
//! that sleeps on a dead channel would stall silently. It reconnects in the background; the
//! first waiter after the repair claims again, which finds what was published meanwhile.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use postgres::Client;
use postgres::fallible_iterator::FallibleIterator;

use crate::server::Server;

use super::CHANNEL;
use crate::error::{PgError, Result, describe};

/// How often the listening thread looks at its stop flag while nothing arrives.
const TICK: Duration = Duration::from_millis(200);

#[derive(Default)]
struct State {
    /// Moves on every notification and every repair of the connection.
    generation: u64,
    /// Listening now (the `LISTEN` committed).
    listening: bool,
    /// Why the listening connection is down, while it is.
    broken: Option<String>,
    started: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    moved: Condvar,
    stop: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update(&self, f: impl FnOnce(&mut State)) {
        let mut s = self.lock();
        f(&mut s);
        s.generation += 1;
        drop(s);
        self.moved.notify_all();
    }
}

/// The process's listening connection, started by the first waiting claim and stopped when
/// the queue is dropped.
#[derive(Default)]
pub(crate) struct Listener {
    shared: Arc<Shared>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
    }
}

impl Listener {
    /// Starts listening (once) and waits until the channel is listened to, so that a claim
    /// made after this returns misses no notification.
    pub fn start(&self, server: &Server, name: &str, timeout: Duration) -> Result<()> {
        let mut s = self.shared.lock();
        if !s.started {
            s.started = true;
            let (shared, server, name) =
                (Arc::clone(&self.shared), server.clone(), name.to_owned());
            std::thread::Builder::new()
                .name("pg-queue-listen".into())
                .spawn(move || listen(&shared, &server, &name))
                .map_err(|e| PgError::Unreachable(format!("cannot start the listener: {e}")))?;
        }
        let deadline = Instant::now() + timeout;
        while !s.listening {
            if let Some(why) = &s.broken {
                return Err(PgError::Unreachable(format!(
                    "listening for wake-ups: {why}"
                )));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(PgError::Unreachable(
                    "listening for wake-ups: timed out".into(),
                ));
            }
            s = self
                .shared
                .moved
                .wait_timeout(s, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        Ok(())
    }

    /// The current generation, or why the channel is down.
    pub fn generation(&self) -> Result<u64> {
        let s = self.shared.lock();
        match &s.broken {
            Some(why) => Err(PgError::Unreachable(format!(
                "listening for wake-ups: {why}"
            ))),
            None => Ok(s.generation),
        }
    }

    /// Sleeps until the generation moves past `seen` or `nap` passes.
    pub fn wait_past(&self, seen: u64, nap: Duration) -> Result<()> {
        let s = self.shared.lock();
        let (s, _) = self
            .shared
            .moved
            .wait_timeout_while(s, nap, |s| s.generation == seen)
            .unwrap_or_else(|e| e.into_inner());
        match &s.broken {
            Some(why) => Err(PgError::Unreachable(format!(
                "listening for wake-ups: {why}"
            ))),
            None => Ok(()),
        }
    }
}

/// The listening thread: connect, `LISTEN`, count notifications; on a break, report it and
/// reconnect, once a second, until the queue is dropped.
fn listen(shared: &Shared, server: &Server, name: &str) {
    while !shared.stop.load(Ordering::Relaxed) {
        let Err(why) = session(shared, server, name) else {
            return;
        };
        shared.update(|s| {
            s.listening = false;
            s.broken = Some(why);
        });
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// One connection's life; returns `Ok` only when told to stop.
fn session(shared: &Shared, server: &Server, name: &str) -> std::result::Result<(), String> {
    let mut client: Client = server.named(name).connect().map_err(|e| describe(&e))?;
    client
        .batch_execute(&format!("LISTEN {CHANNEL}"))
        .map_err(|e| describe(&e))?;
    // Listening again after a break: what was published meanwhile was not notified here, so
    // every waiter looks again.
    shared.update(|s| {
        s.listening = true;
        s.broken = None;
    });
    while !shared.stop.load(Ordering::Relaxed) {
        // `None` is a quiet tick, or a connection that ended without a word.
        let arrived = client
            .notifications()
            .timeout_iter(TICK)
            .next()
            .map_err(|e| describe(&e))?;
        if arrived.is_some() {
            shared.update(|_| {});
        } else if client.is_closed() {
            return Err("the server closed the connection".into());
        }
    }
    Ok(())
}
