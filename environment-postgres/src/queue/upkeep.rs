//! Retention: acked deliveries go some time after their ack, then their messages, and dedup
//! ids once their window has passed, in bounded steps.

use std::sync::atomic::{AtomicI64, Ordering};

use environment_bus::PurgeReport;

use super::Ctx;
use super::schema::ACKED;
use crate::error::{PgContext, Result};
use crate::statements::Statements;

/// What a purge step does when another machine's purge step holds the turn.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Waits for it.
    Wait,
    /// Does nothing: that machine is purging.
    Skip,
}

/// One step of the purge sweep: of at most `chunk` messages after `cursor`, removes the
/// deliveries acked before `cutoff`, then each message older than `cutoff` with no delivery
/// left (all purged, or no subscriber). Returns what went and whether the sweep reached the
/// end (the cursor then starts over); `None` if the step skipped its turn. The steps of the
/// machines sharing the queue take turns on a lock of the queue's schema.
pub(crate) fn purge_step(
    ctx: &mut Ctx<'_, '_>,
    turn: Turn,
    cutoff: i64,
    chunk: i64,
    cursor: &AtomicI64,
) -> Result<Option<(PurgeReport, bool)>> {
    let took: bool = match turn {
        Turn::Wait => ctx
            .execute(
                "SELECT pg_advisory_xact_lock(hashtextextended(current_schema() || '.bus_purge', 0))",
                &[],
            )
            .map(|_| true),
        Turn::Skip => ctx
            .query_one(
                "SELECT pg_try_advisory_xact_lock(hashtextextended(current_schema() || '.bus_purge', 0))",
                &[],
            )
            .map(|r| r.get(0)),
    }
    .ctx("taking the purge's turn")?;
    if !took {
        return Ok(None);
    }
    let from = cursor.load(Ordering::Relaxed);
    let row = ctx
        .query_one(
            "WITH seen AS (SELECT id FROM bus_messages WHERE id > $1 ORDER BY id LIMIT $2),
             gone AS (DELETE FROM bus_deliveries WHERE msg_id IN (SELECT id FROM seen)
                      AND state = $3 AND finished_at < $4 RETURNING 1)
             SELECT (SELECT COUNT(*) FROM seen), (SELECT MAX(id) FROM seen),
                    (SELECT COUNT(*) FROM gone)",
            &[&from, &chunk, &ACKED, &cutoff],
        )
        .ctx("purging acked deliveries")?;
    let (seen, last, deliveries): (i64, Option<i64>, i64) = (row.get(0), row.get(1), row.get(2));
    let last = last.unwrap_or(from);
    // The statement above removed the deliveries; this one sees that.
    let messages = ctx
        .execute(
            "DELETE FROM bus_messages m WHERE m.id > $1 AND m.id <= $2 AND m.published_at < $3
             AND NOT EXISTS (SELECT 1 FROM bus_deliveries d WHERE d.msg_id = m.id)",
            &[&from, &last, &cutoff],
        )
        .ctx("purging messages")?;
    // Dedup ids outlive their messages: they go only when their own window has passed.
    let now = ctx.now;
    let dedup_ids = ctx
        .execute(
            "DELETE FROM bus_dedup WHERE (topic_id, dedup_id) IN (SELECT topic_id, dedup_id
             FROM bus_dedup WHERE expires_at <= $1 LIMIT $2)",
            &[&now, &chunk],
        )
        .ctx("purging dedup ids")?;
    let wrapped = seen < chunk;
    cursor.store(if wrapped { 0 } else { last }, Ordering::Relaxed);
    let count = |n: i64| u64::try_from(n).unwrap_or(0);
    Ok(Some((
        PurgeReport {
            deliveries: count(deliveries),
            messages,
            dedup_ids,
        },
        wrapped,
    )))
}
