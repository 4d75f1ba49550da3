//! The command line: global options and one subcommand per verb.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// The exit codes, shown at the end of `envctl --help`.
pub const EXIT_CODES: &str = "\
Exit codes:
  0  done
  1  failure (storage, I/O, a damaged environment)
  2  malformed input (arguments, names, paths, payloads, rules)
  3  not found (version, branch, mark, environment, topic, group, receipt, approval, program)
  4  denied by the policy, or it needs an approval first
  5  conflict (stale write, name taken, stale receipt, decided approval, merge with conflicts,
     nothing to undo or redo)
  6  no supervisor is listening where one is required
  7  not available here (no sandboxes on this host; not through a running supervisor)
`exec` and `run` exit with the command's own status once it ran.

Versions are named by an op id or any unique prefix (4+ hex digits), a mark, a branch, or
any of these followed by ~N (N steps back); HEAD is the head of main.

Without a running supervisor every command first captures what changed in the workspace since
the last capture, so nothing done out of band is lost or overwritten. While `envctl run` runs,
log, show, diff, status, mark NAME, restore, undo, merge and exec go through its control
socket; listing marks, branch, effects, policy, queue, gc and verify work on the stores beside
it; a tournament runs its candidates on forks and has the supervisor merge the winner.";

/// envctl: put any agent into an environment — automatic capture, rollback, history, marks,
/// branches, the queue and the policy.
#[derive(Parser, Debug)]
#[command(name = "envctl", version, after_long_help = EXIT_CODES)]
pub struct Cli {
    /// The workspace directory (default: the nearest one with a .environment at or above the
    /// current directory).
    #[arg(
        short = 'C',
        long = "dir",
        value_name = "DIR",
        global = true,
        env = "ENVIRONMENT_DIR"
    )]
    pub chdir: Option<PathBuf>,
    /// Who acts (`kind:name`, e.g. human:alice, agent:coder-1).
    #[arg(long, global = true, env = "ENVIRONMENT_ACTOR")]
    pub actor: Option<String>,
    /// Go through the supervisor listening at this control socket (inside `envctl run
    /// --self-rollback`, ENVIRONMENT_SOCKET names it).
    #[arg(long, global = true, env = "ENVIRONMENT_SOCKET")]
    pub socket: Option<PathBuf>,
    /// Present this capability token with every request (limits what --actor may do).
    #[arg(long, global = true, env = "ENVIRONMENT_TOKEN", value_name = "TOKEN")]
    pub token: Option<String>,
    /// Present this granted approval with every request: retries an action that was held for
    /// an approval (`envctl policy approvals` lists them).
    #[arg(long, global = true, value_name = "ID")]
    pub approval: Option<String>,
    /// Print one JSON document instead of lines.
    #[arg(long, global = true)]
    pub json: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Make DIR an environment (its home in DIR/.environment unless --home) and capture it.
    Init {
        /// The workspace (default: the current directory).
        dir: Option<PathBuf>,
        /// Seed a managed rootfs from a directory or a .tar file.
        #[arg(long)]
        rootfs: Option<PathBuf>,
        /// Keep the environment's home here instead of DIR/.environment.
        #[arg(long)]
        home: Option<PathBuf>,
        /// Share the queue through this PostgreSQL database (a libpq connection string or a
        /// postgresql:// URL, without a password: PGPASSWORD supplies it) with every
        /// environment that names it, on any machine. Kept in the home's stores.toml.
        #[arg(long, value_name = "POSTGRES")]
        shared_queue: Option<String>,
        /// Share the policy (rules, relations, approvals, and the quota and token uses it
        /// spends) through this PostgreSQL database, as --shared-queue does the queue: every
        /// environment that names it is governed by one policy.
        #[arg(long, value_name = "POSTGRES")]
        shared_policy: Option<String>,
        /// Keep the effect log in this PostgreSQL database, as --shared-queue does the queue:
        /// an effect begun on one machine is found, not begun again, on every other.
        #[arg(long, value_name = "POSTGRES")]
        shared_effects: Option<String>,
        /// Keep the history (operations, branches, tree nodes) in this PostgreSQL database,
        /// so that other machines attach working copies of this environment (`envctl
        /// attach`). Needs --shared-blobs; the effect log goes with it unless
        /// --shared-effects names another database. The log must be new.
        #[arg(long, value_name = "POSTGRES", requires = "shared_blobs")]
        shared_log: Option<String>,
        /// Keep the file contents in this bucket (s3://BUCKET/PREFIX; credentials, region and
        /// endpoint from the AWS_* variables), shared by every working copy.
        #[arg(long, value_name = "URL")]
        shared_blobs: Option<String>,
    },
    /// Make DIR (empty or missing) a new working copy of an environment whose history and
    /// blobs are shared (made with `envctl init --shared-log --shared-blobs` on another
    /// machine): the branch's head is written into it, and from then on its changes are
    /// committed into the shared history and the others' written into it.
    Attach {
        /// The stores file naming the shared log and blobs (a copy of stores.toml from the
        /// home of a working copy; it holds no password).
        #[arg(long, value_name = "FILE")]
        stores: PathBuf,
        /// The new working copy.
        dir: PathBuf,
        /// Keep its home here instead of DIR/.environment.
        #[arg(long)]
        home: Option<PathBuf>,
    },
    /// Run an agent under a supervisor: in a sandbox, its changes captured as it works, the
    /// control socket answering; a final capture and a summary at its exit (or at SIGTERM or
    /// SIGINT to envctl, which stop the agent first).
    Run(RunArgs),
    /// Run one command as a recorded operation (in a sandbox when this host allows): its file
    /// changes and its output are stored with it, attributed to --actor.
    Exec(ExecArgs),
    /// The history: key nodes with automatic captures squashed (--all: every operation).
    Log {
        /// Every operation, nothing squashed.
        #[arg(long)]
        all: bool,
        /// The branch (default main).
        #[arg(long, default_value = "main")]
        branch: String,
        /// At most this many entries.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// The changes commands made that their actor may not make: put back in the tree and kept
    /// here with the decision that refused them, newest first.
    Refused {
        /// The branch (default main).
        #[arg(long, default_value = "main")]
        branch: String,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// One operation: who, why, what changed.
    Show {
        /// The version.
        version: String,
    },
    /// What changed between two versions (B defaults to HEAD).
    Diff {
        /// From.
        from: String,
        /// To.
        to: Option<String>,
        /// Only the counts.
        #[arg(long)]
        stat: bool,
        /// Show how this one file changed, line by line (a unified diff).
        #[arg(long, value_name = "PATH", conflicts_with = "stat")]
        file: Option<String>,
    },
    /// Bring the workspace back to a version (appends a rollback; --dry-run previews it).
    Restore {
        /// The version.
        version: String,
        /// Show what would change, change nothing.
        #[arg(long)]
        dry_run: bool,
        /// List every path written or removed (by default: counts by top-level entry).
        #[arg(long)]
        verbose: bool,
    },
    /// Undo the last operation on main not undone yet, in the log and in the workspace: each
    /// undo steps one operation further back (undos and redos are stepped over).
    Undo {
        /// List every path written or removed (by default: counts by top-level entry).
        #[arg(long)]
        verbose: bool,
    },
    /// Redo the last undo not redone yet, in the log and in the workspace.
    Redo {
        /// List every path written or removed (by default: counts by top-level entry).
        #[arg(long)]
        verbose: bool,
    },
    /// Name a version (default HEAD); without NAME, list the marks.
    Mark {
        /// The name.
        name: Option<String>,
        /// The version.
        version: Option<String>,
    },
    /// Create a branch at a version (default HEAD); without NAME, list the branches.
    Branch {
        /// The name.
        name: Option<String>,
        /// The version.
        version: Option<String>,
    },
    /// Merge a branch into main and write the result into the workspace.
    Merge {
        /// The branch.
        branch: String,
    },
    /// Fork candidates from a version, run each in its own sandbox, test each, adopt the winner.
    Tournament(TournamentArgs),
    /// External side effects (--unfinished: in flight or of unknown outcome).
    Effects {
        /// Only the unfinished ones.
        #[arg(long)]
        unfinished: bool,
    },
    /// The policy: rules, decisions, approvals.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// The queue: publish, claim, settle, dead letters.
    #[command(subcommand)]
    Queue(QueueCommand),
    /// Remove content no kept version refers to.
    Gc,
    /// Check the integrity of the stores (the hash chain, the views, the blobs).
    Verify,
    /// Where the environment is, its head, branches, marks, policy and queue.
    Status,
    /// Serve the environment over MCP on stdin/stdout.
    ///
    /// Every tool call is an action of --actor (default agent:mcp) and passes the policy when
    /// one is loaded; while the workspace's supervisor runs, the tools go through it as --actor.
    /// With --socket, they go through that agent's socket, as its agent. Configure it in an MCP
    /// client as the command `envctl -C DIR mcp`, e.g.
    /// `claude mcp add environment -- envctl -C /path/to/project mcp`.
    Mcp,
    /// Serve the environment over HTTP: a JSON API (its OpenAPI document at /openapi.json),
    /// a live event stream, MCP over Streamable HTTP at /mcp, and a web view for people.
    ///
    /// Every request carries a bearer credential: the session token printed at start (it acts
    /// as --actor; `--revoke` ends it), or a capability token of the policy (it acts as its
    /// actor, within its limits). Through the workspace's supervisor when one runs.
    Serve(ServeArgs),
    /// A short tour in a throwaway workspace: an agent works, breaks things, is rolled back.
    Demo {
        /// Keep the workspace in a new directory under this one.
        #[arg(long)]
        keep: Option<PathBuf>,
    },
    /// The workspace monitor (started by the commands themselves when they need one).
    #[command(hide = true)]
    Monitor {
        /// The environment's home.
        #[arg(long)]
        home: PathBuf,
        /// Start it in the background and return.
        #[arg(long)]
        detach: bool,
    },
}

/// Where `run` puts the agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Isolation {
    /// On the host as it is, unconfined, in the workspace.
    None,
    /// In namespaces: the host read-only, the workspace writable, secrets masked.
    Host,
    /// In namespaces with the managed rootfs as its root (fully writable, captured beside the
    /// workspace and rolled back with it while the supervisor runs), the workspace at
    /// /workspace.
    Rootfs,
}

/// The agent's network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Network {
    /// The host's network, shared (the default: package installs and API calls work).
    #[default]
    Host,
    /// A network namespace of its own with only the loopback interface.
    None,
}

/// How the sandbox of `run` and `exec` is opened beyond its defaults.
#[derive(Args, Clone, Debug, Default)]
pub struct SandboxArgs {
    /// The command's network: host (shared, the default) or none (only loopback).
    #[arg(long, value_enum)]
    pub network: Option<Network>,
    /// A further host directory the command may write, at the same path (repeatable), e.g. a
    /// package manager's cache under $HOME. Not captured: only the workspace is.
    #[arg(long = "writable", value_name = "DIR")]
    pub writable: Vec<std::path::PathBuf>,
    /// An environment variable of the caller's passed to the command (repeatable; a trailing
    /// `*` takes every name with that prefix, e.g. `npm_config_*`).
    #[arg(long = "pass-env", value_name = "NAME")]
    pub pass_env: Vec<String>,
    /// The most memory the whole sandbox may use, swap refused (cgroup v2 `memory.max`): bytes,
    /// or with a K, M or G suffix. Needs a delegated cgroup v2 subtree; refused without one.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory: Option<u64>,
    /// The most processes and threads the whole sandbox may hold at once, its own two included
    /// (cgroup v2 `pids.max`). Needs a delegated cgroup v2 subtree; refused without one.
    #[arg(long, value_name = "N")]
    pub max_processes: Option<u64>,
    /// The CPU bandwidth of the whole sandbox, in CPUs (e.g. 0.5 or 2; cgroup v2 `cpu.max`).
    /// Needs a delegated cgroup v2 subtree; refused without one.
    #[arg(long, value_name = "CPUS", value_parser = parse_cpus)]
    pub cpus: Option<u64>,
}

/// `512M`, `2G`, `65536`: bytes.
fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, shift) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 10),
        Some(b'm' | b'M') => (&s[..s.len() - 1], 20),
        Some(b'g' | b'G') => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{s:?} is not a size (bytes, or a number with K, M or G)"))?;
    n.checked_mul(1 << shift)
        .filter(|&b| b > 0)
        .ok_or_else(|| format!("{s:?} is not a usable size"))
}

/// `1.5` CPUs: 1500 thousandths.
fn parse_cpus(s: &str) -> Result<u64, String> {
    let cpus: f64 = s
        .parse()
        .map_err(|_| format!("{s:?} is not a number of CPUs"))?;
    if !(cpus.is_finite() && (0.001..=4096.0).contains(&cpus)) {
        return Err(format!("{s:?}: CPUs must lie between 0.001 and 4096"));
    }
    Ok((cpus * 1000.0).round() as u64)
}

impl SandboxArgs {
    /// Whether any of them was given (a supervisor's sandbox cannot be opened up per command).
    pub fn given(&self) -> bool {
        self.network.is_some()
            || !self.writable.is_empty()
            || !self.pass_env.is_empty()
            || self.memory.is_some()
            || self.max_processes.is_some()
            || self.cpus.is_some()
    }
}

/// `envctl run`.
#[derive(Args, Debug)]
pub struct RunArgs {
    /// Where the agent runs (default: host when this host allows user namespaces, else none).
    #[arg(long, value_enum)]
    pub isolate: Option<Isolation>,
    /// Give the agent the control socket (`ENVIRONMENT_SOCKET`): it may then call history,
    /// show, diff, status, mark, restore, undo, exec and the queue and policy methods (e.g. by
    /// running `envctl restore VERSION` inside), each authorized as --actor. Without it the
    /// agent is not given the socket (ENVIRONMENT_SOCKET names a path that cannot exist), and
    /// in a sandbox it cannot reach it; unconfined (--isolate none) nothing stops it looking.
    #[arg(long)]
    pub self_rollback: bool,
    /// The sandbox's network, writable directories and passed variables.
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// The agent's command.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// `envctl exec`.
#[derive(Args, Debug)]
pub struct ExecArgs {
    /// Why (default: the command line).
    #[arg(long)]
    pub intent: Option<String>,
    /// The sandbox's network, writable directories and passed variables.
    #[command(flatten)]
    pub sandbox: SandboxArgs,
    /// The command.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// `envctl tournament`.
#[derive(Args, Debug)]
pub struct TournamentArgs {
    /// The version to fork from (default HEAD).
    #[arg(long)]
    pub base: Option<String>,
    /// The test each candidate must pass (a shell command, exit 0 passes).
    #[arg(long)]
    pub test: String,
    /// first: the first to pass wins; all: every candidate runs to the end, the first passer
    /// in the order given wins.
    #[arg(long, value_enum, default_value = "first")]
    pub pick: PickArg,
    /// How many candidates run at once.
    #[arg(long, default_value_t = 4)]
    pub jobs: usize,
    /// The candidates, one shell command each (run with /bin/sh -c).
    #[arg(last = true, required = true)]
    pub candidates: Vec<String>,
}

/// How a tournament picks its winner.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PickArg {
    /// The first to pass.
    First,
    /// Every candidate runs; the first passer in the order given.
    All,
}

/// `envctl policy ...`.
#[derive(Subcommand, Debug)]
pub enum PolicyCommand {
    /// Load a TOML rule file (replaces the rules).
    Load {
        /// The rule file.
        file: PathBuf,
    },
    /// Decide ACTOR ACTION RESOURCE without spending anything (exit 4 unless allowed).
    Check(Query),
    /// Decide and explain why, in words.
    Explain(Query),
    /// What ACTOR may do under RESOURCE (default: everything).
    May {
        /// The actor asked about (not --actor, who asks).
        #[arg(id = "subject", value_name = "ACTOR")]
        actor: String,
        /// The resource (default: the whole workspace).
        resource: Option<String>,
    },
    /// Add ACTOR to GROUP (a `group:` or `role:` id).
    Member {
        /// The actor.
        member: String,
        /// The group.
        group: String,
    },
    /// Approval requests; `grant ID` / `reject ID` decides one as --actor.
    Approvals {
        /// grant or reject.
        #[arg(value_enum)]
        decision: Option<ApprovalDecision>,
        /// The approval request.
        id: Option<String>,
    },
}

/// An approval decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ApprovalDecision {
    /// Let it through (once).
    Grant,
    /// Refuse it.
    Reject,
}

/// A policy question.
#[derive(Args, Debug)]
pub struct Query {
    /// The actor asked about (`kind:name`; not --actor, who asks).
    #[arg(id = "subject", value_name = "ACTOR")]
    pub actor: String,
    /// read, write, delete, execute, publish, consume, approve, delegate, or a declared one.
    pub action: String,
    /// `path:GLOB` (or a bare path), `prefix:P`, `object:KIND/KEY`, `branch:B`, `topic:T`,
    /// `secret:S`, `service:URL`, `program:PROG ARGS...`, or `environment`.
    pub resource: String,
}

/// `envctl queue ...`.
#[derive(Subcommand, Debug)]
pub enum QueueCommand {
    /// Publish PAYLOAD (text, or @FILE) to TOPIC (created if new).
    Publish {
        /// The topic.
        topic: String,
        /// The payload, or @FILE.
        payload: String,
        /// Ordering key: same-key messages are delivered one at a time, in order.
        #[arg(long)]
        key: Option<String>,
        /// Dedup id: a repeat within the window is accepted and not delivered again.
        #[arg(long)]
        dedup: Option<String>,
    },
    /// Subscribe GROUP to topics (creating the group and topics).
    Subscribe {
        /// The consumer group.
        group: String,
        /// The topics.
        #[arg(required = true)]
        topics: Vec<String>,
    },
    /// Lease messages of GROUP.
    Claim {
        /// The consumer group.
        group: String,
        /// Lease length in seconds.
        #[arg(long, default_value_t = 60)]
        lease: u64,
        /// At most this many messages.
        #[arg(long, default_value_t = 1)]
        max: u32,
    },
    /// Acknowledge a receipt: done, never delivered to the group again.
    Ack {
        /// The receipt (DELIVERY.TOKEN).
        receipt: String,
        /// Also lease up to N further messages of the same group, in the same step.
        #[arg(long, value_name = "N")]
        next: Option<u32>,
        /// Lease length in seconds of those further messages.
        #[arg(long, default_value_t = 60)]
        lease: u64,
    },
    /// Give a lease back (retried after a backoff).
    Nack {
        /// The receipt.
        receipt: String,
        /// Why.
        #[arg(long)]
        error: Option<String>,
    },
    /// The dead letters of GROUP.
    Dead {
        /// The consumer group.
        group: String,
    },
    /// Send GROUP's dead letters back to the queue.
    Redrive {
        /// The consumer group.
        group: String,
    },
    /// Depth, leases and dead letters per topic and group.
    Stats,
    /// The leases in flight: who holds which message, on which attempt, until when.
    Leases {
        /// Only this consumer group's.
        #[arg(long)]
        group: Option<String>,
    },
}

/// `envctl serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Where to listen (a loopback address unless --behind-proxy; port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: std::net::SocketAddr,
    /// Allow a non-loopback address: the server then sits behind a reverse proxy that ends
    /// TLS and forwards the original Host (see the README).
    #[arg(long)]
    pub behind_proxy: bool,
    /// Requests a second each actor may make on average, in bursts of twice as many (0: no
    /// limit).
    #[arg(long, value_name = "PER_SECOND", default_value_t = 2000)]
    pub rate_limit: u32,
    /// Also accept this Host (a proxy's public name, `name` or `name:port`).
    #[arg(long = "host", value_name = "HOST")]
    pub hosts: Vec<String>,
    /// Open the web view in a browser.
    #[arg(long)]
    pub open: bool,
    /// End the session token of the last `serve` (a running server refuses it at once) and
    /// exit.
    #[arg(long)]
    pub revoke: bool,
}
