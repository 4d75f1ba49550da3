//! The policy's storage port: where a policy keeps its rules, relations, delegations, approvals
//! and the counters its allows spend (quota uses, token uses). `environment-policy` keeps them
//! in SQLite beside one environment; `environment-postgres` keeps them in PostgreSQL for an
//! environment that several machines share. The policy gives the records their meaning; a
//! store only keeps them, and refuses a write made on a state that has moved since it was read.
//!
//! Every write is a compare-and-swap, so that policies on several machines (or several
//! processes on one file) never lose each other's work:
//! - a change of rules, relations or delegations names the version it was made on, and is
//!   refused when the store has moved past it;
//! - a spend names every counter as it was read; one counter that moved refuses all of them;
//! - an approval's record is replaced only while it still holds what was read.
//!
//! A refused write changes nothing. The caller reads the store again and decides again.

use crate::error::PortError;

/// One record the policy serializes itself: a delegation or an approval, by its id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyRecord {
    /// Its id, unique among records of its kind.
    pub id: String,
    /// Its body, as the policy wrote it.
    pub body: String,
}

/// The uses of one quota rule by one actor in one window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaCount {
    /// The rule that sets the quota.
    pub rule: String,
    /// Whose uses.
    pub actor: String,
    /// When the window began (milliseconds since the Unix epoch).
    pub window: i64,
    /// The uses had in it.
    pub used: u32,
}

/// Everything a policy store holds, read in one snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PolicyRecords {
    /// The version of rules, relations and delegations (0: nothing changed yet).
    pub version: u64,
    /// The rule file, once one was loaded.
    pub rules: Option<String>,
    /// (member, group) pairs.
    pub relations: Vec<(String, String)>,
    /// Delegations, in the order they were made.
    pub delegations: Vec<PolicyRecord>,
    /// Approval requests, in the order they were filed.
    pub approvals: Vec<PolicyRecord>,
    /// The last known count of each (rule, actor).
    pub quotas: Vec<QuotaCount>,
    /// Uses of each token caveat, by its tag.
    pub token_uses: Vec<(String, u32)>,
    /// The key tokens are signed with: made once, when the store is made, and the same for
    /// every handle on the store.
    pub token_key: [u8; 32],
}

/// A change of the rules, relations or delegations: each makes a new version. Every store
/// must keep every kind of change, so the list is closed: a new kind is a new port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PolicyChange {
    /// Replaces the rule file.
    Rules(String),
    /// Adds memberships (those already there stay as they are).
    AddRelations(Vec<(String, String)>),
    /// Removes one membership.
    RemoveRelation(String, String),
    /// Records a new delegation.
    PutDelegation(PolicyRecord),
    /// Removes a delegation.
    DeleteDelegation(String),
}

/// The counters one allow consumes, each as it was read and as it becomes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Uses {
    /// Quota counts: the count read (`None`: none recorded for the rule and actor) and the new.
    pub quotas: Vec<(Option<QuotaCount>, QuotaCount)>,
    /// Approvals: the body read and the new record (a use counted in it).
    pub approvals: Vec<(String, PolicyRecord)>,
    /// Token caveats: the tag, the uses read (0: none recorded) and the new count.
    pub tokens: Vec<(String, u32, u32)>,
}

impl Uses {
    /// Whether there is nothing to count.
    pub fn is_empty(&self) -> bool {
        self.quotas.is_empty() && self.approvals.is_empty() && self.tokens.is_empty()
    }
}

/// What a write did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Written {
    /// It is committed. `before` is the store's generation as the write found it, `after` as
    /// it left it: when `before` is the one the caller last loaded, nobody else wrote in
    /// between, and memory updated with this write is what the store holds at `after`.
    Done {
        /// The generation the write found.
        before: i64,
        /// The generation it left.
        after: i64,
    },
    /// The state it was made on has moved: nothing was written.
    Stale,
}

/// Where a policy keeps what it must not forget. One handle is used by one policy, behind its
/// lock; several handles (in several processes or on several machines) may share a store.
pub trait PolicyStore: Send {
    /// A number that moves whenever another handle commits a write (it may move for this
    /// handle's writes too). Cheap: every check of the policy asks it.
    fn generation(&mut self) -> Result<i64, PortError>;
    /// Everything the store holds, with the generation it was read at, in one snapshot.
    fn load(&mut self) -> Result<(i64, PolicyRecords), PortError>;
    /// Makes `change` version `expected + 1`, if the store is still at version `expected`.
    fn change(&mut self, expected: u64, change: &PolicyChange) -> Result<Written, PortError>;
    /// Records an approval request: a new one (`before` is `None`: refused if the id exists)
    /// or a decided one (refused unless its record still holds `before`).
    fn put_approval(
        &mut self,
        before: Option<&str>,
        record: &PolicyRecord,
    ) -> Result<Written, PortError>;
    /// Counts `uses`, all of them or none: refused if any counter moved since it was read.
    fn spend(&mut self, uses: &Uses) -> Result<Written, PortError>;
}
