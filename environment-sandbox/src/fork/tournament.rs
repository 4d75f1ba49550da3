//! Tournament: several candidate commands on forks of one version, one test, one winner.
//!
//! Each candidate runs in its own sandbox on its own fork, concurrently up to a bound; its
//! changes are captured as one operation on its fork's branch, then the test runs in the same
//! working tree and its outcome and output are recorded as a second operation there. The winner
//! is chosen by an explicit rule ([`Pick`]) and adopted as the new head of the target branch
//! (the live tree is restored to it when a tracker is given); every other contestant stays in
//! history as its branch, with its test output.

use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use environment_core::shell::command_line;
use environment_core::{
    ActorId, Cancel, EnvError, Exit, Intent, IntentKind, OpFlags, OpId, StoredOutput,
};
use serde::{Deserialize, Serialize};

use super::{Forks, WorkingTree};
use crate::error::{Result, SandboxError};
use crate::launch::Launcher;
use crate::shell::exec::{self, Collector};
use crate::shell::now_ms;
use crate::shell::redact::Redactor;
use crate::tracker::Tracker;

/// How much of a command's output is recorded (the rest is counted and said to be cut).
const OUTPUT_LIMIT: u64 = 1 << 20;

/// One candidate: a name and the command that makes its attempt.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    /// A short name (a branch-name segment: letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// The program and its arguments.
    pub argv: Vec<String>,
}

/// How the winner is chosen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Pick {
    /// The contestant whose test passed first in time wins.
    #[default]
    FirstToPass,
    /// Every contestant runs to the end and all passers are reported; the first passer in
    /// candidate order wins (the same inputs always pick the same winner).
    AllPassers,
}

/// A tournament's rules.
#[derive(Clone, Debug)]
pub struct Tournament {
    /// Who runs it (every operation is this actor's).
    pub actor: ActorId,
    /// The version every candidate starts from.
    pub base: OpId,
    /// The candidates.
    pub candidates: Vec<Candidate>,
    /// The test, run in each candidate's working tree after the candidate; exit 0 passes.
    pub test: Vec<String>,
    /// How many candidates run at once.
    pub concurrency: usize,
    /// How the winner is chosen.
    pub pick: Pick,
    /// How long one command (a candidate or a test) may run before it is killed.
    pub timeout: Duration,
    /// The branch the winner is adopted into.
    pub target: String,
    /// The prefix of the contestants' branches (`<name>/<candidate>`).
    pub name: String,
}

impl Tournament {
    /// A tournament of shell scripts (`c1`, `c2`… each run as `/bin/sh -c SCRIPT`) from
    /// `base`, judged by the `test` script, adopted into `main`.
    pub fn of_scripts(actor: ActorId, base: OpId, scripts: &[String], test: &str) -> Self {
        let candidates = scripts
            .iter()
            .enumerate()
            .map(|(i, script)| Candidate {
                name: format!("c{}", i + 1),
                argv: sh(script),
            })
            .collect();
        Tournament::new(actor, base, candidates, sh(test))
    }

    /// A tournament of `candidates` from `base`, judged by `test`, adopted into `main`.
    pub fn new(actor: ActorId, base: OpId, candidates: Vec<Candidate>, test: Vec<String>) -> Self {
        let name = format!("tournament/{}", &base.to_string()[..12]);
        Tournament {
            actor,
            base,
            candidates,
            test,
            concurrency: 4,
            pick: Pick::default(),
            timeout: Duration::from_secs(600),
            target: "main".to_owned(),
            name,
        }
    }
}

/// One contestant's run.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Contestant {
    /// The candidate.
    pub candidate: Candidate,
    /// Its branch.
    pub branch: String,
    /// How the candidate command ended.
    pub run: Exit,
    /// How the test ended.
    pub test: Exit,
    /// Whether the test passed.
    pub passed: bool,
    /// The head of its branch after the test: `obj:exec/stdout` there is the test's output.
    pub head: OpId,
    /// The test's standard output, as stored.
    pub test_output: StoredOutput,
    /// When its test finished, from the tournament's start.
    pub finished_after: Duration,
}

/// What a tournament did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TournamentReport {
    /// Every contestant, in candidate order.
    pub contestants: Vec<Contestant>,
    /// The index of the winner, if any passed.
    pub winner: Option<usize>,
    /// The target branch's head after adopting the winner.
    pub adopted: Option<OpId>,
}

impl TournamentReport {
    /// The contestants whose test passed.
    pub fn passers(&self) -> impl Iterator<Item = &Contestant> {
        self.contestants.iter().filter(|c| c.passed)
    }
}

impl Tournament {
    /// Runs the tournament. `launcher_for` gives each working tree its sandbox (typically an
    /// [`crate::isolate::Isolation`] whose workspace is the tree's overlay); `live`, when given,
    /// is the tracker of the live tree, which is restored to the winner.
    pub fn run(
        &self,
        forks: &Forks,
        launcher_for: &(dyn Fn(&WorkingTree) -> Result<Box<dyn Launcher>> + Sync),
        live: Option<&Tracker>,
    ) -> Result<TournamentReport> {
        self.validate()?;
        let start = Instant::now();
        let branches: Vec<String> = self
            .candidates
            .iter()
            .map(|c| format!("{}/{}", self.name, c.name))
            .collect();
        let trees = forks.fork_into(&self.actor, &self.base, &branches)?;
        let results: Mutex<Vec<Option<Result<Contestant>>>> =
            Mutex::new((0..trees.len()).map(|_| None).collect());
        let next = Mutex::new(0usize);
        let workers = self.concurrency.clamp(1, trees.len().max(1));
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| {
                    loop {
                        let i = {
                            let mut n = lock(&next);
                            let i = *n;
                            *n += 1;
                            i
                        };
                        let Some(tree) = trees.get(i) else { break };
                        let r = self.contest(forks, launcher_for, &self.candidates[i], tree, start);
                        lock(&results)[i] = Some(r);
                    }
                });
            }
        });
        let contestants: Vec<Contestant> = results
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(SandboxError::Watch("a contestant did not run".into())))
            })
            .collect::<Result<_>>()?;
        for tree in &trees {
            forks.remove(tree)?;
        }
        let winner = match self.pick {
            Pick::FirstToPass => contestants
                .iter()
                .enumerate()
                .filter(|(_, c)| c.passed)
                .min_by_key(|(_, c)| c.finished_after)
                .map(|(i, _)| i),
            Pick::AllPassers => contestants.iter().position(|c| c.passed),
        };
        let adopted = match winner {
            Some(i) => Some(self.adopt(forks, &contestants[i], live)?),
            None => None,
        };
        Ok(TournamentReport {
            contestants,
            winner,
            adopted,
        })
    }

    fn validate(&self) -> Result<()> {
        let bad = |reason: &'static str| -> Result<()> {
            Err(EnvError::InvalidName {
                name: self.name.clone(),
                reason,
            }
            .into())
        };
        if self.candidates.is_empty() {
            return bad("a tournament needs at least one candidate");
        }
        if self.test.is_empty() || self.candidates.iter().any(|c| c.argv.is_empty()) {
            return bad("every candidate and the test need a program to run");
        }
        let mut names: Vec<&str> = self.candidates.iter().map(|c| c.name.as_str()).collect();
        names.sort_unstable();
        if names.windows(2).any(|w| w[0] == w[1]) {
            return bad("candidate names must differ");
        }
        Ok(())
    }

    /// Runs one candidate and the test in its working tree, recording both.
    fn contest(
        &self,
        forks: &Forks,
        launcher_for: &(dyn Fn(&WorkingTree) -> Result<Box<dyn Launcher>> + Sync),
        candidate: &Candidate,
        tree: &WorkingTree,
        start: Instant,
    ) -> Result<Contestant> {
        let launcher = launcher_for(tree)?;
        let (run, _) = self.run_recorded(forks, &*launcher, tree, &candidate.argv, false)?;
        let (test, output) = self.run_recorded(forks, &*launcher, tree, &self.test, true)?;
        Ok(Contestant {
            candidate: candidate.clone(),
            branch: tree.branch.clone(),
            run,
            passed: test.success(),
            test,
            head: forks.env().head(&tree.branch)?,
            test_output: output,
            finished_after: start.elapsed(),
        })
    }

    /// Runs one command in a working tree and records it on the tree's branch as one operation
    /// holding the files it changed and its output, as the shell records a command.
    fn run_recorded(
        &self,
        forks: &Forks,
        launcher: &dyn Launcher,
        tree: &WorkingTree,
        argv: &[String],
        is_test: bool,
    ) -> Result<(Exit, StoredOutput)> {
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .current_dir(launcher.workspace_inside());
        launcher.confine(&mut cmd)?;
        let started_ms = now_ms();
        let started = Instant::now();
        let ran = exec::run(
            cmd,
            &argv[0],
            Vec::new(),
            Some(self.timeout),
            &Cancel::new(),
            || Collector::new(Redactor::default(), OUTPUT_LIMIT),
        )?;
        let env = forks.env();
        let guard = env.blobs().write_guard().map_err(EnvError::from)?;
        let record = exec::record(
            env,
            &ran,
            argv,
            "",
            started_ms,
            started.elapsed().as_millis() as u64,
        )?;
        let intent = if is_test {
            Intent::new(IntentKind::Test, format!("test: {}", command_line(argv)))
        } else {
            Intent::new(IntentKind::Command, command_line(argv))
        };
        forks.capture(tree, &self.actor, intent, record.flags, record.changes)?;
        drop(guard);
        Ok((ran.exit, record.stdout))
    }

    /// Makes the winner the target branch's head: a restore of the live tree (or of the branch)
    /// to it when the target has not moved since the base, a merge otherwise (written into the
    /// live tree). The live tree's tracker must track the target branch.
    fn adopt(&self, forks: &Forks, winner: &Contestant, live: Option<&Tracker>) -> Result<OpId> {
        let env = forks.env();
        let intent = Intent::new(
            IntentKind::Merge,
            format!("adopt tournament winner {}", winner.candidate.name),
        );
        if let Some(tracker) = live {
            // What the live tree gained meanwhile is in the target before it is compared.
            tracker.capture_now(
                Intent::new(
                    IntentKind::Capture,
                    "capture before adopting a tournament winner",
                ),
                OpFlags::AUTO_CAPTURE,
            )?;
        }
        let head = env.head(&self.target)?;
        let moved = env.diff(&self.actor, &self.base, &head, None)?;
        match (moved.is_empty(), live) {
            (true, Some(tracker)) => {
                tracker.restore(&self.actor, &winner.head, intent)?;
            }
            (true, None) => {
                env.restore(&self.actor, &self.target, &winner.head, intent)?;
            }
            (false, live) => {
                env.merge(&self.actor, &winner.branch, &self.target, intent)?;
                if let Some(tracker) = live {
                    tracker.sync()?;
                }
            }
        }
        Ok(env.head(&self.target)?)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A shell script as a command line.
pub fn sh(script: &str) -> Vec<String> {
    vec!["/bin/sh".into(), "-c".into(), script.into()]
}
