//! What can go wrong with blobs in a bucket.

use std::time::Duration;

use environment_core::Hash;
use environment_core::error::{BlobError, ErrorKind, PortError};

/// An error of the bucket store.
#[derive(Debug, thiserror::Error)]
pub enum BucketError {
    /// The bucket's address or settings cannot be used.
    #[error("bucket {url:?}: {reason}")]
    Config {
        /// The address given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The object store refused or could not be reached.
    #[error("bucket: {what} {key}: {source}")]
    Store {
        /// What was being done (`put`, `get`, `head`, `list`, `delete`).
        what: &'static str,
        /// The object's key.
        key: String,
        /// The object store's own error.
        source: object_store::Error,
    },
    /// No blob with this hash is in the bucket.
    #[error("blob {0} is not in the bucket")]
    Missing(Hash),
    /// The object under a blob's name does not hash to it: it was damaged or replaced.
    #[error("blob {expected} in the bucket is damaged: its content hashes to {actual}")]
    Damaged {
        /// The blob's name.
        expected: Hash,
        /// What the object's bytes hash to.
        actual: Hash,
    },
    /// The local cache failed.
    #[error(transparent)]
    Cache(#[from] BlobError),
    /// A write window stayed open longer than a collection spares young blobs: the blobs it
    /// stored may have been collected meanwhile, so the operation must not commit on them.
    /// Store them again in a new window.
    #[error(
        "the write window was open {open:?}, longer than the {limit:?} a collection spares \
         young blobs: store the blobs again in a new window before committing"
    )]
    WindowClosed {
        /// How long the window was open.
        open: Duration,
        /// How long it may be.
        limit: Duration,
    },
    /// A collection ran past its time, or could not re-stamp its marker in time: it stopped
    /// before removing anything else, and what it had not removed stays.
    #[error(
        "the collection ran {ran:?} (it may run {limit:?}) or fell behind stamping its marker: \
         it stopped, nothing else removed"
    )]
    SweepTooSlow {
        /// How long it had run.
        ran: Duration,
        /// How long it may run.
        limit: Duration,
    },
    /// A collection did its work (the report says what it removed) but could not remove its
    /// marker, or those of collections that died: a marker left goes stale within five beats.
    #[error("the collection removed {} blob(s) but could not tidy its markers: {source}", report.removed)]
    Untidy {
        /// What the collection did.
        report: crate::SweepReport,
        /// Why the markers stayed.
        source: Box<BucketError>,
    },
    /// Another machine's collection kept running while a writer waited for it to end.
    #[error("a collection on another machine is still running after {waited:?}")]
    SweepInProgress {
        /// How long the writer waited.
        waited: Duration,
    },
    /// The environment could not say which blobs live: the collection removed nothing.
    #[error("the environment could not say which blobs live: {0}")]
    Live(PortError),
}

impl From<PortError> for BucketError {
    fn from(e: PortError) -> BucketError {
        BucketError::Live(e)
    }
}

impl BucketError {
    /// This error as core's ports report it.
    pub fn port(&self) -> PortError {
        let (kind, next) = match self {
            BucketError::Config { .. } => {
                (ErrorKind::Invalid, "fix the bucket's address or settings")
            }
            BucketError::Store { .. } | BucketError::SweepInProgress { .. } => (
                ErrorKind::Unavailable,
                "try again; if it persists, check that the bucket answers",
            ),
            BucketError::Missing(_) => {
                (ErrorKind::NotFound, "refer to content some machine stored")
            }
            BucketError::Damaged { .. } => (
                ErrorKind::Corrupt,
                "stop and tell a human: an object in the bucket was damaged or replaced",
            ),
            BucketError::WindowClosed { .. } => (
                ErrorKind::Unavailable,
                "try the action again: its blobs are stored again in a new window",
            ),
            BucketError::Live(e) => return e.clone(),
            BucketError::Cache(e) => (e.kind(), "check this machine's disk"),
            BucketError::SweepTooSlow { .. } | BucketError::Untidy { .. } => {
                (ErrorKind::Unavailable, "run the collection again later")
            }
        };
        PortError::new(kind, self.to_string(), next)
    }
}

impl BucketError {
    pub(crate) fn store(
        what: &'static str,
        key: &object_store::path::Path,
    ) -> impl FnOnce(object_store::Error) -> BucketError {
        let key = key.to_string();
        move |source| BucketError::Store { what, key, source }
    }
}
