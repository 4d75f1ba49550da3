//! The log's port: where the bodies open environments ([`Backend`], [`Place`]) and the bodies
//! about several handles on one log (as several processes or machines have): no lost update,
//! exact conflicts, and acts that build on each other.

use std::path::PathBuf;
use std::sync::Arc;

use environment_core::{
    ActRequest, ActorId, EnvError, Environment, Intent, Key, LocalEnvironment, Options, Value,
};

/// Where environments are kept: a store of the log (and what goes with it).
pub trait Backend: Sync {
    /// The place of a new, empty environment.
    fn fresh(&self) -> Box<dyn Place>;
    /// The place `described` ([`Place::describe`]) names, from another process: the same
    /// environment, left where it is when dropped.
    fn at(&self, described: &str) -> Box<dyn Place>;
}

/// One environment's place: opened again, it is the same environment (a reopen, another
/// process's or machine's handle).
pub trait Place {
    /// Opens the environment, with `options` and this place's stores.
    fn open(&self, options: Options) -> LocalEnvironment;
    /// What names this place to another process ([`Backend::at`]).
    fn describe(&self) -> String;
}

/// The embedded store: an environment in a temporary home.
pub struct Embedded;

/// A home: a temporary one the place removes when dropped, or one it was handed.
struct Home {
    path: PathBuf,
    _made: Option<tempfile::TempDir>,
}

impl Backend for Embedded {
    fn fresh(&self) -> Box<dyn Place> {
        let made = tempfile::tempdir().unwrap();
        Box::new(Home {
            path: made.path().to_owned(),
            _made: Some(made),
        })
    }

    fn at(&self, described: &str) -> Box<dyn Place> {
        Box::new(Home {
            path: PathBuf::from(described),
            _made: None,
        })
    }
}

impl Place for Home {
    fn open(&self, options: Options) -> LocalEnvironment {
        LocalEnvironment::open(&self.path, options).unwrap()
    }

    fn describe(&self) -> String {
        self.path.to_str().unwrap().to_owned()
    }
}

const TASKS: usize = 8;
const ROUNDS: usize = 40;

/// Eight tasks acting at once on overlapping and disjoint keys, through `handles` handles on
/// one environment (as many processes or machines): no lost update, and conflicts reported
/// exactly when keys overlap.
pub async fn no_lost_update_and_exact_conflicts(backend: &dyn Backend, handles: usize) {
    let place = backend.fresh();
    let envs: Vec<Arc<dyn Environment>> = (0..handles.max(1))
        .map(|_| Arc::new(place.open(Options::default())) as Arc<dyn Environment>)
        .collect();
    let env = envs[0].clone();
    let counter = Key::obj("counter").unwrap();
    let start = env.head("main").await.unwrap();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let env = envs[t % envs.len()].clone();
        let counter = counter.clone();
        tasks.push(tokio::spawn(async move {
            let actor = ActorId::new(format!("agent:{t}")).unwrap();
            let own = Key::fs(format!("task{t}/progress")).unwrap();
            let mut conflicts = 0;
            let mut last_seen = start;
            let mut rebased = 0;
            for round in 0..ROUNDS {
                // Disjoint key, based on the version this task last wrote: others have moved the
                // head meanwhile, so it is rebased, never refused.
                let obs = env
                    .act(
                        ActRequest::new(actor.clone(), Intent::edit("progress"))
                            .base(last_seen)
                            .put(own.clone(), Value::file(round.to_string())),
                    )
                    .await
                    .unwrap();
                last_seen = obs.version;
                rebased += usize::from(obs.rebased);
                // Overlapping key: read-modify-write with retry.
                loop {
                    let head = env.head("main").await.unwrap();
                    let n: u64 = match env.read(&actor, &counter, &head).await.unwrap() {
                        Some(v) => String::from_utf8(env.content(&v).await.unwrap())
                            .unwrap()
                            .parse()
                            .unwrap(),
                        None => 0,
                    };
                    let r = ActRequest::new(actor.clone(), Intent::edit("increment"))
                        .base(head)
                        .put(counter.clone(), Value::file((n + 1).to_string()));
                    match env.act(r).await {
                        Ok(_) => break,
                        Err(EnvError::Conflict(c)) => {
                            assert_eq!(c.keys, vec![counter.clone()]);
                            assert_ne!(c.current, head);
                            conflicts += 1;
                        }
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            (conflicts, rebased)
        }));
    }
    let (mut total_conflicts, mut total_rebased) = (0, 0);
    for t in tasks {
        let (c, r) = t.await.unwrap();
        total_conflicts += c;
        total_rebased += r;
    }
    assert!(total_rebased > 0, "the tasks never overlapped in time");
    let actor = ActorId::new("agent:check").unwrap();
    let head = env.head("main").await.unwrap();
    let v = env.read(&actor, &counter, &head).await.unwrap().unwrap();
    let n: usize = String::from_utf8(env.content(&v).await.unwrap())
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        n,
        TASKS * ROUNDS,
        "lost updates ({total_conflicts} conflicts retried)"
    );
    for t in 0..TASKS {
        let v = env
            .read(
                &actor,
                &Key::fs(format!("task{t}/progress")).unwrap(),
                &head,
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            env.content(&v).await.unwrap(),
            (ROUNDS - 1).to_string().into_bytes()
        );
    }
    env.verify(&environment_core::ActorId::system())
        .await
        .unwrap();
}

/// Two handles on one environment (as two processes or machines have) take turns acting on
/// one branch, each through the async path and the blocking one: each act builds on the
/// other's last one, and the log's sequence numbers grow with it (without duplicate; a store
/// may leave gaps).
pub async fn two_handles_taking_turns_build_on_each_other(backend: &dyn Backend) {
    let place = backend.fresh();
    let a = place.open(Options::default());
    let b = place.open(Options::default());
    let actor = ActorId::new("agent:turns").unwrap();
    let key = |i: usize| Key::fs(format!("turns/{i}.txt")).unwrap();
    let mut versions = Vec::new();
    for i in 0..60 {
        let env = if i % 2 == 0 { &a } else { &b };
        let req = ActRequest::new(actor.clone(), Intent::edit(format!("turn {i}")))
            .put(key(i), Value::file(i.to_string()));
        // Alternate between the writer thread (async) and the caller's thread (blocking) too.
        let obs = if i % 3 == 0 {
            env.act_blocking(req).unwrap()
        } else {
            Environment::act(env, req).await.unwrap()
        };
        assert!(!obs.rebased, "turn {i} was based on the head it saw");
        if let Some(prev) = versions.last() {
            assert_eq!(
                env.op(&obs.version).unwrap().parents,
                vec![*prev],
                "turn {i}"
            );
        }
        versions.push(obs.version);
    }
    let seqs: Vec<u64> = versions.iter().map(|v| a.op(v).unwrap().seq).collect();
    assert!(seqs.windows(2).all(|w| w[1] > w[0]), "{seqs:?}");
    for env in [&a, &b] {
        assert_eq!(env.head("main").unwrap(), *versions.last().unwrap());
        for i in 0..60 {
            let v = env.read(&actor, &key(i), versions.last().unwrap()).unwrap();
            assert_eq!(v, Some(Value::file(i.to_string())));
        }
        env.verify(&environment_core::ActorId::system()).unwrap();
    }
}

/// A version dropped by retention through one handle (and its tree collected) is dropped for
/// every other handle too: a read of it there is refused with [`EnvError::VersionDropped`],
/// never a storage error, and the versions around it still read. (A handle that read the
/// version before it was dropped may still answer from its cache of the tree.)
pub fn a_version_dropped_on_one_handle_is_dropped_on_every_other(backend: &dyn Backend) {
    let place = backend.fresh();
    let (a, b) = (
        place.open(Options::default()),
        place.open(Options::default()),
    );
    let actor = ActorId::new("agent:retention").unwrap();
    let key = Key::fs("notes.txt").unwrap();
    let versions: Vec<_> = (0..3)
        .map(|i| {
            a.act_blocking(
                ActRequest::new(actor.clone(), Intent::edit(format!("version {i}")))
                    .put(key.clone(), Value::file(format!("version {i}"))),
            )
            .unwrap()
            .version
        })
        .collect();
    let dropped = versions[1];
    assert_eq!(a.drop_versions(&actor, &[dropped]).unwrap(), 1);
    a.gc(&ActorId::system()).unwrap();
    for env in [&a, &b] {
        assert!(
            matches!(env.read(&actor, &key, &dropped), Err(EnvError::VersionDropped(v)) if v == dropped),
            "{:?}",
            env.read(&actor, &key, &dropped)
        );
        assert!(env.is_dropped(&dropped).unwrap());
        for (i, v) in [(0, versions[0]), (2, versions[2])] {
            assert_eq!(
                env.read(&actor, &key, &v).unwrap(),
                Some(Value::file(format!("version {i}")))
            );
        }
        env.verify(&ActorId::system()).unwrap();
    }
}

/// Two handles merge the same two branches into each other at the same moment, round after
/// round: each merge succeeds (a store that locks heads never has the two wait on each other
/// in a cycle), and both branches end holding every file of both.
pub fn opposite_merges_at_once_both_succeed(backend: &dyn Backend) {
    const ROUNDS: usize = 25;
    let place = backend.fresh();
    let (a, b) = (
        place.open(Options::default()),
        place.open(Options::default()),
    );
    let actor = ActorId::new("agent:merger").unwrap();
    let main = a.head("main").unwrap();
    for name in ["left", "right"] {
        a.create_branch(&actor, name, &main).unwrap();
    }
    for i in 0..ROUNDS {
        for (env, branch) in [(&a, "left"), (&b, "right")] {
            env.act_blocking(
                ActRequest::new(actor.clone(), Intent::edit("work"))
                    .on(branch)
                    .put(Key::fs(format!("{branch}/{i}")).unwrap(), Value::file("x")),
            )
            .unwrap();
        }
        let start = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            for (env, from, into) in [(&a, "left", "right"), (&b, "right", "left")] {
                let (start, actor) = (&start, &actor);
                s.spawn(move || {
                    start.wait();
                    let merged = env.merge(actor, from, into, Intent::edit("merge"));
                    assert!(merged.is_ok(), "round {i}, {from} into {into}: {merged:?}");
                });
            }
        });
    }
    for branch in ["left", "right"] {
        let head = a.head(branch).unwrap();
        for i in 0..ROUNDS {
            for side in ["left", "right"] {
                let key = Key::fs(format!("{side}/{i}")).unwrap();
                assert!(
                    a.read(&actor, &key, &head).unwrap().is_some(),
                    "{branch}: {key:?}"
                );
            }
        }
    }
    a.verify(&ActorId::system()).unwrap();
}
