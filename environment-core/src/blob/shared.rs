//! The port to a blob store shared by the machines of one environment (a bucket in object
//! storage): each machine's own blob store is then its cache of the shared one. What a machine
//! stores is shared before the operation that refers to it commits, and what it lacks is
//! fetched when read, checked against its hash.

use std::collections::HashSet;

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

/// How many times blobs are shared again when sharing itself outlasted the window (it waited
/// out another machine's collection): no collection runs then, so the next share is quick.
const SHARE_ATTEMPTS: usize = 3;

impl BlobStore {
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
