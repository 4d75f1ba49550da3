//! The reverse query: what may an actor do under a resource, so that an agent can plan instead
//! of probing.

use environment_core::Resource;

use crate::delegation::MAX_DELEGATION_DEPTH;
use crate::policy::{Policy, State, principals, read};
use crate::resource::Target;
use crate::rule::{Effect, Rule};
use crate::schema::ActionId;

pub use environment_core::governance::Permission;

impl Policy {
    /// What `actor` may do on `under` (a key, a prefix, a secret…): the permits that reach it,
    /// with their conditions and the forbids that may carve exceptions, including rights lent by
    /// delegation. Lets an agent plan instead of probing.
    pub fn what_may(&self, actor: &str, under: &Resource) -> Vec<Permission> {
        self.refresh_or_keep();
        let st = read(&self.state);
        let Some(target) = Target::of(under) else {
            return Vec::new();
        };
        let now = self.clock.now_ms();
        let mut out = Vec::new();
        own_permissions(&st, actor, &target, None, &mut out);
        // Follow delegations breadth-first, as far as a check would.
        let mut frontier: Vec<(String, String)> = vec![(actor.to_owned(), String::new())];
        for _ in 0..MAX_DELEGATION_DEPTH {
            let mut next = Vec::new();
            for (to, via) in &frontier {
                for d in st.delegations.iter().filter(|d| d.to == *to) {
                    let live = d.expires_at.is_none_or(|e| now < e);
                    let reaches = d.resources.is_empty()
                        || d.resources.iter().any(|r| r.matches(&target, true));
                    if !live || !reaches {
                        continue;
                    }
                    let via = if via.is_empty() {
                        d.id.clone()
                    } else {
                        via.clone()
                    };
                    let mut lent = Vec::new();
                    own_permissions(&st, &d.from, &target, Some(&via), &mut lent);
                    lent.retain(|p| d.actions.iter().any(|a| a == "*" || *a == p.action));
                    out.extend(lent);
                    next.push((d.from.clone(), via));
                }
            }
            frontier = next;
        }
        out.sort_by(|a, b| (&a.action, &a.via, &a.rule).cmp(&(&b.action, &b.via, &b.rule)));
        out.dedup();
        out
    }
}

/// The permissions an actor holds by its own rules (and groups) on `target`.
fn own_permissions(
    st: &State,
    actor: &str,
    target: &Target<'_>,
    via: Option<&str>,
    out: &mut Vec<Permission>,
) {
    let rs = &st.rules;
    let mut idx: Vec<u32> = Vec::new();
    for p in principals(&st.relations, actor) {
        idx.extend(rs.of_principal(p));
    }
    idx.sort_unstable();
    idx.dedup();
    let rules: Vec<&Rule> = idx.iter().filter_map(|i| rs.rule(*i)).collect();
    let forbids: Vec<&Rule> = rules
        .iter()
        .copied()
        .filter(|r| r.effect == Effect::Forbid && r.resource.matches(target, true))
        .collect();
    let all_actions: Vec<String> = (0..rs.schema.len())
        .map(|i| rs.schema.name(i as ActionId).to_owned())
        .collect();
    for r in rules.iter().filter(|r| r.effect == Effect::Permit) {
        if !r.resource.matches(target, true) {
            continue;
        }
        let actions: Vec<&String> = if r.actions.iter().any(|a| a == "*") {
            all_actions.iter().collect()
        } else {
            r.actions.iter().collect()
        };
        for a in actions {
            let applicable: Vec<&&Rule> = forbids.iter().filter(|f| f.names_action(a)).collect();
            let blocked = applicable
                .iter()
                .any(|f| f.conditions.is_empty() && f.resource.matches(target, false));
            if blocked {
                continue;
            }
            out.push(Permission {
                action: a.clone(),
                rule: r.id.clone(),
                resource: r.resource.to_string(),
                conditions: r.conditions.describe(),
                except: applicable.iter().map(|f| f.id.clone()).collect(),
                via: via.map(str::to_owned),
            });
        }
    }
}
