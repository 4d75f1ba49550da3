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
use crate::embedded::{EmbeddedStore, NodeCache};
use crate::error::{EnvError, Result};
use crate::event::{Event, Publisher};
use crate::hash::Hash;
use crate::key::{Key, KeyPrefix};
use crate::op::{ChangeSummary, DecisionRef, Intent, OpFlags, OpId, Operation};
use crate::store::{AfterCommit, CommittedNodes, CommittedOps, LogRead, LogStore, LogWrite, Nodes};
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
    /// Where the effect log is kept when not in the environment's database: a store several
    /// machines share, so that an effect begun on one is never begun again on another.
    pub effects: Option<Arc<dyn crate::effect::EffectStore>>,
    /// Opens the store of the log (operations, heads, marks, tree nodes) when it is not the
    /// environment's database: a store several machines share. It is handed what must hear
    /// of every commit. Such an environment keeps its effect log in [`Options::effects`],
    /// which must then be set.
    pub log_store: Option<OpenLogStore>,
    /// The blob store every machine of the environment shares (a bucket), of which the home's
    /// blob store is then this machine's cache: what an act stores is shared before it
    /// commits, and what this machine lacks is fetched when read. Set it with a shared
    /// [`Options::log_store`], or other machines read operations whose content they cannot get.
    pub shared_blobs: Option<Arc<dyn crate::blob::SharedBlobs>>,
}

/// Opens a store of the log, handed what must hear of every commit (see
/// [`Options::log_store`]).
pub type OpenLogStore = Arc<dyn Fn(AfterCommit) -> Result<Arc<dyn LogStore>> + Send + Sync>;

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
            effects: None,
            log_store: None,
            shared_blobs: None,
        }
    }
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Options")
            .field("publisher", &self.publisher.is_some())
            .field("max_value_bytes", &self.max_value_bytes)
            .field("max_changes", &self.max_changes)
            .field("effects", &self.effects.is_some())
            .field("log_store", &self.log_store.is_some())
            .field("shared_blobs", &self.shared_blobs.is_some())
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    home: PathBuf,
    options: Options,
    blobs: BlobStore,
    /// The log, its heads, marks and tree nodes.
    store: Arc<dyn LogStore>,
    /// The effect log: in the database, unless [`Options::effects`] names another store.
    effects: Arc<dyn crate::effect::EffectStore>,
    ops: Arc<OpCache>,
    hub: Arc<events::Hub>,
    /// Versions dropped by retention (as this process knows them; the table is the truth).
    dropped: std::sync::RwLock<std::collections::HashSet<OpId>>,
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
        let mut blobs = BlobStore::open(home.join("blobs"))?;
        if let Some(shared) = &options.shared_blobs {
            blobs = blobs.sharing(shared.clone());
        }
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
        let (store, effects): (Arc<dyn LogStore>, _) = match &options.log_store {
            Some(open) => {
                let effects = options.effects.clone().ok_or_else(|| EnvError::Home {
                    path: home.clone(),
                    detail: "an environment whose log is in a store of its own keeps its effect \
                             log in one too: set Options::effects"
                        .into(),
                })?;
                (open(after_commit)?, effects)
            }
            None => {
                let embedded = EmbeddedStore::open(
                    &home.join("env.db"),
                    options.checkpoint_every,
                    nodes,
                    after_commit,
                )?;
                let effects = match &options.effects {
                    Some(shared) => shared.clone(),
                    None => embedded.effects(),
                };
                (Arc::new(embedded), effects)
            }
        };
        let inner = Arc::new(Inner {
            store,
            effects,
            home,
            options,
            blobs,
            ops,
            hub,
            dropped: std::sync::RwLock::new(Default::default()),
        });
        let env = LocalEnvironment {
            inner,
            credentials: None,
        };
        env.init()?;
        let dropped = env.inner.read(|log| log.dropped_ids())?;
        if let Ok(mut d) = env.inner.dropped.write() {
            *d = dropped;
        }
        events::start_outbox(&env.inner);
        Ok(env)
    }

    /// Creates the first operation and the `main` branch if the log is empty.
    fn init(&self) -> Result<()> {
        self.inner.write(false, move |inner, tx| {
            if tx.has_ops()? {
                return Ok(());
            }
            let first_id = tx.next_node_id()?;
            let nodes = Nodes(&*tx);
            let mut edit = TreeEdit::new(&nodes, first_id);
            let root = edit.store(Node::Leaf(Vec::new()));
            let new = edit.into_new_nodes(&root);
            tx.put_nodes(crate::store::stored(new));
            inner.commit_op(
                tx,
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

    /// The environment's first operation: its creation, whose view is empty (a new working
    /// copy holds it before anything is written into it). Never dropped.
    pub fn first_version(&self) -> Result<OpId> {
        self.inner.read(|log| {
            log.first_op()?.ok_or_else(|| EnvError::Integrity {
                at: "the log".into(),
                detail: "no operation is recorded".into(),
            })
        })
    }

    /// The operation at the head of `branch`.
    pub fn head(&self, branch: &str) -> Result<OpId> {
        self.inner.read(|log| {
            log.head(branch)?
                .ok_or_else(|| EnvError::UnknownBranch(branch.into()))
        })
    }

    /// Every branch with its head, by name.
    pub fn branches(&self) -> Result<Vec<(String, OpId)>> {
        self.inner
            .read(|log| Ok(log.heads()?.into_iter().collect()))
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
        let (op, view) = self.inner.read(|log| self.inner.stored_op_in(log, id))?;
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
        let mut id = self.inner.read(|log| resolve_in(log, base))?;
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
            .read(|log| tree::get(&Nodes(log), &view, key))
            .map_err(|e| self.dropped_or(e, &[version]))
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
            .read(|log| tree::list(&Nodes(log), &view, prefix))
            .map_err(|e| self.dropped_or(e, &[version]))
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
            .read(|log| tree::diff(&Nodes(log), &a, &b, prefix))
            .map_err(|e| self.dropped_or(e, &[from, to]))
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
    /// Reads the store.
    pub(crate) fn read<R: Send>(
        &self,
        f: impl FnOnce(&dyn LogRead) -> Result<R> + Send,
    ) -> Result<R> {
        self.reading(false, f)
    }

    /// [`Inner::read`] of one consistent state, for a walk of many reads.
    pub(crate) fn read_snapshot<R: Send>(
        &self,
        f: impl FnOnce(&dyn LogRead) -> Result<R> + Send,
    ) -> Result<R> {
        self.reading(true, f)
    }

    fn reading<R: Send>(
        &self,
        snapshot: bool,
        f: impl FnOnce(&dyn LogRead) -> Result<R> + Send,
    ) -> Result<R> {
        let mut f = Some(f);
        let mut out = None;
        self.store.read(snapshot, &mut |log| {
            if let Some(f) = f.take() {
                out = Some(f(log)?);
            }
            Ok(())
        })?;
        out.ok_or(EnvError::Closed)
    }

    /// Runs `job` in a write transaction and waits for its commit. `full_sync` makes the
    /// commit durable against power loss, not only against a crash of the process.
    pub(crate) fn write<R: Send + 'static>(
        self: &Arc<Self>,
        full_sync: bool,
        job: impl FnOnce(&Arc<Inner>, &mut dyn LogWrite) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let answer = self.store.write(full_sync, self.erased(job))?;
        answered(answer)
    }

    /// [`Inner::write`] without blocking the async runtime.
    pub(crate) async fn submit<R: Send + 'static>(
        self: &Arc<Self>,
        job: impl FnOnce(&Arc<Inner>, &mut dyn LogWrite) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let answer = self
            .store
            .submit(self.erased(job))
            .await
            .map_err(|_| EnvError::Closed)??;
        answered(answer)
    }

    /// `job` as the store runs it: with this environment, its answer's type erased.
    fn erased<R: Send + 'static>(
        self: &Arc<Self>,
        job: impl FnOnce(&Arc<Inner>, &mut dyn LogWrite) -> Result<R> + Send + 'static,
    ) -> crate::store::WriteJob {
        let inner = self.clone();
        Box::new(move |tx| Ok(Box::new(job(&inner, tx)?) as crate::store::Answer))
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

    pub(crate) fn op_in(&self, log: &dyn LogRead, id: &OpId) -> Result<Arc<Operation>> {
        Ok(self.stored_op_in(log, id)?.0)
    }

    /// An operation and the root of its view. Does not fill the cache: the caller may be the
    /// writer, seeing its own uncommitted rows.
    pub(crate) fn stored_op_in(
        &self,
        log: &dyn LogRead,
        id: &OpId,
    ) -> Result<(Arc<Operation>, Ptr)> {
        let (op, root) = match self.ops.get(id) {
            Some(found) => found,
            None => log
                .find_op(id)?
                .ok_or_else(|| EnvError::UnknownVersion(id.to_string()))?,
        };
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
        tx: &mut dyn LogWrite,
        draft: OpDraft,
        expected_head: Option<&OpId>,
    ) -> Result<Arc<Operation>> {
        let seq = tx.next_seq()?;
        let mut op = Operation {
            id: OpId(Hash([0; 32])),
            seq,
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
        if tx.head(&op.branch)?.as_ref() != expected_head {
            return Err(EnvError::UnknownBranch(op.branch.clone()));
        }
        self.spend(&draft.permit.spend)?;
        // Recording the operation moves its branch's head, and stores the nodes the job
        // created.
        let run = history::CaptureRun::pending(self, tx, &op)?;
        let (id, record) = op.sealed(|id, record| (id, record.to_vec()));
        op.id = id;
        let event = if self.hub.has_publisher() {
            Some(
                serde_json::to_vec(&Event::from(&op)).map_err(|e| EnvError::Decode {
                    what: "event",
                    detail: e.to_string(),
                })?,
            )
        } else {
            None
        };
        let run = run.map(|r| r.sealed(&op.id));
        let op = Arc::new(op);
        tx.append(op.clone(), &record, draft.view.id, run)?;
        if let Some(event) = event {
            tx.queue_event(event)?;
        }
        Ok(op)
    }
}

/// A write job's answer, as the job gave it.
fn answered<R: 'static>(answer: crate::store::Answer) -> Result<R> {
    answer
        .downcast::<R>()
        .map(|r| *r)
        .map_err(|_| EnvError::CommitFailed("a write job's answer was lost".into()))
}

/// Puts what a group committed in the caches: its operations, and the nodes of the versions it
/// leaves its branches at. Those are what is likely to be read next; the nodes of the versions
/// in between are read back from the database if ever, and caching them would only evict as
/// many others.
fn cache_committed(
    nodes: &NodeCache,
    ops: &OpCache,
    new_nodes: CommittedNodes,
    new_ops: CommittedOps,
) {
    let mut new_nodes: HashMap<NodeId, Arc<Node>> =
        new_nodes.into_iter().map(|(id, n)| (id, n.0)).collect();
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
    Operation::decode(record)
}

pub(crate) fn op_id_from(bytes: &[u8]) -> Result<OpId> {
    Hash::from_slice(bytes).map(OpId).ok_or(EnvError::Decode {
        what: "operation id",
        detail: format!("{} bytes instead of 32", bytes.len()),
    })
}

fn resolve_in(log: &dyn LogRead, spec: &str) -> Result<OpId> {
    if let Some(h) = log.head(spec)? {
        return Ok(h);
    }
    if let Some(m) = log.mark(spec)? {
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
    let found = log.op_ids_between(&lo, &hi)?;
    match found.as_slice() {
        [one] => Ok(*one),
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
