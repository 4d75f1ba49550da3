//! Small blobs live in packs: shared between processes, collected without losing a live blob,
//! and an index torn or left unconfirmed by a crash is repaired when the store opens.
//!
//! Two `BlobStore`s opened on one directory behave as two processes would: each appends to
//! packs of its own and locks them (`flock` locks belong to open files, not processes).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use environment_core::blob::PACKED_MAX;
use environment_core::{
    ActRequest, ActorId, BlobStore, EnvError, Intent, Key, LocalEnvironment, Options, Value,
};

fn content(tag: &str, i: usize) -> Vec<u8> {
    format!("{tag} {i} ").repeat(40).into_bytes()
}

/// The sizes of the pack files under a blob store.
fn pack_sizes(blobs: &Path) -> Vec<u64> {
    std::fs::read_dir(blobs.join("packs"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
        .map(|e| e.metadata().unwrap().len())
        .collect()
}

fn pack_bytes(blobs: &Path) -> u64 {
    pack_sizes(blobs).iter().sum()
}

fn act_files(env: &LocalEnvironment, actor: &ActorId, tag: &str, n: usize) -> Vec<Value> {
    let mut req = ActRequest::new(actor.clone(), Intent::edit(format!("write {tag}")));
    for i in 0..n {
        req = req.put(
            Key::fs(format!("{tag}/{i}")).unwrap(),
            Value::file(content(tag, i)),
        );
    }
    let v = env.act_blocking(req).unwrap().version;
    (0..n)
        .map(|i| {
            env.read(actor, &Key::fs(format!("{tag}/{i}")).unwrap(), &v)
                .unwrap()
                .unwrap()
        })
        .collect()
}

#[test]
fn small_blobs_are_packed_and_seen_by_every_store_on_the_directory() {
    let dir = tempfile::tempdir().unwrap();
    let a = BlobStore::open(dir.path()).unwrap();
    let b = BlobStore::open(dir.path()).unwrap();
    let small = a.put(b"written by a").unwrap();
    let loc = a.location(&small).unwrap();
    assert!(loc.path.starts_with(dir.path().join("packs")), "{loc:?}");
    // b learns of a's pack when it first misses.
    assert!(b.contains(&small));
    assert_eq!(b.get(&small).unwrap(), b"written by a");
    let mid = b.put_unsynced(&vec![3u8; PACKED_MAX]).unwrap();
    b.sync().unwrap();
    assert_eq!(a.get(&mid).unwrap().len(), PACKED_MAX);
    // Past the limit, a blob is a file of its own.
    let big = a.put(&vec![4u8; PACKED_MAX + 1]).unwrap();
    assert_eq!(a.location(&big).unwrap().offset, 0);
    assert!(
        !a.location(&big)
            .unwrap()
            .path
            .starts_with(dir.path().join("packs"))
    );
    assert_eq!(b.get(&big).unwrap().len(), PACKED_MAX + 1);
    drop((a, b));
    let c = BlobStore::open(dir.path()).unwrap();
    let mut listed = c.list().unwrap();
    listed.sort();
    let mut expected = vec![small, mid, big];
    expected.sort();
    assert_eq!(listed, expected);
    assert_eq!(
        c.usage().unwrap().bytes,
        12 + PACKED_MAX as u64 + PACKED_MAX as u64 + 1
    );
}

#[test]
fn gc_rewrites_a_mostly_dead_pack_and_marks_dead_blobs_in_a_mostly_live_one() {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let actor = ActorId::new("agent:gc").unwrap();
    let blobs = home.path().join("blobs");

    // 80 blobs nothing refers to, 20 that a version holds: one pack, mostly dead.
    let orphans: Vec<_> = (0..80)
        .map(|i| env.blobs().put(&content("orphan", i)).unwrap())
        .collect();
    let live = act_files(&env, &actor, "live", 20);
    let before = pack_bytes(&blobs);
    let report = env.gc(&actor).unwrap();
    assert_eq!((report.removed, report.kept), (80, 20), "{report:?}");
    assert_eq!(report.packs_rewritten, 1);
    let orphan_bytes: u64 = (0..80).map(|i| content("orphan", i).len() as u64).sum();
    assert_eq!(report.bytes_removed, orphan_bytes);
    assert!(
        pack_bytes(&blobs) * 4 < before,
        "the dead bytes are gone from disk: {} of {before}",
        pack_bytes(&blobs)
    );
    for o in &orphans {
        assert!(!env.blobs().contains(o));
    }
    for (i, v) in live.iter().enumerate() {
        assert_eq!(env.content(v).unwrap(), content("live", i));
    }

    // A few dead among many live: marked dead in place, not rewritten.
    let few: Vec<_> = (0..5)
        .map(|i| env.blobs().put(&content("few", i)).unwrap())
        .collect();
    let more = act_files(&env, &actor, "more", 50);
    let report = env.gc(&actor).unwrap();
    assert_eq!((report.removed, report.kept), (5, 70), "{report:?}");
    assert_eq!(report.packs_rewritten, 0);
    for f in &few {
        assert!(!env.blobs().contains(f));
    }
    drop(env);
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    for f in &few {
        assert!(!env.blobs().contains(f), "dead stays dead after reopening");
        assert!(matches!(
            env.blobs().get(f),
            Err(environment_core::BlobError::Missing(_))
        ));
    }
    for (i, v) in more.iter().enumerate() {
        assert_eq!(env.content(v).unwrap(), content("more", i));
    }
    for (i, v) in live.iter().enumerate() {
        assert_eq!(env.content(v).unwrap(), content("live", i));
    }
    env.verify_deep(&environment_core::ActorId::system())
        .unwrap();
    assert_eq!(env.blobs().usage().unwrap().blobs, 70);
}

#[test]
fn gc_leaves_a_pack_another_writer_still_appends_to() {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let actor = ActorId::new("agent:gc").unwrap();
    let other = BlobStore::open(home.path().join("blobs")).unwrap();
    let pending = other.put_unsynced(b"stored, not yet referenced").unwrap();
    let report = env.gc(&actor).unwrap();
    assert_eq!(report.removed, 0, "{report:?}");
    assert_eq!(other.get(&pending).unwrap(), b"stored, not yet referenced");
    // Once that writer is gone, its pack is collected like any other.
    drop(other);
    let report = env.gc(&actor).unwrap();
    assert_eq!(report.removed, 1, "{report:?}");
    assert!(!env.blobs().contains(&pending));
}

#[test]
fn a_torn_or_unconfirmed_index_tail_is_repaired_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let store = BlobStore::open(dir.path()).unwrap();
    let durable = store.put(b"synced before the crash").unwrap();
    let damaged = store.put_unsynced(b"bytes lost by the crash").unwrap();
    let after = store
        .put_unsynced(b"recorded after the damaged one")
        .unwrap();
    let at = store.location(&damaged).unwrap();
    drop(store);
    // As a power loss can leave it: the bytes of an unconfirmed blob never reached the disk,
    // and a record was half written.
    std::fs::set_permissions(&at.path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut pack = std::fs::read(&at.path).unwrap();
    pack[at.offset as usize] ^= 0xff;
    std::fs::write(&at.path, pack).unwrap();
    let idx = at.path.with_extension("idx");
    std::fs::OpenOptions::new()
        .append(true)
        .open(&idx)
        .unwrap()
        .write_all(&[7u8; 30])
        .unwrap();

    let store = BlobStore::open(dir.path()).unwrap();
    assert_eq!(store.get(&durable).unwrap(), b"synced before the crash");
    assert!(
        !store.contains(&damaged),
        "a record naming lost bytes is dropped"
    );
    assert!(
        !store.contains(&after),
        "records after the first bad one are dropped too"
    );
    // Stored again, they are whole; the repaired index stays valid on the next opening.
    store.put(b"bytes lost by the crash").unwrap();
    store.put(b"recorded after the damaged one").unwrap();
    drop(store);
    let store = BlobStore::open(dir.path()).unwrap();
    for (h, want) in [
        (durable, &b"synced before the crash"[..]),
        (damaged, b"bytes lost by the crash"),
        (after, b"recorded after the damaged one"),
    ] {
        assert_eq!(store.get(&h).unwrap(), want);
    }
}

#[test]
fn a_damaged_packed_blob_is_an_error_never_wrong_content() {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let actor = ActorId::new("agent:reader").unwrap();
    let values = act_files(&env, &actor, "f", 3);
    let at = env.blobs().location(&values[1].blob().unwrap()).unwrap();
    std::fs::set_permissions(&at.path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut pack = std::fs::read(&at.path).unwrap();
    pack[at.offset as usize + 5] ^= 1;
    std::fs::write(&at.path, pack).unwrap();
    assert!(matches!(
        env.content(&values[1]),
        Err(EnvError::Blob(environment_core::BlobError::Corrupt { .. }))
    ));
    assert_eq!(env.content(&values[0]).unwrap(), content("f", 0));
    assert_eq!(env.content(&values[2]).unwrap(), content("f", 2));
}

#[test]
fn gc_merges_the_small_packs_short_lived_writers_leave() {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let actor = ActorId::new("agent:gc").unwrap();
    let blobs = home.path().join("blobs");
    let packs = || pack_sizes(&blobs).len();
    // Five writers that each store one blob and exit, as five command-line calls would.
    let mut kept = Vec::new();
    for i in 0..5 {
        let store = BlobStore::open(&blobs).unwrap();
        let h = store.put(&content("call", i)).unwrap();
        env.pin_blob(&h, "test").unwrap();
        kept.push(h);
    }
    assert_eq!(packs(), 5);
    let report = env.gc(&actor).unwrap();
    assert_eq!((report.kept, report.packs_rewritten), (5, 5), "{report:?}");
    assert_eq!(packs(), 1, "merged into one pack");
    drop(env);
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    for (i, h) in kept.iter().enumerate() {
        assert_eq!(env.blobs().get(h).unwrap(), content("call", i));
    }
    // One small pack is left as it is.
    assert_eq!(env.gc(&actor).unwrap().packs_rewritten, 0);
}

#[test]
fn parallel_writers_on_a_reopened_store_lose_no_blob() {
    // A store opened by a new process reads its pack indexes on first use; writers arriving
    // together must not race that first read into forgetting a pack one of them just made.
    for round in 0..60u32 {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = BlobStore::open(dir.path()).unwrap();
            for i in 0..200u32 {
                store.put(format!("old {round} {i}").as_bytes()).unwrap();
            }
        }
        let store = std::sync::Arc::new(BlobStore::open(dir.path()).unwrap());
        let written: Vec<_> = (0..8u32)
            .map(|t| {
                let store = store.clone();
                std::thread::spawn(move || {
                    (0..100u32)
                        .map(|i| {
                            let bytes = format!("new {round} {t} {i}").into_bytes();
                            (store.put_unsynced(&bytes).unwrap(), bytes)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let written: Vec<_> = written
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        store.sync().unwrap();
        for (hash, bytes) in &written {
            assert_eq!(&store.get(hash).unwrap(), bytes, "round {round}");
        }
    }
}
