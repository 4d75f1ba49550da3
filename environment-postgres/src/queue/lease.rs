//! Leases: claim, the settlements of a receipt, dead letters and redrive. A claim locks the
//! rows it takes with `FOR UPDATE SKIP LOCKED`, so claims of several machines take different
//! messages without waiting on each other; a settlement's update checks the receipt itself.

use environment_bus::rules::Settle;
use environment_bus::{BusError, Receipt, rules};
use environment_core::queue::{Lease, Message};
use postgres::Row;
use rand::Rng;

use super::Ctx;
use super::publish::{arrival, lock_key, topic_id};
use super::schema::{ACKED, CAUSE_MAX_ATTEMPTS, CAUSE_TERMINATED, DEAD, LEASED, READY, WAITING};
use super::session::Session;
use crate::error::{PgContext, Result};
use crate::statements::Statements;

/// The columns [`message`] reads, from `m` (messages) and `t` (topics).
macro_rules! message_cols {
    () => {
        "m.id, t.name, m.payload, m.okey, m.correlation_id, m.actor"
    };
}
pub(crate) use message_cols;

/// The message whose columns start at `at` (see [`message_cols`]).
pub(crate) fn message(r: &Row, at: usize) -> Message {
    Message {
        id: r.get(at),
        topic: r.get(at + 1),
        payload: r.get(at + 2),
        ordering_key: r.get(at + 3),
        correlation_id: r.get(at + 4),
        publisher: r.get(at + 5),
    }
}

/// (id, max attempts) of a group.
pub(crate) fn group_row(ctx: &mut Ctx<'_, '_>, group: &str) -> Result<(i64, u32)> {
    let row = ctx
        .query_opt(
            "SELECT id, max_attempts FROM bus_groups WHERE name = $1",
            &[&group],
        )
        .ctx("looking up a group")?
        .ok_or_else(|| BusError::UnknownGroup {
            group: group.to_owned(),
        })?;
    Ok((row.get(0), u32::try_from(row.get::<_, i32>(1)).unwrap_or(1)))
}

/// After the head of (group, key) finished, the oldest waiting message of the key takes its
/// place: what keeps one key's messages in publish order and never leased twice.
fn promote_next(ctx: &mut Ctx<'_, '_>, group_id: i64, key: Option<&str>) -> Result<()> {
    let Some(key) = key else { return Ok(()) };
    lock_key(ctx, group_id, key)?;
    if key_busy_active(ctx, group_id, key)? {
        return Ok(());
    }
    let promoted = ctx
        .execute(
            "UPDATE bus_deliveries SET state = $3, due = visible_at WHERE id = (
                SELECT id FROM bus_deliveries
                WHERE group_id = $1 AND okey = $2 AND state = $4 ORDER BY id LIMIT 1)",
            &[&group_id, &key, &READY, &WAITING],
        )
        .ctx("promoting the next message of a key")?;
    if promoted > 0 {
        ctx.wake.push(group_id);
    }
    Ok(())
}

/// Whether (group, key) has a ready or leased delivery (its head).
fn key_busy_active(ctx: &mut Ctx<'_, '_>, group_id: i64, key: &str) -> Result<bool> {
    ctx.query_opt(
        "SELECT 1 FROM bus_deliveries WHERE group_id = $1 AND okey = $2 AND state IN (0, 1)
             LIMIT 1",
        &[&group_id, &key],
    )
    .ctx("checking a key's head")
    .map(|r| r.is_some())
}

fn kill(
    ctx: &mut Ctx<'_, '_>,
    delivery: i64,
    group_id: i64,
    key: Option<&str>,
    cause: i16,
    error: Option<&str>,
) -> Result<()> {
    let now = ctx.now;
    ctx.execute(
        "UPDATE bus_deliveries SET state = $2, due = NULL, lease_until = NULL,
             dead_cause = $3, last_error = COALESCE($4, last_error), finished_at = $5
             WHERE id = $1",
        &[&delivery, &DEAD, &cause, &error, &now],
    )
    .ctx("dead-lettering a delivery")?;
    promote_next(ctx, group_id, key)
}

/// [`claim`] in one statement, when no claimable row of the group has used up its attempts;
/// `None` when one has or the group is unknown (and nothing changed): the transaction of
/// [`claim`] then dead-letters it or says the group is unknown.
pub(crate) fn claim_plain(
    s: &mut Session,
    rng: &mut impl Rng,
    group: &str,
    consumer: &str,
    max: u32,
    lease_ms: i64,
    now: i64,
) -> Result<Option<Vec<Lease>>> {
    claim_plain_after(s, rng, None, group, consumer, max, lease_ms, now)
}

/// [`ack_and_claim`] in one statement, when `receipt` is current, held by `consumer`, of
/// `group`, for a message without ordering key (nothing waits behind it), and [`claim_plain`]
/// applies; `None` when not (and nothing changed): the transaction of [`ack_and_claim`] then
/// acks a keyed message, dead-letters a spent one, or says why it refuses.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ack_and_claim_plain(
    s: &mut Session,
    rng: &mut impl Rng,
    receipt: &Receipt,
    group: &str,
    consumer: &str,
    max: u32,
    lease_ms: i64,
    now: i64,
) -> Result<Option<Vec<Lease>>> {
    claim_plain_after(s, rng, Some(receipt), group, consumer, max, lease_ms, now)
}

/// The statement of [`claim_plain`], or of [`ack_and_claim_plain`] with the ack of `$8`/`$9`
/// first: each part writes only if every other can (a claimable row that used up its
/// attempts, or an ack refused, and nothing is written), and the acked row is never the one
/// claimed, so no row is updated twice by one statement.
macro_rules! claim_plain_sql {
    ($ack:literal, $claimed_if:literal, $refused_if:literal) => {
        concat!(
            "WITH g AS (SELECT id, max_attempts FROM bus_groups WHERE name = $1),
             c AS (SELECT d.id, d.attempts, d.due FROM bus_deliveries d JOIN g ON d.group_id = g.id
                   WHERE d.due IS NOT NULL AND d.due <= $2 AND d.id <> $8
                   ORDER BY d.due, d.id LIMIT $3 FOR UPDATE OF d SKIP LOCKED),
             n AS (SELECT id, row_number() OVER (ORDER BY due, id) AS k FROM c),
             spent AS (SELECT 1 FROM c, g WHERE c.attempts >= g.max_attempts),",
            $ack,
            "u AS (UPDATE bus_deliveries d SET state = $4, due = $5::BIGINT + 1, lease_until = $5,
                     token = ($6::BIGINT[])[n.k], consumer = $7, attempts = d.attempts + 1
                   FROM n WHERE d.id = n.id AND NOT EXISTS (SELECT 1 FROM spent)",
            $claimed_if,
            " RETURNING d.id, d.token, d.attempts, d.msg_id, n.k)
             SELECT FALSE, u.id, u.token, u.attempts, ",
            message_cols!(),
            ", u.k FROM u JOIN bus_messages m ON m.id = u.msg_id
             JOIN bus_topics t ON t.id = m.topic_id
             UNION ALL
             SELECT TRUE, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
             WHERE EXISTS (SELECT 1 FROM spent) OR NOT EXISTS (SELECT 1 FROM g)",
            $refused_if
        )
    };
}

#[allow(clippy::too_many_arguments)]
fn claim_plain_after(
    s: &mut Session,
    rng: &mut impl Rng,
    ack: Option<&Receipt>,
    group: &str,
    consumer: &str,
    max: u32,
    lease_ms: i64,
    now: i64,
) -> Result<Option<Vec<Lease>>> {
    let lease_until = now.saturating_add(lease_ms);
    let tokens: Vec<i64> = (0..max).map(|_| rng.random()).collect();
    // No delivery has id 0: the claim alone excludes nothing.
    let (acked_id, acked_token) = ack.map_or((0, 0), |r| (r.delivery(), r.token()));
    let (sql, what) = match ack {
        None => (claim_plain_sql!("", "", ""), "claiming messages"),
        Some(_) => (
            claim_plain_sql!(
                "a AS (UPDATE bus_deliveries d SET state = $10, due = NULL, lease_until = NULL,
                         finished_at = $2
                       FROM g WHERE d.id = $8 AND d.token = $9 AND d.state = $4
                         AND d.consumer = $7 AND d.okey IS NULL AND d.group_id = g.id
                         AND NOT EXISTS (SELECT 1 FROM spent)
                       RETURNING d.id),",
                " AND EXISTS (SELECT 1 FROM a)",
                " OR NOT EXISTS (SELECT 1 FROM a)"
            ),
            "acking a delivery and claiming messages",
        ),
    };
    let params: [&(dyn postgres::types::ToSql + Sync); 10] = [
        &group,
        &now,
        &i64::from(max),
        &LEASED,
        &lease_until,
        &tokens,
        &consumer,
        &acked_id,
        &acked_token,
        &ACKED,
    ];
    // The claim alone names only the parameters it uses.
    let used = if ack.is_some() { 10 } else { 8 };
    let rows = s.query(sql, &params[..used]).ctx(what)?;
    if rows.iter().any(|r| r.get::<_, bool>(0)) {
        return Ok(None);
    }
    let mut leases: Vec<(i64, Lease)> = rows
        .iter()
        .map(|r| {
            let (id, token, attempt): (i64, i64, i32) = (r.get(1), r.get(2), r.get(3));
            let lease = Lease {
                receipt: Receipt::new(id, token).to_string(),
                group: group.to_owned(),
                message: message(r, 4),
                attempt: u32::try_from(attempt).unwrap_or(0),
                lease_until_ms: lease_until,
            };
            (r.get(10), lease)
        })
        .collect();
    // Oldest due first, as the claim found them.
    leases.sort_by_key(|(k, _)| *k);
    Ok(Some(leases.into_iter().map(|(_, l)| l).collect()))
}

/// Leases up to `max` claimable messages of `group` to `consumer` until `now + lease_ms`.
/// A row whose last attempt's lease ran out is dead-lettered instead, and the claim goes on.
pub(crate) fn claim(
    ctx: &mut Ctx<'_, '_>,
    group: &str,
    consumer: &str,
    max: u32,
    lease_ms: i64,
) -> Result<Vec<Lease>> {
    let (gid, max_attempts) = group_row(ctx, group)?;
    let now = ctx.now;
    let lease_until = now.saturating_add(lease_ms);
    let mut leases = Vec::new();
    loop {
        let want = i64::from(max) - leases.len() as i64;
        let rows = ctx
            .query(
                concat!(
                    "SELECT d.id, d.state, d.attempts, d.okey, ",
                    message_cols!(),
                    " FROM bus_deliveries d JOIN bus_messages m ON m.id = d.msg_id
                     JOIN bus_topics t ON t.id = m.topic_id
                     WHERE d.group_id = $1 AND d.due IS NOT NULL AND d.due <= $2
                     ORDER BY d.due, d.id LIMIT $3 FOR UPDATE OF d SKIP LOCKED"
                ),
                &[&gid, &now, &want],
            )
            .ctx("finding claimable messages")?;
        if rows.is_empty() {
            break;
        }
        let mut died = false;
        for r in rows {
            let (id, state, attempts, okey): (i64, i16, i32, Option<String>) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            let attempts = u32::try_from(attempts).unwrap_or(0);
            if attempts >= max_attempts {
                // Its last attempt's lease ran out (a nack at the limit dead-letters at once).
                let why = (state == LEASED).then_some("lease expired");
                kill(ctx, id, gid, okey.as_deref(), CAUSE_MAX_ATTEMPTS, why)?;
                died = true;
                continue;
            }
            let token: i64 = ctx.rng.random();
            let attempt = attempts + 1;
            ctx.execute(
                "UPDATE bus_deliveries SET state = $2, due = $3, lease_until = $4,
                     token = $5, consumer = $6, attempts = $7 WHERE id = $1",
                &[
                    &id,
                    &LEASED,
                    &lease_until.saturating_add(1),
                    &lease_until,
                    &token,
                    &consumer,
                    &i32::try_from(attempt).unwrap_or(i32::MAX),
                ],
            )
            .ctx("leasing a message")?;
            leases.push(Lease {
                receipt: Receipt::new(id, token).to_string(),
                group: group.to_owned(),
                message: message(&r, 4),
                attempt,
                lease_until_ms: lease_until,
            });
        }
        if !died || leases.len() >= max as usize {
            break;
        }
    }
    Ok(leases)
}

/// The delivery a receipt leases: (group, attempts, ordering key), or why the receipt is
/// refused; with `by`, it must be the consumer holding the lease.
fn leased_row(
    ctx: &mut Ctx<'_, '_>,
    receipt: &Receipt,
    by: Option<&str>,
) -> Result<(i64, u32, Option<String>)> {
    let row = ctx
        .query_opt(
            "SELECT group_id, state, token, attempts, okey, consumer FROM bus_deliveries \
             WHERE id = $1 FOR UPDATE",
            &[&receipt.delivery()],
        )
        .ctx("reading a delivery")?;
    let row = rules::leased(receipt, row, |r| (i64::from(r.get::<_, i16>(1)), r.get(2)))?;
    let holder: Option<String> = row.get(5);
    if let Some(by) = by
        && holder.as_deref() != Some(by)
    {
        return Err(BusError::NotYourReceipt {
            receipt: *receipt,
            consumer: by.to_owned(),
        }
        .into());
    }
    let attempts = u32::try_from(row.get::<_, i32>(3)).unwrap_or(0);
    Ok((row.get(0), attempts, row.get(4)))
}

/// Acks in one statement that checks the receipt itself; only a refusal reads the row to say
/// why. Returns the delivery's group.
fn ack(ctx: &mut Ctx<'_, '_>, receipt: &Receipt, by: Option<&str>) -> Result<i64> {
    let now = ctx.now;
    let acked = ctx
        .query_opt(
            "UPDATE bus_deliveries SET state = $4, due = NULL, lease_until = NULL,
             finished_at = $5 WHERE id = $1 AND state = $2 AND token = $3
             AND ($6::TEXT IS NULL OR consumer = $6)
             RETURNING group_id, okey",
            &[
                &receipt.delivery(),
                &LEASED,
                &receipt.token(),
                &ACKED,
                &now,
                &by,
            ],
        )
        .ctx("acking a delivery")?;
    match acked {
        Some(row) => {
            let (gid, okey): (i64, Option<String>) = (row.get(0), row.get(1));
            promote_next(ctx, gid, okey.as_deref()).map(|()| gid)
        }
        None => {
            leased_row(ctx, receipt, by)?;
            Err(crate::PgError::Schema(format!(
                "receipt {receipt} is current but its ack changed nothing"
            )))
        }
    }
}

/// Acks, in one statement, a current receipt held by `by` whose message has no ordering key
/// (nothing waits behind it); `false` when that is not the case and nothing changed (the
/// transaction of [`settle`] then acks a keyed message or says why it refuses).
pub(crate) fn ack_plain(s: &mut Session, receipt: &Receipt, by: &str, now: i64) -> Result<bool> {
    Ok(!ack_plain_many(s, &[*receipt], by, now)?.is_empty())
}

/// [`ack_plain`] of many receipts in one statement; returns the receipts it acked.
pub(crate) fn ack_plain_many(
    s: &mut impl Statements,
    receipts: &[Receipt],
    by: &str,
    now: i64,
) -> Result<Vec<Receipt>> {
    let ids: Vec<i64> = receipts.iter().map(Receipt::delivery).collect();
    let tokens: Vec<i64> = receipts.iter().map(Receipt::token).collect();
    let rows = s
        .query(
            "UPDATE bus_deliveries d SET state = $4, due = NULL, lease_until = NULL,
             finished_at = $5 FROM unnest($1::BIGINT[], $3::BIGINT[]) AS r(id, token)
             WHERE d.id = r.id AND d.token = r.token AND d.state = $2 AND d.consumer = $6
             AND d.okey IS NULL RETURNING d.id, r.token",
            &[&ids, &LEASED, &tokens, &ACKED, &now, &by],
        )
        .ctx("acking deliveries")?;
    Ok(rows
        .iter()
        .map(|r| Receipt::new(r.get(0), r.get(1)))
        .collect())
}

/// Acks `receipt` as `consumer` and leases up to `max` further messages of `group`, the
/// receipt's own: a worker's cycle in one transaction. A receipt of another group is refused,
/// and (the transaction rolled back) nothing is acked.
pub(crate) fn ack_and_claim(
    ctx: &mut Ctx<'_, '_>,
    receipt: &Receipt,
    consumer: &str,
    group: &str,
    max: u32,
    lease_ms: i64,
) -> Result<Vec<Lease>> {
    let (gid, _) = group_row(ctx, group)?;
    if ack(ctx, receipt, Some(consumer))? != gid {
        return Err(BusError::OtherGroup {
            receipt: *receipt,
            group: group.to_owned(),
        }
        .into());
    }
    claim(ctx, group, consumer, max, lease_ms)
}

/// Settles the delivery a receipt names; with `by`, only as the consumer that claimed it.
pub(crate) fn settle(
    ctx: &mut Ctx<'_, '_>,
    receipt: &Receipt,
    action: &Settle,
    by: Option<&str>,
) -> Result<()> {
    if let Settle::Ack = action {
        return ack(ctx, receipt, by).map(drop);
    }
    // Locked: a concurrent settlement of the same receipt waits, then finds it stale.
    let (gid, attempts, okey) = leased_row(ctx, receipt, by)?;
    let now = ctx.now;
    let id = receipt.delivery();
    match action {
        Settle::Ack => return ack(ctx, receipt, by).map(drop),
        Settle::Nack { delay_ms, error } => {
            let max_attempts: i32 = ctx
                .query_one("SELECT max_attempts FROM bus_groups WHERE id = $1", &[&gid])
                .ctx("reading a group's max_attempts")?
                .get(0);
            if i64::from(attempts) >= i64::from(max_attempts) {
                let err = error.as_deref().or(Some("nacked"));
                kill(ctx, id, gid, okey.as_deref(), CAUSE_MAX_ATTEMPTS, err)?;
            } else {
                let delay = match delay_ms {
                    Some(d) => *d,
                    None => {
                        let (lo, hi) = ctx.backoff.bounds_ms(attempts);
                        ctx.rng.random_range(lo..=hi)
                    }
                };
                ctx.execute(
                    "UPDATE bus_deliveries SET state = $2, due = $3, lease_until = NULL,
                         last_error = COALESCE($4, last_error) WHERE id = $1",
                    &[&id, &READY, &now.saturating_add(delay), error],
                )
                .ctx("nacking a delivery")?;
                ctx.wake.push(gid);
            }
        }
        Settle::Extend { lease_ms } => {
            let until = now.saturating_add(*lease_ms);
            ctx.execute(
                "UPDATE bus_deliveries SET lease_until = $2, due = $3 WHERE id = $1",
                &[&id, &until, &until.saturating_add(1)],
            )
            .ctx("extending a lease")?;
        }
        Settle::Terminate { reason } => {
            kill(
                ctx,
                id,
                gid,
                okey.as_deref(),
                CAUSE_TERMINATED,
                Some(reason),
            )?;
        }
    }
    Ok(())
}

/// Puts a group's dead letters back in line with fresh attempts; returns how many.
pub(crate) fn redrive(ctx: &mut Ctx<'_, '_>, group: &str) -> Result<u64> {
    let (gid, _) = group_row(ctx, group)?;
    let rows: Vec<(i64, Option<String>)> = ctx
        .query(
            "SELECT id, okey FROM bus_deliveries WHERE group_id = $1 AND state = $2 ORDER BY id
             FOR UPDATE",
            &[&gid, &DEAD],
        )
        .ctx("listing dead letters to redrive")?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let now = ctx.now;
    for (id, okey) in &rows {
        let (state, due) = arrival(ctx, gid, okey.as_deref(), now)?;
        ctx.execute(
            "UPDATE bus_deliveries SET state = $2, due = $3, attempts = 0, dead_cause = NULL,
                 finished_at = NULL, token = NULL, consumer = NULL WHERE id = $1",
            &[id, &state, &due],
        )
        .ctx("redriving a dead letter")?;
    }
    if !rows.is_empty() {
        ctx.wake.push(gid);
    }
    Ok(rows.len() as u64)
}

/// Creates `group` with `max_attempts` or finds it with the same, and subscribes it to
/// `topics` (created when new).
pub(crate) fn create_group(
    ctx: &mut Ctx<'_, '_>,
    group: &str,
    topics: &[&str],
    max_attempts: u32,
) -> Result<()> {
    let mut topic_ids = Vec::with_capacity(topics.len());
    for t in topics {
        topic_ids.push(topic_id(ctx, t)?);
    }
    let requested = i32::try_from(max_attempts).unwrap_or(i32::MAX);
    // A group created by another machine meanwhile is found by the lookup that follows.
    ctx.execute(
        "INSERT INTO bus_groups(name, max_attempts) VALUES ($1, $2)
             ON CONFLICT (name) DO NOTHING",
        &[&group, &requested],
    )
    .ctx("creating a group")?;
    let (gid, existing) = group_row(ctx, group)?;
    if existing != max_attempts {
        return Err(BusError::GroupConflict {
            group: group.to_owned(),
            existing,
            requested: max_attempts,
        }
        .into());
    }
    for tid in topic_ids {
        ctx.execute(
            "INSERT INTO bus_subscriptions(topic_id, group_id) VALUES ($1, $2)
                 ON CONFLICT DO NOTHING",
            &[&tid, &gid],
        )
        .ctx("subscribing a group")?;
    }
    Ok(())
}

/// When `group`'s next message falls due (a delay, a backoff or a lease running out).
pub(crate) fn next_due(ctx: &mut Ctx<'_, '_>, group: &str) -> Result<Option<i64>> {
    let (gid, _) = group_row(ctx, group)?;
    ctx.query_one(
        "SELECT MIN(due) FROM bus_deliveries WHERE group_id = $1 AND due IS NOT NULL",
        &[&gid],
    )
    .ctx("reading when a message falls due")
    .map(|r| r.get(0))
}
