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
//!
//! [log]
//! postgres = "host=db.internal user=env dbname=env"
//!
//! [blobs]
//! # Credentials, region and endpoint come from the AWS_* variables of envctl's environment.
//! bucket = "s3://env-blobs/team"
//! ```
//!
//! Without the file (or without a section) the part is embedded in the home, as it always was.
//! Every workspace whose stores name the same database sees one queue, is governed by one
//! policy (rules, relations, approvals, and the quota and token uses they spend), and begins
//! an external effect once whichever machine retries it. With the log and the blobs shared,
//! the workspaces are working copies of one environment (one history, one set of branches):
//! the first is made with `envctl init`, the others with `envctl attach`. A shared log needs
//! shared blobs (another machine could not read what a value names), and the effect log then
//! goes with the log unless it names its own.

use std::path::Path;
use std::sync::Arc;

use environment_bucket::{BucketOptions, SharedBucket};
use environment_core::local::OpenLogStore;
use environment_core::{
    EffectStore, ErrorKind, PolicyStore, Queue, SharedBlobs as SharedBlobsPort,
};
use environment_postgres::{
    PgEffectStore, PgError, PgLogStore, PgPolicyStore, PgQueue, PgQueueConfig, PgStoreConfig,
    ServerAddress,
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
    /// The operation log (history, branches, tree nodes), when it is shared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<Shared>,
    /// The blobs (file contents), when they are shared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blobs: Option<SharedBlobs>,
}

/// Blobs shared through an object store.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedBlobs {
    /// `s3://BUCKET/PREFIX` (or `file:///DIR`), without credentials.
    pub bucket: String,
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
        if !path.exists() {
            return Ok(Stores::default());
        }
        Stores::parse(&path)
    }

    /// The stores a file names (a home's stores.toml, or a copy of it).
    pub fn parse(path: &Path) -> Outcome<Stores> {
        let text = std::fs::read_to_string(path).map_err(|e| Failure::io("read", path, e))?;
        let stores: Stores = toml::from_str(&text).map_err(|e| {
            Failure::usage(format!(
                "{} is not a stores file: {}",
                path.display(),
                e.message()
            ))
            .hint(
                "it has [queue], [policy], [effects] and [log] sections with `postgres = \"CONNECTION\"`, a [blobs] section with `bucket = \"URL\"`, or nothing",
            )
        })?;
        stores.check()?;
        Ok(stores)
    }

    /// Refuses a connection string that does not parse or holds a password, in any part, and
    /// a shared log without shared blobs.
    pub fn check(&self) -> Outcome<()> {
        for (_, shared) in self.parts() {
            postgres_config(&shared.postgres)?;
        }
        if self.log.is_some() && self.blobs.is_none() {
            return Err(Failure::usage(
                "a shared log needs shared blobs: the other machines could not read the files it names",
            )
            .hint("add --shared-blobs s3://BUCKET/PREFIX (a [blobs] section with `bucket = ...`)"));
        }
        if let Some(b) = &self.blobs
            && b.bucket.starts_with("memory:")
        {
            return Err(Failure::usage(
                "blobs in memory are gone with the process that holds them: no other machine could read them",
            )
            .hint("use s3://BUCKET/PREFIX (or file:///DIR on a filesystem every machine mounts)"));
        }
        if let Some(b) = &self.blobs
            && b.bucket.contains('@')
        {
            return Err(Failure::usage(
                "the bucket's address holds credentials, which a file or a command line shows to whoever reads it",
            )
            .hint("leave them out and set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in envctl's environment"));
        }
        Ok(())
    }

    /// Whether the history itself is shared (the log and the blobs): the workspaces naming
    /// them are working copies of one environment.
    pub fn shares_history(&self) -> bool {
        self.log.is_some()
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
            ("log", &self.log),
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

    /// What opens the shared log, if there is one (reached when the environment opens).
    pub fn open_log(&self) -> Outcome<Option<OpenLogStore>> {
        opened(&self.log, "log", |address| {
            let config = store_config("envctl-log").reading(address.ca_file);
            Ok(PgLogStore::opener_on(address.config, &config))
        })
    }

    /// Opens the shared blobs, if there are some, with the home's blob directory as this
    /// machine's cache.
    pub fn open_blobs(&self, home: &Path) -> Outcome<Option<Arc<dyn SharedBlobsPort>>> {
        let Some(blobs) = &self.blobs else {
            return Ok(None);
        };
        let bucket = SharedBucket::open(&blobs.bucket, BucketOptions::new(home.join("blobs")))
            .map_err(|e| match e.port().kind {
                ErrorKind::Invalid => Failure::usage(format!("the shared blobs: {e}"))
                    .hint("use s3://BUCKET/PREFIX, with credentials in the AWS_* variables"),
                _ => Failure::new(
                    ExitCode::Unavailable,
                    format!("the shared blobs are not reachable: {e}"),
                )
                .hint("check the bucket, the AWS_* variables and the address in the home's stores.toml"),
            })?;
        Ok(Some(Arc::new(bucket)))
    }

    /// Where the effect log is shared: its own database, else, with a shared log and no effect
    /// log of its own, the log's.
    pub fn effects_at(&self) -> Option<&Shared> {
        self.effects.as_ref().or(self.log.as_ref())
    }

    /// Opens the shared effect log, if there is one (see [`Stores::effects_at`]).
    pub fn open_effects(&self) -> Outcome<Option<Arc<dyn EffectStore>>> {
        opened(&self.effects_at().cloned(), "effect log", |address| {
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
