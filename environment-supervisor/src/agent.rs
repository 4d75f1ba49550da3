//! The agent process: spawned through the launcher, reaped by a waiter thread, signalled through
//! a pidfd (never by a pid that could have been reused), restarted on request.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rustix::process::{Pid, PidfdFlags, Signal};
use serde::Serialize;

use environment_sandbox::error::{Result, SandboxError};
use environment_workspace::{Workspace, lock};

/// The variable through which the agent finds the control socket.
pub const SOCKET_VAR: &str = "ENVIRONMENT_SOCKET";
/// The variable that hands the agent its capability token, when it has one.
pub const TOKEN_VAR: &str = "ENVIRONMENT_TOKEN";

/// How to start the agent.
#[derive(Clone, Debug)]
pub struct AgentSpec {
    /// The program and its arguments.
    pub argv: Vec<OsString>,
    /// Extra environment variables (the launcher may filter them).
    pub env: Vec<(OsString, OsString)>,
    /// Give the agent an empty stdin instead of the supervisor's.
    pub null_stdin: bool,
}

impl AgentSpec {
    /// An agent running `argv`, inheriting stdio.
    pub fn new<I, S>(argv: I) -> AgentSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        AgentSpec {
            argv: argv.into_iter().map(Into::into).collect(),
            env: Vec::new(),
            null_stdin: false,
        }
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> AgentSpec {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// How the agent ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AgentExit {
    /// The pid of its last run.
    pub pid: u32,
    /// Its exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    /// How many times it was restarted (rollbacks in restart mode).
    pub restarts: u32,
}

impl AgentExit {
    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// One run of the agent.
struct Run {
    generation: u64,
    pid: u32,
    pidfd: Option<OwnedFd>,
    exit: Option<ExitStatus>,
}

#[derive(Default)]
struct State {
    spec: Option<AgentSpec>,
    run: Option<Run>,
    generation: u64,
    restarts: u32,
    /// A restart is under way: the exit of the stopped run is not the agent's end.
    restarting: bool,
}

/// The agent's lifecycle, shared with the waiter threads.
#[derive(Default)]
pub(crate) struct Agent {
    state: Mutex<State>,
    changed: Condvar,
}

/// What the supervisor hands every run.
pub(crate) struct Launch {
    pub socket_inside: PathBuf,
    pub token: Option<String>,
    pub workspace: PathBuf,
}

impl Agent {
    /// Starts the agent (it must not be running).
    pub fn spawn(
        self: &Arc<Self>,
        shared: &Arc<Workspace>,
        launch: &Launch,
        spec: AgentSpec,
    ) -> Result<u32> {
        let mut st = lock(&self.state);
        if st.run.as_ref().is_some_and(|r| r.exit.is_none()) {
            return Err(SandboxError::Supervisor(
                "the agent is already running".into(),
            ));
        }
        st.spec = Some(spec);
        st.restarts = 0;
        self.start(&mut st, shared, launch)
    }

    fn start(
        self: &Arc<Self>,
        st: &mut State,
        shared: &Arc<Workspace>,
        launch: &Launch,
    ) -> Result<u32> {
        let Some(spec) = st.spec.clone() else {
            return Err(SandboxError::Supervisor("no agent to start".into()));
        };
        let Some((program, args)) = spec.argv.split_first() else {
            return Err(SandboxError::Supervisor("the agent's argv is empty".into()));
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .current_dir(&launch.workspace)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .env(SOCKET_VAR, &launch.socket_inside);
        if let Some(t) = &launch.token {
            cmd.env(TOKEN_VAR, t);
        }
        if spec.null_stdin {
            cmd.stdin(std::process::Stdio::null());
        }
        let launcher = shared.launcher.as_ref().ok_or_else(|| {
            SandboxError::Supervisor("the workspace was opened without a launcher".into())
        })?;
        launcher.confine(&mut cmd)?;
        let line = spec
            .argv
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ");
        let _ = shared.with_tracker(|t| {
            t.set_context(Some(format!("`{line}`")));
            Ok(())
        });
        for t in shared
            .extra
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            t.set_context(Some(format!("`{line}`")));
        }
        let child = cmd
            .spawn()
            .map_err(SandboxError::io("spawn the agent", PathBuf::from(program)))?;
        let pid = child.id();
        // Taken before the waiter can reap the child, so it names this process for good.
        let pidfd = Pid::from_raw(pid as i32)
            .and_then(|p| rustix::process::pidfd_open(p, PidfdFlags::empty()).ok());
        st.generation += 1;
        let generation = st.generation;
        st.run = Some(Run {
            generation,
            pid,
            pidfd,
            exit: None,
        });
        *lock(&shared.agent_pid) = Some(pid);
        let (agent, shared) = (self.clone(), shared.clone());
        thread::Builder::new()
            .name("environment-agent".into())
            .spawn(move || agent.reap(child, generation, &shared))
            .map_err(SandboxError::io(
                "start the agent waiter",
                PathBuf::from(program),
            ))?;
        Ok(pid)
    }

    fn reap(&self, mut child: Child, generation: u64, shared: &Workspace) {
        let status = child.wait();
        {
            let mut st = lock(&self.state);
            if let Some(run) = st.run.as_mut().filter(|r| r.generation == generation) {
                run.exit = Some(match status {
                    Ok(s) => s,
                    // wait() fails only if the child was already reaped: report it as killed.
                    Err(_) => std::os::unix::process::ExitStatusExt::from_raw(9),
                });
                run.pidfd = None;
            }
            *lock(&shared.agent_pid) = None;
        }
        self.changed.notify_all();
        // What the agent left behind is captured now, attributed to its end.
        if let Err(e) = shared.capture("capture at the agent's exit") {
            tracing::warn!(error = %e, "capture at the agent's exit failed");
        }
    }

    /// The running agent's pid.
    pub fn pid(&self) -> Option<u32> {
        let st = lock(&self.state);
        st.run.as_ref().filter(|r| r.exit.is_none()).map(|r| r.pid)
    }

    /// Waits until the agent has ended for good (not merely stopped for a restart).
    pub fn wait(&self) -> Option<AgentExit> {
        let mut st = lock(&self.state);
        loop {
            match &st.run {
                None => return None,
                Some(r) if !st.restarting => {
                    if let Some(status) = r.exit {
                        return Some(exit_of(r.pid, status, st.restarts));
                    }
                }
                Some(_) => {}
            }
            st = self.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// The exit of the last run, if it has ended.
    pub fn last_exit(&self) -> Option<AgentExit> {
        let st = lock(&self.state);
        st.run
            .as_ref()
            .and_then(|r| r.exit.map(|s| exit_of(r.pid, s, st.restarts)))
    }

    /// Stops the running agent: SIGTERM, then SIGKILL after `grace`. Returns once it is reaped.
    pub fn stop(&self, grace: Duration) {
        let generation = {
            let st = lock(&self.state);
            match &st.run {
                Some(r) if r.exit.is_none() => {
                    signal(r, Signal::TERM);
                    r.generation
                }
                _ => return,
            }
        };
        let deadline = Instant::now() + grace;
        let mut st = lock(&self.state);
        let mut killed = false;
        loop {
            let Some(run) = st.run.as_ref().filter(|r| r.generation == generation) else {
                return;
            };
            if run.exit.is_some() {
                return;
            }
            let now = Instant::now();
            if now >= deadline && !killed {
                signal(run, Signal::KILL);
                killed = true;
            }
            let wait = if killed {
                Duration::from_millis(100)
            } else {
                deadline - now
            };
            st = self
                .changed
                .wait_timeout(st, wait)
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    /// Stops the agent, runs `between` (the restore), and starts it again with the same spec.
    /// The agent's `wait` does not return across the restart.
    pub fn restart<R>(
        self: &Arc<Self>,
        shared: &Arc<Workspace>,
        launch: &Launch,
        grace: Duration,
        between: impl FnOnce() -> Result<R>,
    ) -> Result<(R, Option<u32>)> {
        let was_running = self.pid().is_some();
        lock(&self.state).restarting = was_running;
        self.stop(grace);
        let outcome = between();
        let mut st = lock(&self.state);
        let pid = if was_running {
            st.restarts += 1;
            let started = self.start(&mut st, shared, launch);
            st.restarting = false;
            Some(started)
        } else {
            None
        };
        drop(st);
        self.changed.notify_all();
        let value = outcome?;
        Ok((value, pid.transpose()?))
    }
}

/// Signals a run that has not been reaped (the caller holds the state lock, and the waiter
/// records the exit under it).
fn signal(run: &Run, sig: Signal) {
    let sent = match &run.pidfd {
        Some(fd) => rustix::process::pidfd_send_signal(fd, sig),
        // No pidfd (an old kernel): the pid, which the window between reaping and recording
        // the exit could let the kernel reuse; narrow, and the best there is.
        None => match Pid::from_raw(run.pid as i32) {
            Some(p) => rustix::process::kill_process(p, sig),
            None => Ok(()),
        },
    };
    if let Err(e) = sent {
        tracing::warn!(pid = run.pid, error = %e, "cannot signal the agent");
    }
}

fn exit_of(pid: u32, status: ExitStatus, restarts: u32) -> AgentExit {
    use std::os::unix::process::ExitStatusExt;
    AgentExit {
        pid,
        code: status.code(),
        signal: status.signal(),
        restarts,
    }
}
