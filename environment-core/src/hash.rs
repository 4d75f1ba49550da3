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

/// Byte strings (names, paths, inline content) are encoded with `serialize_bytes`, which
/// serde's derive does not use for `Vec<u8>`: it spells them as sequences, one call per byte. Both
/// give the same output in postcard (a length, then the bytes) and in JSON (an array of
/// numbers), so nothing stored or hashed changes; the derived `Deserialize` still reads them.
pub(crate) fn bytes<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
    s.serialize_bytes(v)
}

/// [`bytes`] for an optional byte string.
pub(crate) fn opt_bytes<S: serde::Serializer>(
    v: &Option<Vec<u8>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        Some(b) => s.serialize_some(&Bytes(b)),
        None => s.serialize_none(),
    }
}

/// A byte string that serializes as [`bytes`] does.
pub(crate) struct Bytes<'a>(pub &'a [u8]);

impl Serialize for Bytes<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(self.0)
    }
}

thread_local! {
    /// Scratch space for encodings that are hashed or copied right away: encoding into a fresh
    /// `Vec` grows it a few bytes at a time, which showed as a tenth of the writer's work.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Calls `f` with the postcard encoding of `value`, built in a reused per-thread buffer.
pub(crate) fn with_encoding<T: serde::Serialize + ?Sized, R>(
    value: &T,
    f: impl FnOnce(&[u8]) -> R,
) -> R {
    with_written(|buf| encode_into(value, buf), f)
}

/// Calls `f` with what `write` appends to an empty, reused per-thread buffer.
pub(crate) fn with_written<R>(write: impl FnOnce(&mut Vec<u8>), f: impl FnOnce(&[u8]) -> R) -> R {
    SCRATCH.with(|cell| {
        // Taken, not borrowed: `f` may encode something itself.
        let mut buf = cell.take();
        buf.clear();
        write(&mut buf);
        let r = f(&buf);
        cell.replace(buf);
        r
    })
}

/// Appends the postcard encoding of `value` to `out`.
pub(crate) fn encode_into<T: serde::Serialize + ?Sized>(value: &T, out: &mut Vec<u8>) {
    // Encoding plain data into memory does not fail.
    *out = postcard::to_extend(value, std::mem::take(out)).unwrap_or_default();
}
