//! Several working copies of one branch (one per machine, here two directories over one home):
//! each is captured on its own and committed based on the version its tree holds, so a copy
//! that lacks what another committed never records deleting it; each receives the others'
//! changes; a path changed in two copies keeps the first commit and the second change as
//! refused (its content kept, the tree put back), and so is a directory removed in one while
//! the other puts something under it; writing the others' removal of a directory keeps what
//! was made in it here and never recorded; a new copy is attached to an empty directory only,
//! and holds the head when it returns.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{bottom, deep, disk, no_skip, view, write};
use environment_core::{ActorId, ErrorKind, Intent, IntentKind, LocalEnvironment, OpFlags};
use environment_sandbox::{SandboxError, Tracker, TrackerConfig};

fn config(root: &std::path::Path, who: &str) -> TrackerConfig {
    let mut cfg = TrackerConfig::new(root, ActorId::new(who).unwrap());
    cfg.auto = false;
    cfg
}

fn capture(t: &Tracker) -> Option<environment_core::Observation> {
    t.capture_now(Intent::new(IntentKind::Command, "step"), OpFlags::COMMAND)
        .unwrap()
}

/// Asserts that the tree of `t` is exactly the branch's head, and that it says it holds it.
fn holds_head(env: &LocalEnvironment, t: &Tracker) {
    let head = env.head("main").unwrap();
    assert_eq!(
        disk(t.root(), &no_skip),
        view(env, &head),
        "{}",
        t.root().display()
    );
    assert_eq!(t.holds().unwrap(), head);
}

/// Machine A's copy with two files, and machine B's copy attached to it.
struct Two {
    _dirs: [tempfile::TempDir; 3],
    env: LocalEnvironment,
    a: Tracker,
    b: Tracker,
}

fn two() -> Two {
    let (home, wa, wb) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    write(wa.path(), "src/lib.rs", b"pub fn a() {}\n");
    write(wa.path(), "README", b"shared\n");
    let env = LocalEnvironment::open(home.path(), environment_core::Options::default()).unwrap();
    let a = Tracker::open(env.clone(), config(wa.path(), "agent:a")).unwrap();
    let b = Tracker::attach(env.clone(), config(&wb.path().join("copy"), "agent:b")).unwrap();
    Two {
        _dirs: [home, wa, wb],
        env,
        a,
        b,
    }
}

#[test]
fn an_attached_copy_holds_the_head_and_records_nothing() {
    let t = two();
    let ops = t.env.verify(&ActorId::system()).unwrap().ops;
    holds_head(&t.env, &t.b);
    holds_head(&t.env, &t.a);
    // Reopened with a cold watcher, the copy finds nothing to record.
    let root = t.b.root().to_path_buf();
    drop(t.b);
    let b = Tracker::open(t.env.clone(), config(&root, "agent:b")).unwrap();
    assert!(b.rescan_now().unwrap().is_none());
    assert_eq!(t.env.verify(&ActorId::system()).unwrap().ops, ops);
    holds_head(&t.env, &b);
}

#[test]
fn copies_exchange_their_changes_and_never_record_deleting_the_others() {
    let t = two();
    write(t.a.root(), "src/from_a.rs", b"a\n");
    let from_a = capture(&t.a).unwrap();
    // B has not seen A's file: its capture is rebased onto A's operation, keeps it, and writes
    // it into B's tree.
    write(t.b.root(), "src/from_b.rs", b"b\n");
    std::fs::remove_file(t.b.root().join("README")).unwrap();
    let from_b = capture(&t.b).unwrap();
    assert!(from_b.rebased);
    assert_eq!(
        t.env.op(&from_b.version).unwrap().parents,
        vec![from_a.version]
    );
    let head = view(&t.env, &from_b.version);
    assert!(head.contains_key("src/from_a.rs") && head.contains_key("src/from_b.rs"));
    assert!(!head.contains_key("README"));
    holds_head(&t.env, &t.b);
    // A receives B's changes with its next sync, records nothing for them.
    let plan = t.a.sync().unwrap();
    assert_eq!((plan.from, plan.to), (from_a.version, from_b.version));
    holds_head(&t.env, &t.a);
    assert!(capture(&t.a).is_none());
    assert_eq!(t.env.head("main").unwrap(), from_b.version);
    t.env.verify(&ActorId::system()).unwrap();
}

#[test]
fn a_path_changed_in_two_copies_keeps_the_first_and_the_second_as_refused() {
    let t = two();
    write(t.a.root(), "README", b"a's version\n");
    write(t.b.root(), "README", b"b's version\n");
    write(t.b.root(), "notes", b"b's notes\n");
    let first = capture(&t.a).unwrap();
    let second = capture(&t.b).unwrap();
    assert_eq!(
        t.env.op(&second.version).unwrap().parents,
        vec![first.version]
    );
    let head = t.env.head("main").unwrap();
    let readme = environment_core::Key::fs("README").unwrap();
    let agent = ActorId::new("agent:b").unwrap();
    assert_eq!(
        t.env.read(&agent, &readme, &head).unwrap(),
        t.env.read(&agent, &readme, &first.version).unwrap(),
        "the first commit stays"
    );
    let refused = t.env.refused(&agent, "main", 10).unwrap();
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].key, readme);
    assert_eq!(
        refused[0].value.as_ref().map(|v| t.env.content(v).unwrap()),
        Some(b"b's version\n".to_vec()),
        "the second change is kept"
    );
    assert_eq!(
        std::fs::read(t.b.root().join("README")).unwrap(),
        b"a's version\n"
    );
    holds_head(&t.env, &t.b);
    t.a.sync().unwrap();
    holds_head(&t.env, &t.a);
}

#[test]
fn a_file_deleted_in_one_copy_and_changed_in_the_other_keeps_the_deletion() {
    let t = two();
    std::fs::remove_file(t.a.root().join("src/lib.rs")).unwrap();
    capture(&t.a).unwrap();
    write(t.b.root(), "src/lib.rs", b"pub fn b() {}\n");
    capture(&t.b);
    assert!(!t.b.root().join("src/lib.rs").exists());
    let refused = t
        .env
        .refused(&ActorId::new("agent:b").unwrap(), "main", 10)
        .unwrap();
    assert_eq!(refused.len(), 1);
    holds_head(&t.env, &t.b);
}

#[test]
fn a_copy_is_attached_only_to_an_empty_directory_no_tracker_knows() {
    let t = two();
    let ops = t.env.verify(&ActorId::system()).unwrap().ops;
    let full = tempfile::tempdir().unwrap();
    write(full.path(), "mine", b"keep me\n");
    let err = Tracker::attach(t.env.clone(), config(full.path(), "agent:c")).unwrap_err();
    assert!(matches!(err, SandboxError::NotAttachable { .. }), "{err}");
    assert_eq!(err.kind(), ErrorKind::Invalid);
    assert_eq!(
        std::fs::read(full.path().join("mine")).unwrap(),
        b"keep me\n"
    );
    // A copy already tracked, emptied, is not attached again (its tracker would see deletions).
    let a_root = t.a.root().to_path_buf();
    drop(t.a);
    std::fs::remove_dir_all(a_root.join("src")).unwrap();
    std::fs::remove_file(a_root.join("README")).unwrap();
    let err = Tracker::attach(t.env.clone(), config(&a_root, "agent:a")).unwrap_err();
    assert!(matches!(err, SandboxError::NotAttachable { .. }), "{err}");
    assert_eq!(t.env.verify(&ActorId::system()).unwrap().ops, ops);
}

fn refused_count(env: &LocalEnvironment) -> usize {
    env.refused(&ActorId::system(), "main", 100).unwrap().len()
}

#[test]
fn a_directory_removed_in_one_copy_while_the_other_adds_to_it_keeps_the_addition() {
    // B adds under src/ first; A's removal of src/ then finds it there.
    let t = two();
    write(t.b.root(), "src/new.rs", b"b's\n");
    capture(&t.b).unwrap();
    std::fs::remove_dir_all(t.a.root().join("src")).unwrap();
    capture(&t.a);
    let head = view(&t.env, &t.env.head("main").unwrap());
    assert!(
        head.contains_key("src") && head.contains_key("src/new.rs"),
        "{head:?}"
    );
    assert!(!head.contains_key("src/lib.rs"));
    assert_eq!(refused_count(&t.env), 1, "the removal of src itself");
    holds_head(&t.env, &t.a);
    t.b.sync().unwrap();
    holds_head(&t.env, &t.b);
    // A copy attached now is written whole (no path without its directory).
    let c = tempfile::tempdir().unwrap();
    let copy = Tracker::attach(t.env.clone(), config(&c.path().join("c"), "agent:c")).unwrap();
    holds_head(&t.env, &copy);
}

#[test]
fn a_path_added_under_a_directory_another_copy_removed_is_kept_as_refused() {
    // A removes src/ first; B's addition under it then has no home.
    let t = two();
    std::fs::remove_dir_all(t.a.root().join("src")).unwrap();
    capture(&t.a).unwrap();
    write(t.b.root(), "src/new.rs", b"b's\n");
    capture(&t.b);
    let head = view(&t.env, &t.env.head("main").unwrap());
    assert!(!head.keys().any(|k| k.starts_with("src")), "{head:?}");
    let refused = t.env.refused(&ActorId::system(), "main", 10).unwrap();
    assert_eq!(refused.len(), 1);
    assert_eq!(
        refused[0].key,
        environment_core::Key::fs("src/new.rs").unwrap()
    );
    holds_head(&t.env, &t.b);
}

#[test]
fn writing_a_removal_keeps_a_directory_holding_what_was_never_recorded() {
    // B holds, under src/, a path beyond the key limit (never recorded); A removes src/.
    let t = two();
    let long = deep(&t.b.root().join("src"), 90, b"never recorded\n");
    capture(&t.b);
    t.a.sync().unwrap();
    std::fs::remove_dir_all(t.a.root().join("src")).unwrap();
    capture(&t.a).unwrap();
    let plan = t.b.sync().unwrap();
    assert_eq!(
        bottom(&t.b.root().join("src"), &long).as_deref(),
        Some(&b"never recorded\n"[..]),
        "what was never recorded is still there"
    );
    assert!(!t.b.root().join("src/lib.rs").exists());
    assert!(
        plan.not_restored.iter().any(|(p, _)| p.ends_with("src")),
        "{:?}",
        plan.not_restored
    );
}

#[test]
fn a_copy_whose_version_retention_dropped_catches_up_from_a_kept_one() {
    let t = two();
    let idle = t.b.holds().unwrap();
    write(t.a.root(), "src/one.rs", b"1\n");
    capture(&t.a).unwrap();
    write(t.a.root(), "src/two.rs", b"2\n");
    std::fs::remove_file(t.a.root().join("README")).unwrap();
    capture(&t.a).unwrap();
    assert_eq!(t.env.drop_versions(&ActorId::system(), &[idle]).unwrap(), 1);
    t.env.gc(&ActorId::system()).unwrap();
    write(t.b.root(), "notes", b"b's\n");
    t.b.sync().unwrap();
    holds_head(&t.env, &t.b);
    let head = view(&t.env, &t.env.head("main").unwrap());
    assert!(head.contains_key("notes") && head.contains_key("src/two.rs"));
    assert_eq!(refused_count(&t.env), 0);
}

#[test]
fn the_same_bytes_written_in_two_copies_are_no_conflict() {
    let t = two();
    write(t.a.root(), "README", b"agreed\n");
    capture(&t.a).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    write(t.b.root(), "README", b"agreed\n");
    capture(&t.b);
    assert_eq!(refused_count(&t.env), 0);
    holds_head(&t.env, &t.b);
}

#[test]
fn a_copy_tracked_in_the_background_follows_the_others() {
    let t = two();
    let root = t.b.root().to_path_buf();
    drop(t.b);
    let mut cfg = config(&root, "agent:b");
    cfg.auto = true;
    cfg.follow_every = Some(std::time::Duration::from_millis(100));
    let b = Tracker::open(t.env.clone(), cfg).unwrap();
    write(t.a.root(), "src/from_a.rs", b"a\n");
    capture(&t.a).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !root.join("src/from_a.rs").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the copy never followed"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Written in by the follow, not recorded again: the copy holds the head.
    let head = t.env.head("main").unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while b.holds().unwrap() != head {
        assert!(
            std::time::Instant::now() < deadline,
            "the copy never caught up"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(t.env.head("main").unwrap(), head);
    assert_eq!(disk(&root, &no_skip), view(&t.env, &head));
}
