//! environment-workspace: the workspace service, the one door to an environment and the trees
//! it tracks.
//!
//! A [`Workspace`] is an open environment with the trackers of its trees, the shell that runs
//! commands in its sandbox, the policy and the queue. Its use cases ([`Method`]: history, show,
//! diff, marks, restore over every tracked root, undo and redo, files, merge, commands,
//! background processes and terminal sessions, the queue, the policy, gc) are called by name
//! with named parameters that refuse unknown fields, as the workspace's actor, each authorized
//! once through core's `Authorizer` port before anything happens; a refusal is a
//! [`ServiceError`] whose kind every door maps once and whose `for_agent` text says first that
//! nothing happened.
//!
//! The control socket of `environment-supervisor` puts these use cases on the wire as JSON-RPC
//! methods of the same names; it parses, calls and renders, and decides nothing itself.
#![warn(missing_docs)]

pub mod commands;
mod contract;
pub mod effects;
pub mod error;
pub mod files;
mod methods;
mod page;
pub mod patch;
pub mod permissions;
pub mod queue;
mod session;
pub mod tournament;
pub mod versions;
mod workspace;

pub use commands::Bytes;
pub use contract::{Contract, Request};
pub use error::{NOT_DONE, ServiceError};
pub use methods::Method;
pub use workspace::{
    Caller, Counters, ForkSandbox, Forking, Setup, ShellHandles, Trees, Workspace, lock,
};
