//! Tree nodes, their encoding, and where they are read from and written to.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{EnvError, Result};
use crate::hash::Hash;
use crate::value::Value;

/// A directory keeps at most this many entries in one node; past it, the directory splits by the
/// hash of the entry names, so a one-entry change in a huge directory rewrites a few small nodes
/// instead of one huge one.
pub(crate) const LEAF_MAX: usize = 64;

/// What one name in a directory holds: a value, a subdirectory, or both (an object key may have
/// children, and a directory marker carries a directory's mode).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub value: Option<Value>,
    pub tree: Option<Hash>,
}

impl Entry {
    pub fn is_empty(&self) -> bool {
        self.value.is_none() && self.tree.is_none()
    }
}

/// One node of a directory. A directory of at most [`LEAF_MAX`] names is one `Leaf`; a larger one
/// is a hash-array-mapped trie of `Split` nodes over 4-bit slices of blake3(name). The shape
/// depends only on the set of names, so equal directories always have equal hashes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Node {
    /// Entries sorted by name.
    Leaf(Vec<(Vec<u8>, Entry)>),
    /// Children by bucket (ascending), with the total number of names below.
    Split {
        count: u64,
        children: Vec<(u8, Hash)>,
    },
}

impl Node {
    pub fn count(&self) -> u64 {
        match self {
            Node::Leaf(es) => es.len() as u64,
            Node::Split { count, .. } => *count,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        // Encoding owned plain data into a Vec does not fail.
        postcard::to_stdvec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Result<Node> {
        postcard::from_bytes(bytes).map_err(|e| EnvError::Decode {
            what: "tree node",
            detail: e.to_string(),
        })
    }

    pub fn hash_of(bytes: &[u8]) -> Hash {
        Hash::of(b"environment-node-v1", bytes)
    }

    /// The hash of the empty directory, which is also the root of an empty view.
    pub fn empty() -> (Hash, Vec<u8>) {
        let bytes = Node::Leaf(Vec::new()).encode();
        (Node::hash_of(&bytes), bytes)
    }
}

/// The bucket of `name` at trie level `level`.
pub(crate) fn bucket(name: &[u8], level: usize) -> u8 {
    let h = blake3::hash(name);
    let byte = h.as_bytes()[(level / 2) % 32];
    if level % 2 == 0 {
        byte >> 4
    } else {
        byte & 0x0f
    }
}

/// Somewhere nodes can be read from.
pub(crate) trait NodeSource {
    fn node(&self, hash: &Hash) -> Result<Arc<Node>>;
}

/// A set of nodes being built on top of a source: reads see the new nodes first.
pub(crate) struct TreeEdit<'a> {
    src: &'a dyn NodeSource,
    new: HashMap<Hash, (Arc<Node>, Vec<u8>)>,
}

impl<'a> TreeEdit<'a> {
    pub fn new(src: &'a dyn NodeSource) -> TreeEdit<'a> {
        TreeEdit {
            src,
            new: HashMap::new(),
        }
    }

    pub fn store(&mut self, node: Node) -> Hash {
        let bytes = node.encode();
        let hash = Node::hash_of(&bytes);
        self.new
            .entry(hash)
            .or_insert_with(|| (Arc::new(node), bytes));
        hash
    }

    /// The nodes created, to be persisted with the operation that refers to them.
    pub fn into_new_nodes(self) -> Vec<(Hash, Arc<Node>, Vec<u8>)> {
        self.new.into_iter().map(|(h, (n, b))| (h, n, b)).collect()
    }
}

impl NodeSource for TreeEdit<'_> {
    fn node(&self, hash: &Hash) -> Result<Arc<Node>> {
        match self.new.get(hash) {
            Some((n, _)) => Ok(n.clone()),
            None => self.src.node(hash),
        }
    }
}
