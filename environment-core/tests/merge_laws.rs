//! Laws of the three-way merge on the embedded store (the body is in `environment-conformance`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use environment_conformance::log_port::Embedded;
use environment_conformance::merge_laws::{changes, hold};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn merge_laws(base in changes(), ours in changes(), theirs in changes()) {
        hold(&Embedded, &base, &ours, &theirs)?;
    }
}
