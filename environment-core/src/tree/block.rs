//! Node blocks: the nodes one edit creates, stored together in one database row (the row of the
//! operation that created them when they are few, else rows of `node_blocks`).
//!
//! An act creates a few nodes (the path from the changed key to the root). A row per node made
//! each of them a B-tree insert of its own, about a quarter of the writer's time per act; one
//! row for all of them costs one. A block covers a range of row ids (`first..=last`, the ids of
//! the nodes in it, ascending) and is found by the greatest `first` at or below the id sought.
//! Blocks are cut at [`BLOCK_TARGET`] bytes so that reading one node never decodes much more.
//!
//! Layout, per node: id (8 bytes, little endian), length of the encoding (4), content hash
//! (32), the encoding.

use crate::error::{EnvError, Result};
use crate::hash::Hash;
use crate::tree::{Node, NodeId};

/// A block is closed once it holds this many bytes: most blocks then fit one database page,
/// so a node read that misses the cache costs about what a row of its own did.
pub(crate) const BLOCK_TARGET: usize = 3 * 1024;

const HEADER: usize = 8 + 4 + 32;

/// One node of a block: its id, content hash and encoding.
pub(crate) type Stored<'a> = (NodeId, Hash, &'a [u8]);

/// How many node ids an operation has: see [`first_of_op`].
const OP_NODE_BITS: u32 = 20;

/// Where the ids of nodes stored with their operation start. Ids below it were allocated one
/// after another by earlier layouts (a trillion nodes is far beyond any environment), so the
/// two never meet.
pub(crate) const OP_NODES: NodeId = 1 << 40;

/// The first id of the nodes operation `seq` creates. When they are few (a small act's), those
/// nodes are stored in the operation's own row of the log, as one block, so a commit appends to
/// one B-tree instead of two; their ids say which row. The ids of operation `seq` run from here
/// up to [`last_of_op`]`(seq)`,
/// above [`OP_NODES`], and grow with the log: blocks too large for the row still go to the end
/// of `node_blocks`, where SQLite appends to the last page.
pub(crate) fn first_of_op(seq: i64) -> NodeId {
    OP_NODES + (seq << OP_NODE_BITS)
}

/// The last id operation `seq` may give a node.
pub(crate) fn last_of_op(seq: i64) -> NodeId {
    first_of_op(seq + 1) - 1
}

/// The operation that created node `id`, if its id says so (see [`first_of_op`]).
pub(crate) fn op_holding(id: NodeId) -> Option<i64> {
    (id >= OP_NODES).then(|| (id - OP_NODES) >> OP_NODE_BITS)
}

/// What a block entry holds: a node's encoding, or the node to encode (written straight into
/// the block, without an allocation of its own).
pub(crate) trait Payload {
    fn append_to(&self, data: &mut Vec<u8>);
}

impl Payload for &[u8] {
    fn append_to(&self, data: &mut Vec<u8>) {
        data.extend_from_slice(self);
    }
}

impl Payload for &Node {
    fn append_to(&self, data: &mut Vec<u8>) {
        self.encode_into(data);
    }
}

fn push<P: Payload>(data: &mut Vec<u8>, (id, hash, payload): (NodeId, Hash, P)) {
    data.extend_from_slice(&id.to_le_bytes());
    let len_at = data.len();
    data.extend_from_slice(&[0; 4]);
    data.extend_from_slice(&hash.0);
    let start = data.len();
    payload.append_to(data);
    // A node's encoding is bounded far below 4 GiB (LEAF_MAX entries of bounded size).
    let len = (data.len() - start) as u32;
    data[len_at..len_at + 4].copy_from_slice(&len.to_le_bytes());
}

/// Encodes nodes (in ascending id order) into blocks of about [`BLOCK_TARGET`] bytes each,
/// returning each block's first and last id with its bytes.
pub(crate) fn encode<P: Payload>(
    nodes: impl IntoIterator<Item = (NodeId, Hash, P)>,
) -> Vec<(NodeId, NodeId, Vec<u8>)> {
    let mut blocks = Vec::new();
    let mut current: Option<(NodeId, NodeId, Vec<u8>)> = None;
    for node in nodes {
        let (_, last, data) =
            current.get_or_insert_with(|| (node.0, node.0, Vec::with_capacity(BLOCK_TARGET * 2)));
        *last = node.0;
        push(data, node);
        if data.len() >= BLOCK_TARGET {
            blocks.extend(current.take());
        }
    }
    blocks.extend(current);
    blocks
}

/// Encodes nodes (in ascending id order) as one block, however large.
pub(crate) fn encode_one<P: Payload>(
    nodes: impl IntoIterator<Item = (NodeId, Hash, P)>,
) -> Vec<u8> {
    let mut data = Vec::new();
    for node in nodes {
        push(&mut data, node);
    }
    data
}

/// The nodes of a block, in order; a truncated or malformed block is an integrity error.
pub(crate) fn entries(first: NodeId, data: &[u8]) -> impl Iterator<Item = Result<Stored<'_>>> {
    let mut rest = data;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let broken = || EnvError::Integrity {
            at: format!("node block #{first}"),
            detail: "the block is truncated or malformed".into(),
        };
        let Some((head, tail)) = rest.split_at_checked(HEADER) else {
            rest = &[];
            return Some(Err(broken()));
        };
        let id = i64::from_le_bytes(head[..8].try_into().unwrap_or_default());
        let len = u32::from_le_bytes(head[8..12].try_into().unwrap_or_default()) as usize;
        let hash = Hash::from_slice(&head[12..]).unwrap_or(Hash([0; 32]));
        let Some((bytes, after)) = tail.split_at_checked(len) else {
            rest = &[];
            return Some(Err(broken()));
        };
        rest = after;
        Some(Ok((id, hash, bytes)))
    })
}

/// The node `id` in a block, if the block holds it.
pub(crate) fn find(first: NodeId, data: &[u8], id: NodeId) -> Result<Option<(Hash, &[u8])>> {
    for entry in entries(first, data) {
        let (at, hash, bytes) = entry?;
        if at == id {
            return Ok(Some((hash, bytes)));
        }
        if at > id {
            break;
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip_and_split_at_the_target() {
        let big = vec![7u8; BLOCK_TARGET / 3];
        let nodes: Vec<Stored<'_>> = (10..16)
            .map(|id| (id, Hash([id as u8; 32]), &big[..]))
            .collect();
        let blocks = encode(nodes.iter().copied());
        assert_eq!(blocks.len(), 2, "three nodes fill a block");
        assert_eq!((blocks[0].0, blocks[0].1), (10, 12));
        assert_eq!((blocks[1].0, blocks[1].1), (13, 15));
        let back: Vec<Stored<'_>> = blocks
            .iter()
            .flat_map(|(first, _, data)| entries(*first, data))
            .collect::<Result<_>>()
            .unwrap();
        assert_eq!(back, nodes);
        let (h, b) = find(13, &blocks[1].2, 14).unwrap().unwrap();
        assert_eq!((h, b), (Hash([14; 32]), &big[..]));
        assert_eq!(find(13, &blocks[1].2, 12).unwrap(), None);
    }

    #[test]
    fn each_operation_has_its_own_ids_next_to_its_neighbours() {
        for seq in [0, 1, 2, 1000, 1 << 40] {
            let (first, last) = (first_of_op(seq), last_of_op(seq));
            assert!(OP_NODES <= first && first < last);
            assert_eq!(last - first + 1, 1 << OP_NODE_BITS);
            for id in [first, first + 1, last - 1, last] {
                assert_eq!(op_holding(id), Some(seq), "id {id}");
            }
            assert_eq!(last + 1, first_of_op(seq + 1));
        }
        assert_eq!(op_holding(0), None);
        assert_eq!(op_holding(17), None);
    }

    #[test]
    fn an_operations_block_round_trips() {
        let nodes: Vec<Stored<'_>> = (0..5)
            .map(|k| (first_of_op(7) + k, Hash([k as u8; 32]), &b"node"[..]))
            .collect();
        let data = encode_one(nodes.iter().copied());
        let back: Vec<Stored<'_>> = entries(7, &data).collect::<Result<_>>().unwrap();
        assert_eq!(back, nodes);
        assert_eq!(
            find(7, &data, first_of_op(7) + 3).unwrap(),
            Some((Hash([3; 32]), &b"node"[..]))
        );
    }

    #[test]
    fn a_truncated_block_is_an_integrity_error() {
        let blocks = encode([(1, Hash([1; 32]), &b"node"[..])]);
        let data = &blocks[0].2;
        for cut in [1, HEADER, data.len() - 1] {
            assert!(matches!(
                find(1, &data[..cut], 1),
                Err(EnvError::Integrity { .. })
            ));
        }
    }
}
