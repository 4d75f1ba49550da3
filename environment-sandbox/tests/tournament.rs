//! Tournament: three candidate fixes on forks of one version, one test, the winner adopted into
//! main and the live tree, the losers kept in history with their test output.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;

use common::{both, disk, no_isolation, no_skip, view, write};
use environment_core::{ActorId, Exit, Key, LocalEnvironment, OpFlags, Options};
use environment_sandbox::{
    Candidate, ForkConfig, Forks, Isolation, IsolationSpec, Launcher, Pick, Tournament, Tracker,
    TrackerConfig, WorkingTree, Workspace,
};

fn sh(name: &str, script: &str) -> Candidate {
    Candidate {
        name: name.to_owned(),
        argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
    }
}

fn launcher_for(tree: &WorkingTree) -> environment_sandbox::Result<Box<dyn Launcher>> {
    let mut spec = IsolationSpec::host(&tree.lower);
    spec.workspace = Some(Workspace::Overlay {
        lower: tree.lower.clone(),
        upper: tree.upper.clone(),
        work: tree.work.clone(),
    });
    Ok(Box::new(Isolation::new(spec)?))
}

fn scenario(dir: &Path) {
    let work = dir.join("work");
    write(&work, "calc.sh", b"echo $((1 + 2))\n");
    write(&work, "README", b"adds one and one\n");
    let env = LocalEnvironment::open(dir.join("home"), Options::default()).unwrap();
    let mut cfg = TrackerConfig::new(&work, ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    let tracker = Tracker::open(env.clone(), cfg).unwrap();
    let base = env.head("main").unwrap();
    let forks = Forks::open(env.clone(), ForkConfig::default()).unwrap();
    let runner = ActorId::new("agent:tournament").unwrap();

    let mut t = Tournament::new(
        runner.clone(),
        base,
        vec![
            sh("wrong", "echo 'echo 3' > calc.sh && echo tried three"),
            sh(
                "right",
                "echo 'echo $((1 + 1))' > calc.sh && echo notes > NOTES",
            ),
            sh("vandal", "rm calc.sh README"),
        ],
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "test \"$(sh calc.sh)\" = 2 && echo PASS".into(),
        ],
    );
    t.pick = Pick::AllPassers;
    t.concurrency = 2;
    let report = t.run(&forks, &launcher_for, Some(&tracker)).unwrap();

    let names: Vec<(&str, bool)> = report
        .contestants
        .iter()
        .map(|c| (c.candidate.name.as_str(), c.passed))
        .collect();
    assert_eq!(
        names,
        [("wrong", false), ("right", true), ("vandal", false)]
    );
    assert_eq!(report.winner, Some(1));
    let winner = &report.contestants[1];
    assert!(winner.test_output.preview.contains("PASS"));

    // The winner is main's head and the live tree.
    let head = env.head("main").unwrap();
    assert_eq!(report.adopted, Some(head));
    assert_eq!(disk(&work, &no_skip), view(&env, &winner.head));
    assert_eq!(
        std::fs::read_to_string(work.join("calc.sh")).unwrap(),
        "echo $((1 + 1))\n"
    );
    assert!(work.join("NOTES").exists());

    // The losers stay in history as branches, with their test output recorded.
    let stdout = Key::obj("exec/stdout").unwrap();
    for loser in [&report.contestants[0], &report.contestants[2]] {
        assert_eq!(env.head(&loser.branch).unwrap(), loser.head);
        assert_eq!(loser.test, Exit::Code(1));
        let out = env
            .read_unchecked(&stdout, &loser.head)
            .unwrap()
            .expect("the test's output is recorded");
        assert_eq!(out.blob(), Some(loser.test_output.blob));
        let op = env.op(&loser.head).unwrap();
        assert!(op.flags.contains(OpFlags::FAILED), "{:?}", op.flags);
        assert_eq!(op.actor, runner);
        assert!(op.intent.text.starts_with("test: "), "{}", op.intent.text);
    }
    let vandal = &report.contestants[2];
    let gone = env
        .read_unchecked(&Key::fs("calc.sh").unwrap(), &vandal.head)
        .unwrap();
    assert!(
        gone.is_none(),
        "the vandal's deletion was captured from its overlay"
    );
    // The candidate's own run is the operation before the test, with its output.
    let wrong = &report.contestants[0];
    let candidate_op = env.op(&wrong.head).unwrap().parents[0];
    let said = env.read_unchecked(&stdout, &candidate_op).unwrap().unwrap();
    assert_eq!(env.content(&said).unwrap(), b"tried three\n");
    env.verify_deep(&environment_core::ActorId::system())
        .unwrap();
}

#[test]
fn three_candidates_one_winner() {
    both("three_candidates_one_winner", no_isolation, scenario);
}

/// When main moved on while the candidates ran, the winner is merged into it, not restored
/// over it: nothing main gained meanwhile is lost.
#[test]
fn a_winner_is_merged_into_a_main_that_moved() {
    if let Err(e) = Isolation::probe() {
        common::missing_prerequisite(&e.to_string());
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    write(&work, "calc.sh", b"echo $((1 + 2))\n");
    let env = LocalEnvironment::open(dir.path().join("home"), Options::default()).unwrap();
    let mut cfg = TrackerConfig::new(&work, ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    let tracker = Tracker::open(env.clone(), cfg).unwrap();
    let base = env.head("main").unwrap();
    write(&work, "meanwhile.txt", b"a human edit\n");
    tracker
        .capture_now(
            environment_core::Intent::new(environment_core::IntentKind::Edit, "meanwhile"),
            OpFlags::empty(),
        )
        .unwrap()
        .unwrap();
    let forks = Forks::open(env.clone(), ForkConfig::default()).unwrap();
    let t = Tournament::new(
        ActorId::new("agent:tournament").unwrap(),
        base,
        vec![sh("right", "echo 'echo 2' > calc.sh")],
        vec![
            "/bin/sh".into(),
            "-c".into(),
            "test \"$(sh calc.sh)\" = 2".into(),
        ],
    );
    let report = t.run(&forks, &launcher_for, Some(&tracker)).unwrap();
    assert_eq!(report.winner, Some(0));
    assert_eq!(
        std::fs::read_to_string(work.join("calc.sh")).unwrap(),
        "echo 2\n"
    );
    assert_eq!(
        std::fs::read_to_string(work.join("meanwhile.txt")).unwrap(),
        "a human edit\n"
    );
    let head = env.head("main").unwrap();
    let in_main = env
        .read_unchecked(&Key::fs("meanwhile.txt").unwrap(), &head)
        .unwrap();
    assert!(in_main.is_some());
}

#[test]
fn bad_tournaments_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(dir.path(), Options::default()).unwrap();
    let forks = Forks::open(env.clone(), ForkConfig::default()).unwrap();
    let base = env.head("main").unwrap();
    let actor = ActorId::new("agent:t").unwrap();
    let test = vec!["true".to_owned()];
    let no_candidates = Tournament::new(actor.clone(), base, Vec::new(), test.clone());
    let twins = Tournament::new(
        actor.clone(),
        base,
        vec![sh("a", "true"), sh("a", "true")],
        test.clone(),
    );
    let no_test = Tournament::new(actor.clone(), base, vec![sh("a", "true")], Vec::new());
    for t in [no_candidates, twins, no_test] {
        assert!(t.run(&forks, &launcher_for, None).is_err());
    }
    assert_eq!(env.branches().unwrap().len(), 1);
}
