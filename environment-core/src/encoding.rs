//! Encodings written on the writer's hot path: postcard's wire format, which stored records and
//! hashed forms use, produced with as little per-byte work as the format allows.
//!
//! serde hands byte strings to a serializer one byte at a time unless told otherwise, and a
//! fixed-size array (a hash) always: encoding an act's nodes that way was a fifth of the
//! writer's work. The hottest forms (tree nodes and their values) are therefore written directly
//! in the wire format; property tests hold each to what the derives write, byte for byte.

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

/// An unsigned integer as postcard writes it: seven bits a byte, low bits first.
pub(crate) fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A signed integer as postcard writes it: zigzag-mapped to unsigned, then [`varint`].
pub(crate) fn signed(out: &mut Vec<u8>, v: i64) {
    varint(out, ((v << 1) ^ (v >> 63)) as u64);
}

/// A byte string (or a string's bytes) as postcard writes it: its length, then the bytes.
pub(crate) fn byte_string(out: &mut Vec<u8>, b: &[u8]) {
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}
