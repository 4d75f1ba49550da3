//! Tree nodes, their encoding, and where they are read from and written to.
//!
//! A node is named two ways: by its content hash (what views, diffs and merges compare, and what
//! `verify` re-computes) and by its id in this environment's database (how it is found: the id
//! says which operation's row stores it, see [`super::block`]). Child pointers carry both. The
//! nodes of a commit are thus written with its operations, at the end of the log's B-tree,
//! instead of a random page per node, which is what a hash-keyed table would do.

use foldhash::{HashMap, HashMapExt};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::encoding::{byte_string, signed, varint};
use crate::error::{EnvError, Result};
use crate::hash::Hash;
use crate::value::Value;

/// A directory keeps at most this many entries in one node; past it, the directory splits by the
/// hash of the entry names, so a one-entry change in a huge directory rewrites a few small nodes
/// instead of one huge one.
pub(crate) const LEAF_MAX: usize = 64;

/// A node's id in the store that keeps it: given by the store (see
/// [`crate::store::LogWrite::next_node_id`]), never reused, and meaningless elsewhere.
pub type NodeId = i64;

/// A pointer to a stored node. Equality is by content hash alone: two pointers to equal content
/// are equal wherever the content is stored.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub struct Ptr {
    /// The node's content hash: its identity wherever it is kept.
    pub hash: Hash,
    /// Where this store keeps it.
    pub id: NodeId,
}

impl Ptr {
    /// The hash, and in the stored form the id (see [`Node::write`]).
    fn write(&self, out: &mut Vec<u8>, form: Form) {
        out.extend_from_slice(&self.hash.0);
        if form == Form::Stored {
            signed(out, self.id);
        }
    }
}

/// Which encoding of a node: the one stored (child pointers with ids) or the one hashed
/// (child pointers by hash alone, so equal content hashes equally wherever it is stored).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Form {
    Stored,
    Hashed,
}

impl PartialEq for Ptr {
    fn eq(&self, other: &Ptr) -> bool {
        self.hash == other.hash
    }
}

impl Eq for Ptr {}

/// What one name in a directory holds: a value, a subdirectory, or both (an object key may have
/// children, and a directory marker carries a directory's mode).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    pub value: Option<Value>,
    pub tree: Option<Ptr>,
}

impl Entry {
    pub fn is_empty(&self) -> bool {
        self.value.is_none() && self.tree.is_none()
    }
}

/// A name and what it holds, shared by every version of a directory that keeps it unchanged:
/// an edit copies pointers to the entries it does not change instead of the entries.
pub(crate) type Named = Arc<(Vec<u8>, Entry)>;

/// One node of a directory. A directory of at most [`LEAF_MAX`] names is one `Leaf`; a larger one
/// is a hash-array-mapped trie of `Split` nodes over 4-bit slices of blake3(name). The shape
/// depends only on the set of names, so equal directories always have equal hashes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum Node {
    /// Entries sorted by name.
    Leaf(Vec<Named>),
    /// Children by bucket (ascending), with the total number of names below.
    Split {
        count: u64,
        children: Vec<(u8, Ptr)>,
    },
}

impl Node {
    pub fn count(&self) -> u64 {
        match self {
            Node::Leaf(es) => es.len() as u64,
            Node::Split { count, .. } => *count,
        }
    }

    /// Appends the storage encoding (with child ids) to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        self.write(out, Form::Stored);
    }

    pub fn decode(bytes: &[u8]) -> Result<Node> {
        postcard::from_bytes(bytes).map_err(|e| EnvError::Decode {
            what: "tree node",
            detail: e.to_string(),
        })
    }

    /// The content hash: covers names, values and the children's hashes, not where anything is
    /// stored.
    pub fn hash(&self) -> Hash {
        crate::encoding::with_written(
            |buf| self.write(buf, Form::Hashed),
            |bytes| Hash::of(b"environment-node-v1", bytes),
        )
    }

    /// Writes the node in postcard's wire format: the stored form as the derived `Serialize`
    /// would (the derived `Deserialize` reads it back), the hashed form as the same with child
    /// pointers reduced to their hashes. Written by hand because serde hands a hash over one
    /// byte at a time, and a commit writes each of its nodes twice: that was a tenth of an act.
    fn write(&self, out: &mut Vec<u8>, form: Form) {
        match self {
            Node::Leaf(es) => {
                varint(out, 0);
                varint(out, es.len() as u64);
                for named in es {
                    let (name, entry) = &**named;
                    byte_string(out, name);
                    match &entry.value {
                        None => out.push(0),
                        Some(v) => {
                            out.push(1);
                            v.write(out);
                        }
                    }
                    match &entry.tree {
                        None => out.push(0),
                        Some(p) => {
                            out.push(1);
                            p.write(out, form);
                        }
                    }
                }
            }
            Node::Split { count, children } => {
                varint(out, 1);
                varint(out, *count);
                varint(out, children.len() as u64);
                for (b, p) in children {
                    out.push(*b);
                    p.write(out, form);
                }
            }
        }
    }

    /// Every child pointer.
    pub fn children(&self) -> impl Iterator<Item = &Ptr> {
        let (leaf, split) = match self {
            Node::Leaf(es) => (
                Some(es.iter().filter_map(|named| named.1.tree.as_ref())),
                None,
            ),
            Node::Split { children, .. } => (None, Some(children.iter().map(|(_, p)| p))),
        };
        leaf.into_iter()
            .flatten()
            .chain(split.into_iter().flatten())
    }
}

/// The bucket of `name` at trie level `level`.
pub(crate) fn bucket(name: &[u8], level: usize) -> u8 {
    let h = blake3::hash(name);
    let byte = h.as_bytes()[(level / 2) % 32];
    if level.is_multiple_of(2) {
        byte >> 4
    } else {
        byte & 0x0f
    }
}

/// Somewhere nodes can be read from.
pub(crate) trait NodeSource {
    fn node(&self, ptr: &Ptr) -> Result<Arc<Node>>;
}

/// A node created by an edit, ready to be stored.
pub(crate) struct NewNode {
    pub ptr: Ptr,
    pub node: Arc<Node>,
}

/// A set of nodes being built on top of a source: reads see the new nodes first. New nodes get
/// row ids from `next_id` upwards.
pub(crate) struct TreeEdit<'a> {
    src: &'a dyn NodeSource,
    /// The first id of the edit's own nodes: every stored node's id is below it.
    first_id: NodeId,
    next_id: NodeId,
    by_id: HashMap<NodeId, Arc<Node>>,
    by_hash: crate::hash::DigestMap<Ptr>,
}

impl<'a> TreeEdit<'a> {
    pub fn new(src: &'a dyn NodeSource, next_id: NodeId) -> TreeEdit<'a> {
        TreeEdit {
            src,
            first_id: next_id,
            next_id,
            by_id: HashMap::new(),
            by_hash: crate::hash::DigestMap::default(),
        }
    }

    pub fn store(&mut self, node: Node) -> Ptr {
        let hash = node.hash();
        if let Some(p) = self.by_hash.get(&hash) {
            return *p;
        }
        let ptr = Ptr {
            hash,
            id: self.next_id,
        };
        self.next_id += 1;
        self.by_hash.insert(hash, ptr);
        self.by_id.insert(ptr.id, Arc::new(node));
        ptr
    }

    /// The new nodes reachable from `root`, to be stored with the operation that refers to them;
    /// intermediate nodes the edit superseded are left out.
    pub fn into_new_nodes(mut self, root: &Ptr) -> Vec<NewNode> {
        let mut out = Vec::with_capacity(self.by_id.len());
        let mut stack = Vec::with_capacity(16);
        stack.push(*root);
        let first_id = self.first_id;
        while let Some(p) = stack.pop() {
            if let Some(node) = self.by_id.remove(&p.id) {
                stack.extend(node.children().filter(|c| c.id >= first_id).copied());
                out.push(NewNode { ptr: p, node });
            }
        }
        out
    }
}

impl NodeSource for TreeEdit<'_> {
    fn node(&self, ptr: &Ptr) -> Result<Arc<Node>> {
        // Only the edit's own ids are worth looking up here.
        if ptr.id >= self.first_id
            && let Some(n) = self.by_id.get(&ptr.id)
        {
            return Ok(n.clone());
        }
        self.src.node(ptr)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::value::{Content, EntryKind};

    fn named(name: &[u8], value: Option<Value>, tree: Option<Ptr>) -> Named {
        Arc::new((name.to_vec(), Entry { value, tree }))
    }

    /// A leaf with every sort of entry: inline and blob content, a symlink, metadata and
    /// attributes, a subdirectory, a name that is not UTF-8.
    fn varied_leaf() -> Node {
        let sub = Ptr {
            hash: Hash::of(b"test", b"subdirectory"),
            id: (1 << 40) + 7,
        };
        let mut file = Value::file("hello, world").mode(0o644).attr("type", "text");
        file.meta.mtime_ns = Some(1_700_000_000_123_456_789);
        let blob = Value {
            content: Content::Blob(Hash::of(b"test", b"blob")),
            meta: crate::value::Meta {
                size: 1 << 20,
                ..crate::value::Meta::of(EntryKind::File)
            },
        };
        Node::Leaf(vec![
            named(b"a.txt", Some(file), None),
            named(b"b.bin", Some(blob), None),
            named(b"dir", Some(Value::dir()), Some(sub)),
            named(b"link", Some(Value::symlink("../a.txt")), None),
            named(&[0xff, 0x01, b'x'], None, Some(sub)),
        ])
    }

    /// The hashed form as a derive would write it: what [`Node::write`] must match.
    #[derive(Serialize)]
    enum HashedForm<'a> {
        Leaf(Vec<(&'a Vec<u8>, &'a Option<Value>, Option<&'a Hash>)>),
        Split {
            count: u64,
            children: Vec<(u8, &'a Hash)>,
        },
    }

    fn hashed_form(node: &Node) -> HashedForm<'_> {
        match node {
            Node::Leaf(es) => HashedForm::Leaf(
                es.iter()
                    .map(|n| (&n.0, &n.1.value, n.1.tree.as_ref().map(|p| &p.hash)))
                    .collect(),
            ),
            Node::Split { count, children } => HashedForm::Split {
                count: *count,
                children: children.iter().map(|(b, p)| (*b, &p.hash)).collect(),
            },
        }
    }

    fn arb_ptr() -> impl Strategy<Value = Ptr> {
        (any::<[u8; 32]>(), any::<i64>()).prop_map(|(h, id)| Ptr { hash: Hash(h), id })
    }

    fn arb_node() -> impl Strategy<Value = Node> {
        prop_oneof![
            proptest::collection::vec(
                (
                    proptest::collection::vec(any::<u8>(), 1..200),
                    proptest::option::of(crate::value::tests::arb_value()),
                    proptest::option::of(arb_ptr()),
                ),
                0..70,
            )
            .prop_map(|es| Node::Leaf(
                es.into_iter()
                    .map(|(name, value, tree)| named(&name, value, tree))
                    .collect()
            )),
            (
                any::<u64>(),
                proptest::collection::vec((any::<u8>(), arb_ptr()), 0..17)
            )
                .prop_map(|(count, children)| Node::Split { count, children }),
        ]
    }

    proptest! {
        /// Both forms are written exactly as the derives would write them, for any node.
        #[test]
        fn nodes_are_written_as_the_derives_write_them(node in arb_node()) {
            let mut stored = Vec::new();
            node.encode_into(&mut stored);
            prop_assert_eq!(&stored, &postcard::to_stdvec(&node).unwrap());
            prop_assert_eq!(&Node::decode(&stored).unwrap(), &node);
            let mut hashed = Vec::new();
            node.write(&mut hashed, Form::Hashed);
            prop_assert_eq!(&hashed, &postcard::to_stdvec(&hashed_form(&node)).unwrap());
            prop_assert_eq!(node.hash(), Hash::of(b"environment-node-v1", &hashed));
        }
    }

    /// Node hashes and stored encodings are formats: views written by earlier builds must hash
    /// and decode the same. These digests were computed by the build that introduced layout 4.
    #[test]
    fn node_hashes_and_encodings_stay_as_written() {
        let leaf = varied_leaf();
        let split = Node::Split {
            count: 100,
            children: vec![
                (
                    3,
                    Ptr {
                        hash: leaf.hash(),
                        id: 9,
                    },
                ),
                (
                    15,
                    Ptr {
                        hash: Hash::of(b"test", b"other"),
                        id: (1 << 40) + 1,
                    },
                ),
            ],
        };
        for (node, hash, stored) in [
            (
                &leaf,
                "467df28317c4d38afdc0b5cb424a7557ba8c00e424027d15df227ca28eb06d05",
                "1b699affd1c5ac33aab1bb6f80bdc856d1156c3771a57494ccb900fdb6e629f0",
            ),
            (
                &split,
                "5610e8e9728fa769968c94e55c8beec6b5ca5feaa312538b11368bcf943b6b75",
                "e52b24ba2ad13fe4edcf4dcfdbc541c4e26f3775dc41066a40d3bc516a7ef6e0",
            ),
        ] {
            let mut bytes = Vec::new();
            node.encode_into(&mut bytes);
            assert_eq!(node.hash().to_hex(), hash);
            assert_eq!(blake3::hash(&bytes).to_hex().as_str(), stored);
            assert_eq!(&Node::decode(&bytes).unwrap(), node);
        }
    }
}
