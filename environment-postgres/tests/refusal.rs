//! Bad input and settlements that are not the caller's are refused with the bus's typed errors
//! and change nothing in the database.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use environment_bus::{BusError, GroupOptions, NewMessage, PublishOptions};
use environment_core::queue::{Publish, Settlement};
use environment_core::{ErrorKind, ManualClock, Queue};
use environment_postgres::PgError;

const LEASE: Duration = Duration::from_secs(30);

#[test]
fn refusals_change_nothing() {
    let Some(server) = common::fresh("refusal") else {
        return;
    };
    let clock = ManualClock::new(1_000_000);
    let q = common::open(&server, common::config(&clock));
    q.create_group("workers", &["jobs"], GroupOptions { max_attempts: 3 })
        .unwrap();
    q.create_group("audit", &["other"], GroupOptions::default())
        .unwrap();
    q.publish("jobs", b"one".to_vec(), Publish::default())
        .unwrap();
    q.publish("jobs", b"two".to_vec(), Publish::default())
        .unwrap();
    let held = q.claim("workers", "a", 1, LEASE).unwrap().remove(0);
    let stale = {
        let l = q.claim("workers", "a", 1, LEASE).unwrap().remove(0);
        q.ack("a", &l.receipt).unwrap();
        l.receipt
    };
    let before = common::rows(&server);

    let kind = |r: Result<(), environment_core::PortError>| r.unwrap_err().kind;
    let big = vec![0u8; q.config().limits.max_payload_bytes + 1];
    let cases: Vec<(&str, Result<(), environment_core::PortError>, ErrorKind)> = vec![
        (
            "bad topic",
            q.publish("no spaces", vec![], Publish::default()).map(drop),
            ErrorKind::Invalid,
        ),
        (
            "too large",
            q.publish("jobs", big, Publish::default()).map(drop),
            ErrorKind::Invalid,
        ),
        (
            "control in key",
            q.publish(
                "jobs",
                vec![],
                Publish {
                    ordering_key: Some("a\nb".into()),
                    ..Publish::default()
                },
            )
            .map(drop),
            ErrorKind::Invalid,
        ),
        (
            "claim of none",
            Queue::claim(&q, "workers", "a", 0, LEASE).map(drop),
            ErrorKind::Invalid,
        ),
        (
            "zero lease",
            Queue::claim(&q, "workers", "a", 1, Duration::ZERO).map(drop),
            ErrorKind::Invalid,
        ),
        (
            "unknown group",
            Queue::claim(&q, "nobody", "a", 1, LEASE).map(drop),
            ErrorKind::NotFound,
        ),
        (
            "garbage receipt",
            q.settle("a", "garbage", Settlement::Ack),
            ErrorKind::NotFound,
        ),
        (
            "unknown receipt",
            q.settle("a", "999999.0000000000000001", Settlement::Ack),
            ErrorKind::NotFound,
        ),
        (
            "stale receipt",
            q.settle("a", &stale, Settlement::Ack),
            ErrorKind::Conflict,
        ),
        (
            "not the holder's",
            q.settle("b", &held.receipt, Settlement::Ack),
            ErrorKind::Denied,
        ),
        (
            "not the holder's nack",
            q.settle(
                "b",
                &held.receipt,
                Settlement::Nack {
                    delay: None,
                    error: None,
                },
            ),
            ErrorKind::Denied,
        ),
        (
            "nack delay too long",
            q.settle(
                "a",
                &held.receipt,
                Settlement::Nack {
                    delay: Some(Duration::from_secs(u64::MAX / 4)),
                    error: None,
                },
            ),
            ErrorKind::Invalid,
        ),
        (
            "extend too long",
            Queue::extend(&q, &held.receipt, Duration::from_secs(u64::MAX / 4)),
            ErrorKind::Invalid,
        ),
        (
            "ack-and-claim of another group",
            q.ack_and_claim("a", &held.receipt, "audit", 1, LEASE)
                .map(drop),
            ErrorKind::Invalid,
        ),
        (
            "group conflict",
            q.subscribe("workers", &["jobs".to_owned()]),
            ErrorKind::Conflict,
        ),
        (
            "empty reason",
            q.terminate(&held.receipt, "").map_err(Into::into),
            ErrorKind::Invalid,
        ),
    ];
    for (what, result, expected) in cases {
        assert_eq!(kind(result), expected, "{what}");
        assert_eq!(common::rows(&server), before, "{what} changed the database");
    }
    // A dedup window beyond the limit, through the message API.
    let long = PublishOptions::default()
        .dedup_id("x")
        .dedup_window(Duration::from_secs(u64::MAX / 4));
    let err = q
        .publish_message(&NewMessage::new("jobs", vec![]).with(long))
        .unwrap_err();
    assert!(
        matches!(err, PgError::Refused(BusError::OutOfRange { .. })),
        "{err}"
    );
    assert_eq!(common::rows(&server), before);
    // The lease is still the holder's.
    assert_eq!(q.holder(&held.receipt).unwrap().consumer, "a");
}

/// Each receipt of a batch ack is settled or refused on its own, as it would be one at a time.
#[test]
fn a_batch_ack_settles_each_receipt_on_its_own() {
    let Some(server) = common::fresh("ack_many") else {
        return;
    };
    let clock = ManualClock::new(1_000_000);
    let q = common::open(&server, common::config(&clock));
    q.create_group("workers", &["jobs"], GroupOptions::default())
        .unwrap();
    let keyed = PublishOptions::default().ordering_key("k");
    for m in [
        NewMessage::new("jobs", b"plain".to_vec()),
        NewMessage::new("jobs", b"keyed".to_vec()).with(keyed.clone()),
        NewMessage::new("jobs", b"behind".to_vec()).with(keyed),
        NewMessage::new("jobs", b"theirs".to_vec()),
    ] {
        q.publish_message(&m).unwrap();
    }
    let mine = q.claim("workers", "a", 2, LEASE).unwrap();
    let theirs = q.claim("workers", "b", 1, LEASE).unwrap().remove(0);
    assert_eq!(theirs.message.payload, b"theirs");
    let (plain, keyed) = (&mine[0].receipt, &mine[1].receipt);
    // A forged token for the plain message's delivery, before its real receipt.
    let (delivery, _) = plain.split_once('.').unwrap();
    let forged = format!("{delivery}.0000000000000001");
    let outcomes = q
        .ack_many(
            "a",
            &[&forged, plain, plain, keyed, &theirs.receipt, "garbage"],
        )
        .unwrap();
    let kinds: Vec<Option<ErrorKind>> = outcomes
        .iter()
        .map(|o| o.as_ref().err().map(PgError::kind))
        .collect();
    assert_eq!(
        kinds,
        [
            Some(ErrorKind::Conflict),
            None,
            Some(ErrorKind::Conflict),
            None,
            Some(ErrorKind::Denied),
            Some(ErrorKind::NotFound),
        ]
    );
    // The keyed message's ack let the one behind it through; theirs is still theirs.
    let next = q.claim("workers", "a", 5, LEASE).unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].message.payload, b"behind");
    assert_eq!(q.holder(&theirs.receipt).unwrap().consumer, "b");
}
