//! Two workspaces, as on two machines, sharing one queue and one policy through PostgreSQL: a
//! task published in one is claimed and acknowledged in the other; rules loaded in one govern
//! the other, whose approval requests are decided in the first; a shared store named badly is
//! refused and nothing is made. With the log and the blobs shared (PostgreSQL and an S3
//! bucket), the second is a working copy attached to the first's history: each one's changes
//! reach the other, a file changed in both keeps the first and the second as refused.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::PermissionsExt;

use common::{Ws, code, envctl_in, fresh_bucket, fresh_schema};

#[test]
fn two_workspaces_share_one_queue() {
    let Some(conn) = fresh_schema() else { return };
    let planner = Ws::made_with(Some("human:alice"), &["--shared-queue", &conn]);
    let worker = Ws::made_with(Some("agent:worker"), &["--shared-queue", &conn]);
    for ws in [&planner, &worker] {
        let stores = ws.home().join("stores.toml");
        let mode = std::fs::metadata(&stores).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", stores.display());
        assert!(
            !ws.home().join("bus.db").exists(),
            "no embedded queue beside the shared one"
        );
    }

    planner.ok(&["queue", "subscribe", "workers", "tasks"]);
    planner.ok(&["queue", "publish", "tasks", "build the docs"]);
    let claimed = worker.json(&["queue", "claim", "workers", "--lease", "60"]);
    let lease = &claimed["leases"][0];
    assert_eq!(lease["payload"], "build the docs", "{claimed}");
    let receipt = lease["receipt"].as_str().unwrap().to_owned();

    // The planner's side sees who holds the task; the receipt settles nothing for anyone else.
    let held = planner.json(&["queue", "leases", "--group", "workers"]);
    assert_eq!(
        held["leases"][0]["message_id"], lease["message_id"],
        "{held}"
    );
    planner.fails(&["queue", "ack", &receipt], 4);

    worker.ok(&["queue", "ack", &receipt]);
    let held = planner.json(&["queue", "leases", "--group", "workers"]);
    assert_eq!(held["leases"], serde_json::json!([]), "{held}");
    // Nothing is left to claim on either side.
    let again = planner.json(&["--actor", "agent:worker", "queue", "claim", "workers"]);
    assert_eq!(again["leases"], serde_json::json!([]), "{again}");

    // Collection purges the shared queue too (within its retention, nothing yet); a workspace
    // with no queue has none to purge.
    let collected = planner.json(&["gc"]);
    assert_eq!(collected["queue"]["messages"], 0, "{collected}");
    let alone = Ws::new();
    assert!(alone.json(&["gc"])["queue"].is_null());
    assert!(!alone.home().join("bus.db").exists(), "gc makes no queue");
    common::also_unprivileged("two_workspaces_share_one_queue");
}

#[test]
fn two_workspaces_share_one_policy() {
    let Some(conn) = fresh_schema() else { return };
    let lead = Ws::made_with(Some("human:alice"), &["--shared-policy", &conn]);
    let agent = Ws::made_with(Some("agent:bob"), &["--shared-policy", &conn]);
    std::fs::create_dir(agent.path("release")).unwrap();

    // Rules loaded on one machine govern the other; neither keeps a policy file of its own.
    std::fs::write(lead.path("../rules.toml"), common::ALICE_AND_BOB).unwrap();
    assert_eq!(
        lead.json(&["policy", "load", "../rules.toml"])["rules"],
        common::ALICE_AND_BOB_RULES
    );
    let versions =
        |ws: &Ws| ws.json(&["--actor", "human:alice", "status"])["policy_version"].clone();
    assert_eq!(versions(&agent), versions(&lead));
    for ws in [&lead, &agent] {
        assert!(!ws.home().join("policy.db").exists(), "no embedded policy");
    }
    agent.fails(&["exec", "--", "sh", "-c", "echo 1 > README.md"], 4);
    assert_eq!(
        agent.read("README.md").as_deref(),
        Some("# demo\n"),
        "refused, restored"
    );

    // A write that needs approval, refused on the agent's machine, files a request that the
    // human decides on hers.
    agent.fails(&["exec", "--", "sh", "-c", "echo 1 > release/v1"], 4);
    let pending = lead.json(&["policy", "approvals"]);
    let request = &pending["approvals"][0];
    assert_eq!(
        (request["state"].as_str(), request["actor"].as_str()),
        (Some("pending"), Some("agent:bob")),
        "{pending}"
    );
    let id = request["id"].as_str().unwrap().to_owned();
    agent.fails(&["policy", "approvals", "grant", &id], 4);
    assert_eq!(
        lead.json(&["policy", "approvals", "grant", &id])["state"],
        "granted"
    );
    let seen = agent.json(&["--actor", "human:alice", "policy", "approvals"]);
    assert_eq!(seen["approvals"][0]["state"], "granted", "{seen}");

    // The agent may not change the policy from its machine, not even with a "first" load.
    let rules = common::ALICE_AND_BOB;
    let alice = &rules[..rules.find("[[rule]]\nid = \"bob-reads\"").unwrap()];
    let mine = format!(
        "{alice}\n[[rule]]\nid = \"all\"\neffect = \"permit\"\nprincipal = \"agent:bob\"\nactions = [\"write\"]\nresource = \"*\"\n"
    );
    std::fs::write(agent.path("../mine.toml"), mine).unwrap();
    agent.fails(&["policy", "load", "../mine.toml"], 4);
    assert_eq!(versions(&lead), versions(&agent));
    let readme = ["policy", "check", "agent:bob", "write", "path:README.md"];
    lead.fails(&readme, 4);
    // The human may, from either machine, and both see it.
    agent.ok(&["--actor", "human:alice", "policy", "load", "../mine.toml"]);
    lead.ok(&readme);

    // The shared policy out of reach: every command says so (unavailable), and nothing is
    // done unchecked.
    let stores = agent.home().join("stores.toml");
    let gone = agent.path("../no-server-here");
    let text = std::fs::read_to_string(&stores).unwrap();
    let moved = text.replace(
        &conn,
        &format!("host={} user=env dbname=env", gone.display()),
    );
    std::fs::write(&stores, moved).unwrap();
    let before = agent.read("README.md");
    for args in [
        &["log"][..],
        &["exec", "--", "sh", "-c", "echo 2 > README.md"],
        &["policy", "load", "../mine.toml"],
    ] {
        let err = agent.fails(args, 7);
        assert!(err.contains("policy"), "{args:?}: {err}");
    }
    assert_eq!(agent.read("README.md"), before, "nothing ran");
    common::also_unprivileged("two_workspaces_share_one_policy");
}

#[test]
fn two_workspaces_share_one_effect_log() {
    use environment_core::{ActorId, BeginOutcome, LocalEnvironment, Options};
    let Some(conn) = fresh_schema() else { return };
    let one = Ws::made_with(Some("human:alice"), &["--shared-effects", &conn]);
    let two = Ws::made_with(Some("human:alice"), &["--shared-effects", &conn]);
    assert_eq!(
        one.json(&["status"])["shared"],
        serde_json::json!(["effects"])
    );
    assert_eq!(Ws::new().json(&["status"])["shared"], serde_json::json!([]));
    // An agent on the second machine begins a deployment through the shared log.
    let shared = environment_postgres::PgEffectStore::connect(&conn, Default::default()).unwrap();
    let options = Options {
        effects: Some(std::sync::Arc::new(shared)),
        ..Options::default()
    };
    let env = LocalEnvironment::open(two.home(), options).unwrap();
    let agent = ActorId::new("agent:deployer").unwrap();
    let begun = env.effect_begin(&agent, "deploy-42", "https://deploy.example", b"v42");
    assert!(matches!(begun, Ok(BeginOutcome::New(_))), "{begun:?}");
    drop(env);
    // The first machine sees it in flight: a retry there would find it, not deploy again.
    let open = one.json(&["effects", "--unfinished"]);
    assert_eq!(open["effects"][0]["key"], "deploy-42", "{open}");
    assert_eq!(open["effects"][0]["actor"], "agent:deployer", "{open}");
    // Neither home keeps it in its own database.
    for ws in [&one, &two] {
        let own = LocalEnvironment::open(ws.home(), Options::default()).unwrap();
        assert!(own.effects().unwrap().is_empty());
    }
    common::also_unprivileged("two_workspaces_share_one_effect_log");
}

#[test]
fn a_shared_store_named_badly_is_refused_and_nothing_is_made() {
    let tmp = tempfile::tempdir().unwrap();
    let nowhere = tmp.path().join("no-server-here");
    for flag in ["--shared-queue", "--shared-policy", "--shared-effects"] {
        for (conn, expected) in [
            ("host=/tmp user=env password=hunter2 dbname=env", 2),
            ("postgresql://env:hunter2@localhost/env", 2),
            ("host='unterminated", 2),
            (
                &*format!(
                    "host={} user=env dbname=env connect_timeout=2",
                    nowhere.display()
                ),
                7,
            ),
        ] {
            let dir = tmp.path().join("work");
            std::fs::create_dir_all(&dir).unwrap();
            let out = envctl_in(&dir, &["init", flag, conn]);
            let err = common::stderr(&out);
            assert_eq!(code(&out), expected, "{flag} {conn}: {err}");
            assert!(
                !err.contains("hunter2"),
                "a password is never echoed: {err}"
            );
            assert!(
                !dir.join(".environment").exists(),
                "{flag} {conn}: nothing is made"
            );
        }
        // A CA file that cannot be read: refused as bad input before any connection.
        let dir = tmp.path().join("work");
        let out = common::envctl_cmd(
            &dir,
            &["init", flag, "host=127.0.0.1 port=1 user=env dbname=env"],
        )
        .env("PGSSLROOTCERT", tmp.path().join("no-such-ca.pem"))
        .output()
        .unwrap();
        assert_eq!(code(&out), 2, "{flag}: {}", common::stderr(&out));
        assert!(!dir.join(".environment").exists());
    }
    // A bucket's address with credentials in it: refused before anything is reached, never
    // echoed, nothing made.
    let dir = tmp.path().join("work");
    let out = envctl_in(
        &dir,
        &[
            "init",
            "--shared-log",
            "host=/tmp user=env dbname=env",
            "--shared-blobs",
            "s3://key:hunter2@bucket/prefix",
        ],
    );
    let err = common::stderr(&out);
    assert_eq!(code(&out), 2, "{err}");
    assert!(!err.contains("hunter2"), "a secret is never echoed: {err}");
    assert!(!dir.join(".environment").exists());
    common::also_unprivileged("a_shared_store_named_badly_is_refused_and_nothing_is_made");
}

/// A shared store over TLS, its CA named in the connection string (`sslrootcert`, as psql
/// reads it): the server's own CA lets the environment be made; an impostor's is refused as
/// unreachable, and nothing is made.
#[test]
fn a_shared_store_over_tls_checks_the_ca_its_string_names() {
    let Some((url, ca)) = environment_conformance::prerequisite::postgres_tls() else {
        return;
    };
    let Some(local) = fresh_schema() else { return };
    let options = local.split_once(" options=").unwrap().1;
    let tmp = tempfile::tempdir().unwrap();
    for (name, ca, expected) in [
        ("impostor", ca.with_file_name("other-ca.crt"), 7),
        ("server", ca, 0),
    ] {
        let conn = format!("{url} options={options} sslrootcert='{}'", ca.display());
        let dir = tmp.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let out = common::envctl_cmd(&dir, &["init", "--shared-policy", &conn])
            .env_remove("PGSSLROOTCERT")
            .output()
            .unwrap();
        assert_eq!(code(&out), expected, "{name}: {}", common::stderr(&out));
        assert_eq!(dir.join(".environment").exists(), expected == 0, "{name}");
    }
    common::also_unprivileged("a_shared_store_over_tls_checks_the_ca_its_string_names");
}

#[test]
fn working_copies_on_two_machines_share_one_history() {
    let Some(conn) = fresh_schema() else { return };
    let Some(bucket) = fresh_bucket() else { return };
    let shared = [
        "--shared-log",
        conn.as_str(),
        "--shared-blobs",
        bucket.as_str(),
    ];
    let one = Ws::made_with(Some("human:alice"), &shared);
    let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(one.path("data.bin"), &big).unwrap();
    one.ok(&["status"]);
    let stores = one.home().join("stores.toml");
    assert!(
        !one.home().join("env.db").exists(),
        "no embedded log beside the shared one"
    );

    // The second machine: a new working copy, the head written into it.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("copy");
    let out = envctl_in(
        tmp.path(),
        &[
            "--json",
            "attach",
            "--stores",
            stores.to_str().unwrap(),
            dir.to_str().unwrap(),
        ],
    );
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    let two = Ws {
        _tmp: tmp,
        dir,
        actor: Some("agent:bob"),
    };
    assert_eq!(two.read("README.md").as_deref(), Some("# demo\n"));
    assert_eq!(std::fs::read(two.path("data.bin")).unwrap(), big);
    let head = |ws: &Ws| {
        let id = ws.json(&["log", "--all", "--limit", "1"])["entries"][0]["id"].clone();
        assert!(id.is_string(), "{id}");
        id
    };
    assert_eq!(head(&one), head(&two));

    // Each one's changes reach the other; neither records deleting what it had not seen.
    std::fs::write(two.path("src/lib.rs"), "pub fn two() {}\n").unwrap();
    two.ok(&["status"]);
    std::fs::write(one.path("notes.txt"), "from one\n").unwrap();
    one.ok(&["status"]);
    assert_eq!(one.read("src/lib.rs").as_deref(), Some("pub fn two() {}\n"));
    two.ok(&["status"]);
    assert_eq!(two.read("notes.txt").as_deref(), Some("from one\n"));
    assert_eq!(one.read("README.md").as_deref(), Some("# demo\n"));

    // A file changed in both: the first commit stays, the second change is kept as refused and
    // its tree put back.
    std::fs::write(one.path("README.md"), "# one's\n").unwrap();
    std::fs::write(two.path("README.md"), "# two's\n").unwrap();
    one.ok(&["status"]);
    two.ok(&["status"]);
    assert_eq!(two.read("README.md").as_deref(), Some("# one's\n"));
    let refused = two.json(&["refused"]);
    assert_eq!(
        refused["refused"].as_array().map(Vec::len),
        Some(1),
        "{refused}"
    );
    assert_eq!(refused["refused"][0]["path"], "README.md", "{refused}");
    assert_eq!(head(&one), head(&two));
    one.ok(&["verify"]);
    two.ok(&["verify"]);

    // A second `init` on the shared log, or an attach to a directory with files, is refused
    // and makes nothing.
    let other = tempfile::tempdir().unwrap();
    std::fs::write(other.path().join("mine.txt"), "keep\n").unwrap();
    let out = envctl_in(
        other.path(),
        &["init", "--shared-log", &conn, "--shared-blobs", &bucket],
    );
    assert_eq!(code(&out), 5, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!other.path().join(".environment").exists());
    let out = envctl_in(
        other.path(),
        &[
            "attach",
            "--stores",
            stores.to_str().unwrap(),
            other.path().to_str().unwrap(),
        ],
    );
    assert_eq!(code(&out), 5, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!other.path().join(".environment").exists());
    assert_eq!(
        std::fs::read_to_string(other.path().join("mine.txt")).unwrap(),
        "keep\n"
    );
    // A shared log without shared blobs, or with blobs only this process would see, is a
    // usage error.
    for blobs in [&[][..], &["--shared-blobs", "memory:///"]] {
        let mut args = vec!["init", "--shared-log", conn.as_str()];
        args.extend_from_slice(blobs);
        let out = envctl_in(other.path(), &args);
        assert_eq!(code(&out), 2, "{}", String::from_utf8_lossy(&out.stderr));
        assert!(!other.path().join(".environment").exists());
    }
    common::also_unprivileged("working_copies_on_two_machines_share_one_history");
}
