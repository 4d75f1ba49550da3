//! A managed rootfs: seeded from busybox, mapped to root inside, broken by the agent (deleted
//! `/bin` entries, edited `/etc` files), restored exactly by the tracker.
//!
//! Runs as the current user and, when root, again as uid 65534 (see tests/isolation.rs); skips
//! with the reason when the host refuses user namespaces or `/bin/busybox` (Debian's
//! `busybox-static`) is missing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;

use common::{disk, write};
use environment_core::{ActorId, Intent, IntentKind, LocalEnvironment, OpFlags, Options};
use environment_sandbox::{
    Isolation, IsolationSpec, Launcher, Rootfs, SandboxError, Tracker, TrackerConfig,
};

const BUSYBOX: &str = "/bin/busybox";

fn unavailable() -> Option<String> {
    if let Err(e) = Isolation::probe() {
        return Some(e.to_string());
    }
    if !Path::new(BUSYBOX).exists() {
        return Some(format!("{BUSYBOX} is missing (install busybox-static)"));
    }
    None
}

/// Runs the scenario as this user and, under root, as uid 65534 too.
fn both(name: &str, scenario: fn()) {
    common::both(name, unavailable, |_| scenario());
}

/// A tiny root: busybox, a few /etc files, the usual empty directories.
fn busybox_tree(dir: &Path) {
    for d in ["bin", "dev", "proc", "tmp", "root", "etc"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    std::fs::set_permissions(dir.join("tmp"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::set_permissions(dir.join("root"), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::copy(BUSYBOX, dir.join("bin/busybox")).unwrap();
    std::fs::set_permissions(
        dir.join("bin/busybox"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::os::unix::fs::symlink("busybox", dir.join("bin/sh")).unwrap();
    write(dir, "etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n");
    write(dir, "etc/group", b"root:x:0:\n");
    write(dir, "etc/hosts", b"127.0.0.1 localhost\n");
    write(dir, "etc/profile", b"export PS1='# '\n");
    std::fs::set_permissions(
        dir.join("etc/hosts"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
}

fn tarball(src: &Path, out: &Path) {
    let mut b = tar::Builder::new(std::fs::File::create(out).unwrap());
    b.follow_symlinks(false);
    b.append_dir_all(".", src).unwrap();
    b.into_inner().unwrap();
}

fn run(iso: &Isolation, script: &str) -> Output {
    common::run_sh(iso, script)
}

fn internal(rel: &str) -> bool {
    rel == ".environment" || rel.starts_with(".environment/")
}

fn scenario_break_and_restore() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    busybox_tree(&src);
    tarball(&src, &tmp.path().join("root.tar"));

    // Both seeds give the same tree.
    let root = tmp.path().join("rootfs");
    let from_dir = tmp.path().join("from-dir");
    let n = Rootfs::seed_from_tar(&tmp.path().join("root.tar"), &root).unwrap();
    assert!(n >= 10);
    Rootfs::seed_from_dir(&src, &from_dir).unwrap();
    assert_eq!(disk(&root, &internal), disk(&from_dir, &internal));
    assert_eq!(disk(&root, &internal), disk(&src, &internal));

    let iso = Isolation::new(IsolationSpec::rootfs(&root)).unwrap();
    assert_eq!(iso.workspace_inside(), Path::new("/"));
    // Root inside, owning its rootfs: it installs the applet links itself.
    let out = run(
        &iso,
        "set -e; id -u; /bin/busybox --install -s /bin; ls /bin | wc -l; echo $HOME; pwd",
    );
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("0"));
    assert!(lines.next().unwrap().trim().parse::<u32>().unwrap() > 50);
    assert_eq!(lines.next(), Some("/root"));
    assert_eq!(lines.next(), Some("/"));

    let home = tmp.path().join("home");
    let env = LocalEnvironment::open(&home, Options::default()).unwrap();
    let mut cfg = TrackerConfig::new(&root, ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    let tracker = Tracker::open(env.clone(), cfg).unwrap();
    let good = env.head("main").unwrap();
    let expected = disk(&root, &internal);
    assert!(expected.contains_key("bin/ls"));

    // The agent breaks its system.
    let out = run(
        &iso,
        "set -e; rm /bin/ls /bin/cat /bin/vi; rm -r /root; \
         echo 'intruder:x:0:0::/:/bin/sh' >> /etc/passwd; chmod 600 /etc/hosts; \
         rm /etc/group; ln -s /nowhere /etc/localtime; mkdir -p /etc/apt; echo deb > /etc/apt/sources; \
         : > /etc/profile; rm /bin/busybox",
    );
    assert!(out.status.success());
    assert_ne!(disk(&root, &internal), expected);
    tracker
        .capture_now(
            Intent::new(IntentKind::Command, "agent breaks its rootfs"),
            OpFlags::COMMAND,
        )
        .unwrap()
        .unwrap();

    tracker
        .restore(
            &ActorId::new("agent:x").unwrap(),
            &good,
            Intent::new(IntentKind::Restore, "back to the seeded system"),
        )
        .unwrap();
    assert_eq!(
        disk(&root, &internal),
        expected,
        "bytes, modes and links restored"
    );
    // And the system works again.
    let out = run(&iso, "ls /etc; cat /etc/hosts");
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "group\nhosts\npasswd\nprofile\n127.0.0.1 localhost\n"
    );
    env.verify_deep(&environment_core::ActorId::system())
        .unwrap();
}

#[test]
fn agent_breaks_rootfs_and_restore_brings_it_back() {
    both(
        "agent_breaks_rootfs_and_restore_brings_it_back",
        scenario_break_and_restore,
    );
}

/// A workspace bound into a rootfs: a masked path under it is empty inside, the rest is there.
fn scenario_mask_under_the_workspace() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("rootfs");
    busybox_tree(&root);
    let work = tmp.path().join("work");
    std::fs::create_dir_all(work.join("secrets")).unwrap();
    std::fs::write(work.join("secrets/key"), b"hunter2").unwrap();
    std::fs::write(work.join("notes"), b"public").unwrap();
    let mut spec = IsolationSpec::rootfs(&root);
    spec.workspace = Some(environment_sandbox::Workspace::Dir(work.clone()));
    spec.masked.push("/workspace/secrets".into());
    let iso = Isolation::new(spec).unwrap();
    let out = run(
        &iso,
        "cat /workspace/notes; ls -A /workspace/secrets | wc -l",
    );
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "public0\n");
    assert_eq!(std::fs::read(work.join("secrets/key")).unwrap(), b"hunter2");
}

#[test]
fn a_mask_under_the_workspace_hides_it_in_a_rootfs() {
    both(
        "a_mask_under_the_workspace_hides_it_in_a_rootfs",
        scenario_mask_under_the_workspace,
    );
}

/// An archive entry with a raw name (the builder refuses unsafe names, an attacker does not).
fn raw_entry(b: &mut tar::Builder<std::fs::File>, name: &[u8], kind: tar::EntryType, link: &[u8]) {
    let mut h = tar::Header::new_old();
    h.as_old_mut().name[..name.len()].copy_from_slice(name);
    h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
    h.set_entry_type(kind);
    h.set_mode(0o644);
    h.set_size(if kind == tar::EntryType::Regular {
        4
    } else {
        0
    });
    h.set_cksum();
    let data: &[u8] = if kind == tar::EntryType::Regular {
        b"evil"
    } else {
        b""
    };
    b.append(&h, data).unwrap();
}

#[test]
fn tar_entries_escaping_the_rootfs_are_refused() {
    type Entry<'a> = (&'a [u8], tar::EntryType, &'a [u8]);
    let cases: [&[Entry<'_>]; 4] = [
        &[(b"../evil", tar::EntryType::Regular, b"")],
        &[(b"/tmp/evil-abs", tar::EntryType::Regular, b"")],
        &[(b"etc/shadow", tar::EntryType::Link, b"../../etc/shadow")],
        &[
            (b"up", tar::EntryType::Symlink, b"/"),
            (b"up/evil", tar::EntryType::Regular, b""),
        ],
    ];
    for entries in cases {
        let tmp = tempfile::tempdir().unwrap();
        let tarball = tmp.path().join("bad.tar");
        let mut b = tar::Builder::new(std::fs::File::create(&tarball).unwrap());
        raw_entry(&mut b, b"ok", tar::EntryType::Regular, b"");
        for (name, kind, link) in entries {
            raw_entry(&mut b, name, *kind, link);
        }
        b.into_inner().unwrap();
        let dest = tmp.path().join("a/b/rootfs");
        let err = Rootfs::seed_from_tar(&tarball, &dest).unwrap_err();
        assert!(matches!(err, SandboxError::SeedEntry { .. }), "{err}");
        // Nothing was written: not the destination, not the escapes.
        assert!(!dest.exists());
        assert!(!tmp.path().join("a/evil").exists());
        assert!(!Path::new("/tmp/evil-abs").exists());
        assert!(!Path::new("/evil").exists());
    }
}

#[test]
fn seeding_refuses_a_non_empty_destination() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    write(&src, "etc/hosts", b"x\n");
    let dest = tmp.path().join("dest");
    write(&dest, "keep", b"mine\n");
    assert!(matches!(
        Rootfs::seed_from_dir(&src, &dest),
        Err(SandboxError::InvalidSpec { .. })
    ));
    assert_eq!(std::fs::read(dest.join("keep")).unwrap(), b"mine\n");
    assert!(!dest.join("etc").exists());
}

/// Seeding from a directory keeps hard links and modification times, as the tar seed does;
/// a tree this user cannot fully read is refused before anything is written.
fn seed_dir_scenario(dir: &Path) {
    use std::os::unix::fs::MetadataExt;
    let src = dir.join("src");
    write(&src, "usr/bin/tool", b"#!/bin/sh\n");
    write(&src, "etc/conf", b"x = 1\n");
    std::fs::hard_link(src.join("usr/bin/tool"), src.join("usr/bin/tool-alias")).unwrap();
    std::os::unix::fs::symlink("tool", src.join("usr/bin/link")).unwrap();
    let old = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 0,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: 1_000_000_000,
            tv_nsec: 0,
        },
    };
    for p in ["etc/conf", "usr/bin/link", "usr/bin", "usr"] {
        rustix::fs::utimensat(
            rustix::fs::CWD,
            src.join(p),
            &old,
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        )
        .unwrap();
    }
    let dest = dir.join("rootfs");
    Rootfs::seed_from_dir(&src, &dest).unwrap();
    let meta = |p: &str| std::fs::symlink_metadata(dest.join(p)).unwrap();
    assert_eq!(meta("usr/bin/tool").ino(), meta("usr/bin/tool-alias").ino());
    for p in ["etc/conf", "usr/bin/link", "usr/bin", "usr"] {
        assert_eq!(meta(p).mtime(), 1_000_000_000, "{p}");
    }
    // Unreadable to this user: refused whole, nothing written.
    let locked = dir.join("locked-src");
    write(&locked, "ok", b"fine\n");
    write(&locked, "etc/shadow", b"secret\n");
    std::fs::set_permissions(
        locked.join("etc/shadow"),
        std::fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    let dest = dir.join("rootfs-2");
    let result = Rootfs::seed_from_dir(&locked, &dest);
    if rustix::process::geteuid().is_root() {
        result.unwrap();
    } else {
        assert!(
            matches!(
                result,
                Err(environment_sandbox::SandboxError::SeedUnreadable { count: 1, .. })
            ),
            "{result:?}"
        );
        assert!(!dest.exists(), "nothing written");
    }
}

#[test]
fn a_directory_seed_keeps_links_and_times_and_refuses_what_it_cannot_read() {
    common::both(
        "a_directory_seed_keeps_links_and_times_and_refuses_what_it_cannot_read",
        common::always,
        seed_dir_scenario,
    );
}
