//! Keys: a namespace plus a normalized relative path held as bytes.
//!
//! Linux file names are bytes, not UTF-8, so a key keeps the exact bytes it was given and only
//! escapes them for display. Validation happens once, at construction: a `Key` that exists is
//! normalized, so the rest of the crate never re-checks it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The longest key path accepted, in bytes: four times Linux's `PATH_MAX`, since a tree may
/// hold paths longer than one system call takes (they are walked a piece at a time). A path
/// beyond it is refused alone, never the capture it is part of.
pub const MAX_KEY_LEN: usize = 16 * 1024;
/// The longest single path segment accepted, in bytes (Linux's `NAME_MAX`).
pub const MAX_SEGMENT_LEN: usize = 255;

/// Which part of the keyspace a key lives in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Namespace {
    /// The workspace file tree.
    Fs,
    /// Typed domain objects: artifacts, reviews, test results, external references, secret
    /// references.
    Obj,
}

impl Namespace {
    /// Every namespace, in keyspace order.
    pub const ALL: [Namespace; 2] = [Namespace::Fs, Namespace::Obj];

    /// The short name used in displays and as the top segment of the tree.
    pub fn as_str(self) -> &'static str {
        match self {
            Namespace::Fs => "fs",
            Namespace::Obj => "obj",
        }
    }

    /// The namespace with this short name.
    pub fn parse(s: &str) -> Option<Namespace> {
        Namespace::ALL.into_iter().find(|n| n.as_str() == s)
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a key was refused. Nothing is changed by a refused key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The path was empty.
    #[error("the key path is empty")]
    Empty,
    /// The path started with `/`.
    #[error("the key path {path} is absolute; keys are relative to the environment root")]
    Absolute {
        /// The refused path, escaped.
        path: String,
    },
    /// Two slashes in a row, or a trailing slash.
    #[error("the key path {path} has an empty segment")]
    EmptySegment {
        /// The refused path, escaped.
        path: String,
    },
    /// A `.` or `..` segment.
    #[error("the key path {path} has a `.` or `..` segment; keys are normalized paths")]
    DotSegment {
        /// The refused path, escaped.
        path: String,
    },
    /// A NUL byte.
    #[error("the key path {path} contains a NUL byte")]
    Nul {
        /// The refused path, escaped.
        path: String,
    },
    /// Longer than [`MAX_KEY_LEN`] or with a segment longer than [`MAX_SEGMENT_LEN`].
    #[error("the key path is too long ({len} bytes; the limit is {limit})")]
    TooLong {
        /// The offending length.
        len: usize,
        /// The limit that was exceeded.
        limit: usize,
    },
    /// A textual key without a known `namespace:` prefix.
    #[error("unknown namespace in {0:?}; expected `fs:` or `obj:`")]
    UnknownNamespace(String),
}

/// A validated, normalized key: namespace plus relative path bytes with `/` separators.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize)]
#[serde(try_from = "RawKey")]
pub struct Key {
    ns: Namespace,
    path: Vec<u8>,
}

/// A key as read, before it is validated.
#[derive(Deserialize)]
struct RawKey {
    ns: Namespace,
    #[serde(deserialize_with = "serde_bytes_compat::deserialize")]
    path: Vec<u8>,
}

/// A key as written: [`RawKey`]'s shape, borrowed (keys are encoded in every operation record).
#[derive(Serialize)]
#[serde(rename = "RawKey")]
struct KeyRef<'a> {
    ns: Namespace,
    #[serde(serialize_with = "serde_bytes_compat::serialize")]
    path: &'a [u8],
}

impl Serialize for Key {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        KeyRef {
            ns: self.ns,
            path: &self.path,
        }
        .serialize(s)
    }
}

impl TryFrom<RawKey> for Key {
    type Error = KeyError;
    fn try_from(raw: RawKey) -> Result<Self, KeyError> {
        Key::new(raw.ns, raw.path)
    }
}

/// Paths serialize as a string when they are UTF-8 (readable JSON) and as a byte array otherwise.
mod serde_bytes_compat {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    #[derive(Serialize, Deserialize)]
    #[serde(untagged)]
    enum Repr {
        Text(String),
        Bytes(Vec<u8>),
    }

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(v) {
            Ok(t) if s.is_human_readable() => Repr::Text(t.to_owned()).serialize(s),
            _ if s.is_human_readable() => Repr::Bytes(v.to_vec()).serialize(s),
            _ => s.serialize_bytes(v),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        if d.is_human_readable() {
            Ok(match Repr::deserialize(d)? {
                Repr::Text(t) => t.into_bytes(),
                Repr::Bytes(b) => b,
            })
        } else {
            Vec::<u8>::deserialize(d)
        }
    }
}

/// Checks a relative path; shared by keys and key prefixes.
pub(crate) fn validate_path(path: &[u8], allow_empty: bool) -> Result<(), KeyError> {
    if path.is_empty() {
        return if allow_empty {
            Ok(())
        } else {
            Err(KeyError::Empty)
        };
    }
    let shown = || escape(path);
    if path.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong {
            len: path.len(),
            limit: MAX_KEY_LEN,
        });
    }
    if path.contains(&0) {
        return Err(KeyError::Nul { path: shown() });
    }
    if path[0] == b'/' {
        return Err(KeyError::Absolute { path: shown() });
    }
    for seg in path.split(|b| *b == b'/') {
        match seg {
            b"" => return Err(KeyError::EmptySegment { path: shown() }),
            b"." | b".." => return Err(KeyError::DotSegment { path: shown() }),
            s if s.len() > MAX_SEGMENT_LEN => {
                return Err(KeyError::TooLong {
                    len: s.len(),
                    limit: MAX_SEGMENT_LEN,
                });
            }
            _ => {}
        }
    }
    Ok(())
}

impl Key {
    /// Validates `path` and makes a key of it.
    pub fn new(ns: Namespace, path: impl Into<Vec<u8>>) -> Result<Key, KeyError> {
        let path = path.into();
        validate_path(&path, false)?;
        Ok(Key { ns, path })
    }

    /// A key in the workspace file tree.
    pub fn fs(path: impl Into<Vec<u8>>) -> Result<Key, KeyError> {
        Key::new(Namespace::Fs, path)
    }

    /// A key among the typed domain objects.
    pub fn obj(path: impl Into<Vec<u8>>) -> Result<Key, KeyError> {
        Key::new(Namespace::Obj, path)
    }

    /// The namespace.
    pub fn namespace(&self) -> Namespace {
        self.ns
    }

    /// The path bytes, `/`-separated, without a leading slash.
    pub fn path(&self) -> &[u8] {
        &self.path
    }

    /// The path's segments.
    pub fn segments(&self) -> impl Iterator<Item = &[u8]> {
        self.path.split(|b| *b == b'/')
    }

    /// The last segment (the file name).
    pub fn name(&self) -> &[u8] {
        self.segments().last().unwrap_or(&[])
    }

    /// The parent key, if the path has more than one segment.
    pub fn parent(&self) -> Option<Key> {
        let cut = self.path.iter().rposition(|b| *b == b'/')?;
        Some(Key {
            ns: self.ns,
            path: self.path[..cut].to_vec(),
        })
    }

    /// Appends one segment (validated).
    pub fn join(&self, segment: &[u8]) -> Result<Key, KeyError> {
        let mut p = self.path.clone();
        p.push(b'/');
        p.extend_from_slice(segment);
        Key::new(self.ns, p)
    }

    /// Whether this key is `prefix` or lies under it (segment-wise, not byte-wise).
    pub fn starts_with(&self, prefix: &KeyPrefix) -> bool {
        self.ns == prefix.ns
            && (prefix.path.is_empty()
                || (self.path.starts_with(&prefix.path)
                    && (self.path.len() == prefix.path.len()
                        || self.path[prefix.path.len()] == b'/')))
    }

    /// The path, escaped for display (non-UTF-8 bytes as `\xNN`).
    pub fn display_path(&self) -> String {
        escape(&self.path)
    }
}

/// Escapes bytes for display: valid UTF-8 stays, control characters, backslashes and invalid
/// bytes become `\xNN`. The escaping is unambiguous, so [`unescape`] reverses it.
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            if c.is_control() || c == '\\' {
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.push_str(&format!("\\x{b:02x}"));
                }
            } else {
                out.push(c);
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// Reverses [`escape`]. Returns `None` for a malformed escape.
pub fn unescape(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            if bytes.get(i + 1) != Some(&b'x') {
                return None;
            }
            let hex = s.get(i + 2..i + 4)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(out)
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ns, escape(&self.path))
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({self})")
    }
}

/// Parses `ns:path` with the escaping of [`escape`]; a bare path means the `fs` namespace.
impl FromStr for Key {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        let (ns, path) = split_namespace(s)?;
        Key::new(ns, path)
    }
}

fn split_namespace(s: &str) -> Result<(Namespace, Vec<u8>), KeyError> {
    let (ns, rest) = match s.split_once(':') {
        Some((ns, rest)) if !ns.contains('/') => (
            Namespace::parse(ns).ok_or_else(|| KeyError::UnknownNamespace(s.to_owned()))?,
            rest,
        ),
        _ => (Namespace::Fs, s),
    };
    let path = unescape(rest).ok_or_else(|| KeyError::UnknownNamespace(s.to_owned()))?;
    Ok((ns, path))
}

/// A namespace plus a (possibly empty) path prefix; selects a subtree for `list` and `diff`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KeyPrefix {
    ns: Namespace,
    path: Vec<u8>,
}

impl KeyPrefix {
    /// A validated prefix; an empty path selects the whole namespace.
    pub fn new(ns: Namespace, path: impl Into<Vec<u8>>) -> Result<KeyPrefix, KeyError> {
        let path = path.into();
        validate_path(&path, true)?;
        Ok(KeyPrefix { ns, path })
    }

    /// The whole namespace.
    pub fn all(ns: Namespace) -> KeyPrefix {
        KeyPrefix {
            ns,
            path: Vec::new(),
        }
    }

    /// The namespace.
    pub fn namespace(&self) -> Namespace {
        self.ns
    }

    /// The path bytes (may be empty).
    pub fn path(&self) -> &[u8] {
        &self.path
    }
}

impl From<&Key> for KeyPrefix {
    fn from(k: &Key) -> Self {
        KeyPrefix {
            ns: k.ns,
            path: k.path.clone(),
        }
    }
}

impl FromStr for KeyPrefix {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        let (ns, path) = split_namespace(s)?;
        KeyPrefix::new(ns, path)
    }
}

impl fmt::Display for KeyPrefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ns, escape(&self.path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn non_utf8_round_trips_through_display() {
        let k = Key::fs(b"dir/\xff\x00x".to_vec());
        assert!(matches!(k, Err(KeyError::Nul { .. })));
        let k = Key::fs(b"dir/\xffname\\x".to_vec()).unwrap();
        let shown = k.to_string();
        assert_eq!(shown, "fs:dir/\\xffname\\x5cx");
        assert_eq!(shown.parse::<Key>().unwrap(), k);
    }

    #[test]
    fn prefix_is_segment_aware() {
        let k = Key::fs("src/main.rs").unwrap();
        assert!(k.starts_with(&"fs:src".parse().unwrap()));
        assert!(!k.starts_with(&"fs:sr".parse().unwrap()));
        assert!(!k.starts_with(&"obj:src".parse().unwrap()));
        assert!(k.starts_with(&KeyPrefix::all(Namespace::Fs)));
    }
}
