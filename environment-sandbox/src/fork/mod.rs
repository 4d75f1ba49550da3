//! Fork: n branches of one version, each with a working tree that shares unchanged content.
//!
//! A version is *materialized* once into a read-only directory under the environment's home
//! (`forks/base/<version>`, written in parallel into a temporary name and renamed, so a crash
//! leaves no half-made base). A fork is then only bookkeeping: one branch per working tree and,
//! for each, an empty overlay upper and work directory. A sandboxed program sees the overlay of
//! its upper layer over the shared base as its workspace (see
//! [`crate::isolate::Workspace::Overlay`]); everything it changes lands in its upper layer, which
//! is what [`Forks::capture`] reads — so capturing a fork costs what the program changed, never a
//! walk of the base.
//!
//! ```text
//!   home/forks/base/<version>/         the base, read-only, shared by every fork of it
//!   home/forks/trees/<n>/upper/        what the fork changed (overlay upper layer)
//!   home/forks/trees/<n>/work/         overlayfs' scratch directory
//!   home/forks/trees/<n>/out/          output files of the commands run in it
//! ```

mod materialize;
pub mod tournament;
mod upper;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use environment_core::{
    ActorId, Change, EnvError, Intent, LocalEnvironment, Observation, OpFlags, OpId,
};

use crate::capture::KeyMap;
use crate::error::{Result, SandboxError};
use crate::noise::{Noise, NoiseRules};

pub use tournament::{Candidate, Contestant, Pick, Tournament, TournamentReport};

/// How forks of one tracked tree are made.
#[derive(Clone, Debug, Default)]
pub struct ForkConfig {
    /// The key prefix of the tracked tree (as in [`crate::TrackerConfig::key_prefix`]).
    pub key_prefix: Vec<u8>,
    /// What is never captured (as in [`crate::TrackerConfig::noise`]).
    pub noise: NoiseRules,
}

/// One fork: a branch and the directories of its working tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkingTree {
    /// The branch its captures go to.
    pub branch: String,
    /// The version it was forked from.
    pub base: OpId,
    /// The shared read-only base (the overlay's lower layer).
    pub lower: PathBuf,
    /// Its own changes (the overlay's upper layer).
    pub upper: PathBuf,
    /// The overlay's work directory (same filesystem as `upper`).
    pub work: PathBuf,
    /// Where the output of commands run in it is kept.
    pub out: PathBuf,
}

/// Makes and captures forks of the versions of one environment.
pub struct Forks {
    env: LocalEnvironment,
    keys: KeyMap,
    noise: Noise,
    dir: PathBuf,
}

impl std::fmt::Debug for Forks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forks").field("dir", &self.dir).finish()
    }
}

static TREE: AtomicU64 = AtomicU64::new(0);

impl Forks {
    /// Forks of `env`'s tracked tree, kept under `<home>/forks`.
    pub fn open(env: LocalEnvironment, config: ForkConfig) -> Result<Forks> {
        let noise = Noise::new(Path::new("/"), &config.noise)?;
        let dir = env.home().join("forks");
        for sub in ["base", "trees"] {
            let d = dir.join(sub);
            std::fs::create_dir_all(&d).map_err(SandboxError::io("mkdir", &d))?;
        }
        materialize::sweep(&dir.join("base"))?;
        Ok(Forks {
            keys: KeyMap::new(&config.key_prefix),
            env,
            noise,
            dir,
        })
    }

    /// The environment the forks belong to.
    pub fn env(&self) -> &LocalEnvironment {
        &self.env
    }

    /// The read-only directory holding `version`'s tree, made on first use and shared by every
    /// fork of that version afterwards.
    pub fn materialize(&self, version: &OpId) -> Result<PathBuf> {
        materialize::materialize(&self.env, &self.keys, &self.dir.join("base"), version)
    }

    /// Forks `version` into `n` branches named `<name>/1` … `<name>/n`, each with its own empty
    /// working tree over the shared materialization of `version`. Nothing is copied: the cost is
    /// n branches and 3n directories once the base exists. Bad names, a taken name or an
    /// unknown version change nothing.
    pub fn fork(
        &self,
        actor: &ActorId,
        version: &OpId,
        n: usize,
        name: &str,
    ) -> Result<Vec<WorkingTree>> {
        let branches: Vec<String> = (1..=n).map(|i| format!("{name}/{i}")).collect();
        self.fork_into(actor, version, &branches)
    }

    /// Forks `version` into the named branches, one working tree each (see [`Forks::fork`]).
    pub fn fork_into(
        &self,
        actor: &ActorId,
        version: &OpId,
        branches: &[String],
    ) -> Result<Vec<WorkingTree>> {
        self.env.op(version)?;
        for b in branches {
            if self.env.head(b).is_ok() {
                return Err(EnvError::BranchExists(b.clone()).into());
            }
        }
        let lower = self.materialize(version)?;
        let mut trees = Vec::with_capacity(branches.len());
        for branch in branches {
            self.env.create_branch(actor, branch, version)?;
            let dir = self.dir.join("trees").join(format!(
                "{}-{}",
                std::process::id(),
                TREE.fetch_add(1, Ordering::Relaxed)
            ));
            let tree = WorkingTree {
                branch: branch.clone(),
                base: *version,
                lower: lower.clone(),
                upper: dir.join("upper"),
                work: dir.join("work"),
                out: dir.join("out"),
            };
            for d in [&tree.upper, &tree.work, &tree.out] {
                std::fs::create_dir_all(d).map_err(SandboxError::io("mkdir", d))?;
            }
            trees.push(tree);
        }
        Ok(trees)
    }

    /// Captures what a working tree changed since its branch's head into one operation on its
    /// branch, with `extra` changes (a command's outputs, say) in the same operation. Reads only
    /// the upper layer: the cost follows what the fork changed.
    pub fn capture(
        &self,
        tree: &WorkingTree,
        actor: &ActorId,
        intent: Intent,
        flags: OpFlags,
        extra: Vec<Change>,
    ) -> Result<Option<Observation>> {
        upper::capture(self, tree, actor, intent, flags, extra)
    }

    /// Removes a working tree's directories (its branch stays in history).
    pub fn remove(&self, tree: &WorkingTree) -> Result<()> {
        let Some(dir) = tree.upper.parent() else {
            return Ok(());
        };
        if !dir.starts_with(self.dir.join("trees")) {
            return Err(SandboxError::Escape {
                path: dir.to_owned(),
            });
        }
        remove_tree(dir)
    }
}

/// Removes a directory tree that may hold read-only directories (a materialized base, an
/// overlay work directory).
pub(crate) fn remove_tree(dir: &Path) -> Result<()> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            make_writable(dir);
            std::fs::remove_dir_all(dir).map_err(SandboxError::io("remove", dir))
        }
    }
}

fn make_writable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                make_writable(&e.path());
            }
        }
    }
}
