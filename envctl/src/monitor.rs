//! The workspace monitor from envctl's side: started on demand by the first command that opens
//! the workspace, detached from it, stopped after an idle time (`ENVIRONMENT_MONITOR_IDLE`,
//! seconds; ten minutes by default) or when the home goes away. `ENVIRONMENT_MONITOR=off`
//! turns it off: every command then rescans the tree.
//!
//! The hidden `envctl monitor --home HOME` runs one ([`serve`]); with `--detach` it starts
//! that in a new session and returns at once, so the monitor is nobody's child.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use environment_sandbox::MonitorClient;
use environment_sandbox::monitor::MonitorConfig;

use crate::failure::{Failure, Outcome};

/// Where a workspace's monitor listens, inside the home.
pub const MONITOR_SOCKET: &str = "run/monitor.sock";

/// How long a monitor waits for a request before it stops.
fn idle() -> Duration {
    std::env::var("ENVIRONMENT_MONITOR_IDLE")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(600), Duration::from_secs)
}

/// The socket of the running monitor of `home`, started if none runs; `None` when monitors are
/// turned off. An error says why none could be started (the command then rescans).
pub fn ensure(home: &Path) -> Result<Option<PathBuf>, String> {
    if std::env::var("ENVIRONMENT_MONITOR").is_ok_and(|v| v == "off") {
        return Ok(None);
    }
    let socket = home.join(MONITOR_SOCKET);
    if MonitorClient::connect(&socket).is_ok() {
        return Ok(Some(socket));
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find envctl itself: {e}"))?;
    let status = std::process::Command::new(exe)
        .arg("monitor")
        .arg("--home")
        .arg(home)
        .arg("--detach")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot start it: {e}"))?;
    if !status.success() {
        return Err(format!("it did not start ({status})"));
    }
    MonitorClient::connect_waiting(&socket, Duration::from_secs(5))
        .map(|_| Some(socket))
        .map_err(|e| format!("it does not answer ({e}; see {})", log_file(home).display()))
}

fn log_file(home: &Path) -> PathBuf {
    home.join("run/monitor.log")
}

/// Runs the monitor of `home` (the hidden `envctl monitor`); with `detach`, starts it in a new
/// session with its output in `HOME/run/monitor.log` and returns.
pub fn serve(home: &Path, detach: bool) -> Outcome<i32> {
    let home = home
        .canonicalize()
        .map_err(|e| Failure::io("open the home", home, e))?;
    if detach {
        use std::os::unix::process::CommandExt;
        let log_path = log_file(&home);
        if let Some(dir) = log_path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| Failure::io("create", dir, e))?;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| Failure::io("open", &log_path, e))?;
        let exe =
            std::env::current_exe().map_err(|e| Failure::io("find", Path::new("envctl"), e))?;
        let mut cmd = std::process::Command::new(exe);
        cmd.arg("monitor")
            .arg("--home")
            .arg(&home)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        // A process group of its own: a terminal's Ctrl-C reaches the command, not the monitor.
        cmd.process_group(0);
        cmd.spawn()
            .map_err(|e| Failure::io("start", Path::new("envctl monitor"), e))?;
        return Ok(0);
    }
    eprintln!(
        "envctl monitor: pid {} serves {}",
        std::process::id(),
        home.display()
    );
    let served = environment_sandbox::monitor::serve(MonitorConfig {
        socket: home.join(MONITOR_SOCKET),
        idle: idle(),
        guard: home.clone(),
    })
    .map_err(|e| Failure::io("run the monitor of", &home, e))?;
    eprintln!(
        "envctl monitor: pid {} stopped: {served:?}",
        std::process::id()
    );
    Ok(0)
}
