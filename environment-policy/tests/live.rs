//! The policy is read live: a change made through another handle of the same store (another
//! process: a human's `envctl policy` beside a running server) applies to the next check here —
//! a revoked rule, a granted approval, a quota use spent elsewhere.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use common::*;
use environment_core::{Action, Key, ManualClock, Resource};
use environment_policy::{GrantScope, Outcome, Policy, Reason};

const RULES: &str = r#"
[schema]
actions = ["deploy"]

[[rule]]
id = "agent-writes-src"
effect = "permit"
principal = "agent:a"
actions = ["write"]
resource = { path = "src/**" }

[[rule]]
id = "deploys-need-ann"
effect = "permit"
principal = "agent:a"
actions = ["deploy"]
resource = { environment = true }
approval_from = ["human:ann"]

[[rule]]
id = "one-post-an-hour"
effect = "permit"
principal = "agent:a"
actions = ["execute"]
resource = { endpoint = "https://api.example.com/posts" }
quota = { count = 1, window_secs = 3600 }
"#;

/// Two handles on one store file, as two processes would have.
fn two_handles() -> (tempfile::TempDir, Policy, Policy) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.db");
    let clock = Arc::new(ManualClock::new(10 * HOUR));
    let server = Policy::open(&path, clock.clone()).unwrap();
    let human = Policy::open(&path, clock).unwrap();
    (dir, server, human)
}

fn write_src() -> environment_core::AccessRequest {
    req(
        "agent:a",
        Action::Write,
        Resource::Key(Key::fs("src/a.rs").unwrap()),
    )
}

fn deploy() -> environment_core::AccessRequest {
    req(
        "agent:a",
        Action::Custom("deploy".into()),
        Resource::Environment,
    )
}

#[test]
fn rules_loaded_or_revoked_elsewhere_apply_to_the_next_check() {
    let (_dir, server, human) = two_handles();
    assert_eq!(server.check(&write_src()).outcome(), Outcome::Deny);
    human.load_rules(RULES).unwrap();
    assert!(
        server.check(&write_src()).is_allowed(),
        "a loaded rule applies"
    );
    assert_eq!(server.version(), human.version());
    let revoked = human.remove_rule("agent-writes-src").unwrap();
    let d = server.check(&write_src());
    assert_eq!(
        d.outcome(),
        Outcome::Deny,
        "a revoked rule no longer applies"
    );
    assert_eq!(d.policy_version(), revoked);
    // A change made here after one made there builds on it, not on what memory held.
    server.remove_rule("one-post-an-hour").unwrap();
    let rules = human.rules();
    assert!(rules.rules.iter().all(|r| r.id != "agent-writes-src"));
    assert!(rules.rules.iter().all(|r| r.id != "one-post-an-hour"));
    assert!(rules.rules.iter().any(|r| r.id == "deploys-need-ann"));
}

#[test]
fn an_approval_granted_elsewhere_is_usable_at_once() {
    let (_dir, server, human) = two_handles();
    human.load_rules(RULES).unwrap();
    let asked = server.check(&deploy());
    assert_eq!(asked.outcome(), Outcome::NeedsApproval);
    let filed = server.request_approval(&deploy()).unwrap();
    // The human sees the request filed by the server, and grants it.
    assert!(human.approvals().iter().any(|a| a.id == filed.id));
    human
        .grant(&filed.id, "human:ann", GrantScope::once())
        .unwrap();
    let mut with = deploy();
    with.context.approval = Some(filed.id.clone());
    let d = server.check(&with);
    assert!(d.is_allowed(), "{:?}", d.reason());
    assert_eq!(*d.reason(), Reason::Approved);
    // Used once, here: the human's handle knows it is used.
    assert_eq!(human.check(&with).outcome(), Outcome::NeedsApproval);
}

#[test]
fn a_quota_use_spent_elsewhere_counts_here() {
    let (_dir, server, human) = two_handles();
    human.load_rules(RULES).unwrap();
    let post = req(
        "agent:a",
        Action::Execute,
        Resource::Service("https://api.example.com/posts".into()),
    );
    assert!(human.check(&post).is_allowed());
    let d = server.check(&post);
    assert_eq!(
        d.outcome(),
        Outcome::Deny,
        "one use an hour, spent by the other handle"
    );
    assert!(matches!(d.reason(), Reason::QuotaExhausted { .. }));
}

/// Two handles on one file race for the last use of a quota and of an approval granted once:
/// exactly one of them has it each time.
#[test]
fn the_last_use_is_had_once_when_two_handles_race_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.db");
    let clock = ManualClock::new(10 * HOUR);
    let one = Policy::open(&path, Arc::new(clock.clone())).unwrap();
    let two = Policy::open(&path, Arc::new(clock.clone())).unwrap();
    environment_conformance::policy_port::the_last_use_is_had_once(&one, &two, &clock);
}

/// The storage port's test body, the one PostgreSQL runs, on the SQLite store.
#[test]
fn the_sqlite_store_behaves_as_the_port_says() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.db");
    let open = || -> Box<dyn environment_core::PolicyStore> {
        Box::new(environment_policy::SqlitePolicyStore::open(&path).unwrap())
    };
    environment_conformance::policy_port::the_port_behaves(&open);
}

/// A load made only on one version: refused once another handle made a version in between,
/// and nothing changes.
#[test]
fn a_load_on_a_version_that_moved_is_refused() {
    let (_dir, server, human) = two_handles();
    assert_eq!(server.load_rules_on(0, RULES).unwrap(), 1);
    let err = human.load_rules_on(0, "").unwrap_err();
    assert!(
        matches!(
            err,
            environment_policy::PolicyError::VersionMoved {
                expected: 0,
                current: 1
            }
        ),
        "{err}"
    );
    assert_eq!(human.rules().rules.len(), 3, "the first load stands");
    assert_eq!(human.version(), 1);
    assert_eq!(human.load_rules_on(1, "").unwrap(), 2);
    assert!(server.rules().rules.is_empty());
}
