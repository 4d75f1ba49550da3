//! The one error type of the PostgreSQL stores.

use environment_bus::BusError;
use environment_core::{ErrorKind, PortError};

/// Everything that can go wrong in a PostgreSQL store. A refusal was found before anything
/// was committed: an operation that returns one changed nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    /// The queue refused the operation, for the reason (and in the words) the embedded queue
    /// would: an unknown name, a stale receipt, a value out of range.
    #[error(transparent)]
    Refused(#[from] BusError),
    /// The server said no, or the connection broke.
    #[error("postgres error while {context}: {}", describe(.source))]
    Postgres {
        /// What the store was doing.
        context: &'static str,
        /// The underlying error.
        #[source]
        source: postgres::Error,
    },
    /// No connection could be had from the pool (the server is down or unreachable).
    #[error("cannot reach postgres: {0}")]
    Unreachable(String),
    /// The database's schema is not one this build can use.
    #[error("database schema: {0}")]
    Schema(String),
    /// A connection string that does not parse (it is not echoed: it may hold a secret).
    #[error("the connection string does not parse: {0}")]
    BadAddress(String),
    /// The TLS settings cannot be used (a CA file that cannot be read or holds no
    /// certificate).
    #[error("TLS to postgres: {0}")]
    Tls(String),
}

/// What the server said, rather than the client's bare "db error".
pub(crate) fn describe(e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// The session is gone: the socket closed or failed, or the server's last word was FATAL
/// (terminated by an operator, shut down).
pub(crate) fn session_ended(e: &postgres::Error) -> bool {
    e.is_closed()
        || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
        || e.as_db_error().is_some_and(|db| {
            matches!(db.parsed_severity(), Some(postgres::error::Severity::Fatal))
        })
}

/// Results of the PostgreSQL stores.
pub type Result<T> = std::result::Result<T, PgError>;

/// Attaches a context to a postgres result.
pub(crate) trait PgContext<T> {
    fn ctx(self, context: &'static str) -> Result<T>;
}

impl<T> PgContext<T> for std::result::Result<T, postgres::Error> {
    fn ctx(self, context: &'static str) -> Result<T> {
        self.map_err(|source| PgError::Postgres { context, source })
    }
}

impl From<r2d2::Error> for PgError {
    fn from(e: r2d2::Error) -> PgError {
        PgError::Unreachable(e.to_string())
    }
}

impl PgError {
    /// What kind of failure it is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            PgError::Refused(e) => e.kind(),
            PgError::Postgres { source, .. } if session_ended(source) => ErrorKind::Unavailable,
            PgError::Unreachable(_) => ErrorKind::Unavailable,
            PgError::Postgres { .. } => ErrorKind::Internal,
            PgError::Schema(_) => ErrorKind::Corrupt,
            PgError::Tls(_) | PgError::BadAddress(_) => ErrorKind::Invalid,
        }
    }

    /// A conflict between concurrent transactions that the same work, tried again, gets past
    /// (serialization failure, deadlock).
    pub(crate) fn retryable(&self) -> bool {
        let PgError::Postgres { source, .. } = self else {
            return false;
        };
        source.code().is_some_and(|c| {
            *c == postgres::error::SqlState::T_R_SERIALIZATION_FAILURE
                || *c == postgres::error::SqlState::T_R_DEADLOCK_DETECTED
        })
    }
}

/// The store's errors as the ports report them, each with what the caller can do next.
impl From<PgError> for PortError {
    fn from(e: PgError) -> PortError {
        match e {
            PgError::Refused(e) => PortError::from(e),
            other => {
                let next = match other.kind() {
                    ErrorKind::Unavailable => "check that the PostgreSQL server is up and retry.",
                    ErrorKind::Corrupt => {
                        "migrate the database with a build that knows its schema."
                    }
                    _ => "report the error to a human if it persists.",
                };
                PortError::new(other.kind(), other.to_string(), next)
            }
        }
    }
}
