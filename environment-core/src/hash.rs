//! Content hashes: the names of blobs, tree nodes and operations.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A blake3 digest. Blobs, tree nodes and operation records are all named by one.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Hash(pub [u8; 32]);

impl Hash {
    /// Hashes `bytes` under a domain tag, so that a blob can never be mistaken for a node or an op
    /// with the same bytes.
    pub fn of(domain: &[u8], bytes: &[u8]) -> Hash {
        let mut h = blake3::Hasher::new();
        h.update(domain);
        h.update(&[0]);
        h.update(bytes);
        Hash(*h.finalize().as_bytes())
    }

    /// The lowercase hex spelling (64 characters).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The first `n` hex characters, for display.
    pub fn short(&self, n: usize) -> String {
        let mut s = self.to_hex();
        s.truncate(n.min(64));
        s
    }

    /// Reads a hash from a 32-byte slice.
    pub fn from_slice(bytes: &[u8]) -> Option<Hash> {
        <[u8; 32]>::try_from(bytes).ok().map(Hash)
    }
}

impl fmt::Display for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Hash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Hash({})", self.short(12))
    }
}

/// A string that is not 64 hex characters.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("not a 64-character hex hash: {0:?}")]
pub struct ParseHashError(pub String);

impl FromStr for Hash {
    type Err = ParseHashError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).map_err(|_| ParseHashError(s.to_owned()))?;
        Ok(Hash(out))
    }
}
