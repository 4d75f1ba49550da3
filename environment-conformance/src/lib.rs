//! The test bodies that every store of an Environment runs, from one source: a behaviour is
//! written once and each implementation (the embedded SQLite stores, PostgreSQL) is handed to
//! it. Only tests depend on this crate.
//!
//! - [`queue_port`]: the queue port as the workspace service uses it.
//! - [`queue_model`]: random interleavings of a queue's operations checked step by step against
//!   an in-memory model of its promises.
//! - [`log_port`] and [`log_model`]: the log's store, by several handles at once and against
//!   an in-memory model.
//! - [`log_refusals`]: bad input to the log gets a typed error and changes nothing.
//! - [`merge_laws`]: the laws of the three-way merge.
//! - [`log_crash`]: a process killed at random moments loses nothing it acknowledged.
//! - [`retention`]: protected versions, dropped versions on every handle, and the collection
//!   of what only dropped versions used.
//! - [`effect_port`]: the effect log's port, and environments on one log racing to begin one
//!   effect.
//! - [`policy_port`]: the policy's storage port, and two policies on one store racing for a
//!   last use.
//! - [`prerequisite`]: what a test does when a server it needs is not there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod effect_port;
pub mod log_crash;
pub mod log_model;
pub mod log_port;
pub mod log_refusals;
pub mod merge_laws;
pub mod policy_port;
pub mod prerequisite;
pub mod queue_model;
pub mod queue_port;
pub mod retention;
