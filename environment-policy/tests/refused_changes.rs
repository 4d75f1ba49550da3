//! Changes already made in a tree (a command's files) that their actor may not make: the act
//! records the allowed ones as the actor's and keeps each refused one as a refused change with
//! its decision — never in the branch, never dropped.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use environment_core::{ActRequest, Intent, Key, LocalEnvironment, MAIN, Options, Value, Verdict};

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

[[rule]]
id = "no-vault"
effect = "forbid"
principal = "agent:x"
actions = ["write", "delete"]
resource = { path = "vault" }
"#;

fn key(p: &str) -> Key {
    Key::fs(p).unwrap()
}

fn at_head(env: &LocalEnvironment, path: &str) -> Option<Value> {
    env.read_unchecked(&key(path), &env.head(MAIN).unwrap())
        .unwrap()
}

#[test]
fn allowed_changes_are_recorded_and_refused_ones_kept_with_their_decision() {
    let (dir, env) = governed(RULES);
    let admin = LocalEnvironment::open(dir.path(), Options::default()).unwrap();
    let human = actor("human:h");
    admin
        .act_blocking(
            ActRequest::new(human, Intent::edit("setup"))
                .put(key("secrets"), Value::dir())
                .put(key("secrets/old"), Value::file("kept")),
        )
        .unwrap();
    let before = env.head(MAIN).unwrap();
    let agent = actor("agent:x");
    // Big enough to go to the blob store: a refused value's content is kept like a recorded one.
    let big = vec![b'z'; 64 << 10];
    let obs = env
        .act_blocking(
            ActRequest::new(agent.clone(), Intent::edit("a command"))
                .put(key("src/a.rs"), Value::file("fn main() {}"))
                .put(key("secrets/new"), Value::file(big.clone()))
                .delete(key("secrets/old"))
                .recording_refusals(),
        )
        .unwrap();
    assert!(!obs.noop);
    let op = env.op(&obs.version).unwrap();
    assert_eq!(op.actor, agent);
    assert_eq!(op.parents, vec![before]);
    assert_eq!(op.summary.keys, vec![key("src/a.rs")]);
    // The branch holds the allowed change and none of the refused ones.
    assert!(at_head(&env, "src/a.rs").is_some());
    assert!(at_head(&env, "secrets/new").is_none());
    assert_eq!(
        env.content(&at_head(&env, "secrets/old").unwrap()).unwrap(),
        b"kept"
    );
    // Each refused change is kept, with the actor, the head it was refused on and the rule.
    assert_eq!(obs.refused.len(), 2, "{:?}", obs.refused);
    let listed = env.refused(&agent, MAIN, 10).unwrap();
    assert_eq!(listed.len(), 2);
    for r in &listed {
        assert_eq!(r.actor, agent);
        assert_eq!(r.head, before);
        assert_eq!(r.decision.verdict, Verdict::Deny);
        assert_eq!(r.decision.rules, vec!["no-secrets".to_string()]);
        assert_eq!(r.intent.text, "a command");
    }
    let new = listed.iter().find(|r| r.key == key("secrets/new")).unwrap();
    let old = listed.iter().find(|r| r.key == key("secrets/old")).unwrap();
    assert!(
        old.value.is_none(),
        "the refused change of secrets/old is its deletion"
    );
    assert!(listed[0].id > listed[1].id, "newest first");
    // Nothing the actor did is lost: the refused content survives garbage collection (once
    // the handle that stored it is closed, so its pack can be collected), and reopening.
    drop(env);
    let human = actor("human:h");
    admin.gc(&human).unwrap();
    drop(admin);
    let reopened = LocalEnvironment::open(dir.path(), Options::default()).unwrap();
    assert_eq!(reopened.content(new.value.as_ref().unwrap()).unwrap(), big);
    reopened.verify_deep(&human).unwrap();
    assert_eq!(reopened.refused(&human, MAIN, 10).unwrap(), listed);
}

#[test]
fn an_act_with_every_change_refused_records_no_operation() {
    let (_dir, env) = governed(RULES);
    let before = env.head(MAIN).unwrap();
    let agent = actor("agent:x");
    let obs = env
        .act_blocking(
            ActRequest::new(agent.clone(), Intent::edit("only secrets"))
                .put(key("secrets/x"), Value::file("no"))
                .recording_refusals(),
        )
        .unwrap();
    assert!(obs.noop);
    assert_eq!(obs.version, before);
    assert_eq!(env.head(MAIN).unwrap(), before);
    assert_eq!(obs.refused.len(), 1);
    assert_eq!(env.refused(&agent, MAIN, 10).unwrap(), obs.refused);
    assert!(at_head(&env, "secrets/x").is_none());
}

#[test]
fn a_tree_stays_a_tree_when_part_of_a_change_is_refused() {
    let (dir, env) = governed(RULES);
    let admin = LocalEnvironment::open(dir.path(), Options::default()).unwrap();
    let agent = actor("agent:x");
    admin
        .act_blocking(
            ActRequest::new(actor("human:h"), Intent::edit("setup"))
                .put(key("secrets"), Value::dir())
                .put(key("secrets/old"), Value::file("kept"))
                .put(key("secrets/notes"), Value::dir()),
        )
        .unwrap();
    // `rm -rf secrets; mkdir vault; echo > vault/f`: the removal of the directory that keeps a
    // refused deletion is refused with it, and a file under a directory whose creation was
    // refused is refused with it; the allowed removal beside them happens.
    let obs = env
        .act_blocking(
            ActRequest::new(agent.clone(), Intent::edit("rm -rf"))
                .delete(key("secrets"))
                .delete(key("secrets/old"))
                .delete(key("secrets/notes"))
                .put(key("vault"), Value::dir())
                .put(key("vault/f"), Value::file("x"))
                .recording_refusals(),
        )
        .unwrap();
    let refused: Vec<String> = obs.refused.iter().map(|r| r.key.display_path()).collect();
    for k in [
        "secrets",
        "secrets/old",
        "secrets/notes",
        "vault",
        "vault/f",
    ] {
        assert!(
            refused.contains(&k.to_string()),
            "{k} not refused: {refused:?}"
        );
    }
    assert!(at_head(&env, "secrets").is_some());
    assert!(at_head(&env, "secrets/old").is_some());
    assert!(at_head(&env, "vault/f").is_none());
    // The one a refused change held back names the rule of the change that held it.
    let held = obs
        .refused
        .iter()
        .find(|r| r.key == key("vault/f"))
        .unwrap();
    assert_eq!(held.decision.rules, vec!["no-vault".to_string()]);
}

#[test]
fn an_act_asked_for_is_still_refused_whole() {
    let (_dir, env) = governed(RULES);
    let before = env.head(MAIN).unwrap();
    let r = env.act_blocking(
        ActRequest::new(actor("agent:x"), Intent::edit("asked"))
            .put(key("src/a.rs"), Value::file("a"))
            .put(key("secrets/x"), Value::file("no")),
    );
    assert!(matches!(r, Err(environment_core::EnvError::NotAllowed(_))));
    assert_eq!(env.head(MAIN).unwrap(), before);
    assert!(env.refused(&actor("agent:x"), MAIN, 10).unwrap().is_empty());
}
