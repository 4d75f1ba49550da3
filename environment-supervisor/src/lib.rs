//! The supervisor: runs an agent, captures everything it changes, and answers it on a control
//! socket.
//!
//! A [`Supervisor`] holds the environment, a [`Tracker`] with automatic capture over the
//! workspace, and a Unix socket speaking JSON-RPC 2.0 (one message per line; the methods, their
//! parameters, results and error codes are published by [`schema`]). It runs outside
//! the rollback scope: its database, blobs and socket live under the environment's home, which
//! must not be inside the workspace.
//!
//! Every request on the socket is authorized through core's `Authorizer` port (the policy) as
//! the agent's actor, with the request's capability token or the one the agent was given,
//! before anything happens; a refusal is an error whose `data.for_agent` says first that the
//! action did NOT happen.
//!
//! Commands go through the socket too: `exec` runs one in the sandbox as a recorded operation
//! (output stored, changed files captured and attributed to it), `process.*` keeps background
//! processes, `pty.*` terminal sessions that survive a reconnect — the sandbox's
//! [`Shell`](environment_sandbox::Shell), run through the same launcher as the agent, unless
//! [`SupervisorConfig::shell`] is off or [`Supervisor::attach_shell`] replaces it.
//!
//! **Self-rollback**: the agent calls `restore` on the socket; the workspace is restored while
//! the agent keeps running (same pid) and the answer carries the new version. **A rollback from
//! outside** ([`Supervisor::rollback`], for a human or a CLI) chooses a [`RollbackMode`]: keep
//! the agent running (it sees its files change under it, as with a self-rollback), or stop it,
//! restore, and start it again with the same command — for agents that cache what they read.
//!
//! ```no_run
//! use std::sync::Arc;
//! use environment_core::ActorId;
//! use environment_supervisor::{AgentSpec, Supervisor, SupervisorConfig};
//! use environment_sandbox::Unconfined;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let config = SupervisorConfig::new(
//!     "/var/lib/env/home",
//!     "/home/me/project",
//!     Arc::new(Unconfined::new("/home/me/project")),
//!     ActorId::new("agent:coder")?,
//! );
//! let supervisor = Supervisor::open(config)?;
//! let exit = supervisor.run_agent(AgentSpec::new(["sh", "-c", "echo hi > hello.txt"]))?;
//! let summary = supervisor.shutdown()?;
//! println!("agent exit {:?}; {} file(s) changed", exit.code, summary.files_changed);
//! # Ok(()) }
//! ```

mod agent;
pub mod control;
pub mod methods;
pub mod rpc;
mod server;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use environment_core::{
    ActorId, AllowAll, Authorizer, EnvError, Governance, Intent, IntentKind, KeyPrefix,
    LocalEnvironment, MAIN, Namespace, OpId, Options, Queue, SecretProvider,
};
use serde::Serialize;

pub use agent::{AgentExit, AgentSpec, SOCKET_VAR, TOKEN_VAR};
pub use control::{ControlClient, ControlError, HangUp};
pub use methods::{Method, schema};

use agent::{Agent, Launch};
use environment_sandbox::error::{Result, SandboxError};
use environment_sandbox::launch::Launcher;
use environment_sandbox::noise::NoiseRules;
use environment_sandbox::tracker::{Tracker, TrackerConfig};
use environment_workspace::{Counters, Setup, Trees, Workspace, lock};
pub use server::ControlLimits;
pub use server::SESSION_OPEN;
use server::{Peer, Server};

/// Where the operator's socket is under the home, by default.
pub const OPERATOR_SOCKET: &str = "operator/control.sock";

pub use environment_workspace::ShellHandles;

/// How a supervisor is set up.
#[derive(Clone)]
pub struct SupervisorConfig {
    /// The environment's home (database, blobs, the socket by default). Outside the workspace.
    pub home: PathBuf,
    /// The tracked workspace.
    pub workspace: PathBuf,
    /// How the agent (and anything it runs through the supervisor) is confined.
    pub launcher: Arc<dyn Launcher>,
    /// Whom the agent's requests act as.
    pub actor: ActorId,
    /// The agent's capability token: handed to it in `ENVIRONMENT_TOKEN` and applied to every
    /// request that presents none.
    pub token: Option<String>,
    /// Decides every request (and every operation of the environment); without it, everything
    /// is allowed.
    pub policy: Option<Arc<dyn Governance>>,
    /// The queue behind the `queue.*` methods.
    pub bus: Option<Arc<dyn Queue>>,
    /// The effect log, when it is not kept in the environment's database (one that several
    /// machines share).
    pub effects: Option<Arc<dyn environment_core::EffectStore>>,
    /// The socket's path; `<home>/run/control.sock` by default.
    pub socket: Option<PathBuf>,
    /// Where the agent sees the socket, when a launcher mounts its directory elsewhere; the host
    /// path by default. With [`Isolation`](environment_sandbox::Isolation), add a [`Bind`](environment_sandbox::Bind) of
    /// [`SupervisorConfig::socket_path`]'s directory (writable) to its spec, at a path under a
    /// directory the sandbox mounts itself (e.g. `/tmp/environment-control`), and name the
    /// socket there.
    pub socket_inside: Option<PathBuf>,
    /// The operator's socket: `<home>/operator/control.sock` by default. A connection there
    /// opens a session as the actor it names (`session.open`), so a person's `envctl` acts as
    /// that person while the agent runs; it is private to the supervisor's user, in a
    /// directory the sandbox does not show, and never mounted into it.
    pub operator_socket: Option<PathBuf>,
    /// Whom automatic captures are attributed to: the agent by default, since what changes in
    /// its workspace while it runs is its doing, decided by the policy as its requests are (a
    /// change it may not make is put back and kept as refused). The witness
    /// ([`environment_core::witness`]) records whatever it finds, as everywhere: only for a
    /// workspace whose changes come from outside every door.
    pub capture_actor: ActorId,
    /// What is never captured, and what is quiet.
    pub noise: NoiseRules,
    /// Automatic capture waits for this much quiet…
    pub quiet_period: Duration,
    /// …but no longer than this after the first change.
    pub max_wait: Duration,
    /// The branch the workspace is captured to.
    pub branch: String,
    /// A workspace monitor's socket ([`environment_sandbox::monitor`]): the trackers start from what it saw
    /// instead of rescanning the trees.
    pub monitor: Option<PathBuf>,
    /// Offer the sandbox's [`Shell`](environment_sandbox::Shell) on the socket (`exec`, `process.*`,
    /// `pty.*`), running commands through the launcher as the agent. On by default;
    /// [`Supervisor::attach_shell`] replaces it.
    pub shell: bool,
    /// Resolves the secret references commands ask for; without one, asking is an error.
    pub secrets: Option<Arc<dyn SecretProvider>>,
    /// Further trees tracked on the same branch beside the workspace, each under its own key
    /// prefix (a managed rootfs, the agent's home): captured with it, restored with it.
    pub extra_roots: Vec<TrackedRoot>,
    /// What the control socket takes at most (connections, idle time).
    pub control_limits: ControlLimits,
}

/// A tree tracked beside the workspace. Its keys live under `key_prefix`, which the
/// workspace's own keys must never reach: the directory it names in the workspace is ignored
/// there (or does not exist).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrackedRoot {
    /// The tree.
    pub path: PathBuf,
    /// Where its keys live (`fs:<key_prefix>/<path>`).
    pub key_prefix: Vec<u8>,
    /// Its own noise rules (a rootfs has its own mount points to leave alone); the
    /// supervisor's when `None`.
    pub noise: Option<NoiseRules>,
}

/// Raises this process's soft descriptor limit to its hard limit: the watcher and the capture
/// must never run short because connections or commands took the budget (the socket's own
/// share is bounded by [`ControlLimits`]).
fn reserve_descriptors() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let now = getrlimit(Resource::Nofile);
    if now.current != now.maximum {
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: now.maximum,
                maximum: now.maximum,
            },
        );
    }
}

impl SupervisorConfig {
    /// A configuration with defaults: no policy, no queue, the socket under the home.
    pub fn new(
        home: impl Into<PathBuf>,
        workspace: impl Into<PathBuf>,
        launcher: Arc<dyn Launcher>,
        actor: ActorId,
    ) -> SupervisorConfig {
        SupervisorConfig {
            home: home.into(),
            workspace: workspace.into(),
            launcher,
            actor: actor.clone(),
            token: None,
            policy: None,
            bus: None,
            effects: None,
            socket: None,
            socket_inside: None,
            operator_socket: None,
            capture_actor: actor,
            noise: NoiseRules::default(),
            quiet_period: Duration::from_millis(200),
            max_wait: Duration::from_secs(2),
            branch: MAIN.to_owned(),
            monitor: None,
            shell: true,
            secrets: None,
            extra_roots: Vec::new(),
            control_limits: ControlLimits::default(),
        }
    }
}

impl SupervisorConfig {
    /// Where the control socket will be on the host: the configured path, or
    /// `<home>/run/control.sock`. A launcher that confines the agent must make its directory
    /// visible inside (a bind mount) and let `ENVIRONMENT_SOCKET` (and `ENVIRONMENT_TOKEN`)
    /// through its environment filter; [`SupervisorConfig::socket_inside`] then says where the
    /// agent finds it.
    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| self.home.join("run").join("control.sock"))
    }
}

impl std::fmt::Debug for SupervisorConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SupervisorConfig")
            .field("home", &self.home)
            .field("workspace", &self.workspace)
            .field("launcher", &self.launcher.describe())
            .field("actor", &self.actor)
            .field("policy", &self.policy.is_some())
            .field("bus", &self.bus.is_some())
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

/// What a rollback requested from outside does with the running agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RollbackMode {
    /// Restore under the running agent, as a self-rollback does: same pid, and it must re-read
    /// what it had read (a file it holds open keeps the old content).
    KeepRunning,
    /// Stop the agent (SIGTERM, SIGKILL after `grace`), restore, start it again with the same
    /// command: for agents that keep state read from the files in memory.
    RestartAgent {
        /// How long the agent has to exit after SIGTERM.
        grace: Duration,
    },
}

/// What a rollback did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Rollback {
    /// The new head: the rollback operation.
    pub version: String,
    /// The version whose content was brought back.
    pub restored_to: String,
    /// Paths written.
    pub writes: usize,
    /// Paths removed.
    pub removals: usize,
    /// The agent's pid after the rollback (a new one after a restart), if it runs.
    pub agent_pid: Option<u32>,
    /// Whether the agent was restarted.
    pub restarted: bool,
}

/// What a supervised run amounted to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Captures recorded (automatic and at barriers).
    pub captures: u64,
    /// Workspace paths that differ between the start and the end.
    pub files_changed: u64,
    /// Rollbacks done (asked by the agent or from outside).
    pub rollbacks: u64,
    /// Requests answered on the socket.
    pub requests: u64,
    /// Requests the policy refused.
    pub denied: u64,
    /// The version at the start.
    pub first_version: String,
    /// The version after the final capture.
    pub final_version: String,
    /// How the agent ended, if one ran.
    pub agent: Option<AgentExit>,
    /// Paths that could not be read at the end (still pending: not recorded), and why.
    pub unreadable: Vec<(PathBuf, String)>,
    /// Paths recorded without their content because they stayed unreadable, and why.
    pub without_content: Vec<(PathBuf, String)>,
    /// Paths the agent changed that it may not change, and why: put back and kept as refused.
    pub refused: Vec<(PathBuf, String)>,
    /// Why captures rescanned whole trees at the end (see [`Tracker::blind`]), one per tree.
    pub blind: Vec<String>,
}

/// Runs an agent with its changes captured, its requests answered and authorized.
pub struct Supervisor {
    shared: Arc<Workspace>,
    agent: Arc<Agent>,
    server: Server,
    operator: Server,
    operator_socket: PathBuf,
    launch: Launch,
    socket: PathBuf,
    first: OpId,
    capture_actor: ActorId,
}

impl Drop for Supervisor {
    /// A supervisor that goes away without [`Supervisor::shutdown`] (a panic, an early return)
    /// does not leave its agent running unsupervised.
    fn drop(&mut self) {
        self.agent.stop(Duration::from_secs(1));
    }
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Supervisor")
            .field("socket", &self.socket)
            .field("actor", &self.shared.actor)
            .finish_non_exhaustive()
    }
}

fn canonical(path: &Path, what: &'static str) -> Result<PathBuf> {
    path.canonicalize().map_err(SandboxError::io(what, path))
}

impl Supervisor {
    /// Opens the environment, starts tracking the workspace (an initial capture of whatever
    /// changed since the last run) and starts the control socket.
    pub fn open(config: SupervisorConfig) -> Result<Supervisor> {
        reserve_descriptors();
        let config_limits = config.control_limits;
        std::fs::create_dir_all(&config.home)
            .map_err(SandboxError::io("create home", &config.home))?;
        let home = canonical(&config.home, "open home")?;
        let workspace = canonical(&config.workspace, "open workspace")?;
        let socket = config
            .socket
            .clone()
            .unwrap_or_else(|| home.join("run").join("control.sock"));
        let operator_socket = config
            .operator_socket
            .clone()
            .unwrap_or_else(|| home.join(OPERATOR_SOCKET));
        if operator_socket.parent() == socket.parent() {
            return Err(SandboxError::Supervisor(format!(
                "the operator's socket ({}) must not share the agent's socket's directory, which \
                 the sandbox shows",
                operator_socket.display()
            )));
        }
        let socket_dir = match socket.parent() {
            Some(d) if !d.as_os_str().is_empty() => {
                std::fs::create_dir_all(d)
                    .map_err(SandboxError::io("create socket directory", d))?;
                canonical(d, "open socket directory")?
            }
            _ => PathBuf::from("."),
        };
        // The supervisor's own files must survive a rollback of the workspace: outside it, or
        // in a part of it that is never captured (and so never restored).
        let noise = environment_sandbox::noise::Noise::new(&workspace, &config.noise)?;
        for (what, p) in [("home", &home), ("socket", &socket_dir)] {
            if let Ok(rel) = p.strip_prefix(&workspace)
                && (rel.as_os_str().is_empty() || !noise.is_ignored(rel, true))
            {
                return Err(SandboxError::Supervisor(format!(
                    "the {what} ({}) is inside the workspace ({}); a rollback would touch it",
                    p.display(),
                    workspace.display()
                )));
            }
        }
        let authorizer: Arc<dyn Authorizer> = match &config.policy {
            Some(p) => p.clone() as Arc<dyn Authorizer>,
            None => Arc::new(AllowAll),
        };
        let env = LocalEnvironment::open(
            &home,
            Options {
                authorizer: authorizer.clone(),
                effects: config.effects.clone(),
                ..Options::default()
            },
        )?;
        let mut tc = TrackerConfig::new(&workspace, config.capture_actor.clone());
        tc.branch = config.branch.clone();
        tc.noise = config.noise.clone();
        tc.monitor = config.monitor.clone();
        let mut workspace_noise = config.noise.clone();
        for root in &config.extra_roots {
            let prefix = std::str::from_utf8(&root.key_prefix)
                .ok()
                .filter(|p| !p.is_empty() && !p.starts_with('/'))
                .ok_or_else(|| {
                    SandboxError::Supervisor(format!(
                        "a tracked root's key prefix must be a non-empty relative path, not {:?}",
                        String::from_utf8_lossy(&root.key_prefix)
                    ))
                })?;
            // The workspace's keys never reach a further root's: its directory there (if any)
            // is the other root's business.
            workspace_noise.ignored.push(format!("/{prefix}"));
        }
        tc.quiet_period = config.quiet_period;
        tc.max_wait = config.max_wait;
        let mut wc = tc.clone();
        wc.noise = workspace_noise;
        // The agent's captures are the agent's acts: under its token, as its requests are.
        let capturing = match &config.token {
            Some(t) if config.capture_actor == config.actor => {
                env.presenting(environment_core::Credentials {
                    token: Some(t.clone()),
                    approval: None,
                })
            }
            _ => env.clone(),
        };
        let tracker = Arc::new(Tracker::open(capturing.clone(), wc)?);
        let mut extra = Vec::with_capacity(config.extra_roots.len());
        for root in &config.extra_roots {
            let mut rc = tc.clone();
            rc.root = canonical(&root.path, "open a tracked root")?;
            rc.key_prefix = root.key_prefix.clone();
            if let Some(noise) = &root.noise {
                rc.noise = noise.clone();
            }
            extra.push(Arc::new(Tracker::open(capturing.clone(), rc)?));
        }
        let first = env.head(&config.branch)?;
        let shell = if config.shell {
            let shell = Arc::new(environment_sandbox::shell::Shell::new(
                config.launcher.clone(),
                tracker.clone(),
                config.secrets.clone(),
            )?);
            ShellHandles {
                exec: Some(shell.clone()),
                processes: Some(shell.clone()),
                pty: Some(shell),
            }
        } else {
            ShellHandles::default()
        };
        let setup = Setup {
            env,
            authorizer,
            policy: config.policy.clone(),
            bus: config.bus.clone(),
            launcher: Some(config.launcher.clone()),
            actor: config.actor.clone(),
            default_token: config.token.clone(),
            branch: config.branch.clone(),
            // The trackers capture in the background, and at each use case's barriers.
            capture_each_call: false,
            // A tournament's forks run outside the agent's sandbox: not offered to it.
            forking: None,
        };
        let trees = Trees {
            tracker,
            extra,
            shell,
        };
        let shared = Arc::new(Workspace::new(setup, trees));
        let server = Server::start(&socket, shared.clone(), config_limits, Peer::Agent)?;
        let operator = Server::start(
            &operator_socket,
            shared.clone(),
            config_limits,
            Peer::Operator,
        )?;
        let socket_inside = config
            .socket_inside
            .clone()
            .unwrap_or_else(|| socket.clone());
        Ok(Supervisor {
            shared,
            agent: Arc::new(Agent::default()),
            server,
            operator,
            operator_socket,
            launch: Launch {
                socket_inside,
                token: config.token,
                workspace,
            },
            socket,
            first,
            capture_actor: config.capture_actor,
        })
    }

    /// The environment.
    pub fn env(&self) -> &LocalEnvironment {
        &self.shared.env
    }

    /// The workspace service the socket puts on the wire: its use cases, called in process
    /// exactly as the socket calls them.
    pub fn workspace(&self) -> &Arc<Workspace> {
        &self.shared
    }

    /// The control socket's path on the host.
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// The operator's socket: a connection there acts as the actor its `session.open` names.
    pub fn operator_socket_path(&self) -> &Path {
        &self.operator_socket
    }

    /// Starts the agent through the launcher, with `ENVIRONMENT_SOCKET` (and `ENVIRONMENT_TOKEN`)
    /// set; returns its pid.
    pub fn spawn_agent(&self, spec: AgentSpec) -> Result<u32> {
        self.agent.spawn(&self.shared, &self.launch, spec)
    }

    /// The running agent's pid.
    pub fn agent_pid(&self) -> Option<u32> {
        self.agent.pid()
    }

    /// Waits for the agent to end for good (a restart by a rollback is not an end). `None` if
    /// no agent was started.
    pub fn wait_agent(&self) -> Option<AgentExit> {
        self.agent.wait()
    }

    /// Starts the agent and waits for it to end. Whatever it changed is captured when it ends,
    /// however it ends (exit, crash, kill).
    pub fn run_agent(&self, spec: AgentSpec) -> Result<AgentExit> {
        self.spawn_agent(spec)?;
        self.agent
            .wait()
            .ok_or_else(|| SandboxError::Supervisor("the agent did not start".into()))
    }

    /// The tracker of the workspace, to build a shell on (its commands' captures must go
    /// through the same tracker). `None` after shutdown.
    pub fn tracker(&self) -> Option<Arc<Tracker>> {
        self.shared
            .tracker
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Exposes shell capabilities on the socket (`exec`, `process.*`, `pty.*`); a method whose
    /// capability is absent answers `UNAVAILABLE`. Replaces what was attached before. The
    /// socket's gate only evaluates the `execute` request (spending no quota): a shell must
    /// authorize it itself when it starts the program, as the sandbox's [`Shell`](environment_sandbox::Shell)
    /// does.
    pub fn attach_shell(&self, handles: ShellHandles) {
        *self.shared.shell.write().unwrap_or_else(|p| p.into_inner()) = handles;
    }

    /// Stops the agent: SIGTERM, then SIGKILL after `grace`.
    pub fn stop_agent(&self, grace: Duration) {
        self.agent.stop(grace);
    }

    /// A capture barrier: everything changed up to now, attributed to `text`. `None` when
    /// nothing changed.
    pub fn capture(&self, text: &str) -> Result<Option<OpId>> {
        Ok(self.shared.capture(text)?.map(|o| o.version))
    }

    /// Restores the workspace to `version` (an id, a prefix, a mark, `main~2`…), as `actor`
    /// (a human or a tool outside the sandbox; the environment's policy decides), with the agent
    /// kept running or restarted around it.
    pub fn rollback(&self, actor: &ActorId, version: &str, mode: RollbackMode) -> Result<Rollback> {
        let target = self.shared.env.resolve(version)?;
        // Asked before the tree is touched: core asks again only when it records the rollback,
        // after the files were written.
        let mut context = environment_core::Context {
            branch: Some(self.shared.branch.clone()),
            ..Default::default()
        };
        context.attrs.insert(
            "operation".into(),
            environment_core::AttrValue::Str("restore".into()),
        );
        let request = environment_core::AccessRequest {
            actor: actor.clone(),
            action: environment_core::Action::Write,
            resource: environment_core::Resource::Branch(self.shared.branch.clone()),
            context,
        };
        let decision = self.shared.authorizer.decide(&request);
        if !decision.is_allowed() {
            return Err(EnvError::NotAllowed(Box::new(decision)).into());
        }
        let intent = Intent::new(
            IntentKind::Restore,
            format!("restore to {version} (asked by {actor})"),
        );
        let restore = || {
            self.shared.restore(
                actor,
                &environment_core::Credentials::default(),
                &target,
                intent.clone(),
            )
        };
        let (plan, agent_pid, restarted) = match mode {
            RollbackMode::KeepRunning => (restore()?, self.agent.pid(), false),
            RollbackMode::RestartAgent { grace } => {
                let (plan, pid) = self
                    .agent
                    .restart(&self.shared, &self.launch, grace, restore)?;
                (plan, pid, pid.is_some())
            }
        };
        Counters::bump(&self.shared.counters.rollbacks);
        let (writes, removals) = plan.steps.iter().fold((0, 0), |(w, r), s| match s {
            environment_sandbox::restore::RestoreStep::Write(_) => (w + 1, r),
            environment_sandbox::restore::RestoreStep::Remove(_) => (w, r + 1),
        });
        Ok(Rollback {
            version: self.shared.env.head(&self.shared.branch)?.to_string(),
            restored_to: plan.to.to_string(),
            writes,
            removals,
            agent_pid,
            restarted,
        })
    }

    /// Stops the agent if it still runs (SIGTERM, SIGKILL after 5 s), closes the socket, takes
    /// a final capture and stops tracking.
    pub fn shutdown(self) -> Result<Summary> {
        self.shutdown_with_grace(Duration::from_secs(5))
    }

    /// [`Supervisor::shutdown`] with the agent given `grace` to exit after SIGTERM.
    pub fn shutdown_with_grace(mut self, grace: Duration) -> Result<Summary> {
        self.agent.stop(grace);
        self.server.stop();
        self.operator.stop();
        let tracker = self
            .shared
            .tracker
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let extra =
            std::mem::take(&mut *self.shared.extra.write().unwrap_or_else(|p| p.into_inner()));
        // Shell processes end with the shell, before the final capture takes what they left.
        *self.shared.shell.write().unwrap_or_else(|p| p.into_inner()) = ShellHandles::default();
        for t in &extra {
            final_capture(t)?;
        }
        let captures = match &tracker {
            Some(t) => {
                let before = t.captures();
                before + u64::from(final_capture(t)?)
            }
            None => 0,
        };
        let trackers: Vec<&Arc<Tracker>> = tracker.iter().chain(extra.iter()).collect();
        let unreadable = trackers.iter().flat_map(|t| t.unreadable()).collect();
        let without_content = trackers.iter().flat_map(|t| t.without_content()).collect();
        let refused = trackers.iter().flat_map(|t| t.disallowed()).collect();
        let blind = trackers.iter().filter_map(|t| t.blind()).collect();
        let shared = &self.shared;
        let last = shared.env.head(&shared.branch)?;
        let files_changed = shared
            .env
            .diff(
                &self.capture_actor,
                &self.first,
                &last,
                Some(&KeyPrefix::all(Namespace::Fs)),
            )
            .map(|d| d.len() as u64)
            .unwrap_or_else(|e| {
                tracing::warn!(error = %e, "cannot count the changed files");
                0
            });
        let c = &shared.counters;
        Ok(Summary {
            captures,
            files_changed,
            rollbacks: c.rollbacks.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            denied: c.denied.load(Ordering::Relaxed),
            first_version: self.first.to_string(),
            final_version: last.to_string(),
            agent: self.agent.last_exit(),
            unreadable,
            without_content,
            refused,
            blind,
        })
    }

    /// For a supervisor binary: waits for SIGTERM or SIGINT, or for the agent (if one was
    /// started) to end, then shuts down with `grace` for the agent. The signals are handled
    /// from the call on, so the process is not killed by them.
    pub fn run_until_signal(self, grace: Duration) -> Result<Summary> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(SandboxError::io("start signal runtime", &self.socket))?;
        let agent = self.agent.clone();
        let started = lock(&self.shared.agent_pid).is_some() || agent.last_exit().is_some();
        let waited: std::io::Result<()> = rt.block_on(async move {
            use tokio::signal::unix::{SignalKind, signal};
            let mut term = signal(SignalKind::terminate())?;
            let mut int = signal(SignalKind::interrupt())?;
            let ended = async {
                if started {
                    let _ = tokio::task::spawn_blocking(move || agent.wait()).await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
                _ = ended => {}
            }
            Ok(())
        });
        // The blocking wait may still be parked on the agent: do not wait for it.
        rt.shutdown_background();
        waited.map_err(SandboxError::io("install signal handlers", &self.socket))?;
        self.shutdown_with_grace(grace)
    }
}

/// The capture of whatever is left when the supervisor stops; whether it recorded an operation.
/// A capture the policy refuses to the capturing actor is not an error here: the changes stay
/// on disk, unrecorded by this actor, as they would after a refused automatic capture (another
/// actor may record them as found), and the supervisor still stops and reports.
fn final_capture(t: &Tracker) -> Result<bool> {
    match t.capture_last(
        Intent::new(IntentKind::Capture, "final capture"),
        environment_core::OpFlags::AUTO_CAPTURE,
    ) {
        Ok(obs) => Ok(obs.is_some()),
        Err(SandboxError::Env(EnvError::NotAllowed(d))) => {
            tracing::warn!(decision = ?d, "final capture refused; the changes stay unrecorded");
            Ok(false)
        }
        Err(e) => Err(e),
    }
}
