//! Storage follows change: 100 captures of one-file changes add those files' content and a few
//! tree nodes on the changed path each, nothing proportional to the tree.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::{setup, write};
use environment_core::{Intent, IntentKind, OpFlags};

fn db_bytes(home: &std::path::Path, sql: &str) -> i64 {
    let conn = rusqlite::Connection::open(home.join("env.db")).unwrap();
    conn.query_row(sql, [], |r| r.get(0)).unwrap()
}

fn blob_bytes(env: &environment_core::LocalEnvironment) -> u64 {
    env.blobs().usage().unwrap().bytes
}

#[test]
fn a_hundred_one_file_captures_cost_their_content_and_a_path_of_nodes() {
    let s = setup(|w| {
        for i in 0..3000 {
            write(
                w,
                &format!("d{}/e{}/f{}/file{i}.txt", i % 10, i % 7, i % 3),
                &vec![b'x' + (i % 3) as u8; 500 + i % 700],
            );
        }
    });
    let home = s.home.path();
    let nodes_sql = "SELECT (SELECT COALESCE(SUM(LENGTH(data)), 0) FROM nodes)
                          + (SELECT COALESCE(SUM(LENGTH(data)), 0) FROM node_blocks)
                  + (SELECT COALESCE(SUM(LENGTH(nodes)), 0) FROM ops)";
    let (nodes0, blobs0) = (db_bytes(home, nodes_sql), blob_bytes(&s.env));
    let count0 = s
        .env
        .verify(&environment_core::ActorId::system())
        .unwrap()
        .nodes as i64;
    let mut content = 0u64;
    for i in 0..100 {
        let rel = format!("d{}/e{}/f{}/file{i}.txt", i % 10, i % 7, i % 3);
        let bytes = format!("change {i} ").repeat(20 + i).into_bytes();
        content += bytes.len() as u64;
        std::fs::write(s.work.path().join(&rel), &bytes).unwrap();
        s.tracker
            .capture_now(
                Intent::new(IntentKind::Command, "edit one file"),
                OpFlags::COMMAND,
            )
            .unwrap()
            .unwrap();
    }
    let added_blobs = blob_bytes(&s.env) - blobs0;
    assert_eq!(
        added_blobs, content,
        "blob growth is exactly the new content"
    );
    let added_nodes = s
        .env
        .verify(&environment_core::ActorId::system())
        .unwrap()
        .nodes as i64
        - count0;
    let added_node_bytes = db_bytes(home, nodes_sql) - nodes0;
    // The path root → fs → d → e → f holds 5 directory nodes; nothing else is rewritten.
    assert!(
        added_nodes <= 100 * 5,
        "{added_nodes} nodes for 100 one-file captures"
    );
    assert!(
        added_node_bytes / 100 < nodes0 / 50,
        "{} node bytes per capture in a tree of {nodes0}",
        added_node_bytes / 100
    );
    eprintln!(
        "per capture: {} nodes, {} node bytes, {} content bytes (tree: {nodes0} node bytes)",
        added_nodes / 100,
        added_node_bytes / 100,
        content / 100
    );
}
