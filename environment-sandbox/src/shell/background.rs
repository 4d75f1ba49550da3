//! Background processes: started for an actor, owned by the shell, their output (standard
//! output and error together, in order, secrets redacted) appended to a log file in the shell's
//! run directory, readable from any offset by whoever asks later.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use environment_core::{
    ActorId, BackgroundProcesses, EnvError, Exit, OutputChunk, ProcessId, ProcessInfo, Signal,
    SpawnRequest,
};
use rustix::process::Pid;

use super::exec::{exit_of, wait_exited};
use super::redact::Redactor;
use super::{Inner, Prepared, Shell, actor_of, blocking, exec_error, lock, now_ms};

/// The most bytes one read returns, whatever is asked.
const MAX_READ: u64 = 4 << 20;

/// How long after the exit a wait still waits for the output pipe to reach its end.
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

#[derive(Default)]
struct State {
    exit: Option<Exit>,
    /// When the exit was seen (reaped).
    exited_at: Option<Instant>,
    /// Bytes in the log (what readers may see).
    output_len: u64,
    /// The output pipe reached its end: nothing more will be written to the log.
    output_done: bool,
}

/// One background process.
pub(crate) struct Process {
    id: ProcessId,
    actor: ActorId,
    argv: Vec<String>,
    pid: Pid,
    started_ms: i64,
    log: PathBuf,
    state: Mutex<State>,
    changed: Condvar,
}

fn signal_of(s: Signal) -> rustix::process::Signal {
    use rustix::process::Signal as S;
    match s {
        Signal::Interrupt => S::INT,
        Signal::Terminate => S::TERM,
        Signal::Kill => S::KILL,
        Signal::Hangup => S::HUP,
        Signal::Quit => S::QUIT,
        Signal::User1 => S::USR1,
        Signal::User2 => S::USR2,
        Signal::Stop => S::STOP,
        Signal::Continue => S::CONT,
        // A signal added later defaults to asking the process to end.
        _ => S::TERM,
    }
}

impl Process {
    /// Sends a signal to its process group, unless it has been reaped (its group id could then
    /// belong to someone else).
    fn send(&self, sig: rustix::process::Signal) {
        let state = lock(&self.state);
        if state.exit.is_none() {
            let _ = rustix::process::kill_process_group(self.pid, sig);
        }
    }

    /// Ends it and everything in its process group.
    pub(crate) fn kill(&self) {
        self.send(rustix::process::Signal::KILL);
    }

    fn info(&self) -> ProcessInfo {
        let state = lock(&self.state);
        ProcessInfo {
            id: self.id,
            actor: self.actor.clone(),
            argv: self.argv.clone(),
            pid: self.pid.as_raw_nonzero().get() as u32,
            started_ms: self.started_ms,
            exit: state.exit,
            output_len: state.output_len,
        }
    }

    fn read(&self, offset: u64, max: u64) -> Result<OutputChunk, EnvError> {
        let (len, finished) = {
            let s = lock(&self.state);
            (s.output_len, s.exit.is_some() && s.output_done)
        };
        let start = offset.min(len);
        let want = (len - start).min(max).min(MAX_READ);
        let mut bytes = vec![0u8; want as usize];
        if want > 0 {
            let io = |e: std::io::Error| exec_error(&self.argv[0], format!("output log: {e}"));
            let mut f = File::open(&self.log).map_err(io)?;
            f.seek(SeekFrom::Start(start)).map_err(io)?;
            f.read_exact(&mut bytes).map_err(io)?;
        }
        let next_offset = start + want;
        Ok(OutputChunk {
            bytes,
            next_offset,
            eof: finished && next_offset >= len,
        })
    }

    /// Waits for its exit and, for at most [`OUTPUT_GRACE`] after it, for its output to reach
    /// the log: a read after a wait that saw the exit sees what the process wrote (a descendant
    /// still holding the pipe open does not hold the answer longer than the grace).
    fn wait(&self, timeout: Option<Duration>) -> Option<Exit> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut state = lock(&self.state);
        loop {
            let until = match state.exited_at {
                Some(_) if state.output_done => return state.exit,
                Some(at) => Some(at + OUTPUT_GRACE),
                None => deadline,
            };
            let left = until.map(|u| u.saturating_duration_since(Instant::now()));
            state = match left {
                // The timeout (no exit yet) or the grace (the exit without all its output).
                Some(left) if left.is_zero() => return state.exit,
                Some(left) => {
                    self.changed
                        .wait_timeout(state, left)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                }
                None => self.changed.wait(state).unwrap_or_else(|p| p.into_inner()),
            };
        }
    }
}

/// Copies the output pipe into the log, redacting secrets on the way.
fn pump(process: Arc<Process>, mut pipe: impl Read, mut log: File, mut redactor: Redactor) {
    let mut buf = vec![0u8; 64 << 10];
    let mut append = |bytes: &[u8], p: &Process| {
        if bytes.is_empty() {
            return;
        }
        if let Err(e) = log.write_all(bytes) {
            tracing::warn!(error = %e, id = p.id.0, "cannot append to a background output log");
            return;
        }
        lock(&p.state).output_len += bytes.len() as u64;
        p.changed.notify_all();
    };
    loop {
        match pipe.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => append(&redactor.push(&buf[..n]), &process),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    append(&redactor.finish(), &process);
    lock(&process.state).output_done = true;
    process.changed.notify_all();
}

/// Waits for the process to end; reaps it under the state lock, so a signal never reaches a
/// reused process group id.
fn reap(process: Arc<Process>, mut child: Child) {
    wait_exited(process.pid);
    let mut state = lock(&process.state);
    state.exit = Some(match child.wait() {
        Ok(status) => exit_of(status),
        Err(_) => Exit::Code(-1),
    });
    state.exited_at = Some(Instant::now());
    drop(state);
    process.changed.notify_all();
}

impl Inner {
    fn spawn_background(&self, p: Prepared) -> Result<ProcessId, EnvError> {
        let program = p.spec.argv[0].clone();
        let id = ProcessId(self.next_id());
        let log_path = self.run_dir.join(format!("process-{}.log", id.0));
        let log = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| exec_error(&program, format!("output log {}: {e}", log_path.display())))?;
        let (reader, writer) = std::io::pipe().map_err(|e| exec_error(&program, e))?;
        let writer2 = writer.try_clone().map_err(|e| exec_error(&program, e))?;
        let mut cmd = self.command(&p)?;
        cmd.process_group(0)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(writer2);
        let child = cmd.spawn().map_err(|e| exec_error(&program, e))?;
        // The command holds the only write ends now: the pipe ends when it (and what it
        // started) close them.
        drop(cmd);
        let process = Arc::new(Process {
            id,
            actor: actor_of(&p),
            argv: p.spec.argv.clone(),
            pid: Pid::from_child(&child),
            started_ms: now_ms(),
            log: log_path,
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let redactor = p.redactor();
        let (a, b) = (process.clone(), process.clone());
        let started = thread::Builder::new()
            .name("environment-bg-output".into())
            .spawn(move || pump(a, reader, log, redactor))
            .and_then(|_| {
                thread::Builder::new()
                    .name("environment-bg-wait".into())
                    .spawn(move || reap(b, child))
            });
        if let Err(e) = started {
            process.kill();
            return Err(exec_error(&program, format!("cannot supervise it: {e}")));
        }
        lock(&self.processes).insert(id, process);
        Ok(id)
    }

    fn process(&self, id: ProcessId) -> Result<Arc<Process>, EnvError> {
        lock(&self.processes)
            .get(&id)
            .cloned()
            .ok_or(EnvError::NoSuchProcess {
                what: "process",
                id: id.0,
            })
    }
}

#[async_trait]
impl BackgroundProcesses for Shell {
    async fn spawn(&self, request: SpawnRequest) -> Result<ProcessId, EnvError> {
        let prepared = self.inner.prepare(&request.command, "spawn").await?;
        let inner = self.inner.clone();
        blocking(move || inner.spawn_background(prepared)).await
    }

    async fn read(&self, id: ProcessId, offset: u64, max: u64) -> Result<OutputChunk, EnvError> {
        let process = self.inner.process(id)?;
        blocking(move || process.read(offset, max)).await
    }

    async fn wait(
        &self,
        id: ProcessId,
        timeout: Option<Duration>,
    ) -> Result<Option<Exit>, EnvError> {
        let process = self.inner.process(id)?;
        blocking(move || Ok(process.wait(timeout))).await
    }

    async fn signal(&self, id: ProcessId, signal: Signal) -> Result<(), EnvError> {
        self.inner.process(id)?.send(signal_of(signal));
        Ok(())
    }

    async fn list(&self) -> Result<Vec<ProcessInfo>, EnvError> {
        Ok(lock(&self.inner.processes)
            .values()
            .map(|p| p.info())
            .collect())
    }
}
