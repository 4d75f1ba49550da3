//! The shell's use cases: recorded commands (`exec`), background processes
//! (`process.*`) and terminal sessions (`pty.*`), each calling the shell capability the
//! workspace was given. The caller never names the actor a command runs as: it is the
//! workspace's.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use base64::Engine as _;
use environment_core::{
    Action, CommandSpec, ExecRequest, Exit, OutputChunk, ProcessId, ProcessInfo, PtyOutput,
    PtyRequest, Resource, SecretRef, SessionId, SessionInfo, Signal, SpawnRequest, StoredOutput,
};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::error::ServiceError;
use super::session::Session;

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

/// The parts of a command the agent chooses.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct CommandParams {
    argv: Vec<String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    secrets: BTreeMap<String, SecretRef>,
    #[serde(default)]
    intent: Option<String>,
}

impl CommandParams {
    /// The command as the workspace's actor runs it, after the session let it through as an
    /// `execute` of the program with its arguments.
    fn authorize(self, g: &Session<'_>, operation: &str) -> Result<CommandSpec, ServiceError> {
        let Some((program, args)) = self.argv.split_first() else {
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
        let mut spec = CommandSpec::new(g.actor().clone(), self.argv);
        spec.cwd = self.cwd;
        spec.env = self.env;
        spec.secrets = self.secrets;
        spec.intent = self.intent.unwrap_or_default();
        Ok(spec)
    }
}

/// Bytes as the service answers them: as text when they are UTF-8, else as base64 (standard
/// alphabet, padded); exactly one of the two is set.
pub fn bytes_json(bytes: &[u8]) -> (Option<String>, Option<String>) {
    match std::str::from_utf8(bytes) {
        Ok(s) => (Some(s.to_owned()), None),
        Err(_) => (
            None,
            Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
        ),
    }
}

fn exit_json(e: Option<Exit>) -> Value {
    serde_json::to_value(e).unwrap_or(Value::Null)
}

// ---- exec ----------------------------------------------------------------------------------

/// Parses params that are a command's plus `extra` fields of their own (serde cannot deny
/// unknown fields across a flattened struct, so the two parts are taken apart first).
pub(super) fn split<T: serde::de::DeserializeOwned>(
    mut params: Map<String, Value>,
    extra: &[&str],
) -> Result<(CommandParams, T), ServiceError> {
    let mut own = Map::new();
    for k in extra {
        if let Some(v) = params.remove(*k) {
            own.insert((*k).to_owned(), v);
        }
    }
    let command = serde_json::from_value(Value::Object(params)).map_err(ServiceError::invalid)?;
    let own = serde_json::from_value(Value::Object(own)).map_err(ServiceError::invalid)?;
    Ok((command, own))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ExecParams {
    #[serde(default)]
    stdin: Option<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    output_limit: Option<u64>,
}

/// The fields of `exec` beyond the command's.
pub(super) const EXEC_FIELDS: &[&str] = &["stdin", "timeout_ms", "output_limit"];

pub(super) fn exec(
    g: &Session<'_>,
    c: CommandParams,
    p: ExecParams,
) -> Result<Value, ServiceError> {
    let shell = g
        .shared()
        .shell()
        .exec
        .ok_or_else(|| ServiceError::unavailable("command execution"))?;
    let command = c.authorize(g, "exec")?;
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
    let stream = |s: &StoredOutput| {
        // The stored bytes (at most the output limit), so the agent need not ask again.
        let stored = g.env().blobs().get(&s.blob).unwrap_or_default();
        let (text, b64) = bytes_json(&stored);
        json!({
            "text": text,
            "base64": b64,
            "total": s.total,
            "stored": s.stored,
            "truncated": s.truncated,
            "blob": s.blob.to_string(),
        })
    };
    Ok(json!({
        "exit": exit_json(Some(outcome.exit)),
        "success": outcome.exit.success(),
        "op": outcome.op.to_string(),
        "files_changed": outcome.files_changed,
        "duration_ms": outcome.duration_ms,
        "stdout": stream(&outcome.stdout),
        "stderr": stream(&outcome.stderr),
        "refused": outcome.refused.iter().map(|r| r.to_json()).collect::<Vec<_>>(),
    }))
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

pub(super) fn spawn(g: &Session<'_>, c: CommandParams) -> Result<Value, ServiceError> {
    let procs = processes(g)?;
    let command = c.authorize(g, "spawn")?;
    let id = run(procs.spawn(SpawnRequest { command }))?.map_err(ServiceError::from)?;
    Ok(json!({ "id": id.0 }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ProcessParams {
    id: u64,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    max: Option<u64>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    signal: Option<Signal>,
}

fn chunk_json(c: &OutputChunk) -> Value {
    let (text, b64) = bytes_json(&c.bytes);
    json!({ "text": text, "base64": b64, "next_offset": c.next_offset, "eof": c.eof })
}

fn info_json(i: &ProcessInfo) -> Value {
    json!({
        "id": i.id.0,
        "actor": i.actor.as_str(),
        "argv": i.argv,
        "pid": i.pid,
        "started_ms": i.started_ms,
        "exit": exit_json(i.exit),
        "output_len": i.output_len,
    })
}

const MAX_READ: u64 = 1 << 20;

pub(super) fn process_read(g: &Session<'_>, p: ProcessParams) -> Result<Value, ServiceError> {
    let procs = processes(g)?;
    g.allow(Action::Read, Resource::Environment, Some("process.read"))?;
    let max = p.max.unwrap_or(64 << 10).clamp(1, MAX_READ);
    let chunk = run(procs.read(ProcessId(p.id), p.offset.unwrap_or(0), max))?
        .map_err(ServiceError::from)?;
    Ok(chunk_json(&chunk))
}

pub(super) fn process_wait(g: &Session<'_>, p: ProcessParams) -> Result<Value, ServiceError> {
    let procs = processes(g)?;
    g.allow(Action::Read, Resource::Environment, Some("process.wait"))?;
    // Bounded: a connection is answered in order, so an endless wait would block it.
    let timeout = Duration::from_millis(p.timeout_ms.unwrap_or(30_000).min(600_000));
    let exit = run(procs.wait(ProcessId(p.id), Some(timeout)))?.map_err(ServiceError::from)?;
    Ok(json!({ "exit": exit_json(exit), "ended": exit.is_some() }))
}

pub(super) fn process_signal(g: &Session<'_>, p: ProcessParams) -> Result<Value, ServiceError> {
    let procs = processes(g)?;
    let Some(signal) = p.signal else {
        return Err(ServiceError::invalid("`signal` is required"));
    };
    g.allow(Action::Write, Resource::Environment, Some("process.signal"))?;
    run(procs.signal(ProcessId(p.id), signal))?.map_err(ServiceError::from)?;
    Ok(json!({ "id": p.id, "signalled": true }))
}

pub(super) fn process_list(g: &Session<'_>) -> Result<Value, ServiceError> {
    let procs = processes(g)?;
    g.allow(Action::Read, Resource::Environment, Some("process.list"))?;
    let list = run(procs.list())?.map_err(ServiceError::from)?;
    Ok(json!({ "processes": list.iter().map(info_json).collect::<Vec<_>>() }))
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

/// The fields of `pty.open` beyond the command's.
pub(super) const PTY_OPEN_FIELDS: &[&str] = &["rows", "cols", "idle_timeout_ms"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PtyOpenParams {
    #[serde(default)]
    rows: Option<u16>,
    #[serde(default)]
    cols: Option<u16>,
    #[serde(default)]
    idle_timeout_ms: Option<u64>,
}

pub(super) fn pty_open(
    g: &Session<'_>,
    c: CommandParams,
    p: PtyOpenParams,
) -> Result<Value, ServiceError> {
    let pty = ptys(g)?;
    let command = c.authorize(g, "pty")?;
    let id = run(pty.open(PtyRequest {
        command,
        rows: p.rows.unwrap_or(24),
        cols: p.cols.unwrap_or(80),
        idle_timeout_ms: p.idle_timeout_ms,
    }))?
    .map_err(ServiceError::from)?;
    Ok(json!({ "id": id.0 }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PtyParams {
    id: u64,
    #[serde(default)]
    data: Option<String>,
    #[serde(default)]
    rows: Option<u16>,
    #[serde(default)]
    cols: Option<u16>,
}

fn pty_output_json(o: &PtyOutput) -> Value {
    let (text, b64) = bytes_json(&o.bytes);
    json!({
        "text": text,
        "base64": b64,
        "offset": o.offset,
        "missed": o.missed,
        "exit": exit_json(o.exit),
    })
}

fn session_json(s: &SessionInfo) -> Value {
    json!({
        "id": s.id.0,
        "actor": s.actor.as_str(),
        "argv": s.argv,
        "attached": s.attached,
        "rows": s.size.0,
        "cols": s.size.1,
        "exit": exit_json(s.exit),
    })
}

/// What to do with an open terminal session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum PtyOp {
    Write,
    Read,
    Attach,
    Resize,
    Detach,
    Close,
}

/// One `pty.*` method on an open session; `method` is its wire name.
pub(super) fn pty_call(
    g: &Session<'_>,
    op: PtyOp,
    method: &str,
    p: PtyParams,
) -> Result<Value, ServiceError> {
    let pty = ptys(g)?;
    let id = SessionId(p.id);
    let action = match op {
        PtyOp::Read | PtyOp::Attach => Action::Read,
        _ => Action::Write,
    };
    g.allow(action, Resource::Environment, Some(method))?;
    let out = match op {
        PtyOp::Write => {
            let Some(data) = p.data else {
                return Err(ServiceError::invalid("`data` is required"));
            };
            run(pty.write(id, data.as_bytes()))?.map_err(ServiceError::from)?;
            json!({ "id": p.id, "written": data.len() })
        }
        PtyOp::Read => pty_output_json(&run(pty.read(id))?.map_err(ServiceError::from)?),
        PtyOp::Attach => pty_output_json(&run(pty.attach(id))?.map_err(ServiceError::from)?),
        PtyOp::Resize => {
            let (Some(rows), Some(cols)) = (p.rows, p.cols) else {
                return Err(ServiceError::invalid("`rows` and `cols` are required"));
            };
            run(pty.resize(id, rows, cols))?.map_err(ServiceError::from)?;
            json!({ "id": p.id, "rows": rows, "cols": cols })
        }
        PtyOp::Detach => {
            run(pty.detach(id))?.map_err(ServiceError::from)?;
            json!({ "id": p.id, "attached": false })
        }
        PtyOp::Close => {
            let exit = run(pty.close(id))?.map_err(ServiceError::from)?;
            json!({ "id": p.id, "exit": exit_json(exit) })
        }
    };
    Ok(out)
}

pub(super) fn pty_list(g: &Session<'_>) -> Result<Value, ServiceError> {
    let pty = ptys(g)?;
    g.allow(Action::Read, Resource::Environment, Some("pty.list"))?;
    let list = run(pty.list())?.map_err(ServiceError::from)?;
    Ok(json!({ "sessions": list.iter().map(session_json).collect::<Vec<_>>() }))
}
