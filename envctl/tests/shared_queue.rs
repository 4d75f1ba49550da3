//! Two workspaces, as on two machines, sharing one queue through PostgreSQL: a task published
//! in one is claimed and acknowledged in the other; a shared store named badly is refused and
//! nothing is made.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::PermissionsExt;

use common::{Ws, code, envctl_in};

/// The test server's connection string with a new, empty schema of its own, or `None` (a
/// failure under `CI=true`) when no server is configured.
fn fresh_schema() -> Option<String> {
    let url = environment_conformance::prerequisite::postgres()?;
    let schema = format!(
        "envctl_{}_{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let admin: postgres::Config = url.parse().unwrap();
    let mut client = admin.connect(postgres::NoTls).unwrap();
    client
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .unwrap();
    Some(format!("{url} options='-c search_path={schema}'"))
}

#[test]
fn two_workspaces_share_one_queue() {
    let Some(conn) = fresh_schema() else { return };
    let planner = Ws::made_with(Some("human:alice"), &["--shared-queue", &conn]);
    let worker = Ws::made_with(Some("agent:worker"), &["--shared-queue", &conn]);
    for ws in [&planner, &worker] {
        let stores = ws.home().join("stores.toml");
        let mode = std::fs::metadata(&stores).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", stores.display());
        assert!(
            !ws.home().join("bus.db").exists(),
            "no embedded queue beside the shared one"
        );
    }

    planner.ok(&["queue", "subscribe", "workers", "tasks"]);
    planner.ok(&["queue", "publish", "tasks", "build the docs"]);
    let claimed = worker.json(&["queue", "claim", "workers", "--lease", "60"]);
    let lease = &claimed["leases"][0];
    assert_eq!(lease["payload"], "build the docs", "{claimed}");
    let receipt = lease["receipt"].as_str().unwrap().to_owned();

    // The planner's side sees who holds the task; the receipt settles nothing for anyone else.
    let held = planner.json(&["queue", "leases", "--group", "workers"]);
    assert_eq!(
        held["leases"][0]["message_id"], lease["message_id"],
        "{held}"
    );
    planner.fails(&["queue", "ack", &receipt], 4);

    worker.ok(&["queue", "ack", &receipt]);
    let held = planner.json(&["queue", "leases", "--group", "workers"]);
    assert_eq!(held["leases"], serde_json::json!([]), "{held}");
    // Nothing is left to claim on either side.
    let again = planner.json(&["--actor", "agent:worker", "queue", "claim", "workers"]);
    assert_eq!(again["leases"], serde_json::json!([]), "{again}");

    // Collection purges the shared queue too (within its retention, nothing yet); a workspace
    // with no queue has none to purge.
    let collected = planner.json(&["gc"]);
    assert_eq!(collected["queue"]["messages"], 0, "{collected}");
    let alone = Ws::new();
    assert!(alone.json(&["gc"])["queue"].is_null());
    assert!(!alone.home().join("bus.db").exists(), "gc makes no queue");
    common::also_unprivileged("two_workspaces_share_one_queue");
}

#[test]
fn a_shared_queue_named_badly_is_refused_and_nothing_is_made() {
    let tmp = tempfile::tempdir().unwrap();
    let nowhere = tmp.path().join("no-server-here");
    for (conn, expected) in [
        ("host=/tmp user=env password=hunter2 dbname=env", 2),
        ("postgresql://env:hunter2@localhost/env", 2),
        ("host='unterminated", 2),
        (
            &*format!(
                "host={} user=env dbname=env connect_timeout=2",
                nowhere.display()
            ),
            7,
        ),
    ] {
        let dir = tmp.path().join("work");
        std::fs::create_dir_all(&dir).unwrap();
        let out = envctl_in(&dir, &["init", "--shared-queue", conn]);
        let err = common::stderr(&out);
        assert_eq!(code(&out), expected, "{conn}: {err}");
        assert!(
            !err.contains("hunter2"),
            "a password is never echoed: {err}"
        );
        assert!(
            !dir.join(".environment").exists(),
            "{conn}: nothing is made"
        );
    }
    // A CA file that cannot be read: refused as bad input before any connection.
    let dir = tmp.path().join("work");
    let out = common::envctl_cmd(
        &dir,
        &[
            "init",
            "--shared-queue",
            "host=127.0.0.1 port=1 user=env dbname=env",
        ],
    )
    .env("PGSSLROOTCERT", tmp.path().join("no-such-ca.pem"))
    .output()
    .unwrap();
    assert_eq!(code(&out), 2, "{}", common::stderr(&out));
    assert!(!dir.join(".environment").exists());
    common::also_unprivileged("a_shared_queue_named_badly_is_refused_and_nothing_is_made");
}
