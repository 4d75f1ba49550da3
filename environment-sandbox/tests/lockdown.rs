//! The sandbox holds against a hostile agent: every attack below is run from inside, and the
//! outcome is checked (the secret stays unread, nothing lands outside the writable set, no
//! process survives its supervisor), not a message.
//!
//! Every scenario runs as the current user and, when that is root (as in CI), again as uid/gid
//! 65534 by re-executing this test binary under `setpriv`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use environment_sandbox::{Isolation, IsolationSpec, Launcher};

fn both(name: &str, scenario: fn()) {
    common::both(name, common::no_isolation, |_| scenario());
}

fn run(iso: &Isolation, script: &str) -> Output {
    common::run_sh(iso, script)
}

use common::stdout;

/// A workspace with an environment home inside it (masked, as envctl does), and a home
/// directory outside with a secret (masked by default).
struct Scene {
    ws: tempfile::TempDir,
    home: tempfile::TempDir,
    outside: tempfile::TempDir,
}

impl Scene {
    fn new() -> Scene {
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(ws.path().join(".environment/blobs")).unwrap();
        std::fs::write(ws.path().join(".environment/env.db"), "THE LOG").unwrap();
        std::fs::write(ws.path().join(".environment/policy.db"), "THE TOKEN KEY").unwrap();
        let home = tempfile::tempdir_in("/var/tmp").unwrap();
        std::fs::create_dir_all(home.path().join(".ssh")).unwrap();
        std::fs::write(home.path().join(".ssh/id_rsa"), "PRIVATE KEY").unwrap();
        let outside = tempfile::tempdir_in("/var/tmp").unwrap();
        Scene { ws, home, outside }
    }

    fn isolation(&self) -> Isolation {
        let mut spec = IsolationSpec::host(self.ws.path());
        spec.masked = environment_sandbox::isolate::default_masked(self.home.path());
        spec.masked.push(self.ws.path().join(".environment"));
        Isolation::new(spec).unwrap()
    }
}

fn status_field<'a>(status: &'a str, field: &str) -> Option<&'a str> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .map(|v| v.trim_start_matches(':').trim())
}

fn scenario_no_privilege() {
    let s = Scene::new();
    let out = run(&s.isolation(), "cat /proc/self/status");
    assert!(out.status.success());
    let status = stdout(&out);
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(
            status_field(&status, cap),
            Some("0000000000000000"),
            "{cap} inside"
        );
    }
    assert_eq!(status_field(&status, "NoNewPrivs"), Some("1"));
    let support = Isolation::probe().unwrap();
    if support.seccomp {
        assert_eq!(status_field(&status, "Seccomp"), Some("2"));
    } else {
        common::missing_prerequisite("this kernel runs no seccomp filters");
    }
    // uid 0 inside regains nothing through exec.
    let again = run(&s.isolation(), "exec /bin/sh -c 'cat /proc/self/status'");
    assert_eq!(
        status_field(&stdout(&again), "CapEff"),
        Some("0000000000000000")
    );
}

#[test]
fn the_agent_holds_no_capability_no_new_privs_and_a_filter() {
    both(
        "the_agent_holds_no_capability_no_new_privs_and_a_filter",
        scenario_no_privilege,
    );
}

fn scenario_masks_hold() {
    let s = Scene::new();
    let home = s.home.path().display().to_string();
    let ws = s.ws.path().display().to_string();
    let iso = s.isolation();
    // Unmount, lazily, through a new namespace, by the new mount API's tools: the secret and
    // the stores stay out of reach.
    let script = format!(
        "umount {home}/.ssh; umount -l {home}/.ssh; umount {ws}/.environment; \
         unshare -rm sh -c 'umount {home}/.ssh; cat {home}/.ssh/id_rsa'; \
         unshare -U true && echo UNSHARED; \
         cat {home}/.ssh/id_rsa {ws}/.environment/env.db {ws}/.environment/policy.db; \
         cat /proc/self/root{home}/.ssh/id_rsa /proc/1/root{ws}/.environment/env.db; \
         for p in /proc/[0-9]*; do cat $p/cwd/.environment/env.db $p/root{ws}/.environment/policy.db; done; \
         ls -a {ws}/.environment; stat {ws}/.environment/env.db && echo STATTED; \
         true"
    );
    let out = run(&iso, &script);
    let text = stdout(&out);
    for secret in [
        "PRIVATE KEY",
        "THE LOG",
        "THE TOKEN KEY",
        "UNSHARED",
        "STATTED",
        "env.db",
    ] {
        assert!(
            !text.contains(secret),
            "{secret:?} reached from inside:\n{text}"
        );
    }
    // A symbolic link and a hard link planted in the workspace lead nowhere either.
    std::fs::create_dir_all(s.ws.path().join("planted")).unwrap();
    std::os::unix::fs::symlink(
        s.ws.path().join(".environment/env.db"),
        s.ws.path().join("planted/log"),
    )
    .unwrap();
    std::os::unix::fs::symlink(
        s.home.path().join(".ssh/id_rsa"),
        s.ws.path().join("planted/key"),
    )
    .unwrap();
    let out = run(
        &iso,
        &format!(
            "cat planted/log planted/key; ln {ws}/.environment/policy.db planted/hard; \
             cat planted/hard; ln -s /proc/1/root{ws}/.environment/env.db planted/p; cat planted/p; \
             true"
        ),
    );
    let text = stdout(&out);
    for secret in ["PRIVATE KEY", "THE LOG", "THE TOKEN KEY"] {
        assert!(
            !text.contains(secret),
            "{secret:?} reached through a link:\n{text}"
        );
    }
    assert!(!s.ws.path().join("planted/hard").exists());
    // And the stores are as they were.
    assert_eq!(
        std::fs::read_to_string(s.ws.path().join(".environment/env.db")).unwrap(),
        "THE LOG"
    );
}

#[test]
fn masks_cannot_be_lifted_and_the_stores_are_out_of_reach() {
    both(
        "masks_cannot_be_lifted_and_the_stores_are_out_of_reach",
        scenario_masks_hold,
    );
}

fn scenario_no_write_outside() {
    let s = Scene::new();
    let outside = s.outside.path().display().to_string();
    let host_tmp = tempfile::tempdir_in("/tmp").unwrap();
    let tmp = host_tmp.path().display().to_string();
    let home = s.home.path().display().to_string();
    let script = format!(
        "mount -o remount,bind,rw /; mount -o remount,rw /; umount -l /tmp; umount /tmp; \
         echo x > {outside}/escaped; echo x > {tmp}/escaped; echo x > {home}/escaped; \
         mkdir {outside}/dir; touch /proc/self/root{outside}/escaped2; \
         echo inside > note; echo scratch > /tmp/scratch && cat /tmp/scratch"
    );
    let out = run(&s.isolation(), &script);
    assert!(out.status.success(), "ordinary writes still work");
    assert_eq!(stdout(&out), "scratch\n");
    assert_eq!(
        std::fs::read_to_string(s.ws.path().join("note")).unwrap(),
        "inside\n"
    );
    for dir in [s.outside.path(), host_tmp.path()] {
        let left: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().collect();
        assert!(left.is_empty(), "written outside: {left:?}");
    }
    assert!(!s.home.path().join("escaped").exists());
}

#[test]
fn nothing_lands_outside_the_writable_set() {
    both(
        "nothing_lands_outside_the_writable_set",
        scenario_no_write_outside,
    );
}

fn scenario_landlock() {
    let support = Isolation::probe().unwrap();
    if support.landlock_abi == 0 {
        common::missing_prerequisite("this kernel offers no Landlock");
        return;
    }
    let s = Scene::new();
    // /proc is a fresh, writable mount: only Landlock refuses this write (prctl still names the
    // process).
    let out = run(
        &s.isolation(),
        "echo renamed > /proc/self/comm && echo WROTE; cat /proc/self/comm",
    );
    assert!(!stdout(&out).contains("WROTE"), "{}", stdout(&out));
}

#[test]
fn landlock_confines_writes_where_mounts_do_not() {
    both(
        "landlock_confines_writes_where_mounts_do_not",
        scenario_landlock,
    );
}

fn scenario_descriptors() {
    let s = Scene::new();
    // A descriptor of the caller's that is not close-on-exec (as a careless supervisor might
    // hold): the agent must not see it.
    let file = std::fs::File::open("/etc/hostname")
        .or_else(|_| std::fs::File::open("/etc/passwd"))
        .unwrap();
    let leaked = rustix::io::dup(&file).unwrap();
    // The descriptors of a process that opens none while it waits, read once it is asleep:
    // `sleep` opens its locale files while it starts, so until its system call is the sleep
    // (clock_nanosleep or nanosleep, on x86_64 or aarch64) those may show too.
    let out = run(
        &s.isolation(),
        "sleep 5 & p=$!; n=; i=0; \
         while ! case \"$n\" in 230|35|115|101) true;; *) false;; esac && [ $i -lt 100000 ]; do \
         read -r n rest < /proc/$p/syscall; i=$((i+1)); done; \
         for f in /proc/$p/fd/*; do echo ${f##*/}; done; kill $p",
    );
    drop(leaked);
    let fds: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    assert_eq!(fds, ["0", "1", "2"], "descriptors inside");
    let _ = file.as_raw_fd();
}

#[test]
fn the_agent_starts_with_stdio_alone() {
    both("the_agent_starts_with_stdio_alone", scenario_descriptors);
}

const HELPER: &str = "ENVIRONMENT_SANDBOX_SUPERVISOR_HELPER";

/// Re-executed as a stand-in supervisor: starts a sandbox whose agent runs a background
/// process, says "ready" and waits to be killed.
#[test]
fn supervisor_helper() {
    let Ok(marker) = std::env::var(HELPER) else {
        return;
    };
    let ws = tempfile::tempdir().unwrap();
    let iso = Isolation::new(IsolationSpec::host(ws.path())).unwrap();
    // Spawned from a thread that ends at once: the sandbox must outlive the thread.
    let child = std::thread::spawn(move || {
        let mut c = Command::new("/bin/sh");
        c.args(["-c", &format!("sleep 300 & sleep 300; : {marker}")]);
        c.stdout(Stdio::null());
        iso.confine(&mut c).unwrap();
        c.spawn().unwrap()
    })
    .join()
    .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let mut child = child;
    assert!(
        child.try_wait().unwrap().is_none(),
        "the sandbox outlives the spawning thread"
    );
    println!("ready");
    std::thread::sleep(Duration::from_secs(300));
}

fn sandboxed(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .count()
}

fn scenario_dies_with_supervisor() {
    let marker = format!(
        "lockdown-marker-{}-{}",
        std::process::id(),
        rand::random::<u64>()
    );
    let mut sup = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "supervisor_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HELPER, &marker)
        .env_remove("ENVIRONMENT_SANDBOX_UNPRIVILEGED_SCENARIO")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut out = BufReader::new(sup.stdout.take().unwrap());
    while !line.contains("ready") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the helper ended early"
        );
    }
    assert!(sandboxed(&marker) > 0, "the sandbox runs");
    sup.kill().unwrap(); // SIGKILL: no handler, no cleanup
    sup.wait().unwrap();
    let killed = Instant::now();
    while sandboxed(&marker) > 0 && killed.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        sandboxed(&marker),
        0,
        "sandbox processes outlived their supervisor"
    );
}

#[test]
fn the_sandbox_dies_with_its_supervisor() {
    both(
        "the_sandbox_dies_with_its_supervisor",
        scenario_dies_with_supervisor,
    );
}

fn scenario_ordinary_work() {
    let s = Scene::new();
    let iso = s.isolation();
    let python = ["/usr/bin/python3"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let Some(python) = python else {
        common::missing_prerequisite("python3 is needed (apt-get install python3 python3-venv)");
        return;
    };
    let git = ["/usr/bin/git", "/usr/local/bin/git"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let Some(git) = git else {
        common::missing_prerequisite("git is needed (apt-get install git)");
        return;
    };
    // An interpreter, a compiler when there is one, git, a background process.
    let script = format!(
        "set -e; export HOME=$PWD; {python} -c 'print(6*7)'; \
         if command -v cc >/dev/null; then printf 'int main(){{return 0;}}' > m.c && cc m.c -o m && ./m && echo COMPILED; fi; \
         {git} init -q repo && cd repo && echo hi > f && {git} add f && \
         {git} -c user.email=a@b -c user.name=a commit -qm one && {git} log --oneline | wc -l; \
         cd ..; (sleep 0.2; echo bg > bg.txt) & wait; cat bg.txt"
    );
    let out = run(&iso, &script);
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(text.starts_with("42\n"), "{text}");
    assert!(text.contains("\n1\nbg\n"), "{text}");
    // A venv and a pip install of a package built here, with every layer on.
    let pkg = s.ws.path().join("pkg");
    std::fs::create_dir_all(pkg.join("hello_local")).unwrap();
    std::fs::write(pkg.join("hello_local/__init__.py"), "ANSWER = 42\n").unwrap();
    std::fs::write(
        pkg.join("setup.py"),
        "from setuptools import setup\nsetup(name='hello_local', version='1.0', packages=['hello_local'])\n",
    )
    .unwrap();
    let venv = format!(
        "set -e; export HOME=$PWD; {python} -m venv .venv && \
         .venv/bin/pip install --no-index --no-build-isolation --disable-pip-version-check -q ./pkg && \
         .venv/bin/python -c 'import hello_local; print(hello_local.ANSWER)'"
    );
    let out = run(&iso, &venv);
    if !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("ensurepip") {
        common::missing_prerequisite(
            "python3 -m venv needs ensurepip (apt-get install python3-venv)",
        );
        return;
    }
    assert!(out.status.success());
    assert_eq!(stdout(&out).trim(), "42");
    assert!(s.ws.path().join(".venv/lib").is_dir());
}

#[test]
fn ordinary_work_runs_with_every_layer_on() {
    both(
        "ordinary_work_runs_with_every_layer_on",
        scenario_ordinary_work,
    );
}

/// Where a process's cgroup v2 lives on the host, from a `/proc/PID/cgroup` it printed.
fn cgroup_dir(proc_cgroup: &str) -> Option<std::path::PathBuf> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| Path::new("/sys/fs/cgroup").join(p.trim().trim_start_matches('/')))
}

fn scenario_cgroup_limits() {
    use environment_sandbox::{CgroupLimits, CgroupSupport, SandboxError};
    let ws = tempfile::tempdir().unwrap();
    let mut spec = IsolationSpec::host(ws.path());
    spec.limits.cgroup = CgroupLimits {
        memory: Some(64 << 20),
        processes: Some(16),
        cpu_millis: Some(500),
    };
    let support = Isolation::probe().unwrap();
    let iso = match (&support.cgroup, Isolation::new(spec)) {
        (CgroupSupport::Delegated { .. }, Ok(iso)) => iso,
        (CgroupSupport::Delegated { controllers, .. }, Err(SandboxError::Cgroup { why }))
            if !["memory", "pids", "cpu"]
                .iter()
                .all(|c| controllers.iter().any(|o| o == c)) =>
        {
            eprintln!("cgroup v2 enforcement not checked here, the refusal was: {why}");
            return;
        }
        (CgroupSupport::Unavailable(reason), Err(SandboxError::Cgroup { why })) => {
            // Refused before anything ran, with the probe's reason.
            assert_eq!(&why, reason);
            eprintln!("cgroup v2 enforcement not checked on this host, the refusal was: {why}");
            return;
        }
        (support, other) => panic!("cgroup support {support:?}, yet the sandbox gave {other:?}"),
    };
    // Every process of the sandbox is in its cgroup, with the limits asked.
    let out = run(&iso, "cat /proc/self/cgroup");
    assert!(out.status.success());
    let dir = cgroup_dir(&stdout(&out)).expect("a cgroup v2 line");
    assert!(
        dir.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("sandbox-")
    );
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    assert_eq!(read("memory.max").trim(), (64u64 << 20).to_string());
    assert_eq!(read("pids.max").trim(), "16");
    assert_eq!(read("cpu.max").trim(), "50000 100000");
    // More processes than allowed: the forks past the limit fail.
    run(
        &iso,
        "i=0; while [ $i -lt 40 ]; do sleep 2 & i=$((i+1)); done 2>/dev/null; wait; true",
    );
    let refused: u64 = read("pids.events")
        .lines()
        .find_map(|l| l.strip_prefix("max "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap();
    assert!(refused > 0, "no fork was refused past pids.max");
    // The agent cannot leave its cgroup: the host's cgroup tree is read-only inside.
    let out = run(
        &iso,
        "echo $$ > /sys/fs/cgroup/cgroup.procs; echo $$ > /sys/fs/cgroup/$(cut -d: -f3 /proc/self/cgroup)/../cgroup.procs; cat /proc/self/cgroup",
    );
    assert_eq!(cgroup_dir(&stdout(&out)), Some(dir.clone()));
    // Nothing left behind once the launcher is gone.
    drop(iso);
    assert!(!dir.exists(), "{} was left behind", dir.display());
}

/// cgroup v2 limits hold for the whole sandbox where a cgroup v2 subtree is delegated; where
/// none is, they are refused before anything runs, and the test says which case it checked.
#[test]
fn cgroup_limits_hold_or_are_refused_before_anything_runs() {
    both(
        "cgroup_limits_hold_or_are_refused_before_anything_runs",
        scenario_cgroup_limits,
    );
}
