//! Publishing: a message row and one delivery row per subscribed group. A message with an
//! ordering key waits behind a live one of its key; two publishes of one key (or one dedup id)
//! take turns on an advisory lock, so the check and the insert are one step for each.

use environment_bus::NewMessage;
use environment_core::queue::Posted;

use super::Ctx;
use super::schema::{READY, WAITING};
use crate::error::{PgContext, Result};
use crate::statements::Statements;

/// Takes the lock of (group, ordering key) until the transaction ends: whoever decides whether
/// a key is busy, or makes its next message claimable, holds it.
pub(crate) fn lock_key(ctx: &mut Ctx<'_, '_>, group_id: i64, key: &str) -> Result<()> {
    ctx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended($2, $1))",
        &[&group_id, &key],
    )
    .ctx("locking an ordering key")
    .map(drop)
}

/// The state and due time of a delivery joining (group, key): waiting behind a live delivery
/// of its key, or ready from `due`. Takes the key's lock, held until the transaction ends.
pub(crate) fn arrival(
    ctx: &mut Ctx<'_, '_>,
    group_id: i64,
    key: Option<&str>,
    due: i64,
) -> Result<(i16, Option<i64>)> {
    if let Some(k) = key {
        lock_key(ctx, group_id, k)?;
        if key_busy(ctx, group_id, k)? {
            return Ok((WAITING, None));
        }
    }
    Ok((READY, Some(due)))
}

/// Whether (group, key) has a live delivery (ready, leased or waiting).
pub(crate) fn key_busy(ctx: &mut Ctx<'_, '_>, group_id: i64, key: &str) -> Result<bool> {
    ctx.query_opt(
        "SELECT 1 FROM bus_deliveries WHERE group_id = $1 AND okey = $2 AND state < 3 LIMIT 1",
        &[&group_id, &key],
    )
    .ctx("checking an ordering key")
    .map(|r| r.is_some())
}

/// The id of `topic`, created when new.
pub(crate) fn topic_id(ctx: &mut Ctx<'_, '_>, topic: &str) -> Result<i64> {
    loop {
        if let Some(row) = ctx
            .query_opt("SELECT id FROM bus_topics WHERE name = $1", &[&topic])
            .ctx("looking up a topic")?
        {
            return Ok(row.get(0));
        }
        // Another machine may create it between the two statements: then this inserts nothing
        // and the lookup finds theirs.
        if let Some(row) = ctx
            .query_opt(
                "INSERT INTO bus_topics(name) VALUES ($1) ON CONFLICT (name) DO NOTHING \
                 RETURNING id",
                &[&topic],
            )
            .ctx("creating a topic")?
        {
            return Ok(row.get(0));
        }
    }
}

/// Publishes one message (checked by the caller), creating its topic when new.
pub(crate) fn publish(ctx: &mut Ctx<'_, '_>, m: &NewMessage, window_ms: i64) -> Result<Posted> {
    let now = ctx.now;
    let o = &m.options;
    let tid = topic_id(ctx, &m.topic)?;
    if let Some(dedup) = &o.dedup_id {
        ctx.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($2, -($1::BIGINT)))",
            &[&tid, dedup],
        )
        .ctx("locking a dedup id")?;
        let hit = ctx
            .query_opt(
                "SELECT msg_id FROM bus_dedup WHERE topic_id = $1 AND dedup_id = $2 \
                 AND expires_at > $3",
                &[&tid, dedup, &now],
            )
            .ctx("checking a dedup id")?;
        if let Some(row) = hit {
            return Ok(Posted {
                id: row.get(0),
                duplicate: true,
            });
        }
    }
    let delay = o.delay.map_or(0, super::ms);
    let visible_at = now.saturating_add(delay);
    let id: i64 = ctx
        .query_one(
            "INSERT INTO bus_messages(topic_id, payload, okey, dedup_id, actor, correlation_id,
             published_at) VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
            &[
                &tid,
                &m.payload,
                &o.ordering_key,
                &o.dedup_id,
                &o.headers.actor,
                &o.headers.correlation_id,
                &now,
            ],
        )
        .ctx("inserting a message")?
        .get(0);
    if let Some(dedup) = &o.dedup_id {
        ctx.execute(
            "INSERT INTO bus_dedup(topic_id, dedup_id, msg_id, expires_at)
                 VALUES ($1, $2, $3, $4) ON CONFLICT (topic_id, dedup_id)
                 DO UPDATE SET msg_id = EXCLUDED.msg_id, expires_at = EXCLUDED.expires_at",
            &[&tid, dedup, &id, &now.saturating_add(window_ms)],
        )
        .ctx("recording a dedup id")?;
    }
    let groups: Vec<i64> = ctx
        .query(
            "SELECT group_id FROM bus_subscriptions WHERE topic_id = $1 ORDER BY group_id",
            &[&tid],
        )
        .ctx("listing subscriptions")?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for gid in groups {
        let (state, due) = arrival(ctx, gid, o.ordering_key.as_deref(), visible_at)?;
        ctx.execute(
            "INSERT INTO bus_deliveries(msg_id, group_id, okey, state, due, visible_at)
                 VALUES ($1, $2, $3, $4, $5, $6)",
            &[&id, &gid, &o.ordering_key, &state, &due, &visible_at],
        )
        .ctx("inserting a delivery")?;
        if state == READY {
            ctx.wake.push(gid);
        }
    }
    Ok(Posted {
        id,
        duplicate: false,
    })
}

/// Publishes a message without ordering key or dedup id to an existing topic in one statement,
/// notifying its groups; `None` when it is not such a message or its topic is new (the
/// transaction of [`publish`] takes it then).
pub(crate) fn publish_plain(
    s: &mut impl Statements,
    m: &NewMessage,
    now: i64,
) -> Result<Option<Posted>> {
    let o = &m.options;
    if o.ordering_key.is_some() || o.dedup_id.is_some() {
        return Ok(None);
    }
    let visible_at = now.saturating_add(o.delay.map_or(0, super::ms));
    let row = s
        .query_one(
            "WITH m AS (
                INSERT INTO bus_messages(topic_id, payload, actor, correlation_id, published_at)
                SELECT id, $2, $3, $4, $5 FROM bus_topics WHERE name = $1
                RETURNING id, topic_id),
             d AS (
                INSERT INTO bus_deliveries(msg_id, group_id, state, due, visible_at)
                SELECT m.id, s.group_id, $7, $6, $6
                FROM m JOIN bus_subscriptions s ON s.topic_id = m.topic_id
                RETURNING group_id)
             SELECT (SELECT id FROM m),
                    (SELECT COUNT(pg_notify($8, group_id::TEXT)) FROM d)",
            &[
                &m.topic,
                &m.payload,
                &o.headers.actor,
                &o.headers.correlation_id,
                &now,
                &visible_at,
                &READY,
                &super::CHANNEL,
            ],
        )
        .ctx("publishing a message")?;
    Ok(row.get::<_, Option<i64>>(0).map(|id| Posted {
        id,
        duplicate: false,
    }))
}
