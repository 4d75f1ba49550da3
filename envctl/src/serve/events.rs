//! The environment's events as Server-Sent Events: each new operation (`operation`, its id
//! the operation's position in the log, so a client that reconnects with `Last-Event-ID` gets
//! every one since), and the approvals and effects (`approval`, `effect`: the state of each on
//! connecting, then every change). One watcher looks at the log for the whole server, so an
//! operation another process records shows up too; each client then reads what changed
//! through the service, as itself, so it sees only what it may read.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Extension, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use environment_core::LocalEnvironment;
use environment_core::json::HistoryLine;
use environment_workspace::effects::ListParams as EffectListParams;
use environment_workspace::permissions::ApprovalListParams;
use environment_workspace::versions::HistoryParams;
use environment_workspace::{Caller, Request};
use tokio::sync::{mpsc, watch};
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;

use super::Served;
use crate::door::Door;

/// What the watcher saw last: the log's last operation, and how often the approvals and the
/// effects changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    seq: u64,
    approvals: u64,
    effects: u64,
}

/// How often the log is looked at.
const TICK: Duration = Duration::from_millis(50);
/// At most this many operations are replayed to a client that reconnects.
const REPLAY: usize = 1000;

/// Watches the log (and the approvals and effects) of `env` for the whole server.
pub(crate) fn watch_log(
    env: LocalEnvironment,
    policy: Option<Arc<environment_policy::Policy>>,
    branch: String,
) -> watch::Receiver<Seen> {
    let (tx, rx) = watch::channel(Seen::default());
    tokio::task::spawn_blocking(move || {
        let mut seen = Seen::default();
        let mut last = (String::new(), String::new());
        let mut n = 0u64;
        loop {
            if tx.is_closed() {
                return;
            }
            if let Ok(head) = env.head(&branch)
                && let Ok(op) = env.op(&head)
            {
                seen.seq = op.seq;
            }
            // Approvals and effects change less often; a digest of their states says when.
            if n.is_multiple_of(5) {
                let approvals = policy
                    .as_ref()
                    .map(|p| {
                        p.approvals()
                            .iter()
                            .map(|a| format!("{}:{}", a.id, a.state.name()))
                            .collect::<String>()
                    })
                    .unwrap_or_default();
                let effects = env
                    .effects()
                    .map(|list| {
                        list.iter()
                            .map(|e| format!("{}:{}:{}", e.id, e.state.as_str(), e.updated_ms))
                            .collect::<String>()
                    })
                    .unwrap_or_default();
                if approvals != last.0 {
                    seen.approvals += 1;
                    last.0 = approvals;
                }
                if effects != last.1 {
                    seen.effects += 1;
                    last.1 = effects;
                }
            }
            n += 1;
            tx.send_if_modified(|s| std::mem::replace(s, seen) != seen);
            std::thread::sleep(TICK);
        }
    });
    rx
}

/// `GET /api/v1/events`.
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
    let (tx, rx) = mpsc::channel::<Event>(256);
    let seen = served.seen.clone();
    tokio::spawn(feed(door, seen, resume, tx));
    let events = ReceiverStream::new(rx).map(Ok::<Event, Infallible>);
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// Runs the use case `R` through `door` on the blocking pool.
async fn ask<R: Request + Send + 'static>(door: &Door, request: R) -> Option<R::Answer>
where
    R::Answer: Send,
{
    let door = door.clone();
    tokio::task::spawn_blocking(move || door.request(request).ok())
        .await
        .ok()
        .flatten()
}

/// Sends one client its events until it goes away.
async fn feed(
    door: Door,
    mut seen: watch::Receiver<Seen>,
    resume: Option<u64>,
    tx: mpsc::Sender<Event>,
) {
    let now = *seen.borrow_and_update();
    // Without Last-Event-ID, the stream starts now; with it, at the operation after it.
    let mut cursor = resume.unwrap_or(now.seq);
    let mut approvals: HashMap<String, String> = HashMap::new();
    let mut effects: HashMap<u64, (String, i64)> = HashMap::new();
    let mut last = Seen {
        seq: cursor,
        approvals: u64::MAX,
        effects: u64::MAX,
    };
    let mut current = now;
    loop {
        if current.seq > last.seq {
            let Some(sent) = operations(&door, &mut cursor, &tx).await else {
                return;
            };
            last.seq = sent.max(cursor);
        }
        if current.approvals != last.approvals {
            last.approvals = current.approvals;
            if let Some(list) = ask(&door, ApprovalListParams {}).await {
                for a in list.approvals {
                    if approvals.get(&a.id) != Some(&a.state) {
                        approvals.insert(a.id.clone(), a.state.clone());
                        if !send(&tx, "approval", None, &a).await {
                            return;
                        }
                    }
                }
            }
        }
        if current.effects != last.effects {
            last.effects = current.effects;
            if let Some(list) = ask(&door, EffectListParams { unfinished: false }).await {
                for e in list.effects {
                    let state = (e.state.clone(), e.updated_ms);
                    if effects.get(&e.id) != Some(&state) {
                        effects.insert(e.id, state);
                        if !send(&tx, "effect", None, &e).await {
                            return;
                        }
                    }
                }
            }
        }
        tokio::select! {
            changed = seen.changed() => if changed.is_err() { return },
            _ = tx.closed() => return,
        }
        current = *seen.borrow_and_update();
    }
}

/// Sends the operations after `cursor`, oldest first, each with its position as its id;
/// `None` once the client is gone.
async fn operations(door: &Door, cursor: &mut u64, tx: &mpsc::Sender<Event>) -> Option<u64> {
    let history = ask(
        door,
        HistoryParams {
            all: true,
            limit: Some(REPLAY),
            ..Default::default()
        },
    )
    .await;
    let Some(history) = history else {
        return Some(*cursor);
    };
    let mut newer: Vec<(u64, HistoryLine)> = history
        .entries
        .into_iter()
        .filter_map(|line| match &line {
            HistoryLine::Op { op, .. } if op.seq > *cursor => Some((op.seq, line)),
            _ => None,
        })
        .collect();
    newer.sort_by_key(|(seq, _)| *seq);
    for (seq, line) in newer {
        if !send(tx, "operation", Some(seq), &line).await {
            return None;
        }
        *cursor = seq;
    }
    Some(*cursor)
}

/// Sends one event; false once the client is gone.
async fn send<T: serde::Serialize>(
    tx: &mpsc::Sender<Event>,
    kind: &str,
    id: Option<u64>,
    data: &T,
) -> bool {
    let Ok(event) = Event::default().event(kind).json_data(data) else {
        return true;
    };
    let event = match id {
        Some(id) => event.id(id.to_string()),
        None => event,
    };
    tx.send(event).await.is_ok()
}
