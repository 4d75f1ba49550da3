//! A machine's blob store as the cache of a shared one, through the `SharedBlobs` port: what
//! it lacks is obtained in batches bounded by the bytes the values record, each blob checked
//! against its hash before it is kept, and what no machine shared is named, not invented.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::{Arc, Mutex};

use environment_core::{BlobError, BlobStore, Hash, PortError, ShareWindow, SharedBlobs};

/// A shared store held in memory, which remembers how it was asked.
#[derive(Default)]
struct Remote {
    blobs: Mutex<HashMap<Hash, Vec<u8>>>,
    /// The hashes of each `fetch_each` call.
    asked: Mutex<Vec<Vec<Hash>>>,
}

impl Remote {
    /// Keeps `bytes` under `hash`, whatever they hash to (a damaged object when they differ).
    fn hold(&self, hash: Hash, bytes: &[u8]) {
        self.blobs.lock().unwrap().insert(hash, bytes.to_vec());
    }
}

impl SharedBlobs for Remote {
    fn share(&self, local: &BlobStore, hashes: &[Hash]) -> Result<Box<dyn ShareWindow>, PortError> {
        for h in hashes {
            self.hold(*h, &local.get(h).unwrap());
        }
        Ok(Box::new(Open))
    }

    fn fetch(&self, hash: &Hash) -> Result<Option<Vec<u8>>, PortError> {
        Ok(self.blobs.lock().unwrap().get(hash).cloned())
    }

    fn fetch_each(
        &self,
        hashes: &[Hash],
        keep: &mut dyn FnMut(Hash, Option<Vec<u8>>) -> ControlFlow<()>,
    ) -> Result<(), PortError> {
        self.asked.lock().unwrap().push(hashes.to_vec());
        for hash in hashes {
            if keep(*hash, self.fetch(hash)?).is_break() {
                break;
            }
        }
        Ok(())
    }

    fn missing(&self, hashes: &[Hash]) -> Result<Vec<Hash>, PortError> {
        let held = self.blobs.lock().unwrap();
        Ok(hashes
            .iter()
            .filter(|h| !held.contains_key(h))
            .copied()
            .collect())
    }

    fn collect(
        &self,
        _live: &mut dyn FnMut() -> Result<HashSet<Hash>, PortError>,
    ) -> Result<u64, PortError> {
        Ok(0)
    }
}

struct Open;

impl ShareWindow for Open {
    fn check(&self) -> Result<(), PortError> {
        Ok(())
    }
}

/// A blob store in a new directory, as the cache of an empty shared store.
fn cache() -> (tempfile::TempDir, Arc<Remote>, BlobStore) {
    let dir = tempfile::tempdir().unwrap();
    let remote = Arc::new(Remote::default());
    let store = BlobStore::open(dir.path()).unwrap().sharing(remote.clone());
    (dir, remote, store)
}

fn hash_of(bytes: &[u8]) -> Hash {
    Hash(*blake3::hash(bytes).as_bytes())
}

/// `n` distinct small blobs, put in `remote` only.
fn remote_blobs(remote: &Remote, n: u8) -> Vec<(Hash, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let bytes = vec![i; 1000 + usize::from(i)];
            let hash = hash_of(&bytes);
            remote.hold(hash, &bytes);
            (hash, bytes)
        })
        .collect()
}

#[test]
fn what_a_machine_lacks_is_obtained_in_batches_bounded_by_the_recorded_bytes() {
    let (_dir, remote, store) = cache();
    let blobs = remote_blobs(&remote, 5);
    // One blob is held here already: it is not asked for.
    store.put(&blobs[4].1).unwrap();
    // Each value records 30 MiB: two fit in a batch of 64 MiB, a third does not.
    let wanted: Vec<(Hash, u64)> = blobs.iter().map(|(h, _)| (*h, 30 << 20)).collect();
    let never = hash_of(b"no machine shared this");
    let absent = store
        .obtain_all(&[wanted.clone(), vec![(never, 10), (blobs[0].0, 30 << 20)]].concat())
        .unwrap();
    assert_eq!(absent, vec![never]);
    let asked = remote.asked.lock().unwrap().clone();
    assert_eq!(
        asked,
        vec![
            vec![blobs[0].0, blobs[1].0],
            vec![blobs[2].0, blobs[3].0, never],
        ]
    );
    // Kept: read here with the shared store emptied.
    remote.blobs.lock().unwrap().clear();
    for (hash, bytes) in &blobs {
        assert_eq!(&store.get(hash).unwrap(), bytes);
    }
    // Asked again, nothing is fetched.
    assert_eq!(store.obtain_all(&wanted).unwrap(), Vec::<Hash>::new());
    assert_eq!(remote.asked.lock().unwrap().len(), 2);
}

#[test]
fn a_damaged_blob_among_many_is_an_error_and_is_not_kept() {
    let (_dir, remote, store) = cache();
    let blobs = remote_blobs(&remote, 6);
    let damaged = blobs[3].0;
    remote.hold(damaged, b"replaced by someone");
    // 40 MiB each as recorded: a batch each.
    let wanted: Vec<(Hash, u64)> = blobs.iter().map(|(h, _)| (*h, 40 << 20)).collect();
    let err = store.obtain_all(&wanted).unwrap_err();
    assert!(
        matches!(err, BlobError::Corrupt { expected, .. } if expected == damaged),
        "{err}"
    );
    assert!(!store.contains(&damaged));
    // The first failure ends it: the batches after it are not asked for.
    assert_eq!(remote.asked.lock().unwrap().len(), 4);
    assert!(store.contains(&blobs[2].0) && !store.contains(&blobs[4].0));
    // Without a shared store, what is lacking is named and nothing else happens.
    let alone = tempfile::tempdir().unwrap();
    let alone = BlobStore::open(alone.path()).unwrap();
    assert_eq!(
        alone.obtain_all(&wanted).unwrap(),
        wanted.iter().map(|(h, _)| *h).collect::<Vec<_>>()
    );
}

#[test]
fn a_torn_cached_copy_is_fetched_again_and_mended() {
    let (dir, remote, store) = cache();
    // Large enough to be a file of its own, not packed.
    let bytes: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let hash = hash_of(&bytes);
    remote.hold(hash, &bytes);
    assert!(store.obtain_all(&[(hash, 100_000)]).unwrap().is_empty());
    let cached = store.location(&hash).unwrap().path;
    assert_eq!(std::fs::read(&cached).unwrap(), bytes);
    // What a power loss can leave of a file written without an fsync.
    std::fs::set_permissions(&cached, mode(0o644)).unwrap();
    std::fs::write(&cached, &bytes[..4096]).unwrap();

    // Alone, the store reports the damage.
    let alone = BlobStore::open(dir.path()).unwrap();
    assert!(matches!(alone.get(&hash), Err(BlobError::Corrupt { .. })));
    // As a cache, it fetches the blob again and mends its copy.
    assert_eq!(store.get(&hash).unwrap(), bytes);
    assert_eq!(std::fs::read(&cached).unwrap(), bytes);
    // With nothing to fetch it from, the damage is an error, never wrong content.
    std::fs::set_permissions(&cached, mode(0o644)).unwrap();
    std::fs::write(&cached, b"torn").unwrap();
    remote.blobs.lock().unwrap().clear();
    assert!(store.get(&hash).is_err());
}

fn mode(mode: u32) -> std::fs::Permissions {
    use std::os::unix::fs::PermissionsExt;
    std::fs::Permissions::from_mode(mode)
}
