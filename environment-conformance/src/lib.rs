//! The test bodies that every store of an Environment runs, from one source: a behaviour is
//! written once and each implementation (the embedded SQLite stores, PostgreSQL) is handed to
//! it. Only tests depend on this crate.
//!
//! - [`queue_port`]: the queue port as the workspace service uses it.
//! - [`queue_model`]: random interleavings of a queue's operations checked step by step against
//!   an in-memory model of its promises.
//! - [`prerequisite`]: what a test does when a server it needs is not there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod prerequisite;
pub mod queue_model;
pub mod queue_port;
