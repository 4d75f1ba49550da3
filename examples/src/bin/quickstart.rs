//! Quickstart: open an environment in a temporary directory, let two agents act on it, branch,
//! merge (with a conflict), undo, restore, run an idempotent effect, and print the history an agent
//! would read.
//!
//! `cargo run -p environment-examples --bin quickstart`

use std::error::Error;

use environment_core::{
    ActRequest, ActorId, BeginOutcome, Environment, ForAgent, HistoryOptions, Intent, Key,
    LocalEnvironment, Options, Value,
};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let home = tempfile::tempdir()?;
    let env = LocalEnvironment::open(home.path().join(".environment"), Options::default())?;
    let env: &dyn Environment = &env;
    let coder = ActorId::new("agent:coder")?;
    let reviewer = ActorId::new("agent:reviewer")?;
    println!("environment at {}", home.path().display());

    // An agent reads the head, then acts on it.
    let v0 = env.head("main").await?;
    let v1 = env
        .act(
            ActRequest::new(coder.clone(), Intent::edit("scaffold the parser"))
                .base(v0)
                .put(Key::fs("src/parser.rs")?, Value::file("fn parse() {}\n"))
                .put(
                    Key::fs("Cargo.toml")?,
                    Value::file("[package]\nname = \"demo\"\n"),
                ),
        )
        .await?
        .version;
    env.mark(&coder, "scaffolded", &v1).await?;

    // A second agent works on a branch while the first goes on.
    env.create_branch(&reviewer, "review", &v1).await?;
    env.act(
        ActRequest::new(reviewer.clone(), Intent::edit("document the parser"))
            .on("review")
            .put(
                Key::fs("src/parser.rs")?,
                Value::file("/// Parses.\nfn parse() {}\n"),
            )
            .put(Key::fs("README.md")?, Value::file("# demo\n")),
    )
    .await?;
    env.act(
        ActRequest::new(coder.clone(), Intent::edit("make parse public")).put(
            Key::fs("src/parser.rs")?,
            Value::file("pub fn parse() {}\n"),
        ),
    )
    .await?;

    // A stale write on the same key is refused, with text an LLM can act on.
    let stale = env
        .act(
            ActRequest::new(coder.clone(), Intent::edit("based on an old read"))
                .base(v1)
                .put(
                    Key::fs("src/parser.rs")?,
                    Value::file("fn parse() { todo }\n"),
                ),
        )
        .await;
    if let Err(e) = stale {
        println!("\nrefused: {}\n", e.for_agent());
    }

    // Merging makes a conflict object of the key both changed, and takes the rest.
    let merged = env
        .merge(&coder, "review", "main", Intent::edit("merge the review"))
        .await?;
    println!("merged with conflicts in: {:?}", merged.conflicts);

    // Undo the merge, then restore the marked version: both append operations.
    env.undo(&coder, "main").await?;
    let marked = env.resolve("scaffolded").await?;
    env.restore(
        &coder,
        "main",
        &marked,
        Intent::edit("back to the scaffold"),
    )
    .await?;

    // An external effect with an idempotency key runs once, however often it is retried.
    for attempt in 1..=2 {
        match env
            .effect_begin(&coder, "notify-ci-1", "ci", b"{\"event\":\"ready\"}")
            .await?
        {
            BeginOutcome::New(rec) => {
                env.effect_complete(&coder, rec.id, b"queued").await?;
                println!("attempt {attempt}: effect performed");
            }
            BeginOutcome::AlreadyDone(_) => println!("attempt {attempt}: already done, skipped"),
            other => println!("attempt {attempt}: {other:?}"),
        }
    }

    println!("\nhistory of main (newest first):");
    for entry in env
        .history(&coder, "main", &HistoryOptions::default())
        .await?
    {
        println!("  {entry}");
    }
    let report = env.verify(&coder).await?;
    println!(
        "\nverified: {} operations, {} tree nodes, {} blobs",
        report.ops, report.nodes, report.blobs
    );
    Ok(())
}
