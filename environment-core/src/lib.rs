//! environment-core: the versioned state of an Environment for AI agents.
#![warn(missing_docs)]

pub mod authz;
pub mod clock;
pub mod event;
pub mod hash;
pub mod key;
pub mod op;
pub mod value;

pub use authz::{
    AccessRequest, Action, ActorId, AllowAll, AttrValue, Authorizer, Context, Decision, Resource,
    Risk, Verdict,
};
pub use clock::{Clock, ManualClock, SystemClock};
pub use event::{Event, EventFilter, PublishError, Publisher};
pub use hash::Hash;
pub use key::{Key, KeyError, KeyPrefix, Namespace};
pub use op::{ChangeSummary, Intent, IntentKind, OpFlags, OpId, Operation, Version};
pub use value::{Content, EntryKind, Meta, SecretRef, SecretValue, Value};
