//! A tournament: candidate commands run side by side, each in a fork of the workspace with a
//! sandbox of its own, judged by one test; the winner is adopted into the live tree as the
//! workspace's actor (core decides every key it changes).

use environment_core::{Action, Resource};
use environment_sandbox::fork::tournament::sh;
use environment_sandbox::{Forks, Pick, Tournament};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ServiceError;
use super::session::{Session, resolve};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct TournamentParams {
    /// Shell scripts, one per candidate.
    candidates: Vec<String>,
    /// The shell script that judges each candidate's tree (exit 0 passes).
    test: String,
    #[serde(default)]
    base: Option<String>,
    #[serde(default)]
    jobs: Option<usize>,
    #[serde(default)]
    pick_all: bool,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

/// Runs the candidates, then adopts the winner (if any passed) into the live tree.
pub(super) fn run(g: &Session<'_>, p: TournamentParams) -> Result<Value, ServiceError> {
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
    let mut t = Tournament::of_scripts(shared.actor.clone(), base, &p.candidates, &p.test);
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
    Ok(json!({ "base": base.to_string(), "report": report.to_json() }))
}
