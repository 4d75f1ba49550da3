//! PostgreSQL stores of an Environment, so that several machines share one: the operation log
//! ([`PgLogStore`], core's log port, given to `Options::log_store`), the queue ([`PgQueue`], core's [`Queue`](environment_core::Queue) port with the SQLite bus's
//! semantics), the policy's storage ([`PgPolicyStore`], core's
//! [`PolicyStore`](environment_core::PolicyStore) port) and the effect log ([`PgEffectStore`],
//! core's [`EffectStore`](environment_core::EffectStore) port), on versioned migrations
//! ([`migrate`]).
//!
//! The client is the synchronous `postgres` crate (rust-postgres, the same protocol
//! implementation as `tokio-postgres`) with an `r2d2` pool: the ports are blocking, as the
//! embedded stores are, so an async driver would only add a runtime to block on. `sqlx` was
//! not taken: its macros and drivers cost far more to build on two cores, and its checked
//! queries need a database at build time. Connections over TCP use TLS through rustls, the
//! server's certificate checked (see [`PgQueueConfig::ca_file`]).
//!
//! ```no_run
//! use environment_core::Queue;
//! use environment_postgres::{PgQueue, PgQueueConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let queue = PgQueue::connect("host=/run/postgresql user=env dbname=env", PgQueueConfig::default())?;
//! queue.subscribe("workers", &["tasks".to_owned()])?;
//! queue.publish("tasks", b"build".to_vec(), Default::default())?;
//! let leases = queue.claim("workers", "worker-1", 1, std::time::Duration::from_secs(30))?;
//! # let _ = leases;
//! # Ok(())
//! # }
//! ```

mod address;
mod connection;
mod effects;
mod error;
mod log;
pub mod migrate;
mod policy;
mod queue;
mod server;
mod statements;

pub use address::ServerAddress;
pub use connection::PgStoreConfig;
pub use effects::PgEffectStore;
pub use error::{PgError, Result};
pub use log::PgLogStore;
pub use policy::PgPolicyStore;
pub use queue::{PgQueue, PgQueueConfig};
