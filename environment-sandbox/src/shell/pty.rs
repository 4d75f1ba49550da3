//! Durable terminal sessions: a program on a pseudo-terminal whose output is kept in a bounded
//! buffer with absolute offsets, and a read cursor per session — so a client that detaches and
//! comes back gets what was printed meanwhile.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use environment_core::{
    ActorId, EnvError, Exit, PtyOutput, PtyRequest, PtySessions, SessionId, SessionInfo,
};
use rustix::process::{Pid, Signal};
use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;

use super::exec::{exit_of, wait_exited};
use super::redact::Redactor;
use super::{Inner, Prepared, Shell, actor_of, blocking, exec_error, lock};

/// How much output a session keeps for a client that is away (1 MiB); older output is dropped
/// and the next read says how much was missed.
const BUFFER: usize = 1 << 20;

/// How long a hung-up program has to end before it is killed.
const HANGUP_GRACE: Duration = Duration::from_millis(500);

struct State {
    /// Output not yet dropped: bytes `start..start + buf.len()` of the whole output.
    buf: VecDeque<u8>,
    start: u64,
    /// Where the next read starts.
    cursor: u64,
    attached: bool,
    size: (u16, u16),
    exit: Option<Exit>,
    last_activity: Instant,
    closed: bool,
}

impl State {
    fn end(&self) -> u64 {
        self.start + self.buf.len() as u64
    }

    /// Appends output, dropping the oldest beyond the buffer's capacity.
    fn append(&mut self, bytes: &[u8], capacity: usize) {
        self.buf.extend(bytes);
        let over = self.buf.len().saturating_sub(capacity);
        if over > 0 {
            self.buf.drain(..over);
            self.start += over as u64;
        }
    }

    fn take_since_cursor(&mut self) -> PtyOutput {
        let from = self.cursor.max(self.start);
        let missed = from - self.cursor;
        let skip = (from - self.start) as usize;
        let bytes: Vec<u8> = self.buf.iter().skip(skip).copied().collect();
        self.cursor = self.end();
        self.last_activity = Instant::now();
        PtyOutput {
            bytes,
            offset: from,
            missed,
            exit: self.exit,
        }
    }
}

/// One terminal session.
pub(crate) struct Session {
    id: SessionId,
    actor: ActorId,
    argv: Vec<String>,
    pid: Pid,
    master: File,
    idle: Option<Duration>,
    state: Mutex<State>,
    exited: std::sync::Condvar,
}

impl Session {
    /// Hangs up: SIGHUP to the session's process group, SIGKILL if it lingers. Does not wait.
    fn hang_up(&self) {
        let mut state = lock(&self.state);
        state.closed = true;
        if state.exit.is_none() {
            let _ = rustix::process::kill_process_group(self.pid, Signal::HUP);
            let _ = rustix::process::kill_process_group(self.pid, Signal::CONT);
        }
    }

    /// Ends the program and its process group at once (the shell is going away).
    pub(crate) fn kill(&self) {
        self.hang_up();
        let state = lock(&self.state);
        if state.exit.is_none() {
            let _ = rustix::process::kill_process_group(self.pid, Signal::KILL);
        }
    }

    /// Hangs up and waits for the program to end (killing it after a grace period).
    fn close(&self) -> Option<Exit> {
        self.hang_up();
        let deadline = Instant::now() + HANGUP_GRACE;
        let mut state = lock(&self.state);
        let mut killed = false;
        while state.exit.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                if killed {
                    // The kill is delivered; the reaper is only late. Not worth blocking on.
                    let (s, _) = self
                        .exited
                        .wait_timeout(state, HANGUP_GRACE)
                        .unwrap_or_else(|p| p.into_inner());
                    return s.exit;
                }
                let _ = rustix::process::kill_process_group(self.pid, Signal::KILL);
                killed = true;
                continue;
            }
            state = self
                .exited
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        state.exit
    }

    fn info(&self) -> SessionInfo {
        let s = lock(&self.state);
        SessionInfo {
            id: self.id,
            actor: self.actor.clone(),
            argv: self.argv.clone(),
            attached: s.attached,
            size: s.size,
            exit: s.exit,
        }
    }

    fn touch(&self) {
        lock(&self.state).last_activity = Instant::now();
    }
}

/// Opens a pseudo-terminal pair: (master, slave), both close-on-exec.
fn open_pty(rows: u16, cols: u16) -> std::io::Result<(OwnedFd, OwnedFd)> {
    let master =
        rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let name = rustix::pty::ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    rustix::termios::tcsetwinsize(&master, winsize(rows, cols))?;
    Ok((master, slave))
}

fn winsize(rows: u16, cols: u16) -> Winsize {
    Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    }
}

/// Appends terminal output to the session's buffer until the terminal closes.
fn pump(session: Arc<Session>, mut master: File, mut redactor: Redactor) {
    let mut buf = vec![0u8; 16 << 10];
    let append = |bytes: &[u8]| lock(&session.state).append(bytes, BUFFER);
    loop {
        match master.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => append(&redactor.push(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // EIO: every process holding the terminal has closed it.
            Err(_) => break,
        }
    }
    append(&redactor.finish());
}

/// Reaps the program (under the state lock, so a signal never reaches a reused group id).
fn reap(session: Arc<Session>, mut child: std::process::Child) {
    wait_exited(session.pid);
    let mut state = lock(&session.state);
    state.exit = Some(child.wait().map(exit_of).unwrap_or(Exit::Code(-1)));
    drop(state);
    session.exited.notify_all();
}

/// Closes the session once nobody has touched it for its idle timeout.
fn watch_idle(session: Arc<Session>, shell: Weak<Inner>, idle: Duration) {
    loop {
        let due = {
            let s = lock(&session.state);
            if s.closed {
                return;
            }
            s.last_activity + idle
        };
        let now = Instant::now();
        if now >= due {
            break;
        }
        thread::sleep((due - now).min(Duration::from_millis(200)));
    }
    if let Some(inner) = shell.upgrade() {
        lock(&inner.sessions).remove(&session.id);
    }
    tracing::info!(
        id = session.id.0,
        "terminal session closed after its idle timeout"
    );
    session.close();
}

impl Inner {
    fn open_session(
        self: &Arc<Self>,
        mut p: Prepared,
        req: &PtyRequest,
    ) -> Result<SessionId, EnvError> {
        p.spec
            .env
            .entry("TERM".into())
            .or_insert_with(|| "xterm-256color".into());
        let program = p.spec.argv[0].clone();
        let (master, slave) = open_pty(req.rows, req.cols)
            .map_err(|e| exec_error(&program, format!("cannot open a terminal: {e}")))?;
        let io = |e: std::io::Error| exec_error(&program, e);
        let (s1, s2) = (
            slave.try_clone().map_err(io)?,
            slave.try_clone().map_err(io)?,
        );
        let mut cmd = self.command_with(&p, |cmd| {
            cmd.stdin(Stdio::from(slave))
                .stdout(Stdio::from(s1))
                .stderr(Stdio::from(s2));
            // SAFETY: between fork and exec only async-signal-safe system calls run here
            // (setsid, ioctl), touching no memory shared with the parent; fd 0 borrowed for
            // the ioctl is the terminal, set up as stdin before the hook runs.
            #[allow(unsafe_code)]
            unsafe {
                use std::os::unix::process::CommandExt;
                cmd.pre_exec(|| {
                    // A new session whose controlling terminal is the pty on stdin: job
                    // control and SIGHUP on hang-up work as in any terminal.
                    rustix::process::setsid()?;
                    // fd 0 is the terminal, open for the whole life of this process.
                    let stdin = std::os::fd::BorrowedFd::borrow_raw(0);
                    rustix::process::ioctl_tiocsctty(stdin)?;
                    Ok(())
                });
            }
        })?;
        let child = cmd.spawn().map_err(io)?;
        // The child holds the terminal's slave side now; ours must close so the master sees
        // the end when the child's side closes.
        drop(cmd);
        let reader = File::from(master.try_clone().map_err(io)?);
        let id = SessionId(self.next_id());
        let session = Arc::new(Session {
            id,
            actor: actor_of(&p),
            argv: p.spec.argv.clone(),
            pid: Pid::from_child(&child),
            master: File::from(master),
            idle: req.idle_timeout_ms.map(Duration::from_millis),
            state: Mutex::new(State {
                buf: VecDeque::new(),
                start: 0,
                cursor: 0,
                attached: true,
                size: (req.rows, req.cols),
                exit: None,
                last_activity: Instant::now(),
                closed: false,
            }),
            exited: std::sync::Condvar::new(),
        });
        let redactor = p.redactor();
        let (a, b) = (session.clone(), session.clone());
        let mut started = thread::Builder::new()
            .name("environment-pty-output".into())
            .spawn(move || pump(a, reader, redactor))
            .and_then(|_| {
                thread::Builder::new()
                    .name("environment-pty-wait".into())
                    .spawn(move || reap(b, child))
            })
            .map(|_| ());
        if let (Ok(()), Some(idle)) = (&started, session.idle) {
            let (c, weak) = (session.clone(), Arc::downgrade(self));
            started = thread::Builder::new()
                .name("environment-pty-idle".into())
                .spawn(move || watch_idle(c, weak, idle))
                .map(|_| ());
        }
        if let Err(e) = started {
            session.hang_up();
            return Err(exec_error(&program, format!("cannot supervise it: {e}")));
        }
        lock(&self.sessions).insert(id, session);
        Ok(id)
    }

    fn session(&self, id: SessionId) -> Result<Arc<Session>, EnvError> {
        lock(&self.sessions)
            .get(&id)
            .cloned()
            .ok_or(EnvError::NoSuchProcess {
                what: "session",
                id: id.0,
            })
    }
}

#[async_trait]
impl PtySessions for Shell {
    async fn open(&self, request: PtyRequest) -> Result<SessionId, EnvError> {
        let prepared = self.inner.prepare(&request.command, "pty").await?;
        let inner = self.inner.clone();
        blocking(move || inner.open_session(prepared, &request)).await
    }

    async fn write(&self, id: SessionId, bytes: &[u8]) -> Result<(), EnvError> {
        let session = self.inner.session(id)?;
        session.touch();
        let bytes = bytes.to_vec();
        blocking(move || {
            (&session.master)
                .write_all(&bytes)
                .map_err(|e| exec_error(&session.argv[0], format!("terminal write: {e}")))
        })
        .await
    }

    async fn read(&self, id: SessionId) -> Result<PtyOutput, EnvError> {
        let session = self.inner.session(id)?;
        let out = lock(&session.state).take_since_cursor();
        Ok(out)
    }

    async fn resize(&self, id: SessionId, rows: u16, cols: u16) -> Result<(), EnvError> {
        let session = self.inner.session(id)?;
        rustix::termios::tcsetwinsize(&session.master, winsize(rows, cols))
            .map_err(|e| exec_error(&session.argv[0], format!("terminal resize: {e}")))?;
        let mut s = lock(&session.state);
        s.size = (rows, cols);
        s.last_activity = Instant::now();
        Ok(())
    }

    async fn detach(&self, id: SessionId) -> Result<(), EnvError> {
        let session = self.inner.session(id)?;
        let mut s = lock(&session.state);
        s.attached = false;
        s.last_activity = Instant::now();
        Ok(())
    }

    async fn attach(&self, id: SessionId) -> Result<PtyOutput, EnvError> {
        let session = self.inner.session(id)?;
        let mut s = lock(&session.state);
        s.attached = true;
        Ok(s.take_since_cursor())
    }

    async fn close(&self, id: SessionId) -> Result<Option<Exit>, EnvError> {
        let session = self.inner.session(id)?;
        lock(&self.inner.sessions).remove(&id);
        blocking(move || Ok(session.close())).await
    }

    async fn list(&self) -> Result<Vec<SessionInfo>, EnvError> {
        Ok(lock(&self.inner.sessions)
            .values()
            .map(|s| s.info())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        State {
            buf: VecDeque::new(),
            start: 0,
            cursor: 0,
            attached: true,
            size: (24, 80),
            exit: None,
            last_activity: Instant::now(),
            closed: false,
        }
    }

    #[test]
    fn a_reader_gets_what_is_new_and_learns_what_the_buffer_dropped() {
        let mut s = state();
        s.append(b"hello ", 8);
        let first = s.take_since_cursor();
        assert_eq!(
            (first.bytes.as_slice(), first.offset, first.missed),
            (&b"hello "[..], 0, 0)
        );
        // Away while 12 bytes arrive into an 8-byte buffer: the 4 oldest are gone.
        s.append(b"world, again", 8);
        let back = s.take_since_cursor();
        assert_eq!(back.bytes, b"d, again");
        assert_eq!(back.offset, 10);
        assert_eq!(back.missed, 4);
        let empty = s.take_since_cursor();
        assert!(empty.bytes.is_empty());
        assert_eq!((empty.offset, empty.missed), (18, 0));
    }
}
