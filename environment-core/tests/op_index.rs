//! Finding operations by id once the log outgrows its tail: runs, merges, short prefixes,
//! several handles on one home, the migration from earlier layouts (a B-tree over the ids and a
//! row per tree node; a table for the tail; heads written with every operation and nodes in
//! blocks of their own), and `verify` catching a damaged index.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::path::Path;

use environment_core::error::EnvError;
use environment_core::op::OpId;
use environment_core::{ActRequest, ActorId, Intent, Key, LocalEnvironment, Options, Value};

/// More than 8 runs of 256 (one merge) plus a tail.
const ACTS: usize = 256 * 9 + 100;

fn actor() -> ActorId {
    ActorId::new("agent:index").unwrap()
}

/// `n` acts writing "{label} {i}" to one key; returns each version with the value it wrote.
fn count_up(env: &LocalEnvironment, label: &str, n: usize) -> Vec<(OpId, String)> {
    let key = Key::fs("counter.txt").unwrap();
    (0..n)
        .map(|i| {
            let text = format!("{label} {i}");
            let v = env
                .act_blocking(
                    ActRequest::new(actor(), Intent::edit("count"))
                        .put(key.clone(), Value::file(text.clone())),
                )
                .unwrap()
                .version;
            (v, text)
        })
        .collect()
}

/// An environment with `ACTS` acts, and their versions.
fn grown(home: &Path) -> (LocalEnvironment, Vec<(OpId, String)>) {
    let env = LocalEnvironment::open(home, Options::default()).unwrap();
    let versions = count_up(&env, "value", ACTS);
    (env, versions)
}

fn sql<T: rusqlite::types::FromSql>(home: &Path, query: &str) -> T {
    let conn = rusqlite::Connection::open(home.join("env.db")).unwrap();
    conn.query_row(query, [], |r| r.get(0)).unwrap()
}

/// Every version is found by its full id and reads back what it wrote.
fn assert_all_found(env: &LocalEnvironment, versions: &[(OpId, String)]) {
    let key = Key::fs("counter.txt").unwrap();
    for (v, text) in versions {
        assert_eq!(env.op(v).unwrap().id, *v);
        assert_eq!(env.resolve(&v.to_string()).unwrap(), *v);
        let value = env.read(&actor(), &key, v).unwrap().unwrap();
        assert_eq!(value, Value::file(text.clone()));
    }
}

#[test]
fn every_version_is_found_through_runs_merges_and_the_tail() {
    let home = tempfile::tempdir().unwrap();
    let (env, versions) = grown(home.path());
    let runs: i64 = sql(home.path(), "SELECT COUNT(*) FROM op_runs");
    let tail: i64 = sql(
        home.path(),
        "SELECT COUNT(*) FROM ops WHERE seq > (SELECT MAX(last) FROM op_runs)",
    );
    // 9 full runs of 256 became one merged run of 2048 plus one of 256; the rest is the tail.
    assert_eq!(runs, 2, "runs after a merge");
    assert!(tail < 256, "the tail holds {tail}");
    assert_all_found(&env, &versions);
    env.verify(&environment_core::ActorId::system()).unwrap();

    // A second handle on the same home (its own index, nothing loaded) finds them too, also
    // the versions written after it opened.
    let other = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    assert_all_found(&other, &versions);
    let more = count_up(&env, "later", 300);
    assert_all_found(&other, &more);
    drop((env, other));
    let reopened = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    assert_all_found(&reopened, &versions);
    assert_all_found(&reopened, &more);
    reopened
        .verify(&environment_core::ActorId::system())
        .unwrap();
}

#[test]
fn short_prefixes_resolve_or_are_ambiguous_across_runs_and_tail() {
    let home = tempfile::tempdir().unwrap();
    let (env, versions) = grown(home.path());
    // With ~2,400 ids, many 4-digit prefixes are shared (about 40 pairs are expected).
    let mut by_prefix: HashMap<String, Vec<OpId>> = HashMap::new();
    for (v, _) in &versions {
        by_prefix
            .entry(v.to_string()[..4].to_owned())
            .or_default()
            .push(*v);
    }
    let shared = by_prefix.iter().filter(|(_, vs)| vs.len() > 1).count();
    assert!(shared > 0, "no shared 4-digit prefix among {ACTS} ids");
    for (prefix, vs) in &by_prefix {
        // The first op (the environment's creation) may share the prefix too.
        match env.resolve(prefix) {
            Ok(found) if vs.len() == 1 => assert_eq!(found, vs[0]),
            Err(EnvError::AmbiguousVersion { count, .. }) => assert!(count >= vs.len().max(2)),
            other => panic!("{prefix} ({} versions): {other:?}", vs.len()),
        }
        // Longer prefixes single each one out.
        for v in vs {
            assert_eq!(env.resolve(&v.to_string()[..16]).unwrap(), *v);
        }
    }
    assert!(matches!(
        env.resolve("0123456789abcdef0123"),
        Err(EnvError::UnknownVersion(_))
    ));
}

/// The nodes of a node block: id, hash and encoding of each. Each entry is the node's id
/// (8 bytes, little endian), its length (4), its hash (32) and its encoding.
fn block_entries(data: &[u8]) -> Vec<(i64, &[u8], &[u8])> {
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.is_empty() {
        let id = i64::from_le_bytes(rest[..8].try_into().unwrap());
        let len = u32::from_le_bytes(rest[8..12].try_into().unwrap()) as usize;
        out.push((id, &rest[12..44], &rest[44..44 + len]));
        rest = &rest[44 + len..];
    }
    out
}

/// The values of the first column of `query`'s rows.
fn column(conn: &rusqlite::Connection, query: &str) -> Vec<Vec<u8>> {
    conn.prepare(query)
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<rusqlite::Result<_>>()
        .unwrap()
}

/// Takes an environment written in the current layout back to an earlier one.
fn downgrade(conn: &rusqlite::Connection, layout: u32) {
    // Layout 3 kept the nodes of an operation in a block of their own...
    let blocks = column(conn, "SELECT nodes FROM ops WHERE nodes IS NOT NULL");
    for data in blocks {
        let entries = block_entries(&data);
        conn.execute(
            "INSERT INTO node_blocks(first, last, data) VALUES (?1, ?2, ?3)",
            rusqlite::params![entries[0].0, entries[entries.len() - 1].0, data],
        )
        .unwrap();
    }
    // ...moved the `heads` table with every operation, and the log did not name branches.
    conn.execute_batch(
        "BEGIN;
         ALTER TABLE ops DROP COLUMN nodes;
         ALTER TABLE ops DROP COLUMN run;
         DELETE FROM heads;
         INSERT INTO heads(name, op) SELECT branch, id FROM ops AS o
             WHERE seq = (SELECT MAX(seq) FROM ops WHERE branch = o.branch);
         ALTER TABLE ops DROP COLUMN branch;
         DELETE FROM meta WHERE name = 'heads_seq';
         UPDATE meta SET value = '3' WHERE name = 'schema';
         COMMIT;",
    )
    .unwrap();
    if layout == 3 {
        return;
    }
    // Layout 2 kept the operations no run covers in a table of their own.
    conn.execute_batch(
        "BEGIN;
         CREATE TABLE op_tail(id BLOB PRIMARY KEY, seq INTEGER NOT NULL) WITHOUT ROWID;
         INSERT INTO op_tail SELECT id, seq FROM ops
             WHERE seq > (SELECT COALESCE(MAX(last), 0) FROM op_runs);
         UPDATE meta SET value = '2' WHERE name = 'schema';
         COMMIT;",
    )
    .unwrap();
    if layout == 2 {
        return;
    }
    // Layout 1: the ids indexed by a UNIQUE column, no runs, no tail...
    conn.execute_batch(
        "BEGIN;
         CREATE TABLE ops_v1(seq INTEGER PRIMARY KEY, id BLOB NOT NULL UNIQUE, root INTEGER NOT NULL, record BLOB NOT NULL);
         INSERT INTO ops_v1 SELECT * FROM ops;
         DROP TABLE ops;
         ALTER TABLE ops_v1 RENAME TO ops;
         DROP TABLE op_runs;
         DROP TABLE op_tail;
         UPDATE meta SET value = '1' WHERE name = 'schema';
         COMMIT;",
    )
    .unwrap();
    // And a row per tree node, as before node blocks.
    let blocks = column(conn, "SELECT data FROM node_blocks");
    let mut moved = 0;
    for data in blocks {
        for (id, hash, bytes) in block_entries(&data) {
            conn.execute(
                "INSERT INTO nodes(id, hash, data) VALUES (?1, ?2, ?3)",
                rusqlite::params![id, hash, bytes],
            )
            .unwrap();
            moved += 1;
        }
    }
    conn.execute("DELETE FROM node_blocks", []).unwrap();
    assert!(moved > ACTS, "{moved} nodes");
}

#[test]
fn an_environment_in_an_earlier_layout_opens_and_migrates() {
    for layout in [1, 2, 3] {
        let home = tempfile::tempdir().unwrap();
        let (env, versions) = grown(home.path());
        let from = env.head("main").unwrap();
        env.create_branch(&actor(), "side", &from).unwrap();
        let branches = env.branches().unwrap();
        drop(env);
        let conn = rusqlite::Connection::open(home.path().join("env.db")).unwrap();
        downgrade(&conn, layout);
        drop(conn);
        let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
        assert_all_found(&env, &versions);
        assert_eq!(
            env.branches().unwrap(),
            branches,
            "layout {layout}: the heads"
        );
        env.verify(&environment_core::ActorId::system()).unwrap();
        let old_index: i64 = sql(
            home.path(),
            "SELECT COUNT(*) FROM sqlite_master WHERE tbl_name = 'ops' AND type = 'index'",
        );
        assert_eq!(
            old_index, 0,
            "layout {layout}: the B-tree over the ids is gone"
        );
        let tail_table: i64 = sql(
            home.path(),
            "SELECT COUNT(*) FROM sqlite_master WHERE name = 'op_tail'",
        );
        assert_eq!(tail_table, 0, "layout {layout}: the tail's table is gone");
        let schema: String = sql(home.path(), "SELECT value FROM meta WHERE name = 'schema'");
        assert_eq!(schema, "4", "from layout {layout}");
        // The writer goes on from the migrated index and heads; `side` stays where it was.
        let more = count_up(&env, "after migration", 300);
        assert_all_found(&env, &more);
        assert_eq!(env.head("main").unwrap(), more[299].0);
        assert_eq!(env.branches().unwrap()[1], branches[1]);
        env.verify(&environment_core::ActorId::system()).unwrap();
    }
}

#[test]
fn verify_reports_an_operation_missing_from_the_index() {
    for damage in [
        "DELETE FROM op_runs WHERE first = (SELECT MIN(first) FROM op_runs)",
        "UPDATE op_runs SET entries = substr(entries, 17) WHERE first = (SELECT MIN(first) FROM op_runs)",
    ] {
        let home = tempfile::tempdir().unwrap();
        let (env, _) = grown(home.path());
        env.verify(&environment_core::ActorId::system()).unwrap();
        let conn = rusqlite::Connection::open(home.path().join("env.db")).unwrap();
        let changed = conn.execute(damage, []).unwrap();
        assert_eq!(changed, 1, "{damage}");
        let err = env
            .verify(&environment_core::ActorId::system())
            .unwrap_err();
        assert!(
            matches!(&err, EnvError::Integrity { at, .. } if at.contains("operation index")),
            "{damage}: {err:?}"
        );
    }
}
