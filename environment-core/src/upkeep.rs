//! Upkeep's reports: what a garbage collection removed and what an integrity check covered.

use serde::{Deserialize, Serialize};

/// What a garbage collection did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    /// Blobs still referenced.
    pub kept: u64,
    /// Blobs deleted.
    pub removed: u64,
    /// Bytes of content removed (a pack's share is freed on disk when the pack is rewritten).
    pub bytes_removed: u64,
    /// Packs rewritten without their dead blobs.
    #[serde(default)]
    pub packs_rewritten: u64,
    /// Temporary files of dead writers removed.
    pub temp_removed: u64,
    /// Tree nodes that only dropped versions used, removed.
    pub nodes_removed: u64,
    /// Blobs removed from the store the environment's machines share, if it has one.
    #[serde(default)]
    pub shared_removed: u64,
}

/// What an integrity check covered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    /// Operations re-hashed.
    pub ops: u64,
    /// Tree nodes re-hashed.
    pub nodes: u64,
    /// Blobs referenced (checked present; re-hashed with `deep`).
    pub blobs: u64,
}
