//! Helpers shared by the integration tests: request builders and random policies.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod reference;

use std::sync::Arc;

use environment_core::{
    AccessRequest, Action, ActorId, AttrValue, Context, Key, LocalEnvironment, ManualClock,
    Options, Resource, Risk,
};
use environment_policy::{
    AttrType, Conditions, Delegation, Policy, Principal, ResourcePattern, ResourceSpec, Rule,
    RuleFile, Schema, TimeWindow,
};
use proptest::prelude::*;

pub const HOUR: i64 = 3_600_000;

pub fn policy() -> (Policy, ManualClock) {
    let clock = ManualClock::new(10 * HOUR);
    let p = Policy::in_memory(Arc::new(clock.clone())).expect("in-memory policy");
    (p, clock)
}

/// An environment in a new directory, governed by a policy holding `rules`.
pub fn governed(rules: &str) -> (tempfile::TempDir, LocalEnvironment) {
    let (p, _) = policy();
    p.load_rules(rules).expect("rules");
    let dir = tempfile::tempdir().expect("temp dir");
    let env = LocalEnvironment::open(
        dir.path(),
        Options {
            authorizer: Arc::new(p),
            ..Options::default()
        },
    )
    .expect("environment");
    (dir, env)
}

pub fn actor(s: &str) -> ActorId {
    ActorId::new(s).expect("actor id")
}

pub fn req(who: &str, action: Action, resource: Resource) -> AccessRequest {
    AccessRequest {
        actor: actor(who),
        action,
        resource,
        context: Context::default(),
    }
}

pub fn path(p: &str) -> Resource {
    Resource::Key(Key::fs(p).expect("key"))
}

pub fn write(who: &str, p: &str) -> AccessRequest {
    req(who, Action::Write, path(p))
}

pub fn read(who: &str, p: &str) -> AccessRequest {
    req(who, Action::Read, path(p))
}

pub fn schema() -> Schema {
    let mut s = Schema::default();
    s.actions.push("deploy".into());
    s.attributes.insert("env".into(), AttrType::String);
    s.attributes.insert("ticket".into(), AttrType::Int);
    s
}

// ---- random policies ------------------------------------------------------------------------

pub const ACTORS: [&str; 5] = ["agent:a0", "agent:a1", "agent:a2", "human:h0", "service:s0"];
pub const GROUPS: [&str; 5] = ["group:g0", "group:g1", "group:g2", "role:r0", "role:r1"];
pub const ACTIONS: [&str; 4] = ["read", "write", "execute", "deploy"];
const SEGS: [&str; 3] = ["a", "src", "secrets"];
const PAT_SEGS: [&str; 9] = ["a", "src", "secrets", "*", "**", "**", "**", "s*", "*c*"];

pub fn action_of(name: &str) -> Action {
    match name {
        "read" => Action::Read,
        "write" => Action::Write,
        "execute" => Action::Execute,
        other => Action::Custom(other.to_owned()),
    }
}

fn join(v: Vec<&str>) -> String {
    v.join("/")
}

pub fn arb_path() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(&SEGS[..]), 1..4).prop_map(join)
}

pub fn arb_glob() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(&PAT_SEGS[..]), 1..3).prop_map(join)
}

pub fn arb_principal() -> impl Strategy<Value = Principal> {
    prop_oneof![
        2 => Just(Principal::Anyone),
        2 => Just(Principal::Kind(environment_policy::ActorKind::Agent)),
        3 => prop::sample::select(&ACTORS[..]).prop_map(|a| Principal::parse(a).expect("actor")),
        5 => prop::sample::select(&GROUPS[..]).prop_map(|g| Principal::parse(g).expect("group")),
    ]
}

pub fn arb_resource_pattern() -> impl Strategy<Value = ResourcePattern> {
    prop_oneof![
        1 => Just(ResourcePattern::Any),
        6 => arb_glob().prop_map(|g| ResourcePattern::path(&g).expect("glob")),
        1 => prop::sample::select(&["*", "db/*", "db/**", "api"][..]).prop_map(|s| spec(ResourceSpec { secret: Some(s.into()), ..Default::default() })),
        1 => prop::sample::select(&["cargo", "git", "*"][..]).prop_map(|s| spec(ResourceSpec { program: Some(s.into()), ..Default::default() })),
        1 => prop::sample::select(&["task.*", "task.created", "**"][..]).prop_map(|s| spec(ResourceSpec { topic: Some(s.into()), ..Default::default() })),
        1 => (prop::sample::select(&["review", "*", "rev*"][..]), prop::option::of(prop::sample::select(&["**", "a/*", "*"][..])))
            .prop_map(|(kind, key)| spec(ResourceSpec { object: Some(kind.into()), key: key.map(str::to_owned), ..Default::default() })),
    ]
}

fn spec(s: ResourceSpec) -> ResourcePattern {
    ResourcePattern::from_spec(&s).expect("spec")
}

pub fn arb_conditions(permit: bool) -> impl Strategy<Value = Conditions> {
    (
        prop::option::weighted(0.15, prop::sample::select(&[Risk::Low, Risk::Medium][..])),
        prop::option::weighted(0.1, prop::sample::select(&["main", "feature/*"][..])),
        prop::option::weighted(0.1, prop::sample::select(&["prod", "dev"][..])),
        prop::option::weighted(0.1, Just(TimeWindow::parse("09:00-17:00").expect("window"))),
        prop::option::weighted(0.15, prop::sample::select(&GROUPS[..])),
    )
        .prop_map(move |(risk, branch, env, hours, approval)| {
            let mut c = Conditions {
                risk_max: risk,
                branch: branch.map(|b| environment_policy::Glob::path(b).expect("glob")),
                hours,
                ..Conditions::default()
            };
            if let Some(e) = env {
                c.attrs.insert("env".into(), AttrValue::Str(e.into()));
            }
            if let Some(a) = approval.filter(|_| permit) {
                c.approval_from.push(a.into());
            }
            c
        })
}

pub fn arb_rule(id: usize) -> impl Strategy<Value = Rule> {
    (
        prop::bool::weighted(0.3),
        arb_principal(),
        prop::collection::vec(
            prop::sample::select(&["read", "write", "execute", "deploy", "*"][..]),
            1..3,
        ),
        arb_resource_pattern(),
    )
        .prop_flat_map(move |(forbid, principal, actions, resource)| {
            arb_conditions(!forbid).prop_map(move |conditions| {
                let mut acts: Vec<&str> = actions.clone();
                acts.dedup();
                let r = if forbid {
                    Rule::forbid(
                        &format!("r{id}"),
                        principal.clone(),
                        &acts,
                        resource.clone(),
                    )
                } else {
                    Rule::permit(
                        &format!("r{id}"),
                        principal.clone(),
                        &acts,
                        resource.clone(),
                    )
                };
                r.with_conditions(conditions)
            })
        })
}

pub fn arb_rules(max: usize) -> impl Strategy<Value = Vec<Rule>> {
    (0..max).prop_flat_map(|n| (0..n).map(arb_rule).collect::<Vec<_>>())
}

pub fn arb_relations() -> impl Strategy<Value = Vec<(String, String)>> {
    let members: Vec<&'static str> = ACTORS.iter().chain(GROUPS.iter()).copied().collect();
    prop::collection::vec(
        (
            prop::sample::select(members),
            prop::sample::select(&GROUPS[..]),
        )
            .prop_map(|(m, g)| (m.to_owned(), g.to_owned())),
        0..14,
    )
}

pub fn arb_delegations() -> impl Strategy<Value = Vec<Delegation>> {
    prop::collection::vec(
        (
            prop::sample::select(&ACTORS[..]),
            prop::sample::select(&ACTORS[..]),
            prop::sample::select(&["read", "write", "*"][..]),
            prop::option::weighted(0.5, arb_glob()),
            prop::option::weighted(0.2, Just(5 * HOUR)),
        )
            .prop_map(|(from, to, action, glob, expires_at)| Delegation {
                id: String::new(),
                from: from.into(),
                to: to.into(),
                actions: vec![action.into()],
                resources: glob
                    .map(|g| vec![ResourcePattern::path(&g).expect("glob")])
                    .unwrap_or_default(),
                expires_at: expires_at.map(|e| e + 10 * HOUR),
            }),
        0..4,
    )
}

pub fn arb_resource() -> impl Strategy<Value = Resource> {
    prop_oneof![
        8 => arb_path().prop_map(|p| path(&p)),
        1 => prop::sample::select(&["db/main", "api", "db/x/y"][..]).prop_map(|s| Resource::Secret(s.into())),
        1 => prop::sample::select(&["cargo", "git", "rm"][..]).prop_map(|s| Resource::Program { program: s.into(), args: vec!["x".into()] }),
        1 => prop::sample::select(&["task.created", "task.done", "audit"][..]).prop_map(|s| Resource::Topic(s.into())),
        1 => prop::sample::select(&["review/a/x", "review/b", "artifact/a/y"][..]).prop_map(|s| Resource::Key(Key::obj(s).expect("key"))),
    ]
}

pub fn arb_request() -> impl Strategy<Value = AccessRequest> {
    (
        prop::sample::select(&ACTORS[..]),
        prop::sample::select(&ACTIONS[..]),
        arb_resource(),
        prop::sample::select(&[Risk::Low, Risk::Medium, Risk::High][..]),
        prop::option::of(prop::sample::select(&["main", "feature/x", "dev"][..])),
        prop::option::of(prop::sample::select(&["prod", "dev"][..])),
    )
        .prop_map(|(who, action, resource, risk, branch, env)| {
            let mut r = req(who, action_of(action), resource);
            r.context.risk = risk;
            r.context.branch = branch.map(str::to_owned);
            if let Some(e) = env {
                r.context
                    .attrs
                    .insert("env".into(), AttrValue::Str(e.into()));
            }
            r
        })
}

/// A random world: rules, relations, delegations; built into a fresh policy.
#[derive(Clone, Debug)]
pub struct World {
    pub rules: Vec<Rule>,
    pub relations: Vec<(String, String)>,
    pub delegations: Vec<Delegation>,
    /// Hours after midnight the clock stands at.
    pub hour: i64,
}

pub fn arb_world(max_rules: usize) -> impl Strategy<Value = World> {
    (
        arb_rules(max_rules),
        arb_relations(),
        arb_delegations(),
        prop::sample::select(&[3i64, 10, 20][..]),
    )
        .prop_map(|(rules, relations, delegations, hour)| World {
            rules,
            relations,
            delegations,
            hour,
        })
}

impl World {
    /// Builds the policy; refused relations and delegations (cycles, too deep) are skipped, as a
    /// caller would see them refused.
    pub fn build(&self) -> (Policy, ManualClock) {
        let (p, clock) = policy();
        clock.set(self.hour * HOUR);
        p.set_rules(RuleFile {
            schema: schema(),
            rules: self.rules.clone(),
        })
        .expect("generated rules are valid");
        for (m, g) in &self.relations {
            let _ = p.add_member(m, g);
        }
        for d in &self.delegations {
            let _ = p.delegate(d.clone());
        }
        (p, clock)
    }
}

/// Proptest settings for this crate: `cases` cases, no failure files (tests live outside src/).
pub fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}
