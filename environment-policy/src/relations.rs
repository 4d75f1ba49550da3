//! Membership relations (`member(agent:coder-1, group:coders)`) with their transitive closure
//! kept up to date on every change, so that a check asks set questions instead of walking a graph.

use std::collections::HashMap;

/// A dense number for an actor, group or role.
pub(crate) type EntityId = u32;

/// Reserved ids: the principals every actor has, before any entity.
pub(crate) const ANYONE: EntityId = 0;
pub(crate) const KIND_HUMAN: EntityId = 1;
pub(crate) const KIND_AGENT: EntityId = 2;
pub(crate) const KIND_SERVICE: EntityId = 3;
const RESERVED: [&str; 4] = ["*", "kind:human", "kind:agent", "kind:service"];

/// Why a relation change was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RelationRefusal {
    NotAGroup,
    Cycle,
    Reserved,
}

#[derive(Debug, Default, Clone)]
pub(crate) struct Relations {
    ids: HashMap<Box<str>, EntityId>,
    names: Vec<Box<str>>,
    /// Direct groups of each entity.
    parents: Vec<Vec<EntityId>>,
    /// Direct members of each group.
    children: Vec<Vec<EntityId>>,
    /// Every group an entity belongs to, directly or not; sorted.
    ancestors: Vec<Vec<EntityId>>,
    /// The reserved principal of each entity's kind (or `ANYONE` when it has none).
    kind: Vec<EntityId>,
}

impl Relations {
    pub(crate) fn new() -> Relations {
        let mut r = Relations::default();
        for name in RESERVED {
            r.intern(name);
        }
        r
    }

    pub(crate) fn lookup(&self, name: &str) -> Option<EntityId> {
        self.ids.get(name).copied()
    }

    pub(crate) fn intern(&mut self, name: &str) -> EntityId {
        if let Some(id) = self.ids.get(name) {
            return *id;
        }
        let id = self.names.len() as EntityId;
        self.ids.insert(name.into(), id);
        self.names.push(name.into());
        self.parents.push(Vec::new());
        self.children.push(Vec::new());
        self.ancestors.push(Vec::new());
        let kind = match crate::rule::ActorKind::of(name) {
            Some(crate::rule::ActorKind::Human) => KIND_HUMAN,
            Some(crate::rule::ActorKind::Agent) => KIND_AGENT,
            Some(crate::rule::ActorKind::Service) => KIND_SERVICE,
            _ => ANYONE,
        };
        self.kind.push(kind);
        id
    }

    /// Every group `id` is in, transitively (sorted).
    #[inline]
    pub(crate) fn ancestors(&self, id: EntityId) -> &[EntityId] {
        self.ancestors.get(id as usize).map_or(&[], Vec::as_slice)
    }

    #[inline]
    pub(crate) fn kind_principal(&self, id: EntityId) -> EntityId {
        self.kind.get(id as usize).copied().unwrap_or(ANYONE)
    }

    /// Whether `who` is `group` or a member of it, transitively.
    pub(crate) fn is_in(&self, who: EntityId, group: EntityId) -> bool {
        who == group || self.ancestors(who).binary_search(&group).is_ok()
    }

    /// Whether `member ∈ group` is stored (directly).
    pub(crate) fn contains(&self, member: &str, group: &str) -> bool {
        match (self.lookup(member), self.lookup(group)) {
            (Some(m), Some(g)) => self.parents[m as usize].contains(&g),
            _ => false,
        }
    }

    /// Whether `member ∈ group` may be added (without changing anything).
    pub(crate) fn can_add(&self, member: &str, group: &str) -> Result<(), RelationRefusal> {
        if RESERVED.contains(&member) || RESERVED.contains(&group) {
            return Err(RelationRefusal::Reserved);
        }
        if !crate::rule::is_group(group) {
            return Err(RelationRefusal::NotAGroup);
        }
        if member == group {
            return Err(RelationRefusal::Cycle);
        }
        if let (Some(m), Some(g)) = (self.lookup(member), self.lookup(group))
            && self.is_in(g, m)
        {
            return Err(RelationRefusal::Cycle);
        }
        Ok(())
    }

    /// Adds `member ∈ group`; returns false if it was already there. Call `can_add` first.
    pub(crate) fn add(&mut self, member: &str, group: &str) -> bool {
        let m = self.intern(member);
        let g = self.intern(group);
        let parents = &mut self.parents[m as usize];
        if parents.contains(&g) {
            return false;
        }
        parents.push(g);
        self.children[g as usize].push(m);
        let mut gained = self.ancestors(g).to_vec();
        insert_sorted(&mut gained, g);
        for d in self.subtree(m) {
            let anc = &mut self.ancestors[d as usize];
            for x in &gained {
                insert_sorted(anc, *x);
            }
        }
        true
    }

    /// Removes `member ∈ group`; returns false if it was not there.
    pub(crate) fn remove(&mut self, member: &str, group: &str) -> bool {
        let (Some(m), Some(g)) = (self.lookup(member), self.lookup(group)) else {
            return false;
        };
        let parents = &mut self.parents[m as usize];
        let Some(i) = parents.iter().position(|p| *p == g) else {
            return false;
        };
        parents.swap_remove(i);
        self.children[g as usize].retain(|c| *c != m);
        // Recompute the closure of everything under the member, parents before children.
        for d in self.subtree(m) {
            let mut anc = Vec::new();
            for p in &self.parents[d as usize] {
                insert_sorted(&mut anc, *p);
                for a in &self.ancestors[*p as usize] {
                    insert_sorted(&mut anc, *a);
                }
            }
            self.ancestors[d as usize] = anc;
        }
        true
    }

    /// `root` and everything under it, each before its members (reverse post-order of a DFS).
    fn subtree(&self, root: EntityId) -> Vec<EntityId> {
        let mut seen = vec![false; self.names.len()];
        let mut post = Vec::new();
        let mut stack = vec![(root, 0usize)];
        seen[root as usize] = true;
        while let Some((n, i)) = stack.pop() {
            if let Some(c) = self.children[n as usize].get(i).copied() {
                stack.push((n, i + 1));
                if !seen[c as usize] {
                    seen[c as usize] = true;
                    stack.push((c, 0));
                }
            } else {
                post.push(n);
            }
        }
        post.reverse();
        post
    }

    /// Every stored relation, as (member, group).
    pub(crate) fn pairs(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (m, ps) in self.parents.iter().enumerate() {
            for p in ps {
                out.push((
                    self.names[m].to_string(),
                    self.names[*p as usize].to_string(),
                ));
            }
        }
        out.sort();
        out
    }

    /// Every group `who` is in, transitively, by name.
    pub(crate) fn groups_of(&self, who: &str) -> Vec<String> {
        self.lookup(who)
            .map(|id| {
                self.ancestors(id)
                    .iter()
                    .map(|g| self.names[*g as usize].to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The direct members of a group.
    pub(crate) fn members(&self, group: &str) -> Vec<String> {
        self.lookup(group)
            .map(|g| {
                self.children[g as usize]
                    .iter()
                    .map(|c| self.names[*c as usize].to_string())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn insert_sorted(v: &mut Vec<EntityId>, x: EntityId) {
    if let Err(i) = v.binary_search(&x) {
        v.insert(i, x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closure_follows_changes() {
        let mut r = Relations::new();
        r.add("agent:a", "group:x");
        r.add("group:x", "group:y");
        r.add("group:y", "role:z");
        let a = r.lookup("agent:a").unwrap();
        let z = r.lookup("role:z").unwrap();
        assert!(r.is_in(a, z));
        assert_eq!(r.can_add("role:z", "group:x"), Err(RelationRefusal::Cycle));
        r.add("agent:a", "group:y");
        r.remove("group:x", "group:y");
        assert!(r.is_in(a, z), "still in through the direct edge to y");
        r.remove("agent:a", "group:y");
        assert!(!r.is_in(a, z));
    }
}
