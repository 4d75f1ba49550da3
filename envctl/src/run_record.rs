//! The record of a run in progress (`run/active` under the home), so that a run whose
//! supervisor was killed is noticed: its sandbox died with it, and the next command says so and
//! captures what the agent changed before it ended (every command captures the workspace
//! first).

use std::path::{Path, PathBuf};

/// The record's path under the home.
const ACTIVE: &str = "run/active";

/// A run in progress; [`ActiveRun::end`] removes its record when the run ends as it should.
pub struct ActiveRun {
    path: PathBuf,
}

/// The start time of `pid` in clock ticks since boot (field 22 of `/proc/PID/stat`), which
/// tells a process from a later one given the same pid.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

impl ActiveRun {
    /// Writes the record of this process's run.
    pub fn begin(home: &Path) -> std::io::Result<ActiveRun> {
        let path = home.join(ACTIVE);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let pid = std::process::id();
        let started = start_time(pid).unwrap_or(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        std::fs::write(&path, format!("{pid} {started} {now}\n"))?;
        Ok(ActiveRun { path })
    }

    /// The run ended as it should: its record goes.
    pub fn end(self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// When the home holds the record of a run whose process is gone, removes it and says how it
/// ended; `None` when there is none or it is still running.
pub fn ended_abnormally(home: &Path) -> Option<String> {
    let path = home.join(ACTIVE);
    let text = std::fs::read_to_string(&path).ok()?;
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
    let (pid, started, at) = (fields.next()??, fields.next()??, fields.next()??);
    let pid = u32::try_from(pid).ok()?;
    if start_time(pid) == Some(started) {
        return None; // still running
    }
    let _ = std::fs::remove_file(&path);
    let ago = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs().saturating_sub(at))
        .unwrap_or(0);
    Some(format!(
        "the last run (pid {pid}, started {ago} s ago) ended abnormally: its supervisor was \
         killed, and its sandbox with it; what the agent changed is captured now"
    ))
}
