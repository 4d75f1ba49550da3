//! A recorded command: run to its end with a timeout and an output limit, then one operation
//! holding its file changes and its output.

use std::io::{Read, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use environment_core::{
    Cancel, Change, Content, EntryKind, EnvError, ExecOutcome, ExecRequest, Exit, Intent,
    IntentKind, Key, LocalEnvironment, Meta, OpFlags, StoredOutput, Value, shell::command_line,
};
use rustix::process::{Pid, PidfdFlags, Signal, WaitId, WaitIdOptions};

use super::redact::Redactor;
use super::{Inner, Prepared, exec_error, lock, now_ms, to_env};

/// The objects every recorded command writes (see the module documentation).
pub(crate) const OUTPUT_KEYS: [&str; 3] = ["exec/stdout", "exec/stderr", "exec/status"];

/// The longest intent recorded for a command; a longer one (a long command line) is cut.
const MAX_INTENT: usize = 4096;

/// How many bytes of an output the outcome previews.
const PREVIEW: usize = 512;

/// How long, after a command ended, its output pipes may stay open (held by a process that left
/// its process group) before what was read so far is taken as its output.
const PIPE_GRACE: Duration = Duration::from_secs(2);

/// One output stream as it is read: counted whole, kept up to the limit, secrets redacted.
#[derive(Debug)]
pub(crate) struct Collector {
    redactor: Redactor,
    limit: u64,
    stored: Vec<u8>,
    total: u64,
    truncated: bool,
}

impl Collector {
    pub(crate) fn new(redactor: Redactor, limit: u64) -> Collector {
        Collector {
            redactor,
            limit,
            stored: Vec::new(),
            total: 0,
            truncated: false,
        }
    }

    pub(crate) fn push(&mut self, chunk: &[u8]) {
        self.total += chunk.len() as u64;
        let clean = self.redactor.push(chunk);
        self.keep(&clean);
    }

    pub(crate) fn finish(&mut self) {
        let clean = self.redactor.finish();
        self.keep(&clean);
    }

    fn keep(&mut self, clean: &[u8]) {
        let room = self.limit.saturating_sub(self.stored.len() as u64) as usize;
        if clean.len() > room {
            self.truncated = true;
        }
        self.stored
            .extend_from_slice(&clean[..clean.len().min(room)]);
    }
}

/// Reads a pipe to its end into a shared collector; says so on `done`.
fn read_into(
    mut pipe: impl Read + Send + 'static,
    collector: Arc<Mutex<Collector>>,
    done: mpsc::Sender<()>,
) {
    let spawned = thread::Builder::new()
        .name("environment-exec-output".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                match pipe.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => lock(&collector).push(&buf[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
            let _ = done.send(());
        });
    if spawned.is_err() {
        tracing::warn!("cannot start an output reader; the output is lost");
    }
}

/// How long a wait looks at its cancellation at least once: what a cancelled command may run on
/// for. An ending command is seen at once either way.
const CANCEL_CHECK: Duration = Duration::from_millis(50);

/// How a wait for a command ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ended {
    Exited,
    TimedOut,
    Cancelled,
}

/// Waits up to `timeout` for the child to end, or until `cancel` is called, without reaping it
/// (so its process group id stays reserved until the group is killed).
fn wait_unreaped(pid: Pid, timeout: Option<Duration>, cancel: &Cancel) -> Ended {
    let deadline = timeout.map(|t| Instant::now() + t);
    // The next slice to wait: up to the deadline, at most CANCEL_CHECK; `None` once it passed
    // or the command was called off.
    let slice = || -> Result<Duration, Ended> {
        if cancel.is_cancelled() {
            return Err(Ended::Cancelled);
        }
        match deadline.map(|d| d.saturating_duration_since(Instant::now())) {
            Some(left) if left.is_zero() => Err(Ended::TimedOut),
            Some(left) => Ok(left.min(CANCEL_CHECK)),
            None => Ok(CANCEL_CHECK),
        }
    };
    if let Ok(fd) = rustix::process::pidfd_open(pid, PidfdFlags::empty()) {
        loop {
            let left = match slice() {
                Ok(left) => left,
                Err(ended) => return ended,
            };
            let ts = rustix::event::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            };
            let mut fds = [rustix::event::PollFd::new(
                &fd,
                rustix::event::PollFlags::IN,
            )];
            match rustix::event::poll(&mut fds, Some(&ts)) {
                Ok(n) if n > 0 => return Ended::Exited,
                Ok(_) | Err(rustix::io::Errno::INTR) => continue,
                Err(_) => break,
            }
        }
    }
    // No pidfd (an old kernel, a seccomp profile): poll.
    loop {
        let status = rustix::process::waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT | WaitIdOptions::NOHANG,
        );
        match status {
            Ok(Some(_)) | Err(_) => return Ended::Exited,
            Ok(None) => {}
        }
        if let Err(ended) = slice() {
            return ended;
        }
        thread::sleep(Duration::from_millis(1));
    }
}

/// Blocks until the process has ended, without reaping it.
pub(crate) fn wait_exited(pid: Pid) {
    while let Err(rustix::io::Errno::INTR) = rustix::process::waitid(
        WaitId::Pid(pid),
        WaitIdOptions::EXITED | WaitIdOptions::NOWAIT,
    ) {}
}

/// Converts a reaped status.
pub(crate) fn exit_of(status: std::process::ExitStatus) -> Exit {
    match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Code(code),
        (None, Some(sig)) => Exit::Signal(sig),
        (None, None) => Exit::Code(-1),
    }
}

/// What came out of a run.
pub(crate) struct Ran {
    pub(crate) exit: Exit,
    pub(crate) stdout: Collector,
    pub(crate) stderr: Collector,
}

/// Runs a confined command to its end (or its timeout, or until `cancel` calls it off),
/// feeding it `stdin` and collecting its output; the process group ends with it.
pub(crate) fn run(
    mut cmd: Command,
    program: &str,
    stdin: Vec<u8>,
    timeout: Option<Duration>,
    cancel: &Cancel,
    collector: impl Fn() -> Collector,
) -> Result<Ran, EnvError> {
    cmd.process_group(0)
        .stdin(if stdin.is_empty() {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child: Child = cmd.spawn().map_err(|e| exec_error(program, e))?;
    let pid = Pid::from_child(&child);
    if let Some(mut input) = child.stdin.take() {
        // A command that does not read its input must not block the run.
        let _ = thread::Builder::new()
            .name("environment-exec-input".into())
            .spawn(move || {
                let _ = input.write_all(&stdin);
            });
    }
    let (done_tx, done_rx) = mpsc::channel();
    let out = Arc::new(Mutex::new(collector()));
    let err = Arc::new(Mutex::new(collector()));
    let mut readers = 0;
    if let Some(pipe) = child.stdout.take() {
        read_into(pipe, out.clone(), done_tx.clone());
        readers += 1;
    }
    if let Some(pipe) = child.stderr.take() {
        read_into(pipe, err.clone(), done_tx.clone());
        readers += 1;
    }
    drop(done_tx);
    let ended = wait_unreaped(pid, timeout, cancel);
    // Whatever it left running in its process group ends with it (on a timeout, it too): a
    // command that should outlive its caller is a background process.
    let _ = rustix::process::kill_process_group(pid, Signal::KILL);
    let status = child.wait().map_err(|e| exec_error(program, e))?;
    let grace = Instant::now() + PIPE_GRACE;
    for _ in 0..readers {
        let left = grace.saturating_duration_since(Instant::now());
        if done_rx.recv_timeout(left).is_err() {
            tracing::warn!(%program, "an output pipe stayed open after the command ended");
            break;
        }
    }
    let take = |c: &Arc<Mutex<Collector>>| {
        let mut c = std::mem::replace(&mut *lock(c), Collector::new(Redactor::default(), 0));
        c.finish();
        c
    };
    Ok(Ran {
        exit: match ended {
            Ended::Exited => exit_of(status),
            Ended::TimedOut => Exit::TimedOut,
            Ended::Cancelled => Exit::Cancelled,
        },
        stdout: take(&out),
        stderr: take(&err),
    })
}

/// What a recorded command adds to its operation: its outputs stored, the objects that name
/// them and its status, and the flags its exit calls for.
pub(crate) struct Record {
    pub(crate) changes: Vec<Change>,
    pub(crate) flags: OpFlags,
    pub(crate) stdout: StoredOutput,
    pub(crate) stderr: StoredOutput,
}

/// Stores a run's outputs and describes it (see the module documentation of `shell`). The
/// caller holds the blob store's write guard until the operation commits.
pub(crate) fn record(
    env: &LocalEnvironment,
    ran: &Ran,
    argv: &[String],
    cwd: &str,
    started_ms: i64,
    duration_ms: u64,
) -> Result<Record, EnvError> {
    let (out_value, stdout) = store(env, &ran.stdout)?;
    let (err_value, stderr) = store(env, &ran.stderr)?;
    let status = serde_json::json!({
        "command": command_line(argv),
        "cwd": cwd,
        "exit": ran.exit,
        "started_ms": started_ms,
        "duration_ms": duration_ms,
        "stdout": { "total": stdout.total, "stored": stdout.stored, "truncated": stdout.truncated },
        "stderr": { "total": stderr.total, "stored": stderr.stored, "truncated": stderr.truncated },
    });
    let status_value = Value::with_kind(EntryKind::TestResult, status.to_string().into_bytes())
        .attr("content-type", "application/json");
    let changes = vec![
        Change::Put(obj(OUTPUT_KEYS[0])?, out_value),
        Change::Put(obj(OUTPUT_KEYS[1])?, err_value),
        Change::Put(obj(OUTPUT_KEYS[2])?, status_value),
    ];
    let mut flags = OpFlags::COMMAND;
    if !ran.exit.success() {
        flags |= OpFlags::FAILED;
    }
    Ok(Record {
        changes,
        flags,
        stdout,
        stderr,
    })
}

/// Stores an output in the blob store; the value recorded for it and its summary.
fn store(env: &LocalEnvironment, c: &Collector) -> Result<(Value, StoredOutput), EnvError> {
    let blob = env.blobs().put(&c.stored)?;
    let mut meta = Meta::of(EntryKind::Artifact);
    meta.mode = 0o644;
    meta.size = c.stored.len() as u64;
    meta.attributes.insert("total".into(), c.total.to_string());
    meta.attributes
        .insert("stored".into(), c.stored.len().to_string());
    meta.attributes
        .insert("truncated".into(), c.truncated.to_string());
    let mut preview =
        String::from_utf8_lossy(&c.stored[..c.stored.len().min(PREVIEW)]).into_owned();
    if c.stored.len() > PREVIEW {
        preview.push('…');
    }
    Ok((
        Value {
            content: Content::Blob(blob),
            meta,
        },
        StoredOutput {
            blob,
            total: c.total,
            stored: c.stored.len() as u64,
            truncated: c.truncated,
            preview,
        },
    ))
}

/// `text` cut to at most `max` bytes on a character boundary, marked when cut.
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max.saturating_sub('…'.len_utf8());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

fn obj(path: &str) -> Result<Key, EnvError> {
    Ok(Key::obj(path)?)
}

/// Runs a prepared command and records it as one operation.
pub(crate) fn run_recorded(
    inner: &Arc<Inner>,
    p: Prepared,
    req: ExecRequest,
) -> Result<ExecOutcome, EnvError> {
    let program = p.spec.argv[0].clone();
    // From here to the end-capture, automatic captures leave the command's changes alone.
    let hold = inner.tracker.hold().map_err(|e| to_env(&program, e))?;
    let started_ms = now_ms();
    let started = Instant::now();
    let cmd = inner.command(&p)?;
    let ran = run(
        cmd,
        &program,
        req.stdin.clone(),
        req.timeout_ms.map(Duration::from_millis),
        &req.cancel,
        || Collector::new(p.redactor(), req.output_limit),
    )?;
    let duration_ms = started.elapsed().as_millis() as u64;
    let env = &inner.env;
    // Blobs stored from here are kept from garbage collection until the operation commits.
    let guard = env.blobs().write_guard()?;
    let cwd = p.spec.cwd.clone().unwrap_or_default();
    let Record {
        changes: extra,
        flags,
        stdout,
        stderr,
    } = record(env, &ran, &p.spec.argv, &cwd, started_ms, duration_ms)?;
    let intent = Intent::new(IntentKind::Command, cut(p.spec.intent_text(), MAX_INTENT));
    let captured = inner
        .tracker
        .presenting(p.spec.credentials.clone())
        .capture_command(&p.spec.actor, intent, flags, extra)
        .map_err(|e| to_env(&program, e))?;
    drop(guard);
    drop(hold);
    let op = match captured.observation {
        Some(o) => o.version,
        // Only if the status matched byte for byte, which its start time prevents.
        None => env.head(inner.tracker.branch())?,
    };
    Ok(ExecOutcome {
        exit: ran.exit,
        stdout,
        stderr,
        op,
        files_changed: captured.files,
        duration_ms,
        refused: captured.disallowed,
    })
}
