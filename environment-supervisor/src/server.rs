//! The control socket's server: a tokio runtime on its own thread accepts connections and reads
//! one message per line; each message is handled on the blocking pool (the handlers use SQLite
//! and the filesystem) and answered in order on its connection.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;

use environment_core::{ActorId, Cancel};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

use super::rpc::{
    self, INVALID_REQUEST, MAX_MESSAGE_BYTES, METHOD_NOT_FOUND, PARSE_ERROR, RpcError,
};
use environment_sandbox::error::{Result, SandboxError};
use environment_workspace::{Caller, Counters, Method, Workspace, lock};

/// The method that binds an operator connection's identity (not a use case: a door's).
pub const SESSION_OPEN: &str = "session.open";

/// Whom a socket's connections act as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Peer {
    /// The agent's socket (mounted into its sandbox): every connection acts as the
    /// workspace's actor, with its token, and cannot open a session as anyone else.
    Agent,
    /// The operator's socket (private to the supervisor's user, under the home, which the
    /// sandbox does not show): a connection acts as the actor its `session.open` names.
    /// Whoever can reach it can open the environment's stores directly and act as anyone
    /// there; it grants nothing more, and keeps the captures in one process.
    Operator,
}

/// A connection's identity: the agent's from the start, or an operator's once opened.
type Bound = Arc<Mutex<Option<Caller>>>;

/// How long a stopping server waits for requests in flight.
const HANDLER_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// What one supervisor's socket takes at most, so that no peer (the agent flooding it, say) can
/// spend the descriptors and the threads that capture needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlLimits {
    /// Connections open at once; one more is answered with an error and closed at once.
    pub max_connections: usize,
    /// A connection that sends no complete message for this long is closed.
    pub idle_timeout: std::time::Duration,
}

impl Default for ControlLimits {
    fn default() -> ControlLimits {
        ControlLimits {
            max_connections: 64,
            idle_timeout: std::time::Duration::from_secs(300),
        }
    }
}

/// The running server: its thread and the switch that stops it.
pub(crate) struct Server {
    stop: watch::Sender<bool>,
    thread: Option<thread::JoinHandle<()>>,
    path: PathBuf,
}

/// Binds the socket: its directory private to the user, a stale socket file from a dead
/// supervisor replaced, a live one refused.
fn bind(path: &Path) -> Result<std::os::unix::net::UnixListener> {
    let io = |op| SandboxError::io(op, path);
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(SandboxError::io("create socket directory", dir))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(SandboxError::io("restrict socket directory", dir))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(SandboxError::Supervisor(format!(
                "{} exists and is not a socket; it was left alone",
                path.display()
            )));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(SandboxError::Supervisor(format!(
                "{} is in use by another supervisor",
                path.display()
            )));
        }
        std::fs::remove_file(path).map_err(io("remove stale socket"))?;
    }
    let listener =
        std::os::unix::net::UnixListener::bind(path).map_err(io("bind control socket"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io("restrict control socket"))?;
    listener
        .set_nonblocking(true)
        .map_err(io("configure control socket"))?;
    Ok(listener)
}

impl Server {
    pub fn start(
        path: &Path,
        shared: Arc<Workspace>,
        limits: ControlLimits,
        peer: Peer,
    ) -> Result<Server> {
        let listener = bind(path)?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .thread_name("environment-control")
            .build()
            .map_err(SandboxError::io("start control runtime", path))?;
        let (stop, stopped) = watch::channel(false);
        let thread = thread::Builder::new()
            .name("environment-control".into())
            .spawn(move || {
                runtime.block_on(async move {
                    match UnixListener::from_std(listener) {
                        Ok(l) => accept_loop(l, shared, stopped, limits, peer).await,
                        Err(e) => tracing::error!(error = %e, "control socket unusable"),
                    }
                });
                // Cancels the connections and gives the handlers already running on the blocking
                // pool time to finish (a restore holds the tracker, so shutdown waits for it
                // anyway); a long command is not waited for beyond that.
                runtime.shutdown_timeout(HANDLER_GRACE);
            })
            .map_err(SandboxError::io("start control thread", path))?;
        Ok(Server {
            stop,
            thread: Some(thread),
            path: path.to_owned(),
        })
    }

    /// Stops accepting, ends the connections, waits for handlers in flight, removes the socket.
    pub fn stop(&mut self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn accept_loop(
    listener: UnixListener,
    shared: Arc<Workspace>,
    mut stopped: watch::Receiver<bool>,
    limits: ControlLimits,
    peer: Peer,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        tokio::select! {
            _ = stopped.changed() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        refuse(stream, limits.max_connections);
                        continue;
                    };
                    let (shared, stopped) = (shared.clone(), stopped.clone());
                    tokio::spawn(async move {
                        let bound = Arc::new(Mutex::new(match peer {
                            Peer::Agent => Some(shared.caller()),
                            Peer::Operator => None,
                        }));
                        let conn = Connection { shared, peer, bound };
                        connection(stream, conn, stopped, limits.idle_timeout).await;
                        drop(slot);
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept on the control socket failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// One connection too many: told so in one line, without waiting for the peer, and closed.
fn refuse(stream: UnixStream, max: usize) {
    let reply = rpc::failure(
        Value::Null,
        &RpcError::new(
            rpc::UNAVAILABLE,
            format!("too many connections to the control socket (at most {max} at once)"),
            "close a connection you no longer use, or retry shortly.",
        ),
    );
    let mut out = serde_json::to_vec(&reply).unwrap_or_default();
    out.push(b'\n');
    let _ = stream.try_write(&out);
}

/// One line read from a connection.
enum Line {
    Message(Vec<u8>),
    /// Longer than the limit; the rest of it was skipped.
    TooLong,
}

/// Reads one line of at most [`MAX_MESSAGE_BYTES`]; `None` at the end of the stream.
async fn read_line<R: tokio::io::AsyncBufRead + Unpin>(r: &mut R) -> std::io::Result<Option<Line>> {
    let mut buf = Vec::new();
    let n = (&mut *r)
        .take(MAX_MESSAGE_BYTES as u64 + 1)
        .read_until(b'\n', &mut buf)
        .await?;
    if n == 0 {
        return Ok(None);
    }
    if buf.last() == Some(&b'\n') {
        buf.pop();
        return Ok(Some(Line::Message(buf)));
    }
    if buf.len() <= MAX_MESSAGE_BYTES {
        // The peer closed mid-line: what came is the last message.
        return Ok(Some(Line::Message(buf)));
    }
    // Skip the rest of the oversized line, in bounded steps.
    loop {
        let mut skip = Vec::new();
        let n = (&mut *r)
            .take(64 << 10)
            .read_until(b'\n', &mut skip)
            .await?;
        if n == 0 || skip.last() == Some(&b'\n') {
            return Ok(Some(Line::TooLong));
        }
    }
}

/// What one connection answers for: the workspace, which socket it came through, and whom it
/// acts as.
#[derive(Clone)]
pub(crate) struct Connection {
    pub(crate) shared: Arc<Workspace>,
    pub(crate) peer: Peer,
    pub(crate) bound: Bound,
}

async fn connection(
    stream: UnixStream,
    conn: Connection,
    mut stopped: watch::Receiver<bool>,
    idle: std::time::Duration,
) {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::new(r);
    loop {
        let line = tokio::select! {
            _ = stopped.changed() => return,
            line = tokio::time::timeout(idle, read_line(&mut r)) => match line {
                Ok(line) => line,
                Err(_) => return, // idle too long
            },
        };
        let reply = match line {
            Ok(None) | Err(_) => return,
            Ok(Some(Line::TooLong)) => Some(rpc::failure(
                Value::Null,
                &RpcError::new(
                    INVALID_REQUEST,
                    format!("message longer than {MAX_MESSAGE_BYTES} bytes"),
                    "send smaller requests, one JSON message per line.",
                ),
            )),
            Ok(Some(Line::Message(bytes))) => {
                let (conn, cancel) = (conn.clone(), Cancel::new());
                let calling = cancel.clone();
                let work =
                    tokio::task::spawn_blocking(move || handle_message(&conn, &bytes, &calling));
                match called_off_on_hangup(work, &mut r, &cancel).await {
                    Ok(reply) => reply,
                    Err(e) => Some(rpc::failure(
                        Value::Null,
                        &RpcError::new(
                            rpc::INTERNAL_ERROR,
                            format!("the handler failed: {e}"),
                            "report the error to a human if it persists.",
                        ),
                    )),
                }
            }
        };
        if let Some(reply) = reply {
            let mut out = serde_json::to_vec(&reply).unwrap_or_default();
            out.push(b'\n');
            if w.write_all(&out).await.is_err() {
                return;
            }
        }
    }
}

/// Waits for a request's `work`; if its client hangs up meanwhile (the connection reaches its
/// end), calls the request off through `cancel`: a command is killed and recorded as
/// cancelled. A client that sends its next request before the answer is left to wait for it.
async fn called_off_on_hangup<T>(
    mut work: tokio::task::JoinHandle<T>,
    r: &mut BufReader<tokio::net::unix::OwnedReadHalf>,
    cancel: &Cancel,
) -> Result<T, tokio::task::JoinError> {
    let mut watching = true;
    loop {
        tokio::select! {
            done = &mut work => return done,
            ended = r.fill_buf(), if watching => {
                let ended = matches!(ended, Ok([]) | Err(_));
                // Gone for good; a client that only shut its writing down (`nc -N`, a script's
                // half-close) still waits for its answer. A pipelined request is read once
                // this one is answered.
                if ended && hung_up(r.get_ref()) {
                    cancel.cancel();
                }
                watching = false;
            }
        }
    }
}

/// Whether the client closed its end entirely (not only its writing): the socket polls as hung
/// up.
fn hung_up(r: &tokio::net::unix::OwnedReadHalf) -> bool {
    let stream: &UnixStream = r.as_ref();
    let mut fds = [rustix::event::PollFd::new(
        stream,
        rustix::event::PollFlags::empty(),
    )];
    let now = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut fds, Some(&now)), Ok(n) if n > 0)
        && fds[0].revents().contains(rustix::event::PollFlags::HUP)
}

/// Handles one line: a request, a notification or a batch. `None` when nothing is to be sent
/// back (notifications only, or a blank line). `cancel` calls its commands off.
pub(crate) fn handle_message(conn: &Connection, bytes: &[u8], cancel: &Cancel) -> Option<Value> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    let parsed: Value = match serde_json::from_slice(bytes) {
        Ok(v) => v,
        Err(e) => {
            return Some(rpc::failure(
                Value::Null,
                &RpcError::new(
                    PARSE_ERROR,
                    format!("parse error: {e}"),
                    "send one JSON object per line.",
                ),
            ));
        }
    };
    match parsed {
        Value::Array(items) if items.is_empty() => Some(rpc::failure(
            Value::Null,
            &RpcError::new(
                INVALID_REQUEST,
                "invalid request: empty batch",
                "send at least one request.",
            ),
        )),
        Value::Array(items) => {
            let replies: Vec<Value> = items
                .into_iter()
                .filter_map(|item| handle_one(conn, item, cancel))
                .collect();
            (!replies.is_empty()).then_some(Value::Array(replies))
        }
        single => handle_one(conn, single, cancel),
    }
}

fn handle_one(conn: &Connection, v: Value, cancel: &Cancel) -> Option<Value> {
    let shared = &conn.shared;
    let call = match rpc::parse_call(v) {
        Ok(c) => c,
        Err((id, e)) => return Some(rpc::failure(id, &e)),
    };
    let caller = lock(&conn.bound).clone();
    let outcome = match (Method::from_name(&call.method), caller) {
        (None, _) if call.method == SESSION_OPEN => open_session(conn, call.params),
        (Some(m), Some(caller)) => shared
            .call_as(&caller, m, call.params, cancel)
            .map_err(RpcError::from),
        (Some(_), None) => Err(RpcError::new(
            INVALID_REQUEST,
            "no session is open on this connection",
            "open one first: session.open with the actor you act as.",
        )),
        (None, _) => {
            Counters::bump(&shared.counters.requests);
            let shown: String = call.method.chars().take(100).collect();
            Err(RpcError::new(
                METHOD_NOT_FOUND,
                format!("method not found: {shown:?}"),
                "call one of the methods the control schema lists.",
            ))
        }
    };
    let id = call.id?;
    Some(match outcome {
        Ok(result) => rpc::success(id, result),
        Err(e) => rpc::failure(id, &e),
    })
}

/// The params of `session.open`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenParams {
    actor: String,
    #[serde(default)]
    token: Option<String>,
}

/// Binds an operator connection to the actor it names (once). The agent's connections are the
/// agent's and stay so: opening one as the agent changes nothing, as anyone else is refused.
fn open_session(
    conn: &Connection,
    params: serde_json::Map<String, Value>,
) -> std::result::Result<Value, RpcError> {
    let p: OpenParams = serde_json::from_value(Value::Object(params)).map_err(|e| {
        RpcError::new(
            rpc::INVALID_PARAMS,
            format!("invalid params: {e}"),
            "send session.open with `actor` (and `token`).",
        )
    })?;
    let actor = ActorId::new(&p.actor).map_err(|e| {
        RpcError::new(
            rpc::INVALID_PARAMS,
            format!("invalid params: {e}"),
            "an actor is `kind:name`, e.g. human:alice.",
        )
    })?;
    let mut bound = lock(&conn.bound);
    if conn.peer == Peer::Agent {
        return match bound.as_ref() {
            Some(agent)
                if agent.actor == actor
                    && (p.token.is_none() || p.token == agent.default_token) =>
            {
                Ok(serde_json::json!({ "actor": actor.as_str() }))
            }
            _ => Err(RpcError::new(
                rpc::DENIED,
                "a connection of the agent's socket acts as the agent, with its token; it \
                 cannot open a session as another actor or with another token",
                "call the use cases as you are (a token can still be presented per request).",
            )),
        };
    }
    if bound.is_some() {
        return Err(RpcError::new(
            INVALID_REQUEST,
            "a session is already open on this connection",
            "connect again to act as another actor.",
        ));
    }
    *bound = Some(Caller {
        actor: actor.clone(),
        default_token: p.token,
    });
    Ok(serde_json::json!({ "actor": actor.as_str() }))
}
