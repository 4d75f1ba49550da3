//! The bus's operations as SQL on one connection inside an open transaction. The writer thread
//! runs them in group commits; the `*_in` methods of [`Bus`](crate::Bus) run them inside a
//! caller's transaction.
//!
//! `check` validates input before anything is written; `publish`, `lease` (claim, settle,
//! redrive) and `upkeep` (purge, metrics, dead letters) do the work.

use std::collections::HashMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::error::{BusError, Result, SqlContext};
use crate::types::{Backoff, Headers, Message, MessageId};

/// The columns [`message_from`] reads, as a macro so queries stay literals (no per-call
/// formatting on the hot path).
macro_rules! message_cols {
    () => {
        "m.id, t.name, m.payload, m.okey, m.dedup_id, m.actor, m.correlation_id, m.causing_op, \
         m.published_at"
    };
}

mod lease;
mod publish;
mod upkeep;

pub(crate) use crate::rules::{Settle, check_name, ms};
pub(crate) use lease::{Claimed, ack_and_claim, claim, redrive, settle};
pub(crate) use publish::publish;
pub(crate) use upkeep::{dead_letters, delivery_state, leases, metrics, purge_step};

/// What an operation needs besides the connection.
pub(crate) struct Ctx<'a> {
    pub conn: &'a Connection,
    pub names: &'a mut Names,
    pub now: i64,
    pub backoff: Backoff,
    pub rng: &'a mut StdRng,
    /// Groups that gained claimable messages; woken after the commit.
    pub wake: &'a mut Vec<i64>,
}

/// Topic and group rows looked up before, so a publish or claim does not read them again.
/// Committed topics and groups are never deleted or changed, but a group may subscribe to a
/// topic later and a rolled-back transaction may have created either: the cache is cleared on
/// the bus's own creates, on any rollback, and when another connection committed.
#[derive(Default)]
pub(crate) struct Names {
    /// topic name → (id, subscribed groups)
    topics: HashMap<String, (i64, Arc<[i64]>)>,
    /// group name → (id, max_attempts)
    groups: HashMap<String, (i64, u32)>,
    data_version: Option<i64>,
}

/// Beyond this many entries the cache starts over (names come from callers).
const NAMES_MAX: usize = 4096;

impl Names {
    pub(crate) fn clear(&mut self) {
        self.topics.clear();
        self.groups.clear();
    }

    /// Clears the cache if another connection committed since the last call; call it inside
    /// each transaction, after it began.
    pub(crate) fn check_version(&mut self, conn: &Connection) -> Result<()> {
        let v: i64 = conn
            .prepare_cached("PRAGMA data_version")
            .and_then(|mut s| s.query_row([], |r| r.get(0)))
            .ctx("reading data_version")?;
        if self.data_version != Some(v) {
            self.clear();
            self.data_version = Some(v);
        }
        Ok(())
    }

    /// (id, subscribed groups) of a topic.
    pub(crate) fn topic(&mut self, conn: &Connection, topic: &str) -> Result<(i64, Arc<[i64]>)> {
        if let Some((id, groups)) = self.topics.get(topic) {
            return Ok((*id, groups.clone()));
        }
        let id = topic_id(conn, topic)?;
        let groups: Arc<[i64]> = conn
            .prepare_cached("SELECT group_id FROM bus_subscriptions WHERE topic_id = ?1")
            .and_then(|mut s| {
                s.query_map([id], |r| r.get(0))?
                    .collect::<rusqlite::Result<Vec<i64>>>()
            })
            .ctx("listing subscriptions")?
            .into();
        if self.topics.len() >= NAMES_MAX {
            self.topics.clear();
        }
        self.topics.insert(topic.to_owned(), (id, groups.clone()));
        Ok((id, groups))
    }

    /// (id, max_attempts) of a group.
    pub(crate) fn group(&mut self, conn: &Connection, group: &str) -> Result<(i64, u32)> {
        if let Some(row) = self.groups.get(group) {
            return Ok(*row);
        }
        let row = group_row(conn, group)?;
        if self.groups.len() >= NAMES_MAX {
            self.groups.clear();
        }
        self.groups.insert(group.to_owned(), row);
        Ok(row)
    }
}

pub(crate) fn topic_id(conn: &Connection, topic: &str) -> Result<i64> {
    conn.prepare_cached("SELECT id FROM bus_topics WHERE name = ?1")
        .and_then(|mut s| s.query_row([topic], |r| r.get(0)).optional())
        .ctx("looking up a topic")?
        .ok_or_else(|| BusError::UnknownTopic {
            topic: topic.to_owned(),
        })
}

/// (id, max_attempts)
pub(crate) fn group_row(conn: &Connection, group: &str) -> Result<(i64, u32)> {
    conn.prepare_cached("SELECT id, max_attempts FROM bus_groups WHERE name = ?1")
        .and_then(|mut s| {
            s.query_row([group], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()
        })
        .ctx("looking up a group")?
        .ok_or_else(|| BusError::UnknownGroup {
            group: group.to_owned(),
        })
}

pub(crate) fn create_topic(conn: &Connection, topic: &str) -> Result<()> {
    check_name("topic", topic)?;
    conn.prepare_cached("INSERT OR IGNORE INTO bus_topics(name) VALUES (?1)")
        .and_then(|mut s| s.execute([topic]))
        .ctx("creating a topic")?;
    Ok(())
}

pub(crate) fn create_group(
    conn: &Connection,
    group: &str,
    topics: &[String],
    max_attempts: u32,
) -> Result<()> {
    crate::rules::check_group(group, max_attempts, topics.iter().map(String::as_str))?;
    let mut topic_ids = Vec::with_capacity(topics.len());
    for t in topics {
        topic_ids.push(topic_id(conn, t)?);
    }
    let gid = match group_row(conn, group) {
        Ok((id, existing)) if existing == max_attempts => id,
        Ok((_, existing)) => {
            return Err(BusError::GroupConflict {
                group: group.to_owned(),
                existing,
                requested: max_attempts,
            });
        }
        Err(BusError::UnknownGroup { .. }) => {
            conn.execute(
                "INSERT INTO bus_groups(name, max_attempts) VALUES (?1, ?2)",
                params![group, max_attempts],
            )
            .ctx("creating a group")?;
            conn.last_insert_rowid()
        }
        Err(e) => return Err(e),
    };
    for tid in topic_ids {
        conn.execute(
            "INSERT OR IGNORE INTO bus_subscriptions(topic_id, group_id) VALUES (?1, ?2)",
            params![tid, gid],
        )
        .ctx("subscribing a group")?;
    }
    Ok(())
}

fn message_from(r: &Row<'_>, at: usize) -> rusqlite::Result<Message> {
    Ok(Message {
        id: MessageId(r.get(at)?),
        topic: r.get(at + 1)?,
        payload: r.get(at + 2)?,
        ordering_key: r.get(at + 3)?,
        dedup_id: r.get(at + 4)?,
        headers: Headers {
            actor: r.get(at + 5)?,
            correlation_id: r.get(at + 6)?,
            causing_op: r.get(at + 7)?,
        },
        published_at_ms: r.get(at + 8)?,
    })
}
