//! The policy as environment-core's `Authorizer`, and the reverse query.
// Helpers outside #[test] functions panic on purpose: a broken fixture is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;

use common::*;
use environment_core::{Action, Authorizer, Key, KeyPrefix, Namespace, Resource, Verdict};
use environment_policy::{GrantScope, Policy};

const RULES: &str = r#"
[[rule]]
id = "coders-src"
effect = "permit"
principal = "group:coders"
actions = ["read", "write"]
resource = { path = "src/**" }

[[rule]]
id = "coders-reviews"
effect = "permit"
principal = "group:coders"
actions = ["read"]
resource = { object = "review" }

[[rule]]
id = "no-generated"
effect = "forbid"
principal = "*"
actions = ["write"]
resource = { path = "src/generated/**" }

[[rule]]
id = "cargo-test"
effect = "permit"
principal = "group:coders"
actions = ["execute"]
resource = { program = "cargo", args = ["test", "..."] }

[[rule]]
id = "gh"
effect = "permit"
principal = "group:coders"
actions = ["execute"]
resource = { endpoint = "https://api.github.com/repos/" }

[[rule]]
id = "tasks"
effect = "permit"
principal = "group:coders"
actions = ["publish", "consume"]
resource = { topic = "task.*" }

[[rule]]
id = "merge-main"
effect = "permit"
principal = "group:coders"
actions = ["write"]
resource = { branch = "main" }
approval_from = ["role:maintainer"]
"#;

fn setup() -> Arc<Policy> {
    let (p, _) = policy();
    p.load_rules(RULES).unwrap();
    p.add_member("agent:c", "group:coders").unwrap();
    p.add_member("human:m", "role:maintainer").unwrap();
    Arc::new(p)
}

#[test]
fn core_requests_map_onto_typed_resources() {
    let p = setup();
    let auth: Arc<dyn Authorizer> = p.clone();
    let allow = |r: environment_core::AccessRequest| auth.authorize(&r).is_allowed();
    assert!(allow(write("agent:c", "src/lib.rs")));
    assert!(!allow(write("agent:c", "src/generated/x.rs")));
    assert!(allow(req(
        "agent:c",
        Action::Read,
        Resource::Key(Key::obj("review/42").unwrap())
    )));
    assert!(!allow(req(
        "agent:c",
        Action::Read,
        Resource::Key(Key::obj("artifact/42").unwrap())
    )));
    // A listing is allowed when a permit covers the whole prefix and no forbid reaches into it.
    assert!(allow(req(
        "agent:c",
        Action::Read,
        Resource::Prefix(KeyPrefix::new(Namespace::Fs, "src").unwrap())
    )));
    assert!(!allow(req(
        "agent:c",
        Action::Read,
        Resource::Prefix(KeyPrefix::all(Namespace::Fs))
    )));
    assert!(!allow(req(
        "agent:c",
        Action::Write,
        Resource::Prefix(KeyPrefix::new(Namespace::Fs, "src").unwrap())
    )));
    let prog = |args: &[&str]| {
        req(
            "agent:c",
            Action::Execute,
            Resource::Program {
                program: "cargo".into(),
                args: args.iter().map(|s| s.to_string()).collect(),
            },
        )
    };
    assert!(allow(prog(&["test", "-p", "x"])));
    assert!(!allow(prog(&["publish"])));
    assert!(allow(req(
        "agent:c",
        Action::Execute,
        Resource::Service("https://api.github.com/repos/o/r/issues".into())
    )));
    assert!(!allow(req(
        "agent:c",
        Action::Execute,
        Resource::Service("https://api.github.com/user".into())
    )));
    assert!(!allow(req(
        "agent:c",
        Action::Execute,
        Resource::Service("http://api.github.com/repos/o".into())
    )));
    assert!(allow(req(
        "agent:c",
        Action::Publish,
        Resource::Topic("task.created".into())
    )));
    assert!(!allow(req(
        "agent:c",
        Action::Publish,
        Resource::Topic("task.created.x".into())
    )));
    assert!(!allow(req(
        "agent:other",
        Action::Read,
        Resource::Key(Key::fs("src/a").unwrap())
    )));
}

#[test]
fn core_decisions_carry_rules_version_and_explanations() {
    let p = setup();
    let auth: &dyn Authorizer = &*p;
    let d = auth.authorize(&write("agent:c", "src/lib.rs"));
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(d.rules, ["coders-src"]);
    assert_eq!(d.policy_version, p.version());
    assert!(d.explanation.is_empty(), "allows are not rendered");
    let d = auth.authorize(&write("agent:c", "src/generated/x.rs"));
    assert_eq!(d.verdict, Verdict::Deny);
    assert_eq!(d.rules, ["no-generated"]);
    assert!(
        d.explanation.starts_with("Denied by rule `no-generated`"),
        "{}",
        d.explanation
    );
}

#[test]
fn needs_approval_files_a_durable_request() {
    let p = setup();
    let merge = req("agent:c", Action::Write, Resource::Branch("main".into()));
    let d = p.authorize(&merge);
    let Verdict::NeedsApproval {
        from,
        request: Some(id),
        ..
    } = d.verdict
    else {
        panic!("{d:?}");
    };
    assert_eq!(from, ["role:maintainer"]);
    assert!(d.explanation.contains(&id));
    // Asking again finds the same pending request.
    let Verdict::NeedsApproval {
        request: Some(again),
        ..
    } = p.authorize(&merge).verdict
    else {
        panic!();
    };
    assert_eq!(again, id);
    p.grant(&id, "human:m", GrantScope::once()).unwrap();
    let mut retry = merge.clone();
    retry.context.approval = Some(id);
    assert!(p.authorize(&retry).is_allowed());
    assert!(!p.authorize(&retry).is_allowed());
}

#[test]
fn what_may_lists_actions_under_a_prefix() {
    let p = setup();
    let under = Resource::Prefix(KeyPrefix::new(Namespace::Fs, "src").unwrap());
    let perms = p.what_may("agent:c", &under);
    let pairs: Vec<(&str, &str)> = perms
        .iter()
        .map(|x| (x.action.as_str(), x.rule.as_str()))
        .collect();
    assert_eq!(pairs, [("read", "coders-src"), ("write", "coders-src")]);
    let write = perms.iter().find(|x| x.action == "write").unwrap();
    assert_eq!(write.except, ["no-generated"]);
    assert_eq!(write.resource, "src/**");
    // Fully forbidden actions disappear.
    let generated = Resource::Prefix(KeyPrefix::new(Namespace::Fs, "src/generated").unwrap());
    let actions: Vec<String> = p
        .what_may("agent:c", &generated)
        .into_iter()
        .map(|x| x.action)
        .collect();
    assert_eq!(actions, ["read"]);
    assert!(p.what_may("agent:nobody", &under).is_empty());
    let branch = p.what_may("agent:c", &Resource::Branch("main".into()));
    assert_eq!(branch.len(), 1);
    assert!(branch[0].conditions.contains("approval by role:maintainer"));
    assert!(perms.iter().all(|x| x.via.is_none()));
}

#[test]
fn what_may_includes_rights_lent_by_delegation() {
    let p = setup();
    p.delegate(environment_policy::Delegation {
        id: "c-lends-reads".into(),
        from: "agent:c".into(),
        to: "agent:helper".into(),
        actions: vec!["read".into()],
        resources: vec![environment_policy::ResourcePattern::path("src/**").unwrap()],
        expires_at: None,
    })
    .unwrap();
    let under = Resource::Prefix(KeyPrefix::new(Namespace::Fs, "src").unwrap());
    let perms = p.what_may("agent:helper", &under);
    assert_eq!(perms.len(), 1, "{perms:?}");
    assert_eq!(perms[0].action, "read");
    assert_eq!(perms[0].via.as_deref(), Some("c-lends-reads"));
    assert!(p.evaluate(&read("agent:helper", "src/a.rs")).is_allowed());
}

#[test]
fn concurrent_checks_and_changes() {
    let p = setup();
    std::thread::scope(|s| {
        for t in 0..4 {
            let p = &p;
            s.spawn(move || {
                for i in 0..200 {
                    if t == 0 && i % 20 == 0 {
                        p.add_member(&format!("agent:n{i}"), "group:coders")
                            .unwrap();
                    }
                    assert!(p.check(&write("agent:c", "src/lib.rs")).is_allowed());
                }
            });
        }
    });
    assert!(p.is_member("agent:n0", "group:coders"));
}

/// Through environment-core: a handle presenting a granted approval gets the one merge it was
/// granted for; a handle presenting a token is held to the token's limits.
#[test]
fn core_handles_present_approvals_and_tokens() {
    use environment_core::{
        ActRequest, ActorId, Credentials, EnvError, Intent, LocalEnvironment, Options, Value,
    };
    use environment_policy::TokenLimits;
    let p = setup();
    let dir = tempfile::tempdir().unwrap();
    // The branch is set up by an administrator's handle that the policy does not govern.
    let admin = LocalEnvironment::open(dir.path(), Options::default()).unwrap();
    let main = admin.head("main").unwrap();
    admin
        .create_branch(&ActorId::system(), "topic", &main)
        .unwrap();
    drop(admin);
    let env = LocalEnvironment::open(
        dir.path(),
        Options {
            authorizer: p.clone(),
            ..Options::default()
        },
    )
    .unwrap();
    let coder = ActorId::new("agent:c").unwrap();
    let edit = |env: &LocalEnvironment, path: &str| {
        env.act_blocking(
            ActRequest::new(coder.clone(), Intent::edit("edit"))
                .on("topic")
                .put(Key::fs(path).unwrap(), Value::file("x")),
        )
    };
    edit(&env, "src/a.rs").unwrap();

    // The merge needs an approval; without one it is held and nothing changes.
    let merge = |env: &LocalEnvironment| env.merge(&coder, "topic", "main", Intent::edit("merge"));
    let held = merge(&env).unwrap_err();
    assert!(matches!(held, EnvError::NotAllowed { .. }), "{held}");
    assert_eq!(env.head("main").unwrap(), main);
    let id = p
        .approvals()
        .into_iter()
        .find(|a| a.actor == "agent:c")
        .expect("the held merge filed an approval request")
        .id;
    p.grant(&id, "human:m", GrantScope::once()).unwrap();
    let approved = env.presenting(Credentials {
        approval: Some(id),
        ..Credentials::default()
    });
    merge(&approved).unwrap();
    assert_ne!(env.head("main").unwrap(), main);
    // Once only: the next merge is held again, even presenting the spent approval.
    edit(&env, "src/b.rs").unwrap();
    assert!(merge(&approved).is_err());
    // Other handles never presented anything.
    assert!(merge(&env).is_err());

    // A token narrows the bearer to its limits.
    let token = p
        .issue_token(
            "agent:c",
            TokenLimits {
                paths: Some(vec!["src/only/**".into()]),
                ..TokenLimits::default()
            },
        )
        .unwrap();
    let narrowed = env.presenting(Credentials {
        token: Some(token.encode()),
        ..Credentials::default()
    });
    let refused = edit(&narrowed, "src/c.rs").unwrap_err();
    assert!(matches!(refused, EnvError::NotAllowed { .. }), "{refused}");
    edit(&narrowed, "src/only/d.rs").unwrap();
    edit(&env, "src/c.rs").unwrap();
}
