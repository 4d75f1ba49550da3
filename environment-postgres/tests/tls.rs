//! The queue over TLS to a server on another machine (here a loopback port): the connection is
//! encrypted and the server's certificate checked, so a server nothing trusted vouches for is
//! refused and nothing is written; a machine in the middle that declines TLS is never spoken
//! to in clear; a CA file that holds no certificate is refused at once.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use environment_core::{ErrorKind, Queue};
use environment_postgres::{PgError, PgQueue, PgQueueConfig};

/// The TLS server in a fresh schema, its CA file, and the schema's server over the socket
/// (to look from the server's side).
fn fresh_tls(test: &str) -> Option<(postgres::Config, std::path::PathBuf, postgres::Config)> {
    let (url, ca) = environment_conformance::prerequisite::postgres_tls()?;
    let local = common::fresh(test)?;
    let mut tls: postgres::Config = url.parse().unwrap();
    tls.options(local.get_options().unwrap());
    Some((tls, ca, local))
}

fn config(name: &str, ca: Option<std::path::PathBuf>) -> PgQueueConfig {
    PgQueueConfig {
        application_name: name.to_owned(),
        ca_file: ca,
        connect_timeout: Duration::from_secs(3),
        ..PgQueueConfig::default()
    }
}

#[test]
fn a_queue_over_tls_checks_the_server_and_is_encrypted() {
    let Some((tls, ca, local)) = fresh_tls("tls") else {
        return;
    };
    let name = format!("tls-{:08x}", rand::random::<u32>());
    let queue = PgQueue::open(tls, config(&name, Some(ca))).unwrap();
    queue.subscribe("workers", &["tasks".to_owned()]).unwrap();
    queue
        .publish("tasks", b"over tls".to_vec(), Default::default())
        .unwrap();
    let leases = queue
        .claim("workers", "w", 1, Duration::from_secs(30))
        .unwrap();
    assert_eq!(leases[0].message.payload, b"over tls");

    // From the server's side: every session of this queue is encrypted.
    let mut admin = local.connect(postgres::NoTls).unwrap();
    let rows = admin
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
             WHERE a.application_name = $1",
            &[&name],
        )
        .unwrap();
    assert!(!rows.is_empty(), "the queue's sessions are on the server");
    assert!(
        rows.iter().all(|r| r.get::<_, bool>(0)),
        "every session is encrypted"
    );
}

#[test]
fn a_server_no_trusted_ca_vouches_for_is_refused_and_nothing_is_written() {
    let Some((tls, ca, local)) = fresh_tls("tls_refused") else {
        return;
    };
    // Trusting another CA (one with the same name as the server's): the server is not who it
    // says. Even with TLS only preferred (the default), it is refused rather than spoken to in
    // clear.
    let mut tls = tls;
    tls.ssl_mode(postgres::config::SslMode::Prefer);
    let impostor = ca.with_file_name("other-ca.crt");
    let err = PgQueue::open(tls, config("tls-refused", Some(impostor))).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let mut admin = local.connect(postgres::NoTls).unwrap();
    let tables: i64 = admin
        .query_one(
            "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()",
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(tables, 0, "no migration ran over the refused connection");
}

#[test]
fn a_ca_file_without_a_certificate_is_refused_at_once() {
    let Some((tls, _, _)) = fresh_tls("tls_bad_ca") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("ca.pem");
    std::fs::write(&empty, "not a certificate\n").unwrap();
    for ca in [empty, dir.path().join("missing.pem")] {
        let err = PgQueue::open(tls.clone(), config("tls-bad-ca", Some(ca))).unwrap_err();
        assert!(matches!(err, PgError::Tls(_)), "{err}");
        assert_eq!(err.kind(), ErrorKind::Invalid);
    }
}

/// A machine in the middle that answers the client's TLS request with "no": under the default
/// `sslmode` the client must give up, never send its startup message (user, database) in
/// clear.
#[test]
fn a_server_that_declines_tls_is_never_spoken_to_in_clear() {
    use std::io::{Read, Write};
    let Some((_, ca)) = environment_conformance::prerequisite::postgres_tls() else {
        return;
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let middle = std::thread::spawn(move || {
        let mut heard = Vec::new();
        if let Ok((mut conn, _)) = listener.accept() {
            let mut request = [0u8; 8];
            conn.read_exact(&mut request).unwrap();
            assert_eq!(request, [0, 0, 0, 8, 4, 210, 22, 47], "an SSLRequest first");
            conn.write_all(b"N").unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
            let _ = conn.read_to_end(&mut heard);
        }
        heard
    });
    let server: postgres::Config = format!("host=127.0.0.1 port={port} user=envtest dbname=secret")
        .parse()
        .unwrap();
    let err = PgQueue::open(server, config("tls-declined", Some(ca))).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let heard = middle.join().unwrap();
    assert!(
        heard.is_empty(),
        "spoke in clear after TLS was declined: {heard:?}"
    );
}

/// The CA named in the connection string itself (`sslrootcert`, as psql reads it) is the one
/// the server's certificate is checked against, for every store: the server's own CA lets
/// them in, an impostor CA keeps them out.
#[test]
fn the_connection_string_names_the_ca_to_check_the_server_with() {
    use environment_postgres::{PgEffectStore, PgPolicyStore, PgStoreConfig};
    let Some((url, ca)) = environment_conformance::prerequisite::postgres_tls() else {
        return;
    };
    let Some(local) = common::fresh("tls_sslrootcert") else {
        return;
    };
    let options = local.get_options().unwrap();
    let string =
        |ca: &std::path::Path| format!("{url} options='{options}' sslrootcert='{}'", ca.display());
    let none = PgQueueConfig {
        ca_file: None,
        connect_timeout: Duration::from_secs(3),
        ..PgQueueConfig::default()
    };
    let queue = PgQueue::connect(&string(&ca), none.clone()).unwrap();
    queue.subscribe("workers", &["tasks".to_owned()]).unwrap();
    let stores = PgStoreConfig {
        ca_file: None,
        ..PgStoreConfig::default()
    };
    PgPolicyStore::connect(&string(&ca), stores.clone()).unwrap();
    PgEffectStore::connect(&string(&ca), stores.clone()).unwrap();

    let impostor = ca.with_file_name("other-ca.crt");
    let err = PgQueue::connect(&string(&impostor), none).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(PgPolicyStore::connect(&string(&impostor), stores.clone()).is_err());
    assert!(PgEffectStore::connect(&string(&impostor), stores).is_err());
    let err = PgQueue::connect(
        "host=db sslrootcert='/unterminated",
        PgQueueConfig::default(),
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Invalid, "{err}");
}
