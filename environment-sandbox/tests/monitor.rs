//! The workspace monitor keeps the dirty set between trackers: a tracker opened after another
//! learns what changed from it without rescanning, and nothing leaves the set before a capture
//! that recorded it is acknowledged.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use common::{disk, no_skip, view, write};
use environment_core::{ActorId, LocalEnvironment, Options};
use environment_sandbox::monitor::{MonitorConfig, Served, serve};
use environment_sandbox::{MonitorClient, NoiseRules, Tracker, TrackerConfig};

struct Monitored {
    work: tempfile::TempDir,
    home: tempfile::TempDir,
    env: LocalEnvironment,
    socket: PathBuf,
    served: Option<std::thread::JoinHandle<Served>>,
}

impl Monitored {
    fn new() -> Monitored {
        let work = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        write(work.path(), "keep.txt", b"keep\n");
        write(work.path(), "gone.txt", b"gone\n");
        write(work.path(), "src/lib.rs", b"pub fn f() {}\n");
        let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
        let socket = home.path().join("run/monitor.sock");
        let config = MonitorConfig {
            socket: socket.clone(),
            idle: Duration::from_secs(600),
            guard: home.path().to_owned(),
        };
        let served = std::thread::spawn(move || serve(config).unwrap());
        MonitorClient::connect_waiting(&socket, Duration::from_secs(5)).unwrap();
        Monitored {
            work,
            home,
            env,
            socket,
            served: Some(served),
        }
    }

    fn root(&self) -> PathBuf {
        self.work.path().canonicalize().unwrap()
    }

    fn config(&self, rescan_on_open: bool) -> TrackerConfig {
        let mut c = TrackerConfig::new(self.work.path(), ActorId::new("service:t").unwrap());
        c.auto = false;
        c.monitor = Some(self.socket.clone());
        c.rescan_on_open = rescan_on_open;
        c
    }

    fn head_matches_disk(&self) {
        let head = self.env.head("main").unwrap();
        assert_eq!(view(&self.env, &head), disk(self.work.path(), &no_skip));
    }

    fn changes(&self) -> environment_sandbox::monitor::Changes {
        MonitorClient::connect(&self.socket)
            .unwrap()
            .changes(&self.root(), &NoiseRules::default())
            .unwrap()
    }
}

impl Drop for Monitored {
    fn drop(&mut self) {
        if let Ok(c) = MonitorClient::connect(&self.socket) {
            let _ = c.stop();
        }
        if let Some(t) = self.served.take() {
            let _ = t.join();
        }
    }
}

fn paths(set: &BTreeSet<Vec<u8>>) -> Vec<String> {
    set.iter()
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect()
}

#[test]
fn a_later_tracker_learns_what_changed_without_rescanning() {
    let m = Monitored::new();
    // The first tracker rescans (the monitor just started watching) and gives it a baseline.
    Tracker::open(m.env.clone(), m.config(true))
        .unwrap()
        .close()
        .unwrap();
    m.head_matches_disk();
    assert_eq!(m.changes().incomplete, None, "the rescan was acknowledged");
    // Between two processes: an edit, a removal, a directory tree made at once, a rename.
    write(m.work.path(), "keep.txt", b"changed\n");
    std::fs::remove_file(m.work.path().join("gone.txt")).unwrap();
    std::fs::create_dir_all(m.work.path().join("a/b/c")).unwrap();
    write(m.work.path(), "a/b/c/deep.txt", b"deep\n");
    std::fs::rename(m.work.path().join("src"), m.work.path().join("lib")).unwrap();
    // A tracker that may not rescan records all of it: the monitor's set is complete.
    let t = Tracker::open(m.env.clone(), m.config(false)).unwrap();
    m.head_matches_disk();
    // And at its barriers it asks the monitor again.
    write(m.work.path(), "lib/new.rs", b"new\n");
    t.capture_now(
        environment_core::Intent::new(environment_core::IntentKind::Command, "step"),
        environment_core::OpFlags::COMMAND,
    )
    .unwrap();
    m.head_matches_disk();
    t.close().unwrap();
    assert!(m.changes().paths.is_empty(), "everything was acknowledged");
}

#[test]
fn nothing_leaves_the_set_before_its_capture_is_acknowledged() {
    let m = Monitored::new();
    Tracker::open(m.env.clone(), m.config(true))
        .unwrap()
        .close()
        .unwrap();
    write(m.work.path(), "keep.txt", b"one\n");
    // A command that read the set and died before committing: nothing is acknowledged.
    let read = m.changes();
    assert!(paths(&read.paths).contains(&"keep.txt".to_owned()));
    drop(read);
    // A change made after a drain survives an acknowledgement of that drain.
    let mut client = MonitorClient::connect(&m.socket).unwrap();
    let drained = client.changes(&m.root(), &NoiseRules::default()).unwrap();
    write(m.work.path(), "during.txt", b"made while the capture ran\n");
    write(m.work.path(), "keep.txt", b"two\n");
    client
        .acknowledge(&m.root(), drained.seq, &BTreeSet::new(), false)
        .unwrap();
    let after = paths(&m.changes().paths);
    assert!(after.contains(&"during.txt".to_owned()), "{after:?}");
    assert!(after.contains(&"keep.txt".to_owned()), "{after:?}");
    // So the next tracker, which may not rescan, still records both.
    Tracker::open(m.env.clone(), m.config(false))
        .unwrap()
        .close()
        .unwrap();
    m.head_matches_disk();
}

#[test]
fn without_a_baseline_a_tracker_rescans() {
    let m = Monitored::new();
    // Changes made before the monitor watched the tree: it cannot vouch for them.
    write(m.work.path(), "before.txt", b"before the monitor\n");
    let c = m.changes();
    assert!(c.incomplete.is_some(), "a new watch has no baseline");
    // A tracker that may not rescan records only what the monitor saw, and the monitor stays
    // without a baseline; its next barrier rescans and records everything.
    let t = Tracker::open(m.env.clone(), m.config(false)).unwrap();
    let head = m.env.head("main").unwrap();
    assert!(!view(&m.env, &head).contains_key("before.txt"));
    assert!(m.changes().incomplete.is_some());
    t.capture_now(
        environment_core::Intent::new(environment_core::IntentKind::Command, "step"),
        environment_core::OpFlags::COMMAND,
    )
    .unwrap();
    m.head_matches_disk();
    assert_eq!(m.changes().incomplete, None);
    drop(t);
    // Other noise rules are another watch: no baseline again.
    let mut other = NoiseRules::default();
    other.ignored.push("*.tmp".into());
    let c = MonitorClient::connect(&m.socket)
        .unwrap()
        .changes(&m.root(), &other)
        .unwrap();
    assert!(c.incomplete.is_some());
}

#[test]
fn a_question_asked_now_does_not_wait_for_the_watches() {
    let m = Monitored::new();
    write(m.work.path(), "before.txt", b"before the monitor\n");
    // The first question about a root, asked now: the watches are placed meanwhile, and the
    // answer is empty and says the set is not complete.
    let now = MonitorClient::connect(&m.socket)
        .unwrap()
        .changes_now(&m.root(), &NoiseRules::default())
        .unwrap();
    assert!(now.paths.is_empty(), "{:?}", paths(&now.paths));
    assert!(now.incomplete.is_some());
    // A question that waits gets the watched root, still without a baseline.
    let waited = m.changes();
    assert!(waited.incomplete.is_some());
    // A tracker that may not rescan, opened on a monitor that has never seen its root,
    // records nothing it does not know; the first tracker that rescans records everything.
    let other = tempfile::tempdir().unwrap();
    write(other.path(), "seen.txt", b"x\n");
    let other_home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(other_home.path(), Options::default()).unwrap();
    let mut config = m.config(false);
    config.root = other.path().to_owned();
    // Its first capture, without the monitor; then a change the monitor never saw.
    let mut alone = config.clone();
    alone.monitor = None;
    alone.rescan_on_open = true;
    Tracker::open(env.clone(), alone).unwrap().close().unwrap();
    write(other.path(), "unseen.txt", b"x\n");
    let t = Tracker::open(env.clone(), config.clone()).unwrap();
    let recorded = |env: &LocalEnvironment| {
        env.head("main")
            .map(|head| view(env, &head))
            .unwrap_or_default()
    };
    assert!(!recorded(&env).contains_key("unseen.txt"));
    drop(t);
    config.rescan_on_open = true;
    Tracker::open(env.clone(), config).unwrap().close().unwrap();
    assert_eq!(recorded(&env), disk(other.path(), &no_skip));
}

#[test]
fn a_second_monitor_does_not_start_and_a_stopped_one_costs_a_rescan() {
    let m = Monitored::new();
    let again = serve(MonitorConfig {
        socket: m.socket.clone(),
        idle: Duration::from_secs(1),
        guard: m.home.path().to_owned(),
    })
    .unwrap();
    assert_eq!(again, Served::AlreadyRunning);
    Tracker::open(m.env.clone(), m.config(true))
        .unwrap()
        .close()
        .unwrap();
    // The monitor goes away while a tracker holds it: the tracker's next barrier rescans.
    let t = Tracker::open(m.env.clone(), m.config(false)).unwrap();
    MonitorClient::connect(&m.socket).unwrap().stop().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    write(m.work.path(), "after-stop.txt", b"x\n");
    t.capture_now(
        environment_core::Intent::new(environment_core::IntentKind::Command, "step"),
        environment_core::OpFlags::COMMAND,
    )
    .unwrap();
    m.head_matches_disk();
}

#[test]
fn a_background_tracker_on_a_vouched_tree_never_rescans() {
    let m = Monitored::new();
    Tracker::open(m.env.clone(), m.config(true))
        .unwrap()
        .close()
        .unwrap();
    assert_eq!(m.changes().incomplete, None, "the monitor has a baseline");
    // A supervisor's tracker takes its opening set from the monitor and then watches by
    // itself: its first automatic capture records what its own watcher saw, without a rescan
    // (a capture that rescanned says so in its intent).
    let mut config = m.config(true);
    config.auto = true;
    config.quiet_period = Duration::from_millis(20);
    let t = Tracker::open(m.env.clone(), config).unwrap();
    let opened = m.env.head("main").unwrap();
    write(m.work.path(), "agent/one.txt", b"one\n");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while m.env.head("main").unwrap() == opened {
        assert!(std::time::Instant::now() < deadline, "nothing was captured");
        std::thread::sleep(Duration::from_millis(20));
    }
    let op = m.env.op(&m.env.head("main").unwrap()).unwrap();
    assert!(
        !op.intent.text.contains("rescan"),
        "the capture rescanned: {}",
        op.intent.text
    );
    t.close().unwrap();
    m.head_matches_disk();
}

#[test]
fn a_background_tracker_hands_back_what_it_recorded() {
    let m = Monitored::new();
    // A supervisor's tracker: it watches by itself, takes its opening set from the monitor…
    let mut config = m.config(true);
    config.auto = true;
    let t = Tracker::open(m.env.clone(), config).unwrap();
    write(m.work.path(), "agent/one.txt", b"one\n");
    write(m.work.path(), "keep.txt", b"changed by the agent\n");
    std::fs::remove_file(m.work.path().join("gone.txt")).unwrap();
    t.close().unwrap();
    m.head_matches_disk();
    // …and at its last capture tells the monitor that all of it is recorded: the next command
    // has nothing to read again, and the monitor's set is still complete.
    let after = m.changes();
    assert!(after.paths.is_empty(), "{:?}", paths(&after.paths));
    assert_eq!(after.incomplete, None);
    // What changes afterwards is the monitor's again.
    write(m.work.path(), "later.txt", b"later\n");
    assert!(paths(&m.changes().paths).contains(&"later.txt".to_owned()));
}
