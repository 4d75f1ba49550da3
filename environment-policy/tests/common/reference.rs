//! A naive reference evaluator: the policy's semantics written as directly as possible, with no
//! index, no precomputed closure and no compiled globs. The engine must agree with it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

use environment_core::{AccessRequest, Resource};
use environment_policy::{
    ActorKind, CapabilityToken, Conditions, Delegation, Effect, Outcome, Policy, Principal,
    ResourcePattern, Rule,
};

pub struct Model {
    pub rules: Vec<Rule>,
    pub relations: Vec<(String, String)>,
    pub delegations: Vec<Delegation>,
    pub now: i64,
}

pub fn glob(pat: &str, s: &str, sep: char) -> bool {
    let p: Vec<&str> = pat.split(sep).collect();
    let s: Vec<&str> = if s.is_empty() {
        Vec::new()
    } else {
        s.split(sep).collect()
    };
    segs(&p, &s)
}

fn segs(p: &[&str], s: &[&str]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((&"**", rest)) => (0..=s.len()).any(|k| segs(rest, &s[k..])),
        Some((x, rest)) => {
            !s.is_empty() && wild(x.as_bytes(), s[0].as_bytes()) && segs(rest, &s[1..])
        }
    }
}

fn wild(p: &[u8], s: &[u8]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|k| wild(rest, &s[k..])),
        Some((c, rest)) => s.first() == Some(c) && wild(rest, &s[1..]),
    }
}

pub fn resource_ok(pat: &ResourcePattern, r: &Resource) -> bool {
    let Some(spec) = pat.to_spec() else {
        return true;
    };
    match r {
        Resource::Key(k) => {
            let p = String::from_utf8_lossy(k.path()).into_owned();
            spec.path.as_deref().is_some_and(|g| glob(g, &p, '/'))
                && k.to_string().starts_with("fs:")
                || spec.object.is_some()
                    && k.to_string().starts_with("obj:")
                    && glob(
                        &format!(
                            "{}/{}",
                            spec.object.clone().unwrap_or_default(),
                            spec.key.clone().unwrap_or_default()
                        ),
                        &p,
                        '/',
                    )
        }
        Resource::Secret(s) => spec.secret.as_deref().is_some_and(|g| glob(g, s, '/')),
        Resource::Program { program, .. } => {
            spec.args.is_none()
                && spec
                    .program
                    .as_deref()
                    .is_some_and(|g| glob(g, program, '/'))
        }
        Resource::Topic(t) => spec.topic.as_deref().is_some_and(|g| glob(g, t, '.')),
        _ => false,
    }
}

fn conditions_ok(c: &Conditions, req: &AccessRequest, now: i64) -> bool {
    let ctx = &req.context;
    if c.risk_max.is_some_and(|m| ctx.risk > m) || c.risk_min.is_some_and(|m| ctx.risk < m) {
        return false;
    }
    if let Some(b) = &c.branch {
        match &ctx.branch {
            Some(x) if glob(b.as_str(), x, '/') => {}
            _ => return false,
        }
    }
    if let Some(w) = &c.hours {
        let minute = (now / 60_000) % 1440;
        let (s, e) = (i64::from(w.start_min), i64::from(w.end_min));
        let inside = if s <= e {
            s <= minute && minute < e
        } else {
            minute >= s || minute < e
        };
        if !inside {
            return false;
        }
    }
    c.attrs.iter().all(|(k, v)| ctx.attrs.get(k) == Some(v))
}

impl Model {
    pub fn of(p: &Policy, now: i64) -> Model {
        Model {
            rules: p.rules().rules,
            relations: p.relations(),
            delegations: p.delegations(),
            now,
        }
    }

    pub fn groups(&self, who: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![who.to_owned()];
        while let Some(x) = todo.pop() {
            for (m, g) in &self.relations {
                if *m == x && seen.insert(g.clone()) {
                    todo.push(g.clone());
                }
            }
        }
        seen
    }

    fn principal_ok(&self, p: &Principal, who: &str) -> bool {
        match p {
            Principal::Anyone => true,
            Principal::Kind(k) => ActorKind::of(who) == Some(*k),
            Principal::Entity(e) => e == who || self.groups(who).contains(e),
            _ => false,
        }
    }

    /// The rules that apply to `who` for this request.
    pub fn applicable(&self, who: &str, req: &AccessRequest) -> Vec<&Rule> {
        self.rules
            .iter()
            .filter(|r| {
                self.principal_ok(&r.principal, who)
                    && r.names_action(req.action.as_str())
                    && resource_ok(&r.resource, &req.resource)
                    && conditions_ok(&r.conditions, req, self.now)
            })
            .collect()
    }

    pub fn forbids(&self, who: &str, req: &AccessRequest) -> Vec<String> {
        self.applicable(who, req)
            .into_iter()
            .filter(|r| r.effect == Effect::Forbid)
            .map(|r| r.id.clone())
            .collect()
    }

    pub fn decide(&self, who: &str, req: &AccessRequest, depth: usize) -> Outcome {
        let rules = self.applicable(who, req);
        if rules.iter().any(|r| r.effect == Effect::Forbid) {
            return Outcome::Deny;
        }
        let permits: Vec<&&Rule> = rules
            .iter()
            .filter(|r| r.effect == Effect::Permit)
            .collect();
        if permits
            .iter()
            .any(|r| r.conditions.approval_from.is_empty())
        {
            return Outcome::Allow;
        }
        if !permits.is_empty() {
            return Outcome::NeedsApproval;
        }
        if depth < environment_policy::MAX_DELEGATION_DEPTH {
            for d in &self.delegations {
                let covers = d.to == who
                    && d.expires_at.is_none_or(|e| self.now < e)
                    && d.actions
                        .iter()
                        .any(|a| a == "*" || a == req.action.as_str())
                    && (d.resources.is_empty()
                        || d.resources.iter().any(|p| resource_ok(p, &req.resource)));
                if covers && self.decide(&d.from, req, depth + 1) == Outcome::Allow {
                    return Outcome::Allow;
                }
            }
        }
        Outcome::Deny
    }

    /// The outcome of a request presenting `token` (whose MAC is known to be intact), without
    /// spending uses.
    pub fn decide_with_token(&self, req: &AccessRequest, token: &CapabilityToken) -> Outcome {
        let presenter = req.actor.as_str();
        if token.bearer() != presenter {
            return Outcome::Deny;
        }
        for c in &token.caveats {
            if c.expires_at.is_some_and(|e| self.now >= e) {
                return Outcome::Deny;
            }
            if c.actions
                .as_ref()
                .is_some_and(|a| !a.iter().any(|x| x == req.action.as_str()))
            {
                return Outcome::Deny;
            }
            if c.paths.is_some() || c.programs.is_some() || c.endpoints.is_some() {
                let ok = match &req.resource {
                    Resource::Key(k) if k.to_string().starts_with("fs:") => {
                        let p = String::from_utf8_lossy(k.path()).into_owned();
                        c.paths.iter().flatten().any(|g| glob(g, &p, '/'))
                    }
                    Resource::Program { program, .. } => {
                        c.programs.iter().flatten().any(|g| glob(g, program, '/'))
                    }
                    _ => false,
                };
                if !ok {
                    return Outcome::Deny;
                }
            }
        }
        if token.principal != presenter && !self.forbids(presenter, req).is_empty() {
            return Outcome::Deny;
        }
        self.decide(&token.principal, req, 0)
    }
}
