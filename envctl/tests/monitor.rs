//! The workspace monitor: commands without a supervisor learn what changed from it, read-only
//! commands never rescan, and a monitor that is gone costs a rescan, never a change.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::*;

/// The pids of monitors serving `home`.
fn monitors(home: &Path) -> Vec<i32> {
    let home = home.canonicalize().unwrap_or_else(|_| home.to_owned());
    let wanted = format!("monitor\0--home\0{}\0", home.display());
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            let text = String::from_utf8_lossy(&cmdline).into_owned();
            (text.contains(&wanted) && !text.contains("--detach")).then_some(pid)
        })
        .collect()
}

/// Whether process `pid` has ended (gone, or its main thread a zombie; its other threads may
/// still hold its descriptors for a moment).
fn ended(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).map_or(true, |s| {
        s.lines()
            .any(|l| l.starts_with("State:") && (l.contains('Z') || l.contains('X')))
    })
}

/// Sends `signal` to the monitors of `ws` and waits until they have ended.
fn stop_monitors(ws: &Ws, signal: &str) {
    let pids = monitors(&ws.home());
    for pid in &pids {
        let ok = std::process::Command::new("kill")
            .args([format!("-{signal}"), pid.to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }
    // Its threads end after its main one: gone once its socket refuses.
    let socket = ws.home().join("run/monitor.sock");
    wait_until("the monitor has ended", || {
        pids.iter().all(|p| ended(*p)) && std::os::unix::net::UnixStream::connect(&socket).is_err()
    });
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The paths each operation of the full log changed, newest first.
fn changed_paths(ws: &Ws) -> Vec<(String, Vec<String>)> {
    let log = ws.full_log("human:test");
    log["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let id = e["id"].as_str().unwrap().to_owned();
            let show = ws.json(&["show", &id]);
            let paths = show["changes"]
                .as_array()
                .map(|c| {
                    c.iter()
                        .map(|c| {
                            format!(
                                "{}:{}",
                                c["namespace"].as_str().unwrap(),
                                c["path"].as_str().unwrap()
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            (
                e["intent"]["text"].as_str().unwrap_or_default().to_owned(),
                paths,
            )
        })
        .collect()
}

fn recorded(ws: &Ws, key: &str) -> bool {
    changed_paths(ws)
        .iter()
        .any(|(_, p)| p.iter().any(|k| k == key))
}

#[test]
fn a_command_without_a_supervisor_records_what_the_monitor_saw() {
    also_unprivileged("a_command_without_a_supervisor_records_what_the_monitor_saw");
    let ws = Ws::new();
    wait_until("init started a monitor", || {
        !monitors(&ws.home()).is_empty()
    });
    // A read-only command records a change the monitor saw (it has a baseline since init).
    std::fs::write(ws.path("src/main.rs"), "fn main() { println!(\"hi\") }\n").unwrap();
    ws.ok(&["log"]);
    assert!(
        recorded(&ws, "fs:src/main.rs"),
        "log recorded the change: {:?}",
        changed_paths(&ws)
    );
    // Changes made while no monitor runs are found by the rescan of the next command that
    // looks at the tree: a monitor that is gone costs a rescan, never a change.
    stop_monitors(&ws, "KILL");
    std::fs::write(ws.path("while-away.txt"), "x\n").unwrap();
    ws.ok(&["status"]);
    assert!(recorded(&ws, "fs:while-away.txt"));
    assert_eq!(
        monitors(&ws.home()).len(),
        1,
        "status started a new monitor"
    );
}

#[test]
fn read_only_commands_never_rescan() {
    also_unprivileged("read_only_commands_never_rescan");
    let ws = Ws::new();
    stop_monitors(&ws, "TERM");
    std::fs::write(ws.path("unseen.txt"), "x\n").unwrap();
    // Nothing vouches for the tree (no monitor watched it): log, show, diff and verify leave
    // it alone, with monitors off or with a new one (a rescan would cost the whole tree), and
    // the next command that looks at the tree records the change.
    for monitor in ["off", "on"] {
        for args in [
            &["log"][..],
            &["verify"],
            &["diff", "HEAD~1"],
            &["show", "HEAD"],
        ] {
            let out = ws
                .cmd(args)
                .env("ENVIRONMENT_MONITOR", monitor)
                .output()
                .unwrap();
            assert_eq!(code(&out), 0, "{args:?}: {}", stderr(&out));
        }
    }
    assert!(!recorded(&ws, "fs:unseen.txt"));
    let out = ws
        .cmd(&["status"])
        .env("ENVIRONMENT_MONITOR", "off")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(recorded(&ws, "fs:unseen.txt"));
}

#[test]
fn later_captures_are_not_called_the_initial_capture() {
    let ws = Ws::new();
    std::fs::write(ws.path("later.txt"), "x\n").unwrap();
    ws.ok(&["status"]);
    let ops = changed_paths(&ws);
    let later = ops
        .iter()
        .find(|(_, p)| p.iter().any(|k| k == "fs:later.txt"))
        .expect("recorded");
    assert!(!later.0.contains("initial"), "{ops:?}");
    assert_eq!(
        ops.iter()
            .filter(|(i, _)| i.contains("initial capture"))
            .count(),
        1,
        "{ops:?}"
    );
}

#[test]
fn the_monitor_stops_when_idle_or_when_its_home_is_gone() {
    let ws = Ws::new();
    wait_until("a monitor runs", || monitors(&ws.home()).len() == 1);
    // Idle: a monitor started with a one-second idle time stops by itself.
    let idle = Ws::new();
    stop_monitors(&idle, "TERM");
    let out = idle
        .cmd(&["status"])
        .env("ENVIRONMENT_MONITOR_IDLE", "1")
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let started = monitors(&idle.home());
    assert_eq!(
        started.len(),
        1,
        "status started a monitor: {} {:?}",
        stderr(&out),
        std::fs::read_to_string(idle.home().join("run/monitor.log"))
    );
    wait_until("the idle monitor stopped", || {
        started.iter().all(|p| ended(*p))
    });
    assert!(!idle.home().join("run/monitor.sock").exists());
    // Gone: removing the workspace ends its monitor.
    let pids = monitors(&ws.home());
    assert_eq!(pids.len(), 1);
    drop(ws);
    wait_until("the orphaned monitor stopped", || {
        pids.iter().all(|p| ended(*p))
    });
}

#[test]
fn another_user_cannot_reach_the_monitor() {
    if in_unprivileged_run() {
        return;
    }
    if !running_as_root() {
        missing_prerequisite("only root can try the monitor as another user");
        return;
    }
    let ws = Ws::new();
    let socket = ws.home().join("run/monitor.sock");
    wait_until("a monitor listens", || socket.exists());
    // The socket is the owner's alone: uid 65534 may not connect, even where the directories
    // above it would let it through.
    let mut dir = socket.parent().unwrap().to_owned();
    while dir != Path::new("/") {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode | 0o711)).unwrap();
        dir = dir.parent().unwrap().to_owned();
    }
    let out = std::process::Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--"])
        .args(["/usr/bin/python3", "-c"])
        .arg(format!(
            "import socket,sys\ns=socket.socket(socket.AF_UNIX)\ntry:\n s.connect({:?})\nexcept PermissionError:\n sys.exit(13)\nsys.exit(0)",
            socket.display().to_string()
        ))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(13),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// envctl `args` in the workspace, in a user namespace of its own whose inotify watch limit is
/// `limit` (a limit of that namespace alone: the host's stays as it is); a monitor it starts
/// keeps the limit.
fn under_watch_limit(ws: &Ws, limit: u32, args: &[&str]) -> std::process::Output {
    let script = format!("echo {limit} > /proc/sys/user/max_inotify_watches && exec \"$@\"");
    let mut c = std::process::Command::new("unshare");
    c.args(["-Ur", "sh", "-c", &script, "sh", BIN])
        .args(args)
        .current_dir(&ws.dir)
        .env_remove("ENVIRONMENT_DIR")
        .env_remove("ENVIRONMENT_ACTOR")
        .env_remove("ENVIRONMENT_SOCKET")
        .env_remove("ENVIRONMENT_TOKEN");
    c.output().unwrap()
}

#[test]
fn a_watch_limit_costs_rescans_never_a_change_and_says_so() {
    also_unprivileged("a_watch_limit_costs_rescans_never_a_change_and_says_so");
    let ws = Ws::new();
    stop_monitors(&ws, "TERM");
    // More directories than the limit lets the monitor watch.
    let deep = (0..24)
        .map(|i| format!("d{i}"))
        .collect::<Vec<_>>()
        .join("/");
    std::fs::create_dir_all(ws.path(&deep)).unwrap();
    let probe = under_watch_limit(&ws, 8, &["status"]);
    if code(&probe) != 0 && stderr(&probe).contains("unshare") {
        missing_prerequisite(&format!(
            "a user namespace to lower the watch limit in: {}",
            stderr(&probe)
        ));
        return;
    }
    assert_eq!(code(&probe), 0, "{}", stderr(&probe));
    let says = |out: &std::process::Output| {
        stderr(out)
            .lines()
            .filter(|l| l.contains("rescans the whole tree") && l.contains("watch limit"))
            .count()
    };
    assert_eq!(says(&probe), 1, "one line says why: {}", stderr(&probe));
    assert_eq!(monitors(&ws.home()).len(), 1, "status started a monitor");
    // The monitor has had its rescan acknowledged; the directories it could not watch still
    // count: every change there is recorded by the next command, every time.
    for round in 0..2 {
        let file = format!("{deep}/late-{round}.txt");
        std::fs::write(ws.path(&file), "written where no watch sees it\n").unwrap();
        let out = ws.run(&["status"]);
        assert_eq!(code(&out), 0, "{}", stderr(&out));
        assert!(
            recorded(&ws, &format!("fs:{file}")),
            "round {round}: {:?}",
            changed_paths(&ws)
        );
        assert_eq!(says(&out), 1, "{}", stderr(&out));
        eprintln!("{:?}", changed_paths(&ws));
    }
    stop_monitors(&ws, "TERM");
}

/// A run that lasts longer than the monitor's idle time keeps it (the supervisor's tracker holds
/// its connection), so the command after the run starts no new monitor and rescans nothing:
/// it records what changed after the run from the same monitor.
#[test]
fn a_run_longer_than_the_idle_time_keeps_the_monitor() {
    if environment_sandbox::Isolation::probe().is_err() {
        common::missing_prerequisite(
            "a_run_longer_than_the_idle_time_keeps_the_monitor: no user namespaces",
        );
        return;
    }
    let ws = Ws::new();
    stop_monitors(&ws, "TERM");
    let idle = |args: &[&str]| {
        let out = ws
            .cmd(args)
            .env("ENVIRONMENT_MONITOR_IDLE", "1")
            .output()
            .unwrap();
        assert_eq!(code(&out), 0, "{}", stderr(&out));
    };
    idle(&["status"]);
    let before = monitors(&ws.home());
    assert_eq!(before.len(), 1);
    idle(&["run", "--", "sh", "-c", "sleep 3; echo during > during.txt"]);
    assert!(recorded(&ws, "fs:during.txt"));
    std::fs::write(ws.path("after.txt"), "after\n").unwrap();
    idle(&["status"]);
    assert_eq!(
        monitors(&ws.home()),
        before,
        "the run's monitor was replaced"
    );
    assert!(recorded(&ws, "fs:after.txt"));
}
