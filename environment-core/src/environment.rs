//! The `Environment` trait: what agent frameworks hold as `Arc<dyn Environment>`.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::authz::ActorId;
use crate::error::{EnvError, Result};
use crate::key::{Key, KeyPrefix};
use crate::local::{
    ActRequest, BeginOutcome, EffectRecord, HistoryEntry, HistoryOptions, LocalEnvironment,
    MergeOutcome, Observation, VerifyReport,
};
use crate::op::{Intent, OpId};
use crate::tree::KeyChange;
use crate::value::Value;

/// An optional capability an implementation may offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Capability {
    /// Automatic capture of a live directory tree, and restore into it.
    Snapshots,
    /// Stateless command execution.
    ShellExec,
    /// Background processes.
    BackgroundProcesses,
    /// Durable terminal sessions.
    Pty,
    /// A coordination queue.
    Queue,
}

impl Capability {
    /// The capability's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Capability::Snapshots => "snapshots",
            Capability::ShellExec => "shell exec",
            Capability::BackgroundProcesses => "background processes",
            Capability::Pty => "pty sessions",
            Capability::Queue => "a queue",
        }
    }
}

/// Which optional capabilities an implementation offers. Everything not listed is unsupported,
/// and asking for it returns [`EnvError::Unsupported`], so an adapter can degrade cleanly.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// The capabilities offered.
    pub offered: Vec<Capability>,
}

impl Capabilities {
    /// Whether `c` is offered.
    pub fn has(&self, c: Capability) -> bool {
        self.offered.contains(&c)
    }

    /// `Ok` if `c` is offered, [`EnvError::Unsupported`] otherwise.
    pub fn require(&self, c: Capability) -> Result<()> {
        if self.has(c) {
            Ok(())
        } else {
            Err(EnvError::Unsupported(c.as_str()))
        }
    }
}

/// An environment: versioned state, its operation log and effect log, seen by actors.
/// Every method is one action of one actor; an error means nothing happened.
#[async_trait]
pub trait Environment: Send + Sync {
    /// The optional capabilities this implementation offers.
    fn capabilities(&self) -> Capabilities;
    /// The head of a branch.
    async fn head(&self, branch: &str) -> Result<OpId>;
    /// Resolves a version spec (id or prefix, mark, branch, `~N`).
    async fn resolve(&self, spec: &str) -> Result<OpId>;
    /// Changes state: authorize, apply, record, announce; one transaction.
    async fn act(&self, request: ActRequest) -> Result<Observation>;
    /// The value at a key in a version.
    async fn read(&self, actor: &ActorId, key: &Key, version: &OpId) -> Result<Option<Value>>;
    /// The bytes of a value.
    async fn content(&self, value: &Value) -> Result<Vec<u8>>;
    /// The keys under a prefix in a version.
    async fn list(
        &self,
        actor: &ActorId,
        prefix: &KeyPrefix,
        version: &OpId,
    ) -> Result<Vec<(Key, Value)>>;
    /// What changed between two versions.
    async fn diff(
        &self,
        actor: &ActorId,
        from: &OpId,
        to: &OpId,
        prefix: Option<&KeyPrefix>,
    ) -> Result<Vec<KeyChange>>;
    /// A branch's history for an agent's context.
    async fn history(
        &self,
        actor: &ActorId,
        branch: &str,
        options: &HistoryOptions,
    ) -> Result<Vec<HistoryEntry>>;
    /// Creates a branch at a version.
    async fn create_branch(&self, actor: &ActorId, name: &str, from: &OpId) -> Result<OpId>;
    /// Merges one branch into another.
    async fn merge(
        &self,
        actor: &ActorId,
        source: &str,
        target: &str,
        intent: Intent,
    ) -> Result<MergeOutcome>;
    /// Brings a branch back to an earlier version (appending an operation).
    async fn restore(
        &self,
        actor: &ActorId,
        branch: &str,
        target: &OpId,
        intent: Intent,
    ) -> Result<OpId>;
    /// Undoes a branch's last operation (appending an operation).
    async fn undo(&self, actor: &ActorId, branch: &str) -> Result<OpId>;
    /// Names a version.
    async fn mark(&self, actor: &ActorId, name: &str, version: &OpId) -> Result<()>;
    /// Records that an external effect is about to happen, unless its key was seen.
    async fn effect_begin(
        &self,
        actor: &ActorId,
        key: &str,
        target: &str,
        request: &[u8],
    ) -> Result<BeginOutcome>;
    /// Records an effect's result, as `actor` (authorized as its beginning was).
    async fn effect_complete(
        &self,
        actor: &ActorId,
        id: u64,
        result: &[u8],
    ) -> Result<EffectRecord>;
    /// Records an effect's failure (it did not take effect), as `actor`.
    async fn effect_fail(&self, actor: &ActorId, id: u64, error: &str) -> Result<EffectRecord>;
    /// Effects in flight or of unknown outcome.
    async fn effects_unfinished(&self) -> Result<Vec<EffectRecord>>;
    /// Checks the stores' integrity, as `actor` (a read of the whole environment).
    async fn verify(&self, actor: &ActorId) -> Result<VerifyReport>;
}

impl LocalEnvironment {
    /// Runs blocking work on the blocking pool, so no async worker waits on SQLite or files.
    async fn blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce(LocalEnvironment) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || f(this))
            .await
            .map_err(|_| EnvError::Closed)?
    }
}

#[async_trait]
impl Environment for LocalEnvironment {
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    async fn head(&self, branch: &str) -> Result<OpId> {
        let b = branch.to_owned();
        self.blocking(move |e| e.head(&b)).await
    }

    async fn resolve(&self, spec: &str) -> Result<OpId> {
        let s = spec.to_owned();
        self.blocking(move |e| e.resolve(&s)).await
    }

    async fn act(&self, request: ActRequest) -> Result<Observation> {
        self.act_async(request).await
    }

    async fn read(&self, actor: &ActorId, key: &Key, version: &OpId) -> Result<Option<Value>> {
        let (a, k, v) = (actor.clone(), key.clone(), *version);
        self.blocking(move |e| e.read(&a, &k, &v)).await
    }

    async fn content(&self, value: &Value) -> Result<Vec<u8>> {
        let v = value.clone();
        self.blocking(move |e| e.content(&v)).await
    }

    async fn list(
        &self,
        actor: &ActorId,
        prefix: &KeyPrefix,
        version: &OpId,
    ) -> Result<Vec<(Key, Value)>> {
        let (a, p, v) = (actor.clone(), prefix.clone(), *version);
        self.blocking(move |e| e.list(&a, &p, &v)).await
    }

    async fn diff(
        &self,
        actor: &ActorId,
        from: &OpId,
        to: &OpId,
        prefix: Option<&KeyPrefix>,
    ) -> Result<Vec<KeyChange>> {
        let (a, f, t, p) = (actor.clone(), *from, *to, prefix.cloned());
        self.blocking(move |e| e.diff(&a, &f, &t, p.as_ref())).await
    }

    async fn history(
        &self,
        actor: &ActorId,
        branch: &str,
        options: &HistoryOptions,
    ) -> Result<Vec<HistoryEntry>> {
        let (a, b, o) = (actor.clone(), branch.to_owned(), options.clone());
        self.blocking(move |e| e.history(&a, &b, &o)).await
    }

    async fn create_branch(&self, actor: &ActorId, name: &str, from: &OpId) -> Result<OpId> {
        let (a, n, f) = (actor.clone(), name.to_owned(), *from);
        self.blocking(move |e| e.create_branch(&a, &n, &f)).await
    }

    async fn merge(
        &self,
        actor: &ActorId,
        source: &str,
        target: &str,
        intent: Intent,
    ) -> Result<MergeOutcome> {
        let (a, s, t) = (actor.clone(), source.to_owned(), target.to_owned());
        self.blocking(move |e| e.merge(&a, &s, &t, intent)).await
    }

    async fn restore(
        &self,
        actor: &ActorId,
        branch: &str,
        target: &OpId,
        intent: Intent,
    ) -> Result<OpId> {
        let (a, b, t) = (actor.clone(), branch.to_owned(), *target);
        self.blocking(move |e| e.restore(&a, &b, &t, intent)).await
    }

    async fn undo(&self, actor: &ActorId, branch: &str) -> Result<OpId> {
        let (a, b) = (actor.clone(), branch.to_owned());
        self.blocking(move |e| e.undo(&a, &b)).await
    }

    async fn mark(&self, actor: &ActorId, name: &str, version: &OpId) -> Result<()> {
        let (a, n, v) = (actor.clone(), name.to_owned(), *version);
        self.blocking(move |e| e.mark(&a, &n, &v)).await
    }

    async fn effect_begin(
        &self,
        actor: &ActorId,
        key: &str,
        target: &str,
        request: &[u8],
    ) -> Result<BeginOutcome> {
        let (a, k, t, r) = (
            actor.clone(),
            key.to_owned(),
            target.to_owned(),
            request.to_vec(),
        );
        self.blocking(move |e| e.effect_begin(&a, &k, &t, &r)).await
    }

    async fn effect_complete(
        &self,
        actor: &ActorId,
        id: u64,
        result: &[u8],
    ) -> Result<EffectRecord> {
        let (a, r) = (actor.clone(), result.to_vec());
        self.blocking(move |e| e.effect_complete(&a, id, &r)).await
    }

    async fn effect_fail(&self, actor: &ActorId, id: u64, error: &str) -> Result<EffectRecord> {
        let (a, m) = (actor.clone(), error.to_owned());
        self.blocking(move |e| e.effect_fail(&a, id, &m)).await
    }

    async fn effects_unfinished(&self) -> Result<Vec<EffectRecord>> {
        self.blocking(|e| e.effects_unfinished()).await
    }

    async fn verify(&self, actor: &ActorId) -> Result<VerifyReport> {
        let actor = actor.clone();
        self.blocking(move |e| e.verify(&actor)).await
    }
}
