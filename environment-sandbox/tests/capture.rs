//! Capture hazards, each its own test: everything a process does to the tree shows up in the
//! environment, and nothing else does.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use common::{Entry, disk, no_skip, setup, view, write};
use environment_core::{
    ActorId, HistoryEntry, HistoryOptions, Intent, IntentKind, LocalEnvironment, OpFlags, Options,
};
use environment_sandbox::{Tracker, TrackerConfig};

fn barrier(s: &common::Setup) -> Option<environment_core::Observation> {
    s.tracker
        .capture_now(Intent::new(IntentKind::Command, "step"), OpFlags::COMMAND)
        .unwrap()
}

fn head_matches_disk(s: &common::Setup) {
    let head = s.env.head("main").unwrap();
    assert_eq!(view(&s.env, &head), disk(s.work.path(), &no_skip));
}

#[test]
fn initial_capture_records_the_whole_tree() {
    let s = setup(|w| {
        write(w, "src/main.rs", b"fn main() {}\n");
        write(w, "README.md", &vec![b'r'; 5000]);
        std::os::unix::fs::symlink("src/main.rs", w.join("link")).unwrap();
    });
    head_matches_disk(&s);
}

#[test]
fn nested_directories_created_at_once_are_never_missed() {
    let s = setup(|_| {});
    std::fs::create_dir_all(s.work.path().join("a/b/c")).unwrap();
    std::fs::write(s.work.path().join("a/b/c/f"), b"x").unwrap();
    std::fs::create_dir_all(s.work.path().join("p/q/r/s/t")).unwrap();
    std::fs::write(s.work.path().join("p/q/r/s/t/deep"), b"y").unwrap();
    barrier(&s).expect("a capture");
    head_matches_disk(&s);
}

#[test]
fn renames_across_directories_pair_up() {
    let s = setup(|w| {
        write(w, "one/file.txt", b"content");
        write(w, "tree/sub/leaf", b"leaf");
        std::fs::create_dir_all(w.join("two")).unwrap();
    });
    std::fs::rename(
        s.work.path().join("one/file.txt"),
        s.work.path().join("two/renamed.txt"),
    )
    .unwrap();
    std::fs::rename(s.work.path().join("tree"), s.work.path().join("two/tree")).unwrap();
    barrier(&s).unwrap();
    head_matches_disk(&s);
    // The moved directory is still watched under its new name.
    std::fs::write(s.work.path().join("two/tree/sub/new"), b"n").unwrap();
    barrier(&s).unwrap();
    head_matches_disk(&s);
    // A directory moved out of the tree is a deletion; one moved in is scanned.
    let outside = tempfile::tempdir().unwrap();
    std::fs::rename(s.work.path().join("two/tree"), outside.path().join("tree")).unwrap();
    write(outside.path(), "incoming/x/y", b"in");
    std::fs::rename(
        outside.path().join("incoming"),
        s.work.path().join("incoming"),
    )
    .unwrap();
    barrier(&s).unwrap();
    head_matches_disk(&s);
    // Changes in the moved-out tree are not ours any more.
    std::fs::write(outside.path().join("tree/sub/leaf"), b"changed outside").unwrap();
    assert!(barrier(&s).is_none());
}

#[test]
fn queue_overflow_falls_back_to_a_rescan() {
    let s = setup(|_| {});
    let limit: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_queued_events")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(16384);
    // More events than the kernel queues, with nobody reading: the queue overflows.
    let dir = s.work.path().join("burst");
    std::fs::create_dir(&dir).unwrap();
    barrier(&s).unwrap();
    let n = limit / 2 + 100;
    for i in 0..n {
        std::fs::write(dir.join(format!("f{i}")), b"x").unwrap();
    }
    let obs = barrier(&s).unwrap();
    head_matches_disk(&s);
    let op = s.env.op(&obs.version).unwrap();
    assert!(
        op.intent.text.contains("rescan"),
        "the log says the capture came from a rescan: {}",
        op.intent.text
    );
}

#[test]
fn same_size_edit_with_the_mtime_put_back_is_seen() {
    let s = setup(|w| write(w, "data", b"aaaa"));
    let path = s.work.path().join("data");
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    std::thread::sleep(Duration::from_millis(10));
    std::fs::write(&path, b"bbbb").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    barrier(&s).expect("the edit is captured");
    head_matches_disk(&s);
    // Also without events: a rescan compares ctime, which the edit moved.
    drop(s.tracker);
    std::fs::write(&path, b"cccc").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(mtime)
        .unwrap();
    let mut cfg = TrackerConfig::new(s.work.path(), ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    let _t = Tracker::open(s.env.clone(), cfg).unwrap();
    let head = s.env.head("main").unwrap();
    assert_eq!(view(&s.env, &head), disk(s.work.path(), &no_skip));
}

#[test]
fn modes_including_special_bits_are_recorded_exactly() {
    let s = setup(|_| {});
    let w = s.work.path();
    for (name, mode) in [
        ("setuid", 0o4755),
        ("setgid", 0o2750),
        ("plain", 0o640),
        ("exec", 0o700),
    ] {
        write(w, name, name.as_bytes());
        std::fs::set_permissions(w.join(name), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    std::fs::create_dir(w.join("sticky")).unwrap();
    std::fs::set_permissions(w.join("sticky"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    barrier(&s).unwrap();
    let v = view(&s.env, &s.env.head("main").unwrap());
    assert_eq!(
        v["setuid"],
        Entry::File {
            mode: 0o4755,
            content: b"setuid".to_vec()
        }
    );
    assert_eq!(
        v["setgid"],
        Entry::File {
            mode: 0o2750,
            content: b"setgid".to_vec()
        }
    );
    assert_eq!(v["sticky"], Entry::Dir { mode: 0o1777 });
    head_matches_disk(&s);
}

#[test]
fn special_files_are_recorded_never_opened() {
    let s = setup(|_| {});
    let fifo = s.work.path().join("pipe");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    // Opening a FIFO for reading would block forever: the capture must not.
    barrier(&s).unwrap();
    let v = view(&s.env, &s.env.head("main").unwrap());
    assert_eq!(v["pipe"], Entry::Other("Fifo".into()));
}

#[test]
fn a_file_rewritten_during_capture_is_never_recorded_torn() {
    let s = setup(|w| write(w, "hot", &vec![b'A'; 1 << 20]));
    let path = s.work.path().join("hot");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (path, stop) = (path.clone(), stop.clone());
        std::thread::spawn(move || {
            use std::io::{Seek, Write};
            let mut f = std::fs::File::options().write(true).open(&path).unwrap();
            let mut n = 0u8;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                n = n.wrapping_add(1);
                let byte = b'A' + n % 26;
                f.seek(std::io::SeekFrom::Start(0)).unwrap();
                // Each rewrite is one write of the whole content; a read that overlaps one sees
                // a mix of two rewrites unless it is detected and repeated.
                f.write_all(&vec![byte; 1 << 20]).unwrap();
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut captured = 0;
    while Instant::now() < deadline {
        if let Some(obs) = barrier(&s) {
            captured += 1;
            if let Some(Entry::File { content, .. }) = view(&s.env, &obs.version).get("hot") {
                let first_diff = content.iter().position(|b| *b != content[0]);
                assert!(
                    first_diff.is_none(),
                    "a torn read was recorded: {:?} then {:?} at {:?}, len {}",
                    content[0] as char,
                    first_diff.map(|i| content[i] as char),
                    first_diff,
                    content.len()
                );
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    barrier(&s);
    head_matches_disk(&s);
    let _ = captured;
}

#[test]
fn ignored_paths_are_not_captured_and_quiet_ones_leave_no_history_node() {
    let s = setup(|w| write(w, "pkg/mod.py", b"x = 1"));
    let w = s.work.path();
    write(w, ".main.rs.swp", b"swap");
    write(w, "pkg/__pycache__/m.cpython.pyc", b"bytecode");
    assert!(
        barrier(&s).is_none(),
        "only ignored paths changed: no operation"
    );
    write(w, "target/debug/app", b"binary");
    let obs = barrier(&s).unwrap();
    let op = s.env.op(&obs.version).unwrap();
    assert!(op.flags.contains(OpFlags::QUIET));
    write(w, "src/lib.rs", b"pub fn f() {}");
    barrier(&s).unwrap();
    let h = s
        .env
        .history(&s.agent, "main", &HistoryOptions::default())
        .unwrap();
    assert!(
        matches!(&h[0], HistoryEntry::Op { op, .. } if op.summary.keys.iter().any(|k| k.path() == b"src/lib.rs"))
    );
    assert!(
        matches!(&h[1], HistoryEntry::Captures { quiet: 1, .. }),
        "{}",
        h[1]
    );
    let v = view(&s.env, &s.env.head("main").unwrap());
    assert!(!v.contains_key(".main.rs.swp") && !v.keys().any(|k| k.contains("__pycache__")));
}

#[test]
fn automatic_capture_debounces_and_respects_the_maximum_wait() {
    let work = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let mut cfg = TrackerConfig::new(work.path(), ActorId::new("service:watcher").unwrap());
    // Generous periods: a loaded machine must not split the burst or outlast the quiet period.
    cfg.quiet_period = Duration::from_millis(1000);
    cfg.max_wait = Duration::from_millis(2500);
    let tracker = Tracker::open(env.clone(), cfg).unwrap();
    // A burst of writes is one capture.
    for i in 0..50 {
        write(work.path(), &format!("burst/{i}"), b"x");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while tracker.captures() == 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(tracker.captures(), 1);
    // A writer that never pauses for the quiet period is still captured within the max wait.
    let start = Instant::now();
    while tracker.captures() < 2 && start.elapsed() < Duration::from_secs(20) {
        write(
            work.path(),
            "busy",
            start.elapsed().as_millis().to_string().as_bytes(),
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        tracker.captures() >= 2,
        "a busy writer postponed captures forever"
    );
    tracker.close().unwrap();
    assert_eq!(
        view(&env, &env.head("main").unwrap()),
        disk(work.path(), &no_skip)
    );
}

/// What cannot be read now (a mode-000 file as dpkg makes them, a directory that may not be
/// searched) is neither recorded nor removed: the rest of the batch is captured, the path stays
/// pending and named, and it is captured once it can be read.
fn unreadable_scenario(dir: &std::path::Path) {
    let work = dir.join("work");
    write(&work, "a.txt", b"a\n");
    write(&work, "d/x", b"inside\n");
    let env = LocalEnvironment::open(dir.join("home"), Options::default()).unwrap();
    let mut cfg = TrackerConfig::new(&work, ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    let tracker = Tracker::open(env.clone(), cfg).unwrap();
    let capture = || {
        tracker
            .capture_now(
                Intent::new(IntentKind::Capture, "now"),
                OpFlags::AUTO_CAPTURE,
            )
            .unwrap()
    };
    write(&work, "b.txt", b"b\n");
    write(&work, "c.txt", b"later\n");
    let set_mode = |rel: &str, mode: u32| {
        std::fs::set_permissions(work.join(rel), std::fs::Permissions::from_mode(mode)).unwrap();
    };
    set_mode("c.txt", 0o000);
    set_mode("d", 0o000);
    std::fs::write(work.join("b.txt"), "b2\n").unwrap();
    // Changes the tracker has not seen by events (auto is off): a rescan finds them.
    tracker.rescan_now().unwrap();
    capture();
    let root = rustix::process::geteuid().is_root();
    let v = view(&env, &env.head("main").unwrap());
    assert!(v.contains_key("b.txt"), "the rest of the batch is captured");
    assert!(
        v.contains_key("d/x"),
        "nothing under an unsearchable directory is removed"
    );
    if root {
        // Root reads mode-000 files: nothing is left unread.
        assert!(v.contains_key("c.txt"));
    } else {
        assert!(!v.contains_key("c.txt"));
        let unreadable: Vec<_> = tracker.unreadable().into_iter().map(|(p, _)| p).collect();
        assert!(unreadable.contains(&"c.txt".into()), "{unreadable:?}");
        // Still pending: another capture commits nothing and loses nothing.
        capture();
        let again = view(&env, &env.head("main").unwrap());
        assert!(again.contains_key("d/x") && !again.contains_key("c.txt"));
    }
    set_mode("c.txt", 0o644);
    set_mode("d", 0o755);
    capture();
    let v = view(&env, &env.head("main").unwrap());
    assert!(
        matches!(v.get("c.txt"), Some(Entry::File { content, .. }) if content == b"later\n"),
        "captured once readable"
    );
    assert!(v.contains_key("d/x"));
    assert!(tracker.unreadable().is_empty());
    assert_eq!(disk(&work, &no_skip), v);
    env.verify_deep(&environment_core::ActorId::system())
        .unwrap();
}

#[test]
fn an_unreadable_path_stays_pending_and_the_rest_is_captured() {
    common::both(
        "an_unreadable_path_stays_pending_and_the_rest_is_captured",
        common::always,
        unreadable_scenario,
    );
}

/// Allows everything, but while `refusing` is set the watcher's writes list a use that cannot
/// be spent when the operation commits: the capture fails as a whole (as one whose store fails
/// would), which is not a change refused by the policy.
struct Refusing {
    refusing: std::sync::atomic::AtomicBool,
}

impl environment_core::Authorizer for Refusing {
    fn decide(&self, r: &environment_core::AccessRequest) -> environment_core::Decision {
        let mut d = environment_core::Decision::allow_unconditionally();
        if self.refusing.load(std::sync::atomic::Ordering::SeqCst)
            && r.actor.as_str() == "service:watcher"
            && matches!(r.action, environment_core::Action::Write)
        {
            d.spend.push(environment_core::Spend::TokenUse {
                tag: "test:refusing".into(),
                max: 1,
            });
        }
        d
    }

    fn spend(
        &self,
        uses: &[environment_core::Spend],
    ) -> Result<(), Box<environment_core::Decision>> {
        if uses.is_empty() {
            return Ok(());
        }
        Err(Box::new(environment_core::Decision {
            verdict: environment_core::Verdict::Deny,
            rules: vec!["test:refusing".into()],
            policy_version: 1,
            next: String::new(),
            explanation: "not now".into(),
            spend: Vec::new(),
        }))
    }
}

/// A capture that fails keeps its whole batch: the next one records it.
#[test]
fn a_failed_capture_keeps_its_batch_for_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    write(&work, "a.txt", b"a\n");
    let gate = std::sync::Arc::new(Refusing {
        refusing: std::sync::atomic::AtomicBool::new(false),
    });
    let env = LocalEnvironment::open(
        dir.path().join("home"),
        Options {
            authorizer: gate.clone(),
            ..Options::default()
        },
    )
    .unwrap();
    let mut cfg = TrackerConfig::new(&work, ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    let tracker = Tracker::open(env.clone(), cfg).unwrap();
    write(&work, "b.txt", b"b\n");
    tracker.rescan_now().unwrap();
    gate.refusing
        .store(true, std::sync::atomic::Ordering::SeqCst);
    write(&work, "c.txt", b"c\n");
    // Found by a rescan (no watcher thread runs here), failed at its commit, kept.
    assert!(tracker.rescan_now().is_err());
    assert!(!view(&env, &env.head("main").unwrap()).contains_key("c.txt"));
    gate.refusing
        .store(false, std::sync::atomic::Ordering::SeqCst);
    tracker
        .capture_now(
            Intent::new(IntentKind::Capture, "now"),
            OpFlags::AUTO_CAPTURE,
        )
        .unwrap();
    let v = view(&env, &env.head("main").unwrap());
    assert!(
        v.contains_key("b.txt") && v.contains_key("c.txt"),
        "{:?}",
        v.keys()
    );
    assert_eq!(disk(&work, &no_skip), v);
}

/// A file that stays unreadable (its ctime older than the tracker's bound) is recorded with
/// its metadata and the unreadable marker, the operation says so, and a restore leaves what is
/// on disk alone, naming the path when it is missing.
fn without_content_scenario(dir: &std::path::Path) {
    use environment_sandbox::capture::UNREADABLE;
    let work = dir.join("work");
    write(&work, "a.txt", b"a\n");
    write(&work, "locked", b"never read\n");
    std::fs::set_permissions(work.join("locked"), std::fs::Permissions::from_mode(0o000)).unwrap();
    let env = LocalEnvironment::open(dir.join("home"), Options::default()).unwrap();
    let mut cfg = TrackerConfig::new(&work, ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    // A bound of an hour: the file stays pending.
    cfg.unreadable_after = Duration::from_secs(3600);
    let tracker = Tracker::open(env.clone(), cfg.clone()).unwrap();
    assert!(!view(&env, &env.head("main").unwrap()).contains_key("locked"));
    assert_eq!(tracker.unreadable().len(), 1);
    drop(tracker);
    // A bound already past: recorded without content, named, and said in the intent.
    cfg.unreadable_after = Duration::ZERO;
    let tracker = Tracker::open(env.clone(), cfg).unwrap();
    let head = env.head("main").unwrap();
    let key = environment_core::Key::fs("locked").unwrap();
    let value = env.read_unchecked(&key, &head).unwrap().expect("recorded");
    assert!(value.meta.attributes.contains_key(UNREADABLE), "{value:?}");
    assert_eq!(value.meta.mode, 0);
    assert!(tracker.unreadable().is_empty(), "no longer pending");
    assert_eq!(tracker.without_content().len(), 1);
    assert!(
        env.op(&head)
            .unwrap()
            .intent
            .text
            .contains("without content")
    );
    // Nothing changed since: another capture records nothing.
    assert!(
        tracker
            .capture_now(
                Intent::new(IntentKind::Capture, "again"),
                OpFlags::AUTO_CAPTURE
            )
            .unwrap()
            .is_none()
    );
    // Readable again: recorded with its content. A restore to the version without it leaves
    // the file on disk as it is…
    let agent = ActorId::new("agent:t").unwrap();
    std::fs::set_permissions(work.join("locked"), std::fs::Permissions::from_mode(0o600)).unwrap();
    tracker.rescan_now().unwrap();
    let v = view(&env, &env.head("main").unwrap());
    assert!(
        matches!(v.get("locked"), Some(Entry::File { content, .. }) if content == b"never read\n")
    );
    let plan = tracker
        .restore(&agent, &head, Intent::new(IntentKind::Restore, "back"))
        .unwrap();
    assert!(plan.not_restored.is_empty(), "{:?}", plan.not_restored);
    assert_eq!(std::fs::read(work.join("locked")).unwrap(), b"never read\n");
    // …and names it when it is gone: its content was never known.
    std::fs::remove_file(work.join("locked")).unwrap();
    tracker.rescan_now().unwrap();
    let plan = tracker
        .restore(&agent, &head, Intent::new(IntentKind::Restore, "again"))
        .unwrap();
    assert!(
        plan.not_restored
            .iter()
            .any(|(p, _)| p == std::path::Path::new("locked")),
        "{:?}",
        plan.not_restored
    );
}

#[test]
fn a_file_that_stays_unreadable_is_recorded_without_content() {
    common::as_nobody(
        "a_file_that_stays_unreadable_is_recorded_without_content",
        common::always,
        without_content_scenario,
    );
}

/// Set in this binary re-run under a lowered inotify watch limit.
const WATCH_LIMITED: &str = "ENVIRONMENT_TEST_WATCH_LIMITED";

/// Re-runs test `name` of this binary in a user namespace of its own whose inotify watch limit
/// is `limit` (that namespace's alone), as the current user and, as root, also as uid 65534.
fn under_watch_limit(name: &str, limit: u32) {
    let script = format!("echo {limit} > /proc/sys/user/max_inotify_watches && exec \"$@\"");
    let exe = std::env::current_exe().unwrap();
    let mut users: Vec<Vec<String>> = vec![Vec::new()];
    if rustix::process::geteuid().is_root() {
        users.push(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--",
            ]
            .map(str::to_owned)
            .to_vec(),
        );
    }
    for prefix in users {
        let mut argv = prefix.clone();
        argv.extend(["unshare", "-Ur", "sh", "-c", &script, "sh"].map(str::to_owned));
        let out = std::process::Command::new(&argv[0])
            .args(&argv[1..])
            .arg(&exe)
            .args(["--exact", name, "--nocapture", "--test-threads=1"])
            .env(WATCH_LIMITED, "1")
            .env("TMPDIR", "/tmp")
            .env("HOME", "/tmp")
            .current_dir("/")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() && text.contains("unshare:") {
            common::missing_prerequisite(&format!("a user namespace ({prefix:?}): {text}"));
            continue;
        }
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{prefix:?}: {text}"
        );
    }
}

#[test]
fn a_watch_limit_costs_rescans_never_a_change() {
    if std::env::var_os(WATCH_LIMITED).is_none() {
        return under_watch_limit("a_watch_limit_costs_rescans_never_a_change", 8);
    }
    // More directories than the limit lets the tracker watch.
    let deep = (0..24)
        .map(|i| format!("d{i}"))
        .collect::<Vec<_>>()
        .join("/");
    let work = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(work.path().join(&deep)).unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let mut cfg = TrackerConfig::new(work.path(), ActorId::new("service:watcher").unwrap());
    cfg.quiet_period = Duration::from_millis(50);
    let tracker = Tracker::open(env.clone(), cfg).unwrap();
    let why = tracker
        .blind()
        .expect("the tracker says the tree is not all watched");
    assert!(why.contains("watch limit"), "{why}");
    // A change where no watch sees it makes no event: the periodic rescan records it anyway
    // (the first ticks after the open may still rescan for the open's own sake).
    std::thread::sleep(Duration::from_secs(1));
    let file = format!("{deep}/unseen.txt");
    write(work.path(), &file, b"no event for this\n");
    let deadline = Instant::now() + Duration::from_secs(40);
    while !view(&env, &env.head("main").unwrap()).contains_key(&file) {
        assert!(Instant::now() < deadline, "never captured: {file}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A capture asked for rescans too, so it misses nothing either.
    let second = format!("{deep}/asked.txt");
    write(work.path(), &second, b"captured when asked\n");
    tracker
        .capture_now(Intent::new(IntentKind::Command, "step"), OpFlags::COMMAND)
        .unwrap();
    assert!(view(&env, &env.head("main").unwrap()).contains_key(&second));
    tracker.close().unwrap();
}

/// A rescan skips listing the head only while its cache is known to hold every key of it: a
/// path another tracker recorded (so absent from this one's loaded cache) and then deleted is
/// found gone by this one's next rescan, and rescans that follow its own captures stay exact.
#[test]
fn a_rescan_finds_every_recorded_path_gone_whoever_recorded_it() {
    let s = setup(|w| {
        write(w, "kept.txt", b"kept\n");
        write(w, "dir/old.txt", b"old\n");
    });
    let rescan = |t: &Tracker| t.rescan_now().unwrap();
    // This tracker's cache is loaded and, after a rescan that listed the head, covers it.
    assert!(rescan(&s.tracker).is_none());
    assert!(rescan(&s.tracker).is_none());
    // Another tracker of the same tree records a path this one's cache never held.
    let (_, other) = common::manual(s.work.path(), s.home.path());
    write(s.work.path(), "dir/theirs.txt", b"theirs\n");
    assert!(
        other
            .capture_now(Intent::new(IntentKind::Command, "theirs"), OpFlags::COMMAND)
            .unwrap()
            .is_some()
    );
    std::fs::remove_file(s.work.path().join("dir/theirs.txt")).unwrap();
    assert!(rescan(&s.tracker).is_some(), "the deletion was not found");
    head_matches_disk(&s);
    // Its own captures keep the cache whole: deletions after them are found without a listing.
    write(s.work.path(), "new.txt", b"new\n");
    assert!(rescan(&s.tracker).is_some());
    std::fs::remove_file(s.work.path().join("new.txt")).unwrap();
    std::fs::remove_dir_all(s.work.path().join("dir")).unwrap();
    assert!(rescan(&s.tracker).is_some());
    head_matches_disk(&s);
    // And a fresh tracker of the same tree starts from what is stored.
    drop(other);
    let (_, fresh) = common::manual(s.work.path(), s.home.path());
    std::fs::remove_file(s.work.path().join("kept.txt")).unwrap();
    assert!(rescan(&fresh).is_some());
    head_matches_disk(&s);
}

/// Lets anyone read, no one change anything: only the witness's one rule records a change.
struct ReadOnly;

impl environment_core::Authorizer for ReadOnly {
    fn decide(&self, r: &environment_core::AccessRequest) -> environment_core::Decision {
        let allow = environment_core::Decision::allow_unconditionally();
        match r.action {
            environment_core::Action::Read => allow,
            _ => environment_core::Decision {
                verdict: environment_core::Verdict::Deny,
                ..allow
            },
        }
    }
}

/// What changed while no tracker watched is nobody's known act: the witness records it when a
/// tracker opens, whatever the policy says. What changes while it watches is its capture
/// actor's, decided as that actor's: refused here, put back, kept as refused.
#[test]
fn the_opening_capture_is_the_witness_s_and_later_ones_the_capture_actor_s() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    write(&work, "before.txt", b"out of band\n");
    let env = LocalEnvironment::open(
        dir.path().join("home"),
        Options {
            authorizer: std::sync::Arc::new(ReadOnly),
            ..Options::default()
        },
    )
    .unwrap();
    let agent = ActorId::new("agent:coder").unwrap();
    let mut cfg = TrackerConfig::new(&work, agent.clone());
    cfg.auto = false;
    let tracker = Tracker::open(env.clone(), cfg).unwrap();
    let head = env.head("main").unwrap();
    let opening = env.op(&head).unwrap();
    assert_eq!(opening.actor, environment_core::witness());
    assert!(
        env.read_unchecked(&environment_core::Key::fs("before.txt").unwrap(), &head)
            .unwrap()
            .is_some()
    );

    write(&work, "during.txt", b"the agent's\n");
    tracker
        .capture_now(
            Intent::new(IntentKind::Capture, "step"),
            OpFlags::AUTO_CAPTURE,
        )
        .unwrap();
    assert!(!work.join("during.txt").exists(), "put back");
    assert!(work.join("before.txt").exists());
    let refused = env
        .refused(&environment_core::witness(), "main", 10)
        .unwrap();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].actor, agent);
    assert_eq!(refused[0].key.display_path(), "during.txt");
}
