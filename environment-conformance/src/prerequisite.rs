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
    match std::env::var(POSTGRES) {
        Ok(url) if !url.trim().is_empty() => Some(url),
        _ => {
            missing(&format!(
                "{POSTGRES} names no PostgreSQL server (.ci/run starts one and sets it)"
            ));
            None
        }
    }
}

/// A prerequisite of the test is missing: fails under `CI=true`, says SKIPPED elsewhere.
pub fn missing(reason: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("a prerequisite is missing under CI=true: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
}
