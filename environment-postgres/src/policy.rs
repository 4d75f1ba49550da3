//! [`PgPolicyStore`]: core's policy storage port on PostgreSQL, so that the policies of every
//! machine working on one environment keep one set of rules, relations, delegations and
//! approvals, and spend one set of quota and token counters.
//!
//! Every write is one transaction that first locks the store's single state row: writers take
//! turns, and each reads the version and the counters it compares against after the one before
//! it committed (`READ COMMITTED` reads what committed before each statement). The state row
//! also holds the generation, bumped by every write, which each check of every policy reads.
//! A load reads everything in one `REPEATABLE READ` snapshot.
//!
//! The store keeps one connection ([`Session`]): policy writes are rare, and each check reads
//! one number.

use environment_core::PortError;
use environment_core::policy_store::{
    PolicyChange, PolicyRecord, PolicyRecords, PolicyStore, QuotaCount, Uses, Written,
};
use postgres::IsolationLevel;

use crate::connection::{PgStoreConfig, Session, Tx};
use crate::error::{PgContext, PgError, Result};
use crate::migrate::Migration;
use crate::statements::Statements;

/// The component's name in `environment_migrations`.
const COMPONENT: &str = "policy";

/// The policy's migrations, in order.
const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "state, relations, delegations, approvals, quota and token counters",
        sql: "
CREATE TABLE policy_state(
    id BOOLEAN PRIMARY KEY DEFAULT TRUE CHECK (id),
    version BIGINT NOT NULL DEFAULT 0,
    generation BIGINT NOT NULL DEFAULT 0,
    rules TEXT,
    token_key BYTEA CHECK (length(token_key) = 32)
);
INSERT INTO policy_state(id) VALUES (TRUE);
CREATE TABLE policy_relations(
    member TEXT NOT NULL,
    grp TEXT NOT NULL,
    PRIMARY KEY (member, grp)
);
CREATE TABLE policy_delegations(
    seq BIGINT GENERATED ALWAYS AS IDENTITY,
    id TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
CREATE TABLE policy_approvals(
    seq BIGINT GENERATED ALWAYS AS IDENTITY,
    id TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
CREATE TABLE policy_quotas(
    rule TEXT NOT NULL,
    actor TEXT NOT NULL,
    win BIGINT NOT NULL,
    used BIGINT NOT NULL CHECK (used >= 0),
    PRIMARY KEY (rule, actor)
);
CREATE TABLE policy_token_uses(
    tag TEXT PRIMARY KEY,
    used BIGINT NOT NULL CHECK (used >= 0)
);
",
    },
    Migration {
        version: 2,
        name: "a spend in one statement",
        sql: SPEND_FUNCTION,
    },
];

/// A spend, compared and counted on the server in one statement (one round trip, where the
/// same steps from the client took six): the state row locked, every counter compared with
/// what it was read as (NULL when one moved, and nothing written), then all of them written
/// and the generation bumped; the generation before and after otherwise. Each statement of
/// the function reads what committed before it, so it sees every spend that held the lock
/// before this one.
const SPEND_FUNCTION: &str = "
CREATE FUNCTION policy_spend(
    q_rule TEXT[], q_actor TEXT[], q_had BOOLEAN[], q_before_win BIGINT[],
    q_before_used BIGINT[], q_win BIGINT[], q_used BIGINT[],
    a_id TEXT[], a_before TEXT[], a_body TEXT[],
    t_tag TEXT[], t_before BIGINT[], t_used BIGINT[]
) RETURNS BIGINT[] LANGUAGE plpgsql AS $$
DECLARE
    before BIGINT;
    after BIGINT;
    w BIGINT;
    u BIGINT;
    b TEXT;
BEGIN
    SELECT generation INTO before FROM policy_state FOR UPDATE;
    FOR i IN 1 .. COALESCE(array_length(q_rule, 1), 0) LOOP
        SELECT win, used INTO w, u FROM policy_quotas
            WHERE rule = q_rule[i] AND actor = q_actor[i];
        IF FOUND <> q_had[i] OR (FOUND AND (w <> q_before_win[i] OR u <> q_before_used[i])) THEN
            RETURN NULL;
        END IF;
    END LOOP;
    FOR i IN 1 .. COALESCE(array_length(a_id, 1), 0) LOOP
        SELECT body INTO b FROM policy_approvals WHERE id = a_id[i];
        IF NOT FOUND OR b <> a_before[i] THEN
            RETURN NULL;
        END IF;
    END LOOP;
    FOR i IN 1 .. COALESCE(array_length(t_tag, 1), 0) LOOP
        SELECT used INTO u FROM policy_token_uses WHERE tag = t_tag[i];
        IF COALESCE(u, 0) <> t_before[i] THEN
            RETURN NULL;
        END IF;
    END LOOP;
    INSERT INTO policy_quotas(rule, actor, win, used)
        SELECT * FROM unnest(q_rule, q_actor, q_win, q_used)
        ON CONFLICT (rule, actor) DO UPDATE SET win = excluded.win, used = excluded.used;
    UPDATE policy_approvals p SET body = n.body
        FROM unnest(a_id, a_body) AS n(id, body) WHERE p.id = n.id;
    INSERT INTO policy_token_uses(tag, used) SELECT * FROM unnest(t_tag, t_used)
        ON CONFLICT (tag) DO UPDATE SET used = excluded.used;
    UPDATE policy_state SET generation = generation + 1 RETURNING generation INTO after;
    RETURN ARRAY[before, after];
END
$$;
";

/// A policy store in a PostgreSQL database, shared by every machine that opens it.
///
/// ```no_run
/// use std::sync::Arc;
/// use environment_core::SystemClock;
/// use environment_policy::Policy;
/// use environment_postgres::{PgStoreConfig, PgPolicyStore};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let store = PgPolicyStore::connect("host=/run/postgresql user=env dbname=env", PgStoreConfig::default())?;
/// let policy = Policy::with_store(Box::new(store), Arc::new(SystemClock))?;
/// policy.add_member("agent:coder", "group:builders")?;
/// # Ok(()) }
/// ```
pub struct PgPolicyStore {
    session: Session,
}

impl std::fmt::Debug for PgPolicyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgPolicyStore").finish_non_exhaustive()
    }
}

impl PgPolicyStore {
    /// Connects with a libpq-style connection string (`host=… user=… dbname=…`, or a
    /// `postgresql://` URL) and brings the schema up to date.
    pub fn connect(params: &str, config: PgStoreConfig) -> Result<PgPolicyStore> {
        let address = crate::ServerAddress::parse(params)?;
        PgPolicyStore::open(address.config, config.reading(address.ca_file))
    }

    /// Opens the store on `server`, migrating its schema.
    pub fn open(server: postgres::Config, config: PgStoreConfig) -> Result<PgPolicyStore> {
        let session = Session::open(server, &config, COMPONENT, MIGRATIONS)?;
        Ok(PgPolicyStore { session })
    }

    fn call<T: Send>(
        &mut self,
        work: impl FnOnce(&mut Session) -> Result<T> + Send,
    ) -> std::result::Result<T, PortError> {
        self.session.call(work).map_err(PortError::from)
    }

    /// Runs a write on the state as it is once the state row is locked: `apply` says whether
    /// what it was made on still holds (then it wrote), and the version moves when `bump`.
    fn write(
        &mut self,
        bump: bool,
        apply: impl Fn(&mut Tx<'_, '_>, i64) -> Result<bool> + Send + Sync,
    ) -> std::result::Result<Written, PortError> {
        self.call(|s| {
            s.run(IsolationLevel::ReadCommitted, |tx| {
                let row = tx
                    .query_one(
                        "SELECT version, generation FROM policy_state FOR UPDATE",
                        &[],
                    )
                    .ctx("locking the policy")?;
                let (version, before): (i64, i64) = (row.get(0), row.get(1));
                if !apply(tx, version)? {
                    return Ok(Written::Stale);
                }
                let after: i64 = tx
                    .query_one(
                        "UPDATE policy_state SET generation = generation + 1,
                             version = version + $1::BIGINT
                         RETURNING generation",
                        &[&i64::from(bump)],
                    )
                    .ctx("recording a policy write")?
                    .get(0);
                Ok(Written::Done { before, after })
            })
        })
    }
}

fn count(n: i64, what: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| PgError::Schema(format!("{what} holds {n}, not a count")))
}

fn records(tx: &mut Tx<'_, '_>, sql: &'static str) -> Result<Vec<PolicyRecord>> {
    Ok(tx
        .query(sql, &[])
        .ctx("reading policy records")?
        .iter()
        .map(|r| PolicyRecord {
            id: r.get(0),
            body: r.get(1),
        })
        .collect())
}

fn load(tx: &mut Tx<'_, '_>, token_key: [u8; 32]) -> Result<(i64, PolicyRecords)> {
    let state = tx
        .query_one("SELECT version, generation, rules FROM policy_state", &[])
        .ctx("reading the policy")?;
    let version: i64 = state.get(0);
    let relations = tx
        .query("SELECT member, grp FROM policy_relations", &[])
        .ctx("reading relations")?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let quotas = tx
        .query("SELECT rule, actor, win, used FROM policy_quotas", &[])
        .ctx("reading quotas")?
        .iter()
        .map(|r| {
            Ok(QuotaCount {
                rule: r.get(0),
                actor: r.get(1),
                window: r.get(2),
                used: count(r.get(3), "a quota count")?,
            })
        })
        .collect::<Result<_>>()?;
    let token_uses = tx
        .query("SELECT tag, used FROM policy_token_uses", &[])
        .ctx("reading token uses")?
        .iter()
        .map(|r| Ok((r.get(0), count(r.get(1), "a token use count")?)))
        .collect::<Result<_>>()?;
    let records = PolicyRecords {
        version: u64::try_from(version)
            .map_err(|_| PgError::Schema(format!("the policy version is {version}")))?,
        rules: state.get(2),
        relations,
        delegations: records(tx, "SELECT id, body FROM policy_delegations ORDER BY seq")?,
        approvals: records(tx, "SELECT id, body FROM policy_approvals ORDER BY seq")?,
        quotas,
        token_uses,
        token_key,
    };
    Ok((state.get(1), records))
}

/// The token key: made by the first machine that finds none; every machine reads the one that
/// was written first.
fn token_key(s: &mut Session) -> Result<[u8; 32]> {
    let client = s.client()?;
    let fresh: [u8; 32] = rand::random();
    client
        .execute(
            "UPDATE policy_state SET token_key = $1 WHERE token_key IS NULL",
            &[&&fresh[..]],
        )
        .ctx("making the token key")?;
    let key: Vec<u8> = client
        .query_one("SELECT token_key FROM policy_state", &[])
        .ctx("reading the token key")?
        .get(0);
    <[u8; 32]>::try_from(key.as_slice())
        .map_err(|_| PgError::Schema("the token key is not 32 bytes".into()))
}

fn apply(tx: &mut Tx<'_, '_>, change: &PolicyChange) -> Result<()> {
    match change {
        PolicyChange::Rules(text) => tx
            .execute("UPDATE policy_state SET rules = $1", &[text])
            .map(drop),
        PolicyChange::AddRelations(pairs) => {
            for (m, g) in pairs {
                tx.execute(
                    "INSERT INTO policy_relations(member, grp) VALUES ($1, $2)
                     ON CONFLICT DO NOTHING",
                    &[m, g],
                )
                .ctx("adding a relation")?;
            }
            Ok(())
        }
        PolicyChange::RemoveRelation(m, g) => tx
            .execute(
                "DELETE FROM policy_relations WHERE member = $1 AND grp = $2",
                &[m, g],
            )
            .map(drop),
        PolicyChange::PutDelegation(d) => tx
            .execute(
                "INSERT INTO policy_delegations(id, body) VALUES ($1, $2)",
                &[&d.id, &d.body],
            )
            .map(drop),
        PolicyChange::DeleteDelegation(id) => tx
            .execute("DELETE FROM policy_delegations WHERE id = $1", &[id])
            .map(drop),
    }
    .ctx("changing the policy")
}

/// The arguments of `policy_spend`, each counter once (a spend that names one twice read it
/// once, so its copies agree).
#[derive(Default)]
struct SpendArgs {
    q_rule: Vec<String>,
    q_actor: Vec<String>,
    q_had: Vec<bool>,
    q_before_win: Vec<i64>,
    q_before_used: Vec<i64>,
    q_win: Vec<i64>,
    q_used: Vec<i64>,
    a_id: Vec<String>,
    a_before: Vec<String>,
    a_body: Vec<String>,
    t_tag: Vec<String>,
    t_before: Vec<i64>,
    t_used: Vec<i64>,
}

impl SpendArgs {
    fn of(uses: &Uses) -> SpendArgs {
        let mut a = SpendArgs::default();
        let mut seen = std::collections::HashSet::new();
        for (before, q) in &uses.quotas {
            if !seen.insert(("q", q.rule.as_str(), q.actor.as_str())) {
                continue;
            }
            a.q_rule.push(q.rule.clone());
            a.q_actor.push(q.actor.clone());
            a.q_had.push(before.is_some());
            a.q_before_win.push(before.as_ref().map_or(0, |b| b.window));
            a.q_before_used
                .push(before.as_ref().map_or(0, |b| i64::from(b.used)));
            a.q_win.push(q.window);
            a.q_used.push(i64::from(q.used));
        }
        for (before, r) in &uses.approvals {
            if !seen.insert(("a", r.id.as_str(), "")) {
                continue;
            }
            a.a_id.push(r.id.clone());
            a.a_before.push(before.clone());
            a.a_body.push(r.body.clone());
        }
        for (tag, before, used) in &uses.tokens {
            if !seen.insert(("t", tag.as_str(), "")) {
                continue;
            }
            a.t_tag.push(tag.clone());
            a.t_before.push(i64::from(*before));
            a.t_used.push(i64::from(*used));
        }
        a
    }
}

impl PolicyStore for PgPolicyStore {
    fn generation(&mut self) -> std::result::Result<i64, PortError> {
        self.call(|s| {
            let rows = s.read("SELECT generation FROM policy_state", &[])?;
            let row = rows
                .first()
                .ok_or_else(|| PgError::Schema("the policy has no state row".into()))?;
            Ok(row.get(0))
        })
    }

    fn load(&mut self) -> std::result::Result<(i64, PolicyRecords), PortError> {
        self.call(|s| {
            let key = token_key(s)?;
            s.run(IsolationLevel::RepeatableRead, |tx| load(tx, key))
        })
    }

    fn change(
        &mut self,
        expected: u64,
        change: &PolicyChange,
    ) -> std::result::Result<Written, PortError> {
        self.write(true, |tx, version| {
            if u64::try_from(version).ok() != Some(expected) {
                return Ok(false);
            }
            apply(tx, change)?;
            Ok(true)
        })
    }

    fn put_approval(
        &mut self,
        before: Option<&str>,
        record: &PolicyRecord,
    ) -> std::result::Result<Written, PortError> {
        self.write(false, |tx, _| {
            let changed = match before {
                None => tx.execute(
                    "INSERT INTO policy_approvals(id, body) VALUES ($1, $2) ON CONFLICT DO NOTHING",
                    &[&record.id, &record.body],
                ),
                Some(before) => tx.execute(
                    "UPDATE policy_approvals SET body = $2 WHERE id = $1 AND body = $3",
                    &[&record.id, &record.body, &before],
                ),
            }
            .ctx("recording an approval")?;
            Ok(changed == 1)
        })
    }

    fn spend(&mut self, uses: &Uses) -> std::result::Result<Written, PortError> {
        let a = SpendArgs::of(uses);
        self.call(|s| {
            let rows = s.write(
                "SELECT policy_spend($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
                &[
                    &a.q_rule,
                    &a.q_actor,
                    &a.q_had,
                    &a.q_before_win,
                    &a.q_before_used,
                    &a.q_win,
                    &a.q_used,
                    &a.a_id,
                    &a.a_before,
                    &a.a_body,
                    &a.t_tag,
                    &a.t_before,
                    &a.t_used,
                ],
            )?;
            let done: Option<Vec<i64>> = rows.first().and_then(|r| r.get(0));
            Ok(match done.as_deref() {
                Some(&[before, after]) => Written::Done { before, after },
                _ => Written::Stale,
            })
        })
    }
}
