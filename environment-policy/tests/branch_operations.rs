//! Restore, undo and merge through environment-core under the policy: besides the branch, the
//! actor must be allowed to change every key the operation changes, and a refused one changes
//! nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use environment_core::{
    ActRequest, ActorId, EnvError, Intent, Key, LocalEnvironment, OpId, Options, Value,
};

const RULES: &str = r#"
[[rule]]
id = "work"
effect = "permit"
principal = "agent:x"
actions = ["read", "write", "delete"]
resource = { path = "**" }

[[rule]]
id = "main"
effect = "permit"
principal = "agent:x"
actions = ["read", "write"]
resource = { branch = "**" }

[[rule]]
id = "no-secrets"
effect = "forbid"
principal = "agent:x"
actions = ["write", "delete"]
resource = { path = "secrets/**" }
"#;

struct Fixture {
    _dir: tempfile::TempDir,
    /// A handle the policy does not govern, for the setup.
    admin: LocalEnvironment,
    /// The same environment under the policy.
    env: LocalEnvironment,
    agent: ActorId,
}

fn fixture() -> Fixture {
    let (dir, env) = governed(RULES);
    let admin = LocalEnvironment::open(dir.path(), Options::default()).unwrap();
    Fixture {
        _dir: dir,
        admin,
        env,
        agent: actor("agent:x"),
    }
}

fn put(env: &LocalEnvironment, who: &ActorId, branch: &str, files: &[(&str, &str)]) -> OpId {
    let mut req = ActRequest::new(who.clone(), Intent::edit("edit")).on(branch);
    for &(path, content) in files {
        req = req.put(Key::fs(path).unwrap(), Value::file(content));
    }
    env.act_blocking(req).unwrap().version
}

fn content(env: &LocalEnvironment, path: &str) -> Option<Vec<u8>> {
    let head = env.head("main").unwrap();
    env.read_unchecked(&Key::fs(path).unwrap(), &head)
        .unwrap()
        .map(|v| env.content(&v).unwrap())
}

fn denied(r: Result<impl std::fmt::Debug, EnvError>) {
    match r {
        Err(EnvError::NotAllowed(_)) => {}
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_restore_that_would_rewrite_a_forbidden_key_is_refused_and_changes_nothing() {
    let f = fixture();
    let human = actor("human:h");
    let before = put(
        &f.admin,
        &human,
        "main",
        &[("secrets/old", "v1"), ("a.txt", "1")],
    );
    put(
        &f.admin,
        &human,
        "main",
        &[("secrets/old", "v2"), ("a.txt", "2")],
    );
    let head = f.env.head("main").unwrap();

    denied(
        f.env
            .restore(&f.agent, "main", &before, Intent::edit("back")),
    );
    let mut applied = false;
    denied(
        f.env
            .restore_applying(&f.agent, "main", &before, Intent::edit("back"), || {
                applied = true;
                Ok::<(), EnvError>(())
            }),
    );
    assert!(!applied, "a refused restore never touches the files");
    assert_eq!(f.env.head("main").unwrap(), head);
    assert_eq!(content(&f.env, "secrets/old").unwrap(), b"v2");

    // Undo of the human's edit would bring the old secret back: refused too.
    denied(f.env.undo(&f.agent, "main"));
    assert_eq!(f.env.head("main").unwrap(), head);

    // A restore that leaves the forbidden keys as they are passes, and names its rules.
    let ok = put(&f.admin, &human, "main", &[("a.txt", "3")]);
    let restored = f
        .env
        .restore(&f.agent, "main", &head, Intent::edit("a.txt back"))
        .unwrap();
    assert_ne!(restored, ok);
    assert_eq!(content(&f.env, "a.txt").unwrap(), b"2");
    let op = f.env.op(&restored).unwrap();
    let rules = op
        .decision
        .as_ref()
        .expect("the rules that allowed it")
        .rules
        .clone();
    assert!(rules.contains(&"work".to_owned()), "{rules:?}");
}

#[test]
fn a_merge_that_would_write_a_forbidden_key_is_refused_and_changes_nothing() {
    let f = fixture();
    let human = actor("human:h");
    put(&f.admin, &human, "main", &[("a.txt", "1")]);
    let main = f.admin.head("main").unwrap();
    f.admin.create_branch(&human, "topic", &main).unwrap();
    put(
        &f.admin,
        &human,
        "topic",
        &[("secrets/new", "s"), ("b.txt", "b")],
    );
    let head = f.env.head("main").unwrap();

    denied(
        f.env
            .merge(&f.agent, "topic", "main", Intent::edit("merge")),
    );
    assert_eq!(f.env.head("main").unwrap(), head);
    assert_eq!(content(&f.env, "secrets/new"), None);
    assert_eq!(content(&f.env, "b.txt"), None);

    // Without the secret on the branch, the same merge passes.
    let clean = f.admin.head("main").unwrap();
    f.admin.create_branch(&human, "clean", &clean).unwrap();
    put(&f.admin, &human, "clean", &[("b.txt", "b")]);
    let merged = f
        .env
        .merge(&f.agent, "clean", "main", Intent::edit("merge"))
        .unwrap();
    assert!(!merged.noop);
    assert_eq!(content(&f.env, "b.txt").unwrap(), b"b");
}
