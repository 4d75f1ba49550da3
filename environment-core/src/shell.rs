//! The Shell capabilities: optional traits an environment implementation may offer, each on its
//! own, so an adapter holds exactly what it can use (`Arc<dyn ShellExec>`, …) and degrades
//! cleanly where one is missing ([`crate::Capability`]).
//!
//! - [`ShellExec`]: run a command to its end as one recorded operation — authorized as an
//!   `execute` action on the program, its output stored as blobs, the files it changed captured
//!   at its end and attributed to it.
//! - [`BackgroundProcesses`]: spawn a long-running command and come back to its output later,
//!   from any offset; the process belongs to the environment, not to the caller's connection.
//! - [`PtySessions`]: a terminal that survives the client going away; re-attaching returns what
//!   was printed meanwhile.
//! - [`SecretProvider`]: resolves a [`SecretRef`] at the moment a command starts, into that
//!   command's environment only; the value is redacted from everything stored.
//!
//! Identifiers of processes and sessions are the environment's own numbers, never OS pids, so
//! they stay unambiguous after a pid is reused.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::authz::ActorId;
use crate::error::{EnvError, Result};
use crate::hash::Hash;
use crate::local::RefusedChange;
use crate::op::OpId;
use crate::value::{SecretRef, SecretValue};

/// The default cap on the stored bytes of each output stream of a command (1 MiB).
pub const DEFAULT_OUTPUT_LIMIT: u64 = 1 << 20;

/// How a command is started: the parts shared by [`ExecRequest`], [`SpawnRequest`] and
/// [`PtyRequest`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommandSpec {
    /// Who runs it: the operation's actor and the subject of the `execute` authorization.
    pub actor: ActorId,
    /// Why, in the actor's words; becomes the operation's intent. Empty means "the command line".
    #[serde(default)]
    pub intent: String,
    /// The program and its arguments; the program is looked up on `PATH` when it has no `/`.
    pub argv: Vec<String>,
    /// The working directory relative to the workspace root (`None` or empty: the root).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Environment variables added to (or replacing) the sandbox's own.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Environment variables whose values are secrets, resolved only when the command starts and
    /// redacted from everything stored as `[redacted:NAME]`.
    #[serde(default)]
    pub secrets: BTreeMap<String, SecretRef>,
    /// What the request presented beyond the actor's own rights (a granted approval, a
    /// capability token): the command's changes in the tree are decided with it. Never
    /// stored or sent: it belongs to the request that runs the command.
    #[serde(skip)]
    pub credentials: crate::local::Credentials,
}

impl CommandSpec {
    /// A command run by `actor`.
    pub fn new<S: Into<String>>(actor: ActorId, argv: impl IntoIterator<Item = S>) -> CommandSpec {
        CommandSpec {
            actor,
            intent: String::new(),
            argv: argv.into_iter().map(Into::into).collect(),
            cwd: None,
            env: BTreeMap::new(),
            secrets: BTreeMap::new(),
            credentials: crate::local::Credentials::default(),
        }
    }

    /// The intent to record: the one given, or the command line.
    pub fn intent_text(&self) -> String {
        if self.intent.trim().is_empty() {
            command_line(&self.argv)
        } else {
            self.intent.clone()
        }
    }
}

/// The command line as a shell would read it back (arguments quoted where needed).
pub fn command_line(argv: &[String]) -> String {
    argv.iter()
        .map(|a| {
            let plain = !a.is_empty()
                && a.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,+@%^".contains(&b));
            if plain {
                a.clone()
            } else {
                format!("'{}'", a.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

macro_rules! spec_builders {
    ($t:ty) => {
        impl $t {
            /// Sets the intent recorded with the command (default: the command line).
            pub fn intent(mut self, text: impl Into<String>) -> Self {
                self.command.intent = text.into();
                self
            }

            /// Sets the working directory, relative to the workspace root.
            pub fn cwd(mut self, dir: impl Into<String>) -> Self {
                self.command.cwd = Some(dir.into());
                self
            }

            /// Adds an environment variable.
            pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
                self.command.env.insert(name.into(), value.into());
                self
            }

            /// Adds an environment variable whose value is a secret, resolved at start.
            pub fn secret(mut self, name: impl Into<String>, secret: SecretRef) -> Self {
                self.command.secrets.insert(name.into(), secret);
                self
            }
        }
    };
}

/// A command to run to its end as one recorded operation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// What to run, as whom, where.
    #[serde(flatten)]
    pub command: CommandSpec,
    /// Bytes written to the command's standard input (then closed).
    #[serde(default)]
    pub stdin: Vec<u8>,
    /// Milliseconds after which the command and everything it started are killed.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// The most bytes of each output stream that are stored; the rest is counted, not kept.
    #[serde(default = "default_output_limit")]
    pub output_limit: u64,
    /// Cancels the command from elsewhere: it and everything it started are killed, and it is
    /// recorded as [`Exit::Cancelled`] with what it changed until then.
    #[serde(skip)]
    pub cancel: Cancel,
}

/// A cancellation shared between whoever runs a command and whoever may call it off (a
/// client that went away, a caller's timeout). Cloning shares it.
#[derive(Clone, Debug, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// A cancellation not called yet.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Calls the command off.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether it was called off.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Every cancellation is alike as a value: a request's identity does not depend on who may
/// call it off.
impl PartialEq for Cancel {
    fn eq(&self, _: &Cancel) -> bool {
        true
    }
}

impl Eq for Cancel {}

fn default_output_limit() -> u64 {
    DEFAULT_OUTPUT_LIMIT
}

impl ExecRequest {
    /// A command run by `actor`, with no stdin, no timeout and the default output limit.
    pub fn new<S: Into<String>>(actor: ActorId, argv: impl IntoIterator<Item = S>) -> ExecRequest {
        ExecRequest {
            command: CommandSpec::new(actor, argv),
            stdin: Vec::new(),
            timeout_ms: None,
            output_limit: DEFAULT_OUTPUT_LIMIT,
            cancel: Cancel::new(),
        }
    }

    /// Sets the standard input.
    pub fn stdin(mut self, bytes: impl Into<Vec<u8>>) -> ExecRequest {
        self.stdin = bytes.into();
        self
    }

    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> ExecRequest {
        self.timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Lets `cancel` call the command off.
    pub fn cancelled_by(mut self, cancel: Cancel) -> ExecRequest {
        self.cancel = cancel;
        self
    }

    /// Sets the output limit (bytes stored per stream).
    pub fn output_limit(mut self, bytes: u64) -> ExecRequest {
        self.output_limit = bytes;
        self
    }
}

spec_builders!(ExecRequest);

/// How a command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal (by number) ended it.
    Signal(i32),
    /// It ran past its timeout and was killed, with everything it started.
    TimedOut,
    /// It was called off (see [`Cancel`]) and killed, with everything it started.
    Cancelled,
}

impl Exit {
    /// Whether it exited with code 0.
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit code {c}"),
            Exit::Signal(s) => write!(f, "killed by signal {s}"),
            Exit::TimedOut => f.write_str("timed out"),
            Exit::Cancelled => f.write_str("cancelled"),
        }
    }
}

/// One output stream of a command as it was stored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredOutput {
    /// The stored bytes in the blob store (after secret redaction).
    pub blob: Hash,
    /// How many bytes the command wrote to the stream.
    pub total: u64,
    /// How many bytes were stored (at most the output limit).
    pub stored: u64,
    /// Whether the stored bytes are only the beginning of the output.
    pub truncated: bool,
    /// The first few hundred bytes, decoded as UTF-8 with replacement, for a quick look.
    pub preview: String,
}

/// What a recorded command did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecOutcome {
    /// How it ended.
    pub exit: Exit,
    /// Its standard output.
    pub stdout: StoredOutput,
    /// Its standard error.
    pub stderr: StoredOutput,
    /// The operation that records it, its output and the files it changed.
    pub op: OpId,
    /// How many workspace paths (files, directories, links) it created, changed or deleted.
    pub files_changed: u64,
    /// How long it ran, in milliseconds.
    pub duration_ms: u64,
    /// The changes its actor may not make: not recorded in its operation, kept as refused with
    /// the decision, and put back in the tree to their value before the command.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refused: Vec<RefusedChange>,
}

/// Runs commands to their end, each as one recorded operation.
#[async_trait]
pub trait ShellExec: Send + Sync {
    /// Runs a command: authorize (`execute` on the program), run with the request's stdin,
    /// timeout and output limit, store its output, capture the files it changed and record all
    /// of it as one operation. A refused command does not run and records nothing. A command
    /// that fails or times out is still recorded (flagged failed) and is not an error.
    async fn exec(&self, request: ExecRequest) -> Result<ExecOutcome>;
}

/// The environment's number for a background process (never an OS pid).
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
)]
#[serde(transparent)]
pub struct ProcessId(pub u64);

impl fmt::Display for ProcessId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "process {}", self.0)
    }
}

/// A long-running command to start in the background. Its standard input is empty; its standard
/// output and error are kept together, in order, in one log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpawnRequest {
    /// What to run, as whom, where.
    #[serde(flatten)]
    pub command: CommandSpec,
}

impl SpawnRequest {
    /// A background command run by `actor`.
    pub fn new<S: Into<String>>(actor: ActorId, argv: impl IntoIterator<Item = S>) -> SpawnRequest {
        SpawnRequest {
            command: CommandSpec::new(actor, argv),
        }
    }
}

spec_builders!(SpawnRequest);

/// A piece of a background process's output log.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputChunk {
    /// The bytes from the offset asked for.
    pub bytes: Vec<u8>,
    /// The offset to ask for next.
    pub next_offset: u64,
    /// Whether the process has ended and everything it wrote has been read.
    pub eof: bool,
}

/// A signal to send to a process and everything it started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Signal {
    /// SIGINT, as from Ctrl-C.
    Interrupt,
    /// SIGTERM: asks it to end.
    Terminate,
    /// SIGKILL: ends it.
    Kill,
    /// SIGHUP.
    Hangup,
    /// SIGQUIT.
    Quit,
    /// SIGUSR1.
    User1,
    /// SIGUSR2.
    User2,
    /// SIGSTOP: pauses it.
    Stop,
    /// SIGCONT: resumes it.
    Continue,
}

/// What is known about a background process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ProcessInfo {
    /// Its number.
    pub id: ProcessId,
    /// Who started it.
    pub actor: ActorId,
    /// Its command line.
    pub argv: Vec<String>,
    /// Its OS process id (in the supervisor's pid namespace).
    pub pid: u32,
    /// When it started, in milliseconds since the epoch.
    pub started_ms: i64,
    /// How it ended, if it has.
    pub exit: Option<Exit>,
    /// How many bytes of output it has written so far.
    pub output_len: u64,
}

/// Long-running commands that outlive the caller that started them.
#[async_trait]
pub trait BackgroundProcesses: Send + Sync {
    /// Starts a command (authorized as `execute` on the program) and returns its number.
    async fn spawn(&self, request: SpawnRequest) -> Result<ProcessId>;
    /// Up to `max` bytes of its output log from `offset`.
    async fn read(&self, id: ProcessId, offset: u64, max: u64) -> Result<OutputChunk>;
    /// Waits up to `timeout` (`None`: until it ends) for it to end; `None` if it still runs.
    async fn wait(&self, id: ProcessId, timeout: Option<Duration>) -> Result<Option<Exit>>;
    /// Sends a signal to it and everything it started.
    async fn signal(&self, id: ProcessId, signal: Signal) -> Result<()>;
    /// Every process started and not yet forgotten, running or ended.
    async fn list(&self) -> Result<Vec<ProcessInfo>>;
}

/// The environment's number for a terminal session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "session {}", self.0)
    }
}

/// A terminal session to open: a program (typically a shell) on a new pseudo-terminal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyRequest {
    /// What to run, as whom, where.
    #[serde(flatten)]
    pub command: CommandSpec,
    /// Terminal rows.
    pub rows: u16,
    /// Terminal columns.
    pub cols: u16,
    /// Milliseconds without a write, read or attach after which the session is closed
    /// (`None`: only an explicit close ends it).
    #[serde(default)]
    pub idle_timeout_ms: Option<u64>,
}

impl PtyRequest {
    /// A 24×80 terminal running `argv` for `actor`, with no idle timeout.
    pub fn new<S: Into<String>>(actor: ActorId, argv: impl IntoIterator<Item = S>) -> PtyRequest {
        PtyRequest {
            command: CommandSpec::new(actor, argv),
            rows: 24,
            cols: 80,
            idle_timeout_ms: None,
        }
    }

    /// Sets the terminal size.
    pub fn size(mut self, rows: u16, cols: u16) -> PtyRequest {
        self.rows = rows;
        self.cols = cols;
        self
    }

    /// Sets the idle timeout.
    pub fn idle_timeout(mut self, timeout: Duration) -> PtyRequest {
        self.idle_timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        self
    }
}

spec_builders!(PtyRequest);

/// Terminal output since the session's read cursor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtyOutput {
    /// The bytes, starting at `offset` in the session's whole output.
    pub bytes: Vec<u8>,
    /// Where these bytes start in the session's whole output.
    pub offset: u64,
    /// Bytes between the cursor and `offset` that the bounded buffer no longer held.
    pub missed: u64,
    /// How the program ended, if it has.
    pub exit: Option<Exit>,
}

/// What is known about a terminal session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfo {
    /// Its number.
    pub id: SessionId,
    /// Who opened it.
    pub actor: ActorId,
    /// Its command line.
    pub argv: Vec<String>,
    /// Whether a client is attached.
    pub attached: bool,
    /// Its size (rows, columns).
    pub size: (u16, u16),
    /// How the program ended, if it has.
    pub exit: Option<Exit>,
}

/// Terminal sessions that survive a client going away.
#[async_trait]
pub trait PtySessions: Send + Sync {
    /// Opens a session (authorized as `execute` on the program); the caller is attached.
    async fn open(&self, request: PtyRequest) -> Result<SessionId>;
    /// Types into the terminal.
    async fn write(&self, id: SessionId, bytes: &[u8]) -> Result<()>;
    /// The output since the last read (or attach), moving the cursor past it.
    async fn read(&self, id: SessionId) -> Result<PtyOutput>;
    /// Changes the terminal's size (the program gets SIGWINCH).
    async fn resize(&self, id: SessionId, rows: u16, cols: u16) -> Result<()>;
    /// The client goes away; the program keeps running and its output keeps being kept.
    async fn detach(&self, id: SessionId) -> Result<()>;
    /// A client comes back: returns everything since the last read, like [`PtySessions::read`].
    async fn attach(&self, id: SessionId) -> Result<PtyOutput>;
    /// Ends the session: hangs up the terminal, kills the program if it lingers.
    async fn close(&self, id: SessionId) -> Result<Option<Exit>>;
    /// The open sessions.
    async fn list(&self) -> Result<Vec<SessionInfo>>;
}

/// Resolves secret references into values, at the moment a command starts. Implementations sit
/// in front of a vault, a keyring or the supervisor's own environment.
#[async_trait]
pub trait SecretProvider: Send + Sync {
    /// The value of `secret`, or [`EnvError::SecretUnavailable`].
    async fn resolve(&self, secret: &SecretRef) -> Result<SecretValue>;
}

/// Secrets held in the supervising process's own environment variables (provider `env`): the
/// reference's name is the variable's name.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessEnvSecrets;

#[async_trait]
impl SecretProvider for ProcessEnvSecrets {
    async fn resolve(&self, secret: &SecretRef) -> Result<SecretValue> {
        if secret.provider != "env" {
            return Err(EnvError::SecretUnavailable {
                name: secret.name.clone(),
                detail: format!("provider {:?} is not `env`", secret.provider),
            });
        }
        std::env::var(&secret.name)
            .map(SecretValue::new)
            .map_err(|e| EnvError::SecretUnavailable {
                name: secret.name.clone(),
                detail: e.to_string(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_through_json_with_defaults() {
        let actor = ActorId::new("agent:a").unwrap();
        let r = ExecRequest::new(actor.clone(), ["pip", "install", "x"])
            .cwd("sub")
            .timeout(Duration::from_secs(2))
            .secret(
                "TOKEN",
                SecretRef {
                    name: "T".into(),
                    provider: "env".into(),
                },
            );
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<ExecRequest>(&json).unwrap(), r);
        let minimal: ExecRequest =
            serde_json::from_str(r#"{"actor":"agent:a","argv":["true"]}"#).unwrap();
        assert_eq!(minimal, ExecRequest::new(actor, ["true"]));
        assert_eq!(
            serde_json::to_string(&Exit::TimedOut).unwrap(),
            "\"timed_out\""
        );
        assert_eq!(
            serde_json::to_string(&Exit::Code(3)).unwrap(),
            r#"{"code":3}"#
        );
    }

    #[test]
    fn the_default_intent_is_the_command_line() {
        let actor = ActorId::new("agent:a").unwrap();
        let spec = CommandSpec::new(actor, ["sh", "-c", "echo 'hi there'"]);
        assert_eq!(spec.intent_text(), r"sh -c 'echo '\''hi there'\'''");
    }
}
