//! Bad input is refused with a typed error and changes nothing.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use environment_bus::{
    Bus, BusConfig, BusError, DeliveryStatus, GroupOptions, MessageId, NewMessage, PublishOptions,
    Receipt,
};
use environment_core::ManualClock;

const LEASE: Duration = Duration::from_secs(30);

fn setup() -> (tempfile::TempDir, Bus) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = BusConfig::with_clock(Arc::new(ManualClock::new(1_000_000)));
    config.auto_purge = None;
    config.limits.max_payload_bytes = 1024;
    let bus = Bus::open(dir.path().join("bus.db"), config).unwrap();
    bus.create_topic("t").wait().unwrap();
    bus.create_group("g", &["t"], GroupOptions::default())
        .wait()
        .unwrap();
    (dir, bus)
}

/// Depth, in flight and retained: the figures any change would move.
fn snapshot(bus: &Bus) -> Vec<(u64, u64, u64, u64)> {
    bus.metrics()
        .unwrap()
        .iter()
        .flat_map(|t| {
            t.groups
                .iter()
                .map(move |g| (t.retained, g.depth, g.in_flight, g.dead_letters))
        })
        .collect()
}

#[test]
fn unknown_and_forged_receipts() {
    let (_d, bus) = setup();
    bus.publish("t", b"x".to_vec(), PublishOptions::default())
        .wait()
        .unwrap();
    let l = bus.claim("g", "c", 1, LEASE).wait().unwrap();
    let before = snapshot(&bus);
    let never: Receipt = "999999.0000000000000001".parse().unwrap();
    assert!(matches!(
        bus.ack(&never).wait(),
        Err(BusError::UnknownReceipt { .. })
    ));
    // Right delivery, wrong token: someone guessing.
    let text = l[0].receipt.to_string();
    let (d, _) = text.split_once('.').unwrap();
    let forged: Receipt = format!("{d}.00000000deadbeef").parse().unwrap();
    for r in [
        bus.ack(&forged).wait(),
        bus.nack(&forged).wait(),
        bus.extend(&forged, LEASE).wait(),
        bus.terminate(&forged, "x").wait(),
    ] {
        assert!(matches!(r, Err(BusError::StaleReceipt { .. })), "{r:?}");
    }
    for bad in [
        "",
        "abc",
        "1.2",
        "-5.0000000000000001",
        "1.000000000000000g",
        "1.0000000000000001.3",
    ] {
        assert!(
            matches!(bad.parse::<Receipt>(), Err(BusError::UnknownReceipt { .. })),
            "{bad:?} parsed"
        );
    }
    assert_eq!(snapshot(&bus), before);
    assert_eq!(
        bus.status("g", l[0].message.id).unwrap(),
        Some(DeliveryStatus::Leased)
    );
}

#[test]
fn leases_and_delays_out_of_range() {
    let (_d, bus) = setup();
    bus.publish("t", b"x".to_vec(), PublishOptions::default())
        .wait()
        .unwrap();
    let before = snapshot(&bus);
    // Durations cannot be negative in this API; zero and huge ones are the bad cases left.
    for lease in [
        Duration::ZERO,
        Duration::from_secs(13 * 3600),
        Duration::MAX,
    ] {
        assert!(matches!(
            bus.claim("g", "c", 1, lease).wait(),
            Err(BusError::OutOfRange { what: "lease", .. })
        ));
    }
    assert!(matches!(
        bus.claim("g", "c", 0, LEASE).wait(),
        Err(BusError::OutOfRange {
            what: "claim size",
            ..
        })
    ));
    assert!(matches!(
        bus.claim("g", "c", u32::MAX, LEASE).wait(),
        Err(BusError::OutOfRange { .. })
    ));
    let huge = PublishOptions::default().delay(Duration::from_secs(365 * 24 * 3600));
    assert!(matches!(
        bus.publish("t", b"x".to_vec(), huge).wait(),
        Err(BusError::OutOfRange { what: "delay", .. })
    ));
    let zero_window = PublishOptions::default()
        .dedup_id("d")
        .dedup_window(Duration::ZERO);
    assert!(matches!(
        bus.publish("t", b"x".to_vec(), zero_window).wait(),
        Err(BusError::OutOfRange { .. })
    ));
    assert_eq!(snapshot(&bus), before);

    let l = bus.claim("g", "c", 1, LEASE).wait().unwrap();
    let before = snapshot(&bus);
    assert!(matches!(
        bus.extend(&l[0].receipt, Duration::ZERO).wait(),
        Err(BusError::OutOfRange { .. })
    ));
    assert!(matches!(
        bus.extend(&l[0].receipt, Duration::MAX).wait(),
        Err(BusError::OutOfRange { .. })
    ));
    assert!(matches!(
        bus.nack_with_delay(&l[0].receipt, Duration::MAX).wait(),
        Err(BusError::OutOfRange { .. })
    ));
    assert_eq!(snapshot(&bus), before);
    assert_eq!(
        bus.status("g", l[0].message.id).unwrap(),
        Some(DeliveryStatus::Leased)
    );
    bus.ack(&l[0].receipt).wait().unwrap();
}

#[test]
fn oversized_payloads_and_batches() {
    let (_d, bus) = setup();
    let before = snapshot(&bus);
    assert!(matches!(
        bus.publish("t", vec![0u8; 1025], PublishOptions::default())
            .wait(),
        Err(BusError::PayloadTooLarge {
            size: 1025,
            limit: 1024
        })
    ));
    // One bad message spoils the whole batch, before anything is written.
    let batch = vec![
        NewMessage::new("t", vec![1u8]),
        NewMessage::new("t", vec![0u8; 5000]),
    ];
    assert!(matches!(
        bus.publish_batch(batch).wait(),
        Err(BusError::PayloadTooLarge { .. })
    ));
    let too_many: Vec<_> = (0..10_001)
        .map(|_| NewMessage::new("t", vec![1u8]))
        .collect();
    assert!(matches!(
        bus.publish_batch(too_many).wait(),
        Err(BusError::OutOfRange {
            what: "batch size",
            ..
        })
    ));
    assert!(
        bus.publish("t", vec![0u8; 1024], PublishOptions::default())
            .wait()
            .is_ok()
    );
    assert_ne!(snapshot(&bus), before);
}

#[test]
fn unknown_topics_and_groups() {
    let (_d, bus) = setup();
    let before = snapshot(&bus);
    assert!(matches!(
        bus.publish("ghost", b"x".to_vec(), PublishOptions::default())
            .wait(),
        Err(BusError::UnknownTopic { .. })
    ));
    assert!(matches!(
        bus.claim("ghosts", "c", 1, LEASE).wait(),
        Err(BusError::UnknownGroup { .. })
    ));
    assert!(matches!(
        bus.create_group("g2", &["t", "ghost"], GroupOptions::default())
            .wait(),
        Err(BusError::UnknownTopic { .. })
    ));
    assert!(matches!(
        bus.claim("g2", "c", 1, LEASE).wait(),
        Err(BusError::UnknownGroup { .. })
    ));
    assert!(matches!(
        bus.dead_letters("ghosts", 10),
        Err(BusError::UnknownGroup { .. })
    ));
    assert!(matches!(
        bus.redrive("ghosts", None).wait(),
        Err(BusError::UnknownGroup { .. })
    ));
    assert!(matches!(
        bus.redrive("g", Some(MessageId(42))).wait(),
        Err(BusError::NoSuchDeadLetter { .. })
    ));
    assert!(matches!(
        bus.dead_letter("g", MessageId(42)),
        Err(BusError::NoSuchDeadLetter { .. })
    ));
    assert!(matches!(
        bus.consumer("ghosts", "c", LEASE),
        Err(BusError::UnknownGroup { .. })
    ));
    assert!(matches!(
        bus.create_group("g", &["t"], GroupOptions { max_attempts: 9 })
            .wait(),
        Err(BusError::GroupConflict { .. })
    ));
    assert!(matches!(
        bus.create_group("g3", &["t"], GroupOptions { max_attempts: 0 })
            .wait(),
        Err(BusError::OutOfRange { .. })
    ));
    assert_eq!(snapshot(&bus), before);
}

#[test]
fn invalid_names_and_text() {
    let (_d, bus) = setup();
    let before = snapshot(&bus);
    for name in ["", "has space", "tab\t", &"x".repeat(201), "semi;colon"] {
        assert!(matches!(
            bus.create_topic(name).wait(),
            Err(BusError::InvalidName { .. })
        ));
        assert!(matches!(
            bus.claim("g", name, 1, LEASE).wait(),
            Err(BusError::InvalidName { .. })
        ));
    }
    for o in [
        PublishOptions::default().ordering_key(""),
        PublishOptions::default().dedup_id("line\nbreak"),
        PublishOptions::default().ordering_key("k".repeat(513)),
    ] {
        assert!(matches!(
            bus.publish("t", b"x".to_vec(), o).wait(),
            Err(BusError::InvalidName { .. })
        ));
    }
    assert_eq!(snapshot(&bus), before);
}

#[test]
fn a_database_from_a_newer_bus_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bus.db");
    drop(Bus::open(&path, BusConfig::default()).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "UPDATE bus_meta SET value = 99 WHERE key = 'schema_version'",
        [],
    )
    .unwrap();
    drop(conn);
    assert!(matches!(
        Bus::open(&path, BusConfig::default()),
        Err(BusError::Corrupt { .. })
    ));
}
