//! Where the parts of an environment that several machines share live: `HOME/stores.toml`.
//!
//! ```toml
//! [queue]
//! # A libpq connection string (or a postgresql:// URL), without a password: the password
//! # comes from PGPASSWORD in the environment of envctl.
//! postgres = "host=db.internal user=env dbname=env"
//!
//! [policy]
//! postgres = "host=db.internal user=env dbname=env"
//!
//! [effects]
//! postgres = "host=db.internal user=env dbname=env"
//! ```
//!
//! Without the file (or without a section) the part is embedded in the home, as it always was.
//! So far the queue, the policy and the effect log can be shared: every workspace whose stores
//! name the same database sees one queue, is governed by one policy (rules, relations,
//! approvals, and the quota and token uses they spend), and begins an external effect once
//! whichever machine retries it.

use std::path::Path;
use std::sync::Arc;

use environment_core::{EffectStore, ErrorKind, PolicyStore, Queue};
use environment_postgres::{
    PgEffectStore, PgError, PgPolicyStore, PgQueue, PgQueueConfig, PgStoreConfig, ServerAddress,
};
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
    pub queue: Option<Shared>,
    /// The policy, when it is shared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Shared>,
    /// The effect log, when it is shared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effects: Option<Shared>,
}

/// A part shared through a PostgreSQL database.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shared {
    /// The database, as a libpq connection string or a `postgresql://` URL, without a
    /// password.
    pub postgres: String,
}

impl Shared {
    /// The server, with the password from PGPASSWORD, and the CA file the string names.
    fn server(&self) -> Outcome<ServerAddress> {
        let mut address = postgres_config(&self.postgres)?;
        if let Ok(password) = std::env::var("PGPASSWORD") {
            address.config.password(password);
        }
        Ok(address)
    }
}

/// Why the shared `part` could not be opened, as the exit status says it.
fn unopened(part: &str, e: PgError) -> Failure {
    match e.kind() {
        ErrorKind::Invalid => Failure::usage(format!("the shared {part}: {e}"))
            .hint("name a readable PEM file of CA certificates in PGSSLROOTCERT"),
        _ => Failure::new(
            ExitCode::Unavailable,
            format!("the shared {part} is not reachable: {e}"),
        )
        .hint(
            "check the server, its certificate and the connection string in the home's stores.toml",
        ),
    }
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
            .hint(
                "it has [queue], [policy] and [effects] sections with `postgres = \"CONNECTION\"`, or nothing",
            )
        })?;
        stores.check()?;
        Ok(stores)
    }

    /// Refuses a connection string that does not parse or holds a password, in any part.
    pub fn check(&self) -> Outcome<()> {
        for (_, shared) in self.parts() {
            postgres_config(&shared.postgres)?;
        }
        Ok(())
    }

    /// The parts that are shared, by name (`queue`, `policy`, `effects`).
    pub fn shared(&self) -> Vec<&'static str> {
        self.parts().map(|(name, _)| name).collect()
    }

    fn parts(&self) -> impl Iterator<Item = (&'static str, &Shared)> {
        [
            ("queue", &self.queue),
            ("policy", &self.policy),
            ("effects", &self.effects),
        ]
        .into_iter()
        .filter_map(|(name, part)| part.as_ref().map(|p| (name, p)))
    }

    /// Writes the file (readable by its owner only: it names where the data is).
    pub fn write(&self, home: &Path) -> Outcome<()> {
        let text = toml::to_string(self).map_err(|e| Failure::other(e.to_string()))?;
        crate::workspace::write_private(&home.join(STORES_FILE), text.as_bytes())
    }

    /// Opens the shared queue, if there is one.
    pub fn open_queue(&self) -> Outcome<Option<Arc<dyn Queue>>> {
        opened(&self.queue, "queue", |address| {
            let mut config = PgQueueConfig {
                application_name: "envctl".into(),
                ..PgQueueConfig::default()
            };
            if address.ca_file.is_some() {
                config.ca_file = address.ca_file;
            }
            Ok(Arc::new(PgQueue::open(address.config, config)?) as Arc<dyn Queue>)
        })
    }

    /// Opens the shared policy's store, if there is one.
    pub fn open_policy(&self) -> Outcome<Option<Box<dyn PolicyStore>>> {
        opened(&self.policy, "policy", |address| {
            let config = store_config("envctl-policy").reading(address.ca_file);
            let store = PgPolicyStore::open(address.config, config)?;
            Ok(Box::new(store) as Box<dyn PolicyStore>)
        })
    }

    /// Opens the shared effect log, if there is one.
    pub fn open_effects(&self) -> Outcome<Option<Arc<dyn EffectStore>>> {
        opened(&self.effects, "effect log", |address| {
            let config = store_config("envctl-effects").reading(address.ca_file);
            let store = PgEffectStore::open(address.config, config)?;
            Ok(Arc::new(store) as Arc<dyn EffectStore>)
        })
    }
}

/// The shared `part`, opened on its server by `open`, if the file names one.
fn opened<T>(
    shared: &Option<Shared>,
    part: &str,
    open: impl FnOnce(ServerAddress) -> Result<T, PgError>,
) -> Outcome<Option<T>> {
    let Some(shared) = shared else {
        return Ok(None);
    };
    open(shared.server()?)
        .map(Some)
        .map_err(|e| unopened(part, e))
}

fn store_config(application_name: &str) -> PgStoreConfig {
    PgStoreConfig {
        application_name: application_name.into(),
        ..PgStoreConfig::default()
    }
}

/// A connection string checked: it parses and carries no password (a password in a file or on
/// a command line is seen by whoever reads them; PGPASSWORD supplies it).
pub fn postgres_config(text: &str) -> Outcome<ServerAddress> {
    let address = ServerAddress::parse(text).map_err(|e| {
        // Not echoed: a malformed string may still hold a secret.
        Failure::usage(e.to_string())
            .hint("use `host=HOST user=USER dbname=DB` or postgresql://USER@HOST/DB")
    })?;
    if address.config.get_password().is_some() {
        return Err(Failure::usage(
            "the connection string holds a password, which a file or a command line shows to whoever reads it",
        )
        .hint("leave it out and set PGPASSWORD in envctl's environment"));
    }
    Ok(address)
}
