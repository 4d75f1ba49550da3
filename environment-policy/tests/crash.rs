//! Crash safety: two child processes changing one stored policy at once are killed (SIGKILL)
//! at random moments; each time the store reopens, and every change it kept is whole and
//! counted once — the version counts exactly the relations and rules that survived, and the
//! closure agrees with the relations.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use environment_conformance::policy_port::{change_until_killed, whole_after_kills};
use environment_core::ManualClock;
use environment_policy::Policy;

const CHILD_ENV: &str = "ENVIRONMENT_POLICY_CRASH_CHILD";

/// The child's work: endless small changes, each one change = one version.
#[test]
fn crash_child() {
    let Ok(path) = std::env::var(CHILD_ENV) else {
        return;
    };
    let p = Policy::open(path.as_ref(), Arc::new(ManualClock::new(0))).unwrap();
    change_until_killed(&p, &std::process::id().to_string());
}

#[test]
fn killed_writers_leave_a_consistent_store() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.db");
    let exe = std::env::current_exe().unwrap();
    let mut last = 0;
    for round in 0..6u64 {
        let mut children: Vec<_> = (0..2)
            .map(|_| {
                Command::new(&exe)
                    .args(["--exact", "crash_child", "--test-threads=1", "--quiet"])
                    .env(CHILD_ENV, &path)
                    .stdout(Stdio::null())
                    .spawn()
                    .unwrap()
            })
            .collect();
        std::thread::sleep(Duration::from_millis(60 + 37 * round));
        for child in &mut children {
            child.kill().unwrap();
            child.wait().unwrap();
        }
        let p = Policy::open(&path, Arc::new(ManualClock::new(0))).unwrap();
        last = whole_after_kills(&p, round);
    }
    eprintln!("{last} changes survived six crashes");
    assert!(
        last > 6,
        "the children made changes before they were killed"
    );
}
