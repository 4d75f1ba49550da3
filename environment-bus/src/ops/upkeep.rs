//! Upkeep and inspection: purge, dead letters, metrics, delivery states.

use std::sync::atomic::{AtomicI64, Ordering};

use rusqlite::{Connection, OptionalExtension, params};

use super::{group_row, message_from};
use crate::error::{Result, SqlContext};
use crate::schema::{ACKED, CAUSE_TERMINATED, LEASED};
use environment_core::queue::LeaseInFlight;

use crate::types::{DeadCause, DeadLetter, GroupMetrics, MessageId, PurgeReport, TopicMetrics};

/// One bounded purge step, so a purge never holds the write lock for long: it examines at most
/// `chunk` messages, from where the sweep stopped last time (`cursor`; it wraps to 0 at the end).
/// Of each, it removes the deliveries acked before `cutoff`, then the message itself if it is
/// older than `cutoff` and has no delivery left (all acked and purged, or no subscriber).
/// Finding acked deliveries through the sweep instead of an index of their own saves every ack
/// an index entry. Returns the report and whether the sweep reached the end.
pub(crate) fn purge_step(
    conn: &Connection,
    now: i64,
    cutoff: i64,
    chunk: i64,
    cursor: &AtomicI64,
) -> Result<(PurgeReport, bool)> {
    let from = cursor.load(Ordering::Relaxed);
    let seen: Vec<i64> = conn
        .prepare_cached("SELECT id FROM bus_messages WHERE id > ?1 ORDER BY id LIMIT ?2")
        .and_then(|mut s| s.query_map(params![from, chunk], |r| r.get(0))?.collect())
        .ctx("sweeping messages")?;
    let wrapped = (seen.len() as i64) < chunk;
    cursor.store(
        if wrapped {
            0
        } else {
            seen.last().copied().unwrap_or(0)
        },
        Ordering::Relaxed,
    );
    let (mut deliveries, mut messages) = (0u64, 0u64);
    for id in seen {
        deliveries += conn
            .prepare_cached(
                "DELETE FROM bus_deliveries WHERE msg_id = ?1 AND state = ?2 AND finished_at < ?3",
            )
            .and_then(|mut s| s.execute(params![id, ACKED, cutoff]))
            .ctx("purging acked deliveries")? as u64;
        messages += conn
            .prepare_cached(
                "DELETE FROM bus_messages WHERE id = ?1 AND published_at < ?2
                 AND NOT EXISTS (SELECT 1 FROM bus_deliveries d WHERE d.msg_id = ?1)",
            )
            .and_then(|mut s| s.execute(params![id, cutoff]))
            .ctx("purging a message")? as u64;
    }
    // Dedup ids outlive their messages: they go only when their own window has passed.
    let dedup_ids = conn
        .prepare_cached(
            "DELETE FROM bus_dedup WHERE (topic_id, dedup_id) IN (SELECT topic_id, dedup_id
             FROM bus_dedup WHERE expires_at <= ?1 LIMIT ?2)",
        )
        .and_then(|mut s| s.execute(params![now, chunk]))
        .ctx("purging dedup ids")?;
    Ok((
        PurgeReport {
            deliveries,
            messages,
            dedup_ids: dedup_ids as u64,
        },
        wrapped,
    ))
}

pub(crate) fn dead_letters(
    conn: &Connection,
    group: &str,
    only: Option<MessageId>,
    after: Option<MessageId>,
    limit: u32,
) -> Result<Vec<DeadLetter>> {
    let (gid, _) = group_row(conn, group)?;
    conn.prepare_cached(concat!(
        "SELECT d.attempts, d.last_error, d.dead_cause, d.finished_at, ",
        message_cols!(),
        " FROM bus_deliveries d JOIN bus_messages m ON m.id = d.msg_id
         JOIN bus_topics t ON t.id = m.topic_id
         WHERE d.group_id = ?1 AND d.state = 4 AND (?2 IS NULL OR d.msg_id = ?2)
           AND d.msg_id > ?3
         ORDER BY d.msg_id LIMIT ?4"
    ))
    .and_then(|mut s| {
        let after = after.map_or(0, |m| m.0);
        s.query_map(params![gid, only.map(|m| m.0), after, limit], |r| {
            let cause: Option<i64> = r.get(2)?;
            Ok(DeadLetter {
                group: group.to_owned(),
                attempts: r.get(0)?,
                last_error: r.get(1)?,
                cause: if cause == Some(CAUSE_TERMINATED) {
                    DeadCause::Terminated
                } else {
                    DeadCause::MaxAttempts
                },
                dead_at_ms: r.get::<_, Option<i64>>(3)?.unwrap_or(0),
                message: message_from(r, 4)?,
            })
        })?
        .collect()
    })
    .ctx("listing dead letters")
}

/// The leases in flight at `now` (of `group`, or of every group), oldest message first.
pub(crate) fn leases(
    conn: &Connection,
    group: Option<&str>,
    after: Option<i64>,
    now: i64,
    limit: u32,
) -> Result<Vec<LeaseInFlight>> {
    conn.prepare_cached(
        "SELECT g.name, t.name, m.id, d.consumer, d.attempts, m.published_at, d.lease_until, d.id
         FROM bus_deliveries d JOIN bus_groups g ON g.id = d.group_id
         JOIN bus_messages m ON m.id = d.msg_id JOIN bus_topics t ON t.id = m.topic_id
         WHERE d.state = ?1 AND d.lease_until >= ?2 AND (?3 IS NULL OR g.name = ?3)
           AND d.id > ?4
         ORDER BY d.id LIMIT ?5",
    )
    .and_then(|mut s| {
        s.query_map(
            params![LEASED, now, group, after.unwrap_or(0), limit],
            |r| {
                Ok(LeaseInFlight {
                    group: r.get(0)?,
                    topic: r.get(1)?,
                    message_id: r.get(2)?,
                    consumer: r.get::<_, Option<String>>(3)?.unwrap_or_default(),
                    attempt: r.get(4)?,
                    published_at_ms: r.get(5)?,
                    lease_until_ms: r.get(6)?,
                    delivery: r.get(7)?,
                })
            },
        )?
        .collect()
    })
    .ctx("listing leases in flight")
}

pub(crate) fn metrics(conn: &Connection, now: i64) -> Result<Vec<TopicMetrics>> {
    let topics: Vec<(i64, String, u64)> = conn
        .prepare_cached(
            "SELECT t.id, t.name, (SELECT COUNT(*) FROM bus_messages m WHERE m.topic_id = t.id)
             FROM bus_topics t ORDER BY t.name",
        )
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect()
        })
        .ctx("listing topics")?;
    let mut out = Vec::with_capacity(topics.len());
    for (tid, name, retained) in topics {
        let groups: Vec<GroupMetrics> = conn
            .prepare_cached(
                "SELECT g.name,
                   COALESCE(SUM(d.state IN (0, 2) OR (d.state = 1 AND d.lease_until < ?2)), 0),
                   COALESCE(SUM(d.state = 1 AND d.lease_until >= ?2), 0),
                   MIN(CASE WHEN d.state < 3 THEN m.published_at END),
                   COALESCE(SUM(d.state = 4), 0),
                   COALESCE(SUM(MAX(d.attempts - 1, 0)), 0)
                 FROM bus_subscriptions s JOIN bus_groups g ON g.id = s.group_id
                 LEFT JOIN bus_messages m ON m.topic_id = s.topic_id
                 LEFT JOIN bus_deliveries d ON d.msg_id = m.id AND d.group_id = s.group_id
                 WHERE s.topic_id = ?1 GROUP BY g.id ORDER BY g.name",
            )
            .and_then(|mut s| {
                s.query_map(params![tid, now], |r| {
                    let oldest: Option<i64> = r.get(3)?;
                    Ok(GroupMetrics {
                        topic: name.clone(),
                        group: r.get(0)?,
                        depth: r.get(1)?,
                        in_flight: r.get(2)?,
                        oldest_age_ms: oldest.map(|o| (now - o).max(0)).unwrap_or(0),
                        dead_letters: r.get(4)?,
                        redeliveries: r.get(5)?,
                    })
                })?
                .collect()
            })
            .ctx("computing group metrics")?;
        out.push(TopicMetrics {
            topic: name,
            retained,
            groups,
        });
    }
    Ok(out)
}

/// The state of one delivery, for inspection and tests.
pub(crate) fn delivery_state(
    conn: &Connection,
    group: &str,
    msg: MessageId,
) -> Result<Option<i64>> {
    let (gid, _) = group_row(conn, group)?;
    conn.prepare_cached("SELECT state FROM bus_deliveries WHERE group_id = ?1 AND msg_id = ?2")
        .and_then(|mut s| s.query_row(params![gid, msg.0], |r| r.get(0)).optional())
        .ctx("reading a delivery's state")
}
