//! `envctl demo`: the tour a newcomer runs first. It makes a throwaway workspace, lets a scripted
//! agent work in it, breaks it, and rolls it back — printing each real envctl command and what
//! it answered.

use std::path::Path;
use std::process::Command;

use crate::failure::{Failure, Outcome};

/// The scripted agent: writes code, edits the README, removes a file.
const AGENT: &str = "mkdir -p src && printf 'pub fn add(a: i32, b: i32) -> i32 { a + b }\\n' > src/lib.rs \
                     && printf '# demo\\n\\nNow with addition.\\n' > README.md && rm notes.txt";

/// The accident: the agent wipes its sources.
const ACCIDENT: &str = "rm -r src && echo oops > README.md";

fn step(exe: &Path, dir: &Path, args: &[&str], why: &str) -> Outcome<()> {
    println!("\n# {why}");
    let shown: Vec<String> = args
        .iter()
        .map(|a| {
            if a.contains('\'') {
                format!("\"{a}\"")
            } else if a.contains(' ') {
                format!("'{a}'")
            } else {
                (*a).to_owned()
            }
        })
        .collect();
    println!("$ envctl {}", shown.join(" "));
    let out = Command::new(exe)
        .args(args)
        .current_dir(dir)
        .env_remove("ENVIRONMENT_DIR")
        .env_remove("ENVIRONMENT_SOCKET")
        .output()
        .map_err(|e| Failure::other(format!("cannot run envctl for the demo: {e}")))?;
    print!("{}", String::from_utf8_lossy(&out.stdout));
    print!("{}", String::from_utf8_lossy(&out.stderr));
    if out.status.success() {
        Ok(())
    } else {
        Err(
            Failure::other(format!("the demo step `envctl {}` failed", args.join(" ")))
                .hint("the output above says why"),
        )
    }
}

fn ls(dir: &Path) -> String {
    let mut names = Vec::new();
    for rel in ["README.md", "notes.txt", "src/lib.rs"] {
        if dir.join(rel).exists() {
            names.push(rel);
        }
    }
    names.join(", ")
}

/// Runs the tour in a new directory under `parent` (default: the system's temporary directory).
pub fn run(keep: Option<&Path>) -> Outcome<()> {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::other(format!("cannot find the envctl binary: {e}")))?;
    let parent = keep
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir);
    let dir = parent.join(format!("envctl-demo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| Failure::io("create", &dir, e))?;
    std::fs::write(dir.join("README.md"), "# demo\n").map_err(|e| Failure::io("write", &dir, e))?;
    std::fs::write(dir.join("notes.txt"), "remember the milk\n")
        .map_err(|e| Failure::io("write", &dir, e))?;
    let result = tour(&exe, &dir);
    if keep.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("\nThe workspace stays at {}.", dir.display());
    }
    result
}

fn tour(exe: &Path, dir: &Path) -> Outcome<()> {
    println!(
        "A throwaway workspace at {} holds: {}",
        dir.display(),
        ls(dir)
    );
    step(
        exe,
        dir,
        &["init"],
        "make it an environment: everything in it is captured",
    )?;
    step(
        exe,
        dir,
        &["--actor", "agent:demo", "run", "--", "sh", "-c", AGENT],
        "an agent works in it; every change is captured without its help",
    )?;
    step(exe, dir, &["log"], "the history, as an agent would read it")?;
    step(exe, dir, &["mark", "good"], "name the good state")?;
    step(
        exe,
        dir,
        &[
            "--actor",
            "agent:demo",
            "exec",
            "--intent",
            "clean up",
            "--",
            "sh",
            "-c",
            ACCIDENT,
        ],
        "an accident, recorded as one command of the agent",
    )?;
    println!("(the workspace now holds: {})", ls(dir));
    step(exe, dir, &["diff", "good"], "what the accident changed")?;
    step(
        exe,
        dir,
        &["restore", "good", "--dry-run"],
        "preview the rollback",
    )?;
    step(
        exe,
        dir,
        &["restore", "good"],
        "roll back: only what differs is written",
    )?;
    println!("(the workspace holds again: {})", ls(dir));
    step(
        exe,
        dir,
        &["log", "--all", "--limit", "6"],
        "nothing was rewritten: the rollback is an operation too",
    )?;
    step(exe, dir, &["verify"], "and the hash-chained log proves it")?;
    println!(
        "\nNext: `envctl init` in a project of yours, then `envctl run -- <your agent>`, or configure `envctl mcp` as an MCP server."
    );
    Ok(())
}
