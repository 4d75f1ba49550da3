//! A policy whose store cannot be read or written fails closed: checks refuse, changes are
//! refused with the store's error and leave memory as it was, and no use is spent; once the
//! store answers again, everything is as it was before it went away.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use common::*;
use environment_core::policy_store::{
    PolicyChange, PolicyRecord, PolicyRecords, PolicyStore, Uses, Written,
};
use environment_core::{Action, ErrorKind, ManualClock, PortError, Resource};
use environment_policy::{Outcome, Policy, PolicyError, Reason, SqlitePolicyStore};

const UP: u8 = 0;
/// Reads fail, and so do writes.
const DOWN: u8 = 1;
/// Reads answer, writes fail.
const READ_ONLY: u8 = 2;

/// A store that goes away when told to.
struct Flaky {
    inner: SqlitePolicyStore,
    state: Arc<AtomicU8>,
}

fn gone() -> PortError {
    PortError::new(ErrorKind::Unavailable, "the store is gone", "wait for it")
}

impl Flaky {
    fn read(&self) -> Result<(), PortError> {
        match self.state.load(Ordering::SeqCst) {
            DOWN => Err(gone()),
            _ => Ok(()),
        }
    }

    fn write(&self) -> Result<(), PortError> {
        match self.state.load(Ordering::SeqCst) {
            UP => Ok(()),
            _ => Err(gone()),
        }
    }
}

impl PolicyStore for Flaky {
    fn generation(&mut self) -> Result<i64, PortError> {
        self.read()?;
        self.inner.generation()
    }
    fn load(&mut self) -> Result<(i64, PolicyRecords), PortError> {
        self.read()?;
        self.inner.load()
    }
    fn change(&mut self, expected: u64, change: &PolicyChange) -> Result<Written, PortError> {
        self.write()?;
        self.inner.change(expected, change)
    }
    fn put_approval(
        &mut self,
        before: Option<&str>,
        record: &PolicyRecord,
    ) -> Result<Written, PortError> {
        self.write()?;
        self.inner.put_approval(before, record)
    }
    fn spend(&mut self, uses: &Uses) -> Result<Written, PortError> {
        self.write()?;
        self.inner.spend(uses)
    }
}

const RULES: &str = r#"
[[rule]]
id = "one-post"
effect = "permit"
principal = "agent:a"
actions = ["execute"]
resource = { endpoint = "https://api.example.com/posts" }
quota = { count = 1, window_secs = 3600 }
"#;

#[test]
fn a_policy_whose_store_is_gone_fails_closed_and_loses_nothing() {
    let state = Arc::new(AtomicU8::new(UP));
    let store = Flaky {
        inner: SqlitePolicyStore::in_memory().unwrap(),
        state: state.clone(),
    };
    let p = Policy::with_store(Box::new(store), Arc::new(ManualClock::new(10 * HOUR))).unwrap();
    p.load_rules(RULES).unwrap();
    let post = req(
        "agent:a",
        Action::Execute,
        Resource::Service("https://api.example.com/posts".into()),
    );
    assert!(p.evaluate(&post).is_allowed());

    // Gone: a check refuses, as unreadable, and spends nothing.
    state.store(DOWN, Ordering::SeqCst);
    let d = p.check(&post);
    assert_eq!(
        (d.outcome(), d.reason()),
        (Outcome::Deny, &Reason::Unreadable)
    );
    // A change is refused with the store's error, and memory does not take it.
    let err = p.add_member("agent:a", "group:g").unwrap_err();
    assert!(
        matches!(&err, PolicyError::Store(e) if e.kind == ErrorKind::Unavailable),
        "{err}"
    );
    assert!(!p.is_member("agent:a", "group:g"));

    // Readable but not writable: the decision is made, the spend is not, so it is refused.
    state.store(READ_ONLY, Ordering::SeqCst);
    let d = p.check(&post);
    assert_eq!(
        (d.outcome(), d.reason()),
        (Outcome::Deny, &Reason::NoPermit)
    );

    // Back: the quota's one use is still there, and is had once.
    state.store(UP, Ordering::SeqCst);
    assert!(p.check(&post).is_allowed(), "the use was never spent");
    assert!(matches!(
        p.check(&post).reason(),
        Reason::QuotaExhausted { .. }
    ));
    assert_eq!(
        p.version(),
        1,
        "no change got through while the store was gone"
    );
}
