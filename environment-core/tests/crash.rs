//! Crash safety on the embedded store: a child process acting, using effects and collecting
//! garbage is SIGKILLed at random moments, and every invariant holds after each kill (the body
//! is in `environment-conformance`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use environment_conformance::log_crash;
use environment_conformance::log_port::Embedded;

#[test]
fn crash_child_entry() {
    log_crash::child_entry(&Embedded);
}

#[test]
fn killed_at_random_moments() {
    log_crash::killed_at_random_moments(&Embedded, "crash_child_entry", 60);
}
