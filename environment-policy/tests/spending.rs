//! What an allow consumes — a quota use, an approval use, a token use — is spent with the
//! action it allowed, never by a refused or conflicting one, and one operation spends one use
//! however many keys it changes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use common::*;
use environment_core::{
    AccessRequest, ActRequest, ActorId, Authorizer, Credentials, EnvError, Intent, Key,
    LocalEnvironment, OpId, Options, Value,
};
use environment_policy::{GrantScope, Policy};

/// `agent:x` writes `src/**` twice an hour, never `secrets/**`; `docs/**` needs `human:ann`'s
/// approval; it restores main once an hour and undoes once an hour; it marks twice an hour and
/// runs the `deploy` effect twice an hour.
const RULES: &str = r#"
[[rule]]
id = "src-twice"
effect = "permit"
principal = "agent:x"
actions = ["write", "delete"]
resource = { path = "src/**" }
quota = { count = 2, window_secs = 3600 }

[[rule]]
id = "read"
effect = "permit"
principal = "agent:x"
actions = ["read"]
resource = { path = "**" }

[[rule]]
id = "no-secrets"
effect = "forbid"
principal = "agent:x"
actions = ["write", "delete"]
resource = { path = "secrets/**" }

[[rule]]
id = "docs-approved"
effect = "permit"
principal = "agent:x"
actions = ["write"]
resource = { path = "docs/**" }
approval_from = ["human:ann"]

[[rule]]
id = "history"
effect = "permit"
principal = "agent:x"
actions = ["read"]
resource = { branch = "**" }

[[rule]]
id = "one-restore"
effect = "permit"
principal = "agent:x"
actions = ["write"]
resource = { branch = "main" }
when = { operation = "restore" }
quota = { count = 1, window_secs = 3600 }

[[rule]]
id = "two-marks"
effect = "permit"
principal = "agent:x"
actions = ["write"]
resource = { environment = true }
when = { operation = "mark" }
quota = { count = 2, window_secs = 3600 }

[[rule]]
id = "deploy-twice"
effect = "permit"
principal = "agent:x"
actions = ["execute"]
resource = { service = "deploy" }
quota = { count = 2, window_secs = 3600 }

[[rule]]
id = "undo"
effect = "permit"
principal = "agent:x"
actions = ["write"]
resource = { branch = "main" }
when = { operation = "undo" }
quota = { count = 1, window_secs = 3600 }
"#;

struct Fixture {
    _dir: tempfile::TempDir,
    policy: Arc<Policy>,
    /// A handle the policy does not govern, for the setup.
    admin: LocalEnvironment,
    /// The same environment under the policy.
    env: LocalEnvironment,
    agent: ActorId,
}

fn fixture() -> Fixture {
    let (p, _) = policy();
    p.load_rules(RULES).expect("rules");
    let policy = Arc::new(p);
    let dir = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(
        dir.path(),
        Options {
            authorizer: policy.clone(),
            ..Options::default()
        },
    )
    .unwrap();
    let admin = LocalEnvironment::open(dir.path(), Options::default()).unwrap();
    Fixture {
        _dir: dir,
        policy,
        admin,
        env,
        agent: actor("agent:x"),
    }
}

fn edit(who: &ActorId, files: &[(&str, &str)]) -> ActRequest {
    let mut req = ActRequest::new(who.clone(), Intent::edit("edit"));
    for &(path, content) in files {
        req = req.put(Key::fs(path).unwrap(), Value::file(content));
    }
    req
}

fn put(env: &LocalEnvironment, who: &ActorId, files: &[(&str, &str)]) -> OpId {
    env.act_blocking(edit(who, files)).unwrap().version
}

/// The approval request a refusal held for approval filed.
fn held<T: std::fmt::Debug>(r: Result<T, EnvError>) -> String {
    match r {
        Err(EnvError::NotAllowed(d)) => match d.verdict {
            environment_core::Verdict::NeedsApproval {
                request: Some(id), ..
            } => id,
            other => panic!("expected an approval request, got {other:?}"),
        },
        other => panic!("expected a hold, got {other:?}"),
    }
}

fn denied<T: std::fmt::Debug>(r: Result<T, EnvError>) {
    match r {
        Err(EnvError::NotAllowed(_)) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_refused_act_spends_no_quota() {
    let f = fixture();
    let head = f.env.head("main").unwrap();
    // Allowed for src/a (a quota use) but refused for secrets/s: nothing happens.
    denied(
        f.env
            .act_blocking(edit(&f.agent, &[("src/a", "1"), ("secrets/s", "x")])),
    );
    assert_eq!(f.env.head("main").unwrap(), head);
    // Both uses are still there.
    put(&f.env, &f.agent, &[("src/a", "2")]);
    put(&f.env, &f.agent, &[("src/a", "3")]);
    denied(f.env.act_blocking(edit(&f.agent, &[("src/a", "4")])));
}

#[test]
fn a_conflicting_act_spends_no_quota() {
    let f = fixture();
    let base = put(&f.admin, &actor("human:ann"), &[("src/a", "0")]);
    put(&f.admin, &actor("human:ann"), &[("src/a", "moved")]);
    // Based on a version whose src/a has moved since: a stale write, refused after the policy
    // allowed it.
    match f
        .env
        .act_blocking(edit(&f.agent, &[("src/a", "stale")]).base(base))
    {
        Err(EnvError::Conflict(_)) => {}
        other => panic!("expected a conflict, got {other:?}"),
    }
    put(&f.env, &f.agent, &[("src/a", "1")]);
    put(&f.env, &f.agent, &[("src/a", "2")]);
    denied(f.env.act_blocking(edit(&f.agent, &[("src/a", "3")])));
}

#[test]
fn one_operation_spends_one_use_however_many_keys_it_changes() {
    let f = fixture();
    put(
        &f.env,
        &f.agent,
        &[("src/a", "1"), ("src/b", "1"), ("src/c", "1")],
    );
    put(&f.env, &f.agent, &[("src/a", "2"), ("src/b", "2")]);
    denied(f.env.act_blocking(edit(&f.agent, &[("src/c", "3")])));
}

#[test]
fn a_restore_or_undo_that_fails_spends_no_quota() {
    let f = fixture();
    let start = put(&f.admin, &actor("human:ann"), &[("secrets/s", "old")]);
    put(&f.admin, &actor("human:ann"), &[("secrets/s", "new")]);
    // The branch write is allowed (one restore an hour), the secret it would rewrite is not.
    denied(
        f.env
            .restore(&f.agent, "main", &start, Intent::edit("back")),
    );
    denied(f.env.undo(&f.agent, "main"));
    // The restore quota is whole: a restore that leaves the secret alone passes, once.
    let v = put(&f.env, &f.agent, &[("src/a", "1")]);
    put(&f.admin, &actor("human:ann"), &[("src/a", "2")]);
    f.env
        .restore(&f.agent, "main", &v, Intent::edit("back"))
        .unwrap();
    denied(f.env.restore(&f.agent, "main", &v, Intent::edit("again")));
}

#[test]
fn an_approval_presented_with_a_conflicting_act_is_not_used_up() {
    let f = fixture();
    let base = put(&f.admin, &actor("human:ann"), &[("docs/x", "0")]);
    put(&f.admin, &actor("human:ann"), &[("docs/x", "moved")]);
    let id = held(f.env.act_blocking(edit(&f.agent, &[("docs/x", "mine")])));
    f.policy
        .grant(&id, "human:ann", GrantScope::once())
        .unwrap();
    let approved = f.env.presenting(Credentials {
        token: None,
        approval: Some(id),
    });
    match approved.act_blocking(edit(&f.agent, &[("docs/x", "mine")]).base(base)) {
        Err(EnvError::Conflict(_)) => {}
        other => panic!("expected a conflict, got {other:?}"),
    }
    // The one use is still there, and is spent by the act that happens.
    approved
        .act_blocking(edit(&f.agent, &[("docs/x", "mine")]))
        .unwrap();
    denied(approved.act_blocking(edit(&f.agent, &[("docs/x", "again")])));
    let head = f.env.head("main").unwrap();
    let v = f
        .admin
        .read_unchecked(&Key::fs("docs/x").unwrap(), &head)
        .unwrap()
        .unwrap();
    assert_eq!(f.admin.content(&v).unwrap(), b"mine");
}

#[test]
fn a_use_taken_since_the_decision_refuses_the_spend() {
    let f = fixture();
    let req: AccessRequest = write("agent:x", "src/a");
    let restore = {
        let mut r = req.clone();
        r.resource = environment_core::Resource::Branch("main".into());
        r.context.branch = Some("main".into());
        r.context.attrs.insert(
            "operation".into(),
            environment_core::AttrValue::Str("restore".into()),
        );
        r
    };
    // Two decisions of the one-an-hour restore, both allowed, both listing the same use.
    let first = f.policy.decide(&restore);
    let second = f.policy.decide(&restore);
    assert!(first.is_allowed() && second.is_allowed());
    assert!(!first.spend.is_empty(), "{first:?}");
    f.policy.spend(&first.spend).unwrap();
    assert!(f.policy.spend(&second.spend).is_err());
    // Deciding spends nothing.
    for _ in 0..5 {
        assert!(f.policy.decide(&req).is_allowed());
    }
    // A spend is all or nothing: a list whose restore use is gone spends no src use either.
    let both: Vec<_> = f
        .policy
        .decide(&req)
        .spend
        .into_iter()
        .chain(second.spend)
        .collect();
    assert!(f.policy.spend(&both).is_err());
    put(&f.env, &f.agent, &[("src/a", "1")]);
    put(&f.env, &f.agent, &[("src/a", "2")]);
    denied(f.env.act_blocking(edit(&f.agent, &[("src/a", "3")])));
}

#[test]
fn a_refused_mark_or_effect_transition_spends_no_quota() {
    let f = fixture();
    let v = f.env.head("main").unwrap();
    f.env.mark(&f.agent, "first", &v).unwrap();
    // The name is taken: refused after the policy allowed it.
    assert!(matches!(
        f.env.mark(&f.agent, "first", &v),
        Err(EnvError::MarkExists(_))
    ));
    f.env.mark(&f.agent, "second", &v).unwrap();
    denied(f.env.mark(&f.agent, "third", &v));

    let id = match f
        .env
        .effect_begin(&f.agent, "deploy-1", "deploy", b"v1")
        .unwrap()
    {
        environment_core::BeginOutcome::New(r) => r.id,
        other => panic!("expected a new effect, got {other:?}"),
    };
    // An in-flight effect cannot be compensated: refused after the policy allowed it.
    assert!(matches!(
        f.env.effect_compensate(&f.agent, id, "undo it"),
        Err(EnvError::InvalidEffectTransition { .. })
    ));
    f.env.effect_complete(&f.agent, id, b"ok").unwrap();
    denied(f.env.effect_fail(&f.agent, id, "late"));
}

/// A file written into a new directory is one request: the directory made for it is decided by
/// the file, so one approval covers both, and is used once. A directory put on its own, or
/// beside a file it does not hold, is decided as itself.
#[test]
fn a_directory_made_for_a_file_is_decided_by_the_file() {
    let f = fixture();
    let with_dir = |path: &str, dir: &str| {
        ActRequest::new(f.agent.clone(), Intent::edit("write into a new directory"))
            .put(Key::fs(dir).unwrap(), Value::dir())
            .put(Key::fs(path).unwrap(), Value::file("plan"))
    };
    let id = held(f.env.act_blocking(with_dir("docs/plan.md", "docs")));
    f.policy
        .grant(&id, "human:ann", GrantScope::once())
        .unwrap();
    let approved = f.env.presenting(Credentials {
        token: None,
        approval: Some(id),
    });
    approved
        .act_blocking(with_dir("docs/plan.md", "docs"))
        .unwrap();
    denied(approved.act_blocking(edit(&f.agent, &[("docs/plan.md", "again")])));
    // `src/**` is the agent's; the directory `src` itself is not, nor is `lib` beside it.
    f.env.act_blocking(with_dir("src/new/a.rs", "src")).unwrap();
    denied(
        f.env.act_blocking(
            ActRequest::new(f.agent.clone(), Intent::edit("a directory alone"))
                .put(Key::fs("lib").unwrap(), Value::dir()),
        ),
    );
    denied(f.env.act_blocking(with_dir("src/b.rs", "lib")));
    let head = f.env.head("main").unwrap();
    assert!(
        f.admin
            .read_unchecked(&Key::fs("lib").unwrap(), &head)
            .unwrap()
            .is_none()
    );
}
