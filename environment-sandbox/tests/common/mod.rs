//! Helpers shared by the sandbox tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use environment_core::{ActorId, EntryKind, KeyPrefix, LocalEnvironment, Namespace, OpId, Options};
use environment_sandbox::{Tracker, TrackerConfig};

/// Runs `script` with `/bin/sh -c` through `launcher` and waits; what it did is logged.
pub fn run_sh(launcher: &dyn environment_sandbox::Launcher, script: &str) -> std::process::Output {
    let mut c = std::process::Command::new("/bin/sh");
    c.args(["-c", script]);
    launcher.confine(&mut c).unwrap();
    let out = c.output().unwrap();
    eprintln!(
        "$ {script}\n{:?}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A command's standard output as text.
pub fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What a path holds, as compared between the disk and a view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    File { mode: u32, content: Vec<u8> },
    Dir { mode: u32 },
    Symlink { target: Vec<u8> },
    Other(String),
}

/// Every path under `root` except those matching `skip`.
pub fn disk(root: &Path, skip: &dyn Fn(&str) -> bool) -> BTreeMap<String, Entry> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_string_lossy().to_string();
            if skip(&rel) {
                continue;
            }
            let m = std::fs::symlink_metadata(&p).unwrap();
            let mode = m.permissions().mode() & 0o7777;
            let entry = if m.file_type().is_symlink() {
                Entry::Symlink {
                    target: std::fs::read_link(&p)
                        .unwrap()
                        .into_os_string()
                        .into_encoded_bytes(),
                }
            } else if m.is_dir() {
                stack.push(p.clone());
                Entry::Dir { mode }
            } else if m.is_file() {
                Entry::File {
                    mode,
                    content: std::fs::read(&p).unwrap(),
                }
            } else {
                Entry::Other(format!("{:o}", m.mode() & 0o170000))
            };
            out.insert(rel, entry);
        }
    }
    out
}

/// The hard-link groups under `root`: the paths of every file with more than one link, by
/// inode (paths matching `skip` left out).
pub fn link_groups(
    root: &Path,
    skip: &dyn Fn(&str) -> bool,
) -> std::collections::BTreeSet<std::collections::BTreeSet<String>> {
    let mut by_ino: BTreeMap<u64, std::collections::BTreeSet<String>> = BTreeMap::new();
    for (rel, _) in disk(root, skip) {
        let m = std::fs::symlink_metadata(root.join(&rel)).unwrap();
        if m.is_file() && m.nlink() > 1 {
            by_ino.entry(m.ino()).or_default().insert(rel);
        }
    }
    by_ino.into_values().collect()
}

/// Every `fs` key of a version, as the disk would show it.
pub fn view(env: &LocalEnvironment, version: &OpId) -> BTreeMap<String, Entry> {
    let actor = ActorId::new("test:reader").unwrap();
    let mut out = BTreeMap::new();
    for (k, v) in env
        .list(&actor, &KeyPrefix::all(Namespace::Fs), version)
        .unwrap()
    {
        let path = String::from_utf8(k.path().to_vec()).unwrap();
        let entry = match v.meta.kind {
            EntryKind::File => Entry::File {
                mode: v.meta.mode,
                content: env.content(&v).unwrap(),
            },
            EntryKind::Dir => Entry::Dir { mode: v.meta.mode },
            EntryKind::Symlink => Entry::Symlink {
                target: v.meta.symlink_target.clone().unwrap(),
            },
            other => Entry::Other(format!("{other:?}")),
        };
        out.insert(path, entry);
    }
    out
}

pub fn no_skip(_: &str) -> bool {
    false
}

/// An environment and a tracker (manual captures) over a fresh workspace.
pub struct Setup {
    pub work: tempfile::TempDir,
    pub home: tempfile::TempDir,
    pub env: LocalEnvironment,
    pub tracker: Tracker,
    pub agent: ActorId,
}

pub fn setup(prepare: impl FnOnce(&Path)) -> Setup {
    let work = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    prepare(work.path());
    let (env, tracker) = manual(work.path(), home.path());
    Setup {
        work,
        home,
        env,
        tracker,
        agent: ActorId::new("agent:test").unwrap(),
    }
}

/// An environment in `home` and a tracker of `work` that captures only when asked.
pub fn manual(work: &Path, home: &Path) -> (LocalEnvironment, Tracker) {
    let env = LocalEnvironment::open(home, Options::default()).unwrap();
    let mut cfg = TrackerConfig::new(work, ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    let tracker = Tracker::open(env.clone(), cfg).unwrap();
    (env, tracker)
}

pub fn write(root: &Path, rel: &str, content: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, content).unwrap();
}

/// Set in a test binary re-executed as an unprivileged user: the test whose scenario it runs.
const SCENARIO: &str = "ENVIRONMENT_SANDBOX_UNPRIVILEGED_SCENARIO";
pub const NOBODY: u32 = 65534;

/// A prerequisite of the test is missing: under `CI=true` (CI sets it) the test fails, since a
/// skip there would report success for a test that never ran; elsewhere it says SKIPPED and why.
pub fn missing_prerequisite(reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("a prerequisite is missing under CI=true: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
}

/// No requirement beyond the test itself.
pub fn always() -> Option<String> {
    None
}

/// Runs `scenario` in a fresh directory as this process's user, then — when that is root, as
/// in CI — again as uid/gid 65534 (see [`as_nobody`]). `name` is the calling test's name;
/// `unavailable` says why the scenario cannot run on this host (it then counts as skipped, and
/// says so).
pub fn both(name: &str, unavailable: fn() -> Option<String>, scenario: impl Fn(&Path)) {
    if std::env::var_os(SCENARIO).is_none() {
        if let Some(reason) = unavailable() {
            missing_prerequisite(&reason);
            return;
        }
        scenario(tempfile::tempdir().unwrap().path());
    }
    as_nobody(name, unavailable, scenario);
}

/// Why the namespace launcher cannot run here, if it cannot.
pub fn no_isolation() -> Option<String> {
    environment_sandbox::Isolation::probe()
        .err()
        .map(|e| e.to_string())
}

/// Runs `scenario` in a fresh directory as an unprivileged user: directly when this process is
/// not root, otherwise by re-running this test binary's test `name` under `setpriv` as uid/gid
/// 65534 and checking that the scenario passed there.
pub fn as_nobody(name: &str, unavailable: fn() -> Option<String>, scenario: impl Fn(&Path)) {
    if let Ok(which) = std::env::var(SCENARIO) {
        // The re-executed child: only the named test runs its scenario.
        if which == name {
            assert_ne!(rustix::process::geteuid().as_raw(), 0, "must not be root");
            if let Some(reason) = unavailable() {
                missing_prerequisite(&reason);
                println!("SCENARIO-SKIPPED {reason}");
                return;
            }
            scenario(tempfile::tempdir().unwrap().path());
            println!("SCENARIO-PASSED {name}");
        }
        return;
    }
    if !rustix::process::geteuid().is_root() {
        if let Some(reason) = unavailable() {
            missing_prerequisite(&reason);
            return;
        }
        scenario(tempfile::tempdir().unwrap().path());
        return;
    }
    let out = std::process::Command::new("setpriv")
        .args([
            format!("--reuid={NOBODY}"),
            format!("--regid={NOBODY}"),
            "--clear-groups".into(),
            "--".into(),
        ])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(SCENARIO, name)
        .env("HOME", std::env::temp_dir())
        .output()
        .expect("setpriv (util-linux) is needed to drop privileges");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if let Some(reason) = stdout
        .lines()
        .find_map(|l| l.strip_prefix("SCENARIO-SKIPPED "))
    {
        missing_prerequisite(&format!("as uid {NOBODY}: {reason}"));
        return;
    }
    assert!(
        out.status.success() && stdout.contains(&format!("SCENARIO-PASSED {name}")),
        "the scenario failed as uid {NOBODY}:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A directory name of 200 bytes.
pub fn name(i: usize) -> String {
    format!("{i:03}{}", "d".repeat(197))
}

/// Makes `depth` nested directories below `root` (fd by fd: the path is too long for one call)
/// and writes `content` at the bottom; returns the bottom file's path relative to `root`.
pub fn deep(root: &Path, depth: usize, content: &[u8]) -> String {
    let mut dir: std::os::fd::OwnedFd = rustix::fs::open(
        root,
        rustix::fs::OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let mut rel = Vec::new();
    for i in 0..depth {
        let n = name(i);
        match rustix::fs::mkdirat(&dir, n.as_str(), rustix::fs::Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => panic!("mkdirat: {e}"),
        }
        dir = rustix::fs::openat(
            &dir,
            n.as_str(),
            rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        rel.push(n);
    }
    let f = rustix::fs::openat(
        &dir,
        "bottom.txt",
        rustix::fs::OFlags::CREATE | rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::TRUNC,
        rustix::fs::Mode::from_raw_mode(0o644),
    )
    .unwrap();
    rustix::io::write(&f, content).unwrap();
    rel.push("bottom.txt".into());
    rel.join("/")
}

/// What the tree holds, read through descriptors (`disk` cannot open such paths).
pub fn bottom(root: &Path, rel: &str) -> Option<Vec<u8>> {
    let mut dir: std::os::fd::OwnedFd = rustix::fs::open(
        root,
        rustix::fs::OFlags::DIRECTORY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    let parts: Vec<&str> = rel.split('/').collect();
    let (last, dirs) = parts.split_last().unwrap();
    for d in dirs {
        dir = rustix::fs::openat(
            &dir,
            *d,
            rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .ok()?;
    }
    let f = rustix::fs::openat(
        &dir,
        *last,
        rustix::fs::OFlags::RDONLY,
        rustix::fs::Mode::empty(),
    )
    .ok()?;
    let mut out = vec![0u8; 4096];
    let n = rustix::io::read(&f, &mut out).unwrap();
    out.truncate(n);
    Some(out)
}
