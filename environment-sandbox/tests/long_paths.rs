//! Paths longer than one system call takes (`PATH_MAX`, 4096 bytes) are captured, watched and
//! restored like any other; a path beyond the key limit is refused alone and never stops a
//! capture.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;

use common::{always, both, bottom, deep, name, view};
use environment_core::{ActorId, Intent, IntentKind, LocalEnvironment, OpFlags, Options};
use environment_sandbox::{Tracker, TrackerConfig};

fn open(root: &Path, home: &Path) -> (LocalEnvironment, Tracker) {
    let env = LocalEnvironment::open(home, Options::default()).unwrap();
    let mut cfg = TrackerConfig::new(root, ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    let t = Tracker::open(env.clone(), cfg).unwrap();
    (env, t)
}

fn step(t: &Tracker) {
    t.capture_now(Intent::new(IntentKind::Command, "step"), OpFlags::COMMAND)
        .unwrap();
}

#[test]
fn paths_beyond_path_max_are_captured_watched_and_restored() {
    both(
        "paths_beyond_path_max_are_captured_watched_and_restored",
        always,
        |dir| {
            let (work, home) = (dir.join("work"), dir.join("home"));
            std::fs::create_dir(&work).unwrap();
            std::fs::write(work.join("top.txt"), "top\n").unwrap();
            // 30 levels of 200-byte names: about 6,000 bytes, beyond PATH_MAX.
            let rel = deep(&work, 30, b"first\n");
            assert!(rel.len() > 4096);
            let (env, t) = open(&work, &home);
            let first = env.head("main").unwrap();
            let key = |v| {
                view(&env, &v)
                    .into_iter()
                    .find(|(k, _)| k == &rel)
                    .map(|(_, e)| e)
            };
            assert!(
                key(first).is_some(),
                "the opening rescan recorded the deep file"
            );
            // The watcher sees a change down there (its directories are watched through
            // descriptors), and a restore writes it back.
            deep(&work, 30, b"second\n");
            step(&t);
            let second = env.head("main").unwrap();
            assert_ne!(second, first, "the change deep down was captured");
            t.restore(
                &ActorId::new("agent:t").unwrap(),
                &first,
                Intent::new(IntentKind::Restore, "back"),
            )
            .unwrap();
            assert_eq!(bottom(&work, &rel).as_deref(), Some(&b"first\n"[..]));
            // Removed, and restored from nothing: every directory on the way is made again.
            std::fs::remove_dir_all(work.join(name(0))).unwrap();
            step(&t);
            assert_eq!(bottom(&work, &rel), None);
            t.restore(
                &ActorId::new("agent:t").unwrap(),
                &second,
                Intent::new(IntentKind::Restore, "forward"),
            )
            .unwrap();
            assert_eq!(bottom(&work, &rel).as_deref(), Some(&b"second\n"[..]));
            assert!(t.refused().is_empty());
        },
    );
}

#[test]
fn a_path_beyond_the_key_limit_is_refused_alone() {
    both(
        "a_path_beyond_the_key_limit_is_refused_alone",
        always,
        |dir| {
            let (work, home) = (dir.join("work"), dir.join("home"));
            std::fs::create_dir(&work).unwrap();
            // About 18,000 bytes: beyond the key limit (16 KiB).
            let rel = deep(&work, 90, b"too deep\n");
            assert!(rel.len() > environment_core::key::MAX_KEY_LEN);
            std::fs::write(work.join("ok.txt"), "ok\n").unwrap();
            let (env, t) = open(&work, &home);
            let head = env.head("main").unwrap();
            let seen = view(&env, &head);
            assert!(seen.contains_key("ok.txt"), "the rest was captured");
            assert!(!seen.contains_key(&rel));
            assert!(
                t.refused()
                    .iter()
                    .any(|(p, _)| p.to_string_lossy().len() > 16 * 1024),
                "the refusal is named: {:?}",
                t.refused().len()
            );
            // Later captures go on, and the tree on disk keeps the path.
            std::fs::write(work.join("later.txt"), "later\n").unwrap();
            step(&t);
            let now = view(&env, &env.head("main").unwrap());
            assert!(now.contains_key("later.txt"));
            assert_eq!(bottom(&work, &rel).as_deref(), Some(&b"too deep\n"[..]));
        },
    );
}
