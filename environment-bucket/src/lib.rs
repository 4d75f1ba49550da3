//! An environment's blobs and chunks in object storage, shared by several machines.
//!
//! Every blob is an immutable object named by its blake3 hash (`ROOT/blobs/HEX`), written once
//! by whichever machine first needs it and read by any other through a local read-through
//! cache (an ordinary [`environment_core::BlobStore`]). What comes back from the bucket is
//! re-hashed before it is used or cached, so a damaged or replaced object is an error, never
//! wrong content. The same code talks to S3, MinIO, R2 or any S3-compatible server through the
//! `object_store` crate; `file://` and `memory://` buckets serve one machine and tests.
//!
//! An environment takes the bucket as the blob store its machines share through
//! [`SharedBucket`] (core's `SharedBlobs` port, in `Options::shared_blobs`): an act shares its
//! blobs before it commits and checks its window just before, a machine fetches what it lacks
//! when it reads, and the environment's `gc` collects the bucket with the log's live set.
//!
//! Collecting unreferenced blobs is safe while other machines write (see `sweep`): a
//! collection spares every blob younger than a grace period and announces itself with a
//! marker object, stamped every beat while it runs; a writer commits within a quarter of the
//! grace period of storing its blobs (its [`WriteWindow`]), sends again an old blob it would
//! reuse, and then waits out any running collection and checks that every blob of its window
//! is still there.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), environment_bucket::BucketError> {
//! use environment_bucket::{Bucket, BucketOptions};
//!
//! let cache = tempfile::tempdir().unwrap();
//! let bucket = Bucket::open("memory:///", BucketOptions::new(cache.path())).await?;
//! let window = bucket.window();
//! let hash = bucket.put(&window, b"hello").await?;
//! window.check()?; // now commit the operation that refers to `hash`
//! assert_eq!(bucket.get(&hash).await?, b"hello");
//! # Ok(()) }
//! ```

mod blobs;
mod error;
mod open;
mod shared;
mod sweep;
mod window;

use std::sync::Arc;
use std::time::Duration;

use environment_core::BlobStore;
use object_store::ObjectStore;
use object_store::path::Path;

pub use error::BucketError;
pub use open::{BucketOptions, DEFAULT_GRACE};
pub use shared::SharedBucket;
pub use sweep::SweepReport;
pub use window::WriteWindow;

/// The blobs of one environment in a bucket, with this machine's cache of them.
pub struct Bucket {
    store: Arc<dyn ObjectStore>,
    /// Where the environment's objects live in the bucket.
    root: Path,
    cache: BlobStore,
    grace: Duration,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket")
            .field("store", &self.store.to_string())
            .field("root", &self.root)
            .field("grace", &self.grace)
            .finish_non_exhaustive()
    }
}
