//! A schema of its own for each test on the test server, so tests run side by side.
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use environment_bus::Backoff;
use environment_conformance::prerequisite;
use environment_core::ManualClock;
use environment_postgres::{PgQueue, PgQueueConfig};

/// The test server with `search_path` set to a new, empty schema named after `test`, or `None`
/// (a failure under `CI=true`) when no server is configured.
pub fn fresh(test: &str) -> Option<postgres::Config> {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let url = prerequisite::postgres()?;
    let admin: postgres::Config = url.parse().expect("ENVIRONMENT_TEST_POSTGRES parses");
    let schema = format!(
        "t_{test}_{}_{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    );
    let mut client = admin
        .connect(postgres::NoTls)
        .expect("the test server accepts connections");
    client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
        ))
        .expect("a schema for the test");
    Some(in_schema(admin, &schema))
}

/// `server` with `search_path` set to `schema`.
pub fn in_schema(mut server: postgres::Config, schema: &str) -> postgres::Config {
    server.options(&format!("-c search_path={schema}"));
    server
}

/// The schema a [`fresh`] server works in (to hand to a child process).
pub fn schema_of(server: &postgres::Config) -> String {
    server
        .get_options()
        .and_then(|o| o.strip_prefix("-c search_path="))
        .expect("a server from `fresh`")
        .to_owned()
}

/// The test server in `schema` (in a child process, from its parent's [`schema_of`]).
pub fn server_in(schema: &str) -> postgres::Config {
    let url = prerequisite::postgres().expect("the parent had a server");
    in_schema(
        url.parse().expect("ENVIRONMENT_TEST_POSTGRES parses"),
        schema,
    )
}

/// A queue configuration on `clock`, with the model's backoff.
pub fn config(clock: &ManualClock) -> PgQueueConfig {
    PgQueueConfig {
        clock: Arc::new(clock.clone()),
        backoff: Backoff {
            base: Duration::from_millis(1000),
            max: Duration::from_millis(8000),
        },
        pool_size: 4,
        // The tests purge when they mean to.
        auto_purge: None,
        ..PgQueueConfig::default()
    }
}

/// Opens the queue in `server`'s schema.
pub fn open(server: &postgres::Config, config: PgQueueConfig) -> PgQueue {
    PgQueue::open(server.clone(), config).expect("the queue opens")
}

/// Every row of the queue's tables, as text in a stable order: equal before and after an
/// operation exactly when it changed nothing.
pub fn rows(server: &postgres::Config) -> String {
    let mut client = server.connect(postgres::NoTls).expect("connect");
    let mut out = String::new();
    for table in [
        "bus_topics",
        "bus_groups",
        "bus_subscriptions",
        "bus_messages",
        "bus_deliveries",
        "bus_dedup",
    ] {
        let row = client
            .query_one(
                &format!(
                    "SELECT COALESCE(string_agg(t::text, '|' ORDER BY t::text), '') FROM {table} t"
                ),
                &[],
            )
            .expect("read a table");
        out.push_str(table);
        out.push('=');
        out.push_str(row.get::<_, &str>(0));
        out.push('\n');
    }
    out
}
