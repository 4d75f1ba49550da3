//! Multi-agent coordination: a planner, a coder, a tester and a human maintainer hand one task
//! to each other through the bus, work on the environment, and the policy decides who may do
//! what at every step.
//!
//! task.created → (coder) patch.ready → (tester) review.required → (maintainer approves the
//! merge) → task.completed
//!
//! `cargo run -p environment-examples --bin multi_agent`

use std::error::Error;
use std::sync::Arc;
use std::time::Duration;

use environment_bus::{Bus, BusConfig, GroupOptions, Headers, Lease, PublishOptions};
use environment_core::{
    AccessRequest, ActRequest, Action, ActorId, AttrValue, Context, Credentials, EntryKind,
    ForAgent, HistoryOptions, Intent, IntentKind, Key, LocalEnvironment, Options, Resource,
    SystemClock, Value,
};
use environment_policy::{GrantScope, Policy};

const RULES: &str = r#"
[[rule]]
id = "everyone-reads"
effect = "permit"
principal = "*"
actions = ["read"]
resource = "*"

[[rule]]
id = "planner-plans"
effect = "permit"
principal = "agent:planner"
actions = ["write"]
resource = { object = "task" }

[[rule]]
id = "planner-opens-task-branches"
effect = "permit"
principal = "agent:planner"
actions = ["write"]
resource = { branch = "task/*" }

[[rule]]
id = "coder-edits-src-on-task-branches"
effect = "permit"
principal = "agent:coder"
actions = ["write", "delete"]
resource = { path = "src/**" }
branch = "task/*"
advice = "work on the task's branch, never on main"

[[rule]]
id = "coder-changes-reach-main-only-by-merge"
effect = "permit"
principal = "agent:coder"
actions = ["write", "delete"]
resource = { path = "src/**" }
branch = "main"
when = { operation = "merge" }

[[rule]]
id = "test-results-reach-main-by-merge"
effect = "permit"
principal = "agent:coder"
actions = ["write"]
resource = { object = "test-result" }
branch = "main"
when = { operation = "merge" }

[[rule]]
id = "tester-records-results"
effect = "permit"
principal = "agent:tester"
actions = ["write"]
resource = { object = "test-result" }
branch = "task/*"

[[rule]]
id = "merges-into-main-need-a-maintainer"
effect = "permit"
principal = "agent:coder"
actions = ["write"]
resource = { branch = "main" }
approval_from = ["role:maintainer"]
advice = "request approval from a maintainer, then merge with the approval's id"

[[rule]]
id = "maintainers-approve"
effect = "permit"
principal = "role:maintainer"
actions = ["approve"]
resource = "*"

[[rule]]
id = "agents-use-the-queue"
effect = "permit"
principal = "kind:agent"
actions = ["publish", "consume"]
resource = { topic = "*.*" }

[[rule]]
id = "maintainers-use-the-queue"
effect = "permit"
principal = "role:maintainer"
actions = ["publish", "consume"]
resource = { topic = "*.*" }

[[rule]]
id = "maintainers-check-integrity"
effect = "permit"
principal = "role:maintainer"
actions = ["read"]
resource = { environment = true }
"#;

/// One actor's view of the world: the environment, the bus and the policy that governs both.
struct Desk {
    actor: ActorId,
    env: LocalEnvironment,
    bus: Bus,
    policy: Arc<Policy>,
}

impl Desk {
    /// Publishes a step of the task, after the policy allowed it.
    fn publish(
        &self,
        topic: &str,
        task: &str,
        body: &str,
        op: Option<String>,
    ) -> Result<(), Box<dyn Error>> {
        self.allowed(Action::Publish, Resource::Topic(topic.into()))?;
        let headers = Headers {
            actor: Some(self.actor.to_string()),
            correlation_id: Some(task.to_owned()),
            causing_op: op,
        };
        self.bus
            .publish(
                topic,
                body,
                PublishOptions::default()
                    .ordering_key(task)
                    .headers(headers),
            )
            .wait()?;
        println!("  {} → {topic}: {body}", self.actor);
        Ok(())
    }

    /// Claims the next message of `group`.
    fn claim(&self, group: &str, topic: &str) -> Result<Lease, Box<dyn Error>> {
        self.allowed(Action::Consume, Resource::Topic(topic.into()))?;
        let mut leases = self
            .bus
            .claim(group, self.actor.as_str(), 1, Duration::from_secs(60))
            .wait()?;
        let lease = leases.pop().ok_or("nothing to claim")?;
        println!(
            "  {} claimed {} ({})",
            self.actor,
            lease.message.topic,
            String::from_utf8_lossy(&lease.message.payload)
        );
        Ok(lease)
    }

    fn allowed(&self, action: Action, resource: Resource) -> Result<(), Box<dyn Error>> {
        let request = AccessRequest {
            actor: self.actor.clone(),
            action,
            resource,
            context: Context::default(),
        };
        let decision = self.policy.check(&request);
        if decision.outcome() == environment_policy::Outcome::Allow {
            Ok(())
        } else {
            Err(decision.explain(&request).into())
        }
    }
}

fn main() -> Result<(), Box<dyn Error>> {
    let home = tempfile::tempdir()?;
    let clock = Arc::new(SystemClock);
    let policy = Arc::new(Policy::open(&home.path().join("policy.db"), clock)?);
    policy.load_rules(RULES)?;
    policy.add_member("human:maintainer", "role:maintainer")?;
    let env = LocalEnvironment::open(
        home.path().join(".environment"),
        Options {
            authorizer: policy.clone(),
            ..Options::default()
        },
    )?;
    let bus = Bus::open(home.path().join("bus.db"), BusConfig::default())?;
    for topic in [
        "task.created",
        "patch.ready",
        "review.required",
        "task.completed",
    ] {
        bus.create_topic(topic).wait()?;
    }
    let groups = [
        ("coders", "task.created"),
        ("testers", "patch.ready"),
        ("maintainers", "review.required"),
        ("planners", "task.completed"),
    ];
    for (group, topic) in groups {
        bus.create_group(group, &[topic], GroupOptions::default())
            .wait()?;
    }
    let desk = |name: &str| -> Result<Desk, Box<dyn Error>> {
        Ok(Desk {
            actor: ActorId::new(name)?,
            env: env.clone(),
            bus: bus.clone(),
            policy: policy.clone(),
        })
    };
    let (planner, coder, tester, maintainer) = (
        desk("agent:planner")?,
        desk("agent:coder")?,
        desk("agent:tester")?,
        desk("human:maintainer")?,
    );
    let task = "task/1";

    println!("1. the planner files the task and opens its branch");
    let filed = planner.env.act_blocking(
        ActRequest::new(
            planner.actor.clone(),
            Intent::new(IntentKind::Plan, "file task 1: a parser"),
        )
        .put(
            Key::obj("task/1")?,
            Value::with_kind(
                EntryKind::Artifact,
                r#"{"title":"write a parser","state":"open"}"#,
            ),
        ),
    )?;
    planner
        .env
        .create_branch(&planner.actor, task, &filed.version)?;
    planner.publish(
        "task.created",
        task,
        "write a parser on branch task/1",
        Some(filed.version.to_string()),
    )?;

    println!("2. the coder claims it and writes the patch on the task's branch");
    let lease = coder.claim("coders", "task.created")?;
    let wrong = coder.env.act_blocking(
        ActRequest::new(
            coder.actor.clone(),
            Intent::edit("quick fix straight on main"),
        )
        .put(Key::fs("src/parser.rs")?, Value::file("fn parse() {}\n")),
    );
    match wrong {
        Err(e) => println!("  refused as it should be: {}", e.for_agent()),
        Ok(_) => return Err("the coder wrote on main: the policy failed".into()),
    }
    let patch = coder.env.act_blocking(
        ActRequest::new(
            coder.actor.clone(),
            Intent::edit("parse numbers and identifiers"),
        )
        .on(task)
        .put(
            Key::fs("src/parser.rs")?,
            Value::file("pub fn parse(s: &str) -> Vec<&str> { s.split(' ').collect() }\n"),
        ),
    )?;
    coder.publish(
        "patch.ready",
        task,
        "parser ready for testing",
        Some(patch.version.to_string()),
    )?;
    coder.bus.ack(&lease.receipt).wait()?;

    println!("3. the tester claims the patch, runs the test and records the result");
    let lease = tester.claim("testers", "patch.ready")?;
    let head = tester.env.head(task)?;
    let source = tester
        .env
        .read(&tester.actor, &Key::fs("src/parser.rs")?, &head)?
        .ok_or("the patch has no parser")?;
    let passed = String::from_utf8(tester.env.content(&source)?)?.contains("pub fn parse");
    let verdict = if passed { "pass" } else { "fail" };
    let result = tester.env.act_blocking(
        ActRequest::new(
            tester.actor.clone(),
            Intent::new(IntentKind::Test, "unit tests of the parser"),
        )
        .on(task)
        .put(
            Key::obj("test-result/task-1")?,
            Value::with_kind(
                EntryKind::TestResult,
                format!("{{\"verdict\":\"{verdict}\"}}"),
            ),
        ),
    )?;
    tester.publish(
        "review.required",
        task,
        &format!("tests {verdict}; please review the merge"),
        Some(result.version.to_string()),
    )?;
    tester.bus.ack(&lease.receipt).wait()?;

    println!("4. the coder asks to merge; the policy wants a maintainer's approval first");
    let merge_intent = || Intent::new(IntentKind::Merge, "merge task 1 into main");
    if let Err(e) = coder.env.merge(&coder.actor, task, "main", merge_intent()) {
        println!("  held: {}", e.for_agent());
    }
    let mut attrs = std::collections::BTreeMap::new();
    attrs.insert("operation".to_owned(), AttrValue::Str("merge".into()));
    let approval = policy.request_approval(&AccessRequest {
        actor: coder.actor.clone(),
        action: Action::Write,
        resource: Resource::Branch("main".into()),
        context: Context {
            branch: Some("main".into()),
            attrs,
            ..Context::default()
        },
    })?;
    println!(
        "  approval {} requested from {}",
        approval.id,
        approval.from.join(", ")
    );

    println!("5. the maintainer reviews and approves");
    let lease = maintainer.claim("maintainers", "review.required")?;
    policy.grant(&approval.id, maintainer.actor.as_str(), GrantScope::once())?;
    maintainer.bus.ack(&lease.receipt).wait()?;
    let merged = coder
        .env
        .presenting(Credentials {
            approval: Some(approval.id.clone()),
            ..Credentials::default()
        })
        .merge(&coder.actor, task, "main", merge_intent())?;
    println!("  merged into main: {}", merged.version);
    coder.publish(
        "task.completed",
        task,
        "task 1 merged",
        Some(merged.version.to_string()),
    )?;
    let lease = planner.claim("planners", "task.completed")?;
    planner.env.act_blocking(
        ActRequest::new(
            planner.actor.clone(),
            Intent::new(IntentKind::Plan, "close task 1"),
        )
        .put(
            Key::obj("task/1")?,
            Value::with_kind(
                EntryKind::Artifact,
                r#"{"title":"write a parser","state":"done"}"#,
            ),
        ),
    )?;
    planner.bus.ack(&lease.receipt).wait()?;

    println!("\nhistory of main, as an agent reads it:");
    for entry in env.history(&planner.actor, "main", &HistoryOptions::default())? {
        println!("  {entry}");
    }
    env.verify(&maintainer.actor)?;
    Ok(())
}
