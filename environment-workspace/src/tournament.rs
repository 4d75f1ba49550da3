//! A tournament: candidate commands run side by side, each in a fork of the workspace with a
//! sandbox of its own, judged by one test; the winner is adopted into the live tree as the
//! workspace's actor (core decides every key it changes).

use environment_core::{Action, Exit, Resource};
use environment_sandbox::fork::tournament::sh;
use environment_sandbox::{Forks, Pick, Tournament, TournamentReport};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::error::ServiceError;
use super::session::{Session, resolve};

/// Runs candidate commands side by side, each in a fork of the workspace with a sandbox of its
/// own, judges each by one test, and adopts the winner into the workspace.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TournamentParams {
    /// Shell scripts, one per candidate, e.g. ["pip install 'x<2'", "pip install 'x>=2'"].
    pub candidates: Vec<String>,
    /// The shell script that judges each candidate's tree (exit 0 passes), e.g. "pytest -q".
    pub test: String,
    /// The version every candidate starts from (default: the workspace as it is now).
    #[serde(default)]
    pub base: Option<String>,
    /// How many candidates run at once (default 4).
    #[serde(default)]
    pub jobs: Option<usize>,
    /// Run every candidate to its end; the first passer in candidate order wins (default: the
    /// first to pass in time).
    #[serde(default)]
    pub pick_all: bool,
    /// Kill a candidate or its test after this many milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// A tournament's outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    /// The version every candidate started from.
    pub base: String,
    /// How each candidate did.
    pub report: Report,
}

/// How each candidate did, and which won.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Report {
    /// Every contestant, in candidate order.
    pub contestants: Vec<Contestant>,
    /// The index of the winner, if any passed.
    pub winner: Option<usize>,
    /// The workspace branch's head after adopting the winner.
    pub adopted: Option<String>,
}

/// One candidate's run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Contestant {
    /// The candidate.
    pub candidate: Candidate,
    /// The branch its fork recorded on.
    pub branch: String,
    /// How its command ended.
    pub run: Exit,
    /// How the test ended.
    pub test: Exit,
    /// The test passed.
    pub passed: bool,
    /// Its fork's head.
    pub head: String,
    /// The test's output.
    pub test_output: Output,
    /// When it finished, from the start.
    pub finished_after_ms: u64,
}

/// A candidate command.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    /// Its name.
    pub name: String,
    /// The program and its arguments.
    pub argv: Vec<String>,
}

/// Stored output: its blob, and how much was kept.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Output {
    /// The blob that holds it.
    pub blob: String,
    /// Bytes written.
    pub total: u64,
    /// Bytes kept.
    pub stored: u64,
    /// More was written than kept.
    pub truncated: bool,
}

impl From<&TournamentReport> for Report {
    fn from(r: &TournamentReport) -> Report {
        Report {
            contestants: r
                .contestants
                .iter()
                .map(|c| Contestant {
                    candidate: Candidate {
                        name: c.candidate.name.clone(),
                        argv: c.candidate.argv.clone(),
                    },
                    branch: c.branch.clone(),
                    run: c.run,
                    test: c.test,
                    passed: c.passed,
                    head: c.head.to_string(),
                    test_output: Output {
                        blob: c.test_output.blob.to_string(),
                        total: c.test_output.total,
                        stored: c.test_output.stored,
                        truncated: c.test_output.truncated,
                    },
                    finished_after_ms: c.finished_after.as_millis() as u64,
                })
                .collect(),
            winner: r.winner,
            adopted: r.adopted.map(|v| v.to_string()),
        }
    }
}

/// Runs the candidates, then adopts the winner (if any passed) into the live tree.
pub(super) fn run(g: &Session<'_>, p: TournamentParams) -> Result<Outcome, ServiceError> {
    let shared = g.shared();
    let forking = shared
        .forking
        .as_ref()
        .ok_or_else(|| ServiceError::unavailable("a tournament (forks in sandboxes)"))?;
    if p.candidates.is_empty() || p.jobs == Some(0) {
        return Err(ServiceError::invalid(
            "a tournament needs at least one candidate and one job",
        ));
    }
    // Nothing decides the programs again: the forks' sandboxes run them as they are.
    for script in p.candidates.iter().chain(std::iter::once(&p.test)) {
        let mut argv = sh(script);
        let program = argv.remove(0);
        g.allow(
            Action::Execute,
            Resource::Program {
                program,
                args: argv,
            },
            Some("tournament"),
        )?;
    }
    let base = match &p.base {
        Some(v) => resolve(shared, v)?,
        None => {
            g.capture("capture before a tournament")?;
            g.env().head(g.branch()).map_err(ServiceError::from)?
        }
    };
    let mut t = Tournament::of_scripts(g.actor().clone(), base, &p.candidates, &p.test);
    if let Some(jobs) = p.jobs {
        t.concurrency = jobs;
    }
    if let Some(ms) = p.timeout_ms {
        t.timeout = std::time::Duration::from_millis(ms);
    }
    t.pick = if p.pick_all {
        Pick::AllPassers
    } else {
        Pick::FirstToPass
    };
    let forks = Forks::open(g.env(), forking.config.clone()).map_err(ServiceError::from)?;
    let report = shared
        .with_tracker(|live| t.run(&forks, &*forking.sandbox, Some(live)))
        .map_err(ServiceError::from)?;
    Ok(Outcome {
        base: base.to_string(),
        report: Report::from(&report),
    })
}
