//! The effect log's port on PostgreSQL: the port's test body (the one the embedded store runs),
//! and two environments on two machines, one shared effect log, racing to begin one effect.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use environment_core::{EffectStore, LocalEnvironment, Options};
use environment_postgres::{PgEffectStore, PgStoreConfig};

fn open(server: &postgres::Config) -> Arc<dyn EffectStore> {
    Arc::new(
        PgEffectStore::open(server.clone(), PgStoreConfig::default()).expect("the store opens"),
    )
}

#[test]
fn the_postgres_store_behaves_as_the_port_says() {
    let Some(server) = common::fresh("effect_port") else {
        return;
    };
    environment_conformance::effect_port::the_port_behaves(open(&server).as_ref());
}

#[test]
fn two_machines_begin_an_effect_once() {
    let Some(server) = common::fresh("effect_race") else {
        return;
    };
    // Two homes (two machines' environments), one effect log.
    let machine = |home: &tempfile::TempDir| {
        let options = Options {
            effects: Some(open(&server)),
            ..Options::default()
        };
        LocalEnvironment::open(home.path(), options).unwrap()
    };
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (one, two) = (machine(&a), machine(&b));
    environment_conformance::effect_port::one_begin_wins(&one, &two);
    assert!(
        !one.effects().unwrap().is_empty() && one.effects().unwrap() == two.effects().unwrap(),
        "one log, read alike from both"
    );
}

const CRASH_CHILD: &str = "ENVIRONMENT_PG_EFFECTS_CRASH";

/// A machine's work until it is killed: effects begun under keys drawn from a small set,
/// performed (logged) only when begun as new, then completed; what was acknowledged is said.
#[test]
fn crash_child() {
    use std::io::Write;
    let Ok(spec) = std::env::var(CRASH_CHILD) else {
        return;
    };
    let (schema, dir) = spec.split_once(':').unwrap();
    let server = common::server_in(schema);
    let home = tempfile::tempdir().unwrap();
    let options = Options {
        effects: Some(open(&server)),
        ..Options::default()
    };
    let env = LocalEnvironment::open(home.path(), options).unwrap();
    let actor = environment_core::ActorId::new("agent:crash").unwrap();
    let mut performed = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(std::path::Path::new(dir).join("performed.log"))
        .unwrap();
    let out = std::io::stdout();
    loop {
        let key = format!("e{}", rand::random_range(0..40));
        match env
            .effect_begin(&actor, &key, "svc", key.as_bytes())
            .unwrap()
        {
            environment_core::BeginOutcome::New(rec) => {
                // One write, so a kill leaves no half line; synced before it is completed.
                performed.write_all(format!("{key}\n").as_bytes()).unwrap();
                performed.sync_data().unwrap();
                env.effect_complete(&actor, rec.id, b"ok").unwrap();
                writeln!(out.lock(), "done {key}").unwrap();
            }
            environment_core::BeginOutcome::AlreadyDone(_) => {
                writeln!(out.lock(), "done {key}").unwrap();
            }
            _ => {}
        }
    }
}

/// Two machines on one shared effect log, SIGKILLed at random moments, again and again: no
/// effect is performed twice by either, every one performed has its record, and every one
/// acknowledged as done is done.
#[test]
fn machines_killed_mid_effect_never_perform_one_twice() {
    use std::io::BufRead;
    let Some(server) = common::fresh("effects_crash") else {
        return;
    };
    let schema = common::schema_of(&server);
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let store = open(&server);
    let mut acked = std::collections::BTreeSet::new();
    for _ in 0..8 {
        let children: Vec<_> = (0..2)
            .map(|_| {
                let mut child = std::process::Command::new(&exe)
                    .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
                    .env(CRASH_CHILD, format!("{schema}:{}", dir.path().display()))
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap();
                let stdout = child.stdout.take().unwrap();
                let reader = std::thread::spawn(move || {
                    std::io::BufReader::new(stdout)
                        .lines()
                        .map_while(Result::ok)
                        .collect::<Vec<_>>()
                });
                (child, reader)
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(rand::random_range(
            100..400,
        )));
        for (mut child, reader) in children {
            child.kill().unwrap();
            child.wait().unwrap();
            for line in reader.join().unwrap() {
                if let Some(key) = line.strip_prefix("done ") {
                    acked.insert(key.to_owned());
                }
            }
        }
        for key in &acked {
            let r = store.by_key(key).unwrap().expect("an acknowledged effect");
            assert_eq!(r.state, environment_core::EffectState::Done, "{key}");
        }
        let log = std::fs::read_to_string(dir.path().join("performed.log")).unwrap_or_default();
        let mut times = std::collections::HashMap::new();
        for key in log.lines() {
            *times.entry(key).or_insert(0) += 1;
            assert!(
                store.by_key(key).unwrap().is_some(),
                "{key} performed without a record"
            );
        }
        assert!(
            times.values().all(|n| *n == 1),
            "an effect performed twice: {times:?}"
        );
    }
    assert!(
        !acked.is_empty(),
        "the machines made progress before they were killed"
    );
}
