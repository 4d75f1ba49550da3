//! The one error type of the bus.

use std::sync::Arc;

use environment_core::ErrorKind;

use crate::types::Receipt;

/// Everything that can go wrong on the bus. Refusals (bad input, stale receipts, unknown names)
/// are detected before anything is written: an operation that returns one changed nothing.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum BusError {
    /// No topic of that name exists; create it with
    /// [`Bus::create_topic`](crate::Bus::create_topic).
    #[error("unknown topic {topic:?}")]
    UnknownTopic {
        /// The name asked for.
        topic: String,
    },
    /// No consumer group of that name exists.
    #[error("unknown consumer group {group:?}")]
    UnknownGroup {
        /// The name asked for.
        group: String,
    },
    /// A topic, group, consumer, dedup id, ordering key or header is empty, too long or contains
    /// characters outside the allowed set.
    #[error("invalid {what} {value:?}: {rule}")]
    InvalidName {
        /// Which kind of name.
        what: &'static str,
        /// The offending value (truncated to 200 characters).
        value: String,
        /// The rule it broke.
        rule: &'static str,
    },
    /// The group exists already with different settings.
    #[error("consumer group {group:?} exists with max_attempts {existing}, not {requested}")]
    GroupConflict {
        /// The group.
        group: String,
        /// Its stored max_attempts.
        existing: u32,
        /// What was asked for.
        requested: u32,
    },
    /// A payload larger than [`Limits::max_payload_bytes`](crate::Limits::max_payload_bytes).
    #[error("payload of {size} bytes exceeds the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The payload's size.
        size: usize,
        /// The configured limit.
        limit: usize,
    },
    /// A lease, delay, window or count outside its allowed range.
    #[error("{what} of {value} is out of range (allowed {min}..={max})")]
    OutOfRange {
        /// Which parameter.
        what: &'static str,
        /// The value given (milliseconds for durations).
        value: u128,
        /// The smallest value allowed.
        min: u128,
        /// The largest value allowed.
        max: u128,
    },
    /// The receipt names no delivery the bus knows (never issued, malformed, or purged).
    #[error("unknown receipt {receipt}")]
    UnknownReceipt {
        /// The receipt presented.
        receipt: String,
    },
    /// The receipt was valid once, but the delivery has since been claimed again, acked, nacked,
    /// terminated or dead-lettered. Nothing was changed.
    #[error("stale receipt {receipt}: the delivery was settled or claimed again since")]
    StaleReceipt {
        /// The receipt presented.
        receipt: Receipt,
    },
    /// The receipt is current, but the delivery was claimed by another consumer than the one
    /// settling it (a receipt that leaked). Nothing was changed.
    #[error("receipt {receipt} was not handed to {consumer}: another consumer claimed it")]
    NotYourReceipt {
        /// The receipt presented.
        receipt: Receipt,
        /// Who presented it.
        consumer: String,
    },
    /// The receipt is of another consumer group than the one to claim the next message from
    /// (an ack-and-claim-next continues in the group it acks in). Nothing was changed.
    #[error("receipt {receipt} is not of group {group:?}")]
    OtherGroup {
        /// The receipt presented.
        receipt: Receipt,
        /// The group named.
        group: String,
    },
    /// No dead letter with that message id in that group.
    #[error("no dead letter for message {message} in group {group:?}")]
    NoSuchDeadLetter {
        /// The group.
        group: String,
        /// The message id.
        message: i64,
    },
    /// The database said no.
    #[error("sqlite error while {context}: {source}")]
    Sqlite {
        /// What the bus was doing.
        context: &'static str,
        /// The underlying error (shared so that one failed group commit can be reported to
        /// every caller in it).
        #[source]
        source: Arc<rusqlite::Error>,
    },
    /// The database holds something this version cannot read.
    #[error("corrupt bus data: {detail}")]
    Corrupt {
        /// What was wrong.
        detail: String,
    },
    /// The writer thread is gone (the bus was shut down or the thread died).
    #[error("the bus writer thread has stopped")]
    WriterStopped,
    /// Opening the database or starting the writer failed.
    #[error("cannot open bus at {path}: {message}")]
    Open {
        /// The database file.
        path: String,
        /// Why.
        message: String,
    },
}

/// Results of bus operations.
pub type Result<T> = std::result::Result<T, BusError>;

/// Attaches a context to a rusqlite result.
pub(crate) trait SqlContext<T> {
    fn ctx(self, context: &'static str) -> Result<T>;
}

impl<T> SqlContext<T> for rusqlite::Result<T> {
    fn ctx(self, context: &'static str) -> Result<T> {
        self.map_err(|e| BusError::Sqlite {
            context,
            source: Arc::new(e),
        })
    }
}

impl BusError {
    /// What kind of failure it is (see [`ErrorKind`]).
    pub fn kind(&self) -> ErrorKind {
        match self {
            BusError::InvalidName { .. }
            | BusError::OtherGroup { .. }
            | BusError::PayloadTooLarge { .. }
            | BusError::OutOfRange { .. } => ErrorKind::Invalid,
            BusError::UnknownTopic { .. }
            | BusError::UnknownGroup { .. }
            | BusError::UnknownReceipt { .. }
            | BusError::NoSuchDeadLetter { .. } => ErrorKind::NotFound,
            BusError::StaleReceipt { .. } | BusError::GroupConflict { .. } => ErrorKind::Conflict,
            BusError::NotYourReceipt { .. } => ErrorKind::Denied,
            BusError::Corrupt { .. } => ErrorKind::Corrupt,
            BusError::WriterStopped => ErrorKind::Unavailable,
            BusError::Sqlite { .. } | BusError::Open { .. } => ErrorKind::Internal,
        }
    }
}
