//! Storing and reading blobs: the writer's side of the collection protocol, and the
//! read-through cache.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use environment_core::Hash;
use environment_core::error::BlobError;
use futures_util::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStoreExt, PutPayload};

use crate::error::BucketError;
use crate::{Bucket, WriteWindow};

/// How many requests a writer has in flight at once (64 made sharing 10,000 small files take
/// twice as long as 16 on the S3 server the tests use: writes contend on the server's side).
pub(crate) const IN_FLIGHT: usize = 16;

/// How often a writer looks again while a collection runs.
const WAIT_STEP: Duration = Duration::from_millis(50);

/// Milliseconds since the epoch on this machine's clock.
pub(crate) fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

pub(crate) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// When a blob the bucket already has is not sent again.
#[derive(Clone, Copy)]
enum Unless<'w> {
    /// It is young enough to be reused within this window.
    Fresh(&'w WriteWindow),
    /// It is there at all.
    There,
}

impl Bucket {
    /// Opens the window of one operation's writes: store its blobs, then
    /// [`WriteWindow::check`] it right before committing the operation that refers to them.
    pub fn window(&self) -> WriteWindow {
        WriteWindow::new(self.grace)
    }

    pub(crate) fn key(&self, hash: &Hash) -> Path {
        self.blobs_dir().join(hash.to_hex())
    }

    /// Stores `bytes` in the bucket (and in this machine's cache) and returns their hash.
    /// Content already there is not sent again unless it is old enough to be collected soon.
    pub async fn put(&self, window: &WriteWindow, bytes: &[u8]) -> Result<Hash, BucketError> {
        Ok(self.put_many(window, &[bytes]).await?[0])
    }

    /// Stores several blobs with one wait for running collections, and returns their hashes in
    /// order. The bucket is asked about (and sent) several blobs at once.
    pub async fn put_many(
        &self,
        window: &WriteWindow,
        blobs: &[&[u8]],
    ) -> Result<Vec<Hash>, BucketError> {
        let mut hashes = Vec::with_capacity(blobs.len());
        for bytes in blobs {
            hashes.push(self.cache.put_unsynced(bytes)?);
        }
        self.cache.sync()?;
        self.send_many(window, blobs, &hashes).await?;
        Ok(hashes)
    }

    /// [`Bucket::put_many`] of blobs this machine already keeps (`hashes[i]` is the hash of
    /// `blobs[i]`), which are sent without being cached again.
    pub(crate) async fn send_many(
        &self,
        window: &WriteWindow,
        blobs: &[&[u8]],
        hashes: &[Hash],
    ) -> Result<(), BucketError> {
        let all: Vec<(usize, Hash)> = hashes.iter().copied().enumerate().collect();
        self.send(blobs, all.clone(), Unless::Fresh(window)).await?;
        // A collection may have listed a blob's old copy before it was sent again (by this
        // writer or another, whose fresh copy this one then reused) and delete it after: once
        // no collection runs, every blob is looked at again, and whatever is missing is sent
        // again and waited out in turn.
        let mut check = all;
        loop {
            self.wait_for_collections().await?;
            check = self.send(blobs, check, Unless::There).await?;
            if check.is_empty() {
                return Ok(());
            }
        }
    }

    /// Uploads each blob of `which` (by its place in `blobs`) unless the bucket has it as
    /// `unless` asks, several at a time; returns those sent.
    async fn send(
        &self,
        blobs: &[&[u8]],
        which: Vec<(usize, Hash)>,
        unless: Unless<'_>,
    ) -> Result<Vec<(usize, Hash)>, BucketError> {
        futures_util::stream::iter(which)
            .map(|(at, hash)| async move {
                let has = match unless {
                    Unless::Fresh(window) => self.fresh(&hash, window).await?,
                    Unless::There => self.head(&hash).await?.is_some(),
                };
                if has {
                    return Ok(None);
                }
                self.upload(&hash, blobs[at]).await?;
                Ok(Some((at, hash)))
            })
            .buffer_unordered(IN_FLIGHT)
            .try_filter_map(|sent| async move { Ok(sent) })
            .try_collect()
            .await
    }

    /// Whether the blob is in the bucket and young enough to be reused within `window`.
    async fn fresh(&self, hash: &Hash, window: &WriteWindow) -> Result<bool, BucketError> {
        Ok(self.head(hash).await?.is_some_and(|m| {
            m.last_modified.timestamp_millis() >= now_ms() - ms(window.fresh_for())
        }))
    }

    async fn head(&self, hash: &Hash) -> Result<Option<ObjectMeta>, BucketError> {
        let key = self.key(hash);
        match self.store.head(&key).await {
            Ok(meta) => Ok(Some(meta)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(BucketError::store("head", &key)(e)),
        }
    }

    async fn upload(&self, hash: &Hash, bytes: &[u8]) -> Result<(), BucketError> {
        let key = self.key(hash);
        self.store
            .put(&key, PutPayload::from(bytes.to_vec()))
            .await
            .map_err(BucketError::store("put", &key))?;
        Ok(())
    }

    /// Returns once no collection is running. A collection re-stamps its marker while it
    /// runs, so one that died stops counting within five beats.
    async fn wait_for_collections(&self) -> Result<(), BucketError> {
        let started = Instant::now();
        // A collection runs at most half the grace period, and a dead one's marker goes stale
        // within its life; twice that life leaves room for a slow look at the markers.
        let bound = self.grace / 2 + 2 * self.marker_life();
        loop {
            if self.running_collections().await? == 0 {
                return Ok(());
            }
            if started.elapsed() > bound {
                return Err(BucketError::SweepInProgress {
                    waited: started.elapsed(),
                });
            }
            tokio::time::sleep(WAIT_STEP.min(self.beat())).await;
        }
    }

    /// How many collections have a live marker in the bucket.
    async fn running_collections(&self) -> Result<usize, BucketError> {
        let dir = self.markers_dir();
        let mut markers = self.store.list(Some(&dir));
        let mut running = 0;
        while let Some(meta) = markers.next().await {
            let meta = meta.map_err(BucketError::store("list", &dir))?;
            if meta.last_modified.timestamp_millis() >= now_ms() - ms(self.marker_life()) {
                running += 1;
            }
        }
        Ok(running)
    }

    /// Whether the blob is in the bucket.
    pub async fn contains(&self, hash: &Hash) -> Result<bool, BucketError> {
        Ok(self.head(hash).await?.is_some())
    }

    /// The blob's bytes: from this machine's cache, or fetched, checked against the hash and
    /// cached. A cached copy found damaged is fetched again.
    pub async fn get(&self, hash: &Hash) -> Result<Vec<u8>, BucketError> {
        match self.cache.get(hash) {
            Ok(bytes) => return Ok(bytes),
            Err(BlobError::Missing(_) | BlobError::Corrupt { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let fetched = self.download(hash).await?;
        // A cache, not a record: no fsync per blob (a copy lost or torn in a crash is found
        // damaged or missing when read, and fetched again).
        self.cache.put_unsynced(&fetched)?;
        Ok(fetched)
    }

    /// The blob's bytes from the bucket alone, checked against the hash and not cached (for
    /// a caller that keeps them itself).
    pub(crate) async fn download(&self, hash: &Hash) -> Result<Vec<u8>, BucketError> {
        let key = self.key(hash);
        let fetched = match self.store.get(&key).await {
            Ok(r) => r.bytes().await.map_err(BucketError::store("get", &key))?,
            Err(object_store::Error::NotFound { .. }) => return Err(BucketError::Missing(*hash)),
            Err(e) => return Err(BucketError::store("get", &key)(e)),
        };
        let actual = Hash(*blake3::hash(&fetched).as_bytes());
        if actual != *hash {
            return Err(BucketError::Damaged {
                expected: *hash,
                actual,
            });
        }
        Ok(fetched.to_vec())
    }

    /// Several blobs' bytes, in order, fetched several at a time.
    pub async fn get_many(&self, hashes: &[Hash]) -> Result<Vec<Vec<u8>>, BucketError> {
        futures_util::stream::iter(hashes)
            .map(|h| self.get(h))
            .buffered(IN_FLIGHT)
            .try_collect()
            .await
    }
}
