//! The queue's schema: machines opening a new database at once migrate it once; a database
//! migrated by a newer build is refused, and nothing is applied to it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use environment_core::ErrorKind;
use environment_postgres::{PgError, PgQueue, PgQueueConfig};

#[test]
fn machines_opening_a_new_database_at_once_migrate_it_once() {
    let Some(server) = common::fresh("migrate") else {
        return;
    };
    let openers: Vec<_> = (0..4)
        .map(|_| {
            let server = server.clone();
            std::thread::spawn(move || PgQueue::open(server, PgQueueConfig::default()).map(drop))
        })
        .collect();
    for o in openers {
        o.join().unwrap().unwrap();
    }
    let mut client = server.connect(postgres::NoTls).unwrap();
    let applied: i64 = client
        .query_one(
            "SELECT COUNT(*) FROM environment_migrations WHERE component = 'queue'",
            &[],
        )
        .unwrap()
        .get(0);
    let latest: i32 = client
        .query_one(
            "SELECT MAX(version) FROM environment_migrations WHERE component = 'queue'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        applied,
        i64::from(latest),
        "a step was applied twice or skipped"
    );
}

#[test]
fn a_database_from_a_newer_build_is_refused() {
    let Some(server) = common::fresh("migrate_newer") else {
        return;
    };
    let mut client = server.connect(postgres::NoTls).unwrap();
    client
        .batch_execute(
            "CREATE TABLE environment_migrations(component TEXT NOT NULL, version INT NOT NULL,
                 name TEXT NOT NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                 PRIMARY KEY(component, version));
             INSERT INTO environment_migrations(component, version, name)
                 VALUES ('queue', 1000, 'from the future')",
        )
        .unwrap();
    let err = PgQueue::open(server.clone(), PgQueueConfig::default()).unwrap_err();
    assert!(matches!(err, PgError::Schema(_)), "{err}");
    assert_eq!(err.kind(), ErrorKind::Corrupt);
    let tables: i64 = client
        .query_one(
            "SELECT COUNT(*) FROM information_schema.tables
             WHERE table_schema = current_schema() AND table_name LIKE 'bus_%'",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(tables, 0, "a refused database was changed");
}
