//! The action path: authorize, store content, apply, record, announce — one transaction.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::sync::Arc;

use super::refused::Refused;
use super::{Inner, LocalEnvironment, OpDraft, Permit};
use crate::action::{ActRequest, Change, Observation, Refusal};
use crate::authz::{Action, Decision, Verdict};
use crate::blob::{ShareWindow, WriteGuard};
use crate::error::{EnvError, Result, StaleWrite};
use crate::key::Key;
use crate::op::{ChangeSummary, IntentKind, OpFlags, OpId};
use crate::store::{LogRead, LogWrite, Nodes};
use crate::tree::{self, Applied, Ptr, Put, TreeEdit};
use crate::value::{Content, EntryKind, INLINE_MAX, Value};

const CALLER_FLAGS: OpFlags =
    OpFlags(OpFlags::AUTO_CAPTURE.0 | OpFlags::QUIET.0 | OpFlags::COMMAND.0 | OpFlags::FAILED.0);

/// An act checked, authorized and with its content stored, ready for the writer.
pub(crate) struct Prepared {
    req: ActRequest,
    puts: Vec<Put>,
    permit: Permit,
    refused: Vec<Refused>,
    _guard: Option<WriteGuard>,
    /// Open while the blobs shared for this act are safe from the shared store's collection.
    shared: Option<Box<dyn ShareWindow>>,
}

/// What is left of a prepared act once it is recorded: the caller drops it after the commit, so
/// its blob write guard lasts until the operation that refers to the blobs is committed, and its
/// memory is freed on the caller's thread, not the writer's.
pub(crate) struct Spent {
    _puts: Vec<Put>,
    _guard: Option<WriteGuard>,
}

impl LocalEnvironment {
    /// Performs an act and waits for it to commit. Blocks: from async code use
    /// [`crate::Environment::act`].
    pub fn act_blocking(&self, req: ActRequest) -> Result<Observation> {
        let prepared = self.prepare_act(req, true)?;
        self.inner
            .write(false, move |inner, tx| inner.apply_act(tx, prepared))
            .map(|(observation, _spent)| observation)
    }

    /// Performs an act without blocking the async runtime: content that needs the blob store is
    /// stored on the blocking pool; the commit is awaited.
    pub(crate) async fn act_async(&self, req: ActRequest) -> Result<Observation> {
        let needs_blobs = req.changes.iter().any(|c| match c {
            Change::Put(_, v) => {
                matches!(&v.content, Content::Inline(b) if b.len() > INLINE_MAX)
                    || matches!(v.content, Content::Blob(_) | Content::Chunks(_))
            }
            Change::Delete(_) => false,
        });
        let prepared = if needs_blobs {
            let this = self.clone();
            tokio::task::spawn_blocking(move || this.prepare_act(req, true))
                .await
                .map_err(|_| EnvError::Closed)??
        } else {
            self.prepare_act(req, false)?
        };
        self.inner
            .submit(move |inner, tx| inner.apply_act(tx, prepared))
            .await
            .map(|(observation, _spent)| observation)
    }

    /// Checks limits and authorization, and stores large content (before the transaction:
    /// blob I/O never holds the writer).
    pub(crate) fn prepare_act(&self, mut req: ActRequest, may_store: bool) -> Result<Prepared> {
        let opts = &self.inner.options;
        if req.changes.len() > opts.max_changes {
            return Err(EnvError::RequestTooLarge(format!(
                "{} changes; the limit is {}",
                req.changes.len(),
                opts.max_changes
            )));
        }
        if req.intent.text.len() > opts.max_intent_len {
            return Err(EnvError::RequestTooLarge(format!(
                "an intent of {} bytes; the limit is {}",
                req.intent.text.len(),
                opts.max_intent_len
            )));
        }
        super::validate_name(&req.branch)?;
        req.flags = OpFlags(req.flags.0 & CALLER_FLAGS.0);
        let mut seen = BTreeSet::new();
        for c in &req.changes {
            if !seen.insert(c.key()) {
                return Err(EnvError::DuplicateKey(c.key().clone()));
            }
        }
        let action = |c: &Change| match c {
            Change::Put(..) => Action::Write,
            Change::Delete(_) => Action::Delete,
        };
        let mut refused = Vec::new();
        // A capture says so, for the one rule that records the witness's (see `WitnessRule`).
        let operation = (req.intent.kind == IntentKind::Capture).then_some("capture");
        let permit = match req.refusal {
            Refusal::Whole => {
                let implied = implied_directories(&req.changes);
                self.decide_changes(
                    &req.actor,
                    &req.branch,
                    operation,
                    req.changes
                        .iter()
                        .filter(|c| !implied.contains(c.key()))
                        .map(|c| (action(c), c.key())),
                )?
            }
            Refusal::Record => {
                let mut permit = Permit::default();
                let mut kept = Vec::with_capacity(req.changes.len());
                let decided = self.decide_each(
                    &req.actor,
                    &req.branch,
                    operation,
                    req.changes.iter().map(|c| (action(c), c.key())),
                );
                for (c, d) in std::mem::take(&mut req.changes).into_iter().zip(decided) {
                    if d.is_allowed() {
                        permit.add(d);
                        kept.push(c);
                    } else {
                        refused.push(Refused::of(c, d));
                    }
                }
                req.changes = keep_a_tree(kept, &mut refused);
                permit
            }
        };
        let mut guard = None;
        let mut puts = Vec::with_capacity(req.changes.len());
        for c in std::mem::take(&mut req.changes) {
            match c {
                Change::Delete(k) => puts.push((k, None)),
                Change::Put(k, mut v) => {
                    self.store_content(&k, &mut v, &mut guard, may_store)?;
                    puts.push((k, Some(v)));
                }
            }
        }
        // A refused value is kept as it was made: its content is stored like a recorded one.
        for r in &mut refused {
            if let Some(v) = &mut r.value {
                self.store_content(&r.key, v, &mut guard, may_store)?;
            }
        }
        let shared = self.share_content(&puts, &refused)?;
        Ok(Prepared {
            req,
            puts,
            permit,
            refused,
            _guard: guard,
            shared,
        })
    }

    /// Shares the blobs of the act's values (recorded and refused) with the other machines of
    /// the environment, when it has a shared blob store; the window that comes back is checked
    /// right before the act commits.
    fn share_content(
        &self,
        puts: &[Put],
        refused: &[Refused],
    ) -> Result<Option<Box<dyn ShareWindow>>> {
        let blobs = &self.inner.blobs;
        if blobs.shared().is_none() {
            return Ok(None);
        }
        let values = puts
            .iter()
            .filter_map(|(_, v)| v.as_ref())
            .chain(refused.iter().filter_map(|r| r.value.as_ref()));
        let mut hashes = Vec::new();
        let mut seen = HashSet::new();
        for v in values {
            for h in blobs.blobs_of(&v.content)? {
                if seen.insert(h) {
                    hashes.push(h);
                }
            }
        }
        Ok(blobs.share(&hashes)?)
    }

    fn store_content(
        &self,
        key: &Key,
        v: &mut Value,
        guard: &mut Option<WriteGuard>,
        may_store: bool,
    ) -> Result<()> {
        let limit = self.inner.options.max_value_bytes;
        let blobs = &self.inner.blobs;
        match &v.content {
            Content::Inline(bytes) => {
                let size = bytes.len() as u64;
                if size > limit {
                    return Err(EnvError::ValueTooLarge {
                        key: key.clone(),
                        size,
                        limit,
                    });
                }
                // A symlink's size is its target's length (as `lstat` says), so a value read
                // back compares equal to the same link read from disk again.
                v.meta.size = match (&v.meta.kind, &v.meta.symlink_target) {
                    (crate::value::EntryKind::Symlink, Some(target)) => target.len() as u64,
                    _ => size,
                };
                if bytes.len() > INLINE_MAX && may_store {
                    if guard.is_none() {
                        *guard = Some(blobs.write_guard()?);
                    }
                    v.content = Content::Blob(blobs.put(bytes)?);
                }
            }
            Content::Blob(h) | Content::Chunks(h) => {
                if guard.is_none() && may_store {
                    *guard = Some(blobs.write_guard()?);
                }
                // Content another machine stored is fetched from the shared store, if any.
                if !blobs.obtain(h)? {
                    return Err(crate::error::BlobError::Missing(*h).into());
                }
            }
        }
        Ok(())
    }
}

/// Of `kept`, what stays once the changes the refused ones hold back are refused with them: a
/// change under a key whose change was refused (a file in a directory the actor may not make),
/// and the removal of a directory that keeps a refused change. The refused changes of `kept`
/// join `refused`, with the decision of the change that held them back.
fn keep_a_tree(kept: Vec<Change>, refused: &mut Vec<Refused>) -> Vec<Change> {
    if refused.is_empty() {
        return kept;
    }
    let decided: BTreeMap<Key, Decision> = refused
        .iter()
        .map(|r| (r.key.clone(), r.decision.clone()))
        .collect();
    let mut below: BTreeMap<Key, &Decision> = BTreeMap::new();
    for (key, d) in &decided {
        let mut at = key.parent();
        while let Some(k) = at {
            at = k.parent();
            below.entry(k).or_insert(d);
        }
    }
    let mut out = Vec::with_capacity(kept.len());
    for c in kept {
        let mut at = c.key().parent();
        let mut held = None;
        while let Some(k) = at {
            if let Some(d) = decided.get(&k) {
                held = Some(d);
                break;
            }
            at = k.parent();
        }
        let held = held.or_else(|| match &c {
            Change::Delete(k) => below.get(k).copied(),
            Change::Put(..) => None,
        });
        match held {
            Some(d) => refused.push(Refused::of(c, d.clone())),
            None => out.push(c),
        }
    }
    out
}

impl Inner {
    /// Runs a prepared act in the writer's transaction. The request's parts move into the
    /// operation; what is left comes back with the observation (see [`Spent`]).
    pub(crate) fn apply_act(
        self: &Arc<Self>,
        tx: &mut dyn LogWrite,
        p: Prepared,
    ) -> Result<(Observation, Spent)> {
        let Prepared {
            req,
            mut puts,
            permit,
            mut refused,
            _guard,
            shared,
        } = p;
        // The shared blobs must still be there when the operation that refers to them commits.
        if let Some(window) = &shared {
            window.check().map_err(crate::error::BlobError::Shared)?;
        }
        let ActRequest {
            actor,
            branch,
            base,
            intent,
            changes: _,
            mut flags,
            effects,
            refusal,
        } = req;

        let spent = |puts| Spent {
            _puts: puts,
            _guard,
        };
        let head_id = existing_head(tx, &branch)?;
        let (head, head_view) = self.stored_op_in(tx, &head_id)?;
        let base_id = base.unwrap_or(head_id);
        let mut rebased = false;
        if base_id != head_id {
            let (base_op, base_view) = self.stored_op_in(tx, &base_id)?;
            if tx.is_dropped(base_op.seq)? {
                return Err(EnvError::VersionDropped(base_id));
            }
            // Under `Record`, only paths of a tree can be stale: the rest of such an act (the
            // records of the command that made the changes) is written over the head.
            let compared = puts.iter().map(|(k, _)| k).filter(|k| {
                refusal == Refusal::Whole || k.namespace() == crate::key::Namespace::Fs
            });
            let moved = moved_keys(tx, &base_view, &head_view, compared)?;
            if !moved.is_empty() {
                let ops = self.ops_that_changed(tx, &head_id, &base_id, &moved)?;
                if refusal == Refusal::Whole {
                    return Err(EnvError::Conflict(Box::new(StaleWrite {
                        keys: moved,
                        ops,
                        base: base_id,
                        current: head_id,
                    })));
                }
                refuse_stale(tx, &head_view, &moved, &ops, &mut puts, &mut refused)?;
            }
            if refusal == Refusal::Record {
                let homeless = homeless(tx, &base_view, &head_view, &puts)?;
                if !homeless.is_empty() {
                    let (keys, why): (Vec<Key>, Vec<Key>) = homeless.into_iter().unzip();
                    let ops = self.ops_that_changed(tx, &head_id, &base_id, &why)?;
                    refuse_stale(tx, &head_view, &keys, &ops, &mut puts, &mut refused)?;
                }
            }
            rebased = true;
        }
        let first_id = tx.next_node_id()?;
        let nodes = Nodes(&*tx);
        let mut edit = TreeEdit::new(&nodes, first_id);
        let (view, applied) = tree::apply(&mut edit, &head_view, &puts)?;
        // Refused changes are recorded last, once nothing can refuse the operation (a job that
        // fails must not have written), against the head they were decided on.
        let clock = &*self.options.clock;
        if applied.is_empty() {
            let refused =
                super::refused::record(tx, &actor, &branch, head_id, &intent, clock, refused)?;
            let observation = Observation {
                version: head_id,
                seq: head.seq,
                branch,
                rebased,
                noop: true,
                summary: ChangeSummary::default(),
                refused,
            };
            return Ok((observation, spent(puts)));
        }
        let refusing = (!refused.is_empty()).then(|| (actor.clone(), intent.clone()));
        let summary = summarize(&applied);
        let new = edit.into_new_nodes(&view);
        tx.put_nodes(crate::store::stored(new));
        if rebased {
            flags |= OpFlags::REBASED;
        }
        let op = self.commit_op(
            tx,
            OpDraft {
                parents: vec![head_id],
                view,
                branch,
                actor,
                intent,
                base_version: Some(base_id),
                summary: summary.clone(),
                flags,
                permit,
                restored_from: None,
                effects,
            },
            Some(&head_id),
        )?;
        let refused = match refusing {
            Some((actor, intent)) => {
                super::refused::record(tx, &actor, &op.branch, head_id, &intent, clock, refused)?
            }
            None => Vec::new(),
        };
        let observation = Observation {
            version: op.id,
            seq: op.seq,
            branch: op.branch.clone(),
            rebased,
            noop: false,
            summary,
            refused,
        };
        Ok((observation, spent(puts)))
    }

    /// The operations between `head` and `base` (first parents, newest first) that changed any
    /// of `keys`. Bounded: a very long gap names the most recent ones.
    pub(crate) fn ops_that_changed(
        &self,
        log: &dyn LogRead,
        head: &OpId,
        base: &OpId,
        keys: &[Key],
    ) -> Result<Vec<OpId>> {
        const MAX_WALK: usize = 10_000;
        let mut out = Vec::new();
        let (mut cur, mut cur_view) = self.stored_op_in(log, head)?;
        for _ in 0..MAX_WALK {
            if cur.id == *base {
                break;
            }
            let Some(parent_id) = cur.parents.first() else {
                break;
            };
            let (parent, parent_view) = self.stored_op_in(log, parent_id)?;
            for k in keys {
                if tree::get(&Nodes(log), &cur_view, k)? != tree::get(&Nodes(log), &parent_view, k)?
                {
                    out.push(cur.id);
                    break;
                }
            }
            (cur, cur_view) = (parent, parent_view);
        }
        Ok(out)
    }
}

/// The head of a branch that must exist.
pub(crate) fn existing_head(log: &dyn LogRead, branch: &str) -> Result<OpId> {
    log.head(branch)?
        .ok_or_else(|| EnvError::UnknownBranch(branch.into()))
}

/// Of `keys`, those whose values differ between `base` and `head`: O(k · depth).
fn moved_keys<'k>(
    log: &dyn LogRead,
    base: &Ptr,
    head: &Ptr,
    keys: impl Iterator<Item = &'k Key>,
) -> Result<Vec<Key>> {
    let mut moved = Vec::new();
    for k in keys {
        if tree::get(&Nodes(log), base, k)? != tree::get(&Nodes(log), head, k)? {
            moved.push(k.clone());
        }
    }
    Ok(moved)
}

/// Takes out of `puts` the changes to `moved` keys (changed on the branch since the act's base,
/// by `ops`): one that puts what the head holds already (see `same_but_time`) is dropped
/// (nothing to record), any other is refused as a stale write, so the change made in a tree is
/// kept, never laid over the newer one.
fn refuse_stale(
    log: &dyn LogRead,
    head: &Ptr,
    moved: &[Key],
    ops: &[OpId],
    puts: &mut Vec<Put>,
    refused: &mut Vec<Refused>,
) -> Result<()> {
    let moved: HashSet<&Key> = moved.iter().collect();
    let by: Vec<String> = ops.iter().take(3).map(OpId::to_string).collect();
    let decision = Decision {
        verdict: Verdict::Stale { by: by.clone() },
        rules: Vec::new(),
        policy_version: 0,
        explanation: format!(
            "the key changed on the branch after the version this change was made on (by {})",
            by.join(", ")
        ),
        next: "read the key at the branch's head and make the change again".to_owned(),
        spend: Vec::new(),
    };
    let mut kept = Vec::with_capacity(puts.len());
    for (key, value) in std::mem::take(puts) {
        if !moved.contains(&key) {
            kept.push((key, value));
        } else if !same_but_time(&tree::get(&Nodes(log), head, &key)?, &value) {
            let change = match value {
                Some(v) => Change::Put(key, v),
                None => Change::Delete(key),
            };
            refused.push(Refused::of(change, decision.clone()));
        }
    }
    *puts = kept;
    Ok(())
}

/// Whether two values of a key are the same but for when and how they were laid on disk (two
/// trees that wrote the same bytes at different moments agree): their modification times, and
/// whether the filesystem had allocated every block yet (`sparse`, which delayed allocation
/// reports for a file just written).
fn same_but_time(a: &Option<Value>, b: &Option<Value>) -> bool {
    let lasting = |v: &Value| {
        let mut attributes = v.meta.attributes.clone();
        attributes.remove("sparse");
        attributes
    };
    match (a, b) {
        (Some(a), Some(b)) => {
            a.content == b.content
                && a.meta.kind == b.meta.kind
                && a.meta.mode == b.meta.mode
                && a.meta.size == b.meta.size
                && a.meta.symlink_target == b.meta.symlink_target
                && lasting(a) == lasting(b)
        }
        (None, None) => true,
        _ => false,
    }
}

/// The paths of a rebased act that the head's tree would leave without a home, each with the
/// key the branch changed that makes it so: a directory removed, or replaced by something
/// else, while the branch put something under it since the act's base (the key under it); a
/// path put under a directory the branch removed or replaced since (that directory).
fn homeless(log: &dyn LogRead, base: &Ptr, head: &Ptr, puts: &[Put]) -> Result<Vec<(Key, Key)>> {
    let nodes = Nodes(log);
    let moved = |k: &Key| -> Result<bool> {
        Ok(tree::get(&nodes, base, k)? != tree::get(&nodes, head, k)?)
    };
    let deleted: HashSet<&Key> = puts
        .iter()
        .filter(|(_, v)| v.is_none())
        .map(|(k, _)| k)
        .collect();
    let made_dirs: HashSet<&Key> = puts
        .iter()
        .filter(|(_, v)| v.as_ref().is_some_and(|v| v.meta.kind == EntryKind::Dir))
        .map(|(k, _)| k)
        .collect();
    let mut out = Vec::new();
    for (key, value) in puts {
        if key.namespace() != crate::key::Namespace::Fs {
            continue;
        }
        let is_dir = value
            .as_ref()
            .is_some_and(|v| v.meta.kind == EntryKind::Dir);
        if !is_dir {
            // Something the branch holds under it that this act does not remove.
            let under = crate::key::KeyPrefix::new(key.namespace(), key.path().to_vec())?;
            let mut child = None;
            for (k, _) in tree::list(&nodes, head, &under)? {
                if k != *key && !deleted.contains(&k) && moved(&k)? {
                    child = Some(k);
                    break;
                }
            }
            if let Some(child) = child {
                out.push((key.clone(), child));
                continue;
            }
        }
        if value.is_none() {
            continue;
        }
        // Its nearest ancestor that this act does not make must be a directory at the head.
        let mut at = key.parent();
        while let Some(dir) = at {
            if made_dirs.contains(&dir) {
                at = dir.parent();
                continue;
            }
            match tree::get(&nodes, head, &dir)? {
                Some(v) if v.meta.kind == EntryKind::Dir => {}
                // Never recorded (the root of a tree tracked under a prefix) is a home too.
                _ if moved(&dir)? => out.push((key.clone(), dir)),
                _ => {}
            }
            break;
        }
    }
    Ok(out)
}

/// Counts what was added, modified and removed, naming the first keys.
pub(crate) fn summarize(applied: &[Applied]) -> ChangeSummary {
    let mut s = ChangeSummary::default();
    for a in applied {
        if a.key.namespace() == crate::key::Namespace::Fs {
            s.files += 1;
        }
        match (a.before, a.after) {
            (false, true) => s.added += 1,
            (true, false) => s.removed += 1,
            _ => s.modified += 1,
        }
    }
    let mut keys: Vec<&Key> = applied.iter().map(|a| &a.key).collect();
    keys.sort();
    s.keys = keys
        .into_iter()
        .take(ChangeSummary::NAMED)
        .cloned()
        .collect();
    s
}

/// The directories an act puts only as the ancestors of something else it puts (`mkdir -p` for
/// a file written into a new directory): each is decided by what it holds, not on its own, so
/// that one decision (one approval) covers writing `approved/plan.md` and making `approved`.
fn implied_directories(changes: &[Change]) -> BTreeSet<Key> {
    let dirs: BTreeSet<&Key> = changes
        .iter()
        .filter_map(|c| match c {
            Change::Put(k, v) if v.meta.kind == EntryKind::Dir => Some(k),
            _ => None,
        })
        .collect();
    let mut implied = BTreeSet::new();
    if dirs.is_empty() {
        // The common act: no directory put, nothing to walk.
        return implied;
    }
    for c in changes {
        let Change::Put(k, _) = c else { continue };
        let mut parent = k.parent();
        while let Some(p) = parent {
            // An ancestor met before had its own ancestors walked then.
            if p.path().is_empty() || (dirs.contains(&p) && !implied.insert(p.clone())) {
                break;
            }
            parent = p.parent();
        }
    }
    implied
}
