//! Who is asking, and whether the request may reach the service at all: a bearer credential
//! (the person's session token, or a capability token of the policy) binds the caller; the
//! `Host` and `Origin` checks keep other sites and rebound names out; a rate limit per
//! credential keeps one client from starving the others. What the caller may then do is the
//! service's to decide.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use environment_core::ActorId;
use environment_core::ErrorKind;
use environment_policy::CapabilityToken;
use environment_workspace::{Caller, ServiceError};
use serde_json::json;

use super::Served;
use crate::failure::{Failure, Outcome};

/// The session token of the person who started the server: random, written 0600 under the
/// home, and valid while that file holds it (`envctl serve --revoke` removes it; a new server
/// writes a new one).
pub(crate) struct SessionToken {
    path: PathBuf,
    token: String,
    actor: ActorId,
}

/// Where the session token is kept under the home.
const SESSION_FILE: &str = "serve/session.json";

impl SessionToken {
    /// A new token for `actor`, replacing the last one.
    pub(crate) fn create(home: &Path, actor: &ActorId) -> Outcome<SessionToken> {
        let path = home.join(SESSION_FILE);
        let dir = path.parent().unwrap_or(home);
        std::fs::create_dir_all(dir).map_err(|e| Failure::io("create", dir, e))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Failure::io("restrict", dir, e))?;
        let bytes: [u8; 32] = rand::random();
        let token = format!("envs_{}", hex(&bytes));
        let tmp = path.with_extension("tmp");
        let _ = std::fs::remove_file(&tmp);
        let body = json!({ "token": token, "actor": actor.as_str() }).to_string();
        crate::workspace::write_private(&tmp, body.as_bytes())?;
        std::fs::rename(&tmp, &path).map_err(|e| Failure::io("write", &path, e))?;
        Ok(SessionToken {
            path,
            token,
            actor: actor.clone(),
        })
    }

    /// Ends the last server's session token.
    pub(crate) fn revoke(home: &Path) -> Outcome<()> {
        let path = home.join(SESSION_FILE);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Failure::io("remove", &path, e)),
        }
    }

    pub(crate) fn token(&self) -> &str {
        &self.token
    }

    pub(crate) fn actor(&self) -> &ActorId {
        &self.actor
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether `presented` is this token, still in force (its file not revoked or replaced).
    fn accepts(&self, presented: &str) -> bool {
        if !same(presented.as_bytes(), self.token.as_bytes()) {
            return false;
        }
        std::fs::read(&self.path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .is_some_and(|v| v["token"].as_str() == Some(self.token.as_str()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Compares without stopping at the first difference.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// The `Host` values the server answers to: its loopback names on its port, and those given.
pub(crate) fn hosts(bound: SocketAddr, extra: &[String]) -> Vec<String> {
    let port = bound.port();
    let mut hosts = vec![
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        bound.to_string(),
    ];
    hosts.extend(extra.iter().cloned());
    hosts.sort();
    hosts.dedup();
    hosts
}

/// The origins a page of this server has: each of its own addresses over plain HTTP, and each
/// public name given with `--host` over HTTPS only (the reverse proxy in front ends TLS, so a
/// page of that name over plain HTTP is not the server's).
pub(crate) fn origins(hosts: &[String], public: &[String]) -> Vec<String> {
    hosts
        .iter()
        .map(|h| match public.contains(h) {
            true => format!("https://{h}"),
            false => format!("http://{h}"),
        })
        .collect()
}

/// An error the server answers before the service is reached, in the API's error shape, its
/// text rendered as the service renders its own.
pub(crate) fn refused(status: StatusCode, kind: ErrorKind, message: &str, next: &str) -> Response {
    let e = ServiceError::new(kind, message, next);
    let body = json!({
        "error": { "kind": kind, "message": e.message, "for_agent": e.for_agent() }
    });
    (status, axum::Json(body)).into_response()
}

/// Refuses a request whose `Host` is not the server's (a rebound name) or that a page of
/// another origin sends (`Origin`).
pub(crate) async fn same_site(
    State(served): State<Arc<Served>>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or_default();
    if !served.hosts.iter().any(|h| h == host) {
        return refused(
            StatusCode::MISDIRECTED_REQUEST,
            ErrorKind::Denied,
            &format!("this server does not answer to the host {host:?}"),
            "use the URL envctl serve printed",
        );
    }
    if let Some(origin) = headers.get(header::ORIGIN)
        && !served
            .origins
            .iter()
            .any(|o| o.as_bytes() == origin.as_bytes())
    {
        return refused(
            StatusCode::FORBIDDEN,
            ErrorKind::Denied,
            "a page of another origin may not call this server",
            "use the web view this server serves",
        );
    }
    next.run(request).await
}

/// The credential a request presents: `Authorization: Bearer …`, or (for the event stream,
/// which a browser's EventSource opens without headers) an `access_token` query parameter.
fn credential(headers: &HeaderMap, query: Option<&str>, events: bool) -> Option<String> {
    if let Some(bearer) = headers
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
    {
        return Some(bearer.trim().to_owned());
    }
    if !events {
        return None;
    }
    query?.split('&').find_map(|kv| {
        kv.strip_prefix("access_token=").map(|v| {
            percent_encoding::percent_decode_str(v)
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

/// Binds the request's caller from its credential (401 without a valid one), and counts it
/// against the credential's rate.
pub(crate) async fn authenticate(
    State(served): State<Arc<Served>>,
    mut request: Request,
    next: Next,
) -> Response {
    let events = request.uri().path() == "/api/v1/events";
    let Some(credential) = credential(request.headers(), request.uri().query(), events) else {
        return unauthorized("the request carries no credential");
    };
    let caller = if served.session.accepts(&credential) {
        Caller::new(served.session.actor().clone())
    } else {
        match capability(&served, &credential) {
            Some(caller) => caller,
            None => {
                return unauthorized(
                    "the credential is not valid here (revoked, expired or unknown)",
                );
            }
        }
    };
    // By actor, not by the credential's text: a token written another way (its JSON
    // reordered) is the same caller, with the same rate.
    if !served.limiter.admit(caller.actor.as_str()) {
        return refused(
            StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Unavailable,
            "too many requests from this actor",
            "wait a moment, then retry",
        );
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

fn unauthorized(message: &str) -> Response {
    let mut r = refused(
        StatusCode::UNAUTHORIZED,
        ErrorKind::Denied,
        message,
        "present the session token envctl serve printed, or a capability token, as `Authorization: Bearer TOKEN`",
    );
    r.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer"),
    );
    r
}

/// A capability token of the policy, verified: it acts as its bearer, within its limits (it is
/// presented with every request the caller makes).
fn capability(served: &Served, credential: &str) -> Option<Caller> {
    let policy = served.policy.as_ref()?;
    let token = CapabilityToken::decode(credential).ok()?;
    let bearer = token.bearer().to_owned();
    policy.verify_token(&token, &bearer).ok()?;
    let actor = ActorId::new(bearer).ok()?;
    Some(Caller {
        actor,
        default_token: Some(credential.to_owned()),
    })
}

/// A token bucket per actor: `rate` requests a second on average, bursts of twice that (a
/// drained bucket is full again after two quiet seconds); a rate of 0 admits everything.
pub(crate) struct RateLimiter {
    rate: f64,
    buckets: Mutex<HashMap<String, (f64, Instant)>>,
}

/// Past this many buckets, the full ones (idle actors) are dropped.
const BUCKETS: usize = 1024;

impl RateLimiter {
    /// At most `rate` requests a second per actor (0: no limit).
    pub(crate) fn new(rate: u32) -> RateLimiter {
        RateLimiter {
            rate: f64::from(rate),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    fn admit(&self, actor: &str) -> bool {
        if self.rate == 0.0 {
            return true;
        }
        let burst = 2.0 * self.rate;
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if buckets.len() >= BUCKETS {
            let rate = self.rate;
            buckets.retain(|_, (tokens, at)| {
                *tokens + now.duration_since(*at).as_secs_f64() * rate < burst
            });
        }
        let (tokens, at) = buckets.entry(actor.to_owned()).or_insert((burst, now));
        *tokens = (*tokens + now.duration_since(*at).as_secs_f64() * self.rate).min(burst);
        *at = now;
        if *tokens < 1.0 {
            return false;
        }
        *tokens -= 1.0;
        true
    }
}
