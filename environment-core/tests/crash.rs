//! Crash safety: a child process acts, begins and completes effects and collects garbage in a
//! loop, reporting every acknowledged result; it is SIGKILLed at random moments. After each kill
//! the parent reopens the environment and checks every invariant.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use environment_core::{
    ActRequest, ActorId, BeginOutcome, EffectState, Intent, Key, LocalEnvironment, OpId, Options,
    Value,
};
use rand::Rng;

const CHILD_ENV: &str = "ENVIRONMENT_CRASH_CHILD_HOME";
const KILLS: usize = 60;

fn content_hash(bytes: &[u8]) -> String {
    blake3::hash(bytes).to_hex().to_string()
}

/// The child's work: runs until killed.
fn child(home: &Path) {
    let env = LocalEnvironment::open(home.join("env"), Options::default()).unwrap();
    let actor = ActorId::new("agent:crash").unwrap();
    let mut rng = rand::rng();
    let run: u32 = rng.random();
    let out = std::io::stdout();
    let mut performed = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(home.join("performed.log"))
        .unwrap();
    for i in 0u64.. {
        let n = rng.random_range(0..60);
        let key = format!("f/{}/{n}", n % 7);
        let size = if rng.random_bool(0.3) {
            rng.random_range(65..4000)
        } else {
            rng.random_range(0..60)
        };
        let bytes: Vec<u8> = (0..size)
            .map(|j| (j as u64 ^ i ^ run as u64) as u8)
            .collect();
        let obs = env
            .act_blocking(
                ActRequest::new(actor.clone(), Intent::edit(format!("write {key}")))
                    .put(Key::fs(key.clone()).unwrap(), Value::file(bytes.clone())),
            )
            .unwrap();
        writeln!(
            out.lock(),
            "op {} {key} {}",
            obs.version,
            content_hash(&bytes)
        )
        .unwrap();
        if i % 3 == 0 {
            let ekey = format!("e{}", rng.random_range(0..40));
            match env
                .effect_begin(&actor, &ekey, "svc", ekey.as_bytes())
                .unwrap()
            {
                BeginOutcome::New(rec) => {
                    // One write call, so a kill cannot leave half a line for the next run to
                    // append to (`writeln!` writes the key and the newline separately).
                    performed.write_all(format!("{ekey}\n").as_bytes()).unwrap();
                    performed.sync_data().unwrap();
                    env.effect_complete(&actor, rec.id, b"ok").unwrap();
                    writeln!(out.lock(), "done {ekey}").unwrap();
                }
                BeginOutcome::AlreadyDone(_) => writeln!(out.lock(), "done {ekey}").unwrap(),
                _ => {}
            }
        }
        if i % 25 == 0 {
            env.gc(&actor).unwrap();
        }
    }
}

#[test]
fn crash_child_entry() {
    // Runs the child's loop when re-executed by `killed_at_random_moments`; a no-op otherwise.
    if let Ok(home) = std::env::var(CHILD_ENV) {
        child(Path::new(&home));
    }
}

#[test]
fn killed_at_random_moments() {
    let home = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rng();
    let mut acked_ops: Vec<(OpId, String, String)> = Vec::new();
    let mut acked_effects: Vec<String> = Vec::new();
    for _ in 0..KILLS {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, home.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut lines = Vec::new();
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(l) => lines.push(l),
                    Err(_) => break,
                }
            }
            lines
        });
        std::thread::sleep(Duration::from_millis(rng.random_range(20..200)));
        child.kill().unwrap();
        child.wait().unwrap();
        for line in reader.join().unwrap() {
            let parts: Vec<&str> = line.split(' ').collect();
            match parts.as_slice() {
                ["op", id, key, hash] => {
                    acked_ops.push((id.parse().unwrap(), key.to_string(), hash.to_string()))
                }
                ["done", key] => acked_effects.push(key.to_string()),
                _ => {}
            }
        }

        let env = LocalEnvironment::open(home.path().join("env"), Options::default()).unwrap();
        env.verify(&environment_core::ActorId::system()).unwrap();
        for (id, key, hash) in &acked_ops {
            let v = env
                .read_unchecked(&Key::fs(key.as_str()).unwrap(), id)
                .unwrap()
                .expect("acknowledged write");
            assert_eq!(&content_hash(&env.content(&v).unwrap()), hash);
        }
        for key in &acked_effects {
            assert_eq!(env.effect(key).unwrap().unwrap().state, EffectState::Done);
        }
        let log = std::fs::read_to_string(home.path().join("performed.log")).unwrap_or_default();
        let mut times: HashMap<&str, usize> = HashMap::new();
        for k in log.lines() {
            *times.entry(k).or_default() += 1;
            assert!(
                env.effect(k).unwrap().is_some(),
                "effect {k} performed without a record"
            );
        }
        assert!(
            times.values().all(|n| *n == 1),
            "an effect ran twice: {times:?}"
        );
    }
    assert!(
        acked_ops.len() > KILLS,
        "the child made too little progress to mean anything"
    );
}
