//! Round trip: random mutations of a tree, a capture after each, then a restore to a random
//! earlier version gives exactly that version's tree.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::PermissionsExt;

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
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
    #[test]
    fn restore_to_any_captured_version_gives_its_tree(steps in proptest::collection::vec(mutation(), 1..12), pick in any::<proptest::sample::Index>()) {
        let s = setup(|_| {});
        let mut versions = vec![(s.env.head("main").unwrap(), disk(s.work.path(), &no_skip))];
        for m in &steps {
            apply(s.work.path(), m);
            s.tracker.capture_now(Intent::new(IntentKind::Command, "mutate"), OpFlags::COMMAND).unwrap();
            let head = s.env.head("main").unwrap();
            let tree = disk(s.work.path(), &no_skip);
            prop_assert_eq!(&view(&s.env, &head), &tree);
            versions.push((head, tree));
        }
        let (target, tree) = pick.get(&versions).clone();
        s.tracker.restore(&s.agent, &target, Intent::new(IntentKind::Restore, "back")).unwrap();
        prop_assert_eq!(disk(s.work.path(), &no_skip), tree);
    }
}
