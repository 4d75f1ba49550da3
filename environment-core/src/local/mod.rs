//! `LocalEnvironment`: the environment on SQLite and the blob store, in one home directory.

mod act;
pub(crate) mod branch;
mod effect;
mod events;
mod history;
mod maintain;
mod refused;
mod retention;
mod undo;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt};
use rusqlite::{Connection, OptionalExtension, params};

pub use crate::action::{ActRequest, Change, Observation, Refusal, RefusedChange};
pub use crate::effect::{BeginOutcome, EffectRecord, EffectState};
pub use crate::history::{HistoryEntry, HistoryOptions};
pub use crate::merge::MergeOutcome;
pub use crate::upkeep::{GcReport, VerifyReport};
pub use events::Subscription;
pub use history::ShownOp;
pub use refused::put_back_note;
pub(crate) use refused::reason as refused_reason;
pub use undo::UndoStep;

use crate::authz::{
    AccessRequest, Action, ActorId, AllowAll, AttrValue, Authorizer, Context, Decision, Resource,
    Spend,
};
use crate::blob::BlobStore;
use crate::clock::{Clock, SystemClock};
use crate::db::{self, AfterCommit, DbNodes, NodeCache, ReadPool, TxEffects, Writer};
use crate::error::{EnvError, Result};
use crate::event::{Event, Publisher};
use crate::hash::Hash;
use crate::key::{Key, KeyPrefix};
use crate::op::{ChangeSummary, DecisionRef, Intent, OpFlags, OpId, Operation};
use crate::op_index::OpIndex;
use crate::tree::{self, KeyChange, Node, NodeId, Ptr, TreeEdit};
use crate::value::{Content, Value};

/// The branch every environment starts with.
pub const MAIN: &str = "main";

/// How an environment is opened.
#[derive(Clone)]
pub struct Options {
    /// Decides every action; [`AllowAll`] unless set. The environment keeps the one rule for
    /// captures around it ([`WitnessRule`](crate::WitnessRule)): the witness records what it
    /// finds whatever this decides.
    pub authorizer: Arc<dyn Authorizer>,
    /// Receives every committed operation's event, through the durable outbox.
    pub publisher: Option<Arc<dyn Publisher>>,
    /// Where time comes from.
    pub clock: Arc<dyn Clock>,
    /// The largest value one act may carry, in bytes.
    pub max_value_bytes: u64,
    /// The most changes one act may carry.
    pub max_changes: usize,
    /// The longest intent text, in bytes.
    pub max_intent_len: usize,
    /// How many decoded tree nodes to keep in memory.
    pub node_cache: usize,
    /// When set, a background thread checkpoints the database this often (see
    /// [`crate::checkpoint`]), off the writer's commit path; otherwise commits checkpoint.
    pub checkpoint_every: Option<std::time::Duration>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            authorizer: Arc::new(AllowAll),
            publisher: None,
            clock: Arc::new(SystemClock),
            max_value_bytes: 256 << 20,
            max_changes: 1_000_000,
            max_intent_len: 16 << 10,
            node_cache: 200_000,
            checkpoint_every: Some(std::time::Duration::from_millis(100)),
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("publisher", &self.publisher.is_some())
            .field("max_value_bytes", &self.max_value_bytes)
            .field("max_changes", &self.max_changes)
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    home: PathBuf,
    options: Options,
    blobs: BlobStore,
    writer: Writer,
    readers: ReadPool,
    nodes: Arc<NodeCache>,
    ops: Arc<OpCache>,
    hub: Arc<events::Hub>,
    /// Versions dropped by retention (as this process knows them; the table is the truth).
    dropped: std::sync::RwLock<std::collections::HashSet<OpId>>,
    /// Finds operations by id.
    op_index: OpIndex,
    /// Checkpoints until the environment closes.
    _checkpointer: Option<crate::checkpoint::Checkpointer>,
}

/// An environment stored on this machine: a SQLite database (`env.db`) and a blob store
/// (`blobs/`) under one home directory. Cheap to clone; clones share everything. Several
/// processes may open the same home: SQLite serializes their writes.
#[derive(Clone)]
pub struct LocalEnvironment {
    inner: Arc<Inner>,
    /// What this handle presents with every request it authorizes (see
    /// [`LocalEnvironment::presenting`]).
    credentials: Option<Arc<Credentials>>,
}

/// Proof beyond an actor's own rights, presented with each request to the [`Authorizer`]: a
/// capability token, or the id of a granted approval.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Credentials {
    /// A serialized capability token.
    pub token: Option<String>,
    /// The id of a granted approval.
    pub approval: Option<String>,
}

impl std::fmt::Debug for LocalEnvironment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalEnvironment")
            .field("home", &self.inner.home)
            .finish_non_exhaustive()
    }
}

/// Operations (with their root node) by id, shared by every reader and the writer.
type OpCache = quick_cache::sync::Cache<OpId, (Arc<Operation>, NodeId)>;

/// The actor that records the environment's own operations (creation).
pub(crate) fn system_actor() -> ActorId {
    ActorId::system()
}

impl LocalEnvironment {
    /// Opens the environment in `home`, creating it (with an empty `main` branch) if needed.
    pub fn open(home: impl AsRef<Path>, mut options: Options) -> Result<LocalEnvironment> {
        options.authorizer = Arc::new(crate::authz::WitnessRule(options.authorizer));
        let home = home.as_ref().to_path_buf();
        std::fs::create_dir_all(&home).map_err(|e| EnvError::Home {
            path: home.clone(),
            detail: e.to_string(),
        })?;
        let db_path = home.join("env.db");
        let blobs = BlobStore::open(home.join("blobs"))?;
        let conn = db::open_writer(&db_path)?;
        let checkpointer = match options.checkpoint_every {
            Some(every) => Some(
                crate::checkpoint::Checkpointer::start(&conn, &db_path, every).map_err(|e| {
                    EnvError::Home {
                        path: db_path.clone(),
                        detail: format!("cannot start the checkpointer: {e}"),
                    }
                })?,
            ),
            None => None,
        };
        let nodes = Arc::new(NodeCache::new(options.node_cache));
        let ops = Arc::new(OpCache::new(100_000));
        let hub = Arc::new(events::Hub::new(options.publisher.is_some()));
        let after_commit = {
            let (nodes, ops, hub) = (nodes.clone(), ops.clone(), hub.clone());
            AfterCommit {
                announce: Box::new(move |ops| hub.deliver(ops)),
                remember: Box::new(move |new_nodes, new_ops| {
                    cache_committed(&nodes, &ops, new_nodes, new_ops)
                }),
            }
        };
        let writer = Writer::start(conn, after_commit)?;
        let inner = Arc::new(Inner {
            readers: ReadPool::new(db_path),
            home,
            options,
            blobs,
            writer,
            nodes,
            ops,
            hub,
            dropped: std::sync::RwLock::new(Default::default()),
            op_index: OpIndex::default(),
            _checkpointer: checkpointer,
        });
        let env = LocalEnvironment {
            inner,
            credentials: None,
        };
        env.init()?;
        let dropped = env.inner.readers.with(retention::dropped_in)?;
        if let Ok(mut d) = env.inner.dropped.write() {
            *d = dropped;
        }
        events::start_outbox(&env.inner);
        Ok(env)
    }

    /// Creates the first operation and the `main` branch if the log is empty.
    fn init(&self) -> Result<()> {
        let inner = self.inner.clone();
        self.inner.writer.run(false, move |conn, fx| {
            let any: Option<i64> = conn
                .query_row("SELECT seq FROM ops LIMIT 1", [], |r| r.get(0))
                .optional()?;
            if any.is_some() {
                return Ok(());
            }
            let nodes = inner.writer_nodes(conn);
            let mut edit = TreeEdit::new(&nodes, db::next_node_id(conn)?);
            let root = edit.store(Node::Leaf(Vec::new()));
            inner.persist(fx, edit, &root);
            inner.commit_op(
                conn,
                fx,
                OpDraft {
                    parents: Vec::new(),
                    view: root,
                    branch: MAIN.to_owned(),
                    actor: system_actor(),
                    intent: Intent::new(crate::op::IntentKind::Setup, "create the environment"),
                    base_version: None,
                    summary: ChangeSummary::default(),
                    flags: OpFlags::INIT,
                    permit: Permit::default(),
                    restored_from: None,
                    effects: Vec::new(),
                },
                None,
            )?;
            Ok(())
        })
    }

    /// The home directory.
    pub fn home(&self) -> &Path {
        &self.inner.home
    }

    /// The blob store.
    pub fn blobs(&self) -> &BlobStore {
        &self.inner.blobs
    }

    /// The operation at the head of `branch`.
    pub fn head(&self, branch: &str) -> Result<OpId> {
        self.inner.readers.with(|conn| {
            crate::heads::of(conn, branch)?.ok_or_else(|| EnvError::UnknownBranch(branch.into()))
        })
    }

    /// Every branch with its head, by name.
    pub fn branches(&self) -> Result<Vec<(String, OpId)>> {
        self.inner
            .readers
            .with(|conn| Ok(crate::heads::all(conn)?.into_iter().collect()))
    }

    /// The operation record with this id.
    pub fn op(&self, id: &OpId) -> Result<Arc<Operation>> {
        Ok(self.stored_op(id)?.0)
    }

    fn stored_op(&self, id: &OpId) -> Result<(Arc<Operation>, Ptr)> {
        if let Some((op, root)) = self.inner.ops.get(id) {
            let view = Ptr {
                hash: op.view,
                id: root,
            };
            return Ok((op, view));
        }
        let (op, view) = self
            .inner
            .readers
            .with(|conn| self.inner.stored_op_in(conn, id))?;
        self.inner.ops.insert(*id, (op.clone(), view.id));
        Ok((op, view))
    }

    /// The root of a version's view.
    fn view(&self, id: &OpId) -> Result<Ptr> {
        self.check_kept(id)?;
        Ok(self.stored_op(id)?.1)
    }

    /// Resolves a version spelled as a full id, a unique id prefix (4+ hex digits), a mark, a
    /// branch name, or any of these followed by `~N` (N first-parent steps back; `HEAD` means
    /// `main`).
    pub fn resolve(&self, spec: &str) -> Result<OpId> {
        let (base, back) = match spec.rsplit_once('~') {
            Some((b, n)) => (
                b,
                n.parse::<usize>()
                    .map_err(|_| EnvError::UnknownVersion(spec.to_owned()))?,
            ),
            None => (spec, 0),
        };
        let base = if base == "HEAD" { MAIN } else { base };
        let mut id = self
            .inner
            .readers
            .with(|conn| resolve_in(conn, &self.inner.op_index, base))?;
        for _ in 0..back {
            let op = self.op(&id)?;
            id = *op
                .parents
                .first()
                .ok_or_else(|| EnvError::UnknownVersion(spec.to_owned()))?;
        }
        Ok(id)
    }

    /// The value at `key` in `version`.
    pub fn read(&self, actor: &ActorId, key: &Key, version: &OpId) -> Result<Option<Value>> {
        self.authorize(actor, Action::Read, Resource::Key(key.clone()), None, None)?;
        self.read_unchecked(key, version)
    }

    /// Reads without asking the authorizer: for the environment's own machinery.
    pub fn read_unchecked(&self, key: &Key, version: &OpId) -> Result<Option<Value>> {
        let view = self.view(version)?;
        self.inner
            .readers
            .with(|conn| tree::get(&self.inner.nodes_in(conn), &view, key))
    }

    /// The bytes of a value, whole: inline content, or its blob or chunks (each checked
    /// against its hash). For a large file, [`BlobStore::write_chunked`] writes it without
    /// holding it in memory.
    pub fn content(&self, value: &Value) -> Result<Vec<u8>> {
        match &value.content {
            Content::Inline(b) => Ok(b.clone()),
            Content::Blob(h) => Ok(self.inner.blobs.get(h)?),
            Content::Chunks(m) => Ok(self.inner.blobs.read_chunked(m)?),
        }
    }

    /// Every key under `prefix` in `version`, ordered segment by segment.
    pub fn list(
        &self,
        actor: &ActorId,
        prefix: &KeyPrefix,
        version: &OpId,
    ) -> Result<Vec<(Key, Value)>> {
        self.authorize(
            actor,
            Action::Read,
            Resource::Prefix(prefix.clone()),
            None,
            None,
        )?;
        let view = self.view(version)?;
        self.inner
            .readers
            .with(|conn| tree::list(&self.inner.nodes_in(conn), &view, prefix))
    }

    /// The keys (under `prefix`, or all) whose values differ from `from` to `to`. Cost follows
    /// the size of the difference, not of the views.
    pub fn diff(
        &self,
        actor: &ActorId,
        from: &OpId,
        to: &OpId,
        prefix: Option<&KeyPrefix>,
    ) -> Result<Vec<KeyChange>> {
        let resource = match prefix {
            Some(p) => Resource::Prefix(p.clone()),
            None => Resource::Environment,
        };
        self.authorize(actor, Action::Read, resource, None, None)?;
        let (a, b) = (self.view(from)?, self.view(to)?);
        self.inner
            .readers
            .with(|conn| tree::diff(&self.inner.nodes_in(conn), &a, &b, prefix))
    }

    /// Subscribes to committed operations' events that pass `filter`.
    pub fn subscribe(&self, filter: crate::event::EventFilter) -> Subscription {
        self.inner.hub.subscribe(filter)
    }

    /// Asks the environment's authorizer about an action the environment does not perform
    /// itself (running a program, for a shell): anything but an allow is
    /// [`EnvError::NotAllowed`] carrying the decision. The handle's credentials (see
    /// [`LocalEnvironment::presenting`]) apply where the request presents none.
    pub fn check_access(&self, request: &AccessRequest) -> Result<Decision> {
        match &self.credentials {
            Some(c) if request.context.token.is_none() && request.context.approval.is_none() => {
                let mut request = request.clone();
                request.context.token.clone_from(&c.token);
                request.context.approval.clone_from(&c.approval);
                self.inner.check(&request)
            }
            _ => self.inner.check(request),
        }
    }

    /// Asks the authorizer; anything but an allow is an error carrying the decision.
    /// A handle on the same environment that presents `credentials` with every request it
    /// makes: a capability token limits what the actor may do through it, a granted approval
    /// lets through the request it was granted for. Other handles are unaffected.
    pub fn presenting(&self, credentials: Credentials) -> LocalEnvironment {
        LocalEnvironment {
            inner: self.inner.clone(),
            credentials: Some(Arc::new(credentials)),
        }
    }

    /// Decides whether `actor` may make `changes` (a write or a delete per key) on `branch`,
    /// one decision per key, so that no operation — an act, a restore, an undo, a merge —
    /// changes a key its actor may not change. Nothing is spent: the permit carries the rules
    /// that allowed the changes (for the operation's record) and what they consume, spent when
    /// the operation is recorded.
    pub(crate) fn decide_changes<'a>(
        &self,
        actor: &ActorId,
        branch: &str,
        operation: Option<&str>,
        changes: impl IntoIterator<Item = (Action, &'a Key)>,
    ) -> Result<Permit> {
        let mut permit = Permit::default();
        for d in self.decide_each(actor, branch, operation, changes) {
            permit.add(allowed(d)?);
        }
        Ok(permit)
    }

    /// One decision per change, in order, decided together (see [`Authorizer::decide_all`]).
    pub(crate) fn decide_each<'a>(
        &self,
        actor: &ActorId,
        branch: &str,
        operation: Option<&str>,
        changes: impl IntoIterator<Item = (Action, &'a Key)>,
    ) -> Vec<Decision> {
        let requests: Vec<AccessRequest> = changes
            .into_iter()
            .map(|(action, key)| {
                self.request(
                    actor,
                    action,
                    Resource::Key(key.clone()),
                    Some(branch),
                    operation,
                )
            })
            .collect();
        self.inner.options.authorizer.decide_all(&requests)
    }

    /// Decides and spends at once: for an action with no transaction of its own.
    pub(crate) fn authorize(
        &self,
        actor: &ActorId,
        action: Action,
        resource: Resource,
        branch: Option<&str>,
        operation: Option<&str>,
    ) -> Result<Decision> {
        let decision = self.decide(actor, action, resource, branch, operation)?;
        self.inner.spend(&decision.spend)?;
        Ok(decision)
    }

    /// Decides without spending; anything but an allow is an error carrying the decision.
    pub(crate) fn decide(
        &self,
        actor: &ActorId,
        action: Action,
        resource: Resource,
        branch: Option<&str>,
        operation: Option<&str>,
    ) -> Result<Decision> {
        let request = self.request(actor, action, resource, branch, operation);
        allowed(self.inner.options.authorizer.decide(&request))
    }

    /// The request this handle makes: with its credentials, the branch and the operation.
    fn request(
        &self,
        actor: &ActorId,
        action: Action,
        resource: Resource,
        branch: Option<&str>,
        operation: Option<&str>,
    ) -> AccessRequest {
        let mut context = Context {
            branch: branch.map(str::to_owned),
            ..Context::default()
        };
        if let Some(c) = &self.credentials {
            context.token.clone_from(&c.token);
            context.approval.clone_from(&c.approval);
        }
        if let Some(op) = operation {
            context
                .attrs
                .insert("operation".into(), AttrValue::Str(op.into()));
        }
        AccessRequest {
            actor: actor.clone(),
            action,
            resource,
            context,
        }
    }
}

fn allowed(decision: Decision) -> Result<Decision> {
    if decision.is_allowed() {
        Ok(decision)
    } else {
        Err(EnvError::NotAllowed(Box::new(decision)))
    }
}

impl From<Decision> for Permit {
    fn from(d: Decision) -> Permit {
        let mut p = Permit::default();
        p.add(d);
        p
    }
}

/// What let an operation through: the rules that allowed each of its checks, and the uses
/// they consume, spent when the operation is recorded (so a refused or conflicting one spends
/// nothing).
#[derive(Clone, Debug, Default)]
pub(crate) struct Permit {
    rules: std::collections::BTreeSet<String>,
    policy_version: u64,
    /// One use each: an operation is one action, however many keys it changes.
    pub spend: Vec<Spend>,
}

impl Permit {
    /// Adds one allowed decision.
    pub(crate) fn add(&mut self, d: Decision) {
        self.absorb(d.policy_version, d.rules, d.spend);
    }

    /// The same permit with its uses already spent.
    pub(crate) fn spent(mut self) -> Permit {
        self.spend.clear();
        self
    }

    /// Adds another permit's decisions.
    pub(crate) fn join(mut self, other: Permit) -> Permit {
        self.absorb(other.policy_version, other.rules, other.spend);
        self
    }

    fn absorb(
        &mut self,
        policy_version: u64,
        rules: impl IntoIterator<Item = String>,
        spend: Vec<Spend>,
    ) {
        self.policy_version = self.policy_version.max(policy_version);
        self.rules.extend(rules);
        for s in spend {
            if !self.spend.contains(&s) {
                self.spend.push(s);
            }
        }
    }

    /// The record of the decisions, when a policy decided.
    pub(crate) fn record(&self) -> Option<DecisionRef> {
        (self.policy_version > 0 || !self.rules.is_empty()).then(|| DecisionRef {
            policy_version: self.policy_version,
            rules: self.rules.iter().cloned().collect(),
        })
    }
}

/// An operation about to be recorded.
pub(crate) struct OpDraft {
    pub parents: Vec<OpId>,
    pub view: Ptr,
    pub branch: String,
    pub actor: ActorId,
    pub intent: Intent,
    pub base_version: Option<OpId>,
    pub summary: ChangeSummary,
    pub flags: OpFlags,
    pub permit: Permit,
    pub restored_from: Option<OpId>,
    pub effects: Vec<u64>,
}

impl Inner {
    /// Nodes as a reader sees them (committed only, so they may fill the cache).
    pub(crate) fn nodes_in<'a>(&'a self, conn: &'a Connection) -> DbNodes<'a> {
        DbNodes {
            conn,
            cache: &self.nodes,
            fill_cache: true,
        }
    }

    /// Nodes as the writer sees them, inside its open transaction.
    pub(crate) fn writer_nodes<'a>(&'a self, conn: &'a Connection) -> DbNodes<'a> {
        DbNodes {
            conn,
            cache: &self.nodes,
            fill_cache: false,
        }
    }

    pub(crate) fn check(&self, request: &AccessRequest) -> Result<Decision> {
        allowed(self.options.authorizer.authorize(request))
    }

    /// Spends what an operation's decisions consume; a use no longer available refuses it.
    /// Called inside the writer's transaction once every other check has passed (only a
    /// failure of the commit itself can follow, and it fails closed: the use stays spent).
    pub(crate) fn spend(&self, uses: &[Spend]) -> Result<()> {
        if uses.is_empty() {
            return Ok(());
        }
        self.options
            .authorizer
            .spend(uses)
            .map_err(EnvError::NotAllowed)
    }

    pub(crate) fn op_in(&self, conn: &Connection, id: &OpId) -> Result<Arc<Operation>> {
        Ok(self.stored_op_in(conn, id)?.0)
    }

    /// An operation and the root of its view. Does not fill the cache: the caller may be the
    /// writer, seeing its own uncommitted rows.
    pub(crate) fn stored_op_in(
        &self,
        conn: &Connection,
        id: &OpId,
    ) -> Result<(Arc<Operation>, Ptr)> {
        // The writer's jobs find the operations of the jobs before them in the same
        // transaction in memory (elsewhere there are none).
        if let Some((op, root)) = self.ops.get(id).or_else(|| db::pending_op(id)) {
            let view = Ptr {
                hash: op.view,
                id: root,
            };
            return Ok((op, view));
        }
        let key = &id.0.0[..];
        let found = self.op_index.find(conn, key, key, |seq| {
            let row: Option<(Vec<u8>, NodeId, Vec<u8>)> = conn
                .prepare_cached("SELECT id, root, record FROM ops WHERE seq = ?1")?
                .query_row([seq], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                .optional()?;
            Ok(row.and_then(|(at, root, record)| (at == key).then_some((root, record))))
        })?;
        let (root, record) = found
            .into_iter()
            .next()
            .ok_or_else(|| EnvError::UnknownVersion(id.to_string()))?;
        let op = Arc::new(decode_op(&record)?);
        let view = Ptr {
            hash: op.view,
            id: root,
        };
        Ok((op, view))
    }

    /// Records an operation and moves its branch's head to it (compare-and-swap against
    /// `expected_head`, `None` for a new branch). Called inside the writer's transaction.
    pub(crate) fn commit_op(
        &self,
        conn: &Connection,
        fx: &mut TxEffects,
        draft: OpDraft,
        expected_head: Option<&OpId>,
    ) -> Result<Arc<Operation>> {
        let seq = db::next_seq(conn)?;
        let mut op = Operation {
            id: OpId(Hash([0; 32])),
            seq: seq as u64,
            parents: draft.parents,
            view: draft.view.hash,
            branch: draft.branch,
            actor: draft.actor,
            intent: draft.intent,
            base_version: draft.base_version,
            summary: draft.summary,
            flags: draft.flags,
            time_ms: self.options.clock.now_ms(),
            decision: draft.permit.record(),
            restored_from: draft.restored_from,
            effects: draft.effects,
        };
        // Every caller read the head it builds on in this transaction, and heads move only by
        // recording operations: a different head here would be a bug, refused before writing.
        if db::head(conn, &op.branch)?.as_ref() != expected_head {
            return Err(EnvError::UnknownBranch(op.branch.clone()));
        }
        self.spend(&draft.permit.spend)?;
        // Recording the operation moves its branch's head (see `heads`), and stores the nodes
        // the job created.
        let run = history::CaptureRun::pending(self, conn, &op)?;
        op.id = op.sealed(|id, record| -> Result<OpId> {
            let nodes = db::store_op_nodes(conn, seq, record.len())?;
            conn.prepare_cached(
                "INSERT INTO ops(seq, id, root, record, branch, nodes, run) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )?
            .execute(params![
                seq,
                &id.0.0[..],
                draft.view.id,
                record,
                op.branch,
                nodes,
                run.map(|r| r.sealed(&id)),
            ])?;
            Ok(id)
        })?;
        if self.hub.has_publisher() {
            let bytes = serde_json::to_vec(&Event::from(&op)).map_err(|e| EnvError::Decode {
                what: "event",
                detail: e.to_string(),
            })?;
            conn.prepare_cached("INSERT INTO outbox(event) VALUES (?1)")?
                .execute([bytes])?;
        }
        let op = Arc::new(op);
        fx.ops.push((op.clone(), draft.view.id));
        Ok(op)
    }

    /// Persists the nodes an edit created that `root` reaches (they are written with the
    /// operation the job records), and schedules them for the cache.
    pub(crate) fn persist(&self, fx: &mut TxEffects, edit: TreeEdit<'_>, root: &Ptr) {
        let new = edit.into_new_nodes(root);
        db::insert_nodes(&new);
        fx.nodes.extend(new.into_iter().map(|n| (n.ptr.id, n.node)));
    }
}

/// Puts what a group committed in the caches: its operations, and the nodes of the versions it
/// leaves its branches at. Those are what is likely to be read next; the nodes of the versions
/// in between are read back from the database if ever, and caching them would only evict as
/// many others.
fn cache_committed(
    nodes: &NodeCache,
    ops: &OpCache,
    new_nodes: db::CommittedNodes,
    new_ops: db::CommittedOps,
) {
    let mut new_nodes: HashMap<NodeId, Arc<Node>> = new_nodes.into_iter().collect();
    let mut last_roots: HashMap<&str, NodeId> = HashMap::new();
    for (op, root) in &new_ops {
        last_roots.insert(&op.branch, *root);
    }
    let mut live: Vec<NodeId> = last_roots.into_values().collect();
    while let Some(id) = live.pop() {
        if let Some(node) = new_nodes.remove(&id) {
            live.extend(node.children().map(|p| p.id));
            nodes.insert(id, node);
        }
    }
    for (op, root) in new_ops {
        ops.insert(op.id, (op, root));
    }
}

pub(crate) fn decode_op(record: &[u8]) -> Result<Operation> {
    postcard::from_bytes(record).map_err(|e| EnvError::Decode {
        what: "operation",
        detail: e.to_string(),
    })
}

pub(crate) fn op_id_from(bytes: &[u8]) -> Result<OpId> {
    Hash::from_slice(bytes).map(OpId).ok_or(EnvError::Decode {
        what: "operation id",
        detail: format!("{} bytes instead of 32", bytes.len()),
    })
}

/// Rows of (name, operation id), for marks.
pub(crate) fn named_ops(conn: &Connection, sql: &str) -> Result<Vec<(String, OpId)>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let rows = stmt.query_map([], |r| {
        Ok((r.get::<_, String>(0)?, r.get::<_, Vec<u8>>(1)?))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (name, op) = row?;
        out.push((name, op_id_from(&op)?));
    }
    Ok(out)
}

fn resolve_in(conn: &Connection, index: &OpIndex, spec: &str) -> Result<OpId> {
    if let Some(h) = crate::heads::of(conn, spec)? {
        return Ok(h);
    }
    if let Some(m) = branch::mark_in(conn, spec)? {
        return Ok(m);
    }
    let is_hex = spec.len() >= 4 && spec.len() <= 64 && spec.bytes().all(|b| b.is_ascii_hexdigit());
    if !is_hex {
        return Err(EnvError::UnknownVersion(spec.to_owned()));
    }
    let lower = spec.to_ascii_lowercase();
    let bound = |fill: char| -> Result<Vec<u8>> {
        let full: String = lower
            .chars()
            .chain(std::iter::repeat(fill))
            .take(64)
            .collect();
        hex::decode(full).map_err(|_| EnvError::UnknownVersion(spec.to_owned()))
    };
    let (lo, hi) = (bound('0')?, bound('f')?);
    let found = index.find(conn, &lo, &hi, |seq| {
        let id: Option<Vec<u8>> = conn
            .prepare_cached("SELECT id FROM ops WHERE seq = ?1")?
            .query_row([seq], |r| r.get(0))
            .optional()?;
        Ok(id.filter(|id| (&lo[..]..=&hi[..]).contains(&&id[..])))
    })?;
    match found.as_slice() {
        [one] => op_id_from(one),
        [] => Err(EnvError::UnknownVersion(spec.to_owned())),
        _ => Err(EnvError::AmbiguousVersion {
            prefix: spec.to_owned(),
            count: found.len(),
        }),
    }
}

/// Branch and mark names: short, printable, no spaces, no `~` or `:` (they have meanings in
/// version specs), not a hex string that could be mistaken for an id.
pub(crate) fn validate_name(name: &str) -> Result<()> {
    let bad = |reason| {
        Err(EnvError::InvalidName {
            name: name.to_owned(),
            reason,
        })
    };
    if name.is_empty() || name.len() > 100 {
        return bad("a name has 1 to 100 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'/'))
    {
        return bad("a name uses only letters, digits, `-`, `_`, `.` and `/`");
    }
    if name.starts_with(['-', '.', '/']) || name.ends_with('/') || name.contains("//") {
        return bad("a name does not start with `-`, `.` or `/`, nor end with `/`");
    }
    if name == "HEAD" || (name.len() >= 4 && name.bytes().all(|b| b.is_ascii_hexdigit())) {
        return bad("`HEAD` and hex strings are reserved for versions");
    }
    Ok(())
}
