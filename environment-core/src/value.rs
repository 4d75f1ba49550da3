//! Values: content plus metadata.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::encoding::{byte_string, signed, varint};
use crate::hash::Hash;

/// Content at most this long is kept inline in the tree node; longer content goes to the blob
/// store. Small enough that a directory node of small files stays small.
pub const INLINE_MAX: usize = 64;

/// What a key holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[non_exhaustive]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A symbolic link; the target is in [`Meta::symlink_target`].
    Symlink,
    /// A directory marker (keeps an empty directory and its mode).
    Dir,
    /// A named pipe (recorded, never opened).
    Fifo,
    /// A Unix socket (recorded, never opened).
    Socket,
    /// A character or block device (recorded, never opened).
    Device,
    /// A build or run artifact.
    Artifact,
    /// A review of a change.
    Review,
    /// The result of a test run.
    TestResult,
    /// A reference to something outside: an issue, a pull request, a deployment.
    ExternalRef,
    /// A reference to a secret: a name and a provider, never the secret's value.
    SecretRef,
    /// Two sides of a merge that changed the same key differently; see [`crate::Conflict`].
    Conflict,
}

/// Where the bytes of a value are.
#[derive(Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Content {
    /// Small content held in the tree node itself.
    Inline(Vec<u8>),
    /// Content in the blob store, named by its blake3 hash.
    Blob(Hash),
    /// A large or sparse file in chunks: the blob named is its [`crate::blob::Manifest`].
    Chunks(Hash),
}

impl fmt::Debug for Content {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Content::Inline(b) => write!(f, "Inline({:?})", crate::key::escape(b)),
            Content::Blob(h) => write!(f, "Blob({})", h.short(12)),
            Content::Chunks(h) => write!(f, "Chunks({})", h.short(12)),
        }
    }
}

/// Everything about a value but its bytes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Meta {
    /// What the key holds.
    pub kind: EntryKind,
    /// Unix mode bits, including setuid/setgid/sticky (file type bits excluded).
    pub mode: u32,
    /// Length of the content in bytes (for a sparse file, its apparent size).
    pub size: u64,
    /// The target of a symlink, as bytes.
    pub symlink_target: Option<Vec<u8>>,
    /// Modification time in nanoseconds since the epoch, when the value came from a file.
    pub mtime_ns: Option<i64>,
    /// Free-form attributes (content type, producer, device numbers…).
    pub attributes: BTreeMap<String, String>,
}

impl Meta {
    /// Metadata of the given kind with no mode, size or attributes.
    pub fn of(kind: EntryKind) -> Meta {
        Meta {
            kind,
            mode: 0,
            size: 0,
            symlink_target: None,
            mtime_ns: None,
            attributes: BTreeMap::new(),
        }
    }
}

/// A value stored at a key.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Value {
    /// The bytes, inline or in the blob store.
    pub content: Content,
    /// Kind, mode, size and the rest.
    pub meta: Meta,
}

impl Value {
    /// Writes the value as its derived `Serialize` does in postcard (see [`crate::encoding`]):
    /// a commit writes every value of the directories it changes, twice.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        match &self.content {
            Content::Inline(bytes) => {
                varint(out, 0);
                byte_string(out, bytes);
            }
            Content::Blob(hash) => {
                varint(out, 1);
                out.extend_from_slice(&hash.0);
            }
            Content::Chunks(hash) => {
                varint(out, 2);
                out.extend_from_slice(&hash.0);
            }
        }
        let Meta {
            kind,
            mode,
            size,
            symlink_target,
            mtime_ns,
            attributes,
        } = &self.meta;
        // The variant's index in declaration order, as the derive numbers it.
        varint(out, *kind as u64);
        varint(out, u64::from(*mode));
        varint(out, *size);
        match symlink_target {
            None => out.push(0),
            Some(target) => {
                out.push(1);
                byte_string(out, target);
            }
        }
        match mtime_ns {
            None => out.push(0),
            Some(ns) => {
                out.push(1);
                signed(out, *ns);
            }
        }
        varint(out, attributes.len() as u64);
        for (name, value) in attributes {
            byte_string(out, name.as_bytes());
            byte_string(out, value.as_bytes());
        }
    }

    /// A regular file with mode 0644.
    pub fn file(bytes: impl Into<Vec<u8>>) -> Value {
        Value::with_kind(EntryKind::File, bytes).mode(0o644)
    }

    /// A value of any kind with the given bytes.
    pub fn with_kind(kind: EntryKind, bytes: impl Into<Vec<u8>>) -> Value {
        let bytes = bytes.into();
        let mut meta = Meta::of(kind);
        meta.size = bytes.len() as u64;
        Value {
            content: Content::Inline(bytes),
            meta,
        }
    }

    /// A symlink to `target`.
    pub fn symlink(target: impl Into<Vec<u8>>) -> Value {
        let target = target.into();
        let mut meta = Meta::of(EntryKind::Symlink);
        meta.mode = 0o777;
        meta.size = target.len() as u64;
        meta.symlink_target = Some(target);
        Value {
            content: Content::Inline(Vec::new()),
            meta,
        }
    }

    /// A directory marker with mode 0755.
    pub fn dir() -> Value {
        let mut meta = Meta::of(EntryKind::Dir);
        meta.mode = 0o755;
        Value {
            content: Content::Inline(Vec::new()),
            meta,
        }
    }

    /// A secret reference. Only the name and provider are stored.
    pub fn secret_ref(secret: &SecretRef) -> Value {
        Value::with_kind(
            EntryKind::SecretRef,
            serde_json::to_vec(secret).unwrap_or_default(),
        )
    }

    /// Sets the mode bits.
    pub fn mode(mut self, mode: u32) -> Value {
        self.meta.mode = mode;
        self
    }

    /// Sets an attribute.
    pub fn attr(mut self, name: impl Into<String>, value: impl Into<String>) -> Value {
        self.meta.attributes.insert(name.into(), value.into());
        self
    }

    /// The blob this value refers to, if its content is in the blob store (for chunked
    /// content, its manifest).
    pub fn blob(&self) -> Option<Hash> {
        match self.content {
            Content::Blob(h) | Content::Chunks(h) => Some(h),
            Content::Inline(_) => None,
        }
    }
}

/// A reference to a secret held elsewhere (a vault, an environment variable of the supervisor,
/// a keyring). The environment stores only this reference; the value is resolved at the moment of
/// use into a [`SecretValue`] and never written down.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SecretRef {
    /// The secret's name at its provider.
    pub name: String,
    /// Who holds it (e.g. `env`, `keyring`, `vault`).
    pub provider: String,
}

/// A resolved secret. Its `Debug`, `Display` and `Serialize` all print `[redacted]`; the only way
/// to the bytes is [`SecretValue::expose`], which makes every use greppable.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretValue(String);

impl SecretValue {
    /// Wraps a resolved secret.
    pub fn new(value: impl Into<String>) -> SecretValue {
        SecretValue(value.into())
    }

    /// The secret itself, for the one place that must hand it to a child process.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

const REDACTED: &str = "[redacted]";

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for SecretValue {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(REDACTED)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::key::Key;

    /// Any value: inline or blob content, every kind, any metadata.
    pub(crate) fn arb_value() -> impl Strategy<Value = Value> {
        // Every kind, in declaration order: the derive numbers them so.
        let kinds: Vec<EntryKind> = (0u8..)
            .map_while(|i| postcard::from_bytes(&[i]).ok())
            .collect();
        (
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..300).prop_map(Content::Inline),
                any::<[u8; 32]>().prop_map(|h| Content::Blob(Hash(h))),
                any::<[u8; 32]>().prop_map(|h| Content::Chunks(Hash(h))),
            ],
            proptest::sample::select(kinds),
            any::<(u32, u64, Option<i64>)>(),
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200)),
            proptest::collection::btree_map(".{0,8}", ".{0,8}", 0..3),
        )
            .prop_map(
                |(content, kind, (mode, size, mtime_ns), symlink_target, attributes)| Value {
                    content,
                    meta: Meta {
                        kind,
                        mode,
                        size,
                        symlink_target,
                        mtime_ns,
                        attributes,
                    },
                },
            )
    }

    proptest! {
        /// A value is written exactly as its derived `Serialize` writes it.
        #[test]
        fn values_are_written_as_the_derive_writes_them(v in arb_value()) {
            let mut written = Vec::new();
            v.write(&mut written);
            prop_assert_eq!(&written, &postcard::to_stdvec(&v).unwrap());
            prop_assert_eq!(postcard::from_bytes::<Value>(&written).unwrap(), v);
        }
    }

    #[test]
    fn secret_values_never_print() {
        let s = SecretValue::new("hunter2");
        assert_eq!(format!("{s:?} {s}"), "[redacted] [redacted]");
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"[redacted]\"");
        assert_eq!(s.expose(), "hunter2");
    }

    /// Values reach tools as JSON (events, `envctl --json`, MCP): the spelling stays as it was.
    #[test]
    fn values_keep_their_json_spelling() {
        let v = (
            Value::file(vec![0, 1, 0xff]),
            Value::symlink(vec![b't', 0xff]).attr("k", "v"),
        );
        let json = serde_json::to_string(&v).unwrap();
        assert_eq!(
            json,
            r#"[{"content":{"Inline":[0,1,255]},"meta":{"kind":"File","mode":420,"size":3,"symlink_target":null,"mtime_ns":null,"attributes":{}}},{"content":{"Inline":[]},"meta":{"kind":"Symlink","mode":511,"size":2,"symlink_target":[116,255],"mtime_ns":null,"attributes":{"k":"v"}}}]"#
        );
        assert_eq!(serde_json::from_str::<(Value, Value)>(&json).unwrap(), v);
        let key = Key::fs(vec![b'b', 0xff]).unwrap();
        let json = serde_json::to_string(&(key.clone(), Key::fs("a/b").unwrap())).unwrap();
        assert_eq!(
            json,
            r#"[{"ns":"Fs","path":[98,255]},{"ns":"Fs","path":"a/b"}]"#
        );
        assert_eq!(
            serde_json::from_str::<(Key, Key)>(&json).unwrap(),
            (key, Key::fs("a/b").unwrap())
        );
    }
}
