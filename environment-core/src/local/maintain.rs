//! Upkeep: garbage collection of blobs, pins, and the integrity check.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::{Inner, LocalEnvironment, decode_op, op_id_from};
use crate::authz::{Action, ActorId, Resource};
use crate::error::{EnvError, Result};
use crate::hash::Hash;
use crate::op::OpId;
use crate::store::{LogRead, Nodes};
use crate::tree::{self, Node, NodeId, Ptr};
use crate::upkeep::{GcReport, VerifyReport};
use crate::value::Content;

/// A failure of this environment as a port reports it (to the shared blob store's collection).
fn as_port(e: EnvError) -> crate::error::PortError {
    crate::error::PortError::new(
        e.kind(),
        e.to_string(),
        "run verify on this machine; the collection removed nothing it could not read",
    )
}

fn broken(at: String, detail: impl Into<String>) -> EnvError {
    EnvError::Integrity {
        at,
        detail: detail.into(),
    }
}

impl LocalEnvironment {
    /// Deletes the blobs that no operation's view and no pin refers to. Safe against a crash at
    /// any point (it only deletes what nothing refers to, and moves a packed blob by writing its new copy durably before deleting the old) and against concurrent writers in any
    /// process (they wait while it sweeps; it waits for those with blobs not yet committed).
    pub fn gc(&self, actor: &ActorId) -> Result<GcReport> {
        self.authorize(
            actor,
            Action::Delete,
            Resource::Environment,
            None,
            Some("gc"),
        )?;
        let guard = self.inner.blobs.sweep_guard()?;
        let live = self.inner.read_snapshot(|log| self.inner.live_blobs(log))?;
        let swept = self.inner.blobs.sweep(&live, &guard)?;
        let mut report = GcReport {
            kept: swept.kept,
            removed: swept.removed,
            bytes_removed: swept.bytes_removed,
            packs_rewritten: swept.packs_rewritten,
            ..GcReport::default()
        };
        report.temp_removed = self.inner.blobs.clear_temp(&guard)?;
        report.nodes_removed = self.collect_nodes()?;
        // Local writers need not wait for the shared store's collection.
        drop(guard);
        if let Some(shared) = self.inner.blobs.shared() {
            // Read again once the collection has announced itself: what writers commit
            // meanwhile is either in this set or spared by the collection.
            let mut live = || {
                self.inner
                    .read_snapshot(|log| self.inner.live_blobs(log))
                    .map_err(as_port)
            };
            report.shared_removed = shared
                .collect(&mut live)
                .map_err(crate::error::BlobError::Shared)?;
        }
        Ok(report)
    }

    /// Removes the tree nodes no kept version reaches. Runs as one writer job: no commit can
    /// add a reference meanwhile. Nothing to do until retention has dropped something.
    fn collect_nodes(&self) -> Result<u64> {
        self.inner.write(false, move |_, tx| {
            if tx.dropped_seqs()?.is_empty() {
                return Ok(0);
            }
            let mut live: HashSet<NodeId> = HashSet::new();
            let mut roots = Vec::new();
            tx.each_kept_op(&mut |op, root| {
                roots.push(Ptr {
                    hash: op.view,
                    id: root,
                });
                Ok(())
            })?;
            for root in &roots {
                tree::walk_nodes(&Nodes(&*tx), root, &mut |p| live.insert(p.id), &mut |_| {})?;
            }
            let mut dead: HashSet<NodeId> = HashSet::new();
            tx.each_node(&mut |id, _, _| {
                if !live.contains(&id) {
                    dead.insert(id);
                }
                Ok(())
            })?;
            tx.delete_nodes(&dead)?;
            Ok(dead.len() as u64)
        })
    }

    /// Keeps a blob alive for `owner` (a message, an effect result…) even if no view refers to it.
    pub fn pin_blob(&self, hash: &Hash, owner: &str) -> Result<()> {
        self.pin_change(hash, owner, true)
    }

    /// Releases a pin.
    pub fn unpin_blob(&self, hash: &Hash, owner: &str) -> Result<()> {
        self.pin_change(hash, owner, false)
    }

    fn pin_change(&self, hash: &Hash, owner: &str, pinned: bool) -> Result<()> {
        let (h, owner) = (*hash, owner.to_owned());
        // A pinned blob is kept for every machine: shared first, when the store is.
        let window = if pinned {
            self.inner.blobs.share(&[h])?
        } else {
            None
        };
        self.inner.write(false, move |_, tx| {
            if let Some(window) = &window {
                window.check().map_err(crate::error::BlobError::Shared)?;
            }
            tx.pin_blob(&h, &owner, pinned)
        })
    }

    /// Re-hashes every operation and tree node, checks the hash chain, that every view is
    /// complete, that heads and marks name existing operations and that referenced blobs exist.
    /// Returns the first damage found as [`EnvError::Integrity`]. `actor` must be allowed to
    /// read the environment as a whole (the report counts everything in it).
    ///
    /// ```
    /// # use environment_core::{ActorId, LocalEnvironment, Options};
    /// # let dir = tempfile::tempdir().unwrap();
    /// let env = LocalEnvironment::open(dir.path(), Options::default())?;
    /// let report = env.verify(&ActorId::new("human:ann")?)?;
    /// assert_eq!(report.ops, 1); // the first operation
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn verify(&self, actor: &ActorId) -> Result<VerifyReport> {
        self.verify_with(actor, false)
    }

    /// [`LocalEnvironment::verify`], and re-hashes every referenced blob as well.
    pub fn verify_deep(&self, actor: &ActorId) -> Result<VerifyReport> {
        self.verify_with(actor, true)
    }

    fn verify_with(&self, actor: &ActorId, deep: bool) -> Result<VerifyReport> {
        self.authorize(
            actor,
            Action::Read,
            Resource::Environment,
            None,
            Some("verify"),
        )?;
        let mut report = self.inner.read_snapshot(|log| self.inner.verify_in(log))?;
        let blobs = self.inner.read_snapshot(|log| self.inner.live_blobs(log))?;
        let mut not_here = Vec::new();
        for h in &blobs {
            if deep {
                self.inner.blobs.get(h)?;
            } else if !self.inner.blobs.contains(h) {
                not_here.push(*h);
            }
        }
        // What this machine has not cached must be in the store the machines share.
        let missing = match self.inner.blobs.shared() {
            Some(shared) if !not_here.is_empty() => shared
                .missing(&not_here)
                .map_err(crate::error::BlobError::Shared)?,
            _ => not_here,
        };
        if let Some(h) = missing.first() {
            return Err(broken(format!("blob {h}"), "referenced but missing"));
        }
        report.blobs = blobs.len() as u64;
        Ok(report)
    }
}

impl Inner {
    /// Every blob referenced by a view of any operation, or pinned. Runs in one read
    /// transaction so it sees one consistent state.
    fn live_blobs(&self, log: &dyn LogRead) -> Result<HashSet<Hash>> {
        {
            let mut roots = Vec::new();
            log.each_kept_op(&mut |op, root| {
                roots.push(Ptr {
                    hash: op.view,
                    id: root,
                });
                Ok(())
            })?;
            let mut seen = HashSet::new();
            let mut live = HashSet::new();
            let mut manifests = HashSet::new();
            for root in &roots {
                tree::walk_nodes(
                    &Nodes(log),
                    root,
                    &mut |p| seen.insert(p.id),
                    &mut |c| match c {
                        Content::Chunks(m) => {
                            manifests.insert(*m);
                        }
                        Content::Blob(b) => {
                            live.insert(*b);
                        }
                        Content::Inline(_) => {}
                    },
                )?;
            }
            super::refused::held_blobs(log, &mut live, &mut manifests)?;
            // A chunked file keeps its manifest and every chunk it names; a manifest that
            // cannot be read stops the collection (its chunks would be taken for dead).
            for m in manifests {
                live.extend(self.blobs.manifest(&m)?.pieces.iter().map(|p| p.hash));
                live.insert(m);
            }
            live.extend(log.blob_pins()?);
            Ok(live)
        }
    }

    fn verify_in(&self, log: &dyn LogRead) -> Result<VerifyReport> {
        let mut report = VerifyReport::default();
        // Nodes first: every stored node must decode and hash to the hash stored with it.
        let mut hashes: HashMap<NodeId, Hash> = HashMap::new();
        log.each_node(&mut |id, h, data| {
            let at = || format!("node #{id}");
            let name =
                Hash::from_slice(h).ok_or_else(|| broken(at(), "its hash is not 32 bytes"))?;
            let node = Node::decode(data).map_err(|e| broken(at(), e.to_string()))?;
            if node.hash() != name {
                return Err(broken(
                    at(),
                    "its content does not hash to its recorded hash",
                ));
            }
            hashes.insert(id, name);
            report.nodes += 1;
            Ok(())
        })?;
        // Then the log in order: ids, the hash chain, complete views whose every pointer names
        // the content it points to.
        let mut seqs: HashMap<OpId, u64> = HashMap::new();
        // Each branch's last operation in the log, which is its head by definition.
        let mut latest: BTreeMap<String, OpId> = BTreeMap::new();
        let mut walked = HashSet::new();
        let dropped = log.dropped_seqs()?;
        log.each_op(&mut |row| {
            let seq = row.seq;
            let root = row.root;
            let at = format!("operation #{seq}");
            let id = op_id_from(row.id).map_err(|e| broken(at.clone(), e.to_string()))?;
            let op = decode_op(row.record).map_err(|e| broken(at.clone(), e.to_string()))?;
            let at = format!("{at} ({})", id.short());
            if op.id != id || op.seq != seq {
                return Err(broken(at, "the record does not match its row"));
            }
            if !op.is_intact() {
                return Err(broken(
                    at,
                    "the record does not hash to its id: it was altered",
                ));
            }
            for p in &op.parents {
                match seqs.get(p) {
                    Some(ps) if *ps < op.seq => {}
                    _ => {
                        return Err(broken(
                            at,
                            format!("parent {} is missing or not earlier", p.short()),
                        ));
                    }
                }
            }
            if seqs.insert(id, op.seq).is_some() {
                return Err(broken(at, "another operation has the same id"));
            }
            latest.insert(op.branch.clone(), id);
            report.ops += 1;
            if dropped.contains(&seq) {
                // Thinned out: the record is checked, its view is no longer kept.
                return Ok(());
            }
            let mut bad: Option<Ptr> = None;
            let root = Ptr {
                hash: op.view,
                id: root,
            };
            tree::walk_nodes(
                &Nodes(log),
                &root,
                &mut |p| {
                    if hashes.get(&p.id) != Some(&p.hash) {
                        bad.get_or_insert(*p);
                        return false;
                    }
                    walked.insert(p.id)
                },
                &mut |_| {},
            )
            .map_err(|e| broken(at.clone(), format!("its view is incomplete: {e}")))?;
            if let Some(p) = bad {
                return Err(broken(
                    at,
                    format!(
                        "its view points to node #{} for content {} it does not hold",
                        p.id,
                        p.hash.short(12)
                    ),
                ));
            }
            Ok(())
        })?;
        log.check_indexes(&seqs)?;
        // A head is the latest operation recorded on its branch. (The snapshot of heads may
        // name operations the log has moved past, which retention is free to drop.)
        let heads = log.heads()?;
        if heads != latest {
            return Err(broken(
                "the branch heads".into(),
                "they are not the latest operations recorded on their branches",
            ));
        }
        let mut named: Vec<(&str, String, Option<OpId>)> = heads
            .into_iter()
            .map(|(name, op)| ("heads", name, Some(op)))
            .collect();
        let marks = log
            .marks()
            .map_err(|e| broken("the marks".into(), e.to_string()))?;
        named.extend(
            marks
                .into_iter()
                .map(|(name, op)| ("marks", name, Some(op))),
        );
        for (kind, name, op) in named {
            let at = || format!("{kind} {name}");
            match op.and_then(|id| seqs.get(&id).copied()) {
                None => return Err(broken(at(), "names an operation that does not exist")),
                Some(seq) if dropped.contains(&seq) => {
                    return Err(broken(at(), "names an operation retention dropped"));
                }
                Some(_) => {}
            }
        }
        Ok(report)
    }
}
