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
