//! Crash safety, whatever keeps the log: a child process acts, begins and completes effects and
//! collects garbage in a loop, reporting every acknowledged result; it is SIGKILLed at random
//! moments. After each kill the parent reopens the environment and checks every invariant:
//! the log verifies, every acknowledged write reads back as written, every acknowledged effect
//! is done, and no effect was performed twice or without a record.
//!
//! The child is the calling test binary run again with one test selected: that test calls
//! [`child_entry`], which does the child's work when it is run as the child and nothing
//! otherwise.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use environment_core::{
    ActRequest, ActorId, BeginOutcome, EffectState, Hash, Intent, Key, OpId, Options, Value,
};
use rand::Rng;

use crate::log_port::{Backend, Place};

/// The child's place ([`Place::describe`]).
const PLACE: &str = "ENVIRONMENT_CRASH_PLACE";
/// The child's scratch directory, where it notes effects it performed.
const SCRATCH: &str = "ENVIRONMENT_CRASH_SCRATCH";

fn content_hash(bytes: &[u8]) -> String {
    Hash::of(b"crash test", bytes).to_hex()
}

/// Does the child's work, until killed, when this process is the child of
/// [`killed_at_random_moments`]; nothing otherwise. Call it from the test that
/// `killed_at_random_moments` is told to run.
pub fn child_entry(backend: &dyn Backend) {
    if let (Ok(place), Ok(scratch)) = (std::env::var(PLACE), std::env::var(SCRATCH)) {
        child(backend.at(&place).as_ref(), Path::new(&scratch));
    }
}

fn child(place: &dyn Place, scratch: &Path) {
    let env = place.open(Options::default());
    let actor = ActorId::new("agent:crash").unwrap();
    let mut rng = rand::rng();
    let run: u32 = rng.random();
    let out = std::io::stdout();
    let mut performed = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(scratch.join("performed.log"))
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
        if i % 25 == 24 {
            env.gc(&actor).unwrap();
        }
    }
}

/// Runs the child (the test `entry` of the calling test binary) on a new environment of
/// `backend` and kills it `kills` times at random moments once it has acknowledged its first
/// act, checking every invariant after each.
pub fn killed_at_random_moments(backend: &dyn Backend, entry: &str, kills: usize) {
    let place = backend.fresh();
    let scratch = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::rng();
    let mut acked_ops: Vec<(OpId, String, String)> = Vec::new();
    let mut acked_effects: Vec<String> = Vec::new();
    for _ in 0..kills {
        let mut child = Command::new(&exe)
            .args(["--exact", entry, "--nocapture", "--test-threads=1"])
            .env(PLACE, place.describe())
            .env(SCRATCH, scratch.path())
            .stdout(Stdio::piped())
            // Kept for the failure message: why a child stopped early.
            .stderr(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(scratch.path().join("child.err"))
                    .unwrap(),
            )
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (lines, said) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    break;
                }
            }
        });
        // Killed at a random moment of its work, not while it opens the stores: once it has
        // acknowledged an act (the test harness speaks first).
        let mut heard = Vec::new();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !heard.iter().any(|l: &String| l.starts_with("op ")) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match said.recv_timeout(left) {
                Ok(line) => heard.push(line),
                Err(_) => {
                    let _ = child.kill();
                    let said = std::fs::read_to_string(scratch.path().join("child.err"))
                        .unwrap_or_default();
                    panic!(
                        "the child acknowledged no act (it ended, or a minute passed); it said: {}",
                        &said[said.len().saturating_sub(3000)..]
                    )
                }
            }
        }
        std::thread::sleep(Duration::from_millis(rng.random_range(20..200)));
        child.kill().unwrap();
        child.wait().unwrap();
        reader.join().unwrap();
        heard.extend(said.try_iter());
        for line in heard {
            match line.split(' ').collect::<Vec<_>>().as_slice() {
                ["op", id, key, hash] => {
                    acked_ops.push((id.parse().unwrap(), key.to_string(), hash.to_string()))
                }
                ["done", key] => acked_effects.push(key.to_string()),
                _ => {}
            }
        }

        let env = place.open(Options::default());
        env.verify(&ActorId::system()).unwrap();
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
        let log = std::fs::read_to_string(scratch.path().join("performed.log")).unwrap_or_default();
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
    let said = std::fs::read_to_string(scratch.path().join("child.err")).unwrap_or_default();
    assert!(
        acked_ops.len() > kills,
        "the child made too little progress to mean anything ({} acts); it said: {}",
        acked_ops.len(),
        &said[said.len().saturating_sub(3000)..]
    );
}
