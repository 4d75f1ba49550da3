//! Leases: claim, the settlements of a receipt, dead letters and redrive.

use rand::Rng;
use rusqlite::{OptionalExtension, params};

use super::publish::key_busy;
use super::{Ctx, Settle, group_row, message_from};
use crate::error::{BusError, Result, SqlContext};
use crate::rules;
use crate::schema::{ACKED, CAUSE_MAX_ATTEMPTS, CAUSE_TERMINATED, DEAD, LEASED, READY, WAITING};
use crate::types::{Lease, Message, MessageId, Receipt};

/// After the head of (group, key) finished, the oldest waiting message of the key takes its
/// place — that is what keeps same-key messages in publish order and never leased twice.
fn promote_next(ctx: &mut Ctx<'_>, group_id: i64, key: Option<&str>) -> Result<()> {
    let Some(key) = key else { return Ok(()) };
    let next: Option<(i64, i64)> = ctx
        .conn
        .prepare_cached(
            "SELECT id, visible_at FROM bus_deliveries
             WHERE group_id = ?1 AND okey = ?2 AND state < 3 AND state = 2
             ORDER BY id LIMIT 1",
        )
        .and_then(|mut s| {
            s.query_row(params![group_id, key], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .ctx("finding the next message of a key")?;
    if let Some((id, visible_at)) = next {
        ctx.conn
            .prepare_cached("UPDATE bus_deliveries SET state = ?2, due = ?3 WHERE id = ?1")
            .and_then(|mut s| s.execute(params![id, READY, visible_at]))
            .ctx("promoting the next message of a key")?;
        ctx.wake.push(group_id);
    }
    Ok(())
}

fn kill(
    ctx: &mut Ctx<'_>,
    delivery: i64,
    group_id: i64,
    key: Option<&str>,
    cause: i64,
    error: Option<&str>,
) -> Result<()> {
    ctx.conn
        .prepare_cached(
            "UPDATE bus_deliveries SET state = ?2, due = NULL, lease_until = NULL,
             dead_cause = ?3, last_error = COALESCE(?4, last_error), finished_at = ?5
             WHERE id = ?1",
        )
        .and_then(|mut s| s.execute(params![delivery, DEAD, cause, error, ctx.now]))
        .ctx("dead-lettering a delivery")?;
    promote_next(ctx, group_id, key)
}

/// What a claim found, and when the group's next message becomes claimable (so a waiting
/// consumer knows how long it may sleep).
pub(crate) struct Claimed {
    pub leases: Vec<Lease>,
    pub next_due: Option<i64>,
}

pub(crate) fn claim(
    ctx: &mut Ctx<'_>,
    group: &str,
    consumer: &str,
    max: u32,
    lease_ms: i64,
) -> Result<Claimed> {
    let (gid, max_attempts) = ctx.names.group(ctx.conn, group)?;
    let now = ctx.now;
    let lease_until = now.saturating_add(lease_ms);
    let mut leases = Vec::new();
    loop {
        let want = i64::from(max) - leases.len() as i64;
        // Expired leases have `due = lease_until + 1 <= now`: expiry is read from the data here,
        // at claim time, so no rescuer thread has to be alive for messages to come back.
        // The message is read with its delivery: one statement per claimed message fewer.
        let rows: Vec<(i64, i64, u32, Option<String>, Message)> = ctx
            .conn
            .prepare_cached(concat!(
                "SELECT d.id, d.state, d.attempts, d.okey, ",
                message_cols!(),
                " FROM bus_deliveries d JOIN bus_messages m ON m.id = d.msg_id
                 JOIN bus_topics t ON t.id = m.topic_id
                 WHERE d.group_id = ?1 AND d.due IS NOT NULL AND d.due <= ?2
                 ORDER BY d.due, d.id"
            ))
            .and_then(|mut s| {
                // No `LIMIT ?`: a bound LIMIT makes SQLite re-plan the statement on every
                // execution (the plan may depend on it), which cost a tenth of the writer's
                // time. The index delivers rows in order, so stepping stops after `want`.
                s.query_map(params![gid, now], |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        message_from(r, 4)?,
                    ))
                })?
                .take(usize::try_from(want).unwrap_or(0))
                .collect()
            })
            .ctx("finding claimable messages")?;
        if rows.is_empty() {
            break;
        }
        let mut died = false;
        for (id, state, attempts, okey, message) in rows {
            if attempts >= max_attempts {
                // Its last attempt's lease ran out (a nack at the limit dead-letters at once).
                let why = (state == LEASED).then_some("lease expired");
                kill(ctx, id, gid, okey.as_deref(), CAUSE_MAX_ATTEMPTS, why)?;
                died = true;
                continue;
            }
            let token: i64 = ctx.rng.random();
            let attempt = attempts + 1;
            ctx.conn
                .prepare_cached(
                    "UPDATE bus_deliveries SET state = ?2, due = ?3, lease_until = ?4, token = ?5,
                     consumer = ?6, attempts = ?7 WHERE id = ?1",
                )
                .and_then(|mut s| {
                    s.execute(params![
                        id,
                        LEASED,
                        lease_until.saturating_add(1),
                        lease_until,
                        token,
                        consumer,
                        attempt
                    ])
                })
                .ctx("leasing a message")?;
            leases.push(Lease {
                receipt: Receipt {
                    delivery: id,
                    token,
                },
                group: group.to_owned(),
                message,
                attempt,
                lease_until_ms: lease_until,
            });
        }
        if !died || leases.len() >= max as usize {
            break;
        }
    }
    let next_due = if leases.len() < max as usize {
        ctx.conn
            .prepare_cached(
                "SELECT MIN(due) FROM bus_deliveries WHERE group_id = ?1 AND due IS NOT NULL",
            )
            .and_then(|mut s| s.query_row([gid], |r| r.get(0)))
            .ctx("finding the next due message")?
    } else {
        None
    };
    Ok(Claimed { leases, next_due })
}

/// group, state, token, attempts, ordering key, consumer.
type DeliveryRow = (i64, i64, Option<i64>, u32, Option<String>, Option<String>);

/// The delivery a receipt leases: (group, attempts, ordering key), or why the receipt is
/// refused; with `by`, it must be the consumer holding the lease.
fn leased_row(
    ctx: &Ctx<'_>,
    receipt: &Receipt,
    by: Option<&str>,
) -> Result<(i64, u32, Option<String>)> {
    let row: Option<DeliveryRow> = ctx
        .conn
        .prepare_cached(
            "SELECT group_id, state, token, attempts, okey, consumer FROM bus_deliveries \
             WHERE id = ?1",
        )
        .and_then(|mut s| {
            s.query_row([receipt.delivery], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })
            .optional()
        })
        .ctx("reading a delivery")?;
    let (gid, _, _, attempts, okey, holder) = rules::leased(receipt, row, |r| (r.1, r.2))?;
    if let Some(by) = by
        && holder.as_deref() != Some(by)
    {
        return Err(BusError::NotYourReceipt {
            receipt: *receipt,
            consumer: by.to_owned(),
        });
    }
    Ok((gid, attempts, okey))
}

/// The hot settlement in one statement: the update itself checks the receipt, and only a
/// refusal (which wrote nothing) reads the row to say why.
fn ack(ctx: &mut Ctx<'_>, receipt: &Receipt, by: Option<&str>) -> Result<i64> {
    let acked: Option<(i64, Option<String>)> = ctx
        .conn
        .prepare_cached(
            "UPDATE bus_deliveries SET state = ?4, due = NULL, lease_until = NULL,
             finished_at = ?5 WHERE id = ?1 AND state = ?2 AND token = ?3
             AND (?6 IS NULL OR consumer = ?6)
             RETURNING group_id, okey",
        )
        .and_then(|mut s| {
            s.query_row(
                params![receipt.delivery, LEASED, receipt.token, ACKED, ctx.now, by],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
        })
        .ctx("acking a delivery")?;
    match acked {
        Some((gid, okey)) => promote_next(ctx, gid, okey.as_deref()).map(|()| gid),
        None => leased_row(ctx, receipt, by).and_then(|_| {
            Err(BusError::Corrupt {
                detail: format!("receipt {receipt} is current but its ack changed nothing"),
            })
        }),
    }
}

/// Acks the delivery `receipt` names, as `consumer` (who claimed it), and leases up to `max`
/// further messages of `group`, its group, to the same consumer: a worker's whole cycle in one
/// command. A receipt of another group is refused, and (the command's savepoint undone)
/// nothing is acked.
pub(crate) fn ack_and_claim(
    ctx: &mut Ctx<'_>,
    receipt: &Receipt,
    consumer: &str,
    group: &str,
    max: u32,
    lease_ms: i64,
) -> Result<Claimed> {
    let (gid, _) = ctx.names.group(ctx.conn, group)?;
    if ack(ctx, receipt, Some(consumer))? != gid {
        return Err(BusError::OtherGroup {
            receipt: *receipt,
            group: group.to_owned(),
        });
    }
    claim(ctx, group, consumer, max, lease_ms)
}

/// Settles the delivery a receipt names; with `by`, only as the consumer that claimed it.
pub(crate) fn settle(
    ctx: &mut Ctx<'_>,
    receipt: &Receipt,
    action: &Settle,
    by: Option<&str>,
) -> Result<()> {
    if let Settle::Ack = action {
        return ack(ctx, receipt, by).map(drop);
    }
    let (gid, attempts, okey) = leased_row(ctx, receipt, by)?;
    let now = ctx.now;
    let id = receipt.delivery;
    match action {
        Settle::Ack => return ack(ctx, receipt, by).map(drop),
        Settle::Nack { delay_ms, error } => {
            let max_attempts: u32 = ctx
                .conn
                .prepare_cached("SELECT max_attempts FROM bus_groups WHERE id = ?1")
                .and_then(|mut s| s.query_row([gid], |r| r.get(0)))
                .ctx("reading a group's max_attempts")?;
            if attempts >= max_attempts {
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
                ctx.conn
                    .prepare_cached(
                        "UPDATE bus_deliveries SET state = ?2, due = ?3, lease_until = NULL,
                         last_error = COALESCE(?4, last_error) WHERE id = ?1",
                    )
                    .and_then(|mut s| {
                        s.execute(params![id, READY, now.saturating_add(delay), error])
                    })
                    .ctx("nacking a delivery")?;
                ctx.wake.push(gid);
            }
        }
        Settle::Extend { lease_ms } => {
            let until = now.saturating_add(*lease_ms);
            ctx.conn
                .prepare_cached(
                    "UPDATE bus_deliveries SET lease_until = ?2, due = ?3 WHERE id = ?1",
                )
                .and_then(|mut s| s.execute(params![id, until, until.saturating_add(1)]))
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

/// Puts dead letters of a group back in line with fresh attempts; `only` limits it to one
/// message. Returns how many were redriven.
pub(crate) fn redrive(ctx: &mut Ctx<'_>, group: &str, only: Option<MessageId>) -> Result<u64> {
    let (gid, _) = group_row(ctx.conn, group)?;
    let rows: Vec<(i64, Option<String>, i64)> = ctx
        .conn
        .prepare_cached(
            "SELECT id, okey, visible_at FROM bus_deliveries
             WHERE group_id = ?1 AND state = 4 AND (?2 IS NULL OR msg_id = ?2) ORDER BY id",
        )
        .and_then(|mut s| {
            s.query_map(params![gid, only.map(|m| m.0)], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })?
            .collect()
        })
        .ctx("listing dead letters to redrive")?;
    if let Some(m) = only
        && rows.is_empty()
    {
        return Err(BusError::NoSuchDeadLetter {
            group: group.to_owned(),
            message: m.0,
        });
    }
    let n = rows.len() as u64;
    for (id, okey, _) in rows {
        let waiting = match &okey {
            Some(k) => key_busy(ctx.conn, gid, k)?,
            None => false,
        };
        let (state, due) = if waiting {
            (WAITING, None)
        } else {
            (READY, Some(ctx.now))
        };
        ctx.conn
            .prepare_cached(
                "UPDATE bus_deliveries SET state = ?2, due = ?3, attempts = 0, dead_cause = NULL,
                 finished_at = NULL, token = NULL, consumer = NULL WHERE id = ?1",
            )
            .and_then(|mut s| s.execute(params![id, state, due]))
            .ctx("redriving a dead letter")?;
    }
    for _ in 0..n.min(64) {
        ctx.wake.push(gid);
    }
    Ok(n)
}
