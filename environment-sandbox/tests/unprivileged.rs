//! The capture/restore scenario as an unprivileged user. Run as root (as CI does), the test
//! re-executes itself as uid/gid 65534 with `setpriv`; run as anyone else, it runs as is.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{always, as_nobody, disk, no_skip, view, write};
use environment_core::{ActorId, Intent, IntentKind, LocalEnvironment, OpFlags, Options};
use environment_sandbox::{Tracker, TrackerConfig};

/// Capture, break, restore, check — the whole cycle.
fn scenario(dir: &Path) {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    write(&work, "src/main.rs", b"fn main() {}\n");
    write(&work, "bin/run", b"#!/bin/sh\n");
    std::fs::set_permissions(
        work.join("bin/run"),
        std::fs::Permissions::from_mode(0o4755),
    )
    .unwrap();
    write(&work, "data/big", &vec![3u8; 200_000]);
    let env = LocalEnvironment::open(dir.join("home"), Options::default()).unwrap();
    let mut cfg = TrackerConfig::new(&work, ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    let tracker = Tracker::open(env.clone(), cfg).unwrap();
    let good = env.head("main").unwrap();
    let expected = disk(&work, &no_skip);
    std::fs::remove_dir_all(work.join("src")).unwrap();
    std::fs::write(work.join("data/big"), b"clobbered").unwrap();
    std::fs::set_permissions(work.join("bin/run"), std::fs::Permissions::from_mode(0o600)).unwrap();
    tracker
        .capture_now(Intent::new(IntentKind::Command, "break"), OpFlags::COMMAND)
        .unwrap()
        .unwrap();
    tracker
        .restore(
            &ActorId::new("agent:x").unwrap(),
            &good,
            Intent::new(IntentKind::Restore, "fix"),
        )
        .unwrap();
    assert_eq!(disk(&work, &no_skip), expected);
    assert_eq!(view(&env, &env.head("main").unwrap()), expected);
    env.verify_deep(&environment_core::ActorId::system())
        .unwrap();
}

#[test]
fn capture_and_restore_as_an_unprivileged_user() {
    as_nobody(
        "capture_and_restore_as_an_unprivileged_user",
        always,
        scenario,
    );
}
