//! Finding the environment a command works on, and opening it.
//!
//! A workspace is a directory tree with an environment attached: its home is the directory
//! `DIR/.environment` (the default), or a file `DIR/.environment` holding the path of a home
//! elsewhere (`envctl init --home`). The workspace is found like git finds a repository: `-C
//! DIR` or `ENVIRONMENT_DIR` if given, else the nearest directory at or above the current one
//! that has a `.environment`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use environment_bus::{Bus, BusConfig};
use environment_core::{
    AccessRequest, Action, ActorId, AllowAll, Authorizer, Context, Credentials, Governance,
    LocalEnvironment, MAIN, Options, Queue, Resource, SystemClock,
};
use environment_policy::Policy;
use environment_sandbox::{ForkConfig, Launcher, NoiseRules, Shell, Tracker, TrackerConfig};
use environment_workspace as service;

use crate::failure::{Failure, Outcome};
use crate::progress::Progress;
use crate::stores::Stores;

/// The name of the environment's entry in a workspace.
pub const MARKER: &str = ".environment";
/// The policy store inside the home (its presence means a policy is loaded).
pub const POLICY_FILE: &str = "policy.db";
/// The queue inside the home.
pub const BUS_FILE: &str = "bus.db";
/// Where a supervisor listens, inside the home.
pub const SOCKET_FILE: &str = "run/control.sock";
/// The managed rootfs inside the home.
pub const ROOTFS_DIR: &str = "rootfs";
/// Where the managed rootfs's keys live: under the home's own path in the workspace, which no
/// tracker of the workspace alone captures, writes or removes.
pub const ROOTFS_KEY_PREFIX: &str = ".environment/rootfs";

pub use environment_core::witness;

/// A workspace directory and its environment's home.
#[derive(Clone, Debug)]
pub struct Workspace {
    /// The directory tree that is captured and restored.
    pub dir: PathBuf,
    /// The environment's home (database, blobs, policy, queue).
    pub home: PathBuf,
    /// What this invocation presents with every request (`--token`, `--approval`).
    pub credentials: Credentials,
}

impl Workspace {
    /// The workspace at `dir` exactly, or the nearest one above the current directory.
    pub fn find(dir: Option<&Path>) -> Outcome<Workspace> {
        if let Some(d) = dir {
            return Workspace::at(d)?.ok_or_else(|| {
                Failure::not_found(format!("{} is not an environment", d.display()))
                    .hint("run `envctl init` there first")
            });
        }
        let cwd = std::env::current_dir()
            .map_err(|e| Failure::io("read the current directory", Path::new("."), e))?;
        let mut at: Option<&Path> = Some(&cwd);
        while let Some(d) = at {
            if let Some(ws) = Workspace::at(d)? {
                return Ok(ws);
            }
            at = d.parent();
        }
        Err(
            Failure::not_found(format!("no environment at or above {}", cwd.display()))
                .hint("run `envctl init` in the workspace, or pass -C DIR / set ENVIRONMENT_DIR"),
        )
    }

    /// The workspace at `dir`, if it has an environment.
    pub fn at(dir: &Path) -> Outcome<Option<Workspace>> {
        let marker = dir.join(MARKER);
        let meta = match std::fs::metadata(&marker) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Failure::io("read", &marker, e)),
        };
        let home = if meta.is_dir() {
            marker
        } else {
            let text =
                std::fs::read_to_string(&marker).map_err(|e| Failure::io("read", &marker, e))?;
            PathBuf::from(text.trim())
        };
        if !home.is_dir() {
            let f = if home.exists() {
                Failure::other(format!(
                    "the environment's home {} (named by {}) is not a directory",
                    home.display(),
                    dir.join(MARKER).display()
                ))
            } else {
                Failure::not_found(format!(
                    "the environment's home {} (named by {}) does not exist",
                    home.display(),
                    dir.join(MARKER).display()
                ))
            };
            return Err(f.hint("point the marker file at the home, or move the home back"));
        }
        let dir = dir
            .canonicalize()
            .map_err(|e| Failure::io("resolve", dir, e))?;
        Ok(Some(Workspace {
            dir,
            home,
            credentials: Credentials::default(),
        }))
    }

    /// The policy that governs this environment, if one was loaded: the shared one the home's
    /// `stores.toml` names (once rules were loaded into it), else the embedded one (once its
    /// file exists). Without one, everything is allowed.
    pub fn policy(&self) -> Outcome<Option<Policy>> {
        let shared = Stores::read(&self.home)?.policy.is_some();
        if !shared && !self.home.join(POLICY_FILE).exists() {
            return Ok(None);
        }
        let policy = self.open_policy()?;
        Ok((!shared || policy.version() > 0).then_some(policy))
    }

    /// Opens the environment, decided by `authorizer`, with its effect log where the home's
    /// `stores.toml` says (its own database by default).
    pub fn open_environment(&self, authorizer: Arc<dyn Authorizer>) -> Outcome<LocalEnvironment> {
        let stores = Stores::read(&self.home)?;
        let options = Options {
            authorizer,
            effects: stores.open_effects()?,
            log_store: stores.open_log()?,
            shared_blobs: stores.open_blobs(&self.home)?,
            ..Options::default()
        };
        Ok(LocalEnvironment::open(&self.home, options)?)
    }

    /// Opens the policy's store, shared or embedded (creating the embedded one), whether or
    /// not rules were loaded into it.
    pub fn open_policy(&self) -> Outcome<Policy> {
        let clock = Arc::new(SystemClock);
        Ok(match Stores::read(&self.home)?.open_policy()? {
            Some(store) => Policy::with_store(store, clock)?,
            None => Policy::open(&self.home.join(POLICY_FILE), clock)?,
        })
    }

    /// Opens the queue: the shared one the home's `stores.toml` names, else the embedded one
    /// (created when missing if `create`, else only if it exists).
    pub fn open_queue(&self, create: bool) -> Outcome<Option<Arc<dyn Queue>>> {
        self.queue(create, BusConfig::default())
    }

    /// Opens the queue to watch it beside the process that keeps it (a supervisor): only if
    /// it exists, and without purging an embedded one (its keeper does).
    pub fn watch_queue(&self) -> Outcome<Option<Arc<dyn Queue>>> {
        let config = BusConfig {
            auto_purge: None,
            ..BusConfig::default()
        };
        self.queue(false, config)
    }

    fn queue(&self, create: bool, embedded: BusConfig) -> Outcome<Option<Arc<dyn Queue>>> {
        if let Some(shared) = Stores::read(&self.home)?.open_queue()? {
            return Ok(Some(shared));
        }
        let path = self.home.join(BUS_FILE);
        if !create && !path.exists() {
            return Ok(None);
        }
        Ok(Some(Arc::new(Bus::open(path, embedded)?)))
    }
}

/// Writes a new file of the home that only its owner may read (it names a secret or where the
/// data is), synced before it is used; fails if the file exists.
pub fn write_private(path: &Path, bytes: &[u8]) -> Outcome<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| Failure::io("create", path, e))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(|e| Failure::io("write", path, e))
}

/// The managed rootfs's noise rules: the defaults, and the mount points the sandbox makes in
/// it (the workspace, the socket's directory, envctl's own), which are the sandbox's, not the
/// user's history: never captured, and never removed by a restore while an agent may use them.
pub fn rootfs_noise() -> NoiseRules {
    use crate::commands::process::{ROOTFS_WORKSPACE, SOCKET_DIR_INSIDE};
    let mut rules = NoiseRules::default();
    let tools = std::path::Path::new(environment_sandbox::isolate::ROOTFS_TOOLS)
        .parent()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    for point in [ROOTFS_WORKSPACE, SOCKET_DIR_INSIDE, tools.as_str()] {
        rules.ignored.push(format!("{point}/"));
        rules.precious.push(format!("{point}/"));
    }
    rules
}

/// How a session serves as the workspace service (see [`Session::into_service`]); by default
/// as one command does: no commands run, no capture at each call (opening the session
/// captured), the queue only if it exists.
#[derive(Default)]
pub struct Serving {
    /// Confines the commands of its shell; without one, it runs none.
    pub launcher: Option<Arc<dyn Launcher>>,
    /// Every call first captures what changed in the trees since the last one, as the
    /// witness's: for a server that lives across calls.
    pub capture_each_call: bool,
    /// The queue is created when missing (else it is there only if it exists).
    pub create_queue: bool,
    /// Tournaments run, each fork in a sandbox of its own.
    pub forking: bool,
}

/// How much of the tree a command looks at when it opens the workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Look {
    /// Everything changed since the last capture: what the monitor saw, or a rescan when
    /// nothing vouches for it. For every command that may change the tree or relies on it.
    Changes,
    /// Only what the monitor saw, never a rescan: for commands that only read the history.
    Known,
}

/// An open environment: the stores, the policy, and the tracker of the workspace tree.
pub struct Session {
    /// Where it is.
    pub ws: Workspace,
    /// The environment.
    pub env: LocalEnvironment,
    /// The policy, when one is loaded.
    pub policy: Option<Arc<Policy>>,
    /// Who this command acts as.
    pub actor: ActorId,
    /// Core's authorizer: the policy.
    authorizer: Arc<dyn Authorizer>,
    tracker: Option<Tracker>,
    /// The managed rootfs's tracker, when there is one: restored with the workspace.
    rootfs: Option<Tracker>,
}

impl Session {
    /// Opens the environment of `ws` for `actor`, without touching the tree.
    pub fn open_stores(ws: Workspace, actor: ActorId) -> Outcome<Session> {
        let policy = ws.policy()?.map(Arc::new);
        // The policy decides (everything is allowed without one); core keeps the witness's
        // one rule around it.
        let authorizer: Arc<dyn Authorizer> = match &policy {
            Some(p) => p.clone(),
            None => Arc::new(AllowAll),
        };
        let mut env = ws.open_environment(authorizer.clone())?;
        if ws.credentials != Credentials::default() {
            env = env.presenting(ws.credentials.clone());
        }
        Ok(Session {
            ws,
            env,
            policy,
            actor,
            authorizer,
            tracker: None,
            rootfs: None,
        })
    }

    /// Opens the environment and captures whatever changed in the tree since the last capture
    /// (what the workspace monitor saw, or a rescan against the stat cache), so that nothing
    /// done out of band is lost or overwritten by what follows.
    pub fn open(ws: Workspace, actor: ActorId) -> Outcome<Session> {
        Session::open_looking(ws, actor, Look::Changes)
    }

    /// [`Session::open`], looking at the tree as `look` says.
    pub fn open_looking(ws: Workspace, actor: ActorId, look: Look) -> Outcome<Session> {
        if let Some(said) = crate::run_record::ended_abnormally(&ws.home) {
            eprintln!("envctl: {said}");
        }
        let monitor = match crate::monitor::ensure(&ws.home) {
            Ok(m) => m,
            Err(why) => {
                eprintln!(
                    "envctl: the workspace monitor is unavailable ({why}); this command rescans \
                     the tree"
                );
                None
            }
        };
        let mut s = Session::open_stores(ws, actor)?;
        let mut config = s.tracker_config(witness(), false);
        config.monitor = monitor.clone();
        config.rescan_on_open = look == Look::Changes;
        s.tracker = Some(s.track(config, "capturing the workspace")?);
        let rootfs = s.ws.home.join(ROOTFS_DIR);
        if rootfs.is_dir() {
            let mut config = TrackerConfig::new(&rootfs, witness());
            config.auto = false;
            config.noise = rootfs_noise();
            config.key_prefix = ROOTFS_KEY_PREFIX.as_bytes().to_vec();
            config.monitor = monitor;
            config.rescan_on_open = look == Look::Changes;
            s.rootfs = Some(s.track(config, "capturing the managed rootfs")?);
        }
        s.say_unreadable();
        Ok(s)
    }

    /// Opens a tracker; one whose monitor went away between the check and the open tracks
    /// without it (and says so).
    fn track(&self, mut config: TrackerConfig, what: &str) -> Outcome<Tracker> {
        let progress = Progress::spinner(what);
        let mut t = Tracker::open(self.env.clone(), config.clone());
        if let Err(environment_sandbox::SandboxError::Monitor { .. }) = &t {
            if let Err(e) = &t {
                eprintln!("envctl: {e}; this command rescans the tree");
            }
            config.monitor = None;
            t = Tracker::open(self.env.clone(), config);
        }
        progress.finish();
        Ok(t?)
    }

    /// Names what the capture could not read (pending, never dropped), what it recorded
    /// without content, what it can never record, and why captures cost the whole tree: one
    /// line each.
    fn say_unreadable(&self) {
        let trackers = || self.tracker.iter().chain(self.rootfs.iter());
        for (paths, what) in [
            (
                trackers().flat_map(|t| t.unreadable()).collect::<Vec<_>>(),
                "could not be read and are not recorded yet; they are captured once they can \
                 be read",
            ),
            (
                trackers().flat_map(|t| t.without_content()).collect(),
                "stayed unreadable and are recorded without their content",
            ),
            (
                trackers().flat_map(|t| t.refused()).collect(),
                "can never be recorded and are left out of every version",
            ),
        ] {
            if let Some((first, why)) = paths.first() {
                let first: String = first.display().to_string().chars().take(120).collect();
                eprintln!(
                    "envctl: {} path(s) {what} (first: {first}: {why})",
                    paths.len()
                );
            }
        }
        for why in trackers().filter_map(|t| t.blind()) {
            eprintln!("envctl: every capture rescans the whole tree: {why}");
        }
    }

    /// How the workspace is tracked: its noise rules, and its monitor (which tells what changed
    /// since the last capture, so the tracker need not rescan) when one runs.
    pub(crate) fn tracker_config(&self, actor: ActorId, auto: bool) -> TrackerConfig {
        let mut config = TrackerConfig::new(&self.ws.dir, actor);
        config.auto = auto;
        config.noise = self.noise_rules();
        let socket = self.ws.home.join(crate::monitor::MONITOR_SOCKET);
        config.monitor = socket.exists().then_some(socket);
        config
    }

    /// What is never captured: the defaults, plus the environment's own files — the marker (a
    /// file when the home is elsewhere) and a home kept inside the workspace.
    pub fn noise_rules(&self) -> NoiseRules {
        let mut rules = NoiseRules::default();
        rules.ignored.push(format!("/{MARKER}"));
        if let Ok(rel) = self.ws.home.strip_prefix(&self.ws.dir)
            && !rel.as_os_str().is_empty()
        {
            rules.ignored.push(format!("/{}/", rel.display()));
            // Never deleted by a restore, even if a version lacks the directory holding it.
            rules.precious.push(format!("/{}/", rel.display()));
        }
        rules
    }

    /// Tracks the workspace tree in the background from now on, as a long-running server's
    /// own watcher: what anyone changes in it is captured (as the witness's, as every
    /// command's opening capture is) once the tree is quiet, rather than at the next command.
    /// The opening capture took what changed before.
    pub fn watch_in_background(&mut self) -> Outcome<()> {
        if let Some(t) = self.tracker.take() {
            t.close()?;
        }
        let mut config = self.tracker_config(witness(), true);
        config.rescan_on_open = false;
        self.tracker = Some(self.track(config, "watching the workspace")?);
        Ok(())
    }

    /// Stops tracking, so that another tracker can take over (e.g. one attributing captures to
    /// a command's actor).
    pub fn stop_tracker(&mut self) -> Outcome<()> {
        if let Some(t) = self.tracker.take() {
            t.close()?;
        }
        if let Some(t) = self.rootfs.take() {
            t.close()?;
        }
        Ok(())
    }

    /// This session as the workspace service, opened as `how` says: the same stores, trees and
    /// policy.
    pub fn into_service(mut self, how: Serving) -> Outcome<service::Workspace> {
        let Serving {
            launcher,
            capture_each_call,
            create_queue,
            forking,
        } = how;
        let forking = forking.then(|| service::Forking {
            config: ForkConfig {
                noise: self.noise_rules(),
                ..ForkConfig::default()
            },
            sandbox: Arc::new(crate::commands::process::overlay_sandbox),
        });
        let tracker = Arc::new(
            self.tracker
                .take()
                .ok_or_else(|| Failure::other("the workspace is not tracked in this command"))?,
        );
        let extra = self.rootfs.take().map(Arc::new).into_iter().collect();
        let shell = match &launcher {
            Some(l) => {
                let shell = Arc::new(Shell::new(l.clone(), tracker.clone(), None)?);
                service::ShellHandles {
                    exec: Some(shell.clone()),
                    processes: Some(shell.clone()),
                    pty: Some(shell),
                }
            }
            None => service::ShellHandles::default(),
        };
        let trees = service::Trees {
            tracker,
            extra,
            shell,
        };
        let setup = service::Setup {
            env: self.env.clone(),
            authorizer: self.authorizer.clone(),
            policy: self.policy.clone().map(|p| p as Arc<dyn Governance>),
            bus: self.ws.open_queue(create_queue)?,
            launcher,
            actor: self.actor.clone(),
            default_token: self.ws.credentials.token.clone(),
            branch: MAIN.to_owned(),
            capture_each_call,
            forking,
        };
        Ok(service::Workspace::new(setup, trees))
    }

    /// The head of main: the version the tree holds.
    pub fn head(&self) -> Outcome<environment_core::OpId> {
        Ok(self.env.head(MAIN)?)
    }

    /// Decides, spending quota and approvals like any action, whether this command's actor may
    /// do `action` on `resource`: for actions core does not see (commands, the queue).
    pub fn authorize(&self, action: Action, resource: Resource) -> Outcome<()> {
        let Some(policy) = &self.policy else {
            return Ok(());
        };
        let req = AccessRequest {
            actor: self.actor.clone(),
            action,
            resource,
            context: Context {
                branch: Some(MAIN.to_owned()),
                token: self.ws.credentials.token.clone(),
                approval: self.ws.credentials.approval.clone(),
                ..Context::default()
            },
        };
        let d = policy.authorize(&req);
        if d.is_allowed() {
            Ok(())
        } else {
            Err(environment_core::EnvError::NotAllowed(Box::new(d)).into())
        }
    }
}
