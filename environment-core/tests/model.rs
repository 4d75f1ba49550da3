//! The log's model test on the embedded store (the bodies are in `environment-conformance`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use environment_conformance::log_model::{run, step};
use environment_conformance::log_port::Embedded;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn every_read_at_every_version_matches_the_model(steps in proptest::collection::vec(step(), 1..40)) {
        run(&Embedded, steps);
    }
}
