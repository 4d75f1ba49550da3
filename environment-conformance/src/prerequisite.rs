//! Tests that need a server (PostgreSQL, an S3-compatible store) learn where it is from the
//! environment. Under `CI=true` (CI sets it and starts the servers) a missing one fails the
//! test, since a skip there would report success for a test that never ran; elsewhere the test
//! says SKIPPED and why.

/// The variable naming a PostgreSQL server for tests, as a libpq connection string
/// (`host=/run/pg port=5432 user=env dbname=postgres`). `.ci/run` starts one and sets it.
pub const POSTGRES: &str = "ENVIRONMENT_TEST_POSTGRES";

/// The connection string of the test PostgreSQL server, or `None` after reporting it missing
/// (a panic under `CI=true`).
pub fn postgres() -> Option<String> {
    named(
        POSTGRES,
        "no PostgreSQL server (.ci/run starts one and sets it)",
    )
}

/// A prerequisite of the test is missing: fails under `CI=true`, says SKIPPED elsewhere.
pub fn missing(reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("a prerequisite is missing under CI=true: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
}

/// The variable naming the same test server over TCP with TLS required, as a libpq string
/// (`host=localhost port=5433 user=env dbname=postgres sslmode=require`).
pub const POSTGRES_TLS: &str = "ENVIRONMENT_TEST_POSTGRES_TLS";

/// The variable naming the CA certificate (PEM) that signed that server's certificate.
pub const POSTGRES_CA: &str = "ENVIRONMENT_TEST_POSTGRES_CA";

/// The TLS connection string of the test server and its CA file, or `None` after reporting
/// them missing (a panic under `CI=true`).
pub fn postgres_tls() -> Option<(String, std::path::PathBuf)> {
    let what = "no PostgreSQL server over TLS (.ci/run starts one and sets it)";
    let url = named(POSTGRES_TLS, what)?;
    let ca = named(POSTGRES_CA, what)?;
    Some((url, ca.into()))
}

/// The variable naming an S3-compatible bucket for tests, as `s3://BUCKET` (its endpoint and
/// credentials in the usual `AWS_*` variables). `.ci/run` starts a server and sets them.
pub const S3: &str = "ENVIRONMENT_TEST_S3";

/// The address of the test bucket, or `None` after reporting it missing (a panic under
/// `CI=true`).
pub fn s3() -> Option<String> {
    named(
        S3,
        "no S3-compatible bucket (.ci/run starts a server and sets it)",
    )
}

/// The value of `var`, or `None` after reporting that it names `what`.
fn named(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(value) if !value.trim().is_empty() => Some(value),
        _ => {
            missing(&format!("{var} names {what}"));
            None
        }
    }
}
