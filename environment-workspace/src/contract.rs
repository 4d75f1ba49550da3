//! The contract of every use case: the type of its request, the type of its answer, and the
//! function that answers it, in one table. The dispatcher and the published schemas are both
//! read off that table, so a door cannot accept or answer something the schema does not say.

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use super::error::ServiceError;
use super::methods::Method;
use super::session::Session;
use super::{commands, effects, files, patch, permissions, queue, tournament, versions};

/// The request of one use case: its parameters, the method it is sent as, and the type of its
/// answer. Every door sends the same request; [`Workspace::request`](crate::Workspace::request)
/// answers it in process.
pub trait Request: Serialize + DeserializeOwned + JsonSchema {
    /// The use case it asks for.
    const METHOD: Method;
    /// What the use case answers.
    type Answer: Serialize + DeserializeOwned + JsonSchema;
}

/// How a request is answered, for the session it came in on.
pub(crate) trait Handle: Request {
    fn handle(self, g: &Session<'_>) -> Result<Self::Answer, ServiceError>;
}

/// Something done with the request type of a method, whichever it is.
pub(crate) trait Visit {
    type Out;
    fn visit<R: Handle>(self) -> Self::Out;
}

/// The table: each method, its request and answer types, and the function that answers it.
/// It generates the two traits' implementations and [`visit`].
macro_rules! use_cases {
    ($($method:ident: $req:ty => $answer:ty = $f:path;)*) => {
        $(
            impl Request for $req {
                const METHOD: Method = Method::$method;
                type Answer = $answer;
            }
            impl Handle for $req {
                fn handle(self, g: &Session<'_>) -> Result<$answer, ServiceError> {
                    $f(g, self)
                }
            }
        )*

        /// Does `v` with the request type of `m`.
        pub(crate) fn visit<V: Visit>(m: Method, v: V) -> V::Out {
            match m {
                $(Method::$method => v.visit::<$req>(),)*
            }
        }
    };
}

use_cases! {
    History: versions::HistoryParams => versions::History = versions::history;
    Refused: versions::RefusedParams => versions::RefusedList = versions::refused;
    Show: versions::ShowParams => versions::Shown = versions::show;
    Diff: versions::DiffParams => versions::Diff = versions::diff;
    Mark: versions::MarkParams => versions::Marked = versions::mark;
    Marks: versions::MarksParams => versions::Marks = versions::marks;
    BranchList: versions::BranchListParams => versions::Branches = versions::branches;
    BranchCreate: versions::BranchParams => versions::BranchCreated = versions::branch_create;
    Restore: versions::RestoreParams => versions::Restored = versions::restore;
    Undo: versions::UndoParams => versions::Restored = versions::undo;
    Redo: versions::RedoParams => versions::Restored = versions::redo;
    Merge: versions::MergeParams => versions::Merged = versions::merge;
    Status: versions::StatusParams => versions::Status = versions::status;
    FileRead: files::ReadParams => files::FileRead = files::read;
    FileList: files::ListParams => files::FileList = files::list;
    FileDiff: patch::FileDiffParams => patch::FileDiff = patch::file_diff;
    FileWrite: files::WriteParams => files::Edited = files::write;
    FileDelete: files::DeleteParams => files::Edited = files::delete;
    QueuePublish: queue::PublishParams => queue::Published = queue::publish;
    QueueClaim: queue::ClaimParams => queue::Claimed = queue::claim;
    QueueAck: queue::AckParams => queue::Settled = queue::ack;
    QueueNack: queue::NackParams => queue::Settled = queue::nack;
    QueueExtend: queue::ExtendParams => queue::Extended = queue::extend;
    QueueSubscribe: queue::SubscribeParams => queue::Subscribed = queue::subscribe;
    QueueDead: queue::DeadParams => queue::DeadLetters = queue::dead_letters;
    QueueRedrive: queue::RedriveParams => queue::Redriven = queue::redrive;
    QueueStats: queue::StatsParams => queue::Stats = queue::stats;
    QueueLeases: queue::LeasesParams => queue::Leases = queue::leases;
    PolicyExplain: permissions::ExplainParams => permissions::Explained = permissions::explain;
    PolicyWhatMayIDo: permissions::WhatMayParams => permissions::Permissions = permissions::what_may;
    PolicyLoad: permissions::LoadParams => permissions::PolicyChanged = permissions::load;
    PolicyMember: permissions::MemberParams => permissions::Membership = permissions::member;
    ApprovalList: permissions::ApprovalListParams => permissions::Approvals = permissions::approval_list;
    ApprovalRequest: permissions::ApprovalParams => permissions::Approval = permissions::approval_request;
    ApprovalStatus: permissions::ApprovalStatusParams => permissions::Approval = permissions::approval_status;
    ApprovalGrant: permissions::GrantParams => permissions::Approval = permissions::approval_grant;
    ApprovalReject: permissions::RejectParams => permissions::Approval = permissions::approval_reject;
    EffectList: effects::ListParams => effects::Effects = effects::list;
    EffectBegin: effects::BeginParams => effects::Begun = effects::begin;
    EffectComplete: effects::CompleteParams => effects::Settled = effects::complete;
    EffectFail: effects::FailParams => effects::Settled = effects::fail;
    Verify: versions::VerifyParams => versions::Verified = versions::verify;
    Gc: versions::GcParams => versions::Collected = versions::gc;
    Tournament: tournament::TournamentParams => tournament::Outcome = tournament::run;
    Exec: commands::ExecParams => commands::Executed = commands::exec;
    ProcessSpawn: commands::SpawnParams => commands::Started = commands::spawn;
    ProcessRead: commands::ProcessReadParams => commands::Chunk = commands::process_read;
    ProcessWait: commands::ProcessWaitParams => commands::Waited = commands::process_wait;
    ProcessSignal: commands::ProcessSignalParams => commands::Signalled = commands::process_signal;
    ProcessList: commands::ProcessListParams => commands::Processes = commands::process_list;
    PtyOpen: commands::PtyOpenParams => commands::Started = commands::pty_open;
    PtyWrite: commands::PtyWriteParams => commands::PtyWritten = commands::pty_write;
    PtyRead: commands::PtyReadParams => commands::PtyOutput = commands::pty_read;
    PtyResize: commands::PtyResizeParams => commands::PtyResized = commands::pty_resize;
    PtyDetach: commands::PtyDetachParams => commands::PtyDetached = commands::pty_detach;
    PtyAttach: commands::PtyAttachParams => commands::PtyOutput = commands::pty_attach;
    PtyClose: commands::PtyCloseParams => commands::PtyClosed = commands::pty_close;
    PtyList: commands::PtyListParams => commands::PtySessions = commands::pty_list;
}

/// Parses `params` as the request of `m`, answers it, and puts the answer in JSON.
pub(crate) fn answer(
    g: &Session<'_>,
    m: Method,
    params: Map<String, Value>,
) -> Result<Value, ServiceError> {
    struct Answer<'s, 'w>(&'s Session<'w>, Map<String, Value>);
    impl Visit for Answer<'_, '_> {
        type Out = Result<Value, ServiceError>;
        fn visit<R: Handle>(self) -> Self::Out {
            let request: R =
                serde_json::from_value(Value::Object(self.1)).map_err(ServiceError::invalid)?;
            let answer = request.handle(self.0)?;
            serde_json::to_value(answer)
                .map_err(|e| ServiceError::internal(format!("an answer failed to serialize: {e}")))
        }
    }
    visit(m, Answer(g, params))
}

/// What a method takes and answers, as JSON Schemas (draft 2020-12, every subschema inline).
#[derive(Clone, Debug, PartialEq)]
pub struct Contract {
    /// What the use case does (its request type's description).
    pub summary: String,
    /// Its parameters: an object schema that refuses unknown properties, the credentials any
    /// request may present (`token`, `approval`) among them.
    pub params: Value,
    /// Its answer: an object schema.
    pub result: Value,
}

impl Method {
    /// What the method takes and answers, generated from the types its use case is written in.
    ///
    /// ```
    /// use environment_workspace::Method;
    ///
    /// let c = Method::FileWrite.contract();
    /// assert_eq!(c.params["additionalProperties"], false);
    /// assert!(c.params["properties"]["path"].is_object());
    /// assert!(c.result["properties"]["version"].is_object());
    /// ```
    pub fn contract(self) -> Contract {
        struct Describe;
        impl Visit for Describe {
            type Out = Contract;
            fn visit<R: Handle>(self) -> Contract {
                let settings = SchemaSettings::draft2020_12().with(|s| s.inline_subschemas = true);
                let mut params = settings
                    .clone()
                    .into_generator()
                    .into_root_schema_for::<R>();
                let result = settings
                    .for_serialize()
                    .into_generator()
                    .into_root_schema_for::<R::Answer>();
                let summary = params
                    .remove("description")
                    .and_then(|d| d.as_str().map(str::to_owned))
                    .unwrap_or_default();
                Contract {
                    summary,
                    params: with_credentials(params),
                    result: result.to_value(),
                }
            }
        }
        visit(self, Describe)
    }
}

/// The params schema with the credentials every request may present.
fn with_credentials(schema: Schema) -> Value {
    let mut v = schema.to_value();
    if let Some(o) = v.as_object_mut() {
        o.remove("$schema");
        o.remove("title");
        let props = o
            .entry("properties")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Some(props) = props.as_object_mut() {
            props.insert(
                "token".into(),
                json!({
                    "type": ["string", "null"],
                    "description": "A capability token to present with this request: it can only narrow what the actor may do. Default: the one the door was opened with.",
                }),
            );
            props.insert(
                "approval".into(),
                json!({
                    "type": ["string", "null"],
                    "description": "The id of a granted approval to present with this request (see approval.request, and a denied error's data.approval).",
                }),
            );
        }
        o.insert("additionalProperties".into(), Value::Bool(false));
    }
    v
}
