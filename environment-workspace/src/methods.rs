//! The use cases of the workspace service: each method's parameters, the access request it is
//! authorized as, and what it does. Every door calls them by name (the control socket puts
//! them on the wire under the same names).
//!
//! Every request is authorized through the `Authorizer` port as the connection's actor (with the
//! request's capability token, or the one the agent was given) *before* anything happens; a
//! refusal changes nothing. The mapping onto access requests follows core's own (so a rule
//! written for core's checks also governs every door):
//!
//! | method | action | resource | `operation` |
//! |---|---|---|---|
//! | `history`, `status` | read | branch | method name |
//! | `show` | read | the op's branch | `show` |
//! | `diff` | read | the `fs` prefix, or the environment | — |
//! | `mark` | write | environment | `mark` |
//! | `marks`, `branch.list` | read | environment | method name |
//! | `branch.create` | write | the new branch | `branch` |
//! | `restore`, `undo` | write | branch | `restore` |
//! | `restore` with `dry_run` | read | branch | `restore` |
//! | `exec`, `process.spawn`, `pty.open` | execute | program + args | `exec`, `spawn`, `pty` |
//! | `process.read`, `.wait`, `.list`; `pty.read`, `.attach`, `.list` | read | environment | method name |
//! | `process.signal`; `pty.write`, `.resize`, `.detach`, `.close` | write | environment | method name |
//! | `queue.publish` | publish | topic | — |
//! | `queue.claim`, `.ack`, `.nack`, `.extend`, `.dead`, `.redrive` | consume | topic named as the consumer group | — |
//! | `queue.subscribe` | consume | each topic, and the group | — |
//! | `queue.stats` | read | environment | `queue.stats` |
//! | `queue.leases` | consume the group named; read of the environment (`queue.leases`) for every group's | | |
//! | `policy.explain`, `policy.what_may_i_do` | read | environment | method name; `policy.inspect` about another actor |
//! | `policy.load`, `policy.member` | write | environment | method name |
//! | `approval.list` | read | environment | `approval.list` |
//! | `approval.request` | — (allowed when the policy holds the request for approval) | | |
//! | `approval.status` | read | environment | `approval.status` |
//! | `approval.grant`, `approval.reject` | — (the policy: an approver the request names) | | |
//! | `effect.list` | read | environment | `effects` |
//! | `effect.begin`, `.complete`, `.fail` | execute | the effect's target (a service) | `effect` |
//! | `verify` | read | environment | — |
//! | `tournament` | execute | each candidate's and the test's program | `tournament` |
//! | `file.read`, `file.list` | read | the key, the prefix | `read`, `list` |
//! | `file.diff` | read | the key | `read` |
//! | `file.write`, `file.delete` | write, delete | the key | `write`, `delete` |
//! | `gc` | delete | environment | `gc` |
//!
//! Every method also takes `token` (a capability token) and `approval` (the id of a granted
//! approval), which go into the request's context. Core re-checks the operations it performs
//! itself (history, mark, restore, gc…) as the same actor without them: an approval or a token
//! can narrow those, not widen them past the actor's own rules.

use environment_core::Cancel;
use serde_json::{Map, Value};

use super::contract::{self, Request};
use super::error::ServiceError;
use super::session::Session;
use super::workspace::{Caller, Counters, Workspace};

/// The use cases, under the names every door calls them by (the control socket's schema lists
/// them in this order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Method {
    /// The branch's history, key nodes first.
    History,
    /// The changes refused on the branch, newest first.
    Refused,
    /// One operation's record.
    Show,
    /// What changed between two versions.
    Diff,
    /// Names a version.
    Mark,
    /// Lists the marks.
    Marks,
    /// Lists the branches.
    BranchList,
    /// Creates a branch at a version.
    BranchCreate,
    /// Restores the workspace to a version (self-rollback); `dry_run` previews.
    Restore,
    /// Undoes the last operation not undone yet (sequential, see `LocalEnvironment::undo_step`).
    Undo,
    /// Redoes the last undo not redone yet.
    Redo,
    /// Merges a branch into the workspace's branch and writes the result into the tree.
    Merge,
    /// The workspace's state: the branch, its head, the sandbox, the running agent.
    Status,
    /// Reads a workspace file (at the head, or at a version).
    FileRead,
    /// Lists workspace files (at the head, or at a version).
    FileList,
    /// How a workspace file changed between two versions, line by line.
    FileDiff,
    /// Writes a whole workspace file, recorded as one operation.
    FileWrite,
    /// Deletes a workspace file or symlink, recorded as one operation.
    FileDelete,
    /// Publishes a message to a queue topic.
    QueuePublish,
    /// Leases messages of a consumer group.
    QueueClaim,
    /// Acknowledges a lease.
    QueueAck,
    /// Gives a lease back for a later retry.
    QueueNack,
    /// Extends a lease the caller holds.
    QueueExtend,
    /// Subscribes a consumer group to topics.
    QueueSubscribe,
    /// A consumer group's dead letters.
    QueueDead,
    /// Sends a group's dead letters back to the queue.
    QueueRedrive,
    /// Depth, leases and dead letters per topic and group.
    QueueStats,
    /// The leases in flight: who holds which message, until when.
    QueueLeases,
    /// Explains the policy's decision on a request.
    PolicyExplain,
    /// Lists what the caller (or, as a read of the policy, another actor) may do under a
    /// resource.
    PolicyWhatMayIDo,
    /// Replaces the policy's rules (administration: a write of the environment).
    PolicyLoad,
    /// Adds an actor to a group of the policy (administration).
    PolicyMember,
    /// Files an approval request for an action that needs one.
    ApprovalRequest,
    /// Where one of the caller's approval requests stands.
    ApprovalStatus,
    /// Grants a pending approval request the caller may decide.
    ApprovalGrant,
    /// Rejects a pending approval request the caller may decide.
    ApprovalReject,
    /// Every approval request, pending and decided.
    ApprovalList,
    /// The effect log (or its unsettled effects).
    EffectList,
    /// Begins an effect on the world outside under an idempotency key.
    EffectBegin,
    /// Records an effect's result.
    EffectComplete,
    /// Records that an effect failed without taking effect.
    EffectFail,
    /// Checks the stores' integrity.
    Verify,
    /// Deletes unreferenced blobs (normally refused to agents).
    Gc,
    /// Runs candidate commands in forks, judges them by a test, adopts the winner.
    Tournament,
    /// Runs a command to its end as a recorded operation.
    Exec,
    /// Starts a background process.
    ProcessSpawn,
    /// Reads a background process's output from an offset.
    ProcessRead,
    /// Waits (bounded) for a background process to end.
    ProcessWait,
    /// Signals a background process and everything it started.
    ProcessSignal,
    /// Lists the background processes.
    ProcessList,
    /// Opens a terminal session.
    PtyOpen,
    /// Types into a terminal session.
    PtyWrite,
    /// Reads a terminal session's output since the last read.
    PtyRead,
    /// Resizes a terminal session.
    PtyResize,
    /// Detaches from a terminal session (it keeps running).
    PtyDetach,
    /// Re-attaches to a terminal session, with the output since the last read.
    PtyAttach,
    /// Closes a terminal session.
    PtyClose,
    /// Lists the terminal sessions.
    PtyList,
}

impl Method {
    /// Every method, in schema order.
    pub const ALL: &'static [Method] = &[
        Method::History,
        Method::Refused,
        Method::Show,
        Method::Diff,
        Method::Mark,
        Method::Marks,
        Method::BranchList,
        Method::BranchCreate,
        Method::Restore,
        Method::Undo,
        Method::Redo,
        Method::Merge,
        Method::Status,
        Method::FileRead,
        Method::FileList,
        Method::FileDiff,
        Method::FileWrite,
        Method::FileDelete,
        Method::QueuePublish,
        Method::QueueClaim,
        Method::QueueAck,
        Method::QueueNack,
        Method::QueueExtend,
        Method::QueueSubscribe,
        Method::QueueDead,
        Method::QueueRedrive,
        Method::QueueStats,
        Method::QueueLeases,
        Method::PolicyExplain,
        Method::PolicyWhatMayIDo,
        Method::PolicyLoad,
        Method::PolicyMember,
        Method::ApprovalRequest,
        Method::ApprovalStatus,
        Method::ApprovalGrant,
        Method::ApprovalReject,
        Method::ApprovalList,
        Method::EffectList,
        Method::EffectBegin,
        Method::EffectComplete,
        Method::EffectFail,
        Method::Verify,
        Method::Gc,
        Method::Tournament,
        Method::Exec,
        Method::ProcessSpawn,
        Method::ProcessRead,
        Method::ProcessWait,
        Method::ProcessSignal,
        Method::ProcessList,
        Method::PtyOpen,
        Method::PtyWrite,
        Method::PtyRead,
        Method::PtyResize,
        Method::PtyDetach,
        Method::PtyAttach,
        Method::PtyClose,
        Method::PtyList,
    ];

    /// The method's name on the wire.
    pub fn name(self) -> &'static str {
        match self {
            Method::History => "history",
            Method::Refused => "refused",
            Method::Show => "show",
            Method::Diff => "diff",
            Method::Mark => "mark",
            Method::Marks => "marks",
            Method::BranchList => "branch.list",
            Method::BranchCreate => "branch.create",
            Method::Restore => "restore",
            Method::Undo => "undo",
            Method::Redo => "redo",
            Method::Merge => "merge",
            Method::Status => "status",
            Method::FileRead => "file.read",
            Method::FileList => "file.list",
            Method::FileDiff => "file.diff",
            Method::FileWrite => "file.write",
            Method::FileDelete => "file.delete",
            Method::QueuePublish => "queue.publish",
            Method::QueueClaim => "queue.claim",
            Method::QueueAck => "queue.ack",
            Method::QueueNack => "queue.nack",
            Method::QueueExtend => "queue.extend",
            Method::QueueSubscribe => "queue.subscribe",
            Method::QueueDead => "queue.dead",
            Method::QueueRedrive => "queue.redrive",
            Method::QueueStats => "queue.stats",
            Method::QueueLeases => "queue.leases",
            Method::PolicyExplain => "policy.explain",
            Method::PolicyWhatMayIDo => "policy.what_may_i_do",
            Method::ApprovalRequest => "approval.request",
            Method::ApprovalStatus => "approval.status",
            Method::ApprovalGrant => "approval.grant",
            Method::PolicyLoad => "policy.load",
            Method::PolicyMember => "policy.member",
            Method::ApprovalList => "approval.list",
            Method::ApprovalReject => "approval.reject",
            Method::EffectList => "effect.list",
            Method::EffectBegin => "effect.begin",
            Method::EffectComplete => "effect.complete",
            Method::EffectFail => "effect.fail",
            Method::Verify => "verify",
            Method::Gc => "gc",
            Method::Tournament => "tournament",
            Method::Exec => "exec",
            Method::ProcessSpawn => "process.spawn",
            Method::ProcessRead => "process.read",
            Method::ProcessWait => "process.wait",
            Method::ProcessSignal => "process.signal",
            Method::ProcessList => "process.list",
            Method::PtyOpen => "pty.open",
            Method::PtyWrite => "pty.write",
            Method::PtyRead => "pty.read",
            Method::PtyResize => "pty.resize",
            Method::PtyDetach => "pty.detach",
            Method::PtyAttach => "pty.attach",
            Method::PtyClose => "pty.close",
            Method::PtyList => "pty.list",
        }
    }

    /// The method with this wire name.
    pub fn from_name(name: &str) -> Option<Method> {
        Method::ALL.iter().copied().find(|m| m.name() == name)
    }
}

impl Workspace {
    /// Runs one use case for the workspace's actor: its parameters (named, unknown ones
    /// refused), its authorization, then the work. `token` and `approval` among `params` are
    /// presented with the request; without a token, the workspace's default one is.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use environment_core::{ActorId, AllowAll, ErrorKind, LocalEnvironment, MAIN, Options};
    /// use environment_sandbox::{Tracker, TrackerConfig, Unconfined};
    /// use environment_workspace::{Method, Setup, ShellHandles, Trees, Workspace};
    /// use serde_json::json;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let (tree, home) = (tempfile::tempdir()?, tempfile::tempdir()?);
    /// let env = LocalEnvironment::open(home.path(), Options::default())?;
    /// let watcher = ActorId::new("service:watcher")?;
    /// let tracker = Tracker::open(env.clone(), TrackerConfig::new(tree.path(), watcher))?;
    /// let setup = Setup {
    ///     env,
    ///     authorizer: Arc::new(AllowAll),
    ///     policy: None,
    ///     bus: None,
    ///     launcher: Some(Arc::new(Unconfined::new(tree.path()))),
    ///     actor: ActorId::new("agent:coder")?,
    ///     default_token: None,
    ///     branch: MAIN.to_owned(),
    ///     capture_each_call: true,
    ///     forking: None,
    /// };
    /// let trees = Trees {
    ///     tracker: Arc::new(tracker),
    ///     extra: Vec::new(),
    ///     shell: ShellHandles::default(),
    /// };
    /// let workspace = Workspace::new(setup, trees);
    /// let args = |v: serde_json::Value| v.as_object().cloned().unwrap_or_default();
    ///
    /// workspace.call(Method::FileWrite, args(json!({ "path": "notes.md", "content": "hi\n" })))?;
    /// assert_eq!(std::fs::read_to_string(tree.path().join("notes.md"))?, "hi\n");
    ///
    /// // An argument the use case does not take is refused, and nothing happens.
    /// let dry = workspace.call(Method::Undo, args(json!({ "dryRun": true })));
    /// assert_eq!(dry.unwrap_err().kind(), ErrorKind::Invalid);
    /// assert!(tree.path().join("notes.md").exists());
    /// # Ok(()) }
    /// ```
    pub fn call(&self, m: Method, params: Map<String, Value>) -> Result<Value, ServiceError> {
        self.call_cancellable(m, params, &Cancel::new())
    }

    /// [`Workspace::call`], with `cancel` able to call the request off while it runs: a command
    /// (`exec`) is then killed with everything it started, and recorded as cancelled with what
    /// it changed until then. The other use cases are short and run to their end.
    pub fn call_cancellable(
        &self,
        m: Method,
        params: Map<String, Value>,
        cancel: &Cancel,
    ) -> Result<Value, ServiceError> {
        call(self, &self.caller(), m, params, cancel)
    }

    /// [`Workspace::call_cancellable`] for `caller`, the identity a door bound when it opened
    /// (a connection of the control socket opened for an operator, say) rather than the
    /// workspace's own.
    pub fn call_as(
        &self,
        caller: &Caller,
        m: Method,
        params: Map<String, Value>,
        cancel: &Cancel,
    ) -> Result<Value, ServiceError> {
        call(self, caller, m, params, cancel)
    }

    /// Answers a typed request, as [`Workspace::call`] answers its method: the same parsing,
    /// authorization and work, the answer typed.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use environment_core::{ActorId, AllowAll, LocalEnvironment, MAIN, Options};
    /// # use environment_sandbox::{Tracker, TrackerConfig};
    /// # use environment_workspace::{Setup, ShellHandles, Trees, Workspace};
    /// use environment_workspace::files::{ReadParams, WriteParams};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let (tree, home) = (tempfile::tempdir()?, tempfile::tempdir()?);
    /// # let env = LocalEnvironment::open(home.path(), Options::default())?;
    /// # let tracker = Tracker::open(env.clone(), TrackerConfig::new(tree.path(), ActorId::new("service:watcher")?))?;
    /// # let workspace = Workspace::new(
    /// #     Setup {
    /// #         env, authorizer: Arc::new(AllowAll), policy: None, bus: None, launcher: None,
    /// #         actor: ActorId::new("agent:coder")?, default_token: None, branch: MAIN.to_owned(),
    /// #         capture_each_call: true, forking: None,
    /// #     },
    /// #     Trees { tracker: Arc::new(tracker), extra: Vec::new(), shell: ShellHandles::default() },
    /// # );
    /// let written = workspace.request(WriteParams {
    ///     path: "notes.md".into(),
    ///     content: "hi\n".into(),
    ///     intent: None,
    /// })?;
    /// let read = workspace.request(ReadParams { path: "notes.md".into(), version: Some(written.version) })?;
    /// assert_eq!(read.content.text.as_deref(), Some("hi\n"));
    /// # Ok(()) }
    /// ```
    pub fn request<R: Request>(&self, request: R) -> Result<R::Answer, ServiceError> {
        let params = match serde_json::to_value(request) {
            Ok(Value::Object(params)) => params,
            Ok(other) => {
                return Err(ServiceError::internal(format!(
                    "a request is not an object: {other}"
                )));
            }
            Err(e) => {
                return Err(ServiceError::internal(format!(
                    "a request failed to serialize: {e}"
                )));
            }
        };
        let answer = self.call(R::METHOD, params)?;
        serde_json::from_value(answer).map_err(|e| {
            ServiceError::internal(format!("an answer does not read as its type: {e}"))
        })
    }
}

fn call(
    shared: &Workspace,
    caller: &Caller,
    m: Method,
    mut params: Map<String, Value>,
    cancel: &Cancel,
) -> Result<Value, ServiceError> {
    Counters::bump(&shared.counters.requests);
    if caller.actor == environment_core::witness() {
        // It records what it finds in the trees; whoever acts through a door is someone else.
        return Err(ServiceError::new(
            environment_core::ErrorKind::Denied,
            format!(
                "{} records the changes found in the trees; it does not act through a door",
                caller.actor
            ),
            "act as yourself: an agent, a human or a service of your own.",
        ));
    }
    let token = match params.remove("token") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => Some(t),
        Some(_) => return Err(ServiceError::invalid("`token` must be a string")),
    };
    let approval = match params.remove("approval") {
        None | Some(Value::Null) => None,
        Some(Value::String(a)) => Some(a),
        Some(_) => return Err(ServiceError::invalid("`approval` must be a string")),
    };
    let session = Session::new(shared, caller, token, approval, cancel.clone());
    if shared.capture_each_call {
        session.capture_first(&format!("changes found before a {} call", m.name()))?;
    }
    contract::answer(&session, m, params)
}
