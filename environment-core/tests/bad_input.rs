//! Bad input gets a typed error and changes nothing (the bodies every store of the log runs are
//! in `environment-conformance`; those about the embedded store's own files are here).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;

use environment_conformance::log_port::Embedded;
use environment_conformance::log_refusals;
use environment_core::{
    ActRequest, ActorId, BlobError, EnvError, Intent, Key, KeyError, LocalEnvironment, Options,
    Value,
};

fn open() -> (tempfile::TempDir, LocalEnvironment, ActorId) {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(
        home.path(),
        Options {
            max_value_bytes: 1024,
            max_changes: 10,
            ..Options::default()
        },
    )
    .unwrap();
    (home, env, ActorId::new("agent:bad").unwrap())
}

#[test]
fn malformed_keys() {
    type Expect = fn(&KeyError) -> bool;
    let cases: [(&[u8], Expect); 8] = [
        (b"", |e| matches!(e, KeyError::Empty)),
        (b"/etc/passwd", |e| matches!(e, KeyError::Absolute { .. })),
        (b"a//b", |e| matches!(e, KeyError::EmptySegment { .. })),
        (b"a/", |e| matches!(e, KeyError::EmptySegment { .. })),
        (b"a/../b", |e| matches!(e, KeyError::DotSegment { .. })),
        (b"./a", |e| matches!(e, KeyError::DotSegment { .. })),
        (b"a\0b", |e| matches!(e, KeyError::Nul { .. })),
        (&[b'x'; 256], |e| matches!(e, KeyError::TooLong { .. })),
    ];
    for (path, expected) in cases {
        let err = Key::fs(path.to_vec()).unwrap_err();
        assert!(expected(&err), "{path:?}: {err:?}");
    }
    let long: Vec<u8> = std::iter::repeat_n(b"abcdefgh/".as_slice(), 2000)
        .flatten()
        .copied()
        .collect();
    assert!(matches!(Key::fs(long), Err(KeyError::TooLong { .. })));
    assert!(matches!(
        "nope:x".parse::<Key>(),
        Err(KeyError::UnknownNamespace(_))
    ));
    // Non-UTF-8 bytes are fine.
    assert!(Key::fs(b"caf\xe9".to_vec()).is_ok());
}

#[test]
fn corrupt_blob_is_detected_on_read() {
    let (_h, env, actor) = open();
    let k = Key::fs("data.bin").unwrap();
    let obs = env
        .act_blocking(
            ActRequest::new(actor.clone(), Intent::edit("x"))
                .put(k.clone(), Value::file(vec![7u8; 500])),
        )
        .unwrap();
    let v = env.read(&actor, &k, &obs.version).unwrap().unwrap();
    let hash = v.blob().expect("500 bytes live in the blob store");
    let at = env.blobs().location(&hash).unwrap();
    std::fs::set_permissions(&at.path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = std::fs::read(&at.path).unwrap();
    bytes[at.offset as usize + 100] ^= 1;
    std::fs::write(&at.path, bytes).unwrap();
    assert!(matches!(
        env.content(&v),
        Err(EnvError::Blob(BlobError::Corrupt { .. }))
    ));
    assert!(matches!(
        env.verify_deep(&environment_core::ActorId::system()),
        Err(EnvError::Blob(BlobError::Corrupt { .. }))
    ));
}

#[test]
fn tampered_log_is_detected_by_verify() {
    let (home, env, actor) = open();
    for i in 0..3 {
        env.act_blocking(
            ActRequest::new(actor.clone(), Intent::edit("x"))
                .put(Key::fs(format!("k{i}")).unwrap(), Value::file("v")),
        )
        .unwrap();
    }
    env.verify(&environment_core::ActorId::system()).unwrap();
    drop(env);
    let conn = rusqlite::Connection::open(home.path().join("env.db")).unwrap();
    // Rewrite the second operation's actor inside its record, keeping its id.
    let record: Vec<u8> = conn
        .query_row("SELECT record FROM ops WHERE seq = 2", [], |r| r.get(0))
        .unwrap();
    let pos = record.windows(5).position(|w| w == b"agent").unwrap();
    let mut forged = record.clone();
    forged[pos] = b'A';
    conn.execute("UPDATE ops SET record = ?1 WHERE seq = 2", [forged])
        .unwrap();
    drop(conn);
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    match env.verify(&environment_core::ActorId::system()) {
        Err(EnvError::Integrity { at, .. }) => assert!(at.contains("#2"), "{at}"),
        other => panic!("tampering not detected: {other:?}"),
    }
}

/// An environment stored in a later layout than this build's is refused when it opens, before
/// anything is written, and opens again once its layout is one this build reads.
#[test]
fn an_environment_from_a_newer_layout_is_refused_and_left_as_is() {
    let (home, env, actor) = open();
    env.act_blocking(
        ActRequest::new(actor.clone(), Intent::edit("x"))
            .put(Key::fs("kept").unwrap(), Value::file("v")),
    )
    .unwrap();
    drop(env);
    let db = home.path().join("env.db");
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute("UPDATE meta SET value = '99' WHERE name = 'schema'", [])
        .unwrap();
    let tables = |conn: &rusqlite::Connection| -> Vec<String> {
        conn.prepare("SELECT name FROM sqlite_master ORDER BY name")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap()
    };
    // A table a newer layout might have dropped: this build must not recreate or touch it.
    conn.execute("DROP TABLE outbox", []).unwrap();
    let before = tables(&conn);
    drop(conn);
    let err = LocalEnvironment::open(home.path(), Options::default()).unwrap_err();
    assert!(
        matches!(&err, EnvError::Home { detail, .. } if detail.contains("layout 99")),
        "{err:?}"
    );
    let conn = rusqlite::Connection::open(&db).unwrap();
    assert_eq!(tables(&conn), before, "nothing was created");
    let schema: String = conn
        .query_row("SELECT value FROM meta WHERE name = 'schema'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(schema, "99");
    conn.execute("UPDATE meta SET value = '3' WHERE name = 'schema'", [])
        .unwrap();
    drop(conn);
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let head = env.head("main").unwrap();
    assert_eq!(
        env.read(&actor, &Key::fs("kept").unwrap(), &head).unwrap(),
        Some(Value::file("v"))
    );
    env.verify(&environment_core::ActorId::system()).unwrap();
}

#[test]
fn unknown_versions_and_branches() {
    log_refusals::unknown_versions_and_branches(&Embedded);
}

#[test]
fn oversized_and_duplicate_requests() {
    log_refusals::oversized_and_duplicate_requests(&Embedded);
}

#[test]
fn denied_actions_change_nothing_and_allowed_ones_record_the_decision() {
    log_refusals::denied_actions_change_nothing(&Embedded);
}

#[test]
fn stale_writes_conflict_or_are_kept_as_refused() {
    log_refusals::stale_writes(&Embedded);
}

#[test]
fn effect_misuse() {
    log_refusals::effect_misuse(&Embedded);
}
