//! Storage cost and blob lifecycle: bounded nodes in huge directories, structural sharing,
//! diff over large views, garbage collection with pins and concurrent writers.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use environment_core::op::OpId;
use environment_core::{
    ActRequest, ActorId, Intent, Key, KeyPrefix, LocalEnvironment, Namespace, Options, Value,
};

/// The stored nodes (as `verify` counts them) and the bytes of their rows.
fn node_stats(env: &LocalEnvironment, home: &std::path::Path) -> (i64, i64) {
    let conn = rusqlite::Connection::open(home.join("env.db")).unwrap();
    let bytes = conn
        .query_row(
            "SELECT (SELECT COALESCE(SUM(LENGTH(data)), 0) FROM nodes)
                  + (SELECT COALESCE(SUM(LENGTH(data)), 0) FROM node_blocks)
                  + (SELECT COALESCE(SUM(LENGTH(nodes)), 0) FROM ops)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    (
        env.verify(&environment_core::ActorId::system())
            .unwrap()
            .nodes as i64,
        bytes,
    )
}

#[test]
fn one_change_in_a_huge_directory_writes_a_few_small_nodes() {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let actor = ActorId::new("agent:bulk").unwrap();
    let mut r = ActRequest::new(actor.clone(), Intent::edit("20k files in one directory"));
    for i in 0..20_000 {
        r = r.put(
            Key::fs(format!("flat/file-{i:05}.txt")).unwrap(),
            Value::file(format!("content {i}")),
        );
    }
    let v1 = env.act_blocking(r).unwrap().version;
    let (n0, b0) = node_stats(&env, home.path());
    let v2 = env
        .act_blocking(ActRequest::new(actor.clone(), Intent::edit("one")).put(
            Key::fs("flat/file-12345.txt").unwrap(),
            Value::file("changed"),
        ))
        .unwrap()
        .version;
    let (n1, b1) = node_stats(&env, home.path());
    assert!(n1 - n0 <= 8, "{} new nodes for one change", n1 - n0);
    assert!(b1 - b0 < 16 * 1024, "{} new bytes for one change", b1 - b0);
    let d = env.diff(&actor, &v1, &v2, None).unwrap();
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].key, Key::fs("flat/file-12345.txt").unwrap());
    assert_eq!(
        env.list(&actor, &KeyPrefix::all(Namespace::Fs), &v2)
            .unwrap()
            .len(),
        20_000
    );
    // Deleting most entries collapses the directory back into one node with the same hash as
    // building it directly: the shape depends only on the content.
    let mut r = ActRequest::new(actor.clone(), Intent::edit("prune"));
    for i in 10..20_000 {
        r = r.delete(Key::fs(format!("flat/file-{i:05}.txt")).unwrap());
    }
    let pruned = env.act_blocking(r).unwrap().version;
    let home2 = tempfile::tempdir().unwrap();
    let env2 = LocalEnvironment::open(home2.path(), Options::default()).unwrap();
    let mut r = ActRequest::new(actor.clone(), Intent::edit("direct"));
    for i in 0..10 {
        r = r.put(
            Key::fs(format!("flat/file-{i:05}.txt")).unwrap(),
            Value::file(format!("content {i}")),
        );
    }
    let direct = env2.act_blocking(r).unwrap().version;
    assert_eq!(
        env.op(&pruned).unwrap().view,
        env2.op(&direct).unwrap().view
    );
}

#[test]
fn gc_keeps_referenced_and_pinned_blobs_only() {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let actor = ActorId::new("agent:gc").unwrap();
    let k = Key::fs("big").unwrap();
    let v1 = env
        .act_blocking(
            ActRequest::new(actor.clone(), Intent::edit("v1"))
                .put(k.clone(), Value::file(vec![1u8; 1000])),
        )
        .unwrap()
        .version;
    env.act_blocking(
        ActRequest::new(actor.clone(), Intent::edit("v2"))
            .put(k.clone(), Value::file(vec![2u8; 1000])),
    )
    .unwrap();
    let orphan = env.blobs().put(&[3u8; 1000]).unwrap();
    let pinned = env.blobs().put(&[4u8; 1000]).unwrap();
    env.pin_blob(&pinned, "message:1").unwrap();
    let report = env.gc(&actor).unwrap();
    assert_eq!((report.kept, report.removed), (3, 1));
    assert!(!env.blobs().contains(&orphan));
    assert!(env.blobs().contains(&pinned));
    // Old versions stay readable: history keeps their content alive.
    let old = env.read(&actor, &k, &v1).unwrap().unwrap();
    assert_eq!(env.content(&old).unwrap(), vec![1u8; 1000]);
    env.unpin_blob(&pinned, "message:1").unwrap();
    assert_eq!(env.gc(&actor).unwrap().removed, 1);
    env.verify_deep(&environment_core::ActorId::system())
        .unwrap();
}

#[test]
fn gc_racing_writers_never_loses_committed_content() {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let collector = {
        let (env, stop) = (env.clone(), stop.clone());
        std::thread::spawn(move || {
            let actor = ActorId::new("service:gc").unwrap();
            let mut runs = 0;
            while !stop.load(Ordering::Relaxed) {
                env.gc(&actor).unwrap();
                runs += 1;
            }
            runs
        })
    };
    let actor = ActorId::new("agent:w").unwrap();
    let mut written = vec![];
    for i in 0..300u32 {
        // The same content as an earlier, overwritten version: dedup against a blob that gc may
        // be about to collect.
        let bytes = vec![(i % 7) as u8; 100 + (i % 7) as usize];
        let key = Key::fs(format!("d/{}", i % 5)).unwrap();
        let v = env
            .act_blocking(
                ActRequest::new(actor.clone(), Intent::edit("w"))
                    .put(key.clone(), Value::file(bytes.clone())),
            )
            .unwrap();
        written.push((key, v.version, bytes));
    }
    stop.store(true, Ordering::Relaxed);
    assert!(collector.join().unwrap() > 0);
    for (k, v, bytes) in written {
        let val = env
            .read(&actor, &k, &v)
            .unwrap()
            .expect("written at this version");
        assert_eq!(env.content(&val).unwrap(), bytes);
    }
    env.verify_deep(&environment_core::ActorId::system())
        .unwrap();
}

/// Runs garbage collection, which must remove at least `least` nodes, and checks that the
/// stored nodes went down by exactly as many as it reports.
fn collect_nodes(env: &LocalEnvironment, actor: &ActorId, least: u64) {
    let nodes_before = env
        .verify(&environment_core::ActorId::system())
        .unwrap()
        .nodes;
    let report = env.gc(actor).unwrap();
    assert!(report.nodes_removed >= least, "{report:?}");
    assert_eq!(
        env.verify(&environment_core::ActorId::system())
            .unwrap()
            .nodes,
        nodes_before - report.nodes_removed
    );
}

/// Reopens the environment, so nothing is cached, and checks that each version lists exactly
/// its expected content.
fn read_back_cold(
    home: &std::path::Path,
    actor: &ActorId,
    versions: &[(OpId, std::collections::BTreeMap<Key, Value>)],
) {
    let env = LocalEnvironment::open(home, Options::default()).unwrap();
    for (v, expected) in versions {
        let listed: std::collections::BTreeMap<Key, Value> = env
            .list(actor, &KeyPrefix::all(Namespace::Fs), v)
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(&listed, expected);
    }
    env.verify(&environment_core::ActorId::system()).unwrap();
}

#[test]
fn imports_larger_than_a_block_read_back_cold_and_collect() {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let actor = ActorId::new("agent:import").unwrap();
    let mut state = std::collections::BTreeMap::new();
    let mut versions = Vec::new();
    // Imports whose nodes fill many blocks (the third replaces all the second wrote), then a
    // one-key change.
    for (round, keys) in [(0, 2000), (1, 1000), (2, 1000), (3, 1)] {
        let mut r = ActRequest::new(actor.clone(), Intent::edit("import"));
        for i in 0..keys {
            let key = Key::fs(format!("d{}/e{}/f{i}.txt", i % 13, i % 7)).unwrap();
            let value = Value::file(format!("round {round} file {i}"));
            state.insert(key.clone(), value.clone());
            r = r.put(key, value);
        }
        versions.push((env.act_blocking(r).unwrap().version, state.clone()));
    }
    assert_eq!(env.drop_versions(&actor, &[versions[1].0]).unwrap(), 1);
    collect_nodes(&env, &actor, 50);
    drop(env);
    versions.remove(1);
    read_back_cold(home.path(), &actor, &versions);
}

#[test]
fn an_act_whose_nodes_fill_more_than_a_block_keeps_them_in_its_row() {
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let actor = ActorId::new("agent:row").unwrap();
    // The bytes of nodes in the last operation's row, and the rows of `node_blocks`.
    let stored = || -> (Option<i64>, i64) {
        let conn = rusqlite::Connection::open(home.path().join("env.db")).unwrap();
        conn.query_row(
            "SELECT (SELECT LENGTH(nodes) FROM ops ORDER BY seq DESC LIMIT 1),
                    (SELECT COUNT(*) FROM node_blocks)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    };
    // A directory of 44 files with inline content: about 3.3 KB of nodes, more than a block of
    // `node_blocks` holds and less than a row of the log does.
    let mut state = std::collections::BTreeMap::new();
    let mut r = ActRequest::new(actor.clone(), Intent::edit("many small files"));
    for i in 0..44 {
        let key = Key::fs(format!("big/file-{i:02}.txt")).unwrap();
        let value = Value::file(format!("{i:050}"));
        state.insert(key.clone(), value.clone());
        r = r.put(key, value);
    }
    let first = env.act_blocking(r).unwrap().version;
    let (_, blocks) = stored();
    // One change there rewrites the whole directory node, which its operation's row holds (its
    // record names one key, where the first named all it could).
    let key = Key::fs("big/file-07.txt").unwrap();
    state.insert(key.clone(), Value::file("changed"));
    let one = ActRequest::new(actor.clone(), Intent::edit("one")).put(key, Value::file("changed"));
    let second = env.act_blocking(one).unwrap().version;
    let (in_row, blocks_after) = stored();
    let in_row = in_row.expect("the nodes are in the operation's row");
    assert!(
        (3 * 1024..4000).contains(&in_row),
        "{in_row} bytes in the row"
    );
    assert_eq!(blocks_after, blocks);
    // Put the file back, then drop the second version: its nodes die, and its row is rewritten
    // without them.
    let mut kept = state.clone();
    let (key, value) = (
        Key::fs("big/file-07.txt").unwrap(),
        Value::file(format!("{:050}", 7)),
    );
    kept.insert(key.clone(), value.clone());
    let back = ActRequest::new(actor.clone(), Intent::edit("back")).put(key, value);
    let third = env.act_blocking(back).unwrap().version;
    assert_eq!(env.drop_versions(&actor, &[second]).unwrap(), 1);
    collect_nodes(&env, &actor, 1);
    drop(env);
    read_back_cold(home.path(), &actor, &[(first, kept.clone()), (third, kept)]);
}

#[test]
fn retention_protects_drops_and_collects() {
    environment_conformance::retention::protected_dropped_and_collected(
        &environment_conformance::log_port::Embedded,
    );
}
