//! Rootless isolation in host mode, through the `Launcher` seam: what the confined program can
//! see and change, its pid namespace, its environment and network, and how its end is reported.
//!
//! Every scenario runs as the current user and, when that is root (as in CI), again as uid/gid
//! 65534 by re-executing this test binary under `setpriv`. Hosts that refuse unprivileged user
//! namespaces skip with the reason printed.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use environment_sandbox::isolate::{DEFAULT_ENV_ALLOW, default_masked};
use environment_sandbox::{Bind, Isolation, IsolationSpec, Launcher, SandboxError, Workspace};

/// Runs `scenario` as this user and, when root, as uid 65534 too.
/// Runs the scenario as this user and, under root, as uid 65534 too.
fn both(name: &str, scenario: fn()) {
    common::both(name, common::no_isolation, |_| scenario());
}

fn sh(iso: &Isolation, script: &str) -> Command {
    let mut c = Command::new("/bin/sh");
    c.args(["-c", script]);
    iso.confine(&mut c).unwrap();
    c
}

fn run(iso: &Isolation, script: &str) -> Output {
    common::run_sh(iso, script)
}

use common::stdout;

fn scenario_filesystem() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("readme"), "hello\n").unwrap();
    // Outside the workspace and outside /tmp (which is private inside), owned by this user.
    let outside = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::write(outside.path().join("keep"), "keep\n").unwrap();
    // A home with secrets, declared writable (as an agent's home would be).
    let home = tempfile::tempdir_in("/var/tmp").unwrap();
    let h = home.path();
    std::fs::create_dir_all(h.join(".ssh")).unwrap();
    std::fs::write(h.join(".ssh/id_ed25519"), "PRIVATE KEY").unwrap();
    std::fs::write(h.join(".netrc"), "machine x password y\n").unwrap();
    std::fs::create_dir_all(h.join(".aws")).unwrap();
    std::fs::write(h.join(".aws/credentials"), "secret").unwrap();

    let mut spec = IsolationSpec::host(ws.path());
    spec.writable = vec![h.to_path_buf()];
    spec.masked = default_masked(h);
    let iso = Isolation::new(spec).unwrap();
    let ws_in = iso.workspace_inside().to_path_buf();
    assert_eq!(ws_in, std::fs::canonicalize(ws.path()).unwrap());

    let o = outside.path().display();
    let h = h.display();
    let out = run(
        &iso,
        &format!(
            "set -e; pwd; cat readme; echo written > new; mkdir -p sub && echo x > sub/y; \
             echo notes > {h}/notes; \
             if echo no > {o}/keep ; then echo WROTE-OUTSIDE; fi; \
             if touch {o}/new; then echo CREATED-OUTSIDE; fi; \
             if touch /usr/bin/sandbox-probe; then echo WROTE-USR; fi; \
             echo ssh=[$(ls -A {h}/.ssh)] aws=[$(ls -A {h}/.aws)] netrc=[$(cat {h}/.netrc)]; \
             echo tmp=[$(ls -A /tmp)]"
        ),
    );
    assert!(out.status.success());
    let text = stdout(&out);
    assert!(
        text.starts_with(&format!("{}\nhello\n", ws_in.display())),
        "{text}"
    );
    assert!(
        !text.contains("WROTE") && !text.contains("CREATED"),
        "{text}"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("Read-only file system").count(),
        3,
        "every write outside fails with EROFS: {err}"
    );
    assert!(text.contains("ssh=[] aws=[] netrc=[]"), "{text}");
    // /tmp is private: the workspace's mount point is the only entry.
    let first = ws_in
        .strip_prefix("/tmp")
        .map(|r| r.iter().next().unwrap().to_string_lossy().into_owned());
    assert_eq!(text.contains("tmp=[]"), first.is_err(), "{text}");
    if let Ok(first) = first {
        assert!(text.contains(&format!("tmp=[{first}]")), "{text}");
    }
    // The workspace and the writable home received the writes, on the host.
    assert_eq!(
        std::fs::read_to_string(ws.path().join("new")).unwrap(),
        "written\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("sub/y")).unwrap(),
        "x\n"
    );
    assert_eq!(
        std::fs::read_to_string(home.path().join("notes")).unwrap(),
        "notes\n"
    );
    // Nothing outside changed, and the secrets are intact on the host.
    assert_eq!(
        std::fs::read_to_string(outside.path().join("keep")).unwrap(),
        "keep\n"
    );
    assert!(!outside.path().join("new").exists());
    assert_eq!(
        std::fs::read_to_string(home.path().join(".netrc")).unwrap(),
        "machine x password y\n"
    );
    assert!(home.path().join(".ssh/id_ed25519").exists());
}

/// A writable host submount (not `/`, not replaced inside), to check the read-only bind is
/// recursive.
fn writable_submount() -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().find_map(|l| {
        let f: Vec<&str> = l.split(' ').collect();
        let (mp, opts) = (f[4], f[5]);
        let fstype = f
            .iter()
            .skip_while(|x| **x != "-")
            .nth(1)
            .copied()
            .unwrap_or("");
        // Filesystems where creating a file is normally possible.
        let regular =
            ["tmpfs", "ext4", "ext3", "xfs", "btrfs", "overlay", "f2fs"].contains(&fstype);
        let replaced = ["/proc", "/dev", "/tmp", "/sys/kernel", "/sys/fs/fuse"]
            .iter()
            .any(|p| mp == *p || mp.starts_with(&format!("{p}/")));
        (mp != "/"
            && regular
            && !replaced
            && opts.split(',').any(|o| o == "rw")
            && Path::new(mp).is_dir())
        .then(|| mp.to_owned())
    })
}

fn scenario_submounts() {
    let Some(mp) = writable_submount() else {
        eprintln!("submount check skipped: no writable submount on this host");
        return;
    };
    let ws = tempfile::tempdir().unwrap();
    let iso = Isolation::new(IsolationSpec::host(ws.path())).unwrap();
    let out = run(&iso, &format!("touch '{mp}/.sandbox-probe'"));
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("Read-only file system"),
        "{mp} must be read-only inside"
    );
    assert!(!Path::new(&mp).join(".sandbox-probe").exists());
}

#[test]
fn host_submounts_are_read_only_too() {
    both("host_submounts_are_read_only_too", scenario_submounts);
}

#[test]
fn workspace_writable_host_read_only_secrets_masked() {
    both(
        "workspace_writable_host_read_only_secrets_masked",
        scenario_filesystem,
    );
}

fn scenario_pid_namespace() {
    let ws = tempfile::tempdir().unwrap();
    let iso = Isolation::new(IsolationSpec::host(ws.path())).unwrap();
    // Globs and echo are builtins: no other process exists while the list is made.
    let out = run(
        &iso,
        "echo $$; for p in /proc/[0-9]*; do echo ${p#/proc/}; done; hostname",
    );
    assert!(out.status.success());
    let text = stdout(&out);
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("2"), "the agent is pid 2, under init");
    let pids: BTreeSet<&str> = lines.by_ref().take(2).collect();
    assert_eq!(
        pids,
        BTreeSet::from(["1", "2"]),
        "only the sandbox's processes: {text}"
    );
    assert_eq!(lines.next(), Some("sandbox"));

    // An orphan is reaped by init: no zombie is left behind.
    let out = run(
        &iso,
        "sh -c 'true &'; sleep 0.5; for s in /proc/[0-9]*/stat; do read l < $s && echo \"$l\"; done",
    );
    let text = stdout(&out);
    assert!(
        text.lines().all(|l| l
            .split(") ")
            .nth(1)
            .is_some_and(|rest| !rest.starts_with('Z'))),
        "{text}"
    );
}

#[test]
fn own_pid_namespace_with_init() {
    both("own_pid_namespace_with_init", scenario_pid_namespace);
}

fn scenario_environment() {
    let ws = tempfile::tempdir().unwrap();
    let mut spec = IsolationSpec::host(ws.path());
    spec.env_set = vec![("ENVIRONMENT_SOCKET".into(), "/run/env.sock".into())];
    spec.network = false;
    let iso = Isolation::new(spec).unwrap();
    let allowed = |k: &str| {
        DEFAULT_ENV_ALLOW
            .iter()
            .any(|r| r.strip_suffix('*').map_or(*r == k, |p| k.starts_with(p)))
    };
    let denied: Vec<String> = std::env::vars()
        .map(|(k, _)| k)
        .filter(|k| !allowed(k) && !["PWD", "OLDPWD", "SHLVL", "_"].contains(&k.as_str()))
        .collect();
    let mut c = sh(&iso, "env; echo ==; cat /proc/net/dev");
    c.env("EXPLICIT_VAR", "yes");
    let out = c.output().unwrap();
    assert!(out.status.success());
    let text = stdout(&out);
    let (env, net) = text.split_once("==\n").unwrap();
    let inside: BTreeSet<&str> = env
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, _)| k)
        .collect();
    for k in &denied {
        assert!(!inside.contains(k.as_str()), "{k} leaked into the sandbox");
    }
    assert!(inside.contains("EXPLICIT_VAR"));
    assert!(env.contains("ENVIRONMENT_SOCKET=/run/env.sock"));
    assert!(inside.contains("PATH"));
    for k in &inside {
        assert!(
            allowed(k)
                || [
                    "EXPLICIT_VAR",
                    "ENVIRONMENT_SOCKET",
                    "PWD",
                    "OLDPWD",
                    "SHLVL",
                    "_"
                ]
                .contains(k),
            "unexpected {k}"
        );
    }
    // Network off: only the loopback interface.
    let ifaces: Vec<&str> = net
        .lines()
        .skip(2)
        .filter_map(|l| l.split(':').next())
        .map(str::trim)
        .collect();
    assert_eq!(ifaces, vec!["lo"], "{net}");
}

#[test]
fn environment_filtered_and_network_off() {
    both("environment_filtered_and_network_off", scenario_environment);
}

/// Polls until no process whose command line contains `marker` is left, or a generous deadline.
fn gone(marker: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let alive = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        });
        if !alive {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn wait_ready(child: &mut std::process::Child) {
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
}

fn scenario_exit_and_signals() {
    let ws = tempfile::tempdir().unwrap();
    let iso = Isolation::new(IsolationSpec::host(ws.path())).unwrap();
    // The exit code.
    assert_eq!(run(&iso, "exit 7").status.code(), Some(7));
    // Death by a signal, the agent's own.
    let st = run(&iso, "kill -TERM $$").status;
    assert_eq!((st.code(), st.signal()), (None, Some(libc::SIGTERM)));
    // A signal sent to the Child's pid reaches the agent's handler.
    let mut c = sh(&iso, "trap 'exit 3' TERM; echo ready; sleep 1000 & wait");
    let mut child = c.stdout(Stdio::piped()).spawn().unwrap();
    wait_ready(&mut child);
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(3));
    // ... and kills an agent without a handler, which is reported as such.
    let mut c = sh(&iso, "echo ready; exec sleep 1001");
    let mut child = c.stdout(Stdio::piped()).spawn().unwrap();
    wait_ready(&mut child);
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::INT,
    )
    .unwrap();
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGINT));
    assert!(gone("1001"));
    // Killing the Child leaves nothing of the sandbox behind.
    let mut c = sh(
        &iso,
        "sleep 4242 & sh -c 'sleep 4243 & wait' & echo ready; wait",
    );
    let mut child = c.stdout(Stdio::piped()).spawn().unwrap();
    wait_ready(&mut child);
    child.kill().unwrap();
    assert_eq!(child.wait().unwrap().signal(), Some(libc::SIGKILL));
    assert!(
        gone("4242") && gone("4243"),
        "processes survived the sandbox"
    );
}

#[test]
fn exit_status_signals_and_kill() {
    both("exit_status_signals_and_kill", scenario_exit_and_signals);
}

fn scenario_overlay() {
    let base = tempfile::tempdir().unwrap();
    let (lower, upper, work) = (
        base.path().join("lower"),
        base.path().join("upper"),
        base.path().join("work"),
    );
    for d in [&lower, &upper, &work] {
        std::fs::create_dir(d).unwrap();
    }
    std::fs::write(lower.join("a.txt"), "a\n").unwrap();
    std::fs::write(lower.join("b.txt"), "b\n").unwrap();
    let mut spec = IsolationSpec::host(base.path());
    spec.workspace = Some(Workspace::Overlay {
        lower: lower.clone(),
        upper: upper.clone(),
        work: work.clone(),
    });
    spec.workspace_inside = Some("/tmp/fork".into());
    let iso = Isolation::new(spec).unwrap();
    assert_eq!(iso.workspace_inside(), Path::new("/tmp/fork"));
    let out = run(
        &iso,
        "set -e; pwd; cat a.txt; echo changed > a.txt; echo new > c.txt; rm b.txt; ls",
    );
    assert!(out.status.success());
    assert_eq!(stdout(&out), "/tmp/fork\na\na.txt\nc.txt\n");
    // The lower layer is untouched.
    assert_eq!(std::fs::read_to_string(lower.join("a.txt")).unwrap(), "a\n");
    assert_eq!(std::fs::read_to_string(lower.join("b.txt")).unwrap(), "b\n");
    assert!(!lower.join("c.txt").exists());
    // The changes are in upper, the deletion as a whiteout (a 0/0 character device).
    assert_eq!(
        std::fs::read_to_string(upper.join("a.txt")).unwrap(),
        "changed\n"
    );
    assert_eq!(
        std::fs::read_to_string(upper.join("c.txt")).unwrap(),
        "new\n"
    );
    let wh = std::fs::symlink_metadata(upper.join("b.txt")).unwrap();
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0);
}

#[test]
fn overlay_workspace_writes_to_upper() {
    both("overlay_workspace_writes_to_upper", scenario_overlay);
}

fn scenario_binds() {
    let ws = tempfile::tempdir().unwrap();
    let ctl = tempfile::tempdir_in("/var/tmp").unwrap();
    let ro = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::write(ro.path().join("config"), "v1\n").unwrap();
    let mut spec = IsolationSpec::host(ws.path());
    spec.binds = vec![
        Bind {
            host: ctl.path().to_path_buf(),
            inside: "/tmp/control".into(),
            writable: true,
        },
        Bind {
            host: ro.path().to_path_buf(),
            inside: "/tmp/config".into(),
            writable: false,
        },
    ];
    let iso = Isolation::new(spec).unwrap();
    let out = run(
        &iso,
        "echo hi > /tmp/control/msg && cat /tmp/config/config && \
         if echo v2 > /tmp/config/config; then echo WROTE; fi",
    );
    assert!(out.status.success());
    assert_eq!(stdout(&out), "v1\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("Read-only file system"));
    assert_eq!(
        std::fs::read_to_string(ctl.path().join("msg")).unwrap(),
        "hi\n"
    );
    assert_eq!(
        std::fs::read_to_string(ro.path().join("config")).unwrap(),
        "v1\n"
    );
}

#[test]
fn extra_binds_read_only_and_writable() {
    both("extra_binds_read_only_and_writable", scenario_binds);
}

#[test]
fn limits_apply_to_the_agent() {
    both("limits_apply_to_the_agent", || {
        let ws = tempfile::tempdir().unwrap();
        let mut spec = IsolationSpec::host(ws.path());
        spec.limits.open_files = Some(64);
        spec.limits.file_size = Some(4096);
        let iso = Isolation::new(spec).unwrap();
        let out = run(&iso, "ulimit -n; ulimit -f");
        // dash reports the file size limit in 512-byte blocks.
        assert_eq!(stdout(&out), "64\n8\n");
    });
}

#[test]
fn invalid_specs_are_refused() {
    if let Err(e) = Isolation::probe() {
        common::missing_prerequisite(&e.to_string());
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let mut spec = IsolationSpec::host(ws.path().join("missing"));
    assert!(matches!(
        Isolation::new(spec.clone()),
        Err(SandboxError::InvalidSpec { .. })
    ));
    spec.workspace = Some(Workspace::Dir(ws.path().to_path_buf()));
    spec.workspace_inside = Some("relative/path".into());
    assert!(matches!(
        Isolation::new(spec.clone()),
        Err(SandboxError::InvalidSpec { .. })
    ));
    spec.workspace_inside = Some("/a/../b".into());
    assert!(matches!(
        Isolation::new(spec),
        Err(SandboxError::InvalidSpec { .. })
    ));
    // A managed rootfs is writable throughout: a writable directory there is refused, not
    // ignored.
    let mut rootfs = IsolationSpec::rootfs(ws.path());
    rootfs.writable.push(ws.path().to_path_buf());
    assert!(matches!(
        Isolation::new(rootfs),
        Err(SandboxError::InvalidSpec { .. })
    ));
}

#[test]
fn probe_reports_support_or_a_reason() {
    match Isolation::probe() {
        Ok(support) => {
            let ws = tempfile::tempdir().unwrap();
            let iso = Isolation::new(IsolationSpec::host(ws.path())).unwrap();
            let d = iso.describe();
            assert!(
                d.contains("host read-only") && d.contains("cgroup v2"),
                "{d}"
            );
            assert_eq!(
                d.contains("/proc fresh"),
                support.fresh_proc,
                "describe says how /proc is provided: {d}"
            );
        }
        Err(SandboxError::Isolation { missing, hint }) => {
            assert!(!missing.is_empty() && !hint.is_empty());
            common::missing_prerequisite(&format!("{missing}; {hint}"));
        }
        Err(other) => panic!("unexpected error {other}"),
    }
}

/// A program that cannot start inside fails `spawn` with its errno, like any spawn.
#[test]
fn missing_program_fails_spawn() {
    if let Err(e) = Isolation::probe() {
        common::missing_prerequisite(&e.to_string());
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let iso = Isolation::new(IsolationSpec::host(ws.path())).unwrap();
    let mut c = Command::new("/nonexistent/program");
    iso.confine(&mut c).unwrap();
    let err = c.spawn().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
}

fn scenario_dev() {
    let ws = tempfile::tempdir().unwrap();
    let iso = Isolation::new(IsolationSpec::host(ws.path())).unwrap();
    let out = run(
        &iso,
        "set -e; ls -A /dev | tr '\\n' ' '; echo; echo x > /dev/null; \
         head -c 16 /dev/urandom | wc -c; head -c 3 /dev/zero | wc -c; \
         echo shared > /dev/shm/x && cat /dev/shm/x; ls /dev/pts",
    );
    assert!(out.status.success());
    let text = stdout(&out);
    let mut lines = text.lines();
    assert_eq!(
        lines.next(),
        Some("fd full null ptmx pts random shm stderr stdin stdout tty urandom zero ")
    );
    assert_eq!(lines.next().map(str::trim), Some("16"));
    assert_eq!(lines.next().map(str::trim), Some("3"));
    assert_eq!(lines.next(), Some("shared"));
    // A private devpts instance: none of the host's terminals.
    assert_eq!(lines.next(), Some("ptmx"));
    // ... in which the agent can open terminals of its own.
    if Path::new("/usr/bin/python3").exists() {
        let out = run(
            &iso,
            "/usr/bin/python3 -c 'import os; m, s = os.openpty(); print(os.ttyname(s))'",
        );
        assert_eq!(stdout(&out), "/dev/pts/0\n");
    } else {
        common::missing_prerequisite("the PTY check needs /usr/bin/python3");
    }
}

#[test]
fn dev_is_minimal_and_usable() {
    both("dev_is_minimal_and_usable", scenario_dev);
}

fn scenario_setup_failure() {
    let ws = tempfile::tempdir().unwrap();
    let mut spec = IsolationSpec::host(ws.path());
    // The mount point would have to be created in the read-only host.
    spec.binds = vec![Bind {
        host: ws.path().to_path_buf(),
        inside: "/usr/share/environment-sandbox-missing".into(),
        writable: false,
    }];
    let iso = Isolation::new(spec).unwrap();
    let mut c = Command::new("/bin/true");
    c.stderr(Stdio::piped());
    iso.confine(&mut c).unwrap();
    let err = c.spawn().unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
}

#[test]
fn setup_failure_fails_spawn() {
    both("setup_failure_fails_spawn", scenario_setup_failure);
}

#[allow(unsafe_code)]
fn scenario_pty() {
    use std::io::Read;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let ws = tempfile::tempdir().unwrap();
    let iso = Isolation::new(IsolationSpec::host(ws.path())).unwrap();
    let (mut master, mut slave) = (0, 0);
    // SAFETY: openpty writes two descriptors, owned right after.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0);
    // SAFETY: fresh descriptors from openpty, owned once.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let mut c = Command::new("/bin/sh");
    c.args([
        "-c",
        "test -t 0 && echo is-a-tty; echo via-dev-tty > /dev/tty; exit 5",
    ]);
    c.stdin(slave.try_clone().unwrap())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave.try_clone().unwrap());
    iso.confine(&mut c).unwrap();
    // Added after confine: runs in the agent, which becomes the terminal's session leader.
    // SAFETY: setsid and ioctl are async-signal-safe.
    unsafe {
        c.pre_exec(|| {
            if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = c.spawn().unwrap();
    drop(slave);
    drop(c);
    let status = child.wait().unwrap();
    let mut out = Vec::new();
    let _ = std::fs::File::from(master).read_to_end(&mut out); // ends with EIO once drained
    let out = String::from_utf8_lossy(&out);
    assert_eq!(status.code(), Some(5));
    assert!(
        out.contains("is-a-tty") && out.contains("via-dev-tty"),
        "{out}"
    );
}

#[test]
fn pty_from_outside_is_the_controlling_terminal() {
    both("pty_from_outside_is_the_controlling_terminal", scenario_pty);
}

fn scenario_concurrent() {
    let ws = tempfile::tempdir().unwrap();
    let iso = Isolation::new(IsolationSpec::host(ws.path())).unwrap();
    std::thread::scope(|s| {
        for i in 0..8 {
            let iso = &iso;
            s.spawn(move || {
                let out = run(iso, &format!("echo {i} > out-{i}; echo $$"));
                assert!(out.status.success());
                assert_eq!(stdout(&out), "2\n");
            });
        }
    });
    for i in 0..8 {
        assert_eq!(
            std::fs::read_to_string(ws.path().join(format!("out-{i}"))).unwrap(),
            format!("{i}\n")
        );
    }
}

#[test]
fn concurrent_sandboxes_from_threads() {
    both("concurrent_sandboxes_from_threads", scenario_concurrent);
}

/// A caller whose process ignores `SIGCHLD` (some servers do): the exit status still arrives.
#[test]
#[allow(unsafe_code)]
fn exit_status_survives_an_ignored_sigchld() {
    use std::os::unix::process::CommandExt;
    both("exit_status_survives_an_ignored_sigchld", || {
        let ws = tempfile::tempdir().unwrap();
        let iso = Isolation::new(IsolationSpec::host(ws.path())).unwrap();
        let mut c = Command::new("/bin/sh");
        c.args(["-c", "sleep 0.1 & exit 9"]);
        // Added before confine: runs in the outer process, as an inherited disposition would.
        // SAFETY: signal() is async-signal-safe.
        unsafe {
            c.pre_exec(|| {
                libc::signal(libc::SIGCHLD, libc::SIG_IGN);
                Ok(())
            });
        }
        iso.confine(&mut c).unwrap();
        assert_eq!(c.status().unwrap().code(), Some(9));
    });
}
