//! The policy's storage port on PostgreSQL: the port's test body, and policies on two handles
//! (two machines) racing for a last use.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use environment_core::{ManualClock, PolicyStore};
use environment_policy::Policy;
use environment_postgres::{PgPolicyStore, PgStoreConfig};

fn open(server: &postgres::Config) -> PgPolicyStore {
    PgPolicyStore::open(server.clone(), PgStoreConfig::default()).expect("the store opens")
}

#[test]
fn the_postgres_store_behaves_as_the_port_says() {
    let Some(server) = common::fresh("policy_port") else {
        return;
    };
    let handle = || -> Box<dyn PolicyStore> { Box::new(open(&server)) };
    environment_conformance::policy_port::the_port_behaves(&handle);
}

#[test]
fn two_machines_have_a_last_use_once() {
    let Some(server) = common::fresh("policy_race") else {
        return;
    };
    let clock = ManualClock::new(36_000_000);
    let policy = || Policy::with_store(Box::new(open(&server)), Arc::new(clock.clone())).unwrap();
    let (one, two) = (policy(), policy());
    environment_conformance::policy_port::the_last_use_is_had_once(&one, &two, &clock);
}

/// A session the server ended (an operator, a restart, an idle timeout) is opened again: the
/// next check reads the policy as it is, and the next write goes through.
#[test]
fn a_session_the_server_ended_is_opened_again() {
    let Some(server) = common::fresh("policy_reconnect") else {
        return;
    };
    let config = PgStoreConfig {
        application_name: "policy-reconnect-test".into(),
        ..PgStoreConfig::default()
    };
    let clock = ManualClock::new(36_000_000);
    let store = PgPolicyStore::open(server.clone(), config).unwrap();
    let policy = Policy::with_store(Box::new(store), Arc::new(clock)).unwrap();
    policy.add_member("agent:a", "group:g").unwrap();
    let terminate = || {
        let mut admin = server.connect(postgres::NoTls).unwrap();
        let ended = admin
            .query_one(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
                 WHERE application_name = 'policy-reconnect-test'",
                &[],
            )
            .unwrap()
            .get::<_, i64>(0);
        assert_eq!(ended, 1, "the store's one session");
    };
    terminate();
    assert_eq!(policy.groups_of("agent:a"), vec!["group:g".to_owned()]);
    let v = policy.version();
    terminate();
    assert_eq!(policy.add_member("agent:b", "group:g").unwrap(), v + 1);
    terminate();
    let other = Policy::with_store(
        Box::new(PgPolicyStore::open(server.clone(), PgStoreConfig::default()).unwrap()),
        Arc::new(ManualClock::new(0)),
    )
    .unwrap();
    assert!(other.is_member("agent:b", "group:g"));
}

/// An environment governed by the shared policy acts from async code (a runtime on the
/// calling thread): each decision reads the store without blocking the runtime's own thread
/// into a refusal, and a rule revoked on another machine refuses the next act.
#[test]
fn an_environment_acting_from_async_code_is_governed_by_the_shared_policy() {
    let Some(server) = common::fresh("policy_async") else {
        return;
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(act_from_async_code(server));
}

async fn act_from_async_code(server: postgres::Config) {
    use environment_core::{
        ActRequest, ActorId, Environment, Intent, Key, LocalEnvironment, Options, Value,
    };
    let clock = ManualClock::new(36_000_000);
    let policy = |clock: &ManualClock| {
        Policy::with_store(Box::new(open(&server)), Arc::new(clock.clone())).unwrap()
    };
    let admin = policy(&clock);
    admin
        .load_rules(
            "[[rule]]\nid = \"w\"\neffect = \"permit\"\nprincipal = \"agent:a\"\nactions = [\"write\", \"read\"]\nresource = { path = \"src/**\" }\n",
        )
        .unwrap();
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(
        home.path(),
        Options {
            authorizer: Arc::new(policy(&clock)),
            ..Options::default()
        },
    )
    .unwrap();
    let agent = ActorId::new("agent:a").unwrap();
    let write = |name: &str| {
        ActRequest::new(agent.clone(), Intent::edit("write"))
            .put(Key::fs(name).unwrap(), Value::file("x"))
    };
    let env: &dyn Environment = &env;
    env.act(write("src/a.rs")).await.expect("permitted");
    env.act(write("README.md"))
        .await
        .expect_err("no rule permits it");
    admin.remove_rule("w").unwrap();
    env.act(write("src/b.rs"))
        .await
        .expect_err("revoked on the other machine");
}

const CRASH_CHILD: &str = "ENVIRONMENT_PG_POLICY_CRASH_SCHEMA";

/// The work of a killed machine: endless small changes to the shared policy.
#[test]
fn crash_child() {
    let Ok(schema) = std::env::var(CRASH_CHILD) else {
        return;
    };
    let server = common::server_in(&schema);
    let p = Policy::with_store(Box::new(open(&server)), Arc::new(ManualClock::new(0))).unwrap();
    environment_conformance::policy_port::change_until_killed(&p, &std::process::id().to_string());
}

/// Two machines changing the shared policy at once are killed (SIGKILL) at random moments,
/// mid-transaction or not: every change the database kept is whole and counted once, and it
/// takes changes again.
#[test]
fn killed_machines_leave_a_consistent_policy() {
    let Some(server) = common::fresh("policy_crash") else {
        return;
    };
    let schema = common::schema_of(&server);
    let exe = std::env::current_exe().unwrap();
    let mut last = 0;
    for round in 0..5u64 {
        let mut children: Vec<_> = (0..2)
            .map(|_| {
                std::process::Command::new(&exe)
                    .args(["--exact", "crash_child", "--test-threads=1", "--quiet"])
                    .env(CRASH_CHILD, &schema)
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(300 + 97 * round));
        for child in &mut children {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        let p = Policy::with_store(Box::new(open(&server)), Arc::new(ManualClock::new(0))).unwrap();
        last = environment_conformance::policy_port::whole_after_kills(&p, round);
    }
    eprintln!("{last} changes survived five crashes");
    assert!(
        last > 5,
        "the machines made changes before they were killed"
    );
}
