//! environment-bus: a durable lease/ack message queue on SQLite, for handing work between the
//! agents and humans of an Environment (task.created → claimed → patch.ready → …).
//!
//! Semantics follow SQS and JetStream where their users trust them:
//!
//! - [`Bus::publish`] / [`Bus::publish_batch`] with an ordering key, a dedup id (a repeat within
//!   the window — 5 minutes by default — is accepted and not delivered again, even after the
//!   first was acked), a delay, and [`Headers`] (actor, correlation id, causing op).
//! - Consumer groups ([`Bus::create_group`]) each see every message of their topics; the
//!   consumers of one group compete.
//! - [`Bus::claim`] leases messages with a [`Receipt`] that changes on every claim; settle with
//!   [`Bus::ack`], [`Bus::nack`] (exponential backoff with jitter — never an instant retry),
//!   [`Bus::nack_with_delay`], [`Bus::extend`] (heartbeat) or [`Bus::terminate`] (poison). A
//!   receipt from an earlier claim is refused with [`BusError::StaleReceipt`] and changes
//!   nothing.
//! - Attempts are counted at claim, so a consumer that crashes still spends one; after the
//!   group's `max_attempts` the message is a [`DeadLetter`] with its last error, listed,
//!   inspected and redriven through the bus.
//! - A message with an ordering key is leased to at most one consumer of a group at a time,
//!   and same-key messages are delivered in publish order.
//! - Lease expiry is read from the data at claim time (`lease_until < now`); there is no
//!   background rescuer that could die.
//! - [`Consumer::next`] waits without polling: a commit that makes messages claimable (publish,
//!   nack, the ack of a key's head, redrive) wakes one waiting consumer of the group per such
//!   message, in this process. A consumer also sleeps only until the group's next delayed
//!   message falls due. Publishes from *another process* are not signalled (a non-goal): they
//!   are found by a slow re-check, [`BusConfig::idle_recheck`] (1 s by default).
//! - [`Bus::metrics`] per topic and group; acked messages are purged after
//!   [`BusConfig::retention`] in small steps that never hold the write lock for long, while
//!   dedup ids stay as long as their window.
//!
//! # Storage
//!
//! One writer thread owns the write connection and runs queued commands in group commits
//! (everything queued while the previous transaction ran goes into the next one, each command
//! under its own savepoint); reads use read-only connections; WAL with `synchronous=NORMAL`,
//! `BEGIN IMMEDIATE`, integer primary keys. Command methods return a [`Pending`]: `.await` it
//! in async code (the executor never blocks on SQLite) or `.wait()` on a plain thread.
//!
//! All tables are named `bus_*`, so the bus can live in the environment's own database file.
//! [`Bus::publish_in`] and [`Bus::ack_in`] run inside a caller's `rusqlite` transaction on that
//! file: a state change and the message it announces commit together (transactional outbox),
//! and a consumer's record of its work commits together with the ack (exactly-once processing
//! records). Do not wait on bus commands while holding a write transaction on the same file:
//! the writer would wait for that lock.
//!
//! [`EventPublisher`] implements environment-core's `Publisher` port: every committed
//! operation's event goes to a topic with the op id as dedup id.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use environment_bus::{Bus, BusConfig, GroupOptions, PublishOptions};
//!
//! # fn main() -> Result<(), environment_bus::BusError> {
//! let dir = tempfile::tempdir().map_err(|e| environment_bus::BusError::Open {
//!     path: "tmp".into(), message: e.to_string() })?;
//! let bus = Bus::open(dir.path().join("bus.db"), BusConfig::default())?;
//! bus.create_topic("task.created").wait()?;
//! bus.create_group("coders", &["task.created"], GroupOptions::default()).wait()?;
//!
//! let opts = PublishOptions::default().dedup_id("task-1").ordering_key("repo-a");
//! bus.publish("task.created", b"fix the build".to_vec(), opts.clone()).wait()?;
//! // The same dedup id again: accepted, not delivered twice.
//! assert!(bus.publish("task.created", b"fix the build".to_vec(), opts).wait()?.duplicate);
//!
//! let leases = bus.claim("coders", "coder-1", 10, Duration::from_secs(30)).wait()?;
//! assert_eq!(leases.len(), 1);
//! assert_eq!(leases[0].message.payload, b"fix the build");
//! bus.ack(&leases[0].receipt).wait()?;
//! // Acked: a second ack with the same receipt is refused.
//! assert!(bus.ack(&leases[0].receipt).wait().is_err());
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]

mod bus;
mod config;
mod consumer;
mod error;
mod inbox;
mod ops;
mod pending;
mod publisher;
mod queue;
pub mod rules;
mod schema;
mod types;
mod writer;

pub use bus::{Bus, DeliveryStatus};
pub use config::BusConfig;
pub use consumer::Consumer;
pub use error::{BusError, Result};
pub use pending::{Pending, PendingFuture};
pub use publisher::EventPublisher;
pub use schema::install;
pub use types::{
    Backoff, DeadCause, DeadLetter, GroupMetrics, GroupOptions, Headers, Lease, LeaseHolder,
    Limits, Message, MessageId, NewMessage, PublishOptions, Published, PurgeReport, Receipt,
    TopicMetrics,
};
