//! Tournament: several candidate commands on forks of one version, one test, one winner.
//!
//! Each candidate runs in its own sandbox on its own fork, concurrently up to a bound; its
//! changes are captured as one operation on its fork's branch, then the test runs in the same
//! working tree and its outcome and output are recorded as a second operation there. The winner
//! is chosen by an explicit rule ([`Pick`]) and adopted as the new head of the target branch
//! (the live tree is restored to it when a tracker is given); every other contestant stays in
//! history as its branch, with its test output.

use std::fs::File;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use environment_core::{
    ActorId, Change, EntryKind, EnvError, Intent, IntentKind, Key, OpFlags, OpId, Value,
};
use serde::{Deserialize, Serialize};

use super::{Forks, WorkingTree};
use crate::error::{Result, SandboxError};
use crate::launch::Launcher;
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

/// How a command ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exit {
    /// Its exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// Whether it was killed for running out of time.
    pub timed_out: bool,
}

impl Exit {
    /// Whether it exited with 0.
    pub fn success(&self) -> bool {
        self.code == Some(0) && !self.timed_out
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
    /// How the test ended (none if the candidate could not be started).
    pub test: Option<Exit>,
    /// Whether the test passed.
    pub passed: bool,
    /// The head of its branch after the test.
    pub head: OpId,
    /// The end of the test's output (the whole output is in the recorded operation).
    pub test_output_tail: String,
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
        let mut trees = Vec::with_capacity(self.candidates.len());
        for c in &self.candidates {
            let mut t = forks.fork(
                &self.actor,
                &self.base,
                1,
                &format!("{}/{}", self.name, c.name),
            )?;
            trees.append(&mut t);
        }
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
        let run = self.run_recorded(forks, &*launcher, tree, "candidate", &candidate.argv)?;
        let test = self.run_recorded(forks, &*launcher, tree, "test", &self.test)?;
        let passed = test.0.success();
        Ok(Contestant {
            candidate: candidate.clone(),
            branch: tree.branch.clone(),
            run: run.0,
            passed,
            test: Some(test.0),
            head: forks.env().head(&tree.branch)?,
            test_output_tail: test.1,
            finished_after: start.elapsed(),
        })
    }

    /// Runs one command in a working tree and records it as one operation on the tree's branch:
    /// the files it changed and its output, with its exit status.
    fn run_recorded(
        &self,
        forks: &Forks,
        launcher: &dyn Launcher,
        tree: &WorkingTree,
        stage: &str,
        argv: &[String],
    ) -> Result<(Exit, String)> {
        let stdout = tree.out.join(format!("{stage}.stdout"));
        let stderr = tree.out.join(format!("{stage}.stderr"));
        let exit = run(launcher, argv, &stdout, &stderr, self.timeout)?;
        let (out, out_cut) = read_limited(&stdout)?;
        let (err, err_cut) = read_limited(&stderr)?;
        let tail = String::from_utf8_lossy(&out[out.len().saturating_sub(2000)..]).into_owned();
        let kind = if stage == "test" {
            EntryKind::TestResult
        } else {
            EntryKind::Artifact
        };
        let status = match (exit.code, exit.signal) {
            (Some(c), _) => c.to_string(),
            (None, Some(s)) => format!("signal {s}"),
            _ => "unknown".to_owned(),
        };
        let output = |name: &str, bytes: Vec<u8>, cut: bool| -> Result<Change> {
            let key =
                Key::obj(format!("runs/{}/{stage}/{name}", tree.branch)).map_err(EnvError::from)?;
            let value = Value::with_kind(kind, bytes)
                .attr("command", argv.join(" "))
                .attr("exit", status.clone())
                .attr("timed_out", exit.timed_out.to_string())
                .attr("truncated", cut.to_string());
            Ok(Change::Put(key, value))
        };
        let extra = vec![
            output("stdout", out, out_cut)?,
            output("stderr", err, err_cut)?,
        ];
        let (intent_kind, text) = if stage == "test" {
            (IntentKind::Test, format!("test: {}", argv.join(" ")))
        } else {
            (IntentKind::Command, argv.join(" "))
        };
        let mut flags = OpFlags::COMMAND;
        if !exit.success() {
            flags |= OpFlags::FAILED;
        }
        forks.capture(
            tree,
            &self.actor,
            Intent::new(intent_kind, text),
            flags,
            extra,
        )?;
        Ok((exit, tail))
    }

    /// Makes the winner the target branch's head: a restore of the live tree (or of the branch)
    /// to it when the target has not moved since the base, a merge otherwise.
    fn adopt(&self, forks: &Forks, winner: &Contestant, live: Option<&Tracker>) -> Result<OpId> {
        let env = forks.env();
        let intent = Intent::new(
            IntentKind::Merge,
            format!("adopt tournament winner {}", winner.candidate.name),
        );
        let head = env.head(&self.target)?;
        let moved = env.diff(&self.actor, &self.base, &head, None)?;
        if moved.is_empty() {
            match live {
                Some(tracker) => {
                    tracker.restore(&self.actor, &winner.head, intent)?;
                }
                None => {
                    env.restore(&self.actor, &self.target, &winner.head, intent)?;
                }
            }
        } else {
            env.merge(&self.actor, &winner.branch, &self.target, intent.clone())?;
            if let Some(tracker) = live {
                let new_head = env.head(&self.target)?;
                tracker.restore(&self.actor, &new_head, intent)?;
            }
        }
        Ok(env.head(&self.target)?)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `argv` through `launcher`, output to two files, killed after `timeout`.
fn run(
    launcher: &dyn Launcher,
    argv: &[String],
    stdout: &Path,
    stderr: &Path,
    timeout: Duration,
) -> Result<Exit> {
    let create = |p: &Path| File::create(p).map_err(SandboxError::io("create", p));
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .current_dir(launcher.workspace_inside())
        .stdin(Stdio::null())
        .stdout(create(stdout)?)
        .stderr(create(stderr)?);
    launcher.confine(&mut cmd)?;
    let mut child = cmd
        .spawn()
        .map_err(SandboxError::io("spawn", Path::new(&argv[0])))?;
    let deadline = Instant::now() + timeout;
    let mut wait = Duration::from_millis(1);
    loop {
        if let Some(status) = child
            .try_wait()
            .map_err(SandboxError::io("wait", Path::new(&argv[0])))?
        {
            use std::os::unix::process::ExitStatusExt;
            return Ok(Exit {
                code: status.code(),
                signal: status.signal(),
                timed_out: false,
            });
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(Exit {
                code: None,
                signal: Some(9),
                timed_out: true,
            });
        }
        std::thread::sleep(wait);
        wait = (wait * 2).min(Duration::from_millis(50));
    }
}

/// The first [`OUTPUT_LIMIT`] bytes of a file, and whether there was more.
fn read_limited(path: &Path) -> Result<(Vec<u8>, bool)> {
    let file = File::open(path).map_err(SandboxError::io("open", path))?;
    let mut bytes = Vec::new();
    file.take(OUTPUT_LIMIT + 1)
        .read_to_end(&mut bytes)
        .map_err(SandboxError::io("read", path))?;
    let cut = bytes.len() as u64 > OUTPUT_LIMIT;
    bytes.truncate(OUTPUT_LIMIT as usize);
    Ok((bytes, cut))
}
