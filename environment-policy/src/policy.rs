//! The policy: the compiled rules, the relations and delegations, the runtime counters
//! (quotas, approvals, token uses), and the store behind them; and the changes to rules and
//! relations. Checks live in `check`, the other families of operations in their own modules.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use environment_core::Clock;
use environment_core::policy_store::{PolicyChange, PolicyRecords, PolicyStore, Written};

use crate::approval::Approval;
use crate::delegation::Delegation;
use crate::error::{PolicyError, Result};
use crate::format::{LoadIssue, RuleFile, check_rule};
use crate::relations::{ANYONE, EntityId, RelationRefusal, Relations};
use crate::rule::{ActorKind, Rule};
use crate::ruleset::RuleSet;
use crate::schema::Schema;
use crate::store::SqlitePolicyStore;

pub(crate) struct State {
    pub(crate) version: u64,
    pub(crate) rules: Arc<RuleSet>,
    pub(crate) relations: Relations,
    pub(crate) delegations: Vec<Delegation>,
}

#[derive(Default)]
pub(crate) struct Runtime {
    pub(crate) quotas: HashMap<(String, String), (i64, u32)>,
    pub(crate) approvals: BTreeMap<String, Approval>,
    pub(crate) token_uses: HashMap<String, u32>,
    /// Each approval's record as the store holds it: what a write of it compares against.
    pub(crate) approval_bodies: HashMap<String, String>,
}

/// The policy of one environment: rules, relations, delegations, approvals and tokens.
/// Share it as `Arc<Policy>`; checks run concurrently, changes are serialized.
pub struct Policy {
    pub(crate) state: RwLock<State>,
    pub(crate) runtime: Mutex<Runtime>,
    pub(crate) store: Mutex<Box<dyn PolicyStore>>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) token_key: [u8; 32],
    /// The store's generation memory holds ([`UNSEEN`]: to be read again).
    seen: AtomicI64,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("version", &self.version())
            .finish_non_exhaustive()
    }
}

pub(crate) fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}
pub(crate) fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}
pub(crate) fn lock<T>(l: &Mutex<T>) -> MutexGuard<'_, T> {
    l.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn random_id(prefix: &str) -> String {
    let bytes: [u8; 12] = rand::random();
    format!("{prefix}{}", hex::encode(bytes))
}

/// The in-memory policy of what a store holds.
fn in_memory(loaded: PolicyRecords) -> Result<(State, Runtime)> {
    let mut relations = Relations::new();
    for (m, g) in &loaded.relations {
        if relations.can_add(m, g).is_err() {
            return Err(PolicyError::Corrupt(format!("relation {m} in {g}")));
        }
        relations.add(m, g);
    }
    let file = match &loaded.rules {
        Some(text) => RuleFile::parse(text).map_err(PolicyError::Invalid)?,
        None => RuleFile::default(),
    };
    let rules = Arc::new(RuleSet::build(file.schema, file.rules, &mut relations));
    let mut runtime = Runtime::default();
    for r in loaded.approvals {
        let a: Approval = serde_json::from_str(&r.body)
            .map_err(|e| PolicyError::Corrupt(format!("approval: {e}")))?;
        runtime.approvals.insert(a.id.clone(), a);
        runtime.approval_bodies.insert(r.id, r.body);
    }
    for q in loaded.quotas {
        runtime.quotas.insert((q.rule, q.actor), (q.window, q.used));
    }
    runtime.token_uses.extend(loaded.token_uses);
    let delegations = loaded
        .delegations
        .iter()
        .map(|r| {
            serde_json::from_str(&r.body)
                .map_err(|e| PolicyError::Corrupt(format!("delegation: {e}")))
        })
        .collect::<Result<Vec<Delegation>>>()?;
    let state = State {
        version: loaded.version,
        rules,
        relations,
        delegations,
    };
    Ok((state, runtime))
}

/// A generation no store reports: memory must be read again.
const UNSEEN: i64 = i64::MIN;

/// How many times a write made on a state that moved is made again on the state read anew.
const ATTEMPTS: usize = 32;

fn issue(message: String) -> LoadIssue {
    LoadIssue {
        line: 0,
        column: 0,
        rule: None,
        message,
    }
}

impl Policy {
    /// Opens (or creates) a policy stored in the SQLite file at `path`.
    pub fn open(path: &Path, clock: Arc<dyn Clock>) -> Result<Policy> {
        Policy::with_store(Box::new(SqlitePolicyStore::open(path)?), clock)
    }

    /// A policy kept in an in-memory SQLite database (tests, throwaway environments).
    pub fn in_memory(clock: Arc<dyn Clock>) -> Result<Policy> {
        Policy::with_store(Box::new(SqlitePolicyStore::in_memory()?), clock)
    }

    /// A policy kept in `store`: one that several processes or machines share (PostgreSQL)
    /// keeps every one of their policies in step, and a use is spent by one of them only.
    pub fn with_store(mut store: Box<dyn PolicyStore>, clock: Arc<dyn Clock>) -> Result<Policy> {
        let (seen, loaded) = store.load()?;
        let token_key = loaded.token_key;
        let (state, runtime) = in_memory(loaded)?;
        Ok(Policy {
            state: RwLock::new(state),
            runtime: Mutex::new(runtime),
            store: Mutex::new(store),
            clock,
            token_key,
            seen: AtomicI64::new(seen),
        })
    }

    /// Brings memory up to date with the store when another handle committed to it since it
    /// was read (a rule loaded or revoked, an approval granted, a quota or token use spent), so
    /// a change made anywhere applies to the next check here. Cheap when nothing changed: one
    /// look at the store's generation.
    pub(crate) fn refresh(&self) -> Result<()> {
        let now = lock(&self.store).generation()?;
        if now == self.seen.load(Ordering::Acquire) {
            return Ok(());
        }
        // The locks in their usual order: state, runtime, store.
        let mut st = write(&self.state);
        let mut rt = lock(&self.runtime);
        let (now, loaded) = lock(&self.store).load()?;
        let (state, runtime) = in_memory(loaded)?;
        *st = state;
        *rt = runtime;
        self.seen.store(now, Ordering::Release);
        Ok(())
    }

    /// Whether a write was committed; memory, which the caller updates with it, stays current
    /// when nobody else wrote since it was read, and is read again otherwise.
    pub(crate) fn wrote(&self, w: Written) -> bool {
        match w {
            Written::Done { before, after } => {
                if self
                    .seen
                    .compare_exchange(before, after, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    self.seen.store(UNSEEN, Ordering::Release);
                }
                true
            }
            Written::Stale => {
                self.seen.store(UNSEEN, Ordering::Release);
                false
            }
        }
    }

    /// Runs `attempt` on memory brought up to date until its write is not refused as made on
    /// a state that moved (`None`), or fails after [`ATTEMPTS`] tries.
    pub(crate) fn retrying<T>(&self, mut attempt: impl FnMut() -> Result<Option<T>>) -> Result<T> {
        for _ in 0..ATTEMPTS {
            self.refresh()?;
            if let Some(done) = attempt()? {
                return Ok(done);
            }
        }
        Err(PolicyError::Contended(ATTEMPTS))
    }

    /// Makes `change` the next version, on the version memory holds; `None` when the store
    /// moved past it.
    pub(crate) fn change(&self, st: &mut State, change: &PolicyChange) -> Result<Option<u64>> {
        let w = lock(&self.store).change(st.version, change)?;
        Ok(self.wrote(w).then_some(st.version + 1))
    }

    /// [`Policy::refresh`] for a listing that cannot fail: one that cannot read the store
    /// answers from memory (checks refuse instead, see [`Reason::Unreadable`]).
    ///
    /// [`Reason::Unreadable`]: crate::Reason::Unreadable
    pub(crate) fn refresh_or_keep(&self) {
        if let Err(e) = self.refresh() {
            tracing::warn!(error = %e, "the policy store cannot be read; answering from memory");
        }
    }

    /// The current policy version (bumped by every change to rules, relations or delegations).
    pub fn version(&self) -> u64 {
        self.refresh_or_keep();
        read(&self.state).version
    }

    /// Replaces the schema and all rules with those of a rule file (TOML); returns the new version.
    pub fn load_rules(&self, text: &str) -> Result<u64> {
        let file = RuleFile::parse(text).map_err(PolicyError::Invalid)?;
        self.set_rules(file)
    }

    /// Replaces the rules with those of a rule file, as [`Policy::load_rules`] does, only
    /// while the policy is at version `expected` (an `If-Match`): a version made in between,
    /// here or on another machine sharing the store, refuses the load and changes nothing.
    pub fn load_rules_on(&self, expected: u64, text: &str) -> Result<u64> {
        let file = RuleFile::parse(text).map_err(PolicyError::Invalid)?;
        validate(&file)?;
        let text = file.render();
        self.retrying(|| {
            let mut st = write(&self.state);
            if st.version != expected {
                return Err(PolicyError::VersionMoved {
                    expected,
                    current: st.version,
                });
            }
            self.put_rules(&mut st, &file, &text)
        })
    }

    /// Replaces the schema and all rules; returns the new version.
    pub fn set_rules(&self, file: RuleFile) -> Result<u64> {
        validate(&file)?;
        let text = file.render();
        self.retrying(|| self.put_rules(&mut write(&self.state), &file, &text))
    }

    /// Makes `file` (rendered as `text`) the rules of the next version, on the version memory
    /// holds; `None` when the store moved past it.
    fn put_rules(&self, st: &mut State, file: &RuleFile, text: &str) -> Result<Option<u64>> {
        let Some(version) = self.change(st, &PolicyChange::Rules(text.to_owned()))? else {
            return Ok(None);
        };
        let rules = RuleSet::build(file.schema.clone(), file.rules.clone(), &mut st.relations);
        st.rules = Arc::new(rules);
        st.version = version;
        Ok(Some(version))
    }

    /// Changes the current rules with `edit` into a new version. Made on the rules of one
    /// version: a version made elsewhere in between is edited again, never overwritten.
    fn edit_rules(&self, edit: impl Fn(&mut RuleFile) -> Result<()>) -> Result<u64> {
        self.retrying(|| {
            let mut st = write(&self.state);
            let mut file = RuleFile {
                schema: st.rules.schema.schema.clone(),
                rules: st.rules.rules.clone(),
            };
            edit(&mut file)?;
            validate(&file)?;
            self.put_rules(&mut st, &file, &file.render())
        })
    }

    /// The current schema and rules.
    pub fn rules(&self) -> RuleFile {
        self.refresh_or_keep();
        let st = read(&self.state);
        RuleFile {
            schema: st.rules.schema.schema.clone(),
            rules: st.rules.rules.clone(),
        }
    }

    /// The current rules as a rule file.
    pub fn render_rules(&self) -> String {
        self.rules().render()
    }

    /// Adds one rule (its id must be new); returns the new version.
    pub fn add_rule(&self, rule: Rule) -> Result<u64> {
        self.edit_rules(|file| {
            file.rules.push(rule.clone());
            Ok(())
        })
    }

    /// Removes the rule with this id; returns the new version.
    pub fn remove_rule(&self, id: &str) -> Result<u64> {
        self.edit_rules(|file| {
            let before = file.rules.len();
            file.rules.retain(|r| r.id != id);
            if file.rules.len() == before {
                return Err(PolicyError::UnknownRule(id.to_owned()));
            }
            Ok(())
        })
    }

    /// Replaces the schema, keeping the rules (which must still validate).
    pub fn set_schema(&self, schema: Schema) -> Result<u64> {
        self.edit_rules(|file| {
            file.schema = schema.clone();
            Ok(())
        })
    }

    /// Records `member ∈ group` (a group or role); returns the version (bumped if it is new).
    /// Refuses a membership that would make a cycle.
    pub fn add_member(&self, member: &str, group: &str) -> Result<u64> {
        self.add_members(&[(member, group)])
    }

    /// Records many memberships as one change (one version, one transaction): all or none.
    /// Memberships already there change nothing; when all are, the version stays.
    pub fn add_members(&self, pairs: &[(&str, &str)]) -> Result<u64> {
        self.retrying(|| {
            let mut st = write(&self.state);
            let mut next = st.relations.clone();
            let mut new = Vec::new();
            for (m, g) in pairs {
                check_entity(m)?;
                refusal(next.can_add(m, g), m, g)?;
                if !next.contains(m, g) {
                    next.add(m, g);
                    new.push(((*m).to_owned(), (*g).to_owned()));
                }
            }
            if new.is_empty() {
                return Ok(Some(st.version));
            }
            let Some(version) = self.change(&mut st, &PolicyChange::AddRelations(new))? else {
                return Ok(None);
            };
            st.relations = next;
            st.version = version;
            Ok(Some(version))
        })
    }

    /// Removes `member ∈ group`; returns the version (bumped if it existed).
    pub fn remove_member(&self, member: &str, group: &str) -> Result<u64> {
        self.retrying(|| {
            let mut st = write(&self.state);
            if !st.relations.contains(member, group) {
                return Ok(Some(st.version));
            }
            let change = PolicyChange::RemoveRelation(member.to_owned(), group.to_owned());
            let Some(version) = self.change(&mut st, &change)? else {
                return Ok(None);
            };
            st.relations.remove(member, group);
            st.version = version;
            Ok(Some(version))
        })
    }

    /// Whether `who` is `group` or in it, transitively.
    pub fn is_member(&self, who: &str, group: &str) -> bool {
        let st = read(&self.state);
        match (st.relations.lookup(who), st.relations.lookup(group)) {
            (Some(w), Some(g)) => st.relations.is_in(w, g),
            _ => who == group,
        }
    }

    /// Every stored membership as (member, group), sorted.
    pub fn relations(&self) -> Vec<(String, String)> {
        read(&self.state).relations.pairs()
    }

    /// Every group and role `who` is in, directly or not.
    pub fn groups_of(&self, who: &str) -> Vec<String> {
        let mut out = read(&self.state).relations.groups_of(who);
        out.sort();
        out
    }

    /// The direct members of a group.
    pub fn members(&self, group: &str) -> Vec<String> {
        read(&self.state).relations.members(group)
    }
}

/// Every problem of a rule file: duplicate ids, and rules the schema does not admit.
fn validate(file: &RuleFile) -> Result<()> {
    let mut issues = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for r in &file.rules {
        if !seen.insert(r.id.as_str()) {
            issues.push(LoadIssue {
                rule: Some(r.id.clone()),
                ..issue("duplicate rule id".into())
            });
        }
        for m in check_rule(r, &file.schema) {
            issues.push(LoadIssue {
                rule: Some(r.id.clone()),
                ..issue(m)
            });
        }
    }
    if issues.is_empty() {
        Ok(())
    } else {
        Err(PolicyError::Invalid(issues))
    }
}

fn check_entity(id: &str) -> Result<()> {
    if ActorKind::of(id).is_none() && !crate::rule::is_group(id) {
        return Err(PolicyError::BadEntity(id.to_owned()));
    }
    Ok(())
}

fn refusal(r: std::result::Result<(), RelationRefusal>, member: &str, group: &str) -> Result<()> {
    match r {
        Ok(()) => Ok(()),
        Err(RelationRefusal::Cycle) => Err(PolicyError::Cycle {
            member: member.to_owned(),
            group: group.to_owned(),
        }),
        Err(RelationRefusal::NotAGroup) => Err(PolicyError::NotAGroup(group.to_owned())),
        Err(RelationRefusal::Reserved) => {
            Err(PolicyError::BadEntity(format!("{member} / {group}")))
        }
    }
}

pub(crate) fn principals(rel: &Relations, actor: &str) -> Vec<EntityId> {
    let mut out = vec![ANYONE];
    match rel.lookup(actor) {
        Some(id) => {
            let k = rel.kind_principal(id);
            if k != ANYONE {
                out.push(k);
            }
            out.push(id);
            out.extend_from_slice(rel.ancestors(id));
        }
        None => {
            if let Some(k) = kind_id(actor) {
                out.push(k);
            }
        }
    }
    out
}

pub(crate) fn kind_id(actor: &str) -> Option<EntityId> {
    match ActorKind::of(actor)? {
        ActorKind::Human => Some(crate::relations::KIND_HUMAN),
        ActorKind::Agent => Some(crate::relations::KIND_AGENT),
        ActorKind::Service => Some(crate::relations::KIND_SERVICE),
    }
}
