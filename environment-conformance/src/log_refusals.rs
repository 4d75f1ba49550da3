//! Bad input to the log gets a typed error and changes nothing, whatever keeps the log: unknown
//! versions and branches, oversized and duplicate requests, denied actions, misused effects.

use std::sync::Arc;

use environment_core::{
    AccessRequest, ActRequest, Action, ActorId, Authorizer, BeginOutcome, BlobError, Content,
    Decision, EnvError, ForAgent, Intent, Key, LocalEnvironment, Options, Resource, Value, Verdict,
};

use crate::log_port::Backend;

/// The limits the bodies run under: values of at most 1,024 bytes, ten changes a request.
fn limited() -> Options {
    Options {
        max_value_bytes: 1024,
        max_changes: 10,
        ..Options::default()
    }
}

fn actor() -> ActorId {
    ActorId::new("agent:bad").unwrap()
}

/// Asserts that `f` fails, that the head and the number of operations did not move, and that
/// the error tells an agent nothing was done.
pub fn refused(env: &LocalEnvironment, f: impl FnOnce() -> Result<(), EnvError>) -> EnvError {
    let system = ActorId::system();
    let before = env.head("main").unwrap();
    let ops_before = env.verify(&system).unwrap().ops;
    let err = f().expect_err("must be refused");
    assert_eq!(env.head("main").unwrap(), before);
    assert_eq!(env.verify(&system).unwrap().ops, ops_before);
    let text = err.for_agent();
    assert!(text.starts_with("The action was NOT performed"), "{text}");
    err
}

/// Versions, marks and branches that do not exist, and names that may not be made, are refused.
pub fn unknown_versions_and_branches(backend: &dyn Backend) {
    let place = backend.fresh();
    let env = place.open(limited());
    let actor = actor();
    let k = Key::fs("a").unwrap();
    let bogus = "00".repeat(32).parse().unwrap();
    assert!(matches!(
        env.read(&actor, &k, &bogus),
        Err(EnvError::UnknownVersion(_))
    ));
    for name in ["nosuchmark", "main~5", "main~x"] {
        assert!(
            matches!(env.resolve(name), Err(EnvError::UnknownVersion(_))),
            "{name}"
        );
    }
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
    assert_eq!(env.resolve("good").unwrap(), head);
}

/// A value over the limit, too many changes, a key changed twice, an oversized intent and a
/// reference to content that is not stored are refused.
pub fn oversized_and_duplicate_requests(backend: &dyn Backend) {
    let place = backend.fresh();
    let env = place.open(limited());
    let actor = actor();
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

/// Denies writes under `secrets/` and every delete, and allows the rest, as policy version 7.
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

/// A request with one denied change records nothing at all; an allowed one records the decision
/// that allowed it.
pub fn denied_actions_change_nothing(backend: &dyn Backend) {
    let place = backend.fresh();
    let env = place.open(Options {
        authorizer: Arc::new(DenySecrets),
        ..Options::default()
    });
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
    let d = env.op(&obs.version).unwrap().decision.clone().unwrap();
    assert_eq!(
        (d.policy_version, d.rules),
        (7, vec!["allow-rest".to_string()])
    );
}

/// A write based on a version older than the head, to a key the head changed since: refused
/// whole with `Conflict` when asked for, kept as a refused change when it was already made in
/// a tree (`recording_refusals`), while the rest of the act is rebased onto the head; a stale
/// write of what the head holds already is neither recorded nor refused. The first version is
/// the empty one every later version descends from.
pub fn stale_writes(backend: &dyn Backend) {
    let place = backend.fresh();
    let env = place.open(Options::default());
    let actor = actor();
    let key = |k: &str| Key::fs(k).unwrap();
    let first = env.first_version().unwrap();
    assert!(env.op(&first).unwrap().parents.is_empty());
    assert!(
        env.list(
            &actor,
            &environment_core::KeyPrefix::all(environment_core::Namespace::Fs),
            &first
        )
        .unwrap()
        .is_empty()
    );
    let base = env
        .act_blocking(
            ActRequest::new(actor.clone(), Intent::edit("first"))
                .put(key("a"), Value::file("1"))
                .put(key("b"), Value::file("1")),
        )
        .unwrap()
        .version;
    let theirs = env
        .act_blocking(
            ActRequest::new(actor.clone(), Intent::edit("theirs")).put(key("a"), Value::file("2")),
        )
        .unwrap()
        .version;
    assert_eq!(env.first_version().unwrap(), first);
    let stale = |v: &str| {
        ActRequest::new(actor.clone(), Intent::edit("stale"))
            .base(base)
            .put(key("a"), Value::file(v))
            .put(key("b"), Value::file("3"))
    };
    let err = refused(&env, || env.act_blocking(stale("3")).map(drop));
    assert_eq!(err.kind(), environment_core::ErrorKind::Conflict);

    let obs = env.act_blocking(stale("3").recording_refusals()).unwrap();
    assert!(obs.rebased && !obs.noop);
    assert_eq!(env.op(&obs.version).unwrap().parents, vec![theirs]);
    let at = |k: &str| env.read(&actor, &key(k), &obs.version).unwrap();
    assert_eq!(at("a"), Some(Value::file("2")), "the newer write stays");
    assert_eq!(at("b"), Some(Value::file("3")), "the rest is rebased");
    assert_eq!(obs.refused.len(), 1);
    let r = &obs.refused[0];
    assert_eq!(
        (&r.key, &r.value, r.head),
        (&key("a"), &Some(Value::file("3")), theirs)
    );
    assert!(matches!(&r.decision.verdict, Verdict::Stale { by } if by == &[theirs.to_string()]));
    assert_eq!(env.refused(&actor, "main", 10).unwrap(), obs.refused);

    let again = env
        .act_blocking(
            ActRequest::new(actor.clone(), Intent::edit("stale, as the head"))
                .base(base)
                .put(key("a"), Value::file("2"))
                .recording_refusals(),
        )
        .unwrap();
    assert!(again.noop && again.refused.is_empty());
    assert_eq!(env.head("main").unwrap(), obs.version);
    assert_eq!(env.refused(&actor, "main", 10).unwrap().len(), 1);
    env.verify(&ActorId::system()).unwrap();
}

/// A reused idempotency key, a transition the effect's state does not allow, an unknown effect
/// and an empty key are refused; the effect keeps its result.
pub fn effect_misuse(backend: &dyn Backend) {
    let place = backend.fresh();
    let env = place.open(limited());
    let actor = actor();
    let rec = match env.effect_begin(&actor, "deploy-1", "prod", b"v1").unwrap() {
        BeginOutcome::New(r) => r,
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
        env.effect_complete(&actor, 999_999, b""),
        Err(EnvError::UnknownEffect(999_999))
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
