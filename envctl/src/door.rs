//! The one door of a command to the workspace's use cases: the workspace service opened in
//! this process, or a running supervisor's socket. Either way a command names a use case
//! ([`Method`]) with its arguments, gets the same answer, and only renders it.

use environment_workspace::{self as service, Method};
use serde_json::Value;

use crate::failure::{Failure, Outcome};
use crate::target::{Remote, Target};
use crate::workspace::Serving;

/// Where a command's use cases run.
pub enum Door {
    /// The workspace service, in this process, and the approval the command presents (its
    /// token is the service's default).
    Service(Box<service::Workspace>, Option<String>),
    /// A running supervisor, through its control socket (which presents the command's
    /// credentials itself).
    Socket(Remote),
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
            Target::Direct(session) => Door::Service(
                Box::new(session.into_service(serving)?),
                credentials.approval.clone(),
            ),
            Target::Supervisor(addr) => Door::Socket(Remote::connect(&addr, credentials)?),
        })
    }

    /// The supervisor's socket, when the door goes through one.
    pub fn socket(&self) -> Option<&std::path::Path> {
        match self {
            Door::Service(..) => None,
            Door::Socket(remote) => Some(remote.socket()),
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

    /// Calls `method` with `params` (an object; nulls are left out).
    pub fn call(&mut self, method: Method, params: Value) -> Outcome<Value> {
        let Value::Object(mut params) = params else {
            return Err(Failure::other("the parameters of a use case are an object"));
        };
        params.retain(|_, v| !v.is_null());
        match self {
            Door::Service(ws, approval) => {
                if let Some(a) = approval {
                    params
                        .entry("approval")
                        .or_insert_with(|| Value::String(a.clone()));
                }
                ws.call(method, params).map_err(Failure::from)
            }
            Door::Socket(remote) => remote.call(method.name(), Value::Object(params)),
        }
    }
}
