//! Round trip: random mutations of a tree, a capture after each, then a restore to a random
//! earlier version gives exactly that version's tree: contents, modes (read-only directories
//! among them), symlinks, large and sparse files, hard-link groups, and no ignored content left
//! in a directory the version lacks.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use common::{disk, no_skip, setup, view, write};
use environment_core::{Intent, IntentKind, OpFlags};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Mutation {
    Write(usize, Vec<u8>),
    Delete(usize),
    Chmod(usize, u32),
    Symlink(usize, usize),
    MkdirOver(usize),
    RemoveDir(usize),
    /// A file past the size read whole (so stored in chunks), with a hole in it or not.
    Large(usize, u8, bool),
    /// A hard link at the first path to the file at the second.
    HardLink(usize, usize),
    /// Ignored content (a `__pycache__`) in a directory.
    Ignored(usize),
    /// A directory's mode: read-only with its contents, or writable again.
    ChmodDir(usize, u32),
}

const PATHS: [&str; 8] = ["a", "b/c", "b/d", "e/f/g", "e/f/h", "e/i", "j", "b/k/l"];
const DIRS: [&str; 4] = ["b", "e", "e/f", "b/k"];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (0..PATHS.len(), prop_oneof![proptest::collection::vec(any::<u8>(), 0..80), (1usize..3).prop_map(|n| vec![b'z'; n * 3000])]).prop_map(|(p, c)| Mutation::Write(p, c)),
        2 => (0..PATHS.len()).prop_map(Mutation::Delete),
        1 => (0..PATHS.len(), prop_oneof![Just(0o644u32), Just(0o755), Just(0o600), Just(0o4755)]).prop_map(|(p, m)| Mutation::Chmod(p, m)),
        1 => (0..PATHS.len(), 0..PATHS.len()).prop_map(|(p, t)| Mutation::Symlink(p, t)),
        1 => (0..PATHS.len()).prop_map(Mutation::MkdirOver),
        1 => (0..DIRS.len()).prop_map(Mutation::RemoveDir),
        1 => (0..PATHS.len(), any::<u8>(), any::<bool>()).prop_map(|(p, b, h)| Mutation::Large(p, b, h)),
        1 => (0..PATHS.len(), 0..PATHS.len()).prop_map(|(p, t)| Mutation::HardLink(p, t)),
        1 => (0..DIRS.len()).prop_map(Mutation::Ignored),
        1 => (0..DIRS.len(), prop_oneof![Just(0o555u32), Just(0o755)]).prop_map(|(d, m)| Mutation::ChmodDir(d, m)),
    ]
}

fn apply(root: &std::path::Path, m: &Mutation) {
    let clear = |p: &std::path::Path| {
        if let Ok(md) = std::fs::symlink_metadata(p) {
            if md.is_dir() {
                std::fs::remove_dir_all(p).unwrap()
            } else {
                std::fs::remove_file(p).unwrap()
            }
        }
    };
    match m {
        Mutation::Write(i, c) => {
            let p = root.join(PATHS[*i]);
            // A file where a directory or symlink stood on the way replaces it.
            let mut cur = root.to_path_buf();
            for comp in std::path::Path::new(PATHS[*i])
                .parent()
                .unwrap()
                .components()
            {
                cur.push(comp);
                if std::fs::symlink_metadata(&cur).is_ok_and(|m| !m.is_dir()) {
                    clear(&cur);
                }
            }
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir() || m.file_type().is_symlink())
            {
                clear(&p);
            }
            write(root, PATHS[*i], c);
        }
        Mutation::Delete(i) => clear(&root.join(PATHS[*i])),
        Mutation::Chmod(i, mode) => {
            let p = root.join(PATHS[*i]);
            if std::fs::symlink_metadata(&p).is_ok_and(|m| m.is_file()) {
                std::fs::set_permissions(p, std::fs::Permissions::from_mode(*mode)).unwrap();
            }
        }
        Mutation::Symlink(i, t) => {
            let p = root.join(PATHS[*i]);
            if p.parent().unwrap().is_dir() {
                clear(&p);
                std::os::unix::fs::symlink(PATHS[*t], p).unwrap();
            }
        }
        Mutation::MkdirOver(i) => {
            let p = root.join(PATHS[*i]);
            if p.parent().unwrap().is_dir() {
                clear(&p);
                std::fs::create_dir(&p).unwrap();
            }
        }
        Mutation::RemoveDir(i) => clear(&root.join(DIRS[*i])),
        Mutation::Large(i, byte, hole) => {
            use std::io::{Seek, SeekFrom, Write};
            let mut content = vec![*byte; 5 << 20];
            content[..4].copy_from_slice(b"head");
            apply(root, &Mutation::Write(*i, Vec::new()));
            let mut f = std::fs::File::create(root.join(PATHS[*i])).unwrap();
            if *hole {
                f.write_all(&content[..1 << 20]).unwrap();
                f.seek(SeekFrom::Start(4 << 20)).unwrap();
                f.write_all(&content[4 << 20..]).unwrap();
            } else {
                f.write_all(&content).unwrap();
            }
        }
        Mutation::HardLink(i, t) => {
            let (p, target) = (root.join(PATHS[*i]), root.join(PATHS[*t]));
            if i != t
                && p.parent().unwrap().is_dir()
                && std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_file())
            {
                clear(&p);
                std::fs::hard_link(target, p).unwrap();
            }
        }
        Mutation::Ignored(i) => {
            let d = root.join(DIRS[*i]);
            if std::fs::symlink_metadata(&d).is_ok_and(|m| m.is_dir()) {
                write(&d, "__pycache__/m.cpython-313.pyc", b"compiled");
            }
        }
        Mutation::ChmodDir(i, mode) => {
            let d = root.join(DIRS[*i]);
            if std::fs::symlink_metadata(&d).is_ok_and(|m| m.is_dir()) {
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(*mode)).unwrap();
            }
        }
    }
}

/// Ignored content: never in a version, compared on its own.
fn ignored(rel: &str) -> bool {
    rel.split('/').any(|c| c == "__pycache__")
}

/// Every directory holding ignored content.
fn ignored_homes(root: &Path) -> BTreeSet<String> {
    disk(root, &no_skip)
        .into_keys()
        .filter_map(|rel| {
            let (home, _) = rel.split_once("/__pycache__")?;
            Some(home.to_owned())
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
    #[test]
    fn restore_to_any_captured_version_gives_its_tree(steps in proptest::collection::vec(mutation(), 1..12), pick in any::<proptest::sample::Index>()) {
        let s = setup(|_| {});
        let w = s.work.path();
        let mut versions = vec![(s.env.head("main").unwrap(), disk(w, &ignored), common::link_groups(w, &ignored))];
        for m in &steps {
            apply(w, m);
            s.tracker.capture_now(Intent::new(IntentKind::Command, "mutate"), OpFlags::COMMAND).unwrap();
            let head = s.env.head("main").unwrap();
            let tree = disk(w, &ignored);
            prop_assert_eq!(&view(&s.env, &head), &tree);
            versions.push((head, tree, common::link_groups(w, &ignored)));
        }
        let (target, tree, groups) = pick.get(&versions).clone();
        let homes_before = ignored_homes(w);
        s.tracker.restore(&s.agent, &target, Intent::new(IntentKind::Restore, "back")).unwrap();
        prop_assert_eq!(disk(w, &ignored), tree.clone());
        prop_assert_eq!(common::link_groups(w, &ignored), groups);
        // Ignored content stays where its directory stays, and goes where it goes.
        for home in ignored_homes(w) {
            prop_assert!(tree.contains_key(&home), "{home}/__pycache__ outlived its directory");
        }
        for home in homes_before {
            if tree.contains_key(&home) && matches!(tree[&home], common::Entry::Dir { .. }) {
                prop_assert!(w.join(&home).join("__pycache__").exists(), "{home}/__pycache__ was removed");
            }
        }
    }
}
