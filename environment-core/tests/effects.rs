//! The effect log's port on the embedded store: the port's test body (the one PostgreSQL runs),
//! and two handles on one home (two processes) racing to begin one effect.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use environment_core::{LocalEnvironment, Options};

#[test]
fn the_embedded_store_behaves_as_the_port_says() {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    environment_conformance::effect_port::the_port_behaves(env.effect_store().as_ref());
}

#[test]
fn two_handles_on_one_home_begin_an_effect_once() {
    let home = tempfile::tempdir().unwrap();
    let one = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let two = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    environment_conformance::effect_port::one_begin_wins(&one, &two);
}
