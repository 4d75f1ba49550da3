//! The port to a blob store shared by the machines of one environment (a bucket in object
//! storage): each machine's own blob store is then its cache of the shared one. What a machine
//! stores is shared before the operation that refers to it commits, and what it lacks is
//! fetched when read, checked against its hash.

use std::collections::HashSet;

use crate::error::PortError;
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
