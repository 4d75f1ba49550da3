//! Core's queue port (`environment_core::Queue`) as the workspace service uses it, in one test
//! body that takes any implementation and a way to move its clock.

use std::time::Duration;

use environment_core::queue::{Publish, Settlement};
use environment_core::{ErrorKind, Queue};

/// The lease every claim of the body takes.
const LEASE: Duration = Duration::from_secs(30);

/// What every queue behind the port does, whatever keeps it.
pub fn the_port_behaves(q: &dyn Queue, advance: &dyn Fn(Duration)) {
    let kind = |r: Result<(), environment_core::PortError>| r.unwrap_err().kind;
    q.subscribe("workers", &["tasks".to_owned()]).unwrap();
    q.subscribe("audit", &["other".to_owned()]).unwrap();

    // Published with who and why; a repeated dedup id is taken and not delivered twice.
    let once = Publish {
        dedup_id: Some("t1".into()),
        publisher: Some("agent:planner".into()),
        correlation_id: Some("task-1".into()),
        ..Publish::default()
    };
    let first = q.publish("tasks", b"build".to_vec(), once.clone()).unwrap();
    let again = q.publish("tasks", b"build".to_vec(), once).unwrap();
    assert!(!first.duplicate && again.duplicate && again.id == first.id);

    // Claimed with its headers, held by its consumer, listed in flight.
    let leases = q.claim("workers", "a", 10, LEASE).unwrap();
    assert_eq!(leases.len(), 1, "{leases:?}");
    let lease = &leases[0];
    assert_eq!(
        (lease.message.payload.as_slice(), lease.attempt),
        (&b"build"[..], 1)
    );
    assert_eq!(lease.message.publisher.as_deref(), Some("agent:planner"));
    assert_eq!(lease.message.correlation_id.as_deref(), Some("task-1"));
    let held = q.holder(&lease.receipt).unwrap();
    assert_eq!(
        (held.group.as_str(), held.consumer.as_str()),
        ("workers", "a")
    );
    let flying = q.leases(Some("workers"), None, 10).unwrap();
    assert_eq!(flying.len(), 1);
    assert_eq!(
        (flying[0].message_id, flying[0].consumer.as_str()),
        (lease.message.id, "a")
    );
    assert_eq!(q.leases(None, None, 10).unwrap(), flying);
    assert_eq!(q.holder("garbage").unwrap_err().kind, ErrorKind::NotFound);

    // Only its holder settles it; a refusal leaves it held.
    q.extend(&lease.receipt, LEASE * 2).unwrap();
    assert_eq!(
        kind(q.settle("b", &lease.receipt, Settlement::Ack)),
        ErrorKind::Denied
    );
    assert_eq!(q.holder(&lease.receipt).unwrap().consumer, "a");

    // Ack-and-claim-next: refused whole for another group, then one step of a worker.
    q.publish("tasks", b"test".to_vec(), Publish::default())
        .unwrap();
    let other = q
        .ack_and_claim("a", &lease.receipt, "audit", 1, LEASE)
        .unwrap_err();
    assert_eq!(other.kind, ErrorKind::Invalid);
    assert_eq!(q.holder(&lease.receipt).unwrap().consumer, "a");
    let next = q
        .ack_and_claim("a", &lease.receipt, "workers", 1, LEASE)
        .unwrap();
    assert_eq!(next[0].message.payload, b"test");
    assert_eq!(
        q.holder(&lease.receipt).unwrap_err().kind,
        ErrorKind::Conflict
    );

    // Given back until it is dead; dead letters page on; a redrive brings it back.
    let mut receipt = next[0].receipt.clone();
    let mut attempts = 1;
    loop {
        let why = Settlement::Nack {
            delay: Some(Duration::ZERO),
            error: Some(format!("failed {attempts}")),
        };
        q.settle("a", &receipt, why).unwrap();
        match q.claim("workers", "a", 1, LEASE).unwrap().pop() {
            Some(again) => {
                attempts += 1;
                receipt = again.receipt;
            }
            None => break,
        }
        assert!(attempts <= 10, "it never died");
    }
    let dead = q.dead_letters("workers", None, 10).unwrap();
    assert_eq!(dead.len(), 1, "{dead:?}");
    assert_eq!(dead[0].message.payload, b"test");
    assert_eq!(dead[0].attempts, attempts);
    assert_eq!(
        dead[0].last_error.as_deref(),
        Some(format!("failed {attempts}").as_str())
    );
    assert!(
        q.dead_letters("workers", Some(dead[0].message.id), 10)
            .unwrap()
            .is_empty()
    );
    let figures = q.metrics().unwrap();
    let workers = figures
        .iter()
        .flat_map(|t| &t.groups)
        .find(|g| g.group == "workers")
        .unwrap();
    assert_eq!((workers.dead_letters, workers.in_flight), (1, 0));
    assert_eq!(q.redrive("workers").unwrap(), 1);
    let back = q.claim("workers", "a", 1, LEASE).unwrap();
    assert_eq!(back[0].message.payload, b"test");

    // A lease that runs out is no longer in flight.
    advance(LEASE + Duration::from_secs(1));
    assert!(q.leases(Some("workers"), None, 10).unwrap().is_empty());

    // Past the retention, a purge removes the acked message, its delivery and its dedup id,
    // and leaves the unsettled one; a second finds nothing.
    advance(Duration::from_secs(2 * 24 * 3600));
    let purged = q.purge().unwrap();
    assert_eq!(
        (purged.deliveries, purged.messages, purged.dedup_ids),
        (1, 1, 1),
        "{purged:?}"
    );
    assert!(q.purge().unwrap().is_empty());
    let left = q.claim("workers", "a", 10, LEASE).unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].message.payload, b"test");
    let fresh = Publish {
        dedup_id: Some("t1".into()),
        ..Publish::default()
    };
    assert!(
        !q.publish("tasks", b"build".to_vec(), fresh)
            .unwrap()
            .duplicate
    );
}
