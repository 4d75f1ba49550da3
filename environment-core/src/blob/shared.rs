//! The port to a blob store shared by the machines of one environment (a bucket in object
//! storage): each machine's own blob store is then its cache of the shared one. What a machine
//! stores is shared before the operation that refers to it commits, and what it lacks is
//! fetched when read, checked against its hash.

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::Arc;

use crate::error::{BlobError, PortError};
use crate::hash::Hash;

use super::BlobStore;

/// Blobs shared by every machine of an environment.
///
/// A shared store may collect what nothing refers to while other machines write: what a
/// writer shares is safe from collection only for a while, which the [`ShareWindow`] it gets
/// back measures; the operation that refers to the blobs commits only while it is open.
pub trait SharedBlobs: Send + Sync {
    /// Makes the blobs named (each held by `local`) readable by every machine. Call it before
    /// the operation that refers to them commits, and check the window right before that.
    fn share(&self, local: &BlobStore, hashes: &[Hash]) -> Result<Box<dyn ShareWindow>, PortError>;

    /// The blob's bytes, checked against its hash, or `None` when no machine shared it.
    fn fetch(&self, hash: &Hash) -> Result<Option<Vec<u8>>, PortError>;

    /// Fetches each of `hashes` and hands it to `keep` as it arrives, in any order: its bytes
    /// (which the caller checks against the hash), or `None` when no machine shared it. A store
    /// reached over a network has many requests in flight, so a new working copy waits for
    /// the bucket's latency once per batch rather than once per file. Stops, with no error,
    /// when `keep` breaks.
    fn fetch_each(
        &self,
        hashes: &[Hash],
        keep: &mut dyn FnMut(Hash, Option<Vec<u8>>) -> ControlFlow<()>,
    ) -> Result<(), PortError> {
        for hash in hashes {
            if keep(*hash, self.fetch(hash)?).is_break() {
                break;
            }
        }
        Ok(())
    }

    /// Which of `hashes` the shared store lacks.
    fn missing(&self, hashes: &[Hash]) -> Result<Vec<Hash>, PortError>;

    /// Removes the shared blobs nothing refers to and that no writer may still commit on.
    /// `live` reads every blob committed state refers to; it is called once the collection has
    /// announced itself to writers, so what they commit meanwhile is either in it or spared.
    /// Returns how many blobs were removed.
    fn collect(
        &self,
        live: &mut dyn FnMut() -> Result<HashSet<Hash>, PortError>,
    ) -> Result<u64, PortError>;
}

/// How long an operation may still commit on the blobs a writer shared.
pub trait ShareWindow: Send + Sync {
    /// Fails once the blobs may have been collected: the operation must not commit (it is
    /// refused, and the caller may try it again).
    fn check(&self) -> Result<(), PortError>;
}

/// A shared store, named in `Debug` output only by its presence.
pub(super) struct Shared(Arc<dyn SharedBlobs>);

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedBlobs")
    }
}

/// How many times blobs are shared again when sharing itself outlasted the window (it waited
/// out another machine's collection): no collection runs then, so the next share is quick.
const SHARE_ATTEMPTS: usize = 3;

/// What `lacking` is asked for in: runs of at most [`FETCH_BYTES`] (a blob larger than that
/// alone).
fn batches(lacking: &[(Hash, u64)]) -> Vec<Vec<Hash>> {
    let mut all = Vec::new();
    let mut batch = Vec::new();
    let mut bytes = 0u64;
    for (hash, size) in lacking {
        if !batch.is_empty() && bytes.saturating_add(*size) > FETCH_BYTES {
            all.push(std::mem::take(&mut batch));
            bytes = 0;
        }
        batch.push(*hash);
        bytes = bytes.saturating_add(*size);
    }
    if !batch.is_empty() {
        all.push(batch);
    }
    all
}

/// The most a chunked file of `size` bytes has as its manifest (which records no size of its
/// own): a piece each `CHUNK_MIN` bytes, each well under 64 bytes encoded.
fn manifest_size(size: u64) -> u64 {
    (size / super::CHUNK_MIN as u64 + 1) * 64
}

/// At most this many bytes (as their values record them) are asked of the shared store in one
/// go: it fetches many blobs at once, and this bounds what is held in memory meanwhile.
const FETCH_BYTES: u64 = 64 << 20;

impl BlobStore {
    /// This store as the cache of `shared`, the store of every machine of the environment:
    /// what is missing here is fetched from it when read (see [`BlobStore::get`]).
    pub fn sharing(mut self, shared: Arc<dyn SharedBlobs>) -> BlobStore {
        self.shared = Some(Shared(shared));
        self
    }

    /// The store shared by the environment's machines, if this one caches one.
    pub fn shared(&self) -> Option<&Arc<dyn SharedBlobs>> {
        self.shared.as_ref().map(|s| &s.0)
    }

    /// Whether the blob is here, fetched from the shared store (and kept) when it is not.
    pub fn obtain(&self, hash: &Hash) -> Result<bool, BlobError> {
        if self.contains(hash) {
            return Ok(true);
        }
        match self.fetch(hash) {
            Ok(_) => Ok(true),
            Err(BlobError::Missing(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Fetches a blob missing here from the shared store, checks it against its hash and
    /// keeps it; [`BlobError::Missing`] when there is no shared store or it lacks the blob.
    pub(super) fn fetch(&self, hash: &Hash) -> Result<Vec<u8>, BlobError> {
        let Some(Shared(shared)) = &self.shared else {
            return Err(BlobError::Missing(*hash));
        };
        let bytes = shared
            .fetch(hash)
            .map_err(BlobError::Shared)?
            .ok_or(BlobError::Missing(*hash))?;
        self.keep_fetched(hash, &bytes)?;
        Ok(bytes)
    }

    /// Keeps a blob fetched from the shared store once it hashes to its name: whatever the
    /// adapter checked, content from elsewhere is never taken on trust.
    fn keep_fetched(&self, hash: &Hash, bytes: &[u8]) -> Result<(), BlobError> {
        let actual = Hash(*blake3::hash(bytes).as_bytes());
        if actual != *hash {
            return Err(BlobError::Corrupt {
                expected: *hash,
                actual,
            });
        }
        // A cache, not a record: no fsync (a copy lost in a crash is fetched again).
        self.put_unsynced(bytes)?;
        Ok(())
    }

    /// Makes every blob of `wanted` held here: those missing are fetched from the shared
    /// store together ([`SharedBlobs::fetch_each`]), checked and kept. Each blob comes with the
    /// size its value records, which bounds the bytes asked for in one go. Returns those
    /// missing here that no machine shared (all those missing, without a shared store). Call
    /// it before reading many blobs a machine may lack (a restore into a new working copy), so
    /// each read finds its blob here.
    pub fn obtain_all(&self, wanted: &[(Hash, u64)]) -> Result<Vec<Hash>, BlobError> {
        let mut seen = HashSet::new();
        let held = |h: &Hash| self.packs.known(h) || self.loose_path(h).exists();
        let mut lacking: Vec<(Hash, u64)> = wanted
            .iter()
            .filter(|(h, _)| seen.insert(*h) && !held(h))
            .copied()
            .collect();
        if lacking.is_empty() {
            return Ok(Vec::new());
        }
        // One look at what other processes packed since, rather than one per missing blob.
        self.packs.refresh()?;
        lacking.retain(|(h, _)| !held(h));
        let Some(Shared(shared)) = &self.shared else {
            return Ok(lacking.into_iter().map(|(h, _)| h).collect());
        };
        let mut absent = Vec::new();
        for batch in batches(&lacking) {
            let mut failed = None;
            shared
                .fetch_each(&batch, &mut |hash, bytes| {
                    let kept = match bytes {
                        Some(bytes) => self.keep_fetched(&hash, &bytes),
                        None => {
                            absent.push(hash);
                            Ok(())
                        }
                    };
                    kept.map_or_else(
                        |e| {
                            failed = Some(e);
                            ControlFlow::Break(())
                        },
                        |()| ControlFlow::Continue(()),
                    )
                })
                .map_err(BlobError::Shared)?;
            // The first failure ends it: no further batch is asked for.
            if let Some(e) = failed {
                return Err(e);
            }
        }
        Ok(absent)
    }

    /// [`BlobStore::obtain_all`] of the blobs the values' contents are kept in: each blob, and
    /// each chunked content's manifest and then its pieces.
    pub fn obtain_contents<'v>(
        &self,
        values: impl IntoIterator<Item = &'v crate::value::Value>,
    ) -> Result<Vec<Hash>, BlobError> {
        use crate::value::Content;
        let mut blobs = Vec::new();
        let mut manifests = Vec::new();
        for value in values {
            match &value.content {
                Content::Inline(_) => {}
                Content::Blob(h) => blobs.push((*h, value.meta.size)),
                Content::Chunks(m) => {
                    blobs.push((*m, manifest_size(value.meta.size)));
                    manifests.push(*m);
                }
            }
        }
        let mut absent = self.obtain_all(&blobs)?;
        let shared_by_none: HashSet<Hash> = absent.iter().copied().collect();
        let mut pieces = Vec::new();
        for m in manifests {
            if !shared_by_none.contains(&m) {
                pieces.extend(self.manifest(&m)?.pieces.iter().map(|p| (p.hash, p.len)));
            }
        }
        absent.extend(self.obtain_all(&pieces)?);
        Ok(absent)
    }

    /// The blobs a value's content is kept in: its blob, or its manifest and every chunk.
    pub fn blobs_of(&self, content: &crate::value::Content) -> Result<Vec<Hash>, BlobError> {
        use crate::value::Content;
        Ok(match content {
            Content::Inline(_) => Vec::new(),
            Content::Blob(h) => vec![*h],
            Content::Chunks(m) => {
                let mut all = vec![*m];
                let mut seen = HashSet::new();
                for p in self.manifest(m)?.pieces {
                    if seen.insert(p.hash) {
                        all.push(p.hash);
                    }
                }
                all
            }
        })
    }

    /// Shares `hashes` (held here) with the other machines, through the shared store if this
    /// store caches one, and gives the window still open on them; `None` without a shared
    /// store or blobs.
    pub(crate) fn share(&self, hashes: &[Hash]) -> Result<Option<Box<dyn ShareWindow>>, BlobError> {
        let Some(shared) = self.shared() else {
            return Ok(None);
        };
        if hashes.is_empty() {
            return Ok(None);
        }
        let mut attempt = 1;
        loop {
            let window = shared.share(self, hashes).map_err(BlobError::Shared)?;
            match window.check() {
                Ok(()) => return Ok(Some(window)),
                Err(e) if attempt == SHARE_ATTEMPTS => return Err(BlobError::Shared(e)),
                Err(_) => attempt += 1,
            }
        }
    }
}
