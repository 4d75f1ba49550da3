//! Self-rollback: an agent breaks its workspace, asks its supervisor over the control socket to
//! roll it back, and carries on — the same process, its files restored under it.
//!
//! The supervisor runs the agent (this binary again, told by an environment variable that it is
//! the agent) in a sandbox when the host allows one, captures everything it changes, and answers
//! it on the socket named by `ENVIRONMENT_SOCKET`.
//!
//! `cargo run -p environment-examples --bin self_rollback`

use std::error::Error;
use std::path::Path;
use std::sync::Arc;

use environment_core::{ActorId, HistoryOptions};
use environment_sandbox::{Bind, Isolation, IsolationSpec, Launcher, Unconfined};
use environment_supervisor::ControlClient;
use environment_supervisor::{AgentSpec, Supervisor, SupervisorConfig};

/// Set for the agent process.
const AGENT: &str = "SELF_ROLLBACK_AGENT";

const LIB: &str = "pub fn answer() -> u32 { 42 }\n";
const CONFIG: &str = "retries = 3\n";

fn main() -> Result<(), Box<dyn Error>> {
    if std::env::var_os(AGENT).is_some() {
        return agent();
    }
    supervisor()
}

/// The agent's pid as the supervisor knows it (it may ask before the supervisor has noted it).
fn supervised_pid(control: &mut ControlClient) -> Result<u64, Box<dyn Error>> {
    for _ in 0..200 {
        if let Some(pid) = control.status()?.agent_pid {
            return Ok(pid.into());
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Err("the supervisor never reported the agent's pid".into())
}

fn agent() -> Result<(), Box<dyn Error>> {
    let own_pid = std::process::id();
    let mut control = ControlClient::from_env()?;
    let before = supervised_pid(&mut control)?;
    control.mark("good")?;
    println!("agent: marked the workspace as `good`; now breaking it");

    std::fs::remove_file("src/lib.rs")?;
    std::fs::write("config.toml", "retries = oops\n")?;
    std::fs::write("scratch.tmp", "half-finished work\n")?;

    let restored = control.restore("good", false)?;
    println!(
        "agent: asked to roll back to `good`; the head is now {}",
        restored
            .version
            .as_deref()
            .and_then(|v| v.get(..12))
            .unwrap_or_default()
    );

    let lib = std::fs::read_to_string("src/lib.rs")?;
    let config = std::fs::read_to_string("config.toml")?;
    if lib != LIB || config != CONFIG || Path::new("scratch.tmp").exists() {
        return Err(format!(
            "the workspace was not restored: lib.rs={lib:?} config.toml={config:?} scratch \
             present={}",
            Path::new("scratch.tmp").exists()
        )
        .into());
    }
    let after = supervised_pid(&mut control)?;
    if after != before || std::process::id() != own_pid {
        return Err(format!("the agent changed: pid {before} before, {after} after").into());
    }
    println!("agent: files back, still the same process (pid {after} to the supervisor)");
    // It carries on from the good state.
    std::fs::write("NOTES", "rolled back once, then went on\n")?;
    Ok(())
}

fn supervisor() -> Result<(), Box<dyn Error>> {
    let dir = tempfile::tempdir()?;
    let work = dir.path().join("project");
    let home = dir.path().join("home");
    std::fs::create_dir_all(work.join("src"))?;
    std::fs::write(work.join("src/lib.rs"), LIB)?;
    std::fs::write(work.join("config.toml"), CONFIG)?;
    let socket = home.join("run/control.sock");

    // In a sandbox when the host allows one: the host read-only, the workspace writable, the
    // socket's directory bound in.
    let (launcher, socket_inside): (Arc<dyn Launcher>, _) = match Isolation::probe() {
        Ok(_) => {
            let inside = Path::new("/tmp/.environment-run");
            std::fs::create_dir_all(home.join("run"))?;
            let mut spec = IsolationSpec::host(&work);
            spec.binds.push(Bind {
                host: home.join("run"),
                inside: inside.to_path_buf(),
                writable: false,
            });
            // The agent is this program: visible inside even when it lives under /tmp, which
            // the sandbox replaces with its own.
            let exe = std::env::current_exe()?;
            if let Some(dir) = exe.parent() {
                spec.binds.push(Bind::same_path(dir));
            }
            (Arc::new(Isolation::new(spec)?), inside.join("control.sock"))
        }
        Err(e) => {
            println!("(no sandbox on this host, the agent runs unconfined: {e})");
            (Arc::new(Unconfined::new(&work)), socket.clone())
        }
    };
    let actor = ActorId::new("agent:self-healer")?;
    let mut config = SupervisorConfig::new(&home, &work, launcher, actor);
    config.socket = Some(socket);
    config.socket_inside = Some(socket_inside);
    let supervisor = Supervisor::open(config)?;

    let exe = std::env::current_exe()?;
    let exit = supervisor.run_agent(AgentSpec::new([exe]).env(AGENT, "1"))?;
    let env = supervisor.env().clone();
    let summary = supervisor.shutdown()?;
    println!(
        "supervisor: the agent exited with {:?}; {} capture(s), {} rollback(s), {} request(s)",
        exit.code, summary.captures, summary.rollbacks, summary.requests
    );
    if !exit.success() {
        return Err(format!("the agent failed: {exit:?}").into());
    }
    if summary.rollbacks != 1 {
        return Err(format!("expected one rollback, saw {}", summary.rollbacks).into());
    }
    let restored = std::fs::read_to_string(work.join("src/lib.rs"))?;
    if restored != LIB || work.join("scratch.tmp").exists() || !work.join("NOTES").exists() {
        return Err("the workspace on disk is not what the agent left".into());
    }
    println!("\nhistory of main:");
    let reader = ActorId::new("human:reader")?;
    for entry in env.history(&reader, "main", &HistoryOptions::default())? {
        println!("  {entry}");
    }
    Ok(())
}
