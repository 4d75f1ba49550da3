//! Showing an operation under the policy: every operation, the first one included, is read as
//! its branch is, through one check every door shares.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use environment_core::{ActRequest, EnvError, Intent, Key, Value};

const RULES: &str = r#"
[[rule]]
id = "reader-reads"
effect = "permit"
principal = "agent:reader"
actions = ["read"]
resource = "*"

[[rule]]
id = "writer-writes"
effect = "permit"
principal = "agent:writer"
actions = ["write"]
resource = "*"
"#;

#[test]
fn every_operation_is_shown_only_to_who_may_read_its_branch() {
    let (_dir, env) = governed(RULES);
    let (reader, writer) = (actor("agent:reader"), actor("agent:writer"));
    let first = env.head("main").unwrap();
    let edit = env
        .act_blocking(
            ActRequest::new(writer.clone(), Intent::edit("a"))
                .put(Key::fs("a.txt").unwrap(), Value::file("1")),
        )
        .unwrap()
        .version;

    // The writer may not read: neither the first operation nor a later one is shown to it.
    for v in [&first, &edit] {
        let r = env.show(&writer, v);
        assert!(matches!(r, Err(EnvError::NotAllowed(_))), "{r:?}");
    }

    let shown = env.show(&reader, &first).unwrap();
    assert_eq!(shown.op.id, first);
    assert!(shown.changes.is_none(), "nothing came before the first");
    let shown = env.show(&reader, &edit).unwrap();
    let changes = shown.changes.unwrap();
    assert_eq!(changes.len(), 1);
    assert_eq!(changes[0].key, Key::fs("a.txt").unwrap());
}
