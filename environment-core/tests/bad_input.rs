//! Bad input gets a typed error and changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use environment_core::{
    AccessRequest, ActRequest, Action, ActorId, Authorizer, BlobError, Content, Decision, EnvError,
    ForAgent, Intent, Key, KeyError, LocalEnvironment, Options, Resource, Value, Verdict,
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

/// Asserts that `f` fails and that the log did not move.
fn refused(env: &LocalEnvironment, f: impl FnOnce() -> Result<(), EnvError>) -> EnvError {
    let before = env.head("main").unwrap();
    let ops_before = env
        .verify(&environment_core::ActorId::system())
        .unwrap()
        .ops;
    let err = f().expect_err("must be refused");
    assert_eq!(env.head("main").unwrap(), before);
    assert_eq!(
        env.verify(&environment_core::ActorId::system())
            .unwrap()
            .ops,
        ops_before
    );
    let text = err.for_agent();
    assert!(text.starts_with("The action was NOT performed"), "{text}");
    err
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
fn unknown_versions_and_branches() {
    let (_h, env, actor) = open();
    let k = Key::fs("a").unwrap();
    let bogus = "00".repeat(32).parse().unwrap();
    assert!(matches!(
        env.read(&actor, &k, &bogus),
        Err(EnvError::UnknownVersion(_))
    ));
    assert!(matches!(
        env.resolve("nosuchmark"),
        Err(EnvError::UnknownVersion(_))
    ));
    assert!(matches!(
        env.resolve("main~5"),
        Err(EnvError::UnknownVersion(_))
    ));
    assert!(matches!(
        env.resolve("main~x"),
        Err(EnvError::UnknownVersion(_))
    ));
    refused(&env, || {
        env.act_blocking(
            ActRequest::new(actor.clone(), Intent::edit("x"))
                .base(bogus)
                .put(k.clone(), Value::file("x")),
        )
        .map(drop)
    });
    refused(&env, || {
        env.act_blocking(
            ActRequest::new(actor.clone(), Intent::edit("x"))
                .on("nobranch")
                .put(k.clone(), Value::file("x")),
        )
        .map(drop)
    });
    refused(&env, || {
        env.restore(&actor, "main", &bogus, Intent::edit("x"))
            .map(drop)
    });
    refused(&env, || {
        env.merge(&actor, "nobranch", "main", Intent::edit("x"))
            .map(drop)
    });
    refused(&env, || env.undo(&actor, "main").map(drop));
    refused(&env, || {
        env.create_branch(&actor, "main", &env.head("main").unwrap())
            .map(drop)
    });
    for name in [
        "", "-x", "a b", "HEAD", "deadbeef", "x~1", "a:b", ".hidden", "a//b",
    ] {
        let err = refused(&env, || {
            env.create_branch(&actor, name, &env.head("main").unwrap())
                .map(drop)
        });
        assert!(matches!(err, EnvError::InvalidName { .. }), "{name}: {err}");
    }
    let head = env.head("main").unwrap();
    env.mark(&actor, "good", &head).unwrap();
    assert!(matches!(
        env.mark(&actor, "good", &head),
        Err(EnvError::MarkExists(_))
    ));
}

#[test]
fn oversized_and_duplicate_requests() {
    let (_h, env, actor) = open();
    let k = Key::fs("big").unwrap();
    let err = refused(&env, || {
        env.act_blocking(
            ActRequest::new(actor.clone(), Intent::edit("x"))
                .put(k.clone(), Value::file(vec![0; 1025])),
        )
        .map(drop)
    });
    assert!(matches!(
        err,
        EnvError::ValueTooLarge {
            size: 1025,
            limit: 1024,
            ..
        }
    ));
    let mut r = ActRequest::new(actor.clone(), Intent::edit("many"));
    for i in 0..11 {
        r = r.put(Key::fs(format!("k{i}")).unwrap(), Value::file("x"));
    }
    assert!(matches!(
        refused(&env, || env.act_blocking(r).map(drop)),
        EnvError::RequestTooLarge(_)
    ));
    let r = ActRequest::new(actor.clone(), Intent::edit("dup"))
        .put(k.clone(), Value::file("a"))
        .delete(k.clone());
    assert!(matches!(
        refused(&env, || env.act_blocking(r).map(drop)),
        EnvError::DuplicateKey(_)
    ));
    let r = ActRequest::new(actor.clone(), Intent::edit("x".repeat(20_000)))
        .put(k.clone(), Value::file("a"));
    assert!(matches!(
        refused(&env, || env.act_blocking(r).map(drop)),
        EnvError::RequestTooLarge(_)
    ));
    // A blob reference to content that is not stored.
    let missing = Value {
        content: Content::Blob("11".repeat(32).parse().unwrap()),
        meta: Value::file("").meta,
    };
    let r = ActRequest::new(actor.clone(), Intent::edit("dangling")).put(k, missing);
    assert!(matches!(
        refused(&env, || env.act_blocking(r).map(drop)),
        EnvError::Blob(BlobError::Missing(_))
    ));
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

struct DenySecrets;
impl Authorizer for DenySecrets {
    fn decide(&self, r: &AccessRequest) -> Decision {
        let denied = matches!(&r.resource, Resource::Key(k) if k.path().starts_with(b"secrets"))
            || r.action == Action::Delete;
        Decision {
            verdict: if denied {
                Verdict::Deny
            } else {
                Verdict::Allow
            },
            rules: vec![if denied { "no-secrets" } else { "allow-rest" }.into()],
            policy_version: 7,
            next: String::new(),
            explanation: if denied {
                "Denied by rule `no-secrets`.".into()
            } else {
                String::new()
            },
            spend: Vec::new(),
        }
    }
}

#[test]
fn denied_actions_change_nothing_and_allowed_ones_record_the_decision() {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(
        home.path(),
        Options {
            authorizer: Arc::new(DenySecrets),
            ..Options::default()
        },
    )
    .unwrap();
    let actor = ActorId::new("agent:x").unwrap();
    let r = ActRequest::new(actor.clone(), Intent::edit("x"))
        .put(Key::fs("ok").unwrap(), Value::file("a"))
        .put(Key::fs("secrets/key.pem").unwrap(), Value::file("b"));
    let err = refused(&env, || env.act_blocking(r).map(drop));
    assert!(err.for_agent().contains("Denied by rule `no-secrets`"));
    assert!(
        env.read(&actor, &Key::fs("ok").unwrap(), &env.head("main").unwrap())
            .unwrap()
            .is_none()
    );
    let obs = env
        .act_blocking(
            ActRequest::new(actor.clone(), Intent::edit("x"))
                .put(Key::fs("ok").unwrap(), Value::file("a")),
        )
        .unwrap();
    let op = env.op(&obs.version).unwrap();
    let d = op.decision.clone().unwrap();
    assert_eq!(
        (d.policy_version, d.rules),
        (7, vec!["allow-rest".to_string()])
    );
}

#[test]
fn effect_misuse() {
    let (_h, env, actor) = open();
    let rec = match env.effect_begin(&actor, "deploy-1", "prod", b"v1").unwrap() {
        environment_core::BeginOutcome::New(r) => r,
        other => panic!("{other:?}"),
    };
    assert!(matches!(
        env.effect_begin(&actor, "deploy-1", "prod", b"v2"),
        Err(EnvError::IdempotencyKeyReused { .. })
    ));
    assert!(matches!(
        env.effect_compensate(&actor, rec.id, "x"),
        Err(EnvError::InvalidEffectTransition { .. })
    ));
    assert!(matches!(
        env.effect_complete(&actor, 999, b""),
        Err(EnvError::UnknownEffect(999))
    ));
    assert!(matches!(
        env.effect_begin(&actor, "", "prod", b""),
        Err(EnvError::RequestTooLarge(_))
    ));
    env.effect_complete(&actor, rec.id, b"ok").unwrap();
    assert!(matches!(
        env.effect_fail(&actor, rec.id, "late"),
        Err(EnvError::InvalidEffectTransition { .. })
    ));
    assert_eq!(
        env.effect("deploy-1").unwrap().unwrap().result.as_deref(),
        Some(&b"ok"[..])
    );
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
