//! environment-sandbox: unprivileged snapshots of a live directory tree.
//!
//! A [`Tracker`] watches a directory tree with inotify and captures every change into an
//! environment as operations in its log — without the cooperation of the process making the
//! changes, at a cost that follows what changed (stat, read and hash only the dirty paths). Any
//! version can be restored in place, writing only what differs, through directory handles that
//! never follow a symlink out of the tree; the processes working in it keep running.
//!
//! An [`Isolation`] runs the agent's programs in unprivileged namespaces, with the host read-only
//! around a writable workspace or in a managed rootfs that a tracker captures like any tree (see
//! [`isolate`]).
//!
//! A [`Shell`] runs commands for agents through a [`Launcher`]: each recorded command is one
//! operation holding the files it changed and its output; background processes and terminal
//! sessions outlive the caller that started them.
//!
//! [`Forks`] make n branches of a version with n working trees that share one materialized base
//! (overlays in the sandbox: never n copies); a [`Tournament`] runs candidate commands on them
//! concurrently, tests each, adopts the winner and keeps the others in history.
//!
//! ```
//! use environment_core::{ActorId, Intent, IntentKind, LocalEnvironment, OpFlags, Options};
//! use environment_sandbox::{Tracker, TrackerConfig};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let work = tempfile::tempdir()?;
//! let home = tempfile::tempdir()?;
//! std::fs::write(work.path().join("config.toml"), "debug = false\n")?;
//! let env = LocalEnvironment::open(home.path(), Options::default())?;
//! let agent = ActorId::new("agent:coder")?;
//! let mut config = TrackerConfig::new(work.path(), ActorId::new("service:watcher")?);
//! config.auto = false; // capture at explicit barriers only, for this example
//! let tracker = Tracker::open(env.clone(), config)?;
//! let good = env.head("main")?;
//!
//! // Something clobbers the config and deletes it, behind the environment's back.
//! std::fs::remove_file(work.path().join("config.toml"))?;
//! tracker.capture_now(Intent::new(IntentKind::Command, "rm config.toml"), OpFlags::COMMAND)?;
//!
//! // Bring it back.
//! tracker.restore(&agent, &good, Intent::new(IntentKind::Restore, "undo the rm"))?;
//! assert_eq!(std::fs::read_to_string(work.path().join("config.toml"))?, "debug = false\n");
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod capture;
pub mod error;
mod feed;
pub mod fork;
pub mod fsops;
pub mod isolate;
pub mod launch;
pub mod monitor;
pub mod noise;
mod parallel;
pub mod restore;
pub mod retention;
pub mod shell;
pub mod statcache;
pub mod tracker;
pub mod watch;

pub use error::{Result, SandboxError};
pub use fork::{Candidate, ForkConfig, Forks, Pick, Tournament, TournamentReport, WorkingTree};
pub use isolate::{
    Bind, CgroupLimits, CgroupSupport, Isolation, IsolationSpec, Limits, Root, Rootfs, Support,
    Workspace,
};
pub use launch::{Launcher, Unconfined};
pub use monitor::{MonitorClient, MonitorConfig};
pub use noise::{Class, Noise, NoiseRules};
pub use restore::{RestorePlan, RestoreStep};
pub use retention::{RetentionPolicy, ThinReport};
pub use shell::Shell;
pub use tracker::{CaptureHold, Presenting, Tracker, TrackerConfig};
