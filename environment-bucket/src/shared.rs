//! The bucket as the blob store every machine of an environment shares: core's
//! [`SharedBlobs`] port, given to an environment as `Options::shared_blobs`.

use std::collections::HashSet;
use std::ops::ControlFlow;
use std::sync::{Arc, mpsc};

use environment_core::error::ErrorKind;
use environment_core::{BlobStore, Hash, PortError, ShareWindow, SharedBlobs};
use futures_util::{StreamExt, TryStreamExt};

use crate::blobs::IN_FLIGHT;
use crate::error::BucketError;
use crate::{Bucket, BucketOptions, WriteWindow};

/// How many bytes of blobs are read from this machine's store and sent in one go: a large
/// file's chunks are not all held in memory at once, and a tree of small files is sent in
/// batches of thousands, each waiting for the bucket once per round of requests.
const BATCH_BYTES: usize = 64 << 20;

/// How many blobs are fetched at once for a reader of many (a new working copy). More than a
/// writer sends: S3 serves more reads than writes a second on one prefix, and a new copy of a
/// tree of small files is otherwise spent waiting; the caller bounds the bytes asked for in
/// one go (see `BlobStore::obtain_all`).
const FETCH_IN_FLIGHT: usize = 256;

/// A bucket shared by the machines of one environment, with the runtime its calls run on.
///
/// The environment's ports are blocking and may be called from an async runtime's threads:
/// each call runs on this adapter's own runtime and is waited for.
///
/// ```no_run
/// use std::sync::Arc;
/// use environment_bucket::{BucketOptions, SharedBucket};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let home = std::path::Path::new("/var/lib/env/home");
/// // The home's blob store is this machine's cache of the bucket.
/// let bucket = SharedBucket::open("s3://team-env/blobs", BucketOptions::new(home.join("blobs")))?;
/// let options = environment_core::Options {
///     shared_blobs: Some(Arc::new(bucket)),
///     ..environment_core::Options::default()
/// };
/// # let _ = options;
/// # Ok(()) }
/// ```
pub struct SharedBucket {
    bucket: Arc<Bucket>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for SharedBucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedBucket")
            .field("bucket", &self.bucket)
            .finish_non_exhaustive()
    }
}

/// An environment's runtime may be dropped from async code: this one is let go without
/// blocking.
impl Drop for SharedBucket {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

fn closed() -> PortError {
    PortError::new(
        ErrorKind::Unavailable,
        "the bucket's runtime stopped",
        "open the environment again",
    )
}

impl SharedBucket {
    /// Opens the bucket at `url` (see [`Bucket::open`]). Give it the environment home's
    /// blob directory (`HOME/blobs`) as its cache, so a blob is kept once on this machine.
    pub fn open(url: &str, options: BucketOptions) -> Result<SharedBucket, BucketError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("bucket")
            .enable_all()
            .build()
            .map_err(|e| BucketError::Config {
                url: url.to_owned(),
                reason: format!("no runtime for the bucket's calls: {e}"),
            })?;
        let url_owned = url.to_owned();
        let bucket = wait(
            &runtime,
            async move { Bucket::open(&url_owned, options).await },
        )
        .ok_or_else(|| BucketError::Config {
            url: url.to_owned(),
            reason: "the bucket's runtime stopped".into(),
        })??;
        Ok(SharedBucket {
            bucket: Arc::new(bucket),
            runtime: Some(runtime),
        })
    }

    /// The bucket itself.
    pub fn bucket(&self) -> &Arc<Bucket> {
        &self.bucket
    }

    /// Runs `work` on the bucket's runtime and waits for it.
    fn run<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T, BucketError>> + Send + 'static,
    ) -> Result<T, PortError> {
        let runtime = self.runtime.as_ref().ok_or_else(closed)?;
        wait(runtime, work)
            .ok_or_else(closed)?
            .map_err(|e| e.port())
    }
}

/// Runs `work` on `runtime` and blocks the calling thread (which may belong to another
/// runtime) until it ends; `None` when the runtime stopped first.
fn wait<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    work: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    let (reply, answer) = mpsc::sync_channel(1);
    runtime.spawn(async move {
        let _ = reply.send(work.await);
    });
    answer.recv().ok()
}

/// Closes a semaphore when dropped: whoever waits on it gives up.
struct CloseOnDrop<'s>(&'s tokio::sync::Semaphore);

impl Drop for CloseOnDrop<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

/// A blob downloaded, or `None` when the bucket lacks it.
fn found(downloaded: Result<Vec<u8>, BucketError>) -> Result<Option<Vec<u8>>, BucketError> {
    match downloaded {
        Ok(bytes) => Ok(Some(bytes)),
        Err(BucketError::Missing(_)) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The bucket's write window, as the port checks it.
struct Window(Arc<WriteWindow>);

impl ShareWindow for Window {
    fn check(&self) -> Result<(), PortError> {
        self.0.check().map_err(|e| e.port())
    }
}

/// A step of a collection running on the bucket's runtime, for the thread that called it.
enum Step {
    /// The collection has announced itself: the live set, please.
    Live(tokio::sync::oneshot::Sender<Result<HashSet<Hash>, PortError>>),
    /// It ended.
    Done(Result<crate::SweepReport, BucketError>),
}

impl SharedBlobs for SharedBucket {
    fn share(&self, local: &BlobStore, hashes: &[Hash]) -> Result<Box<dyn ShareWindow>, PortError> {
        // One window, opened before the first blob is sent, for every batch.
        let window = Arc::new(self.bucket.window());
        let mut rest = hashes;
        while !rest.is_empty() {
            let mut blobs = Vec::new();
            let mut bytes = 0;
            while bytes < BATCH_BYTES && blobs.len() < rest.len() {
                let blob = local
                    .get(&rest[blobs.len()])
                    .map_err(|e| BucketError::from(e).port())?;
                bytes += blob.len();
                blobs.push(blob);
            }
            let (batch, later) = rest.split_at(blobs.len());
            rest = later;
            let (bucket, window, batch) = (self.bucket.clone(), window.clone(), batch.to_vec());
            // `local` is this machine's store, which keeps them already.
            self.run(async move {
                let slices: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
                bucket.send_many(&window, &slices, &batch).await
            })?;
        }
        Ok(Box::new(Window(window)))
    }

    fn fetch(&self, hash: &Hash) -> Result<Option<Vec<u8>>, PortError> {
        let (bucket, hash) = (self.bucket.clone(), *hash);
        // The environment's store keeps what it fetches: not cached here a second time.
        self.run(async move { found(bucket.download(&hash).await) })
    }

    fn fetch_each(
        &self,
        hashes: &[Hash],
        keep: &mut dyn FnMut(Hash, Option<Vec<u8>>) -> ControlFlow<()>,
    ) -> Result<(), PortError> {
        let runtime = self.runtime.as_ref().ok_or_else(closed)?;
        // The blobs come back over a channel as they arrive; a permit per blob fetched and
        // not yet kept bounds what is held in memory when keeping is slower than fetching.
        let permits = Arc::new(tokio::sync::Semaphore::new(FETCH_IN_FLIGHT));
        let (arrived, next) = mpsc::channel();
        let (bucket, wanted, held) = (self.bucket.clone(), hashes.to_vec(), permits.clone());
        runtime.spawn(async move {
            let mut fetched = futures_util::stream::iter(wanted)
                .map(|hash| {
                    let (bucket, held) = (bucket.clone(), held.clone());
                    async move {
                        // Given back by the thread that keeps the blob; closed when it stopped,
                        // and then nothing more is asked of the bucket.
                        let Ok(permit) = held.acquire().await else {
                            return None;
                        };
                        permit.forget();
                        Some((hash, found(bucket.download(&hash).await)))
                    }
                })
                .buffer_unordered(FETCH_IN_FLIGHT);
            while let Some(Some(blob)) = fetched.next().await {
                if arrived.send(blob).is_err() {
                    // The caller stopped: the requests still in flight are dropped with it.
                    return;
                }
            }
        });
        // However this ends, the downloads not started yet are not started.
        let _stop = CloseOnDrop(&permits);
        for _ in 0..hashes.len() {
            let (hash, blob) = next.recv().map_err(|_| closed())?;
            // Given back before the blob is kept, so a download is always free to go on while
            // this thread works (or stops).
            permits.add_permits(1);
            if keep(hash, blob.map_err(|e| e.port())?).is_break() {
                break;
            }
        }
        Ok(())
    }

    fn missing(&self, hashes: &[Hash]) -> Result<Vec<Hash>, PortError> {
        let (bucket, hashes) = (self.bucket.clone(), hashes.to_vec());
        self.run(async move {
            futures_util::stream::iter(hashes)
                .map(|h| {
                    let bucket = bucket.clone();
                    async move { Ok::<_, BucketError>((!bucket.contains(&h).await?).then_some(h)) }
                })
                .buffer_unordered(IN_FLIGHT)
                .try_filter_map(|h| async move { Ok(h) })
                .try_collect()
                .await
        })
    }

    fn collect(
        &self,
        live: &mut dyn FnMut() -> Result<HashSet<Hash>, PortError>,
    ) -> Result<u64, PortError> {
        let runtime = self.runtime.as_ref().ok_or_else(closed)?;
        let (steps, next) = mpsc::channel::<Step>();
        let bucket = self.bucket.clone();
        runtime.spawn(async move {
            let asking = steps.clone();
            let result = bucket
                .sweep(|| async move {
                    let (reply, answer) = tokio::sync::oneshot::channel();
                    asking.send(Step::Live(reply)).map_err(|_| closed())?;
                    answer.await.map_err(|_| closed())?
                })
                .await;
            let _ = steps.send(Step::Done(result));
        });
        // The live set is read on this thread, when the collection asks for it.
        loop {
            match next.recv().map_err(|_| closed())? {
                Step::Live(reply) => {
                    let _ = reply.send(live());
                }
                Step::Done(result) => return result.map(|r| r.removed).map_err(|e| e.port()),
            }
        }
    }
}
