//! The environment's maintenance through environment-core under the policy: `verify` reads the
//! whole environment and `gc` deletes from it, each decided as that.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use environment_core::EnvError;

const RULES: &str = r#"
[[rule]]
id = "ops-check"
effect = "permit"
principal = "human:ops"
actions = ["read", "delete"]
resource = { environment = true }
"#;

#[test]
fn verify_and_gc_are_decided_for_the_whole_environment() {
    let (_dir, env) = governed(RULES);
    let agent = actor("agent:x");
    for refused in [env.verify(&agent).err(), env.verify_deep(&agent).err()] {
        assert!(
            matches!(refused, Some(EnvError::NotAllowed(_))),
            "{refused:?}"
        );
    }
    assert!(matches!(env.gc(&agent), Err(EnvError::NotAllowed(_))));
    let ops = actor("human:ops");
    assert_eq!(env.verify(&ops).unwrap().ops, 1);
    env.verify_deep(&ops).unwrap();
    env.gc(&ops).unwrap();
}
