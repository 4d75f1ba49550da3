//! The one door of a command (or an MCP tool) to the workspace's use cases: the workspace
//! service opened in this process, or a running supervisor's socket. Either way a caller names
//! a use case ([`Method`]) with its arguments, gets the same answer, and only renders it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use environment_core::Cancel;
use environment_workspace::{self as service, Method, Request};
use serde_json::Value;

use crate::failure::{Failure, Outcome};
use crate::target::{Canceller, Remote, Target};
use crate::workspace::Serving;

/// Where use cases run. Cloning shares it: calls in process run side by side, calls through
/// the socket one at a time.
#[derive(Clone)]
pub enum Door {
    /// The workspace service, in this process: whom the calls act as (with the token they
    /// present by default), and the approval presented with every call that presents none.
    Service(Arc<service::Workspace>, service::Caller, Option<String>),
    /// A running supervisor, through its control socket (which presents the caller's
    /// credentials itself).
    Socket(Arc<Mutex<Remote>>),
}

impl Door {
    /// The door of `target`: its stores opened as the service as `serving` says, or its
    /// supervisor, presenting `credentials`.
    pub fn open(
        target: Target,
        credentials: &environment_core::Credentials,
        serving: Serving,
    ) -> Outcome<Door> {
        Ok(match target {
            Target::Direct(session) => {
                let ws = Arc::new(session.into_service(serving)?);
                let caller = ws.caller();
                Door::Service(ws, caller, credentials.approval.clone())
            }
            Target::Supervisor(addr) => Door::through(Remote::connect(&addr, credentials)?),
        })
    }

    /// The door through a supervisor's connection.
    pub fn through(remote: Remote) -> Door {
        Door::Socket(Arc::new(Mutex::new(remote)))
    }

    fn remote(remote: &Mutex<Remote>) -> std::sync::MutexGuard<'_, Remote> {
        remote.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The supervisor's socket, when the door goes through one.
    pub fn socket(&self) -> Option<PathBuf> {
        match self {
            Door::Service(..) => None,
            Door::Socket(remote) => Some(Door::remote(remote).socket().to_owned()),
        }
    }

    /// How a report names the way a command went: nothing in process, else through the
    /// supervisor.
    pub fn via(&self) -> &'static str {
        match self {
            Door::Service(..) => "",
            Door::Socket(_) => " (through the supervisor)",
        }
    }

    /// What calls off, from another thread, a call through the socket (by hanging its
    /// connection up); `None` in process, where [`Door::call_cancellable`]'s `cancel` does.
    pub fn canceller(&self) -> Option<Canceller> {
        match self {
            Door::Service(..) => None,
            Door::Socket(remote) => Door::remote(remote).canceller().ok(),
        }
    }

    /// Sends a typed request, gets its typed answer.
    pub fn request<R: Request>(&self, request: R) -> Outcome<R::Answer> {
        let params = serde_json::to_value(request)
            .map_err(|e| Failure::other(format!("a request failed to serialize: {e}")))?;
        let answer = self.call(R::METHOD, params)?;
        serde_json::from_value(answer).map_err(|e| {
            Failure::other(format!(
                "the answer to {} does not read as its type: {e}",
                R::METHOD.name()
            ))
        })
    }

    /// Every item of a list the service answers a page at a time: `request` asks for the page
    /// after a cursor (`None`: the first), `items` splits an answer into its items and the
    /// cursor of the next page.
    pub fn every<R: Request, T, C>(
        &self,
        request: impl Fn(Option<C>) -> R,
        items: impl Fn(R::Answer) -> (Vec<T>, Option<C>),
    ) -> Outcome<Vec<T>> {
        let mut all = Vec::new();
        let mut after = None;
        loop {
            let (page, next) = items(self.request(request(after))?);
            all.extend(page);
            match next {
                Some(next) => after = Some(next),
                None => return Ok(all),
            }
        }
    }

    /// Calls `method` with `params` (an object; nulls are left out).
    pub fn call(&self, method: Method, params: Value) -> Outcome<Value> {
        self.call_cancellable(method, params, &Cancel::new())
    }

    /// [`Door::call`], with `cancel` able to call a command off in process.
    pub fn call_cancellable(
        &self,
        method: Method,
        params: Value,
        cancel: &Cancel,
    ) -> Outcome<Value> {
        let Value::Object(mut params) = params else {
            return Err(Failure::other("the parameters of a use case are an object"));
        };
        params.retain(|_, v| !v.is_null());
        match self {
            Door::Service(ws, caller, approval) => {
                if let Some(a) = approval {
                    params
                        .entry("approval")
                        .or_insert_with(|| Value::String(a.clone()));
                }
                ws.call_as(caller, method, params, cancel)
                    .map_err(Failure::from)
            }
            Door::Socket(remote) => Door::remote(remote).call(method.name(), Value::Object(params)),
        }
    }
}
