//! Eight tasks acting at once on overlapping and disjoint keys: no lost update, and conflicts
//! reported exactly when keys overlap.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use environment_core::{
    ActRequest, ActorId, EnvError, Environment, Intent, Key, LocalEnvironment, Options, Value,
};

const TASKS: usize = 8;
const ROUNDS: usize = 40;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_lost_update_and_exact_conflicts() {
    let home = tempfile::tempdir().unwrap();
    let env: Arc<dyn Environment> =
        Arc::new(LocalEnvironment::open(home.path(), Options::default()).unwrap());
    let counter = Key::obj("counter").unwrap();
    let start = env.head("main").await.unwrap();
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let env = env.clone();
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
    env.verify().await.unwrap();
}
