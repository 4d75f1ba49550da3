//! Restore hazards: exactly the target comes back, only what differs is touched, nothing outside
//! the root is ever written, ignored paths are left alone, running processes keep running.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use common::{disk, no_skip, setup, view, write};
use environment_core::{Intent, IntentKind, OpFlags};
use environment_sandbox::RestoreStep;

fn barrier(s: &common::Setup) -> Option<environment_core::Observation> {
    s.tracker
        .capture_now(Intent::new(IntentKind::Command, "step"), OpFlags::COMMAND)
        .unwrap()
}

fn restore(s: &common::Setup, to: &environment_core::OpId) -> environment_sandbox::RestorePlan {
    s.tracker
        .restore(&s.agent, to, Intent::new(IntentKind::Restore, "roll back"))
        .unwrap()
}

#[test]
fn restores_content_modes_types_and_deletions_exactly() {
    let s = setup(|w| {
        write(w, "src/main.rs", b"fn main() {}\n");
        write(w, "src/lib.rs", &vec![b'l'; 10_000]);
        write(w, "bin/tool", b"#!/bin/sh\n");
        std::fs::set_permissions(w.join("bin/tool"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();
        std::fs::create_dir(w.join("shared")).unwrap();
        std::fs::set_permissions(w.join("shared"), std::fs::Permissions::from_mode(0o1777))
            .unwrap();
        std::os::unix::fs::symlink("src/main.rs", w.join("entry")).unwrap();
        write(w, "was_file", b"f");
        write(w, "was_dir/inner", b"i");
    });
    let good = s.env.head("main").unwrap();
    let before = disk(s.work.path(), &no_skip);
    let w = s.work.path();
    // Break everything.
    std::fs::write(w.join("src/main.rs"), b"broken").unwrap();
    std::fs::remove_file(w.join("src/lib.rs")).unwrap();
    std::fs::set_permissions(w.join("bin/tool"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(w.join("shared"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::remove_file(w.join("entry")).unwrap();
    std::fs::write(w.join("entry"), b"now a file").unwrap();
    std::fs::remove_file(w.join("was_file")).unwrap();
    write(w, "was_file/nested", b"now a dir");
    std::fs::remove_dir_all(w.join("was_dir")).unwrap();
    std::fs::write(w.join("was_dir"), b"now a file").unwrap();
    write(w, "junk/a/b", b"new stuff");
    let plan = s.tracker.plan_restore(&good).unwrap();
    let broken = disk(w, &no_skip);
    assert_eq!(disk(w, &no_skip), broken, "planning changes nothing");
    assert!(
        plan.steps
            .contains(&RestoreStep::Remove("fs:junk/a/b".parse().unwrap()))
    );
    let done = restore(&s, &good);
    assert_eq!(done.steps, plan.steps);
    assert_eq!(disk(w, &no_skip), before);
    // The rollback is an operation in the log, and the tree equals the head's view.
    let head = s.env.head("main").unwrap();
    assert!(s.env.op(&head).unwrap().flags.contains(OpFlags::ROLLBACK));
    assert_eq!(view(&s.env, &head), before);
    // Its own events make no capture.
    assert!(barrier(&s).is_none());
}

#[test]
fn only_what_differs_is_written() {
    let s = setup(|w| {
        for i in 0..50 {
            write(w, &format!("f{i}"), format!("{i}").as_bytes());
        }
    });
    let good = s.env.head("main").unwrap();
    let inode = |n: &str| std::fs::metadata(s.work.path().join(n)).unwrap().ino();
    let untouched = inode("f7");
    std::fs::write(s.work.path().join("f3"), b"changed").unwrap();
    let plan = restore(&s, &good);
    assert_eq!(
        plan.steps,
        vec![RestoreStep::Write("fs:f3".parse().unwrap())]
    );
    assert_eq!(inode("f7"), untouched, "an unchanged file was rewritten");
}

#[test]
fn a_planted_symlink_never_lets_a_restore_write_outside() {
    let outside = tempfile::tempdir().unwrap();
    let s = setup(|w| write(w, "sub/secret.txt", b"inside"));
    let good = s.env.head("main").unwrap();
    // The agent swaps the directory for a symlink to somewhere else.
    std::fs::remove_dir_all(s.work.path().join("sub")).unwrap();
    std::os::unix::fs::symlink(outside.path(), s.work.path().join("sub")).unwrap();
    restore(&s, &good);
    assert!(
        std::fs::read_dir(outside.path()).unwrap().next().is_none(),
        "wrote outside the root"
    );
    let m = std::fs::symlink_metadata(s.work.path().join("sub")).unwrap();
    assert!(m.is_dir() && !m.file_type().is_symlink());
    assert_eq!(
        std::fs::read(s.work.path().join("sub/secret.txt")).unwrap(),
        b"inside"
    );
}

#[test]
fn resolution_beneath_the_root_refuses_symlinks_and_dotdot() {
    let outside = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), work.path().join("link")).unwrap();
    let root = environment_sandbox::fsops::Root::open(work.path()).unwrap();
    for bad in ["link/x", "../x", "a/../../x", "link"] {
        let r = root.open_beneath(std::path::Path::new(bad), rustix::fs::OFlags::RDONLY, 0);
        assert!(r.is_err(), "{bad} resolved");
    }
}

/// Bytes that do not repeat (so chunks do not deduplicate by accident).
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The blake3 hash of a file, read in pieces.
fn file_hash(path: &std::path::Path) -> blake3::Hash {
    let mut h = blake3::Hasher::new();
    std::io::copy(&mut std::fs::File::open(path).unwrap(), &mut h).unwrap();
    h.finalize()
}

/// Overwrites `bytes` at `at` in the file at `path`, in place.
fn poke(path: &std::path::Path, at: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .write_all_at(bytes, at)
        .unwrap();
}

fn large_files_scenario(dir: &std::path::Path) {
    use environment_core::{ActorId, Content};
    use std::io::{Seek, SeekFrom, Write};
    const GIB: u64 = 1 << 30;
    let work = dir.join("work");
    std::fs::create_dir_all(&work).unwrap();
    // A 1 GiB disk image holding 1 MiB and a few bytes; a 24 MiB file of data.
    let mut img = std::fs::File::create(work.join("disk.img")).unwrap();
    img.write_all(b"head").unwrap();
    img.seek(SeekFrom::Start(GIB / 2)).unwrap();
    img.write_all(&noise(1 << 20, 3)).unwrap();
    img.set_len(GIB - 4).unwrap();
    img.seek(SeekFrom::End(0)).unwrap();
    img.write_all(b"tail").unwrap();
    drop(img);
    let data = noise(24 << 20, 5);
    std::fs::write(work.join("data.bin"), &data).unwrap();
    let (img_hash, data_hash) = (
        file_hash(&work.join("disk.img")),
        file_hash(&work.join("data.bin")),
    );

    let (env, tracker) = common::manual(&work, &dir.join("home"));
    let agent = ActorId::new("agent:t").unwrap();
    let first = env.head("main").unwrap();
    let stored = env.blobs().usage().unwrap();
    assert!(
        stored.bytes < (24 << 20) + (2 << 20),
        "the hole was stored: {stored:?}"
    );
    let img_value = env
        .read_unchecked(&environment_core::Key::fs("disk.img").unwrap(), &first)
        .unwrap()
        .unwrap();
    assert!(matches!(img_value.content, Content::Chunks(_)));
    assert_eq!(img_value.meta.size, GIB);

    // One byte changed in the middle of the data: about one chunk more.
    poke(&work.join("data.bin"), 12 << 20, b"!");
    tracker
        .capture_now(Intent::new(IntentKind::Command, "poke"), OpFlags::COMMAND)
        .unwrap()
        .expect("the change is recorded");
    let poked = env.head("main").unwrap();
    let after = env.blobs().usage().unwrap();
    assert!(
        after.bytes - stored.bytes <= 2 * environment_core::blob::CHUNK_MAX as u64 + (64 << 10),
        "one byte cost {} bytes",
        after.bytes - stored.bytes
    );
    let poked_hash = file_hash(&work.join("data.bin"));

    // Both gone or broken, then back: byte for byte, the image still sparse.
    std::fs::remove_file(work.join("disk.img")).unwrap();
    std::fs::write(work.join("data.bin"), b"clobbered").unwrap();
    let intent = || Intent::new(IntentKind::Restore, "back");
    tracker.restore(&agent, &first, intent()).unwrap();
    assert_eq!(file_hash(&work.join("disk.img")), img_hash);
    assert_eq!(file_hash(&work.join("data.bin")), data_hash);
    let m = std::fs::metadata(work.join("disk.img")).unwrap();
    assert_eq!(m.len(), GIB);
    assert!(
        m.blocks() * 512 < 16 << 20,
        "the restored image takes {} bytes",
        m.blocks() * 512
    );
    // A chunked file that stays one is patched in place: the same inode.
    let ino = || std::fs::metadata(work.join("data.bin")).unwrap().ino();
    let before = ino();
    tracker.restore(&agent, &poked, intent()).unwrap();
    assert_eq!(file_hash(&work.join("data.bin")), poked_hash);
    assert_eq!(ino(), before, "the file was rewritten, not patched");
    // Changed behind the tracker's back: the restore's safety capture records the change, and
    // the way back and forth still ends byte for byte.
    poke(&work.join("data.bin"), 1 << 20, b"?");
    tracker.restore(&agent, &first, intent()).unwrap();
    assert_eq!(file_hash(&work.join("data.bin")), data_hash);
    tracker.restore(&agent, &poked, intent()).unwrap();
    assert_eq!(file_hash(&work.join("data.bin")), poked_hash);

    // Collection keeps every chunk a version names and takes those none does.
    let orphan = work.join("orphan");
    std::fs::write(&orphan, noise(9 << 20, 11)).unwrap();
    let guard = env.blobs().write_guard().unwrap();
    let put = env
        .blobs()
        .put_chunked(&std::fs::File::open(&orphan).unwrap(), true)
        .unwrap();
    drop(guard);
    std::fs::remove_file(&orphan).unwrap();
    let report = env.gc(&agent).unwrap();
    assert!(
        report.removed >= 3,
        "the orphan's manifest and chunks go: {report:?}"
    );
    assert!(!env.blobs().contains(&put.manifest));
    env.verify_deep(&environment_core::ActorId::system())
        .unwrap();
    tracker.restore(&agent, &first, intent()).unwrap();
    assert_eq!(file_hash(&work.join("data.bin")), data_hash);
    assert_eq!(file_hash(&work.join("disk.img")), img_hash);
}

#[test]
fn large_and_sparse_files_cost_what_they_hold() {
    common::both(
        "large_and_sparse_files_cost_what_they_hold",
        common::always,
        large_files_scenario,
    );
}

/// A tree shaped like what `npm install` leaves: hundreds of packages, scoped and nested ones,
/// `.bin` symlinks, executables, read-only files, empty directories and a store of hard links.
fn node_modules(work: &std::path::Path) {
    let nm = work.join("node_modules");
    for i in 0..300 {
        let name = if i % 10 == 0 {
            format!("@scope/pkg-{i}")
        } else {
            format!("pkg-{i}")
        };
        let p = nm.join(&name);
        write(
            &p,
            "package.json",
            format!("{{\"name\":\"{name}\",\"version\":\"1.{i}.0\"}}\n").as_bytes(),
        );
        write(
            &p,
            "index.js",
            format!("module.exports = require('./lib/m{i}.js');\n").as_bytes(),
        );
        write(&p, &format!("lib/m{i}.js"), &vec![b'x'; 100 + i * 37]);
        write(&p, "README.md", b"# readme\n");
        if i % 7 == 0 {
            write(&p, "bin/cli.js", b"#!/usr/bin/env node\n");
            std::fs::set_permissions(p.join("bin/cli.js"), std::fs::Permissions::from_mode(0o755))
                .unwrap();
            std::fs::create_dir_all(nm.join(".bin")).unwrap();
            std::os::unix::fs::symlink(
                format!("../{name}/bin/cli.js"),
                nm.join(format!(".bin/tool-{i}")),
            )
            .unwrap();
        }
        if i % 11 == 0 {
            write(
                &p,
                &format!("node_modules/dep-{i}/package.json"),
                b"{\"name\":\"dep\"}\n",
            );
            std::fs::create_dir_all(p.join("empty")).unwrap();
        }
        if i % 13 == 0 {
            std::fs::set_permissions(p.join("README.md"), std::fs::Permissions::from_mode(0o444))
                .unwrap();
        }
    }
    // A content store linked into place, as pnpm does.
    write(&nm, ".store/blob-a", b"shared content\n");
    std::fs::hard_link(nm.join(".store/blob-a"), nm.join("pkg-1/linked.js")).unwrap();
    std::fs::hard_link(nm.join(".store/blob-a"), nm.join("pkg-2/linked.js")).unwrap();
    write(work, "package-lock.json", b"{\"lockfileVersion\":3}\n");
}

fn node_modules_scenario(dir: &std::path::Path) {
    use environment_core::ActorId;
    let work = dir.join("work");
    write(&work, "package.json", b"{\"name\":\"app\"}\n");
    let (env, tracker) = common::manual(&work, &dir.join("home"));
    let agent = ActorId::new("agent:npm").unwrap();
    let before = (env.head("main").unwrap(), disk(&work, &no_skip));
    node_modules(&work);
    tracker
        .capture_now(
            Intent::new(IntentKind::Command, "npm install"),
            OpFlags::COMMAND,
        )
        .unwrap()
        .expect("the install is recorded");
    let installed = (
        env.head("main").unwrap(),
        disk(&work, &no_skip),
        common::link_groups(&work, &no_skip),
    );
    assert_eq!(view(&env, &installed.0), installed.1);
    let intent = || Intent::new(IntentKind::Restore, "npm");
    for _ in 0..2 {
        tracker.restore(&agent, &before.0, intent()).unwrap();
        assert_eq!(
            disk(&work, &no_skip),
            before.1,
            "back: nothing of the install is left"
        );
        tracker.restore(&agent, &installed.0, intent()).unwrap();
        assert_eq!(
            disk(&work, &no_skip),
            installed.1,
            "forward: the install, byte for byte"
        );
        assert_eq!(common::link_groups(&work, &no_skip), installed.2);
    }
}

#[test]
fn a_node_modules_tree_goes_back_and_forth_exactly() {
    common::both(
        "a_node_modules_tree_goes_back_and_forth_exactly",
        common::always,
        node_modules_scenario,
    );
}

#[test]
fn ignored_paths_are_never_restored_or_deleted() {
    let s = setup(|w| write(w, "src/a.rs", b"a"));
    let good = s.env.head("main").unwrap();
    let w = s.work.path();
    write(w, "src/.a.rs.swp", b"editor state");
    write(w, "src/__pycache__/x.pyc", b"cache");
    write(w, "newdir/__pycache__/y.pyc", b"cache in a new dir");
    write(w, "newdir/tracked.txt", b"tracked");
    restore(&s, &good);
    assert_eq!(
        std::fs::read(w.join("src/.a.rs.swp")).unwrap(),
        b"editor state"
    );
    assert_eq!(
        std::fs::read(w.join("src/__pycache__/x.pyc")).unwrap(),
        b"cache"
    );
    // The target has no such directory: it goes with everything in it, ignored content
    // included, but for an environment's home, which a restore never deletes.
    assert!(
        !w.join("newdir").exists(),
        "no debris of a directory the target lacks"
    );
    // A directory that stays keeps its ignored content.
    assert!(w.join("src/__pycache__/x.pyc").exists());
}

#[test]
fn a_directory_the_target_lacks_goes_with_its_ignored_content() {
    let s = setup(|w| write(w, "src/a.rs", b"a"));
    let good = s.env.head("main").unwrap();
    let w = s.work.path();
    write(w, "pkg/mod.py", b"x = 1\n");
    write(w, "pkg/__pycache__/mod.cpython-311.pyc", b"cache");
    write(w, "pkg/sub/__pycache__/deep.pyc", b"cache");
    write(w, "pkg/ro/__pycache__/r.pyc", b"cache");
    write(w, "keep/.environment/env.db", b"a nested environment's log");
    write(w, "keep/x.txt", b"tracked");
    barrier(&s);
    // A read-only directory holding ignored content.
    std::fs::set_permissions(
        w.join("pkg/ro/__pycache__"),
        std::fs::Permissions::from_mode(0o555),
    )
    .unwrap();
    std::fs::set_permissions(w.join("pkg/ro"), std::fs::Permissions::from_mode(0o555)).unwrap();
    // The plan counts what goes beyond the captured paths: three caches and their files, not
    // the precious home.
    assert_eq!(s.tracker.plan_restore(&good).unwrap().ignored_removed, 6);
    let plan = restore(&s, &good);
    assert_eq!(plan.ignored_removed, 6);
    assert!(!w.join("pkg").exists(), "everything under pkg/ went");
    assert_eq!(
        std::fs::read(w.join("keep/.environment/env.db")).unwrap(),
        b"a nested environment's log",
        "an environment's home is precious"
    );
    assert!(!w.join("keep/x.txt").exists());
    assert_eq!(
        disk(w, &|p: &str| p.starts_with("keep")),
        view(&s.env, &good)
    );
}

/// A real toolchain: a venv made and used (Python writes `__pycache__`, which is ignored),
/// then a restore to before it: nothing of it is left.
#[test]
fn a_restore_to_before_a_venv_leaves_nothing_of_it() {
    let python = "/usr/bin/python3";
    if !std::path::Path::new(python).exists() {
        common::missing_prerequisite("/usr/bin/python3 (apt-get install python3)");
        return;
    }
    let s = setup(|w| write(w, "app.py", b"print('hi')\n"));
    let good = s.env.head("main").unwrap();
    let w = s.work.path();
    let ok = std::process::Command::new(python)
        .args(["-m", "venv", "--without-pip", ".venv"])
        .current_dir(w)
        .status()
        .unwrap();
    assert!(ok.success());
    let site = std::fs::read_dir(w.join(".venv/lib"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path()
        .join("site-packages");
    std::fs::write(site.join("helper.py"), "ANSWER = 42\n").unwrap();
    let ran = std::process::Command::new(w.join(".venv/bin/python"))
        .args(["-c", "import helper; assert helper.ANSWER == 42"])
        .env_remove("PYTHONDONTWRITEBYTECODE")
        .env_remove("PYTHONPYCACHEPREFIX")
        .current_dir(w)
        .status()
        .unwrap();
    assert!(ran.success());
    assert!(site.join("__pycache__").is_dir(), "python wrote its cache");
    barrier(&s);
    restore(&s, &good);
    assert!(!w.join(".venv").exists(), "no .venv debris");
    assert_eq!(disk(w, &no_skip), view(&s.env, &good));
}

#[test]
fn processes_in_the_tree_keep_running() {
    let s = setup(|w| write(w, "state", b"good"));
    let good = s.env.head("main").unwrap();
    let mut child = std::process::Command::new("sh")
        .arg("-c")
        .arg("while true; do cat state > /dev/null; sleep 0.01; done")
        .current_dir(s.work.path())
        .spawn()
        .unwrap();
    std::fs::write(s.work.path().join("state"), b"bad").unwrap();
    restore(&s, &good);
    std::thread::sleep(Duration::from_millis(100));
    assert!(child.try_wait().unwrap().is_none(), "the process died");
    assert_eq!(std::fs::read(s.work.path().join("state")).unwrap(), b"good");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_head_moved_through_the_api_is_written_into_the_tree() {
    let s = setup(|w| {
        write(w, "keep.txt", b"keep");
        write(w, "old.txt", b"old");
    });
    let before = s.env.head("main").unwrap();
    // Another actor changes main through the API; the tree still holds `before`.
    s.env
        .act_blocking(
            environment_core::ActRequest::new(s.agent.clone(), Intent::edit("api edit"))
                .put(
                    environment_core::Key::fs("new/file.txt").unwrap(),
                    environment_core::Value::file("from the api"),
                )
                .put(
                    environment_core::Key::fs("new").unwrap(),
                    environment_core::Value::dir(),
                )
                .delete(environment_core::Key::fs("old.txt").unwrap()),
        )
        .unwrap();
    let head = s.env.head("main").unwrap();
    let plan = s.tracker.sync().unwrap();
    assert_eq!((plan.from, plan.to), (before, head));
    let w = s.work.path();
    assert_eq!(
        std::fs::read(w.join("new/file.txt")).unwrap(),
        b"from the api"
    );
    assert!(!w.join("old.txt").exists());
    assert_eq!(std::fs::read(w.join("keep.txt")).unwrap(), b"keep");
    // What it wrote is no change of the tree: no capture follows, and the tree is the head.
    assert!(barrier(&s).is_none());
    assert_eq!(s.env.head("main").unwrap(), head);
    assert_eq!(disk(w, &no_skip), view(&s.env, &head));
}

/// Refuses every branch write by `agent:intruder`.
struct NoIntruder;

impl environment_core::Authorizer for NoIntruder {
    fn decide(&self, r: &environment_core::AccessRequest) -> environment_core::Decision {
        if r.actor.as_str() == "agent:intruder"
            && matches!(r.resource, environment_core::Resource::Branch(_))
        {
            environment_core::Decision {
                verdict: environment_core::Verdict::Deny,
                rules: vec!["test:no-intruder".into()],
                policy_version: 1,
                next: String::new(),
                explanation: "intruders may not roll back".into(),
                spend: Vec::new(),
            }
        } else {
            environment_core::Decision::allow_unconditionally()
        }
    }
}

/// A refused restore is refused before a single file is written.
#[test]
fn a_refused_restore_writes_nothing() {
    use environment_core::{ActorId, LocalEnvironment, Options};
    use environment_sandbox::{Tracker, TrackerConfig};
    let work = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    write(work.path(), "a.txt", b"first\n");
    let env = LocalEnvironment::open(
        home.path(),
        Options {
            authorizer: std::sync::Arc::new(NoIntruder),
            ..Options::default()
        },
    )
    .unwrap();
    let mut cfg = TrackerConfig::new(work.path(), ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    let tracker = Tracker::open(env.clone(), cfg).unwrap();
    let first = env.head("main").unwrap();
    write(work.path(), "a.txt", b"second\n");
    write(work.path(), "b.txt", b"new\n");
    tracker
        .capture_now(Intent::new(IntentKind::Edit, "edit"), OpFlags::empty())
        .unwrap()
        .unwrap();
    let head = env.head("main").unwrap();
    let before = disk(work.path(), &no_skip);
    let intruder = ActorId::new("agent:intruder").unwrap();
    let refused = tracker.restore(&intruder, &first, Intent::new(IntentKind::Restore, "no"));
    assert!(refused.is_err());
    assert_eq!(disk(work.path(), &no_skip), before, "the tree was touched");
    assert_eq!(env.head("main").unwrap(), head);
    assert!(tracker.interrupted_restore().unwrap().is_none());
}

/// Read-only directories (mode 555 with contents) are restored as tar and rsync do: made
/// writable while their contents change, given their final mode last. As uid 65534 too, for
/// whom a mode is a wall.
fn read_only_scenario(_: &std::path::Path) {
    let s = setup(|w| {
        write(w, "ro/a", b"first");
        write(w, "ro/sub/deep", b"deep");
        write(w, "keep.txt", b"keep");
    });
    let w = s.work.path();
    let ro = |p: &str, mode: u32| {
        std::fs::set_permissions(w.join(p), std::fs::Permissions::from_mode(mode)).unwrap();
    };
    ro("ro/sub", 0o555);
    ro("ro", 0o555);
    barrier(&s);
    let good = s.env.head("main").unwrap();
    let expected = disk(w, &no_skip);
    // Broken: contents changed, one added, the directories made writable and back.
    ro("ro", 0o755);
    ro("ro/sub", 0o755);
    std::fs::write(w.join("ro/a"), "clobbered").unwrap();
    std::fs::write(w.join("ro/extra"), "added").unwrap();
    std::fs::remove_file(w.join("ro/sub/deep")).unwrap();
    ro("ro/sub", 0o555);
    ro("ro", 0o555);
    barrier(&s);
    restore(&s, &good);
    assert_eq!(disk(w, &no_skip), expected, "the version, modes included");
    // And from nothing: the read-only tree made anew.
    ro("ro", 0o755);
    ro("ro/sub", 0o755);
    std::fs::remove_dir_all(w.join("ro")).unwrap();
    barrier(&s);
    restore(&s, &good);
    assert_eq!(disk(w, &no_skip), expected);
    assert_eq!(
        std::fs::metadata(w.join("ro")).unwrap().mode() & 0o777,
        0o555
    );
    // Nothing is left dirty by the restore's own chmods.
    assert!(barrier(&s).is_none());
    ro("ro/sub", 0o755);
    ro("ro", 0o755);
}

#[test]
fn read_only_directories_are_restored_whole() {
    common::both(
        "read_only_directories_are_restored_whole",
        common::always,
        read_only_scenario,
    );
}

/// A device node in a version is made where the caller may make one (root), and otherwise
/// named in what the restore could not do, never passed over in silence; a socket is made.
fn special_files_scenario(_: &std::path::Path) {
    use environment_core::{EntryKind, Key, Meta, Value};
    let s = setup(|w| write(w, "a.txt", b"a"));
    let special = |kind: EntryKind, ty: &str, rdev: u64| {
        let mut meta = Meta::of(kind);
        meta.mode = 0o600;
        meta.attributes.insert("type".into(), ty.into());
        meta.attributes.insert("rdev".into(), rdev.to_string());
        Value {
            content: environment_core::Content::Inline(Vec::new()),
            meta,
        }
    };
    // /dev/null's numbers: major 1, minor 3.
    let null_rdev = (1u64 << 8) | 3;
    s.env
        .act_blocking(
            environment_core::ActRequest::new(s.agent.clone(), Intent::edit("specials"))
                .put(
                    Key::fs("null").unwrap(),
                    special(EntryKind::Device, "characterdevice", null_rdev),
                )
                .put(
                    Key::fs("sock").unwrap(),
                    special(EntryKind::Socket, "socket", 0),
                ),
        )
        .unwrap();
    let plan = s.tracker.sync().unwrap();
    let w = s.work.path();
    use std::os::unix::fs::FileTypeExt;
    assert!(
        std::fs::symlink_metadata(w.join("sock"))
            .unwrap()
            .file_type()
            .is_socket()
    );
    let made = std::fs::symlink_metadata(w.join("null"))
        .is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == null_rdev);
    let named: Vec<_> = plan.not_restored.iter().map(|(p, _)| p.clone()).collect();
    // Made, or named: never neither, never both.
    assert_ne!(
        made,
        named.contains(&"null".into()),
        "made: {made}, named: {named:?}"
    );
    assert!(!named.contains(&"sock".into()));
}

#[test]
fn device_nodes_are_made_or_named_and_sockets_made() {
    common::both(
        "device_nodes_are_made_or_named_and_sockets_made",
        common::always,
        special_files_scenario,
    );
}

/// Hard links: a write through one link is recorded for every link of the group (inotify
/// names only the path written), and a restore makes them one inode again.
fn hard_link_scenario(dir: &std::path::Path) {
    use environment_core::ActorId;
    let work = dir.join("work");
    write(&work, "a/one", b"shared\n");
    std::fs::create_dir_all(work.join("b")).unwrap();
    std::fs::hard_link(work.join("a/one"), work.join("b/two")).unwrap();
    std::fs::hard_link(work.join("a/one"), work.join("three")).unwrap();
    let (env, tracker) = common::manual(&work, &dir.join("home"));
    let agent = ActorId::new("agent:t").unwrap();
    let first = env.head("main").unwrap();
    let step = || {
        tracker
            .capture_now(Intent::new(IntentKind::Command, "step"), OpFlags::COMMAND)
            .unwrap()
    };
    // Through one link: the watcher sees a/one only, the version has all three changed.
    std::fs::write(work.join("a/one"), "changed through one\n").unwrap();
    step();
    let changed = env.head("main").unwrap();
    assert_eq!(view(&env, &changed), disk(&work, &no_skip));
    // Back: one inode again, three names, the old content.
    tracker
        .restore(&agent, &first, Intent::new(IntentKind::Restore, "back"))
        .unwrap();
    let ino = |p: &str| std::fs::metadata(work.join(p)).unwrap().ino();
    assert_eq!(ino("a/one"), ino("b/two"));
    assert_eq!(ino("a/one"), ino("three"));
    assert_eq!(std::fs::read(work.join("three")).unwrap(), b"shared\n");
    assert_eq!(disk(&work, &no_skip), view(&env, &first));
    // A link removed and the group broken up: restored as a group all the same.
    std::fs::remove_file(work.join("b/two")).unwrap();
    std::fs::remove_file(work.join("three")).unwrap();
    std::fs::write(work.join("three"), "alone\n").unwrap();
    step();
    let v = view(&env, &env.head("main").unwrap());
    assert!(!v.contains_key("b/two"));
    tracker
        .restore(&agent, &first, Intent::new(IntentKind::Restore, "again"))
        .unwrap();
    assert_eq!(ino("a/one"), ino("b/two"));
    assert_eq!(ino("a/one"), ino("three"));
    assert_eq!(std::fs::metadata(work.join("three")).unwrap().nlink(), 3);
    assert_eq!(disk(&work, &no_skip), view(&env, &first));
    // A link made to a file captured alone: the group is found (the first file's count
    // moved), and a restore links them.
    write(&work, "solo", b"solo\n");
    step();
    std::fs::hard_link(work.join("solo"), work.join("b/solo-link")).unwrap();
    step();
    let linked = env.head("main").unwrap();
    std::fs::remove_file(work.join("b/solo-link")).unwrap();
    std::fs::remove_file(work.join("solo")).unwrap();
    step();
    tracker
        .restore(&agent, &linked, Intent::new(IntentKind::Restore, "linked"))
        .unwrap();
    assert_eq!(ino("solo"), ino("b/solo-link"));
}

#[test]
fn hard_link_groups_are_captured_and_restored_as_groups() {
    common::both(
        "hard_link_groups_are_captured_and_restored_as_groups",
        common::always,
        hard_link_scenario,
    );
}
