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

/// A map keyed by [`struct@Hash`]es, hashed by [`DigestHasher`].
pub type DigestMap<V> = std::collections::HashMap<Hash, V, DigestState>;

/// Builds [`DigestHasher`]s with this process's secret mix.
#[derive(Clone, Copy, Debug)]
pub struct DigestState {
    seed: u64,
}

impl Default for DigestState {
    fn default() -> DigestState {
        use std::hash::BuildHasher;
        static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
        let seed =
            *SEED.get_or_init(|| std::collections::hash_map::RandomState::new().hash_one(0u8));
        DigestState { seed }
    }
}

impl std::hash::BuildHasher for DigestState {
    type Hasher = DigestHasher;
    fn build_hasher(&self) -> DigestHasher {
        DigestHasher {
            state: self.seed,
            seed: self.seed,
        }
    }
}

/// Hashes a [`struct@Hash`] for a hash map from its own bytes: a digest is uniform already, so
/// folding it is enough, where SipHash over its 32 bytes costs more than the lookup. The fold
/// ends with a multiply by this process's secret odd seed, so that content ground to collide
/// in a map's buckets in one process does not collide in another.
#[derive(Clone, Copy, Debug)]
pub struct DigestHasher {
    state: u64,
    seed: u64,
}

impl std::hash::Hasher for DigestHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.state = self.state.rotate_left(29) ^ u64::from_le_bytes(word);
        }
    }

    fn write_usize(&mut self, _: usize) {
        // The length prefix of the digest's array: always 32.
    }

    fn finish(&self) -> u64 {
        let mixed = (self.state ^ (self.state >> 32)).wrapping_mul(self.seed | 1);
        mixed ^ (mixed >> 29)
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn a_digest_map_finds_what_it_holds_and_spreads_digests_that_share_a_prefix() {
        let mut map = DigestMap::default();
        for i in 0u32..10_000 {
            map.insert(Hash::of(b"test", &i.to_le_bytes()), i);
        }
        for i in 0u32..10_000 {
            assert_eq!(map.get(&Hash::of(b"test", &i.to_le_bytes())), Some(&i));
        }
        assert!(!map.contains_key(&Hash::of(b"test", b"absent")));
        // Digests equal in their first eight bytes still hash apart.
        let state = DigestState::default();
        let mut a = Hash([7; 32]);
        let b = a;
        a.0[31] = 8;
        assert_ne!(state.hash_one(a), state.hash_one(b));
    }
}
