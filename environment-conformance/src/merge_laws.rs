//! Laws of the three-way merge, whatever keeps the log: merging into an ancestor is a
//! fast-forward, merging twice changes nothing, disjoint changes commute, and no change made on
//! one side only is lost.

use environment_core::Value;
use environment_core::{ActRequest, ActorId, Hash, Intent, Key, LocalEnvironment, OpId, Options};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use crate::log_port::Backend;

const KEYS: [&str; 6] = ["a", "b/c", "b/d", "e/f/g", "e/f/h", "i"];

/// One side's changes: keys (by index into a fixed set) written with one of three contents, or
/// deleted.
pub type Changes = Vec<(usize, Option<u8>)>;

/// Random changes to one to three keys.
pub fn changes() -> impl Strategy<Value = Changes> {
    proptest::collection::btree_map(0..KEYS.len(), proptest::option::weighted(0.8, 0u8..3), 1..4)
        .prop_map(|m| m.into_iter().collect())
}

fn act(env: &LocalEnvironment, actor: &ActorId, branch: &str, changes: &Changes) {
    let mut r = ActRequest::new(actor.clone(), Intent::edit("change")).on(branch);
    for (k, v) in changes {
        let key = Key::fs(KEYS[*k]).unwrap();
        r = match v {
            Some(b) => r.put(key, Value::file(vec![*b; 1 + *b as usize * 40])),
            None => r.delete(key),
        };
    }
    env.act_blocking(r).unwrap();
}

fn view(env: &LocalEnvironment, id: &OpId) -> Hash {
    env.op(id).unwrap().view
}

/// Checks every law on a new environment of `backend`: `base` on main, then `ours` and
/// `theirs` on two branches made from it.
pub fn hold(
    backend: &dyn Backend,
    base: &Changes,
    ours: &Changes,
    theirs: &Changes,
) -> Result<(), TestCaseError> {
    let place = backend.fresh();
    let env = place.open(Options::default());
    let actor = ActorId::new("agent:laws").unwrap();
    act(&env, &actor, "main", base);
    let b = env.head("main").unwrap();
    for name in ["x", "y", "z"] {
        env.create_branch(&actor, name, &b).unwrap();
    }
    act(&env, &actor, "x", ours);
    act(&env, &actor, "y", theirs);
    let (x, y) = (env.head("x").unwrap(), env.head("y").unwrap());

    // Merging into an unchanged ancestor yields the source's view.
    let ff = env.merge(&actor, "x", "z", Intent::edit("ff")).unwrap();
    prop_assert!(ff.conflicts.is_empty());
    prop_assert_eq!(view(&env, &ff.version), view(&env, &x));
    // Merging the same thing again is a no-op.
    let again = env.merge(&actor, "x", "z", Intent::edit("again")).unwrap();
    prop_assert!(again.noop);

    // Disjoint changes commute.
    let disjoint = ours.iter().all(|(k, _)| theirs.iter().all(|(j, _)| j != k));
    let x2 = env.create_branch(&actor, "x2", &x).unwrap();
    env.create_branch(&actor, "y2", &y).unwrap();
    let m1 = env
        .merge(&actor, "y", "x2", Intent::edit("y into x"))
        .unwrap();
    let m2 = env
        .merge(&actor, "x", "y2", Intent::edit("x into y"))
        .unwrap();
    if disjoint {
        prop_assert!(m1.conflicts.is_empty() && m2.conflicts.is_empty());
        prop_assert_eq!(view(&env, &m1.version), view(&env, &m2.version));
    }
    // No change is lost: every key changed on one side only has that side's value.
    for (k, _) in ours.iter().chain(theirs.iter()) {
        let key = Key::fs(KEYS[*k]).unwrap();
        let in_x = env.read(&actor, &key, &x).unwrap();
        let in_y = env.read(&actor, &key, &y).unwrap();
        let in_b = env.read(&actor, &key, &b).unwrap();
        let merged = env.read(&actor, &key, &m1.version).unwrap();
        if in_y == in_b {
            prop_assert_eq!(&merged, &in_x);
        } else if in_x == in_b || in_x == in_y {
            prop_assert_eq!(&merged, &in_y);
        } else {
            prop_assert!(m1.conflicts.contains(&key));
        }
    }
    prop_assert_eq!(env.op(&m1.version).unwrap().parents.clone(), vec![x2, y]);
    Ok(())
}
