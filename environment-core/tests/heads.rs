//! Branch heads are found from the log, past a snapshot the writer settles every few hundred
//! operations: heads stay exact through settling, for a branch idle through many settlings,
//! across reopening and between two handles on one home; `verify` catches a snapshot that
//! disagrees with the log.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::Path;

use environment_core::error::EnvError;
use environment_core::op::OpId;
use environment_core::{ActRequest, ActorId, Intent, Key, LocalEnvironment, Options, Value};

fn actor() -> ActorId {
    ActorId::new("agent:heads").unwrap()
}

fn act(env: &LocalEnvironment, branch: &str, i: usize) -> OpId {
    env.act_blocking(
        ActRequest::new(actor(), Intent::edit("edit"))
            .on(branch)
            .put(
                Key::fs(format!("{branch}.txt")).unwrap(),
                Value::file(i.to_string()),
            ),
    )
    .unwrap()
    .version
}

/// The heads the environment reports, checked one by one and all at once against `model`.
fn assert_heads(env: &LocalEnvironment, model: &BTreeMap<String, OpId>) {
    for (branch, head) in model {
        assert_eq!(env.head(branch).unwrap(), *head, "head of {branch}");
    }
    let all: BTreeMap<String, OpId> = env.branches().unwrap().into_iter().collect();
    assert_eq!(&all, model);
}

fn sql(home: &Path, statement: &str) {
    let conn = rusqlite::Connection::open(home.join("env.db")).unwrap();
    conn.execute_batch(statement).unwrap();
}

/// An environment with three branches: `main` and `busy` move all the time, `idle` moves at the
/// start and once between two settlings of the snapshot, then waits through several more.
/// Returns it with its heads and the versions its acts made.
fn three_branches(home: &Path) -> (LocalEnvironment, BTreeMap<String, OpId>, Vec<OpId>) {
    let env = LocalEnvironment::open(home, Options::default()).unwrap();
    let mut model = BTreeMap::new();
    model.insert("main".to_owned(), env.head("main").unwrap());
    for name in ["busy", "idle"] {
        let id = env.create_branch(&actor(), name, &model["main"]).unwrap();
        model.insert(name.to_owned(), id);
    }
    model.insert("idle".to_owned(), act(&env, "idle", 0));
    let mut versions = Vec::new();
    for i in 0..1200 {
        let branch = match i {
            400 => "idle",
            _ if i % 3 == 0 => "main",
            _ => "busy",
        };
        let id = act(&env, branch, i);
        versions.push(id);
        model.insert(branch.to_owned(), id);
        if i % 97 == 0 {
            assert_heads(&env, &model);
        }
    }
    assert_heads(&env, &model);
    (env, model, versions)
}

#[test]
fn heads_stay_exact_through_settling_and_reopening() {
    let home = tempfile::tempdir().unwrap();
    let (env, mut model, _) = three_branches(home.path());
    env.verify(&environment_core::ActorId::system()).unwrap();
    drop(env);
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    assert_heads(&env, &model);
    model.insert("idle".to_owned(), act(&env, "idle", 1));
    assert_heads(&env, &model);
    // A branch that exists only in the log since the last settling is still one.
    let id = env.create_branch(&actor(), "late", &model["busy"]).unwrap();
    model.insert("late".to_owned(), id);
    assert!(matches!(
        env.create_branch(&actor(), "late", &model["main"]),
        Err(EnvError::BranchExists(_))
    ));
    assert_heads(&env, &model);
    env.verify(&environment_core::ActorId::system()).unwrap();
}

#[test]
fn two_handles_on_one_home_see_each_others_heads() {
    let home = tempfile::tempdir().unwrap();
    let (a, mut model, _) = three_branches(home.path());
    let b = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    for i in 0..600 {
        let (env, branch) = if i % 2 == 0 {
            (&a, "busy")
        } else {
            (&b, "main")
        };
        let base = model[branch];
        let id = act(env, branch, i);
        assert_eq!(
            env.op(&id).unwrap().parents,
            vec![base],
            "act {i} builds on the head"
        );
        model.insert(branch.to_owned(), id);
    }
    assert_heads(&a, &model);
    assert_heads(&b, &model);
    b.verify(&environment_core::ActorId::system()).unwrap();
}

#[test]
fn verify_catches_a_snapshot_that_disagrees_with_the_log() {
    for damage in [
        // The idle branch's head in the snapshot, set back to the operation before it.
        "UPDATE heads SET op = (SELECT id FROM ops WHERE branch = 'idle' ORDER BY seq LIMIT 1)
             WHERE name = 'idle'",
        // The snapshot claims to be complete to a later operation than it is: the moves in
        // between are no longer seen.
        "UPDATE meta SET value = CAST(value + 400 AS TEXT) WHERE name = 'heads_seq'",
    ] {
        let home = tempfile::tempdir().unwrap();
        let (env, ..) = three_branches(home.path());
        drop(env);
        sql(home.path(), damage);
        let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
        let err = env
            .verify(&environment_core::ActorId::system())
            .unwrap_err();
        assert!(
            matches!(&err, EnvError::Integrity { at, .. } if at.contains("heads")),
            "{damage}: {err}"
        );
    }
}

#[test]
fn versions_the_snapshot_named_before_their_branch_moved_on_can_be_dropped() {
    let home = tempfile::tempdir().unwrap();
    let (env, mut model, versions) = three_branches(home.path());
    let protected = env.protected_versions().unwrap();
    let droppable: Vec<OpId> = versions
        .into_iter()
        .filter(|v| !protected.contains_key(v))
        .collect();
    assert!(droppable.len() > 1000, "{} droppable", droppable.len());
    env.drop_versions(&actor(), &droppable).unwrap();
    assert_heads(&env, &model);
    env.verify(&environment_core::ActorId::system()).unwrap();
    for i in 0..300 {
        model.insert("busy".to_owned(), act(&env, "busy", i));
    }
    assert_heads(&env, &model);
    env.verify(&environment_core::ActorId::system()).unwrap();
}
