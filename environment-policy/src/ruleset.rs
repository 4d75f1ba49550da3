//! The compiled rule set: rules indexed by principal, then action, then (for paths and objects)
//! the first path segment, so a check looks only at rules that could apply to the actor's own
//! id, its groups and its kind, for this action, under this top-level directory.

use crate::relations::{ANYONE, EntityId, KIND_AGENT, KIND_HUMAN, KIND_SERVICE, Relations};
use crate::resource::{ResourcePattern, Target};
use crate::rule::{ActorKind, Effect, Principal, Rule};
use crate::schema::{ActionId, CompiledSchema, Schema};

/// The rules of one principal for one action: ranges into the rule set's shared arrays, so a
/// check follows no pointers beyond the principal's row.
#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    /// Into `generic`: rules that cannot be keyed (other kinds, `*`, globs starting with a
    /// wildcard).
    generic: (u32, u32),
    /// Into `keyed`: path and object rules by the hash of their first literal segment, sorted.
    keyed: (u32, u32),
}

/// Which keyed rules a target needs to look at.
#[derive(Clone, Copy)]
pub(crate) enum Lookup {
    /// Only those under this first segment.
    Key(u64),
    /// All of them (listings).
    All,
    /// None (the target is not a path or an object).
    Skip,
}

impl Lookup {
    #[inline]
    pub(crate) fn of(target: &Target<'_>) -> Lookup {
        match target {
            Target::Path(p) => Lookup::Key(key(0, first_segment(p))),
            Target::Object(p) => Lookup::Key(key(1, first_segment(p))),
            Target::PathPrefix(_) | Target::ObjectPrefix(_) => Lookup::All,
            _ => Lookup::Skip,
        }
    }
}

#[inline]
fn first_segment(p: &[u8]) -> &[u8] {
    p.split(|b| *b == b'/').next().unwrap_or(p)
}

/// FNV-1a over a kind tag and a segment: short inputs, no allocation, and collisions only cost a
/// glob match (the full pattern is still checked).
#[inline]
fn key(tag: u8, seg: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ u64::from(tag);
    for b in seg {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

fn rule_key(r: &Rule) -> Option<u64> {
    match &r.resource {
        ResourcePattern::Path(g) => g.first_literal().map(|s| key(0, s)),
        ResourcePattern::Object { glob, .. } => glob.first_literal().map(|s| key(1, s)),
        _ => None,
    }
}

#[derive(Debug, Default)]
pub(crate) struct RuleSet {
    pub rules: Vec<Rule>,
    pub schema: CompiledSchema,
    /// Entity id → row in `slots`; `NO_ROW` when the principal has no rules.
    rows: Vec<u32>,
    /// One row of `stride` slots per principal with rules: one per action, then one for rules
    /// that name every action.
    slots: Vec<Slot>,
    stride: usize,
    generic: Vec<u32>,
    keyed: Vec<(u64, u32)>,
}

const NO_ROW: u32 = u32::MAX;

/// A slot's rules while building: generic ones, keyed ones.
type SlotLists = (Vec<u32>, Vec<(u64, u32)>);

impl RuleSet {
    /// Compiles rules that were already validated against `schema`.
    pub(crate) fn build(schema: Schema, rules: Vec<Rule>, relations: &mut Relations) -> RuleSet {
        let schema = CompiledSchema::new(schema);
        let all_slot = schema.len();
        let stride = all_slot + 1;
        // Gather per (principal, slot) first, then lay the lists out contiguously.
        let mut rows: Vec<u32> = Vec::new();
        let mut lists: Vec<SlotLists> = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            let p = match &rule.principal {
                Principal::Anyone => ANYONE,
                Principal::Kind(ActorKind::Human) => KIND_HUMAN,
                Principal::Kind(ActorKind::Agent) => KIND_AGENT,
                Principal::Kind(ActorKind::Service) => KIND_SERVICE,
                Principal::Entity(e) => relations.intern(e),
            } as usize;
            if rows.len() <= p {
                rows.resize(p + 1, NO_ROW);
            }
            if rows[p] == NO_ROW {
                rows[p] = (lists.len() / stride) as u32;
                lists.resize_with(lists.len() + stride, Default::default);
            }
            let row = rows[p] as usize * stride;
            let k = rule_key(rule);
            let mut slots: Vec<usize> = rule
                .actions
                .iter()
                .filter_map(|a| {
                    if a == "*" {
                        Some(all_slot)
                    } else {
                        schema.by_name(a).map(usize::from)
                    }
                })
                .collect();
            slots.sort_unstable();
            slots.dedup();
            for slot in slots {
                let (generic, keyed) = &mut lists[row + slot];
                match k {
                    Some(k) => keyed.push((k, i as u32)),
                    None => generic.push(i as u32),
                }
            }
        }
        // Forbids first, so that a check can skip permits once a forbid applies.
        let permit = |i: u32| rules[i as usize].effect == Effect::Permit;
        let mut set = RuleSet {
            rows,
            stride,
            ..RuleSet::default()
        };
        for (mut generic, mut keyed) in lists {
            generic.sort_by_key(|i| (permit(*i), *i));
            keyed.sort_by_key(|(k, i)| (*k, permit(*i), *i));
            let g0 = set.generic.len() as u32;
            set.generic.extend(generic);
            let k0 = set.keyed.len() as u32;
            set.keyed.extend(keyed);
            set.slots.push(Slot {
                generic: (g0, set.generic.len() as u32),
                keyed: (k0, set.keyed.len() as u32),
            });
        }
        set.rules = rules;
        set.schema = schema;
        set
    }

    fn row(&self, principal: EntityId) -> Option<&[Slot]> {
        let row = *self.rows.get(principal as usize)?;
        if row == NO_ROW {
            return None;
        }
        let start = row as usize * self.stride;
        self.slots.get(start..start + self.stride)
    }

    /// Calls `f` with every rule of `principal` that may apply to `action` on a target looked up
    /// by `lookup`.
    #[inline]
    pub(crate) fn for_each_candidate(
        &self,
        principal: EntityId,
        action: ActionId,
        lookup: Lookup,
        mut f: impl FnMut(u32),
    ) {
        let Some(row) = self.row(principal) else {
            return;
        };
        let specific = row.get(usize::from(action));
        for s in specific.into_iter().chain(row.last()) {
            let generic = self.generic.get(s.generic.0 as usize..s.generic.1 as usize);
            for i in generic.unwrap_or(&[]) {
                f(*i);
            }
            let keyed = self
                .keyed
                .get(s.keyed.0 as usize..s.keyed.1 as usize)
                .unwrap_or(&[]);
            match lookup {
                Lookup::Skip => {}
                Lookup::All => keyed.iter().for_each(|(_, i)| f(*i)),
                Lookup::Key(k) => {
                    let start = keyed.partition_point(|(x, _)| *x < k);
                    for (x, i) in &keyed[start..] {
                        if *x != k {
                            break;
                        }
                        f(*i);
                    }
                }
            }
        }
    }

    /// Every rule of `principal`, for the reverse query.
    pub(crate) fn of_principal(&self, principal: EntityId) -> Vec<u32> {
        let mut out = Vec::new();
        for s in self.row(principal).unwrap_or(&[]) {
            out.extend(
                self.generic
                    .get(s.generic.0 as usize..s.generic.1 as usize)
                    .unwrap_or(&[]),
            );
            out.extend(
                self.keyed
                    .get(s.keyed.0 as usize..s.keyed.1 as usize)
                    .unwrap_or(&[])
                    .iter()
                    .map(|(_, i)| *i),
            );
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    pub(crate) fn rule(&self, i: u32) -> Option<&Rule> {
        self.rules.get(i as usize)
    }
}
