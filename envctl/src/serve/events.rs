//! The environment's events as Server-Sent Events: each new operation (`operation`, its id
//! the operation's position in the log, so a client that reconnects with `Last-Event-ID` gets
//! every one since), the approvals and effects (`approval`, `effect`: the state of each on
//! connecting, then every change), and the queue (`queue`: its figures on connecting and after
//! every change). One watcher looks at the log for the whole server, so an
//! operation another process records shows up too; then one feed per caller reads what changed
//! through the service, as that caller (so it sees only what it may read), once for all the
//! streams the caller has open, rendering each event's frame once. What a feed finds in one
//! look goes out as one batch, written to each stream in one piece: a burst of commits costs a
//! hundred open streams one write each, not one per event.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Extension, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::Response;
use environment_core::json::HistoryLine;
use environment_core::{Governance, LocalEnvironment, Queue};
use environment_workspace::effects::ListParams as EffectListParams;
use environment_workspace::permissions::ApprovalListParams;
use environment_workspace::queue::StatsParams;
use environment_workspace::versions::HistoryParams;
use environment_workspace::{Caller, Request};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::{BroadcastStream, IntervalStream};

use super::Served;
use crate::door::Door;

/// What the watcher saw last: the log's last operation, and how often the approvals, the
/// effects and the queue changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    seq: u64,
    approvals: u64,
    effects: u64,
    queue: u64,
}

/// What the watcher looks at: the environment's log and effects, the policy's approvals and
/// the queue's figures.
#[derive(Clone)]
pub(crate) struct Watched {
    pub(crate) env: LocalEnvironment,
    pub(crate) policy: Option<Arc<dyn Governance>>,
    pub(crate) queue: Option<Arc<dyn Queue>>,
    pub(crate) branch: String,
}

/// How often the log is looked at when nothing is committed in this process.
const TICK: Duration = Duration::from_millis(50);
/// After a change went out, the log is looked at again no sooner than this, so a burst of
/// commits reaches the streams as one batch (a commit after a quiet spell goes out at once).
/// Each batch costs every open stream a write and its reader a wake-up; a longer window
/// spreads that over more commits, and an event of a burst still comes well inside the
/// 100 ms a person notices.
const BATCH: Duration = Duration::from_millis(25);
/// At most this many operations are replayed to a client that reconnects.
const REPLAY: usize = 1000;

/// Watches the log (and the approvals, effects and queue) for the whole server: at once for
/// what this process commits through its environment, within a tick for what other processes
/// do.
pub(crate) async fn watch_log(watched: Watched) -> watch::Receiver<Seen> {
    // What is there already, before the first stream opens: a stream starts after it.
    let first = {
        let (env, branch) = (watched.env.clone(), watched.branch.clone());
        tokio::task::spawn_blocking(move || {
            env.head(&branch)
                .and_then(|h| env.op(&h))
                .map(|op| op.seq)
                .unwrap_or(0)
        })
        .await
        .unwrap_or(0)
    };
    let start = Seen {
        seq: first,
        ..Seen::default()
    };
    let (tx, rx) = watch::channel(start);
    let mut commits = watched
        .env
        .subscribe(environment_core::EventFilter::default());
    tokio::spawn(async move {
        let mut seen = start;
        let mut digests = Digests::default();
        // When the last change went out to the feeds.
        let mut sent: Option<Instant> = None;
        for n in 0u64.. {
            if tx.is_closed() {
                return;
            }
            // Approvals, effects and the queue change less often; a digest of their states
            // says when.
            let w = watched.clone();
            // The server keeps one receiver; each caller's feed holds another.
            let listening = tx.receiver_count() > 1;
            let looked = tokio::task::spawn_blocking(move || {
                let seq = w
                    .env
                    .head(&w.branch)
                    .and_then(|h| w.env.op(&h))
                    .map(|op| op.seq)
                    .ok();
                // Only while some stream listens: a feed's first look reads everything itself.
                let states = (listening && n.is_multiple_of(5)).then(|| Digests::of(&w));
                (seq, states)
            })
            .await;
            let Ok((seq, states)) = looked else {
                return;
            };
            if let Some(seq) = seq {
                seen.seq = seq;
            }
            if let Some(now) = states {
                seen.approvals += u64::from(now.approvals != digests.approvals);
                seen.effects += u64::from(now.effects != digests.effects);
                seen.queue += u64::from(now.queue != digests.queue);
                digests = now;
            }
            if tx.send_if_modified(|s| std::mem::replace(s, seen) != seen) {
                sent = Some(Instant::now());
            }
            tokio::select! {
                _ = commits.recv() => {}
                _ = tokio::time::sleep(TICK) => {}
            }
            // A burst of commits is looked at together, at most once a `BATCH` after the last
            // change went out: each stream then wakes and writes once for the burst, not once
            // per commit. A commit after a quiet spell is looked at at once.
            if let Some(sent) = sent {
                tokio::time::sleep_until(sent + BATCH).await;
            }
            while commits.try_recv().is_some() {}
        }
    });
    rx
}

/// What the approvals, the effects and the queue are, each in a line: a change of the line is a
/// change of what it sums up.
#[derive(Default, PartialEq, Eq)]
struct Digests {
    approvals: String,
    effects: String,
    queue: String,
}

impl Digests {
    fn of(w: &Watched) -> Digests {
        let approvals = w
            .policy
            .as_ref()
            .map(|p| {
                p.approvals()
                    .iter()
                    .map(|a| format!("{}:{};", a.id, a.state))
                    .collect()
            })
            .unwrap_or_default();
        let effects = w
            .env
            .effects()
            .map(|list| {
                list.iter()
                    .map(|e| format!("{}:{}:{};", e.id, e.state.as_str(), e.updated_ms))
                    .collect()
            })
            .unwrap_or_default();
        // The oldest message's age grows with the clock: left out, or the queue would seem
        // to change at every look while anything waits.
        let queue = w
            .queue
            .as_ref()
            .and_then(|q| q.metrics().ok())
            .map(|topics| {
                let mut line = String::new();
                for t in &topics {
                    line.push_str(&format!("{}:{};", t.topic, t.retained));
                    for g in &t.groups {
                        line.push_str(&format!(
                            "{}:{}:{}:{}:{};",
                            g.group, g.depth, g.in_flight, g.dead_letters, g.redeliveries
                        ));
                    }
                }
                line
            })
            .unwrap_or_default();
        Digests {
            approvals,
            effects,
            queue,
        }
    }
}

/// One event, rendered once as the frame every stream of a caller sends.
#[derive(Clone, Debug)]
pub(crate) struct Item {
    /// An operation's position in the log.
    id: Option<u64>,
    /// `event:`, `id:` and `data:` lines and the blank line that ends them.
    frame: Bytes,
}

impl Item {
    fn of<T: serde::Serialize>(kind: &'static str, id: Option<u64>, data: &T) -> Option<Item> {
        // Compact JSON has no line breaks: the data is one `data:` line.
        let data = serde_json::to_string(data).ok()?;
        let mut frame = format!("event: {kind}\n");
        if let Some(id) = id {
            frame.push_str(&format!("id: {id}\n"));
        }
        frame.push_str("data: ");
        frame.push_str(&data);
        frame.push_str("\n\n");
        Some(Item {
            id,
            frame: frame.into(),
        })
    }
}

/// What a feed found in one look, sent to its streams together.
type Batch = Arc<[Item]>;

/// The frames of `items` a stream has not sent yet (an operation at or before `cursor` was
/// in its opening), in one piece; `cursor` moves to the last operation sent.
fn unsent(items: &[Item], cursor: &mut u64) -> Option<Bytes> {
    let mut out = Vec::with_capacity(items.iter().map(|i| i.frame.len()).sum());
    for item in items {
        match item.id {
            Some(id) if id <= *cursor => continue,
            Some(id) => *cursor = id,
            None => {}
        }
        out.extend_from_slice(&item.frame);
    }
    (!out.is_empty()).then(|| out.into())
}

/// A comment line: keeps idle connections (and proxies) from timing out.
const KEEP_ALIVE: &[u8] = b":\n\n";
/// How often a stream sends [`KEEP_ALIVE`], events or not.
const KEEP_ALIVE_EVERY: Duration = Duration::from_secs(15);

/// Whose feed: an actor, and the token it presents by default.
type FeedKey = (String, Option<String>);

/// The feed of each caller with a stream open.
#[derive(Default)]
pub(crate) struct Feeds(Mutex<HashMap<FeedKey, broadcast::Sender<Batch>>>);

/// How many batches a slow stream may fall behind its feed before it is closed (its client
/// then reconnects with `Last-Event-ID` and misses nothing).
const BACKLOG: usize = 4096;

impl Feeds {
    /// A receiver of `caller`'s feed, starting it if none runs.
    fn subscribe(
        &self,
        caller: &Caller,
        door: &Door,
        seen: &watch::Receiver<Seen>,
    ) -> broadcast::Receiver<Batch> {
        let key = (caller.actor.to_string(), caller.default_token.clone());
        let mut feeds = self.0.lock().unwrap_or_else(|p| p.into_inner());
        feeds.retain(|_, tx| tx.receiver_count() > 0);
        if let Some(tx) = feeds.get(&key) {
            return tx.subscribe();
        }
        let (tx, rx) = broadcast::channel(BACKLOG);
        // The feed starts from what the watcher saw as this stream opened, not from when the
        // task happens to run.
        let mut seen = seen.clone();
        let start = *seen.borrow_and_update();
        tokio::spawn(feed(door.clone(), seen, start, tx.clone()));
        feeds.insert(key, tx);
        rx
    }
}

/// `GET /api/v1/events`: what the client missed and what stands now, then the caller's feed.
/// The stream is the feed itself, read by the connection's own task: no task or queue of its
/// own per client, so a hundred open streams cost a hundred socket writes per event and little
/// more.
pub(crate) async fn stream(
    State(served): State<Arc<Served>>,
    Extension(caller): Extension<Caller>,
    headers: HeaderMap,
) -> Response {
    let door = match served.door(&caller) {
        Ok(door) => door,
        Err(f) => return super::api::failure(&f),
    };
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    // Subscribed first, so nothing falls between what is replayed and what the feed sends.
    let live = served.feeds.subscribe(&caller, &door, &served.seen);
    let (opening, mut cursor) = opening(&door, resume).await;
    let opening = unsent(&opening, &mut 0);
    let live = BroadcastStream::new(live)
        // Fallen behind (or the feed ended): closed, the client resumes from its last id.
        .map_while(Result::ok)
        .filter_map(move |batch| unsent(&batch, &mut cursor))
        // `None` marks the end of the feed, so the keep-alive beat does not outlive it.
        .map(Some)
        .chain(tokio_stream::iter([None]));
    let start = Instant::now() + KEEP_ALIVE_EVERY;
    let beats = IntervalStream::new(tokio::time::interval_at(start, KEEP_ALIVE_EVERY))
        .map(|_| Some(Bytes::from_static(KEEP_ALIVE)));
    let frames = tokio_stream::iter(opening)
        .chain(live.merge(beats).map_while(|frame| frame))
        .map(Ok::<Bytes, Infallible>);
    let mut response = Response::new(Body::from_stream(frames));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// Runs the use case `R` through `door` on the blocking pool.
async fn ask<R: Request + Send + 'static>(door: &Door, request: R) -> Option<R::Answer>
where
    R::Answer: Send,
{
    let door = door.clone();
    blocking(move || door.request(request)).await
}

/// The operations after `after`, oldest first (at most `limit`, the newest ones).
async fn operations_after(door: &Door, after: u64, limit: usize) -> Vec<(u64, HistoryLine)> {
    let history = ask(
        door,
        HistoryParams {
            all: true,
            limit: Some(limit.clamp(1, REPLAY)),
            ..Default::default()
        },
    )
    .await;
    let mut newer: Vec<(u64, HistoryLine)> = history
        .map(|h| h.entries)
        .unwrap_or_default()
        .into_iter()
        .filter_map(|line| match &line {
            HistoryLine::Op { op, .. } if op.seq > after => Some((op.seq, line)),
            _ => None,
        })
        .collect();
    newer.sort_by_key(|(seq, _)| *seq);
    newer
}

/// What a stream opens with: the operations it missed (after `Last-Event-ID`), then the
/// approvals, effects and queue as they stand; and the last operation sent.
async fn opening(door: &Door, resume: Option<u64>) -> (Vec<Item>, u64) {
    let mut items = Vec::new();
    let mut cursor = 0;
    if let Some(after) = resume {
        cursor = after;
        for (seq, line) in operations_after(door, after, REPLAY).await {
            items.extend(Item::of("operation", Some(seq), &line));
            cursor = seq;
        }
    }
    for a in every_approval(door).await.unwrap_or_default() {
        items.extend(Item::of("approval", None, &a));
    }
    for e in every_effect(door, true).await.unwrap_or_default() {
        items.extend(Item::of("effect", None, &e));
    }
    if let Some(stats) = ask(door, StatsParams::default()).await {
        items.extend(Item::of("queue", None, &stats));
    }
    (items, cursor)
}

/// A caller's feed: reads what changed, as the caller, each time the watcher sees a change,
/// and sends it to every stream of theirs; it ends with the last of them.
async fn feed(
    door: Door,
    mut seen: watch::Receiver<Seen>,
    start: Seen,
    tx: broadcast::Sender<Batch>,
) {
    let mut cursor = start.seq;
    let mut last = start;
    let mut approvals: HashMap<String, String> = HashMap::new();
    let mut effects: HashMap<u64, (String, i64)> = HashMap::new();
    let mut first = true;
    loop {
        let current = *seen.borrow_and_update();
        let mut batch = Vec::new();
        if current.seq > cursor {
            let missing = usize::try_from(current.seq - cursor).unwrap_or(REPLAY);
            for (seq, line) in operations_after(&door, cursor, missing).await {
                batch.extend(Item::of("operation", Some(seq), &line));
                cursor = seq;
            }
        }
        if (first || current.approvals != last.approvals)
            && let Some(list) = every_approval(&door).await
        {
            for a in list {
                if approvals.get(&a.id) != Some(&a.state) {
                    approvals.insert(a.id.clone(), a.state.clone());
                    // On the first look too: a change between a stream's opening and this
                    // look is not lost (a state sent twice is harmless).
                    batch.extend(Item::of("approval", None, &a));
                }
            }
        }
        if (first || current.effects != last.effects)
            && let Some(list) = every_effect(&door, false).await
        {
            for e in list {
                let state = (e.state.clone(), e.updated_ms);
                if effects.get(&e.id) != Some(&state) {
                    effects.insert(e.id, state);
                    // The first look sends what a stream opens with (the unfinished ones), in
                    // case one changed between the opening and this look.
                    if !first || matches!(e.state.as_str(), "in_flight" | "unknown") {
                        batch.extend(Item::of("effect", None, &e));
                    }
                }
            }
        }
        // The queue's figures as the caller may read them (none for one who may not).
        if (first || current.queue != last.queue)
            && let Some(stats) = ask(&door, StatsParams::default()).await
        {
            batch.extend(Item::of("queue", None, &stats));
        }
        if !batch.is_empty() {
            let _ = tx.send(batch.into());
        }
        first = false;
        last = current;
        if tx.receiver_count() == 0 {
            return;
        }
        tokio::select! {
            changed = seen.changed() => if changed.is_err() { return },
            // Looks now and then whether anyone still listens.
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
    }
}

/// Every approval request the caller may see, page after page.
async fn every_approval(door: &Door) -> Option<Vec<environment_core::governance::Approval>> {
    let door = door.clone();
    blocking(move || {
        door.every(
            |after| ApprovalListParams { after, limit: None },
            |page| (page.approvals, page.next),
        )
    })
    .await
}

/// Every effect (or every unfinished one), page after page.
async fn every_effect(
    door: &Door,
    unfinished: bool,
) -> Option<Vec<environment_core::json::Effect>> {
    let door = door.clone();
    blocking(move || {
        door.every(
            |after| EffectListParams {
                unfinished,
                after,
                limit: None,
            },
            |page| (page.effects, page.next),
        )
    })
    .await
}

/// Runs `work` (calls of the service, which may block) on the blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> crate::failure::Outcome<T> + Send + 'static,
) -> Option<T> {
    tokio::task::spawn_blocking(move || work().ok())
        .await
        .ok()
        .flatten()
}
