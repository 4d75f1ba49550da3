//! Forks: a shared materialized base, overlay working trees, captures from the upper layer.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::Command;

use common::{both, disk, no_isolation, no_skip, view, write};
use environment_core::{ActorId, EnvError, Intent, IntentKind, LocalEnvironment, OpFlags, Options};
use environment_sandbox::{ForkConfig, Forks, SandboxError, Tracker, TrackerConfig, WorkingTree};

/// What the "agent" does in a working tree: deletes, replaces a directory, appends, changes a
/// mode, makes a symlink and a deep new directory.
const EDITS: &str = "rm a.txt && rm -r dir && mkdir dir && echo new > dir/x && \
                     echo more >> b.txt && chmod 755 c.sh && ln -s b.txt link2 && \
                     mkdir -p deep/er && echo d > deep/er/f && rm keep/k";

fn workspace(root: &Path) {
    write(root, "a.txt", b"alpha\n");
    write(root, "b.txt", b"bravo\n");
    write(root, "c.sh", b"#!/bin/sh\necho c\n");
    write(root, "dir/1", b"one\n");
    write(root, "dir/2", &vec![7u8; 100_000]);
    write(root, "keep/k", b"k\n");
    std::os::unix::fs::symlink("a.txt", root.join("link")).unwrap();
    std::fs::create_dir(root.join("empty")).unwrap();
}

/// Runs `script` in the overlay of `tree`, mounted in a fresh user and mount namespace (what
/// the launcher does for a sandboxed program).
fn in_overlay(tree: &WorkingTree, mnt: &Path, script: &str) {
    std::fs::create_dir_all(mnt).unwrap();
    let mount = format!(
        "mount -t overlay overlay -o lowerdir={},upperdir={},workdir={},userxattr {} && cd {} && {}",
        tree.lower.display(),
        tree.upper.display(),
        tree.work.display(),
        mnt.display(),
        mnt.display(),
        script
    );
    let out = Command::new("unshare")
        .args(["-Urm", "sh", "-c", &mount])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the edits failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn scenario(dir: &Path) {
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    workspace(&work);
    let env = LocalEnvironment::open(dir.join("home"), Options::default()).unwrap();
    let mut cfg = TrackerConfig::new(&work, ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    let tracker = Tracker::open(env.clone(), cfg).unwrap();
    tracker
        .capture_now(
            Intent::new(IntentKind::Capture, "start"),
            OpFlags::AUTO_CAPTURE,
        )
        .unwrap();
    let base = env.head("main").unwrap();
    let agent = ActorId::new("agent:forker").unwrap();

    let forks = Forks::open(env.clone(), ForkConfig::default()).unwrap();
    let trees = forks.fork(&agent, &base, 3, "try").unwrap();
    assert_eq!(trees.len(), 3);
    for t in &trees {
        assert_eq!(view(&env, &env.head(&t.branch).unwrap()), view(&env, &base));
        assert_eq!(t.lower, trees[0].lower, "one shared base");
        assert!(std::fs::read_dir(&t.upper).unwrap().next().is_none());
    }
    // The base holds the version exactly.
    assert_eq!(disk(&trees[0].lower, &no_skip), view(&env, &base));

    // Forking again under a taken name changes nothing.
    let err = forks.fork(&agent, &base, 2, "try").unwrap_err();
    assert!(
        matches!(err, SandboxError::Env(EnvError::BranchExists(_))),
        "{err}"
    );

    in_overlay(&trees[0], &dir.join("mnt"), EDITS);
    // The same edits on a plain copy say what the fork must now hold.
    let copy = dir.join("copy");
    let cp = Command::new("cp")
        .args(["-a", &format!("{}/.", trees[0].lower.display())])
        .arg(&copy)
        .status()
        .unwrap();
    assert!(cp.success());
    let edited = Command::new("sh")
        .args(["-c", EDITS])
        .current_dir(&copy)
        .status()
        .unwrap();
    assert!(edited.success());

    let obs = forks
        .capture(
            &trees[0],
            &agent,
            Intent::new(IntentKind::Command, "the edits"),
            OpFlags::COMMAND,
            Vec::new(),
        )
        .unwrap()
        .expect("the fork changed things");
    assert_eq!(env.head(&trees[0].branch).unwrap(), obs.version);
    assert_eq!(view(&env, &obs.version), disk(&copy, &no_skip));
    let op = env.op(&obs.version).unwrap();
    assert_eq!(op.actor, agent);
    assert_eq!(op.intent.text, "the edits");
    // The base, main and the other forks are untouched.
    assert_eq!(disk(&trees[0].lower, &no_skip), view(&env, &base));
    assert_eq!(env.head("main").unwrap(), base);
    let other = env.head(&trees[1].branch).unwrap();
    assert_eq!(view(&env, &other), view(&env, &base));
    // Capturing again without new changes records nothing.
    let again = forks
        .capture(
            &trees[0],
            &agent,
            Intent::new(IntentKind::Command, "nothing"),
            OpFlags::COMMAND,
            Vec::new(),
        )
        .unwrap();
    assert!(again.is_none(), "{again:?}");
    for t in &trees {
        forks.remove(t).unwrap();
        assert!(!t.upper.exists());
    }
    env.verify_deep(&environment_core::ActorId::system())
        .unwrap();
}

#[test]
fn fork_and_capture() {
    both("fork_and_capture", no_isolation, scenario);
}

#[test]
fn an_unknown_version_forks_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(dir.path().join("home"), Options::default()).unwrap();
    let forks = Forks::open(env.clone(), ForkConfig::default()).unwrap();
    let other = LocalEnvironment::open(dir.path().join("other"), Options::default()).unwrap();
    let foreign = other.head("main").unwrap();
    let agent = ActorId::new("agent:forker").unwrap();
    assert!(forks.fork(&agent, &foreign, 2, "x").is_err());
    assert_eq!(env.branches().unwrap().len(), 1);
}

/// A materialization killed midway leaves only a temporary directory, which never counts as a
/// base and is swept once its process is gone.
#[test]
fn a_half_made_base_is_swept_and_never_used() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    write(&work, "a.txt", b"alpha\n");
    let env = LocalEnvironment::open(dir.path().join("home"), Options::default()).unwrap();
    let mut cfg = TrackerConfig::new(&work, ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    let _tracker = Tracker::open(env.clone(), cfg).unwrap();
    let base = env.head("main").unwrap();
    // What a killed process (no such pid) left while writing this version's base.
    let half = dir
        .path()
        .join(format!("home/forks/base/.tmp-{base}-4194999"));
    std::fs::create_dir_all(&half).unwrap();
    std::fs::write(half.join("a.txt"), b"al").unwrap();
    let forks = Forks::open(env.clone(), ForkConfig::default()).unwrap();
    assert!(!half.exists(), "the leftover was swept");
    let lower = forks.materialize(&base).unwrap();
    assert_eq!(disk(&lower, &no_skip), view(&env, &base));
}
