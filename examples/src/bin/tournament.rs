//! Tournament: three candidate fixes run at once, each in its own sandbox on its own fork of the
//! workspace; one test judges them; the winner becomes main and the live tree, the others stay in
//! history with their test output.
//!
//! `cargo run -p environment-examples --bin tournament`

use std::error::Error;

use environment_core::{ActorId, HistoryOptions, LocalEnvironment, Options};
use environment_sandbox::{
    Candidate, ForkConfig, Forks, Isolation, IsolationSpec, Launcher, Tournament, Tracker,
    TrackerConfig, WorkingTree, Workspace,
};

fn candidate(name: &str, script: &str) -> Candidate {
    Candidate {
        name: name.to_owned(),
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
    }
}

/// Each fork runs in user, mount and pid namespaces, the host read-only, its workspace the
/// overlay of its own changes over the shared base.
fn sandbox(tree: &WorkingTree) -> environment_sandbox::Result<Box<dyn Launcher>> {
    let mut spec = IsolationSpec::host(&tree.lower);
    spec.workspace = Some(Workspace::Overlay {
        lower: tree.lower.clone(),
        upper: tree.upper.clone(),
        work: tree.work.clone(),
    });
    spec.network = false;
    Ok(Box::new(Isolation::new(spec)?))
}

fn main() -> Result<(), Box<dyn Error>> {
    if let Err(e) = Isolation::probe() {
        println!("this host cannot make sandboxes, so there is no tournament to show: {e}");
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let work = dir.path().join("project");
    std::fs::create_dir_all(&work)?;
    std::fs::write(
        work.join("total.sh"),
        "echo $((2 + 2 + 2))  # should add two and two\n",
    )?;
    let env = LocalEnvironment::open(work.join(".environment"), Options::default())?;
    let mut config = TrackerConfig::new(&work, ActorId::new("service:watcher")?);
    config.auto = false;
    let tracker = Tracker::open(env.clone(), config)?;
    let forks = Forks::open(env.clone(), ForkConfig::default())?;

    let tournament = Tournament::new(
        ActorId::new("agent:planner")?,
        env.head("main")?,
        vec![
            candidate("subtract", "echo 'echo $((2 + 2 - 2))' > total.sh"),
            candidate(
                "add",
                "echo 'echo $((2 + 2))' > total.sh && echo 'fixed: 2 + 2' > CHANGES",
            ),
            candidate("rewrite", "echo 'echo four' > total.sh"),
        ],
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "test \"$(sh total.sh)\" = 4 && echo ok".into(),
        ],
    );
    let report = tournament.run(&forks, &sandbox, Some(&tracker))?;
    for (i, c) in report.contestants.iter().enumerate() {
        let mark = if Some(i) == report.winner {
            "winner"
        } else {
            "kept in history"
        };
        println!(
            "{:<9} test {:<4} branch {:<40} {mark}",
            c.candidate.name,
            if c.passed { "pass" } else { "fail" },
            c.branch
        );
    }
    println!(
        "live tree: total.sh = {}",
        std::fs::read_to_string(work.join("total.sh"))?.trim()
    );
    let watcher = ActorId::new("service:watcher")?;
    println!("\nhistory of main:");
    for entry in env.history(&watcher, "main", &HistoryOptions::default())? {
        println!("  {entry}");
    }
    if report.winner.is_none() {
        return Err("no candidate passed".into());
    }
    Ok(())
}
