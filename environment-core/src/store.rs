//! The log's storage port: what the use cases (act with rebase, branches, marks, merge,
//! restore, undo, history, retention, upkeep, events) ask of the store that keeps operations,
//! heads, marks, fork points, dropped versions, refused changes, blob pins, the outbox and
//! tree nodes. The use cases are written once over [`LogRead`] and [`LogWrite`]; a store
//! decides how it keeps each (the embedded one keeps them in SQLite).
//!
//! A [`LogRead`] is one reading of the store; a [`LogWrite`] is one write transaction, which
//! reads what it has written so far. Tree nodes are named by their content hash wherever they
//! are kept, and found by the id the store gave them (see [`Ptr`]); a store keeps their
//! encoding ([`StoredNode::encode`]) and never looks inside.
//!
//! A store shared by several machines must give every operation its own sequence number and
//! every node its own id (gaps are allowed), move a branch's head only from the head the job
//! read (a job reads a head, then appends on it, with nobody else appending on that branch
//! in between), and keep everything else append-only or idempotent.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use crate::error::Result;
use crate::hash::Hash;
use crate::op::{OpId, Operation};
pub use crate::tree::node::{NodeId, Ptr};
use crate::tree::{Node, NodeSource};

/// A tree node as a store keeps it: opaque, encoded with [`StoredNode::encode`] and read back
/// with [`StoredNode::decode`]. Cheap to clone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredNode(pub(crate) Arc<Node>);

impl StoredNode {
    /// Its stored encoding (child pointers carry this store's ids).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.0.encode_into(&mut out);
        out
    }

    /// A node from its stored encoding.
    pub fn decode(bytes: &[u8]) -> Result<StoredNode> {
        Ok(StoredNode(Arc::new(Node::decode(bytes)?)))
    }

    /// Its content hash (what a [`Ptr`] to it names).
    pub fn hash(&self) -> Hash {
        self.0.hash()
    }
}

/// An edit's new nodes as a store keeps them.
pub(crate) fn stored(nodes: Vec<crate::tree::NewNode>) -> Vec<(Ptr, StoredNode)> {
    nodes
        .into_iter()
        .map(|n| (n.ptr, StoredNode(n.node)))
        .collect()
}

/// The nodes of a reading, as the tree reads them.
pub(crate) struct Nodes<'a>(pub &'a dyn LogRead);

impl NodeSource for Nodes<'_> {
    fn node(&self, ptr: &Ptr) -> Result<Arc<Node>> {
        Ok(self.0.node(ptr)?.0)
    }
}

/// What a write job answers, its type erased so that the store is an object.
pub type Answer = Box<dyn std::any::Any + Send>;

/// What reads a store, called with one reading.
pub type ReadJob<'a> = dyn FnMut(&dyn LogRead) -> Result<()> + Send + 'a;

/// A job run in a write transaction.
pub type WriteJob = Box<dyn FnOnce(&mut dyn LogWrite) -> Result<Answer> + Send>;

/// Where the log is kept. Several jobs may commit in one transaction (a group commit): a
/// job that fails leaves nothing, and the others of its group are not undone by it.
pub trait LogStore: Send + Sync {
    /// Calls `f` with a reading of the store: of one consistent state when `snapshot` (for a
    /// walk of many reads), else each read as of when it is made. `f` may be run on another
    /// thread (a store whose client must not block an async runtime's thread).
    fn read(&self, snapshot: bool, f: &mut ReadJob<'_>) -> Result<()>;
    /// Runs `job` in a write transaction and waits for its commit. `full_sync`: durable
    /// against power loss, not only against a crash of the process.
    fn write(&self, full_sync: bool, job: WriteJob) -> Result<Answer>;
    /// [`LogStore::write`] without blocking: the answer comes once the job has committed.
    fn submit(&self, job: WriteJob) -> tokio::sync::oneshot::Receiver<Result<Answer>>;
}

/// An operation as stored: its record, decoded, and the id of its view's root node.
pub type StoredOp = (Arc<Operation>, NodeId);

/// Called with each stored node: its id, recorded hash and encoding.
pub type NodeVisitor<'a> = dyn FnMut(NodeId, &[u8], &[u8]) -> Result<()> + 'a;

/// A row of the log, in sequence order, for the integrity check: what the row says apart
/// from the record, so that a record altered or moved can be told.
pub struct LogRow<'a> {
    /// Its sequence number.
    pub seq: u64,
    /// The operation id the row is kept under.
    pub id: &'a [u8],
    /// Its view's root node.
    pub root: NodeId,
    /// The operation's encoding.
    pub record: &'a [u8],
}

/// One reading of the log: what a reader sees, or what a write transaction sees of the store
/// with its own writes.
pub trait LogRead {
    /// The node `ptr` points to. A node that is not stored is an integrity error.
    fn node(&self, ptr: &Ptr) -> Result<StoredNode>;
    /// The head of `branch`, if it exists.
    fn head(&self, branch: &str) -> Result<Option<OpId>>;
    /// Every branch with its head, by name.
    fn heads(&self) -> Result<BTreeMap<String, OpId>>;
    /// The operation with this id, if recorded.
    fn find_op(&self, id: &OpId) -> Result<Option<StoredOp>>;
    /// The ids of the operations whose id lies in `lo..=hi` (full 32-byte bounds).
    fn op_ids_between(&self, lo: &[u8], hi: &[u8]) -> Result<Vec<OpId>>;
    /// Whether any operation is recorded.
    fn has_ops(&self) -> Result<bool>;
    /// The first operation recorded (the environment's creation, whose view is empty).
    fn first_op(&self) -> Result<Option<OpId>>;
    /// The summary of the capture run recorded with operation `seq` (see
    /// `local::history::CaptureRun`), if any.
    fn capture_run(&self, seq: u64) -> Result<Option<Vec<u8>>>;
    /// Calls `f` with every row of the log, in sequence order.
    fn each_op(&self, f: &mut dyn FnMut(LogRow<'_>) -> Result<()>) -> Result<()>;
    /// Calls `f` with the record and root of every operation whose view is kept (not dropped).
    fn each_kept_op(&self, f: &mut dyn FnMut(Operation, NodeId) -> Result<()>) -> Result<()>;
    /// Every mark with its version, by name.
    fn marks(&self) -> Result<Vec<(String, OpId)>>;
    /// The version a mark names.
    fn mark(&self, name: &str) -> Result<Option<OpId>>;
    /// The operations branches were created from.
    fn forks(&self) -> Result<HashSet<OpId>>;
    /// The sequence numbers of the versions retention dropped.
    fn dropped_seqs(&self) -> Result<BTreeSet<u64>>;
    /// Whether retention dropped the version `seq`.
    fn is_dropped(&self, seq: u64) -> Result<bool>;
    /// The ids of the versions retention dropped.
    fn dropped_ids(&self) -> Result<HashSet<OpId>>;
    /// Refused changes with an id below `before`, newest first, as (id, record), while `f`
    /// returns true.
    fn refused_before(
        &self,
        before: u64,
        f: &mut dyn FnMut(u64, &[u8]) -> Result<bool>,
    ) -> Result<()>;
    /// The blobs pinned by their owners.
    fn blob_pins(&self) -> Result<Vec<Hash>>;
    /// Events committed and not yet published, oldest first: (position, event).
    fn outbox(&self, limit: usize) -> Result<Vec<(u64, Vec<u8>)>>;
    /// Calls `f` with every stored node: its id, recorded hash and encoding.
    fn each_node(&self, f: &mut NodeVisitor<'_>) -> Result<()>;
    /// Checks the store's own indexes of the log against the operations (`seqs`: every id
    /// with its sequence number).
    fn check_indexes(&self, seqs: &std::collections::HashMap<OpId, u64>) -> Result<()>;
}

/// One write transaction. Nothing it writes is seen by anyone else before it commits, and a
/// job that fails leaves nothing of what it wrote.
pub trait LogWrite: LogRead {
    /// The id the next new node gets.
    fn next_node_id(&self) -> Result<NodeId>;
    /// The sequence number the next operation gets.
    fn next_seq(&self) -> Result<u64>;
    /// Keeps the nodes a job created; they are stored with the operation it records next.
    fn put_nodes(&mut self, nodes: Vec<(Ptr, StoredNode)>);
    /// Records operation `op` (sealed: its id and `record`, its encoding, are final) with its
    /// view's root and its capture run summary; its branch's head moves to it.
    fn append(
        &mut self,
        op: Arc<Operation>,
        record: &[u8],
        root: NodeId,
        run: Option<Vec<u8>>,
    ) -> Result<()>;
    /// Queues an event for publication, in the same transaction as its operation.
    fn queue_event(&mut self, event: Vec<u8>) -> Result<()>;
    /// Removes published events from the outbox.
    fn remove_events(&mut self, positions: &[u64]) -> Result<()>;
    /// Notes that a branch was created from `op`.
    fn add_fork(&mut self, op: &OpId) -> Result<()>;
    /// Names `op` as `name`.
    fn add_mark(&mut self, name: &str, op: &OpId, actor: &str, time_ms: i64) -> Result<()>;
    /// Drops the version `seq`; false if it was dropped already.
    fn drop_version(&mut self, seq: u64, actor: &str, time_ms: i64) -> Result<bool>;
    /// Keeps a refused change; returns its id.
    fn add_refused(&mut self, actor: &str, time_ms: i64, record: &[u8]) -> Result<u64>;
    /// Pins (`true`) or unpins a blob for `owner`.
    fn pin_blob(&mut self, hash: &Hash, owner: &str, pinned: bool) -> Result<()>;
    /// Deletes stored nodes.
    fn delete_nodes(&mut self, dead: &HashSet<NodeId>) -> Result<()>;
}

/// What happens after every commit with what the committed jobs left, in two steps around
/// answering the jobs' callers.
pub struct AfterCommit {
    /// Before the callers are answered: what they may count on once their call returns (the
    /// subscribers have the operations' events).
    pub announce: Box<dyn Fn(&CommittedOps) + Send + Sync>,
    /// After the callers are answered: what only makes later reads faster (the caches). A caller
    /// woken earlier comes back earlier with its next job, which then joins the next group
    /// instead of waiting for the one after.
    pub remember: Box<dyn Fn(CommittedNodes, CommittedOps) + Send + Sync>,
}

/// Nodes a group wrote, by row id.
pub type CommittedNodes = Vec<(NodeId, StoredNode)>;
/// Operations a group recorded, with their root node.
pub type CommittedOps = Vec<(Arc<Operation>, NodeId)>;
