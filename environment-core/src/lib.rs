//! environment-core: the versioned state of an Environment for AI agents.
//!
//! An environment is the world an agent works in, held as an entity of its own: a keyspace of
//! files and domain objects whose every version is a content-addressed view; an append-only,
//! hash-chained log of who changed what, on which version, with what intent; an effect log for
//! side effects that cannot be undone; a blake3 blob store; branches, merges, restores and a
//! history an agent can read without drowning in noise.
//!
//! ```
//! use environment_core::{ActRequest, ActorId, Intent, Key, LocalEnvironment, Options, Value};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let home = tempfile::tempdir()?;
//! let env = LocalEnvironment::open(home.path(), Options::default())?;
//! let agent = ActorId::new("agent:coder-1")?;
//! let base = env.head("main")?;
//! let obs = env.act_blocking(
//!     ActRequest::new(agent.clone(), Intent::edit("add the greeting"))
//!         .base(base)
//!         .put(Key::fs("src/hello.txt")?, Value::file("hello")),
//! )?;
//! let v = env.read(&agent, &Key::fs("src/hello.txt")?, &obs.version)?.expect("written");
//! assert_eq!(env.content(&v)?, b"hello");
//! // The earlier version is still there, and restoring it appends an operation.
//! env.restore(&agent, "main", &base, Intent::edit("back to the start"))?;
//! assert!(env.read(&agent, &Key::fs("src/hello.txt")?, &env.head("main")?)?.is_none());
//! env.verify(&agent)?;
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod action;
pub mod authz;
pub mod blob;
pub mod checkpoint;
pub mod clock;

pub mod effect;
mod embedded;
mod encoding;
pub mod environment;
pub mod error;
pub mod event;
pub mod governance;
pub mod hash;

pub mod history;
pub mod json;
pub mod key;
pub mod local;
pub mod merge;
pub mod op;

pub mod policy_store;
pub mod queue;
pub mod shell;
pub mod store;
mod tree;
pub mod upkeep;
pub mod value;

pub use action::{ActRequest, Change, Observation, Refusal, RefusedChange};
pub use authz::{
    AccessRequest, Action, ActorId, AllowAll, AttrValue, Authorizer, Context, Decision, Resource,
    Risk, Spend, Verdict, WitnessRule, witness,
};
pub use blob::{BlobLocation, BlobStore, BlobUsage, ShareWindow, SharedBlobs};
pub use clock::{Clock, ManualClock, SystemClock};
pub use effect::{
    BeginOutcome, Begun, EffectChange, EffectRecord, EffectState, EffectStore, NewEffect,
};
pub use environment::{Capabilities, Capability, Environment};
pub use error::{BlobError, EnvError, ErrorKind, ForAgent, PortError, Result, StaleWrite};
pub use event::{Event, EventFilter, PublishError, Publisher};
pub use governance::Governance;
pub use hash::Hash;
pub use history::{HistoryEntry, HistoryOptions};
pub use key::{Key, KeyError, KeyPrefix, Namespace};
pub use local::{
    Credentials, LocalEnvironment, MAIN, Options, ShownOp, Subscription, UndoStep, put_back_note,
};
pub use merge::MergeOutcome;
pub use merge::{Conflict, ConflictSide};
pub use op::{ChangeSummary, Intent, IntentKind, OpFlags, OpId, Operation, Version};
pub use policy_store::{
    PolicyChange, PolicyRecord, PolicyRecords, PolicyStore, QuotaCount, Uses, Written,
};
pub use queue::Queue;
pub use shell::{
    BackgroundProcesses, Cancel, CommandSpec, ExecOutcome, ExecRequest, Exit, OutputChunk,
    ProcessEnvSecrets, ProcessId, ProcessInfo, PtyOutput, PtyRequest, PtySessions, SecretProvider,
    SessionId, SessionInfo, ShellExec, Signal, SpawnRequest, StoredOutput,
};
pub use tree::KeyChange;
pub use upkeep::{GcReport, VerifyReport};
pub use value::{Content, EntryKind, Meta, SecretRef, SecretValue, Value};
