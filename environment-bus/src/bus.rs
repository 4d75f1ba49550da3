//! [`Bus`]: the handle applications hold.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rusqlite::{Connection, OpenFlags, OptionalExtension, Transaction};

use crate::config::BusConfig;
use crate::consumer::Consumer;
use crate::error::{BusError, Result, SqlContext};
use crate::inbox::Inbox;
use crate::ops::{self, Claimed, Ctx, Settle};
use crate::pending::{self, Pending};
use crate::rules;
use crate::schema;
use crate::types::{
    DeadLetter, GroupOptions, Lease, LeaseHolder, MessageId, NewMessage, PublishOptions, Published,
    PurgeReport, Receipt, TopicMetrics,
};
use crate::writer::{Op, Wakers, Work, Writer};

/// Where one message stands in one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeliveryStatus {
    /// Claimable now or after its delay/backoff.
    Ready,
    /// Behind an earlier message with the same ordering key.
    Waiting,
    /// Leased (the lease may have expired; the next claim decides).
    Leased,
    /// Acked.
    Acked,
    /// A dead letter.
    Dead,
}

impl DeliveryStatus {
    /// The state as both stores number it in their tables.
    pub const fn code(self) -> i16 {
        match self {
            DeliveryStatus::Ready => 0,
            DeliveryStatus::Leased => 1,
            DeliveryStatus::Waiting => 2,
            DeliveryStatus::Acked => 3,
            DeliveryStatus::Dead => 4,
        }
    }

    /// The state a stored number stands for (`None`: no state has it, the table is damaged).
    pub fn from_code(code: i64) -> Option<DeliveryStatus> {
        [
            DeliveryStatus::Ready,
            DeliveryStatus::Leased,
            DeliveryStatus::Waiting,
            DeliveryStatus::Acked,
            DeliveryStatus::Dead,
        ]
        .into_iter()
        .find(|s| i64::from(s.code()) == code)
    }
}

struct Inner {
    inbox: Arc<Inbox>,
    writer: Option<JoinHandle<()>>,
    path: PathBuf,
    config: BusConfig,
    readers: Mutex<Vec<Connection>>,
    wakers: Arc<Wakers>,
    purge_cursor: Arc<AtomicI64>,
    purge_failure: Arc<Mutex<Option<BusError>>>,
    /// Stopped after the writer.
    checkpointer: Option<environment_core::checkpoint::Checkpointer>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the channel stops the writer after it drained its queue; joining makes the
        // close of its connection happen before a reopen.
        self.inbox.close();
        if let Some(h) = self.writer.take() {
            let _ = h.join();
        }
        self.checkpointer.take();
    }
}

/// A durable message bus on one SQLite database. Cheap to clone; all clones share one writer
/// thread. Dropping the last clone stops the writer once its queue is drained.
///
/// Command methods return a [`Pending`]: `.await` it, or `.wait()` on a plain thread.
#[derive(Clone)]
pub struct Bus {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bus")
            .field("path", &self.inner.path)
            .finish()
    }
}

impl Bus {
    /// Opens (creating if needed) the bus in the SQLite database at `path`. The file may be the
    /// environment's own database: the bus only touches tables named `bus_*`.
    pub fn open(path: impl AsRef<Path>, config: BusConfig) -> Result<Bus> {
        let path = path.as_ref().to_path_buf();
        let open_err = |message: String| BusError::Open {
            path: path.display().to_string(),
            message,
        };
        let conn = Connection::open(&path).map_err(|e| open_err(e.to_string()))?;
        schema::configure(&conn, config.busy_timeout)?;
        schema::install(&conn)?;
        let checkpointer = match config.checkpoint_every {
            Some(every) => Some(
                environment_core::checkpoint::Checkpointer::start(&conn, &path, every)
                    .map_err(|e| open_err(format!("cannot start the checkpointer: {e}")))?,
            ),
            None => None,
        };
        let wakers = Arc::new(Wakers::default());
        let inbox = Arc::new(Inbox::new());
        let purge_cursor = Arc::new(AtomicI64::new(0));
        let purge_failure = Arc::new(Mutex::new(None));
        let writer = Writer {
            conn,
            clock: config.clock.clone(),
            backoff: config.backoff,
            wakers: wakers.clone(),
            max_batch: config.max_group_commit.max(1),
            auto_purge: config
                .auto_purge
                .map(|every| (every, rules::ms(config.retention))),
            purge_cursor: purge_cursor.clone(),
            purge_failure: purge_failure.clone(),
        };
        let handle = std::thread::Builder::new()
            .name("bus-writer".into())
            .spawn({
                let inbox = inbox.clone();
                move || writer.run(inbox)
            })
            .map_err(|e| open_err(format!("cannot start the writer thread: {e}")))?;
        Ok(Bus {
            inner: Arc::new(Inner {
                inbox,
                writer: Some(handle),
                path,
                config,
                readers: Mutex::new(Vec::new()),
                wakers,
                purge_cursor,
                purge_failure,
                checkpointer,
            }),
        })
    }

    /// The configuration the bus was opened with.
    pub fn config(&self) -> &BusConfig {
        &self.inner.config
    }

    /// Sends a command that refuses (if at all) before its first write.
    fn submit<T, F>(&self, f: F) -> Pending<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Ctx<'_>) -> Result<T> + Send + 'static,
    {
        self.submit_with(false, f)
    }

    fn submit_with<T, F>(&self, needs_savepoint: bool, f: F) -> Pending<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Ctx<'_>) -> Result<T> + Send + 'static,
    {
        let (answer, pending) = pending::pair();
        let work: Box<dyn Work> = Box::new(Op {
            f,
            answer,
            needs_savepoint,
        });
        // A refused send drops the work, whose answer then reports WriterStopped.
        let _ = self.inner.inbox.send(work);
        pending
    }

    fn read<T>(&self, f: impl FnOnce(&Connection) -> Result<T>) -> Result<T> {
        let pooled = self
            .inner
            .readers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop();
        let conn = match pooled {
            Some(c) => c,
            None => {
                let c = Connection::open_with_flags(
                    &self.inner.path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )
                .ctx("opening a read connection")?;
                c.busy_timeout(self.inner.config.busy_timeout)
                    .ctx("setting busy_timeout")?;
                c
            }
        };
        let out = f(&conn);
        self.inner
            .readers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(conn);
        out
    }

    /// Creates a topic; creating an existing one is a no-op.
    pub fn create_topic(&self, topic: &str) -> Pending<()> {
        let topic = topic.to_owned();
        self.submit(move |ctx| {
            ctx.names.clear();
            ops::create_topic(ctx.conn, &topic)
        })
    }

    /// Creates a consumer group subscribed to `topics` (which must exist), or adds
    /// subscriptions to an existing group with the same options. A group receives the messages
    /// published after it subscribed.
    pub fn create_group(&self, group: &str, topics: &[&str], options: GroupOptions) -> Pending<()> {
        let group = group.to_owned();
        let topics: Vec<String> = topics.iter().map(|t| (*t).to_owned()).collect();
        self.submit(move |ctx| {
            ctx.names.clear();
            ops::create_group(ctx.conn, &group, &topics, options.max_attempts)
        })
    }

    /// Publishes one message to every group subscribed to `topic`.
    pub fn publish(
        &self,
        topic: &str,
        payload: impl Into<Vec<u8>>,
        options: PublishOptions,
    ) -> Pending<Published> {
        self.publish_to(topic, payload.into(), options, false)
    }

    /// [`Bus::publish`], creating the topic first when it does not exist, in the same
    /// transaction: a message refused (too large, say) leaves no topic behind.
    pub fn publish_creating(
        &self,
        topic: &str,
        payload: impl Into<Vec<u8>>,
        options: PublishOptions,
    ) -> Pending<Published> {
        self.publish_to(topic, payload.into(), options, true)
    }

    fn publish_to(
        &self,
        topic: &str,
        payload: Vec<u8>,
        options: PublishOptions,
        create: bool,
    ) -> Pending<Published> {
        let m = NewMessage {
            topic: topic.to_owned(),
            payload,
            options,
        };
        if let Err(e) = rules::check_message(&m, &self.inner.config.limits) {
            return Pending::done(Err(e));
        }
        let window = rules::ms(self.inner.config.dedup_window);
        self.submit(move |ctx| {
            if create {
                ctx.names.clear();
                ops::create_topic(ctx.conn, &m.topic)?;
            }
            ops::publish(ctx, &m, window)
        })
    }

    /// Publishes many messages in one transaction: all or none.
    pub fn publish_batch(&self, messages: Vec<NewMessage>) -> Pending<Vec<Published>> {
        let limits = &self.inner.config.limits;
        if messages.len() > limits.max_batch {
            return Pending::done(Err(BusError::OutOfRange {
                what: "batch size",
                value: messages.len() as u128,
                min: 0,
                max: limits.max_batch as u128,
            }));
        }
        if let Some(e) = messages
            .iter()
            .find_map(|m| rules::check_message(m, limits).err())
        {
            return Pending::done(Err(e));
        }
        let window = rules::ms(self.inner.config.dedup_window);
        // An unknown topic may show up after earlier messages were written.
        self.submit_with(true, move |ctx| {
            messages
                .iter()
                .map(|m| ops::publish(ctx, m, window))
                .collect()
        })
    }

    fn check_group_claim(
        &self,
        group: &str,
        consumer: &str,
        max: u32,
        lease: Duration,
    ) -> Result<i64> {
        rules::check_claim(&self.inner.config.limits, group, consumer, max, lease)
    }

    /// The claim both [`Bus::claim`] and [`Consumer`] use; it also reports when the group's
    /// next message falls due.
    pub(crate) fn claim_detailed(
        &self,
        group: &str,
        consumer: &str,
        max: u32,
        lease: Duration,
    ) -> Pending<Claimed> {
        let lease_ms = match self.check_group_claim(group, consumer, max, lease) {
            Ok(l) => l,
            Err(e) => return Pending::done(Err(e)),
        };
        let (group, consumer) = (group.to_owned(), consumer.to_owned());
        self.submit(move |ctx| ops::claim(ctx, &group, &consumer, max, lease_ms))
    }

    /// Leases up to `max` claimable messages of `group` to `consumer` for `lease` (the lease
    /// holds while the clock reads at most `now + lease`). Attempts are counted here; a message
    /// whose attempts are used up becomes a dead letter instead. Returns at once, possibly with
    /// nothing (see [`Consumer::next`] to wait).
    pub fn claim(
        &self,
        group: &str,
        consumer: &str,
        max: u32,
        lease: Duration,
    ) -> Pending<Vec<Lease>> {
        let lease_ms = match self.check_group_claim(group, consumer, max, lease) {
            Ok(l) => l,
            Err(e) => return Pending::done(Err(e)),
        };
        let (group, consumer) = (group.to_owned(), consumer.to_owned());
        self.submit(move |ctx| ops::claim(ctx, &group, &consumer, max, lease_ms).map(|c| c.leases))
    }

    fn settle(&self, receipt: &Receipt, action: Settle) -> Pending<()> {
        self.settle_by(None, receipt, action)
    }

    /// Settles as `by` (the consumer that claimed the delivery) when given.
    fn settle_by(&self, by: Option<&str>, receipt: &Receipt, action: Settle) -> Pending<()> {
        let (receipt, by) = (*receipt, by.map(str::to_owned));
        self.submit(move |ctx| ops::settle(ctx, &receipt, &action, by.as_deref()))
    }

    /// Acknowledges: the message is done for this group and never delivered to it again.
    pub fn ack(&self, receipt: &Receipt) -> Pending<()> {
        self.settle(receipt, Settle::Ack)
    }

    /// [`Bus::ack`] on behalf of `consumer`, which must be the consumer that claimed the
    /// delivery: a receipt that leaked to another consumer is refused with
    /// [`BusError::NotYourReceipt`] and settles nothing. For settlements that arrive through a
    /// door shared by several consumers.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use environment_bus::{Bus, BusConfig, BusError, GroupOptions, PublishOptions};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let bus = Bus::open(dir.path().join("bus.db"), BusConfig::default()).unwrap();
    /// # bus.create_topic("jobs").wait().unwrap();
    /// # bus.create_group("workers", &["jobs"], GroupOptions::default()).wait().unwrap();
    /// bus.publish("jobs", b"build".to_vec(), PublishOptions::default()).wait().unwrap();
    /// let lease = bus.claim("workers", "agent:a", 1, Duration::from_secs(30)).wait().unwrap();
    /// let receipt = &lease[0].receipt;
    /// assert!(matches!(
    ///     bus.ack_as("agent:b", receipt).wait(),
    ///     Err(BusError::NotYourReceipt { .. })
    /// ));
    /// bus.ack_as("agent:a", receipt).wait().unwrap();
    /// ```
    pub fn ack_as(&self, consumer: &str, receipt: &Receipt) -> Pending<()> {
        self.settle_by(Some(consumer), receipt, Settle::Ack)
    }

    /// Acks `receipt` as `consumer` and leases up to `max` further messages of `group` (the
    /// receipt's group) to the same consumer, in one command: a worker's cycle is two
    /// operations (publish, then this), not three. A receipt of another group is
    /// [`BusError::OtherGroup`] and acks nothing.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use environment_bus::{Bus, BusConfig, GroupOptions, PublishOptions};
    /// # let dir = tempfile::tempdir().unwrap();
    /// # let bus = Bus::open(dir.path().join("bus.db"), BusConfig::default()).unwrap();
    /// # bus.create_topic("jobs").wait().unwrap();
    /// # bus.create_group("workers", &["jobs"], GroupOptions::default()).wait().unwrap();
    /// for job in ["build", "test"] {
    ///     bus.publish("jobs", job.as_bytes().to_vec(), PublishOptions::default()).wait().unwrap();
    /// }
    /// let lease = Duration::from_secs(30);
    /// let first = bus.claim("workers", "agent:a", 1, lease).wait().unwrap();
    /// let next = bus
    ///     .ack_and_claim("agent:a", &first[0].receipt, "workers", 1, lease)
    ///     .wait()
    ///     .unwrap();
    /// assert_eq!(next[0].message.payload, b"test");
    /// ```
    pub fn ack_and_claim(
        &self,
        consumer: &str,
        receipt: &Receipt,
        group: &str,
        max: u32,
        lease: Duration,
    ) -> Pending<Vec<Lease>> {
        let lease_ms = match self.check_group_claim(group, consumer, max, lease) {
            Ok(l) => l,
            Err(e) => return Pending::done(Err(e)),
        };
        let (receipt, consumer, group) = (*receipt, consumer.to_owned(), group.to_owned());
        // It may refuse after its ack (a receipt of another group): a savepoint undoes it.
        self.submit_with(true, move |ctx| {
            ops::ack_and_claim(ctx, &receipt, &consumer, &group, max, lease_ms).map(|c| c.leases)
        })
    }

    /// Acks many receipts in one transaction; each gets its own outcome (a stale receipt does
    /// not stop the others). A database error fails the whole call and acks none.
    pub fn ack_many(&self, receipts: &[Receipt]) -> Pending<Vec<Result<()>>> {
        let receipts = receipts.to_vec();
        self.submit(move |ctx| {
            let mut out = Vec::with_capacity(receipts.len());
            for r in &receipts {
                match ops::settle(ctx, r, &Settle::Ack, None) {
                    // Possibly half-written: the transaction (or savepoint) must go.
                    Err(e @ BusError::Sqlite { .. }) => return Err(e),
                    other => out.push(other),
                }
            }
            Ok(out)
        })
    }

    /// Gives the message back for a retry after the configured backoff (exponential with
    /// jitter, never instant). At the group's `max_attempts` it becomes a dead letter instead.
    pub fn nack(&self, receipt: &Receipt) -> Pending<()> {
        self.settle(
            receipt,
            Settle::Nack {
                delay_ms: None,
                error: None,
            },
        )
    }

    /// Gives the message back for a retry after exactly `delay` (zero allowed: an explicit
    /// immediate retry).
    pub fn nack_with_delay(&self, receipt: &Receipt, delay: Duration) -> Pending<()> {
        self.nack_with_error(receipt, Some(delay), None)
    }

    /// Nack with an optional delay (`None`: backoff) and an error to keep as the message's last
    /// error (shown on its dead letter).
    pub fn nack_with_error(
        &self,
        receipt: &Receipt,
        delay: Option<Duration>,
        error: Option<&str>,
    ) -> Pending<()> {
        self.nack_by(None, receipt, delay, error)
    }

    /// [`Bus::nack_with_error`] on behalf of `consumer`, which must be the consumer that
    /// claimed the delivery (see [`Bus::ack_as`]).
    pub fn nack_as(
        &self,
        consumer: &str,
        receipt: &Receipt,
        delay: Option<Duration>,
        error: Option<&str>,
    ) -> Pending<()> {
        self.nack_by(Some(consumer), receipt, delay, error)
    }

    fn nack_by(
        &self,
        by: Option<&str>,
        receipt: &Receipt,
        delay: Option<Duration>,
        error: Option<&str>,
    ) -> Pending<()> {
        let delay_ms = match rules::check_nack(&self.inner.config.limits, delay, error) {
            Ok(d) => d,
            Err(e) => return Pending::done(Err(e)),
        };
        self.settle_by(
            by,
            receipt,
            Settle::Nack {
                delay_ms,
                error: error.map(str::to_owned),
            },
        )
    }

    /// Heartbeat: the lease now runs until `lease` from now.
    pub fn extend(&self, receipt: &Receipt, lease: Duration) -> Pending<()> {
        match rules::check_lease(&self.inner.config.limits, lease) {
            Ok(lease_ms) => self.settle(receipt, Settle::Extend { lease_ms }),
            Err(e) => Pending::done(Err(e)),
        }
    }

    /// Poison message: straight to the dead letters with `reason`, no retry.
    pub fn terminate(&self, receipt: &Receipt, reason: &str) -> Pending<()> {
        if let Err(e) = rules::check_reason(reason) {
            return Pending::done(Err(e));
        }
        self.settle(
            receipt,
            Settle::Terminate {
                reason: reason.to_owned(),
            },
        )
    }

    /// Puts the group's dead letters (or only `message`) back in line with fresh attempts.
    /// Returns how many.
    pub fn redrive(&self, group: &str, message: Option<MessageId>) -> Pending<u64> {
        let group = group.to_owned();
        self.submit(move |ctx| ops::redrive(ctx, &group, message))
    }

    /// Who holds the lease `receipt` names, and in which group, so that a service settling
    /// receipts for callers can decide on the group and settle as the holder (see
    /// [`Bus::ack_as`]), whichever process claimed. A receipt that names no delivery is
    /// [`BusError::UnknownReceipt`]; one whose lease was settled, or lapsed and was claimed
    /// again, is [`BusError::StaleReceipt`].
    pub fn lease_holder(&self, receipt: &Receipt) -> Result<LeaseHolder> {
        let delivery = receipt.delivery;
        let row: Option<(String, i64, Option<i64>, Option<String>)> = self.read(|c| {
            c.prepare_cached(
                "SELECT g.name, d.state, d.token, d.consumer FROM bus_deliveries d \
                 JOIN bus_groups g ON g.id = d.group_id WHERE d.id = ?1",
            )
            .and_then(|mut s| {
                s.query_row([delivery], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
                })
                .optional()
            })
            .ctx("reading a lease's holder")
        })?;
        let (group, _, _, consumer) = rules::leased(receipt, row, |r| (r.1, r.2))?;
        Ok(LeaseHolder {
            group,
            consumer: consumer.unwrap_or_default(),
        })
    }

    /// The leases in flight now, of `group` or of every group, in delivery order after the
    /// delivery `after`: who holds which message, on which attempt, until when (blocks briefly
    /// on a read connection).
    pub fn leases(
        &self,
        group: Option<&str>,
        after: Option<i64>,
        limit: u32,
    ) -> Result<Vec<environment_core::queue::LeaseInFlight>> {
        let now = self.inner.config.clock.now_ms();
        self.read(|c| ops::leases(c, group, after, now, limit))
    }

    /// The group's dead letters, oldest first (blocks briefly on a read connection).
    pub fn dead_letters(&self, group: &str, limit: u32) -> Result<Vec<DeadLetter>> {
        self.dead_letters_after(group, None, limit)
    }

    /// The group's dead letters after the message `after`, oldest first: the next page.
    pub fn dead_letters_after(
        &self,
        group: &str,
        after: Option<MessageId>,
        limit: u32,
    ) -> Result<Vec<DeadLetter>> {
        self.read(|c| ops::dead_letters(c, group, None, after, limit))
    }

    /// One dead letter.
    pub fn dead_letter(&self, group: &str, message: MessageId) -> Result<DeadLetter> {
        self.read(|c| ops::dead_letters(c, group, Some(message), None, 1))?
            .pop()
            .ok_or_else(|| BusError::NoSuchDeadLetter {
                group: group.to_owned(),
                message: message.0,
            })
    }

    /// Where `message` stands in `group`; `None` if the group never had it (published before
    /// it subscribed, or purged).
    pub fn status(&self, group: &str, message: MessageId) -> Result<Option<DeliveryStatus>> {
        let state = self.read(|c| ops::delivery_state(c, group, message))?;
        state
            .map(|s| {
                DeliveryStatus::from_code(s).ok_or_else(|| BusError::Corrupt {
                    detail: format!("delivery state {s}"),
                })
            })
            .transpose()
    }

    /// Depth, in flight, oldest age, dead letters and redeliveries per topic and group.
    pub fn metrics(&self) -> Result<Vec<TopicMetrics>> {
        let now = self.inner.config.clock.now_ms();
        self.read(|c| ops::metrics(c, now))
    }

    fn purge_command(&self, chunk: u32) -> Pending<(PurgeReport, bool)> {
        let retention = rules::ms(self.inner.config.retention);
        let chunk = i64::from(chunk.max(1));
        let cursor = self.inner.purge_cursor.clone();
        self.submit(move |ctx| {
            let cutoff = ctx.now.saturating_sub(retention);
            ops::purge_step(ctx.conn, ctx.now, cutoff, chunk, &cursor)
        })
    }

    /// One bounded purge step as its own command: at most `chunk` messages examined, with
    /// their deliveries acked before the retention.
    pub fn purge_step(&self, chunk: u32) -> Pending<PurgeReport> {
        let retention = rules::ms(self.inner.config.retention);
        let chunk = i64::from(chunk.max(1));
        let cursor = self.inner.purge_cursor.clone();
        self.submit(move |ctx| {
            let cutoff = ctx.now.saturating_sub(retention);
            ops::purge_step(ctx.conn, ctx.now, cutoff, chunk, &cursor).map(|(r, _)| r)
        })
    }

    /// Why the last automatic purge step ([`BusConfig::auto_purge`]) failed, until one
    /// succeeds: the background purge's failures are kept here for whoever reports on the bus,
    /// not only logged.
    pub fn upkeep_failure(&self) -> Option<BusError> {
        self.inner.purge_failure.lock().ok()?.clone()
    }

    /// Purges everything the retention allows, in small steps so claims and acks interleave
    /// instead of waiting for one long transaction. Blocks the calling thread.
    pub fn purge(&self) -> Result<PurgeReport> {
        let mut total = PurgeReport::default();
        let mut quiet_wraps = 0;
        // Two full sweeps without finding anything: the first may have started mid-table.
        while quiet_wraps < 2 {
            let (step, wrapped) = self.purge_command(500).wait()?;
            if wrapped && step.is_empty() {
                quiet_wraps += 1;
            }
            total += step;
        }
        Ok(total)
    }

    /// A consumer of `group` named `name` whose claims last `lease`; its `next()` waits for a
    /// message without polling.
    pub fn consumer(&self, group: &str, name: &str, lease: Duration) -> Result<Consumer> {
        self.check_group_claim(group, name, 1, lease)?;
        let (gid, _) = self.read(|c| ops::group_row(c, group))?;
        Ok(Consumer::new(
            self.clone(),
            group.to_owned(),
            name.to_owned(),
            lease,
            self.inner.wakers.get(gid),
        ))
    }

    /// Wakes every waiting consumer of this process. Call it after committing a transaction
    /// that used [`Bus::publish_in`] or [`Bus::ack_in`].
    pub fn wake(&self) {
        self.inner.wakers.wake_all();
    }

    /// Publishes inside the caller's transaction on the same database (transactional outbox):
    /// the message exists if and only if the caller's transaction commits. Open the transaction
    /// with `TransactionBehavior::Immediate`; the bus's tables must exist (open the bus on the
    /// file first, or call [`install`](crate::install)). Call [`Bus::wake`] after the commit.
    pub fn publish_in(
        &self,
        tx: &Transaction<'_>,
        topic: &str,
        payload: impl Into<Vec<u8>>,
        options: PublishOptions,
    ) -> Result<Published> {
        let m = NewMessage {
            topic: topic.to_owned(),
            payload: payload.into(),
            options,
        };
        rules::check_message(&m, &self.inner.config.limits)?;
        let window = rules::ms(self.inner.config.dedup_window);
        self.in_tx(tx, |ctx| ops::publish(ctx, &m, window))
    }

    /// Acks inside the caller's transaction: the application's record of having processed the
    /// message and the ack commit together, so a crash never leaves one without the other.
    /// A stale receipt is refused; the caller should then roll back its own writes.
    pub fn ack_in(&self, tx: &Transaction<'_>, receipt: &Receipt) -> Result<()> {
        self.in_tx(tx, |ctx| ops::settle(ctx, receipt, &Settle::Ack, None))
    }

    fn in_tx<T>(
        &self,
        tx: &Transaction<'_>,
        f: impl FnOnce(&mut Ctx<'_>) -> Result<T>,
    ) -> Result<T> {
        let mut rng = StdRng::from_os_rng();
        let mut wake = Vec::new();
        // A savepoint so a refusal leaves the caller's transaction as it was.
        tx.prepare_cached("SAVEPOINT bus_in")
            .and_then(|mut s| s.execute([]))
            .ctx("savepoint")?;
        let mut names = ops::Names::default();
        let mut ctx = Ctx {
            conn: tx,
            names: &mut names,
            now: self.inner.config.clock.now_ms(),
            backoff: self.inner.config.backoff,
            rng: &mut rng,
            wake: &mut wake,
        };
        let r = f(&mut ctx);
        if r.is_err() {
            tx.execute_batch("ROLLBACK TO bus_in")
                .ctx("rolling back a savepoint")?;
        }
        tx.prepare_cached("RELEASE bus_in")
            .and_then(|mut s| s.execute([]))
            .ctx("ending a savepoint")?;
        r
    }
}

#[cfg(test)]
mod status_codes {
    use super::DeliveryStatus;

    #[test]
    fn every_state_reads_back_from_its_number_and_no_other_number_reads() {
        for s in [
            DeliveryStatus::Ready,
            DeliveryStatus::Leased,
            DeliveryStatus::Waiting,
            DeliveryStatus::Acked,
            DeliveryStatus::Dead,
        ] {
            assert_eq!(DeliveryStatus::from_code(i64::from(s.code())), Some(s));
        }
        assert_eq!(DeliveryStatus::from_code(5), None);
        assert_eq!(DeliveryStatus::from_code(-1), None);
    }
}
