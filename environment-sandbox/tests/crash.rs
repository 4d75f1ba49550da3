//! Crash safety: a child capturing (or restoring) in a loop is SIGKILLed at random moments; the
//! parent reopens, re-runs, and compares the live tree byte for byte with the expected view.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{disk, no_skip, view, write};
use environment_core::{ActorId, Intent, IntentKind, LocalEnvironment, OpFlags, OpId, Options};
use environment_sandbox::{Tracker, TrackerConfig};
use rand::Rng;

const ROLE: &str = "ENVIRONMENT_SANDBOX_CRASH_ROLE";
const DIR: &str = "ENVIRONMENT_SANDBOX_CRASH_DIR";
const KILLS: usize = 50;

fn open(dir: &Path) -> (LocalEnvironment, Tracker) {
    let env = LocalEnvironment::open(dir.join("home"), Options::default()).unwrap();
    let mut cfg = TrackerConfig::new(dir.join("work"), ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    let t = Tracker::open(env.clone(), cfg).unwrap();
    (env, t)
}

fn mutate(work: &Path, rng: &mut impl Rng) {
    let n = rng.random_range(0..40);
    let p = format!("d{}/f{n}", n % 5);
    match rng.random_range(0..4) {
        0 => {
            let _ = std::fs::remove_file(work.join(&p));
        }
        1 => write(
            work,
            &p,
            &vec![b'a' + (n as u8 % 26); rng.random_range(0..5000)],
        ),
        _ => write(work, &p, format!("{n}-{}", rng.random::<u32>()).as_bytes()),
    }
}

fn child(dir: &Path, role: &str) {
    let (env, tracker) = open(dir);
    let agent = ActorId::new("agent:crash").unwrap();
    let mut rng = rand::rng();
    let out = std::io::stdout();
    match role {
        "capture" => loop {
            for _ in 0..rng.random_range(1..20) {
                mutate(&dir.join("work"), &mut rng);
            }
            if let Some(obs) = tracker
                .capture_now(Intent::new(IntentKind::Command, "work"), OpFlags::COMMAND)
                .unwrap()
            {
                writeln!(out.lock(), "captured {}", obs.version).unwrap();
            }
        },
        "sync" => {
            // A second working copy, following the first: each of the first's captures is
            // written into it.
            let copy = Tracker::open(env.clone(), copy_config(dir)).unwrap();
            loop {
                for _ in 0..rng.random_range(1..20) {
                    mutate(&dir.join("work"), &mut rng);
                }
                tracker
                    .capture_now(Intent::new(IntentKind::Command, "work"), OpFlags::COMMAND)
                    .unwrap();
                let plan = copy.sync().unwrap();
                writeln!(out.lock(), "synced {}", plan.to).unwrap();
            }
        }
        _ => {
            let a = env.resolve("a").unwrap();
            let b = env.resolve("b").unwrap();
            loop {
                for target in [a, b] {
                    tracker
                        .restore(&agent, &target, Intent::new(IntentKind::Restore, "flip"))
                        .unwrap();
                    writeln!(out.lock(), "restored {target}").unwrap();
                }
            }
        }
    }
}

#[test]
fn crash_child_entry() {
    // The child's loop when re-executed by the tests below; a no-op otherwise.
    if let (Ok(role), Ok(dir)) = (std::env::var(ROLE), std::env::var(DIR)) {
        child(Path::new(&dir), &role);
    }
}

fn run_and_kill(dir: &Path, role: &str, rng: &mut impl Rng) -> Vec<String> {
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_child_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE, role)
        .env(DIR, dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = c.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .collect::<Vec<_>>()
    });
    std::thread::sleep(Duration::from_millis(rng.random_range(30..250)));
    c.kill().unwrap();
    c.wait().unwrap();
    reader.join().unwrap()
}

#[test]
fn killed_during_capture() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("work")).unwrap();
    let mut rng = rand::rng();
    let mut acked: Vec<OpId> = Vec::new();
    for _ in 0..KILLS {
        for line in run_and_kill(dir.path(), "capture", &mut rng) {
            if let Some(v) = line.strip_prefix("captured ") {
                acked.push(v.parse().unwrap());
            }
        }
        // Reopening captures whatever the child left uncaptured: the head is the tree.
        let (env, tracker) = open(dir.path());
        env.verify(&environment_core::ActorId::system()).unwrap();
        for v in &acked {
            env.op(v).unwrap();
        }
        let head = env.head("main").unwrap();
        assert_eq!(view(&env, &head), disk(&dir.path().join("work"), &no_skip));
        drop(tracker);
    }
    assert!(
        acked.len() > KILLS / 2,
        "too little progress to mean anything"
    );
}

fn copy_config(dir: &Path) -> TrackerConfig {
    let mut cfg = TrackerConfig::new(dir.join("copy"), ActorId::new("agent:copy").unwrap());
    cfg.auto = false;
    cfg
}

#[test]
fn killed_while_writing_others_changes_into_a_copy() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("work")).unwrap();
    let mut rng = rand::rng();
    {
        let (env, tracker) = open(dir.path());
        for _ in 0..200 {
            mutate(&dir.path().join("work"), &mut rng);
        }
        tracker
            .capture_now(Intent::new(IntentKind::Edit, "start"), OpFlags::empty())
            .unwrap();
        drop(Tracker::attach(env, copy_config(dir.path())).unwrap());
    }
    let mut synced = 0;
    for _ in 0..KILLS / 2 {
        synced += run_and_kill(dir.path(), "sync", &mut rng).len();
        let (env, tracker) = open(dir.path());
        let ops = env.verify(&ActorId::system()).unwrap().ops;
        // Reopened, the copy finishes the writing the kill interrupted and holds the head;
        // nothing half-written is ever recorded as the copy's own change.
        let copy = Tracker::open(env.clone(), copy_config(dir.path())).unwrap();
        assert!(copy.interrupted_restore().unwrap().is_none());
        copy.sync().unwrap();
        let head = env.head("main").unwrap();
        assert_eq!(disk(&dir.path().join("copy"), &no_skip), view(&env, &head));
        assert_eq!(disk(&dir.path().join("work"), &no_skip), view(&env, &head));
        let refused = env.refused(&ActorId::system(), "main", 5).unwrap();
        let at_head: Vec<_> = refused
            .iter()
            .map(|r| env.read_unchecked(&r.key, &r.head).unwrap())
            .collect();
        assert!(
            refused.is_empty(),
            "{refused:#?}\nthe head had: {at_head:#?}"
        );
        assert_eq!(
            env.verify(&ActorId::system()).unwrap().ops,
            ops,
            "the copy recorded a change of its own"
        );
        drop(tracker);
    }
    assert!(synced > 0, "no sync ever completed before a kill");
}

#[test]
fn killed_during_restore() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let mut rng = rand::rng();
    let agent = ActorId::new("agent:setup").unwrap();
    {
        let (env, tracker) = open(dir.path());
        for _ in 0..60 {
            mutate(&work, &mut rng);
        }
        let a = tracker
            .capture_now(Intent::new(IntentKind::Edit, "a"), OpFlags::empty())
            .unwrap()
            .unwrap()
            .version;
        env.mark(&agent, "a", &a).unwrap();
        for _ in 0..60 {
            mutate(&work, &mut rng);
        }
        std::fs::create_dir_all(work.join("only-in-b/deep")).unwrap();
        write(&work, "only-in-b/deep/file", &vec![7u8; 100_000]);
        let b = tracker
            .capture_now(Intent::new(IntentKind::Edit, "b"), OpFlags::empty())
            .unwrap()
            .unwrap()
            .version;
        env.mark(&agent, "b", &b).unwrap();
    }
    let mut completed = 0;
    for _ in 0..KILLS {
        let lines = run_and_kill(dir.path(), "restore", &mut rng);
        completed += lines.len();
        let (env, tracker) = open(dir.path());
        env.verify(&environment_core::ActorId::system()).unwrap();
        // Reopening finished whatever restore the kill interrupted, from its intent record:
        // the tree is one of the two versions, never a mix, and so is the head.
        assert!(tracker.interrupted_restore().unwrap().is_none());
        let (a, b) = (env.resolve("a").unwrap(), env.resolve("b").unwrap());
        let now = disk(&work, &no_skip);
        assert!(
            now == view(&env, &a) || now == view(&env, &b),
            "a half-restored tree survived the reopen"
        );
        assert_eq!(view(&env, &env.head("main").unwrap()), now);
        // Re-running a restore completes it, whatever state the kill left.
        let target = env
            .resolve(if rng.random_bool(0.5) { "a" } else { "b" })
            .unwrap();
        tracker
            .restore(
                &agent,
                &target,
                Intent::new(IntentKind::Restore, "complete"),
            )
            .unwrap();
        assert!(tracker.interrupted_restore().unwrap().is_none());
        assert_eq!(disk(&work, &no_skip), view(&env, &target));
    }
    assert!(completed > 0, "no restore ever completed before a kill");
}
