//! [`PgQueue`]: core's queue port on PostgreSQL, for queues that several machines share. It
//! keeps the embedded bus's promises (leases with receipts, attempts counted at claim, ordering
//! keys, dedup windows, dead letters, redrive) and refuses bad input with the bus's own errors
//! before it reaches the server.
//!
//! Every operation is one transaction at `READ COMMITTED`; the steps that must not interleave
//! (a key's busy check and its insert, a dedup check and its record) take a transaction-scoped
//! advisory lock. A transaction that loses a deadlock or a serialization conflict is run again.
//! The common cases (a plain publish, a claim with attempts left, an unkeyed ack) are one
//! statement each, tried first; what they cannot decide falls to the full transaction.
//! A commit that makes messages claimable sends `NOTIFY`, so [`PgQueue::claim_waiting`] of any
//! machine wakes without polling.

mod lease;
mod publish;
mod read;
mod schema;
pub(crate) mod session;
mod upkeep;
mod wake;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::{Duration, Instant};

use environment_bus::{
    Backoff, BusError, DeliveryStatus, GroupOptions, Limits, NewMessage, PurgeReport, Receipt,
    rules,
};
use environment_core::queue::{
    DeadLetter, Holder, Lease, LeaseInFlight, Posted, Publish, Settlement, TopicMetrics,
};
use environment_core::{Clock, PortError, Queue, SystemClock};
use postgres::{Statement, Transaction};
use rules::Settle;

use crate::error::{PgContext, PgError, Result, session_ended};
use crate::migrate::migrate;
use crate::server::Server;
use crate::statements::Statements;
use session::{Session, Sessions};
use wake::Listener;

/// How a [`PgQueue`] behaves. `Default` uses the system clock and the embedded bus's limits.
#[derive(Clone, Debug)]
pub struct PgQueueConfig {
    /// Where time comes from: leases, delays, backoff and dedup windows read it. Machines
    /// sharing a queue must agree on the time (NTP); a lease is as exact as their clocks.
    pub clock: Arc<dyn Clock>,
    /// Bounds on inputs, the bus's by default.
    pub limits: Limits,
    /// Delays of bare nacks.
    pub backoff: Backoff,
    /// Dedup window of publishes (5 minutes).
    pub dedup_window: Duration,
    /// Acked deliveries (and then their messages) are purged this long after the ack, by
    /// [`PgQueue::purge`] and the background purge.
    pub retention: Duration,
    /// How often a thread of this process purges in the background (`None`: only
    /// [`PgQueue::purge`] does). Of the machines sharing the queue, one purges at a time; the
    /// others skip their turn. A failure is kept for [`PgQueue::upkeep_failure`].
    pub auto_purge: Option<Duration>,
    /// Most connections this process opens.
    pub pool_size: u32,
    /// How long an operation waits for a connection before it fails as unavailable.
    pub connect_timeout: Duration,
    /// The `application_name` of this process's sessions (`pg_stat_activity` shows it); the
    /// listening session's is this with `-listener` appended.
    pub application_name: String,
    /// How long [`PgQueue::claim_waiting`] sleeps at most between looks when nothing wakes it:
    /// a notification lost with a dropped connection is found this late.
    pub idle_recheck: Duration,
    /// The CA certificates (PEM) a TLS server's certificate must chain to; `None`: the
    /// system's roots. By default libpq's `PGSSLROOTCERT`, when set; the connection string's
    /// `sslrootcert` takes its place ([`PgQueue::connect`]). See `sslmode` in the connection
    /// string for when TLS is used.
    pub ca_file: Option<std::path::PathBuf>,
}

impl Default for PgQueueConfig {
    fn default() -> PgQueueConfig {
        PgQueueConfig {
            clock: Arc::new(SystemClock),
            limits: Limits::default(),
            backoff: Backoff::default(),
            dedup_window: Duration::from_secs(300),
            retention: Duration::from_secs(3600),
            auto_purge: Some(Duration::from_secs(30)),
            pool_size: 8,
            connect_timeout: Duration::from_secs(10),
            idle_recheck: Duration::from_secs(5),
            application_name: "environment-queue".into(),
            ca_file: std::env::var_os("PGSSLROOTCERT").map(Into::into),
        }
    }
}

/// What an operation works with: its transaction, the time it reads, and the groups it made
/// claimable (notified at commit).
pub(crate) struct Ctx<'t, 'c> {
    pub tx: &'t mut Transaction<'c>,
    pub statements: &'t mut HashMap<&'static str, Statement>,
    pub now: i64,
    pub backoff: Backoff,
    pub rng: rand::rngs::ThreadRng,
    pub wake: Vec<i64>,
}

pub(crate) use environment_bus::rules::ms;

impl Ctx<'_, '_> {
    /// Notifies the groups the work made claimable; delivered when the transaction commits.
    fn notify(&mut self) -> Result<()> {
        let mut wake = std::mem::take(&mut self.wake);
        wake.sort_unstable();
        wake.dedup();
        for gid in wake {
            self.execute("SELECT pg_notify($1, $2)", &[&CHANNEL, &gid.to_string()])
                .ctx("notifying waiting consumers")?;
        }
        Ok(())
    }
}

/// The channel commits notify with the id of a group that gained claimable messages.
pub(crate) const CHANNEL: &str = "environment_bus";

/// How many times a transaction that lost a deadlock or serialization conflict is run again.
const RETRIES: u32 = 8;

type Pool = r2d2::Pool<Sessions>;

/// A queue in a PostgreSQL database, shared by every process and machine that opens it.
/// Cloning is cheap and shares the pool.
#[derive(Clone)]
pub struct PgQueue {
    inner: Arc<Inner>,
}

struct Inner {
    /// Taken out only when the queue is dropped (see `Drop for Inner`).
    pool: std::sync::Mutex<Option<Pool>>,
    config: PgQueueConfig,
    server: Server,
    listener: Listener,
    /// Where the purge sweep goes on from.
    purge_cursor: AtomicI64,
    /// Why the last background purge failed, until one succeeds.
    purge_failure: std::sync::Mutex<Option<PortError>>,
    /// Dropped with the queue, which stops the background purge.
    _purger: Option<std::sync::mpsc::Sender<()>>,
}

impl Inner {
    /// The pool (a handle on it: cloning shares it).
    fn pool(&self) -> Result<Pool> {
        let pool = self
            .pool
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        pool.clone()
            .ok_or_else(|| PgError::Unreachable("the queue is closed".into()))
    }
}

/// Closing a connection blocks on it: the pool's connections close off an async runtime, as
/// every operation runs.
impl Drop for Inner {
    fn drop(&mut self) {
        let pool = self
            .pool
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        let _ = crate::connection::off_the_runtime(move || {
            drop(pool);
            Ok(())
        });
    }
}

impl std::fmt::Debug for PgQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgQueue")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl PgQueue {
    /// Connects to the database a libpq connection string names (`host=/run/postgresql
    /// user=env dbname=env`, or a `postgresql://` URL) and migrates the queue's tables. Its
    /// `sslrootcert`, if any, names the CA file ([`PgQueueConfig::ca_file`]).
    pub fn connect(params: &str, mut config: PgQueueConfig) -> Result<PgQueue> {
        let address = crate::ServerAddress::parse(params)?;
        if address.ca_file.is_some() {
            config.ca_file = address.ca_file;
        }
        PgQueue::open(address.config, config)
    }

    /// [`PgQueue::connect`] with a parsed configuration.
    pub fn open(mut server: postgres::Config, config: PgQueueConfig) -> Result<PgQueue> {
        server.application_name(&config.application_name);
        let server = Server::new(server, config.ca_file.as_deref())?;
        let manager = Sessions {
            server: server.clone(),
        };
        let pool = r2d2::Pool::builder()
            .max_size(config.pool_size.max(1))
            .min_idle(Some(0))
            // No probe round trip per operation: a connection found closed when its
            // transaction begins is replaced then (see `run`).
            .test_on_check_out(false)
            .connection_timeout(config.connect_timeout)
            .build(manager)?;
        let migrated = crate::connection::off_the_runtime(|| {
            let mut conn = pool.get()?;
            migrate(&mut conn.client, schema::COMPONENT, schema::MIGRATIONS).map(drop)
        });
        if let Err(e) = migrated {
            let _ = crate::connection::off_the_runtime(move || {
                drop(pool);
                Ok(())
            });
            return Err(e);
        }
        let every = config.auto_purge;
        let (stop, stopped) = std::sync::mpsc::channel();
        let inner = Arc::new(Inner {
            pool: std::sync::Mutex::new(Some(pool)),
            server,
            listener: Listener::default(),
            purge_cursor: AtomicI64::new(0),
            purge_failure: std::sync::Mutex::new(None),
            _purger: every.map(|_| stop),
            config,
        });
        if let Some(every) = every {
            let queue = Arc::downgrade(&inner);
            std::thread::Builder::new()
                .name("queue-purge".into())
                .spawn(move || purge_in_background(&queue, &stopped, every))
                .map_err(|e| PgError::Unreachable(format!("cannot start the purge thread: {e}")))?;
        }
        Ok(PgQueue { inner })
    }

    /// Why the last background purge ([`PgQueueConfig::auto_purge`]) failed, until one
    /// succeeds: kept for whoever reports on the queue, not only logged.
    pub fn upkeep_failure(&self) -> Option<PortError> {
        self.inner
            .purge_failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &PgQueueConfig {
        &self.inner.config
    }

    /// Runs `work` in one transaction, again after a deadlock or serialization conflict, and
    /// notifies the groups it made claimable as part of its commit.
    fn run<T: Send>(&self, work: impl FnMut(&mut Ctx<'_, '_>) -> Result<T> + Send) -> Result<T> {
        crate::connection::off_the_runtime(|| self.run_here(work))
    }

    fn run_here<T>(&self, mut work: impl FnMut(&mut Ctx<'_, '_>) -> Result<T>) -> Result<T> {
        let mut stale = 0;
        'connection: loop {
            let mut conn = self.inner.pool()?.get()?;
            let session = &mut *conn;
            let mut attempt = 0;
            loop {
                let mut tx = match session.client.transaction() {
                    Ok(tx) => tx,
                    // A pooled connection the server ended (a restart, an idle timeout):
                    // nothing was sent on it, so another connection takes the work.
                    Err(e) if session_ended(&e) && stale < self.inner.config.pool_size => {
                        stale += 1;
                        continue 'connection;
                    }
                    Err(e) => return Err(e).ctx("starting a transaction"),
                };
                let mut ctx = Ctx {
                    tx: &mut tx,
                    statements: &mut session.statements,
                    now: self.inner.config.clock.now_ms(),
                    backoff: self.inner.config.backoff,
                    rng: rand::rng(),
                    wake: Vec::new(),
                };
                let out = work(&mut ctx).and_then(|v| ctx.notify().map(|()| v));
                drop(ctx);
                let out = out.and_then(|v| tx.commit().ctx("committing").map(|()| v));
                match out {
                    Err(e) if e.retryable() && attempt < RETRIES => {
                        attempt += 1;
                        // Rolled back on drop; the other transaction goes first.
                        std::thread::sleep(Duration::from_millis(u64::from(attempt) * 2));
                    }
                    other => return other,
                }
            }
        }
    }

    /// Runs `work`, one statement that is a transaction of its own (one round trip): the
    /// common case of an operation, tried before its transaction. A session the server ended
    /// before the statement ran (its answer was FATAL) is replaced; a connection that broke
    /// without a word is an error, since the statement may have committed.
    fn alone<T: Send>(&self, work: impl FnMut(&mut Session, i64) -> Result<T> + Send) -> Result<T> {
        crate::connection::off_the_runtime(|| self.alone_here(work))
    }

    fn alone_here<T>(&self, mut work: impl FnMut(&mut Session, i64) -> Result<T>) -> Result<T> {
        let mut stale = 0;
        loop {
            let mut session = self.inner.pool()?.get()?;
            match work(&mut session, self.inner.config.clock.now_ms()) {
                Err(PgError::Postgres { source, .. })
                    if source.as_db_error().is_some()
                        && session_ended(&source)
                        && stale < self.inner.config.pool_size =>
                {
                    stale += 1;
                }
                other => return other,
            }
        }
    }

    /// Creates a consumer group subscribed to `topics` (created when new), or adds
    /// subscriptions to an existing group with the same options; a group receives the messages
    /// published after it subscribed. A group that exists with another `max_attempts` is
    /// [`BusError::GroupConflict`].
    pub fn create_group(&self, group: &str, topics: &[&str], options: GroupOptions) -> Result<()> {
        rules::check_group(group, options.max_attempts, topics.iter().copied())?;
        self.run(|ctx| lease::create_group(ctx, group, topics, options.max_attempts))
    }

    /// Leases up to `max` claimable messages of `group` to `consumer` for `lease`; returns at
    /// once, possibly with nothing.
    pub fn claim(
        &self,
        group: &str,
        consumer: &str,
        max: u32,
        lease: Duration,
    ) -> Result<Vec<Lease>> {
        let lease_ms = rules::check_claim(&self.inner.config.limits, group, consumer, max, lease)?;
        let plain = self.alone(|s, now| {
            lease::claim_plain(s, &mut rand::rng(), group, consumer, max, lease_ms, now)
        })?;
        match plain {
            Some(leases) => Ok(leases),
            None => self.run(|ctx| lease::claim(ctx, group, consumer, max, lease_ms)),
        }
    }

    /// [`PgQueue::claim`] that waits up to `wait` for a message: woken by the commit of any
    /// machine that makes one of `group`'s messages claimable, or by the group's next delayed
    /// message falling due. Returns nothing when `wait` passes. A broken notification
    /// connection is an error here, not a silent slowdown.
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use environment_postgres::{PgQueue, PgQueueConfig};
    /// # fn main() -> Result<(), environment_postgres::PgError> {
    /// let queue = PgQueue::connect("host=/run/postgresql dbname=env", PgQueueConfig::default())?;
    /// let lease = Duration::from_secs(60);
    /// loop {
    ///     for job in queue.claim_waiting("workers", "worker-1", 8, lease, Duration::from_secs(30))? {
    ///         // ... do the work, then:
    ///         queue.ack("worker-1", &job.receipt)?;
    ///     }
    /// }
    /// # }
    /// ```
    pub fn claim_waiting(
        &self,
        group: &str,
        consumer: &str,
        max: u32,
        lease: Duration,
        wait: Duration,
    ) -> Result<Vec<Lease>> {
        let lease_ms = rules::check_claim(&self.inner.config.limits, group, consumer, max, lease)?;
        let deadline = Instant::now() + wait;
        let listener = &self.inner.listener;
        let name = format!("{}-listener", self.inner.config.application_name);
        listener.start(&self.inner.server, &name, self.inner.config.connect_timeout)?;
        loop {
            let seen = listener.generation()?;
            let (leases, next_due) = self.run(|ctx| {
                let leases = lease::claim(ctx, group, consumer, max, lease_ms)?;
                let next = match leases.is_empty() {
                    true => lease::next_due(ctx, group)?,
                    false => None,
                };
                Ok((leases, next.map(|due| due - ctx.now)))
            })?;
            let now = Instant::now();
            if !leases.is_empty() || now >= deadline {
                return Ok(leases);
            }
            let mut nap = (deadline - now).min(self.inner.config.idle_recheck);
            if let Some(due_in) = next_due {
                nap = nap.min(Duration::from_millis(
                    u64::try_from(due_in.max(1)).unwrap_or(1),
                ));
            }
            listener.wait_past(seen, nap)?;
        }
    }

    /// Publishes a message to every group subscribed to its topic, creating the topic when
    /// new; a repeat of a dedup id within its window is accepted and not delivered again.
    pub fn publish_message(&self, m: &NewMessage) -> Result<Posted> {
        rules::check_message(m, &self.inner.config.limits)?;
        if let Some(posted) = self.alone(|s, now| publish::publish_plain(s, m, now))? {
            return Ok(posted);
        }
        let window = ms(m
            .options
            .dedup_window
            .unwrap_or(self.inner.config.dedup_window));
        self.run(|ctx| publish::publish(ctx, m, window))
    }

    /// Publishes many messages in one transaction: all or none.
    pub fn publish_batch(&self, messages: &[NewMessage]) -> Result<Vec<Posted>> {
        let c = &self.inner.config;
        if messages.len() > c.limits.max_batch {
            return Err(BusError::OutOfRange {
                what: "batch size",
                value: messages.len() as u128,
                min: 0,
                max: c.limits.max_batch as u128,
            }
            .into());
        }
        for m in messages {
            rules::check_message(m, &c.limits)?;
        }
        self.run(|ctx| {
            let now = ctx.now;
            messages
                .iter()
                .map(|m| match publish::publish_plain(ctx, m, now)? {
                    Some(posted) => Ok(posted),
                    None => {
                        let window = ms(m.options.dedup_window.unwrap_or(c.dedup_window));
                        publish::publish(ctx, m, window)
                    }
                })
                .collect()
        })
    }

    /// Acks many receipts as `consumer` in one transaction; each gets its own outcome (a stale
    /// receipt does not stop the others). A server error fails the whole call and acks none.
    pub fn ack_many(&self, consumer: &str, receipts: &[&str]) -> Result<Vec<Result<()>>> {
        rules::check_name("consumer", consumer)?;
        let parsed: Vec<std::result::Result<Receipt, BusError>> =
            receipts.iter().map(|r| r.parse()).collect();
        let valid: Vec<Receipt> = parsed
            .iter()
            .filter_map(|r| r.as_ref().ok().copied())
            .collect();
        self.run(|ctx| {
            // The unkeyed current ones at once; each of the rest says why, or is acked with
            // its key's next message promoted.
            let now = ctx.now;
            let mut plain: std::collections::HashSet<Receipt> =
                lease::ack_plain_many(ctx, &valid, consumer, now)?
                    .into_iter()
                    .collect();
            let mut out = Vec::with_capacity(parsed.len());
            for r in &parsed {
                let acked = match r {
                    // Once: the same receipt again is stale, as it would be one at a time.
                    Ok(r) if plain.remove(r) => Ok(()),
                    Ok(r) => lease::settle(ctx, r, &Settle::Ack, Some(consumer)),
                    Err(e) => Err(e.clone().into()),
                };
                match acked {
                    // The transaction is whole: a refusal read rows and wrote none.
                    Ok(()) | Err(PgError::Refused(_)) => out.push(acked),
                    Err(e) => return Err(e),
                }
            }
            Ok(out)
        })
    }

    /// Acks `receipt` as `consumer`, who must hold its lease.
    pub fn ack(&self, consumer: &str, receipt: &str) -> Result<()> {
        self.settle_as(Some(consumer), receipt, Settle::Ack)
    }

    /// Gives the message back as `consumer`, after `delay` (the backoff when `None`), keeping
    /// `error` as its last error; at the group's most attempts it becomes a dead letter.
    pub fn nack(
        &self,
        consumer: &str,
        receipt: &str,
        delay: Option<Duration>,
        error: Option<&str>,
    ) -> Result<()> {
        let delay_ms = rules::check_nack(&self.inner.config.limits, delay, error)?;
        let how = Settle::Nack {
            delay_ms,
            error: error.map(str::to_owned),
        };
        self.settle_as(Some(consumer), receipt, how)
    }

    /// Poison message: straight to the dead letters with `reason`, no retry.
    pub fn terminate(&self, receipt: &str, reason: &str) -> Result<()> {
        rules::check_reason(reason)?;
        let how = Settle::Terminate {
            reason: reason.to_owned(),
        };
        self.settle_as(None, receipt, how)
    }

    /// Heartbeat: the lease now runs until `lease` from now.
    pub fn extend(&self, receipt: &str, lease: Duration) -> Result<()> {
        let lease_ms = rules::check_lease(&self.inner.config.limits, lease)?;
        self.settle_as(None, receipt, Settle::Extend { lease_ms })
    }

    fn settle_as(&self, by: Option<&str>, receipt: &str, how: Settle) -> Result<()> {
        if let Some(by) = by {
            rules::check_name("consumer", by)?;
        }
        let receipt: Receipt = receipt.parse()?;
        if let (Settle::Ack, Some(by)) = (&how, by)
            && self.alone(|s, now| lease::ack_plain(s, &receipt, by, now))?
        {
            return Ok(());
        }
        self.run(|ctx| lease::settle(ctx, &receipt, &how, by))
    }

    /// The state of `message`'s delivery to `group`, if it has one.
    pub fn status(&self, group: &str, message: i64) -> Result<Option<DeliveryStatus>> {
        self.run(|ctx| read::status(ctx, group, message))
    }

    /// The dead letter of `message` in `group`.
    pub fn dead_letter(&self, group: &str, message: i64) -> Result<DeadLetter> {
        self.run(|ctx| read::dead_letters(ctx, group, Some(message), None, 1))?
            .pop()
            .ok_or_else(|| {
                BusError::NoSuchDeadLetter {
                    group: group.to_owned(),
                    message,
                }
                .into()
            })
    }

    /// Removes what retention let go: acked deliveries older than
    /// [`PgQueueConfig::retention`], then their messages, and dedup ids past their window. It
    /// works in small transactions, so the queue stays available while it runs.
    pub fn purge(&self) -> Result<PurgeReport> {
        self.purge_taking(upkeep::Turn::Wait)
    }

    /// [`PgQueue::purge`], each step after the other machines' purge steps (`Wait`), or only
    /// while no other machine purges (`Skip`: the sweep stops at the first step it cannot
    /// take).
    fn purge_taking(&self, turn: upkeep::Turn) -> Result<PurgeReport> {
        let mut total = PurgeReport::default();
        let cutoff_of = |now: i64| now.saturating_sub(ms(self.inner.config.retention));
        loop {
            let step = self.run(|ctx| {
                let cutoff = cutoff_of(ctx.now);
                upkeep::purge_step(ctx, turn, cutoff, 512, &self.inner.purge_cursor)
            })?;
            let Some((step, wrapped)) = step else {
                return Ok(total);
            };
            total += step;
            if wrapped {
                return Ok(total);
            }
        }
    }
}

/// The background purge: every `every` until the queue is dropped, a sweep if no other
/// machine is sweeping, its outcome kept in the queue's `purge_failure`.
fn purge_in_background(
    queue: &std::sync::Weak<Inner>,
    stopped: &std::sync::mpsc::Receiver<()>,
    every: Duration,
) {
    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
        let Some(inner) = queue.upgrade() else { return };
        let queue = PgQueue { inner };
        let outcome = queue.purge_taking(upkeep::Turn::Skip);
        *queue
            .inner
            .purge_failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) =
            outcome.err().map(PortError::from);
    }
}

impl Queue for PgQueue {
    fn publish(
        &self,
        topic: &str,
        payload: Vec<u8>,
        o: Publish,
    ) -> std::result::Result<Posted, PortError> {
        Ok(self.publish_message(&NewMessage::from_port(topic, payload, o))?)
    }

    fn claim(
        &self,
        group: &str,
        consumer: &str,
        max: u32,
        lease: Duration,
    ) -> std::result::Result<Vec<Lease>, PortError> {
        Ok(PgQueue::claim(self, group, consumer, max, lease)?)
    }

    fn holder(&self, receipt: &str) -> std::result::Result<Holder, PortError> {
        let receipt: Receipt = receipt.parse().map_err(PgError::from)?;
        Ok(self.run(|ctx| read::holder(ctx, &receipt))?)
    }

    fn settle(
        &self,
        consumer: &str,
        receipt: &str,
        how: Settlement,
    ) -> std::result::Result<(), PortError> {
        Ok(match how {
            Settlement::Ack => self.ack(consumer, receipt),
            Settlement::Nack { delay, error } => {
                self.nack(consumer, receipt, delay, error.as_deref())
            }
        }?)
    }

    fn ack_and_claim(
        &self,
        consumer: &str,
        receipt: &str,
        group: &str,
        max: u32,
        lease: Duration,
    ) -> std::result::Result<Vec<Lease>, PortError> {
        let lease_ms = rules::check_claim(&self.inner.config.limits, group, consumer, max, lease)?;
        let receipt: Receipt = receipt.parse().map_err(PgError::from)?;
        let plain = self.alone(|s, now| {
            let rng = &mut rand::rng();
            lease::ack_and_claim_plain(s, rng, &receipt, group, consumer, max, lease_ms, now)
        })?;
        match plain {
            Some(leases) => Ok(leases),
            None => Ok(self
                .run(|ctx| lease::ack_and_claim(ctx, &receipt, consumer, group, max, lease_ms))?),
        }
    }

    fn extend(&self, receipt: &str, lease: Duration) -> std::result::Result<(), PortError> {
        Ok(PgQueue::extend(self, receipt, lease)?)
    }

    fn subscribe(&self, group: &str, topics: &[String]) -> std::result::Result<(), PortError> {
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        Ok(self.create_group(group, &names, GroupOptions::default())?)
    }

    fn leases(
        &self,
        group: Option<&str>,
        after: Option<i64>,
        limit: u32,
    ) -> std::result::Result<Vec<LeaseInFlight>, PortError> {
        Ok(self.run(|ctx| read::leases(ctx, group, after, limit))?)
    }

    fn dead_letters(
        &self,
        group: &str,
        after: Option<i64>,
        limit: u32,
    ) -> std::result::Result<Vec<DeadLetter>, PortError> {
        Ok(self.run(|ctx| read::dead_letters(ctx, group, None, after, limit))?)
    }

    fn redrive(&self, group: &str) -> std::result::Result<u64, PortError> {
        Ok(self.run(|ctx| lease::redrive(ctx, group))?)
    }

    fn metrics(&self) -> std::result::Result<Vec<TopicMetrics>, PortError> {
        Ok(self.run(read::metrics)?)
    }

    fn purge(&self) -> std::result::Result<PurgeReport, PortError> {
        Ok(PgQueue::purge(self)?)
    }

    fn upkeep_failure(&self) -> Option<PortError> {
        PgQueue::upkeep_failure(self)
    }
}
