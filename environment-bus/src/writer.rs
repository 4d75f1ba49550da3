//! The writer thread: it owns the only write connection and runs commands in group commits —
//! everything queued while the previous transaction ran goes into the next one, so many
//! clients share one commit.

use std::collections::HashMap;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the writer yields for the next command before sleeping on its inbox.
const SPIN: Duration = Duration::from_micros(200);

use environment_core::Clock;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rusqlite::Connection;
use tokio::sync::Notify;

use crate::error::{BusError, Result, SqlContext};
use crate::inbox::{Inbox, Taken};
use crate::ops::{self, Ctx, Names};
use crate::pending::{self, Answer, Bell};
use crate::types::Backoff;

/// Wakes consumers waiting on a group (in this process).
#[derive(Default)]
pub(crate) struct Wakers {
    map: Mutex<HashMap<i64, Arc<Notify>>>,
}

impl Wakers {
    pub(crate) fn get(&self, group_id: i64) -> Arc<Notify> {
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(group_id).or_default().clone()
    }

    /// Wakes up to `count` waiting consumers of the group: one per message that became
    /// claimable, so a single publish does not send every idle consumer to the writer.
    pub(crate) fn wake(&self, group_id: i64, count: usize) {
        let n = {
            let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            map.get(&group_id).cloned()
        };
        if let Some(n) = n {
            // Past a few dozen, the woken consumers find the rest themselves: one that claims
            // something comes back and claims again before it ever waits.
            for _ in 0..count.min(64) {
                n.notify_one();
            }
        }
    }

    pub(crate) fn wake_all(&self) {
        let all: Vec<Arc<Notify>> = {
            let map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            map.values().cloned().collect()
        };
        for n in all {
            n.notify_waiters();
        }
    }
}

/// A command for the writer.
pub(crate) trait Work: Send {
    /// Whether the command may refuse after it has written something, and so needs a
    /// savepoint when it shares a transaction. The others refuse before their first write
    /// (validation, unknown names, stale receipts), so a refusal leaves nothing to undo and
    /// the two savepoint statements per command are saved.
    fn needs_savepoint(&self) -> bool;
    /// Runs inside the open transaction.
    fn run(self: Box<Self>, ctx: &mut Ctx<'_>) -> Box<dyn Finish>;
    /// The transaction could not even begin.
    fn fail(self: Box<Self>, err: BusError);
}

/// A command that ran and waits for the commit's outcome before answering.
pub(crate) trait Finish: Send {
    fn succeeded(&self) -> bool;
    /// A database error (possibly after partial writes), as opposed to a refusal.
    fn database_error(&self) -> Option<BusError>;
    /// Stores the answer; the bell wakes the caller.
    fn finish(self: Box<Self>, commit: Option<&BusError>) -> Option<Bell>;
}

pub(crate) struct Op<T, F> {
    pub f: F,
    pub answer: Answer<T>,
    pub needs_savepoint: bool,
}

struct Done<T> {
    result: Result<T>,
    answer: Answer<T>,
}

impl<T: Send + 'static, F: FnOnce(&mut Ctx<'_>) -> Result<T> + Send> Work for Op<T, F> {
    fn needs_savepoint(&self) -> bool {
        self.needs_savepoint
    }
    fn run(self: Box<Self>, ctx: &mut Ctx<'_>) -> Box<dyn Finish> {
        let Op { f, answer, .. } = *self;
        Box::new(Done {
            result: f(ctx),
            answer,
        })
    }
    fn fail(self: Box<Self>, err: BusError) {
        self.answer.send(Err(err));
    }
}

impl<T: Send + 'static> Finish for Done<T> {
    fn succeeded(&self) -> bool {
        self.result.is_ok()
    }
    fn database_error(&self) -> Option<BusError> {
        match &self.result {
            Err(e @ BusError::Sqlite { .. }) => Some(e.clone()),
            _ => None,
        }
    }
    fn finish(self: Box<Self>, commit: Option<&BusError>) -> Option<Bell> {
        let result = match (commit, self.result) {
            (Some(e), Ok(_)) => Err(e.clone()),
            (_, r) => r,
        };
        self.answer.set(result)
    }
}

pub(crate) struct Writer {
    pub conn: Connection,
    pub clock: Arc<dyn Clock>,
    pub backoff: Backoff,
    pub wakers: Arc<Wakers>,
    pub max_batch: usize,
    pub auto_purge: Option<(Duration, i64)>,
    pub purge_cursor: Arc<AtomicI64>,
    /// Why the last automatic purge step failed, until one succeeds ([`crate::Bus::upkeep_failure`]).
    pub purge_failure: Arc<Mutex<Option<BusError>>>,
}

impl Writer {
    /// Transaction control through the statement cache: parsing `BEGIN`/`COMMIT` on every
    /// group commit showed up in profiles.
    fn exec(&self, sql: &'static str) -> rusqlite::Result<()> {
        self.conn.prepare_cached(sql)?.execute([]).map(|_| ())
    }

    pub(crate) fn run(self, inbox: Arc<Inbox>) {
        // If this thread dies, queued and later commands answer `WriterStopped` instead of
        // waiting forever.
        struct Stop(Arc<Inbox>);
        impl Drop for Stop {
            fn drop(&mut self) {
                drop(self.0.close_and_drain());
            }
        }
        let _stop = Stop(inbox.clone());
        let mut rng = StdRng::from_os_rng();
        let mut names = Names::default();
        let mut wake = Vec::new();
        let mut batch: Vec<Box<dyn Work>> = Vec::with_capacity(self.max_batch);
        // Purge steps are due by the wall clock whether or not the bus is idle, so a bus under
        // constant load still purges; each step is small and runs between group commits.
        let mut next_purge = self.auto_purge.map(|(every, _)| Instant::now() + every);
        loop {
            if let Some(at) = next_purge
                && Instant::now() >= at
            {
                next_purge = self.purge_step().map(|wait| Instant::now() + wait);
            }
            match inbox.take(&mut batch, self.max_batch, SPIN, next_purge) {
                Taken::Work => {}
                Taken::Idle => continue,
                Taken::Closed => return,
            }
            self.commit_batch(&mut batch, &mut names, &mut rng, &mut wake);
        }
    }

    /// One automatic purge step in its own transaction; returns how long to wait for the
    /// next (none while there is work left).
    fn purge_step(&self) -> Option<Duration> {
        let (every, retention) = self.auto_purge?;
        let now = self.clock.now_ms();
        let step = (|| -> Result<_> {
            self.exec("BEGIN IMMEDIATE").ctx("beginning a purge")?;
            let r = ops::purge_step(
                &self.conn,
                now,
                now.saturating_sub(retention),
                500,
                &self.purge_cursor,
            );
            let end = if r.is_ok() { "COMMIT" } else { "ROLLBACK" };
            self.exec(end).ctx("ending a purge")?;
            r
        })();
        let failure = step.as_ref().err().cloned();
        if let Ok(mut last) = self.purge_failure.lock() {
            *last = failure;
        }
        match step {
            Ok((r, wrapped)) if !r.is_empty() || !wrapped => Some(Duration::ZERO),
            Ok(_) => Some(every),
            Err(e) => {
                tracing::warn!(error = %e, "bus purge step failed");
                let _ = self.exec("ROLLBACK");
                Some(every)
            }
        }
    }

    fn commit_batch(
        &self,
        batch: &mut Vec<Box<dyn Work>>,
        names: &mut Names,
        rng: &mut StdRng,
        wake: &mut Vec<i64>,
    ) {
        if let Err(e) = self.exec("BEGIN IMMEDIATE").ctx("beginning a transaction") {
            for w in batch.drain(..) {
                w.fail(e.clone());
            }
            return;
        }
        if names.check_version(&self.conn).is_err() {
            // Without the version, nothing cached can be trusted; the commands read afresh.
            names.clear();
        }
        // With one command the transaction itself is the unit of rollback. With several, a
        // command that may refuse half-way gets a savepoint so its refusal does not undo its
        // neighbours; a database error in any command undoes the whole transaction.
        let isolate = batch.len() > 1;
        let mut finishes = Vec::with_capacity(batch.len());
        // A database error or a failure of the savepoint machinery: the whole transaction goes.
        let mut broken: Option<BusError> = None;
        let mut single_failed = false;
        for w in batch.drain(..) {
            let guarded = isolate && w.needs_savepoint();
            if guarded && let Err(e) = self.exec("SAVEPOINT cmd").ctx("savepoint") {
                w.fail(e.clone());
                broken = Some(e);
                continue;
            }
            let mark = wake.len();
            let mut ctx = Ctx {
                conn: &self.conn,
                names,
                now: self.clock.now_ms(),
                backoff: self.backoff,
                rng,
                wake,
            };
            let f = w.run(&mut ctx);
            if !f.succeeded() {
                wake.truncate(mark);
                // What it cached may be rolled back with it.
                names.clear();
                if guarded {
                    if let Err(e) = self
                        .exec("ROLLBACK TO cmd")
                        .and_then(|()| self.exec("RELEASE cmd"))
                        .ctx("rolling back a command")
                    {
                        broken = Some(e);
                    }
                } else if !isolate {
                    single_failed = true;
                } else if let Some(e) = f.database_error() {
                    broken = Some(e);
                }
            } else if guarded && let Err(e) = self.exec("RELEASE cmd").ctx("releasing a savepoint")
            {
                broken = Some(e);
            }
            finishes.push(f);
        }
        let commit_err = if let Some(e) = broken {
            let _ = self.exec("ROLLBACK");
            Some(e)
        } else if single_failed {
            // The only command failed: nothing of it may stay; it reports its own error.
            self.exec("ROLLBACK").ctx("rolling back").err()
        } else {
            self.exec("COMMIT").ctx("committing").err()
        };
        if commit_err.is_some() || single_failed {
            names.clear();
        }
        if let Some(e) = &commit_err {
            let _ = self.exec("ROLLBACK");
            tracing::error!(error = %e, "bus: group commit failed");
            wake.clear();
        }
        // Wake only after the commit, so a woken consumer finds the rows.
        wake.sort_unstable();
        for run in wake.chunk_by(|a, b| a == b) {
            self.wakers.wake(run[0], run.len());
        }
        wake.clear();
        let bells = finishes
            .into_iter()
            .filter_map(|f| f.finish(commit_err.as_ref()))
            .collect();
        pending::ring_group(bells);
    }
}
