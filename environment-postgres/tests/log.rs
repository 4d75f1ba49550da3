//! The log on PostgreSQL runs the bodies every store of the log runs (`environment-conformance`):
//! the model test, several handles (as several machines) acting on one log at once, bad input,
//! the merge laws and a process SIGKILLed mid-work; and a log tampered with in the database is
//! caught by `verify`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use environment_conformance::log_port::{self, Backend, Place};
use environment_conformance::{log_crash, log_model, log_refusals, merge_laws};
use environment_core::{
    ActRequest, ActorId, EnvError, Intent, Key, LocalEnvironment, Options, Value,
};
use environment_postgres::{PgEffectStore, PgLogStore, PgStoreConfig};
use proptest::prelude::*;

/// Environments whose log and effect log are in a new schema of the test server; each handle
/// keeps its blobs in the place's home.
struct Postgres;

struct Schema {
    server: postgres::Config,
    home: PathBuf,
    _made: Option<tempfile::TempDir>,
}

impl Backend for Postgres {
    fn fresh(&self) -> Box<dyn Place> {
        // The helper's client blocks: off the async test's runtime.
        let server = std::thread::scope(|s| s.spawn(|| common::fresh("log")).join())
            .unwrap()
            .expect("the test server");
        let made = tempfile::tempdir().unwrap();
        Box::new(Schema {
            server,
            home: made.path().to_owned(),
            _made: Some(made),
        })
    }

    fn at(&self, described: &str) -> Box<dyn Place> {
        let (schema, home) = described.split_once(' ').expect("schema and home");
        Box::new(Schema {
            server: common::server_in(schema),
            home: PathBuf::from(home),
            _made: None,
        })
    }
}

impl Place for Schema {
    fn open(&self, options: Options) -> LocalEnvironment {
        let config = PgStoreConfig::default();
        let effects = PgEffectStore::open(self.server.clone(), config.clone()).unwrap();
        LocalEnvironment::open(
            &self.home,
            Options {
                log_store: Some(PgLogStore::opener_on(self.server.clone(), &config)),
                effects: Some(Arc::new(effects)),
                ..options
            },
        )
        .unwrap()
    }

    fn describe(&self) -> String {
        format!(
            "{} {}",
            common::schema_of(&self.server),
            self.home.to_str().unwrap()
        )
    }
}

/// Whether the test server is there (a failure under `CI=true` when it is not).
fn server() -> bool {
    environment_conformance::prerequisite::postgres().is_some()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    #[test]
    fn every_read_at_every_version_matches_the_model(steps in proptest::collection::vec(log_model::step(), 1..40)) {
        if server() {
            log_model::run(&Postgres, steps);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tasks_on_one_handle_lose_no_update() {
    if server() {
        log_port::no_lost_update_and_exact_conflicts(&Postgres, 1).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_machines_acting_at_once_lose_no_update() {
    if server() {
        log_port::no_lost_update_and_exact_conflicts(&Postgres, 2).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_machines_taking_turns_build_on_each_other() {
    if server() {
        log_port::two_handles_taking_turns_build_on_each_other(&Postgres).await;
    }
}

#[test]
fn unknown_versions_and_branches_are_refused() {
    if server() {
        log_refusals::unknown_versions_and_branches(&Postgres);
    }
}

#[test]
fn oversized_and_duplicate_requests_are_refused() {
    if server() {
        log_refusals::oversized_and_duplicate_requests(&Postgres);
    }
}

#[test]
fn denied_actions_change_nothing() {
    if server() {
        log_refusals::denied_actions_change_nothing(&Postgres);
    }
}

#[test]
fn opposite_merges_at_once_both_succeed() {
    if server() {
        log_port::opposite_merges_at_once_both_succeed(&Postgres);
    }
}

#[test]
fn retention_protects_drops_and_collects() {
    if server() {
        environment_conformance::retention::protected_dropped_and_collected(&Postgres);
    }
}

#[test]
fn stale_writes_conflict_or_are_kept_as_refused() {
    if server() {
        log_refusals::stale_writes(&Postgres);
    }
}

#[test]
fn effect_misuse_is_refused() {
    if server() {
        log_refusals::effect_misuse(&Postgres);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]
    #[test]
    fn the_merge_laws_hold(
        base in merge_laws::changes(),
        ours in merge_laws::changes(),
        theirs in merge_laws::changes(),
    ) {
        if server() {
            merge_laws::hold(&Postgres, &base, &ours, &theirs)?;
        }
    }
}

#[test]
fn crash_child_entry() {
    log_crash::child_entry(&Postgres);
}

#[test]
fn a_machine_killed_at_random_moments_loses_nothing_it_acknowledged() {
    if server() {
        log_crash::killed_at_random_moments(&Postgres, "crash_child_entry", 20);
    }
}

/// An operation's record rewritten in the database (its actor changed, its id kept) is caught
/// by `verify` from any handle, which names the operation.
#[test]
fn a_log_tampered_with_in_the_database_is_caught_by_verify() {
    if !server() {
        return;
    }
    let place = Postgres.fresh();
    let env = place.open(Options::default());
    let actor = ActorId::new("agent:x").unwrap();
    let versions: Vec<_> = (0..3)
        .map(|i| {
            env.act_blocking(
                ActRequest::new(actor.clone(), Intent::edit("x"))
                    .put(Key::fs(format!("k{i}")).unwrap(), Value::file("v")),
            )
            .unwrap()
            .version
        })
        .collect();
    let second = env.op(&versions[1]).unwrap();
    env.verify(&ActorId::system()).unwrap();
    let described = place.describe();
    let (schema, _) = described.split_once(' ').unwrap();
    let mut client = common::server_in(schema).connect(postgres::NoTls).unwrap();
    let record: Vec<u8> = client
        .query_one(
            "SELECT record FROM log_ops WHERE id = $1",
            &[&second.id.0.0.as_slice()],
        )
        .unwrap()
        .get(0);
    let pos = record.windows(5).position(|w| w == b"agent").unwrap();
    let mut forged = record.clone();
    forged[pos] = b'A';
    client
        .execute(
            "UPDATE log_ops SET record = $1 WHERE id = $2",
            &[&forged, &second.id.0.0.as_slice()],
        )
        .unwrap();
    let other = place.open(Options::default());
    for env in [&env, &other] {
        match env.verify(&ActorId::system()) {
            Err(EnvError::Integrity { at, .. }) => {
                assert!(at.contains(&format!("#{}", second.seq)), "{at}")
            }
            other => panic!("tampering not detected: {other:?}"),
        }
    }
}

#[test]
fn a_version_dropped_on_one_machine_is_dropped_on_every_other() {
    if server() {
        log_port::a_version_dropped_on_one_handle_is_dropped_on_every_other(&Postgres);
    }
}
