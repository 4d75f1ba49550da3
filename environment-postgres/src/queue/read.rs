//! What the queue holds, read without changing it: the holder of a lease, the leases in flight,
//! dead letters, figures and a delivery's state.

use environment_bus::{DeliveryStatus, Receipt, rules};
use environment_core::queue::{DeadLetter, GroupMetrics, Holder, LeaseInFlight, TopicMetrics};

use super::Ctx;
use super::lease::{group_row, message, message_cols};
use super::schema::{DEAD, LEASED};
use crate::error::{PgContext, PgError, Result};
use crate::statements::Statements;

/// Who holds the lease `receipt` names.
pub(crate) fn holder(ctx: &mut Ctx<'_, '_>, receipt: &Receipt) -> Result<Holder> {
    let row = ctx
        .query_opt(
            "SELECT g.name, d.state, d.token, d.consumer FROM bus_deliveries d
             JOIN bus_groups g ON g.id = d.group_id WHERE d.id = $1",
            &[&receipt.delivery()],
        )
        .ctx("reading a lease's holder")?;
    let row = rules::leased(receipt, row, |r| (i64::from(r.get::<_, i16>(1)), r.get(2)))?;
    Ok(Holder {
        group: row.get(0),
        consumer: row.get::<_, Option<String>>(3).unwrap_or_default(),
    })
}

/// The leases in flight at the context's time (of `group`, or of every group), in delivery
/// order after the delivery `after`.
pub(crate) fn leases(
    ctx: &mut Ctx<'_, '_>,
    group: Option<&str>,
    after: Option<i64>,
    limit: u32,
) -> Result<Vec<LeaseInFlight>> {
    let now = ctx.now;
    let rows = ctx
        .query(
            "SELECT g.name, t.name, m.id, d.consumer, d.attempts, m.published_at, d.lease_until,
                    d.id
             FROM bus_deliveries d JOIN bus_groups g ON g.id = d.group_id
             JOIN bus_messages m ON m.id = d.msg_id JOIN bus_topics t ON t.id = m.topic_id
             WHERE d.state = $1 AND d.lease_until >= $2 AND ($3::TEXT IS NULL OR g.name = $3)
               AND d.id > $4
             ORDER BY d.id LIMIT $5",
            &[
                &LEASED,
                &now,
                &group,
                &after.unwrap_or(0),
                &i64::from(limit),
            ],
        )
        .ctx("listing leases in flight")?;
    Ok(rows
        .iter()
        .map(|r| LeaseInFlight {
            group: r.get(0),
            topic: r.get(1),
            message_id: r.get(2),
            consumer: r.get::<_, Option<String>>(3).unwrap_or_default(),
            attempt: u32::try_from(r.get::<_, i32>(4)).unwrap_or(0),
            published_at_ms: r.get(5),
            lease_until_ms: r.get::<_, Option<i64>>(6).unwrap_or(0),
            delivery: r.get(7),
        })
        .collect())
}

/// `group`'s dead letters, oldest message first, after the message `after` (only `message`'s
/// when given).
pub(crate) fn dead_letters(
    ctx: &mut Ctx<'_, '_>,
    group: &str,
    only: Option<i64>,
    after: Option<i64>,
    limit: u32,
) -> Result<Vec<DeadLetter>> {
    let (gid, _) = group_row(ctx, group)?;
    let rows = ctx
        .query(
            concat!(
                "SELECT d.attempts, d.last_error, d.finished_at, ",
                message_cols!(),
                " FROM bus_deliveries d JOIN bus_messages m ON m.id = d.msg_id
                 JOIN bus_topics t ON t.id = m.topic_id
                 WHERE d.group_id = $1 AND d.state = $2 AND ($3::BIGINT IS NULL OR d.msg_id = $3)
                   AND d.msg_id > $4
                 ORDER BY d.msg_id LIMIT $5"
            ),
            &[&gid, &DEAD, &only, &after.unwrap_or(0), &i64::from(limit)],
        )
        .ctx("listing dead letters")?;
    Ok(rows
        .iter()
        .map(|r| DeadLetter {
            attempts: u32::try_from(r.get::<_, i32>(0)).unwrap_or(0),
            last_error: r.get(1),
            dead_at_ms: r.get::<_, Option<i64>>(2).unwrap_or(0),
            message: message(r, 3),
        })
        .collect())
}

/// Depth, leases in flight, oldest age, dead letters and redeliveries per topic and group.
pub(crate) fn metrics(ctx: &mut Ctx<'_, '_>) -> Result<Vec<TopicMetrics>> {
    let now = ctx.now;
    let topics: Vec<(i64, String, i64)> = ctx
        .query(
            "SELECT t.id, t.name, (SELECT COUNT(*) FROM bus_messages m WHERE m.topic_id = t.id)
             FROM bus_topics t ORDER BY t.name",
            &[],
        )
        .ctx("listing topics")?
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let mut out = Vec::with_capacity(topics.len());
    for (tid, name, retained) in topics {
        let rows = ctx
            .query(
                "SELECT g.name,
                   COUNT(*) FILTER (WHERE d.state IN (0, 2) OR (d.state = 1 AND d.lease_until < $2)),
                   COUNT(*) FILTER (WHERE d.state = 1 AND d.lease_until >= $2),
                   MIN(m.published_at) FILTER (WHERE d.state < 3),
                   COUNT(*) FILTER (WHERE d.state = 4),
                   COALESCE(SUM(GREATEST(d.attempts - 1, 0)), 0)::BIGINT
                 FROM bus_subscriptions s JOIN bus_groups g ON g.id = s.group_id
                 LEFT JOIN bus_messages m ON m.topic_id = s.topic_id
                 LEFT JOIN bus_deliveries d ON d.msg_id = m.id AND d.group_id = s.group_id
                 WHERE s.topic_id = $1 GROUP BY g.id, g.name ORDER BY g.name",
                &[&tid, &now],
            )
            .ctx("computing group metrics")?;
        let count = |v: i64| u64::try_from(v).unwrap_or(0);
        let groups = rows
            .iter()
            .map(|r| {
                let oldest: Option<i64> = r.get(3);
                GroupMetrics {
                    topic: name.clone(),
                    group: r.get(0),
                    depth: count(r.get(1)),
                    in_flight: count(r.get(2)),
                    oldest_age_ms: oldest.map_or(0, |o| (now - o).max(0)),
                    dead_letters: count(r.get(4)),
                    redeliveries: count(r.get(5)),
                }
            })
            .collect();
        out.push(TopicMetrics {
            topic: name,
            retained: count(retained),
            groups,
        });
    }
    Ok(out)
}

/// The state of `message`'s delivery to `group`, if it has one.
pub(crate) fn status(
    ctx: &mut Ctx<'_, '_>,
    group: &str,
    message: i64,
) -> Result<Option<DeliveryStatus>> {
    let (gid, _) = group_row(ctx, group)?;
    let state: Option<i16> = ctx
        .query_opt(
            "SELECT state FROM bus_deliveries WHERE group_id = $1 AND msg_id = $2",
            &[&gid, &message],
        )
        .ctx("reading a delivery's state")?
        .map(|r| r.get(0));
    state
        .map(|s| {
            DeliveryStatus::from_code(i64::from(s))
                .ok_or_else(|| PgError::Schema(format!("delivery state {s}")))
        })
        .transpose()
}
