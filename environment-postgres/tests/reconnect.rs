//! Sessions the server ends (a restart, a failover, an operator's `pg_terminate_backend`)
//! are replaced: the next operation works on a new connection and applies once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use environment_bus::{GroupOptions, NewMessage};
use environment_postgres::PgQueueConfig;

#[test]
fn operations_go_on_after_the_server_ends_every_session() {
    let Some(server) = common::fresh("reconnect") else {
        return;
    };
    let name = format!("reconnect-{}", std::process::id());
    let queue = common::open(
        &server,
        PgQueueConfig {
            application_name: name.clone(),
            pool_size: 3,
            ..PgQueueConfig::default()
        },
    );
    queue
        .create_group("workers", &["jobs"], GroupOptions::default())
        .unwrap();
    // Fill the pool with open sessions.
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| {
                queue
                    .publish_message(&NewMessage::new("jobs", b"x".to_vec()))
                    .unwrap()
            });
        }
    });
    let mut admin = server.connect(postgres::NoTls).unwrap();
    let ended = admin
        .query(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            &[&name],
        )
        .unwrap();
    assert!(!ended.is_empty(), "no session to end");
    // Give the server a moment to close them.
    std::thread::sleep(Duration::from_millis(200));
    let posted = queue
        .publish_message(&NewMessage::new("jobs", b"after".to_vec()))
        .unwrap();
    let leases = queue
        .claim("workers", "w", 10, Duration::from_secs(30))
        .unwrap();
    assert_eq!(leases.len(), 4, "{leases:?}");
    assert_eq!(
        leases.iter().filter(|l| l.message.id == posted.id).count(),
        1,
        "the message after the break was published once"
    );
}
