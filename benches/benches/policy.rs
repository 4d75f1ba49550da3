//! environment-policy benches: `check` against 1,000 rules with 10,000 actors in groups nested
//! five deep and path globs (the decision alone, and through core's `Authorizer` port); a
//! relation change that updates the closure of a 1,000-member group (stored in a WAL SQLite
//! file); a token attenuate + verify, and a full check presenting an encoded token.
//!
//! `cargo bench -p environment-benches --bench policy`
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use environment_core::{
    AccessRequest, Action, ActorId, Authorizer, Context, Key, ManualClock, Resource, Risk,
};
use environment_policy::{Policy, Reason, RuleFile, TokenLimits};

const ACTORS: usize = 10_000;
const LEAVES: usize = 625;
const RULES: usize = 1_000;
const PROJECTS: usize = 50;

/// Group `i` at `level` (0 = leaves); each level has a fifth of the groups below it.
fn group(level: usize, i: usize) -> String {
    format!("group:l{level}-{i}")
}

/// The groups that carry rules: every level above the leaves (125 + 25 + 5 + 1).
fn rule_groups() -> Vec<(usize, usize)> {
    (1..5)
        .flat_map(|level| (0..LEAVES / 5usize.pow(level as u32)).map(move |j| (level, j)))
        .collect()
}

/// The project a group's rule is about: the lower groups own one project each, the few
/// top-level groups have rules spread over all projects.
fn project(level: usize, j: usize, i: usize) -> usize {
    if level <= 2 {
        j % PROJECTS
    } else {
        (j * 31 + i) % PROJECTS
    }
}

/// The rule file: about six rules per group, of ten shapes — permits on globs, forbids on
/// secrets and generated code, some with conditions, some whose glob starts with `**` (not
/// indexable by directory) — and a few for every agent.
fn rules() -> String {
    let groups = rule_groups();
    let mut out = String::new();
    for i in 0..RULES {
        let (level, j) = groups[i % groups.len()];
        let principal = if i % 97 == 0 {
            "kind:agent".to_owned()
        } else {
            group(level, j)
        };
        let p = project(level, j, i);
        let (effect, actions, path, extra) = match (i / groups.len()) % 7 {
            0 => ("permit", r#"["read"]"#, format!("p{p}/**"), ""),
            1 => (
                "permit",
                r#"["write"]"#,
                format!("p{p}/src/**/*.rs"),
                "risk_max = \"medium\"\n",
            ),
            2 => (
                "forbid",
                r#"["write", "delete"]"#,
                format!("p{p}/secrets/**"),
                "",
            ),
            3 => (
                "permit",
                r#"["write", "read"]"#,
                format!("p{p}/docs/*.md"),
                "",
            ),
            4 if i % 2 == 0 => ("forbid", r#"["write"]"#, format!("**/*.p{p}-lock"), ""),
            4 => (
                "forbid",
                r#"["write"]"#,
                format!("p{p}/src/generated/**"),
                "",
            ),
            5 => (
                "permit",
                r#"["write"]"#,
                format!("p{p}/tests/**"),
                "branch = \"feature/*\"\n",
            ),
            _ => ("permit", r#"["execute"]"#, format!("p{p}/bin/*"), ""),
        };
        out.push_str(&format!(
            "[[rule]]\nid = \"r{i}\"\neffect = \"{effect}\"\nprincipal = \"{principal}\"\nactions = {actions}\nresource = {{ path = \"{path}\" }}\n{extra}\n"
        ));
    }
    out
}

/// 10,000 agents, each in one leaf group; groups nested five levels deep.
fn relations() -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    for level in 0..4 {
        let n = LEAVES / 5usize.pow(level as u32);
        for i in 0..n {
            pairs.push((group(level, i), group(level + 1, i / 5)));
        }
    }
    for a in 0..ACTORS {
        pairs.push((format!("agent:a{a}"), group(0, a % LEAVES)));
    }
    pairs
}

fn big_policy(dir: &tempfile::TempDir) -> Policy {
    let p = Policy::open(&dir.path().join("policy.db"), Arc::new(ManualClock::new(0))).unwrap();
    let file = RuleFile::parse(&rules()).unwrap();
    assert_eq!(file.rules.len(), RULES);
    p.set_rules(file).unwrap();
    let pairs = relations();
    let refs: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(m, g)| (m.as_str(), g.as_str()))
        .collect();
    p.add_members(&refs).unwrap();
    p
}

/// Requests by spread-out agents, mostly on the projects of their own groups (so that a good
/// share is allowed), on paths a few directories deep.
fn requests() -> Vec<AccessRequest> {
    (0..256)
        .map(|i| {
            let a = (i * 131) % ACTORS;
            let level = 1 + i % 2;
            let j = (a % LEAVES) / 5usize.pow(level as u32);
            let p = if i % 5 == 0 {
                (i * 13) % PROJECTS
            } else {
                project(level, j, i)
            };
            let (action, path) = match i % 6 {
                0 => (Action::Write, format!("p{p}/src/core/deep/x{i}.rs")),
                1 => (Action::Read, format!("p{p}/docs/readme{i}.md")),
                2 => (Action::Write, format!("p{p}/secrets/key{i}.pem")),
                3 => (Action::Write, format!("p{p}/docs/guide{i}.md")),
                4 => (Action::Read, format!("p{p}/src/a/b/c{i}.rs")),
                _ => (Action::Write, format!("p{p}/src/generated/c{i}.rs")),
            };
            AccessRequest {
                actor: ActorId::new(format!("agent:a{a}")).unwrap(),
                action,
                resource: Resource::Key(Key::fs(path).unwrap()),
                context: Context {
                    branch: Some("feature/x".into()),
                    risk: Risk::Low,
                    ..Context::default()
                },
            }
        })
        .collect()
}

fn check(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let p = big_policy(&dir);
    let reqs = requests();
    // A realistic mix: most requests allowed, some forbidden, some with no permit at all.
    let allowed = reqs.iter().filter(|r| p.evaluate(r).is_allowed()).count();
    let forbidden = reqs
        .iter()
        .filter(|r| *p.evaluate(r).reason() == Reason::Forbidden)
        .count();
    assert!(allowed > reqs.len() / 3 && forbidden > 0 && allowed + forbidden < reqs.len());
    eprintln!(
        "check mix over {} requests: {allowed} allowed, {forbidden} forbidden, {} default deny",
        reqs.len(),
        reqs.len() - allowed - forbidden
    );
    let mut g = c.benchmark_group("policy");
    let mut i = 0;
    g.bench_function("check_1000_rules_10000_actors", |b| {
        b.iter(|| {
            i = (i + 1) % reqs.len();
            black_box(p.check(black_box(&reqs[i])).outcome())
        })
    });
    let auth: &dyn Authorizer = &p;
    let allow_only: Vec<&AccessRequest> =
        reqs.iter().filter(|r| p.evaluate(r).is_allowed()).collect();
    let mut i = 0;
    g.bench_function("authorize_allowed_via_core_port", |b| {
        b.iter(|| {
            i = (i + 1) % allow_only.len();
            black_box(auth.authorize(black_box(allow_only[i])))
        })
    });
    g.bench_function("explain_a_deny", |b| {
        let r = reqs.iter().find(|r| !p.evaluate(r).is_allowed()).unwrap();
        let d = p.evaluate(r);
        b.iter(|| black_box(d.explain(r)))
    });
    g.finish();
}

fn relation_change(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let p = Policy::open(&dir.path().join("policy.db"), Arc::new(ManualClock::new(0))).unwrap();
    let members: Vec<String> = (0..1_000).map(|i| format!("agent:m{i}")).collect();
    let pairs: Vec<(&str, &str)> = members.iter().map(|m| (m.as_str(), "group:big")).collect();
    p.add_members(&pairs).unwrap();
    p.add_members(&[
        ("group:top", "role:a"),
        ("role:a", "role:b"),
        ("role:b", "role:c"),
    ])
    .unwrap();
    let mut g = c.benchmark_group("policy");
    let mut inside = false;
    // Each iteration is one change: group:big (1,000 members) joins or leaves a group that sits
    // three levels deep, so every member's closure gains or loses four groups.
    g.bench_function("relation_change_1000_member_group", |b| {
        b.iter(|| {
            if inside {
                p.remove_member("group:big", "group:top").unwrap();
            } else {
                p.add_member("group:big", "group:top").unwrap();
            }
            inside = !inside;
        })
    });
    g.finish();
    assert_eq!(p.is_member("agent:m7", "role:c"), inside);
}

fn tokens(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let p = big_policy(&dir);
    let holder = "agent:a7";
    let token = p
        .issue_token(
            holder,
            TokenLimits {
                paths: Some(vec!["p7/**".into()]),
                ..TokenLimits::default()
            },
        )
        .unwrap();
    let limits = TokenLimits {
        paths: Some(vec!["p7/src/**".into()]),
        actions: Some(vec!["write".into()]),
        expires_at: Some(1_000_000),
        bearer: Some("agent:sub".into()),
        ..TokenLimits::default()
    };
    let mut g = c.benchmark_group("policy");
    g.bench_function("token_attenuate_and_verify", |b| {
        b.iter(|| {
            let child = p
                .attenuate_token(black_box(&token), holder, limits.clone())
                .unwrap();
            p.verify_token(black_box(&child), "agent:sub").unwrap();
            child
        })
    });
    let child = p.attenuate_token(&token, holder, limits.clone()).unwrap();
    let r = AccessRequest {
        actor: ActorId::new("agent:sub").unwrap(),
        action: Action::Write,
        resource: Resource::Key(Key::fs("p7/src/lib.rs").unwrap()),
        context: Context {
            token: Some(child.encode()),
            ..Context::default()
        },
    };
    g.bench_function("check_with_encoded_token", |b| {
        b.iter(|| black_box(p.check(black_box(&r)).outcome()))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = check, relation_change, tokens
}
criterion_main!(benches);
