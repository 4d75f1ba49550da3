//! Where the parts of an environment that several machines share live: `HOME/stores.toml`.
//!
//! ```toml
//! [queue]
//! # A libpq connection string (or a postgresql:// URL), without a password: the password
//! # comes from PGPASSWORD in the environment of envctl.
//! postgres = "host=db.internal user=env dbname=env"
//! ```
//!
//! Without the file (or without a section) the part is embedded in the home, as it always was.
//! So far the queue can be shared: every workspace whose stores name the same database sees
//! one queue, whichever machine it is on.

use std::path::Path;
use std::sync::Arc;

use environment_core::{ErrorKind, Queue};
use environment_postgres::{PgQueue, PgQueueConfig};
use serde::{Deserialize, Serialize};

use crate::failure::{ExitCode, Failure, Outcome};

/// The stores' file inside the home.
pub const STORES_FILE: &str = "stores.toml";

/// What `stores.toml` says.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stores {
    /// The queue, when it is shared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<SharedQueue>,
}

/// A queue shared through a PostgreSQL database.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedQueue {
    /// The database, as a libpq connection string or a `postgresql://` URL, without a
    /// password.
    pub postgres: String,
}

impl Stores {
    /// The stores of the environment at `home` (none shared when the file is absent).
    pub fn read(home: &Path) -> Outcome<Stores> {
        let path = home.join(STORES_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Stores::default()),
            Err(e) => return Err(Failure::io("read", &path, e)),
        };
        let stores: Stores = toml::from_str(&text).map_err(|e| {
            Failure::usage(format!(
                "{} is not a stores file: {}",
                path.display(),
                e.message()
            ))
            .hint("it has a [queue] section with `postgres = \"CONNECTION\"`, or nothing")
        })?;
        if let Some(q) = &stores.queue {
            postgres_config(&q.postgres)?;
        }
        Ok(stores)
    }

    /// Writes the file (readable by its owner only: it names where the data is).
    pub fn write(&self, home: &Path) -> Outcome<()> {
        let text = toml::to_string(self).map_err(|e| Failure::other(e.to_string()))?;
        crate::workspace::write_private(&home.join(STORES_FILE), text.as_bytes())
    }

    /// Opens the shared queue, if there is one.
    pub fn open_queue(&self) -> Outcome<Option<Arc<dyn Queue>>> {
        let Some(q) = &self.queue else {
            return Ok(None);
        };
        let mut server = postgres_config(&q.postgres)?;
        if let Ok(password) = std::env::var("PGPASSWORD") {
            server.password(password);
        }
        let queue = PgQueue::open(
            server,
            PgQueueConfig {
                application_name: "envctl".into(),
                ..PgQueueConfig::default()
            },
        )
        .map_err(|e| match e.kind() {
            ErrorKind::Invalid => Failure::usage(format!("the shared queue: {e}"))
                .hint("name a readable PEM file of CA certificates in PGSSLROOTCERT"),
            _ => Failure::new(
                ExitCode::Unavailable,
                format!("the shared queue is not reachable: {e}"),
            )
            .hint("check the server, its certificate and the connection string in the home's stores.toml"),
        })?;
        Ok(Some(Arc::new(queue)))
    }
}

/// A connection string checked: it parses and carries no password (a password in a file or on
/// a command line is seen by whoever reads them; PGPASSWORD supplies it).
pub fn postgres_config(text: &str) -> Outcome<postgres::Config> {
    let config: postgres::Config = text.parse().map_err(|e: postgres::Error| {
        // Not echoed: a malformed string may still hold a secret.
        Failure::usage(format!(
            "the PostgreSQL connection string does not parse: {e}"
        ))
        .hint("use `host=HOST user=USER dbname=DB` or postgresql://USER@HOST/DB")
    })?;
    if config.get_password().is_some() {
        return Err(Failure::usage(
            "the connection string holds a password, which a file or a command line shows to whoever reads it",
        )
        .hint("leave it out and set PGPASSWORD in envctl's environment"));
    }
    Ok(config)
}
