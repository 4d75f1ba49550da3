//! Crash safety: a child process changing a stored policy is killed (SIGKILL) at random moments;
//! each time the store reopens, and every change it kept is whole — the version counts exactly
//! the relations and rules that survived, and the closure agrees with the relations.
// Helpers outside #[test] functions panic on purpose: a broken fixture is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use environment_core::ManualClock;
use environment_policy::{Policy, Principal, ResourcePattern, Rule};

const CHILD_ENV: &str = "ENVIRONMENT_POLICY_CRASH_CHILD";

/// The child's work: endless small changes, each one change = one version.
#[test]
fn crash_child() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let p = Policy::open(path.as_ref(), Arc::new(ManualClock::new(0))).unwrap();
    let round = p.version();
    for i in 0.. {
        if i % 10 == 9 {
            let r = Rule::permit(
                &format!("r{round}-{i}"),
                Principal::parse(&format!("group:g{}", i % 7)).unwrap(),
                &["read"],
                ResourcePattern::path(&format!("p{i}/**")).unwrap(),
            );
            p.add_rule(r).unwrap();
        } else if i % 10 == 4 {
            p.add_member(&format!("group:g{round}-{i}"), &format!("group:g{}", i % 7))
                .unwrap();
        } else {
            p.add_member(&format!("agent:a{round}-{i}"), &format!("group:g{}", i % 7))
                .unwrap();
        }
    }
}

#[test]
fn killed_writers_leave_a_consistent_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.db");
    let exe = std::env::current_exe().unwrap();
    let mut last = 0;
    for round in 0..6u64 {
        let mut child = Command::new(&exe)
            .args(["--exact", "crash_child", "--test-threads=1", "--quiet"])
            .env(CHILD_ENV, &path)
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(60 + 37 * round));
        child.kill().unwrap();
        child.wait().unwrap();
        let p = Policy::open(&path, Arc::new(ManualClock::new(0))).unwrap();
        let relations = p.relations();
        let rules = p.rules().rules;
        assert_eq!(
            p.version() as usize,
            relations.len() + rules.len(),
            "round {round}: every kept change is whole, and only kept changes counted"
        );
        for (m, g) in &relations {
            assert!(p.is_member(m, g), "{m} in {g}");
        }
        // The store stays writable after the crash.
        last = p
            .add_member(&format!("agent:after-{round}"), "group:g0")
            .unwrap();
    }
    eprintln!("{last} changes survived six crashes");
    assert!(
        last > 6,
        "the children made changes before they were killed"
    );
}
