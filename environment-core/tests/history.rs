//! History for agents: key nodes kept, automatic captures squashed, the full log on request.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use environment_core::{
    ActRequest, ActorId, HistoryEntry, HistoryOptions, Intent, IntentKind, Key, LocalEnvironment,
    OpFlags, Options, Value,
};

#[test]
fn captures_are_squashed_and_key_nodes_stay() {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let agent = ActorId::new("agent:coder").unwrap();
    let watcher = ActorId::new("service:watcher").unwrap();
    let capture = |from: usize, n: usize| {
        for i in from..from + n {
            env.act_blocking(
                ActRequest::new(
                    watcher.clone(),
                    Intent::new(IntentKind::Capture, "automatic capture"),
                )
                .flags(OpFlags::AUTO_CAPTURE)
                .put(
                    Key::fs(format!("build/out{i}")).unwrap(),
                    Value::file(format!("{i}")),
                ),
            )
            .unwrap();
        }
    };
    capture(0, 5);
    let fix = env
        .act_blocking(
            ActRequest::new(agent.clone(), Intent::edit("fix the parser")).put(
                Key::fs("src/parser.rs").unwrap(),
                Value::file("fn parse() {}"),
            ),
        )
        .unwrap();
    env.mark(&agent, "parser-fixed", &fix.version).unwrap();
    capture(5, 7);
    env.act_blocking(
        ActRequest::new(
            agent.clone(),
            Intent::new(IntentKind::Command, "cargo test"),
        )
        .flags(OpFlags::COMMAND | OpFlags::FAILED)
        .put(
            Key::obj("tests/last").unwrap(),
            Value::with_kind(environment_core::EntryKind::TestResult, "1 failed"),
        ),
    )
    .unwrap();
    env.restore(
        &agent,
        "main",
        &fix.version,
        Intent::new(IntentKind::Restore, "back to the fix"),
    )
    .unwrap();

    let h = env
        .history(&agent, "main", &HistoryOptions::default())
        .unwrap();
    let lines: Vec<String> = h.iter().map(|e| e.to_string()).collect();
    // restore, failed command, 7 captures squashed, the marked fix, 5 captures squashed, init.
    assert_eq!(h.len(), 6, "{lines:#?}");
    assert!(
        lines[0].contains("rollback") && lines[0].contains(&format!("to {}", fix.version.short())),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains("failed") && lines[1].contains("cargo test"),
        "{}",
        lines[1]
    );
    assert!(
        matches!(h[2], HistoryEntry::Captures { count: 7, .. }),
        "{}",
        lines[2]
    );
    assert!(
        lines[3].contains("mark parser-fixed") && lines[3].contains("fix the parser"),
        "{}",
        lines[3]
    );
    assert!(matches!(h[4], HistoryEntry::Captures { count: 5, .. }));
    assert!(lines[5].contains("init"));

    let all = env
        .history(
            &agent,
            "main",
            &HistoryOptions {
                all: true,
                limit: 1000,
            },
        )
        .unwrap();
    assert_eq!(all.len(), 1 + 5 + 1 + 7 + 1 + 1);
    assert!(all.iter().all(|e| matches!(e, HistoryEntry::Op { .. })));
}

#[test]
fn fork_points_and_versions_by_name() {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let agent = ActorId::new("agent:planner").unwrap();
    let v1 = env
        .act_blocking(
            ActRequest::new(agent.clone(), Intent::edit("a"))
                .put(Key::fs("a").unwrap(), Value::file("1")),
        )
        .unwrap()
        .version;
    env.create_branch(&agent, "feature/x", &v1).unwrap();
    let v2 = env
        .act_blocking(
            ActRequest::new(agent.clone(), Intent::edit("b"))
                .put(Key::fs("a").unwrap(), Value::file("2")),
        )
        .unwrap()
        .version;
    let h = env
        .history(&agent, "main", &HistoryOptions::default())
        .unwrap();
    assert!(h[1].to_string().contains("fork point"), "{}", h[1]);
    assert_eq!(env.resolve("main").unwrap(), v2);
    assert_eq!(env.resolve("HEAD~1").unwrap(), v1);
    assert_eq!(env.resolve(&v1.to_string()[..10]).unwrap(), v1);
    env.mark(&agent, "first", &v1).unwrap();
    assert_eq!(env.resolve("first").unwrap(), v1);
    assert_eq!(env.resolve("feature/x~1").unwrap(), v1);
}

/// A command's operation holds the files it changed and its output objects; the history says
/// how many files it changed.
#[test]
fn a_command_says_how_many_files_it_changed() {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let agent = ActorId::new("agent:coder").unwrap();
    let mut req = ActRequest::new(
        agent.clone(),
        Intent::new(IntentKind::Command, "pip install x"),
    )
    .flags(OpFlags::COMMAND)
    .put(Key::obj("exec/stdout").unwrap(), Value::file("installed"));
    for i in 0..312 {
        req = req.put(
            Key::fs(format!("site-packages/x/m{i}.py")).unwrap(),
            Value::file("pass"),
        );
    }
    let obs = env.act_blocking(req).unwrap();
    let op = env.op(&obs.version).unwrap();
    assert_eq!((op.summary.files, op.summary.objects()), (312, 1));
    let history = env
        .history(&agent, "main", &HistoryOptions::default())
        .unwrap();
    let line = history[0].to_string();
    assert!(
        line.contains("\"pip install x\"") && line.contains("312 files changed, 1 object"),
        "{line}"
    );
}

/// A step of a random history.
#[derive(Clone, Debug)]
enum Step {
    /// An automatic capture on the branch (`quiet`: of quiet paths only; `failed`: it failed).
    Capture { quiet: bool, failed: bool },
    /// An agent's edit: a key node.
    Edit,
    /// A mark on the n-th newest operation of the branch.
    Mark(usize),
    /// A branch forked from the n-th newest operation of main.
    Fork(usize),
    /// Retention drops the n-th newest operation of the branch.
    Drop(usize),
    /// Later steps go to the other branch (main, or the newest fork).
    Switch,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        8 => (any::<bool>(), proptest::bool::weighted(0.1))
            .prop_map(|(quiet, failed)| Step::Capture { quiet, failed }),
        2 => Just(Step::Edit),
        1 => (0usize..20).prop_map(Step::Mark),
        1 => (0usize..20).prop_map(Step::Fork),
        1 => (0usize..20).prop_map(Step::Drop),
        1 => Just(Step::Switch),
    ]
}

/// The history of every branch, as squashed, the full log, and squashed with a small limit.
fn histories(env: &LocalEnvironment, who: &ActorId) -> Vec<Vec<HistoryEntry>> {
    let mut out = Vec::new();
    for (branch, _) in env.branches().unwrap() {
        for options in [
            HistoryOptions::default(),
            HistoryOptions {
                all: true,
                limit: 1000,
            },
            HistoryOptions {
                all: false,
                limit: 3,
            },
        ] {
            out.push(env.history(who, &branch, &options).unwrap());
        }
    }
    out
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// History squashes a run of captures in one step from the summary recorded with its newest
    /// operation; the result is exactly what reading every operation gives (an environment whose
    /// summaries are gone, as one written by an earlier build), with marks, fork points, dropped
    /// operations and failed captures anywhere inside runs, on every branch.
    #[test]
    fn a_squashed_run_is_what_reading_every_operation_gives(
        steps in proptest::collection::vec(step(), 1..60),
    ) {
        let home = tempfile::tempdir().unwrap();
        let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
        let agent = ActorId::new("agent:coder").unwrap();
        let watcher = ActorId::new("service:watcher").unwrap();
        let mut branch = "main".to_owned();
        let mut forks = 0;
        let nth = |branch: &str, n: usize| {
            let all = env
                .history(&agent, branch, &HistoryOptions { all: true, limit: 1000 })
                .unwrap();
            match &all[n.min(all.len() - 1)] {
                HistoryEntry::Op { op, .. } => op.id,
                HistoryEntry::Captures { .. } => unreachable!("`all` squashes nothing"),
            }
        };
        for (i, s) in steps.iter().enumerate() {
            match s {
                Step::Capture { quiet, failed } => {
                    let mut flags = OpFlags::AUTO_CAPTURE;
                    if *quiet {
                        flags |= OpFlags::QUIET;
                    }
                    if *failed {
                        flags |= OpFlags::FAILED;
                    }
                    let mut req = ActRequest::new(
                        watcher.clone(),
                        Intent::new(IntentKind::Capture, "automatic capture"),
                    )
                    .on(branch.as_str())
                    .flags(flags);
                    for k in 0..=(i % 3) {
                        req = req.put(
                            Key::fs(format!("out/{i}-{k}")).unwrap(),
                            Value::file(format!("{i}")),
                        );
                    }
                    env.act_blocking(req).unwrap();
                }
                Step::Edit => {
                    env.act_blocking(
                        ActRequest::new(agent.clone(), Intent::edit("edit"))
                            .on(branch.as_str())
                            .put(Key::fs("src/lib.rs").unwrap(), Value::file(format!("{i}"))),
                    )
                    .unwrap();
                }
                Step::Mark(n) => {
                    env.mark(&agent, &format!("m{i}"), &nth(&branch, *n)).unwrap();
                }
                Step::Fork(n) => {
                    forks += 1;
                    env.create_branch(&agent, &format!("side/{forks}"), &nth("main", *n))
                        .unwrap();
                }
                Step::Drop(n) => {
                    // Protected versions (heads, marks) are refused: nothing changes then.
                    let _ = env.drop_versions(&agent, &[nth(&branch, *n)]);
                }
                Step::Switch => {
                    branch = if branch == "main" && forks > 0 {
                        format!("side/{forks}")
                    } else {
                        "main".to_owned()
                    };
                }
            }
        }
        let with_summaries = histories(&env, &agent);
        drop(env);
        let conn = rusqlite::Connection::open(home.path().join("env.db")).unwrap();
        let summaries = conn
            .execute("UPDATE ops SET run = NULL WHERE run IS NOT NULL", [])
            .unwrap();
        drop(conn);
        let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
        proptest::prop_assert_eq!(histories(&env, &agent), with_summaries);
        let captures = steps
            .iter()
            .filter(|s| matches!(s, Step::Capture { failed: false, .. }))
            .count();
        proptest::prop_assert!(captures == 0 || summaries > 0);
    }
}
