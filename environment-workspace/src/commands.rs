//! The shell's use cases: recorded commands (`exec`), background processes
//! (`process.*`) and terminal sessions (`pty.*`), each calling the shell capability the
//! workspace was given. The caller never names the actor a command runs as: it is the
//! workspace's.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use base64::Engine as _;
use environment_core::{
    Action, CommandSpec, ExecRequest, Exit, ProcessId, ProcessInfo, PtyRequest, Resource,
    SecretRef, SessionId, SessionInfo, Signal, SpawnRequest, StoredOutput, json,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::error::ServiceError;
use super::session::Session;
use super::versions::no_params;

/// Runs a shell future to its end: on the caller's runtime when it is called from one's
/// blocking pool (the control socket's handlers), else on a runtime of its own for this call (a
/// caller in process). The shell's futures only wait on its blocking pool, and its background
/// readers are threads, so nothing of a call outlives that runtime.
fn run<F: Future>(f: F) -> Result<F::Output, ServiceError> {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        return Ok(handle.block_on(f));
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .map_err(|e| ServiceError::internal(format!("no runtime for the shell: {e}")))?;
    Ok(runtime.block_on(f))
}

/// A request that runs a command: the parts of it the agent chooses, then fields of its own.
/// The caller never names the actor: it is the workspace's.
macro_rules! command_request {
    ($(#[$doc:meta])* $name:ident { $($(#[$f:meta])* $field:ident: $ty:ty,)* }) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            /// The program and its arguments, e.g. ["cargo", "test"] (no shell: use
            /// ["sh", "-c", "…"] for one).
            pub argv: Vec<String>,
            /// The directory to run in, relative to the workspace (default its root).
            #[serde(default)]
            pub cwd: Option<String>,
            /// Environment variables to set.
            #[serde(default)]
            pub env: BTreeMap<String, String>,
            /// Secrets to set as environment variables, by reference: their values are
            /// resolved when the command starts and never enter the history.
            #[serde(default)]
            pub secrets: BTreeMap<String, SecretRef>,
            /// Why, for the history (default: the command line).
            #[serde(default)]
            pub intent: Option<String>,
            $($(#[$f])* pub $field: $ty,)*
        }

        impl $name {
            /// The command as the workspace's actor runs it, once the session let it through.
            fn command(
                &self,
                g: &Session<'_>,
                operation: &str,
            ) -> Result<CommandSpec, ServiceError> {
                authorize(
                    g,
                    operation,
                    Command {
                        argv: self.argv.clone(),
                        cwd: self.cwd.clone(),
                        env: self.env.clone(),
                        secrets: self.secrets.clone(),
                        intent: self.intent.clone(),
                    },
                )
            }
        }
    };
}

/// The parts of a command the agent chooses.
struct Command {
    argv: Vec<String>,
    cwd: Option<String>,
    env: BTreeMap<String, String>,
    secrets: BTreeMap<String, SecretRef>,
    intent: Option<String>,
}

/// The command as the workspace's actor runs it, after the session let it through as an
/// `execute` of the program with its arguments.
fn authorize(g: &Session<'_>, operation: &str, c: Command) -> Result<CommandSpec, ServiceError> {
    let Some((program, args)) = c.argv.split_first() else {
        return Err(ServiceError::invalid("`argv` is empty"));
    };
    // The shell asks the same again when it starts the program.
    g.allow_command(
        Action::Execute,
        Resource::Program {
            program: program.clone(),
            args: args.to_vec(),
        },
        Some(operation),
    )?;
    let mut spec = CommandSpec::new(g.actor().clone(), c.argv);
    spec.cwd = c.cwd;
    spec.env = c.env;
    spec.secrets = c.secrets;
    spec.intent = c.intent.unwrap_or_default();
    spec.credentials = g.credentials();
    Ok(spec)
}

/// Bytes as the service answers them: as text when they are UTF-8, else as base64 (standard
/// alphabet, padded); exactly one of the two is set.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Bytes {
    /// The bytes, when they are UTF-8 text.
    pub text: Option<String>,
    /// The bytes in base64 (standard alphabet, padded), when they are not UTF-8.
    pub base64: Option<String>,
}

impl Bytes {
    /// `bytes` as text when they are UTF-8, else as base64.
    pub fn of(bytes: &[u8]) -> Bytes {
        match std::str::from_utf8(bytes) {
            Ok(s) => Bytes {
                text: Some(s.to_owned()),
                base64: None,
            },
            Err(_) => Bytes {
                text: None,
                base64: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
            },
        }
    }

    /// The bytes again.
    pub fn decode(&self) -> Result<Vec<u8>, base64::DecodeError> {
        match (&self.text, &self.base64) {
            (Some(t), _) => Ok(t.clone().into_bytes()),
            (None, Some(b)) => base64::engine::general_purpose::STANDARD.decode(b),
            (None, None) => Ok(Vec::new()),
        }
    }
}

// ---- exec ----------------------------------------------------------------------------------

command_request! {
    /// Runs a command to its end in the workspace's sandbox, recorded as one operation with
    /// what it changed (a change the actor may not make is put back and kept as refused).
    ExecParams {
        /// Text given on the command's standard input.
        #[serde(default)]
        stdin: Option<String>,
        /// Kill the command (and everything it started) after this many milliseconds; it is
        /// recorded as timed out.
        #[serde(default)]
        timeout_ms: Option<u64>,
        /// Keep at most this many bytes of each output stream (default 1 MiB).
        #[serde(default)]
        output_limit: Option<u64>,
    }
}

/// One output stream of a command: the bytes kept (at most the output limit), and its blob.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Stream {
    /// The bytes kept.
    #[serde(flatten)]
    pub bytes: Bytes,
    /// Bytes the command wrote.
    pub total: u64,
    /// Bytes kept.
    pub stored: u64,
    /// More was written than kept.
    pub truncated: bool,
    /// The kept bytes' blob.
    pub blob: String,
}

/// How a command ended and what it did.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Executed {
    /// How it ended.
    pub exit: Exit,
    /// It exited with code 0.
    pub success: bool,
    /// The operation that recorded it.
    pub op: String,
    /// Files it changed.
    pub files_changed: u64,
    /// How long it ran.
    pub duration_ms: u64,
    /// Its standard output.
    pub stdout: Stream,
    /// Its standard error.
    pub stderr: Stream,
    /// Changes it made that the actor may not make: put back, kept as refused.
    pub refused: Vec<json::Refused>,
}

pub(super) fn exec(g: &Session<'_>, p: ExecParams) -> Result<Executed, ServiceError> {
    let shell = g
        .shared()
        .shell()
        .exec
        .ok_or_else(|| ServiceError::unavailable("command execution"))?;
    let command = p.command(g, "exec")?;
    let mut request = ExecRequest {
        command,
        stdin: p.stdin.unwrap_or_default().into_bytes(),
        timeout_ms: p.timeout_ms,
        output_limit: environment_core::shell::DEFAULT_OUTPUT_LIMIT,
        cancel: g.cancel().clone(),
    };
    if let Some(limit) = p.output_limit {
        request.output_limit = limit;
    }
    let outcome = run(shell.exec(request))?.map_err(ServiceError::from)?;
    let stream = |s: &StoredOutput| Stream {
        // The stored bytes (at most the output limit), so the agent need not ask again.
        bytes: Bytes::of(&g.env().blobs().get(&s.blob).unwrap_or_default()),
        total: s.total,
        stored: s.stored,
        truncated: s.truncated,
        blob: s.blob.to_string(),
    };
    Ok(Executed {
        exit: outcome.exit,
        success: outcome.exit.success(),
        op: outcome.op.to_string(),
        files_changed: outcome.files_changed,
        duration_ms: outcome.duration_ms,
        stdout: stream(&outcome.stdout),
        stderr: stream(&outcome.stderr),
        refused: outcome.refused.iter().map(json::Refused::from).collect(),
    })
}

// ---- background processes ------------------------------------------------------------------

fn processes(
    g: &Session<'_>,
) -> Result<std::sync::Arc<dyn environment_core::BackgroundProcesses>, ServiceError> {
    g.shared()
        .shell()
        .processes
        .ok_or_else(|| ServiceError::unavailable("background processes"))
}

command_request! {
    /// Starts a background process in the workspace's sandbox (its output is kept; read it
    /// with process.read).
    SpawnParams {}
}

/// A background process or terminal session started.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Started {
    /// Its id.
    pub id: u64,
}

pub(super) fn spawn(g: &Session<'_>, p: SpawnParams) -> Result<Started, ServiceError> {
    let procs = processes(g)?;
    let command = p.command(g, "spawn")?;
    let id = run(procs.spawn(SpawnRequest { command }))?.map_err(ServiceError::from)?;
    Ok(Started { id: id.0 })
}

/// Reads a background process's output from an offset.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessReadParams {
    /// The process's id.
    pub id: u64,
    /// Where to start reading (default 0).
    #[serde(default)]
    pub offset: Option<u64>,
    /// At most this many bytes (default 64 KiB, at most 1 MiB).
    #[serde(default)]
    pub max: Option<u64>,
}

/// Output of a background process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Chunk {
    /// The bytes read.
    #[serde(flatten)]
    pub bytes: Bytes,
    /// Where to read next.
    pub next_offset: u64,
    /// The process ended and everything it wrote was read.
    pub eof: bool,
}

/// Waits (at most `timeout_ms`) for a background process to end.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessWaitParams {
    /// The process's id.
    pub id: u64,
    /// How long to wait (default 30 s, at most 10 min).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// Whether a process ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Waited {
    /// How it ended, if it did.
    pub exit: Option<Exit>,
    /// It ended.
    pub ended: bool,
}

/// Signals a background process and everything it started.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessSignalParams {
    /// The process's id.
    pub id: u64,
    /// The signal.
    pub signal: Signal,
}

/// A signal sent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Signalled {
    /// The process's id.
    pub id: u64,
    /// Always true.
    pub signalled: bool,
}

no_params! {
    /// Lists the background processes.
    ProcessListParams;
    /// Lists the terminal sessions.
    PtyListParams;
}

/// The background processes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Processes {
    /// Every one, oldest first.
    pub processes: Vec<ProcessInfo>,
}

const MAX_READ: u64 = 1 << 20;

pub(super) fn process_read(g: &Session<'_>, p: ProcessReadParams) -> Result<Chunk, ServiceError> {
    let procs = processes(g)?;
    g.allow(Action::Read, Resource::Environment, Some("process.read"))?;
    let max = p.max.unwrap_or(64 << 10).clamp(1, MAX_READ);
    let c = run(procs.read(ProcessId(p.id), p.offset.unwrap_or(0), max))?
        .map_err(ServiceError::from)?;
    Ok(Chunk {
        bytes: Bytes::of(&c.bytes),
        next_offset: c.next_offset,
        eof: c.eof,
    })
}

pub(super) fn process_wait(g: &Session<'_>, p: ProcessWaitParams) -> Result<Waited, ServiceError> {
    let procs = processes(g)?;
    g.allow(Action::Read, Resource::Environment, Some("process.wait"))?;
    // Bounded: a connection is answered in order, so an endless wait would block it.
    let timeout = Duration::from_millis(p.timeout_ms.unwrap_or(30_000).min(600_000));
    let exit = run(procs.wait(ProcessId(p.id), Some(timeout)))?.map_err(ServiceError::from)?;
    Ok(Waited {
        exit,
        ended: exit.is_some(),
    })
}

pub(super) fn process_signal(
    g: &Session<'_>,
    p: ProcessSignalParams,
) -> Result<Signalled, ServiceError> {
    let procs = processes(g)?;
    g.allow(Action::Write, Resource::Environment, Some("process.signal"))?;
    run(procs.signal(ProcessId(p.id), p.signal))?.map_err(ServiceError::from)?;
    Ok(Signalled {
        id: p.id,
        signalled: true,
    })
}

pub(super) fn process_list(
    g: &Session<'_>,
    _: ProcessListParams,
) -> Result<Processes, ServiceError> {
    let procs = processes(g)?;
    g.allow(Action::Read, Resource::Environment, Some("process.list"))?;
    let list = run(procs.list())?.map_err(ServiceError::from)?;
    Ok(Processes { processes: list })
}

// ---- terminal sessions ---------------------------------------------------------------------

fn ptys(
    g: &Session<'_>,
) -> Result<std::sync::Arc<dyn environment_core::PtySessions>, ServiceError> {
    g.shared()
        .shell()
        .pty
        .ok_or_else(|| ServiceError::unavailable("terminal sessions"))
}

command_request! {
    /// Opens a terminal session running a command in the workspace's sandbox.
    PtyOpenParams {
        /// Rows (default 24).
        #[serde(default)]
        rows: Option<u16>,
        /// Columns (default 80).
        #[serde(default)]
        cols: Option<u16>,
        /// Close the session after this long without a read or a write.
        #[serde(default)]
        idle_timeout_ms: Option<u64>,
    }
}

pub(super) fn pty_open(g: &Session<'_>, p: PtyOpenParams) -> Result<Started, ServiceError> {
    let pty = ptys(g)?;
    let command = p.command(g, "pty")?;
    let id = run(pty.open(PtyRequest {
        command,
        rows: p.rows.unwrap_or(24),
        cols: p.cols.unwrap_or(80),
        idle_timeout_ms: p.idle_timeout_ms,
    }))?
    .map_err(ServiceError::from)?;
    Ok(Started { id: id.0 })
}

/// Types into a terminal session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PtyWriteParams {
    /// The session's id.
    pub id: u64,
    /// What to type (text; "\r" is Enter).
    pub data: String,
}

/// Bytes typed into a session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PtyWritten {
    /// The session's id.
    pub id: u64,
    /// Bytes written.
    pub written: usize,
}

/// A request that names an open terminal session and nothing else.
macro_rules! session_request {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            /// The session's id.
            pub id: u64,
        }
    )*};
}

session_request! {
    /// Reads a terminal session's output since the last read.
    PtyReadParams;
    /// Detaches from a terminal session (it keeps running).
    PtyDetachParams;
    /// Re-attaches to a terminal session, with the output since the last read.
    PtyAttachParams;
    /// Closes a terminal session.
    PtyCloseParams;
}

/// Resizes a terminal session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PtyResizeParams {
    /// The session's id.
    pub id: u64,
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// A terminal session's output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PtyOutput {
    /// The bytes since the last read.
    #[serde(flatten)]
    pub bytes: Bytes,
    /// Where they start in the session's output.
    pub offset: u64,
    /// Bytes dropped before them (the session keeps a bounded backlog).
    pub missed: u64,
    /// How the command ended, if it did.
    pub exit: Option<Exit>,
}

/// A session resized.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PtyResized {
    /// The session's id.
    pub id: u64,
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// A session detached.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PtyDetached {
    /// The session's id.
    pub id: u64,
    /// Always false.
    pub attached: bool,
}

/// A session closed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PtyClosed {
    /// The session's id.
    pub id: u64,
    /// How its command ended, if it did.
    pub exit: Option<Exit>,
}

/// A terminal session.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PtySession {
    /// Its id.
    pub id: u64,
    /// Who opened it.
    pub actor: String,
    /// Its command.
    pub argv: Vec<String>,
    /// Someone is attached.
    pub attached: bool,
    /// Rows.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
    /// How its command ended, if it did.
    pub exit: Option<Exit>,
}

/// The terminal sessions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PtySessions {
    /// Every one.
    pub sessions: Vec<PtySession>,
}

impl From<&SessionInfo> for PtySession {
    fn from(s: &SessionInfo) -> PtySession {
        PtySession {
            id: s.id.0,
            actor: s.actor.as_str().to_owned(),
            argv: s.argv.clone(),
            attached: s.attached,
            rows: s.size.0,
            cols: s.size.1,
            exit: s.exit,
        }
    }
}

/// The session `id`, once the caller may `action` it (`method` is the wire name).
fn pty_session(
    g: &Session<'_>,
    action: Action,
    method: &str,
) -> Result<std::sync::Arc<dyn environment_core::PtySessions>, ServiceError> {
    let pty = ptys(g)?;
    g.allow(action, Resource::Environment, Some(method))?;
    Ok(pty)
}

fn pty_output(o: environment_core::PtyOutput) -> PtyOutput {
    PtyOutput {
        bytes: Bytes::of(&o.bytes),
        offset: o.offset,
        missed: o.missed,
        exit: o.exit,
    }
}

pub(super) fn pty_write(g: &Session<'_>, p: PtyWriteParams) -> Result<PtyWritten, ServiceError> {
    let pty = pty_session(g, Action::Write, "pty.write")?;
    run(pty.write(SessionId(p.id), p.data.as_bytes()))?.map_err(ServiceError::from)?;
    Ok(PtyWritten {
        id: p.id,
        written: p.data.len(),
    })
}

pub(super) fn pty_read(g: &Session<'_>, p: PtyReadParams) -> Result<PtyOutput, ServiceError> {
    let pty = pty_session(g, Action::Read, "pty.read")?;
    Ok(pty_output(
        run(pty.read(SessionId(p.id)))?.map_err(ServiceError::from)?,
    ))
}

pub(super) fn pty_attach(g: &Session<'_>, p: PtyAttachParams) -> Result<PtyOutput, ServiceError> {
    let pty = pty_session(g, Action::Read, "pty.attach")?;
    Ok(pty_output(
        run(pty.attach(SessionId(p.id)))?.map_err(ServiceError::from)?,
    ))
}

pub(super) fn pty_resize(g: &Session<'_>, p: PtyResizeParams) -> Result<PtyResized, ServiceError> {
    let pty = pty_session(g, Action::Write, "pty.resize")?;
    run(pty.resize(SessionId(p.id), p.rows, p.cols))?.map_err(ServiceError::from)?;
    Ok(PtyResized {
        id: p.id,
        rows: p.rows,
        cols: p.cols,
    })
}

pub(super) fn pty_detach(g: &Session<'_>, p: PtyDetachParams) -> Result<PtyDetached, ServiceError> {
    let pty = pty_session(g, Action::Write, "pty.detach")?;
    run(pty.detach(SessionId(p.id)))?.map_err(ServiceError::from)?;
    Ok(PtyDetached {
        id: p.id,
        attached: false,
    })
}

pub(super) fn pty_close(g: &Session<'_>, p: PtyCloseParams) -> Result<PtyClosed, ServiceError> {
    let pty = pty_session(g, Action::Write, "pty.close")?;
    let exit = run(pty.close(SessionId(p.id)))?.map_err(ServiceError::from)?;
    Ok(PtyClosed { id: p.id, exit })
}

pub(super) fn pty_list(g: &Session<'_>, _: PtyListParams) -> Result<PtySessions, ServiceError> {
    let pty = ptys(g)?;
    g.allow(Action::Read, Resource::Environment, Some("pty.list"))?;
    let list = run(pty.list())?.map_err(ServiceError::from)?;
    Ok(PtySessions {
        sessions: list.iter().map(PtySession::from).collect(),
    })
}
