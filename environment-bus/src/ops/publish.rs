//! Publishing: a message row and one delivery row per subscribed group.

use rusqlite::{Connection, OptionalExtension, params};

use super::{Ctx, ms};
use crate::error::{Result, SqlContext};
use crate::schema::{READY, WAITING};
use crate::types::{MessageId, NewMessage, Published};

/// Whether (group, key) has a live delivery (ready, leased or waiting).
pub(super) fn key_busy(conn: &Connection, group_id: i64, key: &str) -> Result<bool> {
    conn.prepare_cached(
        "SELECT 1 FROM bus_deliveries WHERE group_id = ?1 AND okey = ?2 AND state < 3 LIMIT 1",
    )
    .and_then(|mut s| s.exists(params![group_id, key]))
    .ctx("checking an ordering key")
}

/// Publishes one message; the caller validated it with [`crate::rules::check_message`].
pub(crate) fn publish(ctx: &mut Ctx<'_>, m: &NewMessage, default_window: i64) -> Result<Published> {
    let conn = ctx.conn;
    let now = ctx.now;
    let (tid, groups) = ctx.names.topic(conn, &m.topic)?;
    let o = &m.options;
    if let Some(dedup) = &o.dedup_id {
        let hit: Option<(i64, i64)> = conn
            .prepare_cached(
                "SELECT msg_id, expires_at FROM bus_dedup WHERE topic_id = ?1 AND dedup_id = ?2",
            )
            .and_then(|mut s| {
                s.query_row(params![tid, dedup], |r| Ok((r.get(0)?, r.get(1)?)))
                    .optional()
            })
            .ctx("checking a dedup id")?;
        if let Some((id, expires)) = hit
            && expires > now
        {
            return Ok(Published {
                id: MessageId(id),
                duplicate: true,
            });
        }
    }
    let visible_at = now.saturating_add(o.delay.map(ms).unwrap_or(0));
    let h = &o.headers;
    conn.prepare_cached(
        "INSERT INTO bus_messages(topic_id, payload, okey, dedup_id, actor, correlation_id,
         causing_op, published_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )
    .and_then(|mut s| {
        s.execute(params![
            tid,
            m.payload,
            o.ordering_key,
            o.dedup_id,
            h.actor,
            h.correlation_id,
            h.causing_op,
            now
        ])
    })
    .ctx("inserting a message")?;
    let id = conn.last_insert_rowid();
    if let Some(dedup) = &o.dedup_id {
        let window = o.dedup_window.map(ms).unwrap_or(default_window);
        conn.prepare_cached(
            "INSERT OR REPLACE INTO bus_dedup(topic_id, dedup_id, msg_id, expires_at)
             VALUES (?1, ?2, ?3, ?4)",
        )
        .and_then(|mut s| s.execute(params![tid, dedup, id, now.saturating_add(window)]))
        .ctx("recording a dedup id")?;
    }
    for &gid in groups.iter() {
        let waiting = match &o.ordering_key {
            Some(k) => key_busy(conn, gid, k)?,
            None => false,
        };
        let (state, due) = if waiting {
            (WAITING, None)
        } else {
            (READY, Some(visible_at))
        };
        conn.prepare_cached(
            "INSERT INTO bus_deliveries(msg_id, group_id, okey, state, due, visible_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        )
        .and_then(|mut s| s.execute(params![id, gid, o.ordering_key, state, due, visible_at]))
        .ctx("inserting a delivery")?;
        if !waiting {
            ctx.wake.push(gid);
        }
    }
    Ok(Published {
        id: MessageId(id),
        duplicate: false,
    })
}
