//! Retention: recent captures kept, older ones thinned to about K + log2(N), stable over time,
//! protected versions never dropped, the log still verifiable, unreferenced content collected.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use environment_core::{
    ActRequest, ActorId, EnvError, HistoryEntry, HistoryOptions, Intent, IntentKind, Key,
    LocalEnvironment, ManualClock, OpFlags, OpId, Options, Value,
};
use environment_sandbox::retention::{self, Capture, RetentionPolicy};
use proptest::prelude::*;

fn policy() -> RetentionPolicy {
    RetentionPolicy {
        keep_last: 5,
        keep_within: Duration::from_secs(60),
        base: Duration::from_secs(60),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
    /// The schedule alone: bounded by K + O(log N), and stable (a later run keeps a subset).
    #[test]
    fn schedule_is_logarithmic_and_stable(gaps in proptest::collection::vec(1i64..600_000, 1..400), later in 0i64..10_000_000_000) {
        let mut t = 1_000_000_000_000i64;
        let captures: Vec<Capture> = gaps.iter().enumerate().map(|(i, g)| {
            t += g;
            Capture { id: OpId(environment_core::Hash::of(b"test", &i.to_le_bytes())), time_ms: t }
        }).collect();
        let p = policy();
        let now = t + 1;
        let k1 = retention::kept(&captures, now, &p);
        let k2 = retention::kept(&captures, now + later, &p);
        prop_assert!(k2.is_subset(&k1), "a later run kept something an earlier one dropped");
        let span = (now - captures[0].time_ms).max(1) as f64 / 60_000.0;
        let recent = captures.iter().filter(|c| now - c.time_ms < 60_000).count();
        let bound = p.keep_last + recent + 2 * (span.log2().max(0.0) as usize + 2);
        prop_assert!(k1.len() <= bound, "kept {} of {}, bound {}", k1.len(), captures.len(), bound);
        // Not degenerate: the oldest capture (the earliest of every interval it is in) stays.
        prop_assert!(k1.contains(&captures[0].id));
    }
}

#[test]
fn thinning_keeps_protected_versions_and_the_log_verifiable() {
    let home = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(1_700_000_000_000);
    let env = LocalEnvironment::open(
        home.path(),
        Options {
            clock: Arc::new(clock.clone()),
            ..Options::default()
        },
    )
    .unwrap();
    let watcher = ActorId::new("service:watcher").unwrap();
    let agent = ActorId::new("agent:x").unwrap();
    let mut captures = Vec::new();
    let mut protected = HashSet::new();
    for i in 0..600u32 {
        clock.advance(30_000);
        let v = env
            .act_blocking(
                ActRequest::new(
                    watcher.clone(),
                    Intent::new(IntentKind::Capture, "automatic capture"),
                )
                .flags(OpFlags::AUTO_CAPTURE)
                .put(
                    Key::fs(format!("f{}", i % 7)).unwrap(),
                    Value::file(vec![(i % 251) as u8; 200 + i as usize]),
                ),
            )
            .unwrap()
            .version;
        captures.push(v);
        match i {
            100 => {
                env.mark(&agent, "good", &v).unwrap();
                protected.insert(v);
            }
            200 => {
                env.create_branch(&agent, "experiment", &v).unwrap();
                protected.insert(v);
            }
            300 => {
                env.restore(
                    &agent,
                    "main",
                    &captures[250],
                    Intent::new(IntentKind::Restore, "back"),
                )
                .unwrap();
                protected.insert(captures[250]);
            }
            _ => {}
        }
    }
    let blobs_before = env.blobs().list().unwrap().len();
    let mut dropped_before: HashSet<OpId> = HashSet::new();
    for hours in [1i64, 5, 24, 24 * 7] {
        let now = clock_now(&clock) + hours * 3_600_000;
        let report = retention::thin(&env, &agent, "main", &policy(), now).unwrap();
        let dropped: HashSet<OpId> = captures
            .iter()
            .copied()
            .filter(|c| env.is_dropped(c).unwrap())
            .collect();
        assert!(
            dropped.is_superset(&dropped_before),
            "a dropped version came back"
        );
        assert!(
            dropped.is_disjoint(&protected),
            "a protected version was dropped"
        );
        assert!(
            report.kept <= 5 + protected.len() + 2 * 20,
            "kept {}",
            report.kept
        );
        assert!(report.kept > 5, "degenerated to the last K");
        dropped_before = dropped;
        env.verify(&environment_core::ActorId::system()).unwrap();
    }
    assert!(
        env.blobs().list().unwrap().len() < blobs_before,
        "no blob was collected"
    );
    let some_dropped = *dropped_before.iter().next().unwrap();
    assert!(matches!(
        env.read(&agent, &Key::fs("f0").unwrap(), &some_dropped),
        Err(EnvError::VersionDropped(_))
    ));
    assert!(matches!(
        env.restore(&agent, "main", &some_dropped, Intent::edit("x")),
        Err(EnvError::VersionDropped(_))
    ));
    // History skips what was dropped; every kept version still reads in full.
    for e in env
        .history(
            &agent,
            "main",
            &HistoryOptions {
                all: true,
                limit: usize::MAX,
            },
        )
        .unwrap()
    {
        if let HistoryEntry::Op { op, .. } = e {
            assert!(!dropped_before.contains(&op.id));
            env.list(
                &agent,
                &environment_core::KeyPrefix::all(environment_core::Namespace::Fs),
                &op.id,
            )
            .unwrap();
        }
    }
    env.verify_deep(&environment_core::ActorId::system())
        .unwrap();
}

fn clock_now(c: &ManualClock) -> i64 {
    use environment_core::Clock;
    c.now_ms()
}
