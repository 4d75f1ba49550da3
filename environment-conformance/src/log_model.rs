//! The log's model test: random sequences of acts, stale acts, branches, merges, restores,
//! undos and reopens against an in-memory model: every read at every version equals the model,
//! and `verify` passes, on whatever store keeps the log ([`crate::log_port::Backend`]).

use std::collections::{BTreeMap, HashMap};

use environment_core::{
    ActRequest, ActorId, Conflict, EntryKind, EnvError, Intent, Key, KeyPrefix, LocalEnvironment,
    Namespace, OpId, Options, Value,
};
use proptest::prelude::*;

use crate::log_port::Backend;

type State = BTreeMap<Key, Vec<u8>>;

const KEYS: [&str; 8] = ["a", "a/b", "a/c", "d/e/f", "d/e/g", "g", "h/i", "h/j/k"];
const BRANCHES: [&str; 3] = ["main", "feature", "fix"];

/// One step of a run (branches and keys are indexes into the run's own lists).
#[derive(Clone, Debug)]
pub struct Step(Move);

#[derive(Clone, Debug)]
enum Move {
    Act {
        branch: usize,
        changes: Vec<(usize, Option<Vec<u8>>)>,
    },
    Stale {
        branch: usize,
        back: usize,
        changes: Vec<(usize, Option<Vec<u8>>)>,
    },
    Branch {
        name: usize,
        from: usize,
    },
    Merge {
        source: usize,
        target: usize,
    },
    Restore {
        branch: usize,
        to: usize,
    },
    Undo {
        branch: usize,
    },
    Redo {
        branch: usize,
    },
    Reopen,
}

fn content() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![
        3 => (0u8..4).prop_map(|b| Some(vec![b'x', b])),
        1 => (0u8..2).prop_map(|b| Some(vec![b; 100])),
        1 => Just(None),
    ]
}

fn changes() -> impl Strategy<Value = Vec<(usize, Option<Vec<u8>>)>> {
    proptest::collection::btree_map(0..KEYS.len(), content(), 1..4)
        .prop_map(|m| m.into_iter().collect())
}

/// Random steps.
pub fn step() -> impl Strategy<Value = Step> {
    moves().prop_map(Step)
}

fn moves() -> impl Strategy<Value = Move> {
    prop_oneof![
        6 => (0..3usize, changes()).prop_map(|(branch, changes)| Move::Act { branch, changes }),
        2 => (0..3usize, 1..4usize, changes()).prop_map(|(branch, back, changes)| Move::Stale { branch, back, changes }),
        2 => (1..3usize, 0..64usize).prop_map(|(name, from)| Move::Branch { name, from }),
        2 => (0..3usize, 0..3usize).prop_map(|(source, target)| Move::Merge { source, target }),
        1 => (0..3usize, 0..64usize).prop_map(|(branch, to)| Move::Restore { branch, to }),
        2 => (0..3usize).prop_map(|branch| Move::Undo { branch }),
        1 => (0..3usize).prop_map(|branch| Move::Redo { branch }),
        1 => Just(Move::Reopen),
    ]
}

/// What undo and redo may do after an operation, kept as stacks going forward in time (core
/// walks the log backward instead): the operations not undone, oldest first, and the undos
/// that can be redone (the head before each, and the operation it undid), oldest first.
#[derive(Clone, Default)]
struct UndoState {
    undoable: Vec<OpId>,
    redoable: Vec<(OpId, OpId)>,
}

struct Model {
    undo: HashMap<OpId, UndoState>,
    states: HashMap<OpId, State>,
    parents: HashMap<OpId, Vec<OpId>>,
    order: Vec<OpId>,
    heads: BTreeMap<String, OpId>,
}

impl Model {
    fn record(&mut self, id: OpId, parents: Vec<OpId>, state: State) {
        if self.states.insert(id, state).is_none() {
            self.order.push(id);
        }
        // An operation that is neither an undo nor a redo can be undone, and ends what could
        // be redone (an undo or redo replaces this below).
        let mut undoable = parents
            .first()
            .map(|p| self.undo[p].undoable.clone())
            .unwrap_or_default();
        if !parents.is_empty() {
            undoable.push(id);
        }
        self.undo.insert(
            id,
            UndoState {
                undoable,
                redoable: Vec::new(),
            },
        );
        self.parents.insert(id, parents);
    }

    /// Every ancestor of `id` (itself included).
    fn ancestors(&self, id: OpId) -> Vec<OpId> {
        let mut out = vec![];
        let mut stack = vec![id];
        while let Some(x) = stack.pop() {
            if !out.contains(&x) {
                out.push(x);
                stack.extend(self.parents.get(&x).cloned().unwrap_or_default());
            }
        }
        out
    }
}

fn key(i: usize) -> Key {
    Key::fs(KEYS[i]).unwrap()
}

fn content_of(env: &LocalEnvironment, v: &Value) -> Vec<u8> {
    env.content(v).unwrap()
}

fn apply(state: &State, changes: &[(usize, Option<Vec<u8>>)]) -> State {
    let mut s = state.clone();
    for (k, c) in changes {
        match c {
            Some(bytes) => s.insert(key(*k), bytes.clone()),
            None => s.remove(&key(*k)),
        };
    }
    s
}

fn request(actor: &ActorId, branch: &str, changes: &[(usize, Option<Vec<u8>>)]) -> ActRequest {
    let mut r = ActRequest::new(actor.clone(), Intent::edit("random change")).on(branch);
    for (k, c) in changes {
        r = match c {
            Some(bytes) => r.put(key(*k), Value::file(bytes.clone())),
            None => r.delete(key(*k)),
        };
    }
    r
}

fn check_version(env: &LocalEnvironment, actor: &ActorId, id: &OpId, expected: &State) {
    let listed = env.list(actor, &KeyPrefix::all(Namespace::Fs), id).unwrap();
    let got: State = listed
        .iter()
        .map(|(k, v)| (k.clone(), content_of(env, v)))
        .collect();
    assert_eq!(&got, expected, "version {id:?}");
    for (k, name) in KEYS.iter().enumerate() {
        let v = env
            .read(actor, &key(k), id)
            .unwrap()
            .map(|v| content_of(env, &v));
        assert_eq!(v.as_ref(), expected.get(&key(k)), "key {name} at {id:?}");
    }
}

/// Runs `steps` on a fresh environment of `backend`, checking every version against the model.
pub fn run(backend: &dyn Backend, steps: Vec<Step>) {
    let place = backend.fresh();
    let mut env = place.open(Options::default());
    let actor = ActorId::new("agent:model").unwrap();
    let root = env.head("main").unwrap();
    let mut m = Model {
        undo: HashMap::new(),
        states: HashMap::new(),
        parents: HashMap::new(),
        order: vec![],
        heads: BTreeMap::new(),
    };
    m.record(root, vec![], State::new());
    m.heads.insert("main".into(), root);

    for Step(step) in steps {
        match step {
            Move::Act { branch, changes } => {
                let b = BRANCHES[branch];
                let Some(head) = m.heads.get(b).copied() else {
                    continue;
                };
                let obs = env
                    .act_blocking(request(&actor, b, &changes).base(head))
                    .unwrap();
                let new = apply(&m.states[&head], &changes);
                assert_eq!(obs.noop, new == m.states[&head]);
                if !obs.noop {
                    m.record(obs.version, vec![head], new);
                    m.heads.insert(b.into(), obs.version);
                }
            }
            Move::Stale {
                branch,
                back,
                changes,
            } => {
                let b = BRANCHES[branch];
                let Some(head) = m.heads.get(b).copied() else {
                    continue;
                };
                let mut base = head;
                for _ in 0..back {
                    if let Some(p) = m.parents[&base].first() {
                        base = *p;
                    }
                }
                let moved: Vec<Key> = changes
                    .iter()
                    .map(|(k, _)| key(*k))
                    .filter(|k| m.states[&base].get(k) != m.states[&head].get(k))
                    .collect();
                match env.act_blocking(request(&actor, b, &changes).base(base)) {
                    Err(EnvError::Conflict(c)) => {
                        assert!(!moved.is_empty(), "conflict reported without overlap");
                        assert_eq!(c.keys, moved);
                        assert_eq!(c.current, head);
                        assert!(!c.ops.is_empty());
                    }
                    Ok(obs) => {
                        assert!(
                            moved.is_empty(),
                            "overlapping stale write accepted: {moved:?}"
                        );
                        let new = apply(&m.states[&head], &changes);
                        assert_eq!(
                            obs.rebased,
                            base != head && !obs.noop || (obs.noop && obs.rebased)
                        );
                        if !obs.noop {
                            m.record(obs.version, vec![head], new);
                            m.heads.insert(b.into(), obs.version);
                        }
                    }
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
            Move::Branch { name, from } => {
                let b = BRANCHES[name];
                let from = m.order[from % m.order.len()];
                match env.create_branch(&actor, b, &from) {
                    Ok(id) => {
                        assert!(!m.heads.contains_key(b));
                        let s = m.states[&from].clone();
                        m.record(id, vec![from], s);
                        m.heads.insert(b.into(), id);
                    }
                    Err(EnvError::BranchExists(_)) => assert!(m.heads.contains_key(b)),
                    Err(e) => panic!("unexpected error {e}"),
                }
            }
            Move::Merge { source, target } => {
                let (s, t) = (BRANCHES[source], BRANCHES[target]);
                let (Some(sh), Some(th)) = (m.heads.get(s).copied(), m.heads.get(t).copied())
                else {
                    continue;
                };
                if s == t {
                    continue;
                }
                let base = env
                    .common_ancestor(&th, &sh)
                    .unwrap()
                    .expect("all branches share the root");
                assert!(m.ancestors(th).contains(&base) && m.ancestors(sh).contains(&base));
                let out = env.merge(&actor, s, t, Intent::edit("merge")).unwrap();
                if out.noop {
                    assert!(m.ancestors(th).contains(&sh));
                    continue;
                }
                let (bs, os, ts) = (&m.states[&base], &m.states[&th], &m.states[&sh]);
                let mut expected = os.clone();
                let mut conflicts = vec![];
                for k in (0..KEYS.len()).map(key) {
                    let (b0, o, t0) = (bs.get(&k), os.get(&k), ts.get(&k));
                    if b0 == t0 || o == t0 {
                        continue;
                    }
                    if b0 == o {
                        match t0 {
                            Some(v) => expected.insert(k.clone(), v.clone()),
                            None => expected.remove(&k),
                        };
                    } else {
                        conflicts.push(k.clone());
                    }
                }
                assert_eq!(out.conflicts, conflicts);
                // Conflict objects carry both sides.
                for k in &conflicts {
                    let v = env.read(&actor, k, &out.version).unwrap().unwrap();
                    assert_eq!(v.meta.kind, EntryKind::Conflict);
                    let c = Conflict::from_value(&v).unwrap();
                    assert_eq!(
                        c.ours.value.map(|v| content_of(&env, &v)).as_ref(),
                        os.get(k)
                    );
                    assert_eq!(
                        c.theirs.value.map(|v| content_of(&env, &v)).as_ref(),
                        ts.get(k)
                    );
                    expected.insert(k.clone(), env.content(&v).unwrap());
                }
                m.record(out.version, vec![th, sh], expected);
                m.heads.insert(t.into(), out.version);
            }
            Move::Restore { branch, to } => {
                let b = BRANCHES[branch];
                let Some(head) = m.heads.get(b).copied() else {
                    continue;
                };
                let target = m.order[to % m.order.len()];
                let id = env
                    .restore(&actor, b, &target, Intent::edit("restore"))
                    .unwrap();
                let s = m.states[&target].clone();
                m.record(id, vec![head], s);
                m.heads.insert(b.into(), id);
            }
            Move::Undo { branch } => {
                let b = BRANCHES[branch];
                let Some(head) = m.heads.get(b).copied() else {
                    continue;
                };
                let mut next = m.undo[&head].clone();
                match (env.undo(&actor, b), next.undoable.pop()) {
                    (Ok(id), Some(undone)) => {
                        let before = m.parents[&undone][0];
                        let s = m.states[&before].clone();
                        m.record(id, vec![head], s);
                        next.redoable.push((head, undone));
                        m.undo.insert(id, next);
                        m.heads.insert(b.into(), id);
                    }
                    (Err(EnvError::NothingToUndo(_)), None) => {}
                    (got, expected) => panic!("undo: {got:?}, expected to undo {expected:?}"),
                }
            }
            Move::Redo { branch } => {
                let b = BRANCHES[branch];
                let Some(head) = m.heads.get(b).copied() else {
                    continue;
                };
                let mut next = m.undo[&head].clone();
                match (env.redo(&actor, b), next.redoable.pop()) {
                    (Ok(id), Some((back, undone))) => {
                        let s = m.states[&back].clone();
                        m.record(id, vec![head], s);
                        next.undoable.push(undone);
                        m.undo.insert(id, next);
                        m.heads.insert(b.into(), id);
                    }
                    (Err(EnvError::NothingToRedo(_)), None) => {}
                    (got, expected) => panic!("redo: {got:?}, expected to redo {expected:?}"),
                }
            }
            Move::Reopen => {
                drop(env);
                env = place.open(Options::default());
            }
        }
        for (b, h) in &m.heads {
            assert_eq!(env.head(b).unwrap(), *h, "head of {b}");
        }
    }
    for id in &m.order {
        check_version(&env, &actor, id, &m.states[id]);
    }
    let report = env.verify(&environment_core::ActorId::system()).unwrap();
    assert_eq!(report.ops as usize, m.order.len());
}
