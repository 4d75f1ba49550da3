//! Several tasks and handles acting at once on the embedded store (the bodies are in
//! `environment-conformance`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use environment_conformance::log_port::{self, Embedded};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_lost_update_and_exact_conflicts() {
    log_port::no_lost_update_and_exact_conflicts(&Embedded, 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_handles_acting_at_once_lose_no_update() {
    log_port::no_lost_update_and_exact_conflicts(&Embedded, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_handles_taking_turns_build_on_each_other() {
    log_port::two_handles_taking_turns_build_on_each_other(&Embedded).await;
}

#[test]
fn a_version_dropped_on_one_handle_is_dropped_on_every_other() {
    log_port::a_version_dropped_on_one_handle_is_dropped_on_every_other(&Embedded);
}

#[test]
fn opposite_merges_at_once_both_succeed() {
    log_port::opposite_merges_at_once_both_succeed(&Embedded);
}
