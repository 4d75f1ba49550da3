//! The queue's tables: the embedded bus's layout (one delivery row per message and subscribed
//! group, `due` set only while a row may be claimed), with identities from sequences. Ids are
//! unique and increasing per sequence but may have gaps (a rolled-back publish spends one).

use environment_bus::DeliveryStatus;

use crate::migrate::Migration;

/// Delivery states, as the embedded bus numbers them.
pub(crate) const READY: i16 = DeliveryStatus::Ready.code();
pub(crate) const LEASED: i16 = DeliveryStatus::Leased.code();
/// Behind an earlier live message with the same ordering key.
pub(crate) const WAITING: i16 = DeliveryStatus::Waiting.code();
pub(crate) const ACKED: i16 = DeliveryStatus::Acked.code();
pub(crate) const DEAD: i16 = DeliveryStatus::Dead.code();

pub(crate) const CAUSE_MAX_ATTEMPTS: i16 = 1;
pub(crate) const CAUSE_TERMINATED: i16 = 2;

/// The component's name in `environment_migrations`.
pub(crate) const COMPONENT: &str = "queue";

/// The queue's migrations, in order.
pub(crate) const MIGRATIONS: &[Migration] = &[Migration {
    version: 1,
    name: "topics, groups, messages, deliveries, dedup ids",
    sql: "
CREATE TABLE bus_topics(
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name TEXT NOT NULL UNIQUE
);
CREATE TABLE bus_groups(
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name TEXT NOT NULL UNIQUE,
    max_attempts INT NOT NULL
);
CREATE TABLE bus_subscriptions(
    topic_id BIGINT NOT NULL REFERENCES bus_topics(id),
    group_id BIGINT NOT NULL REFERENCES bus_groups(id),
    PRIMARY KEY(topic_id, group_id)
);
CREATE TABLE bus_messages(
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    topic_id BIGINT NOT NULL,
    payload BYTEA NOT NULL,
    okey TEXT,
    dedup_id TEXT,
    actor TEXT,
    correlation_id TEXT,
    published_at BIGINT NOT NULL
);
CREATE TABLE bus_deliveries(
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    msg_id BIGINT NOT NULL,
    group_id BIGINT NOT NULL,
    okey TEXT,
    state SMALLINT NOT NULL,
    due BIGINT,
    visible_at BIGINT NOT NULL,
    lease_until BIGINT,
    token BIGINT,
    consumer TEXT,
    attempts INT NOT NULL DEFAULT 0,
    last_error TEXT,
    dead_cause SMALLINT,
    finished_at BIGINT
);
CREATE INDEX bus_deliveries_due ON bus_deliveries(group_id, due, id) WHERE due IS NOT NULL;
CREATE INDEX bus_deliveries_key ON bus_deliveries(group_id, okey, id)
    WHERE okey IS NOT NULL AND state < 3;
CREATE INDEX bus_deliveries_msg ON bus_deliveries(msg_id);
CREATE INDEX bus_deliveries_dead ON bus_deliveries(group_id, msg_id) WHERE state = 4;
CREATE INDEX bus_deliveries_leased ON bus_deliveries(id) WHERE state = 1;
CREATE TABLE bus_dedup(
    topic_id BIGINT NOT NULL,
    dedup_id TEXT NOT NULL,
    msg_id BIGINT NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY(topic_id, dedup_id)
);
CREATE INDEX bus_dedup_expiry ON bus_dedup(expires_at);
",
}];
