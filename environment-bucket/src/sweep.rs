//! Collecting the blobs nothing refers to, while other machines write.
//!
//! A collection puts a marker object of its own under `ROOT/gc/`, takes the time the bucket
//! stamped on it as its start, and only then reads what is live. It removes a blob only if
//! nothing live refers to it and the bucket last wrote it more than the grace period before
//! that start. For as long as it runs it re-stamps its marker every beat; it deletes nothing
//! once two beats have passed since the last stamp that landed or half the grace period is
//! gone, and gives up on a delete request (a batch of up to 100 blobs, one DeleteObjects on S3)
//! that takes more than a beat. Then it removes its marker. A
//! marker not stamped for five beats (and the bucket's second) is a collection that died:
//! writers stop waiting for it, and the next collection removes it. So the clocks of the
//! machines and the bucket must agree within two beats (20 s by default).
//!
//! Why no blob an operation commits on is lost: a writer reuses a blob as it is only if the
//! bucket wrote it within the last quarter of the grace period, otherwise it uploads it again,
//! and it commits within a quarter of the grace period of opening its window. So an operation
//! that commits after a collection read the live set found its blobs young enough to be
//! spared, or uploaded them. The one race left, a collection that listed a blob's old copy
//! deleting it after it was sent again (by this writer, or by another whose fresh copy this
//! one reused), ends with the writer: once no marker is live it looks at every blob of the
//! window again and sends again whatever is gone. Markers are separate objects, so neither
//! side needs a conditional write, and concurrent collections are harmless.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use environment_core::Hash;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

use crate::Bucket;
use crate::blobs::{ms, now_ms};
use crate::error::BucketError;

/// How coarsely a bucket may date its objects.
const TIMESTAMP_SLACK: Duration = Duration::from_secs(1);

/// The longest beat of a running collection's marker.
const MAX_BEAT: Duration = Duration::from_secs(10);

/// How many blobs one delete request removes: small enough to land within a beat.
const DELETE_BATCH: usize = 100;

/// What a collection did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Blobs kept because something live refers to them.
    pub live: u64,
    /// Blobs nothing refers to, kept because they are younger than the grace period.
    pub young: u64,
    /// Blobs removed.
    pub removed: u64,
    /// Their size, in bytes.
    pub bytes_removed: u64,
    /// Markers of collections that died, removed.
    pub dead_markers: u64,
}

impl Bucket {
    /// How often a running collection re-stamps its marker.
    pub(crate) fn beat(&self) -> Duration {
        (self.grace / 8).min(MAX_BEAT)
    }

    /// How long after its last stamp a marker stands for a collection that may still delete.
    /// A collection deletes only within two beats of its last stamp, each delete within a beat:
    /// five beats and the bucket's second leave two beats for clock skew between a writer and
    /// the bucket (20 s with the default grace period).
    pub(crate) fn marker_life(&self) -> Duration {
        5 * self.beat() + TIMESTAMP_SLACK
    }

    /// Removes the blobs nothing refers to and that are older than the grace period.
    /// `live` is called once the collection is announced, and returns every hash that
    /// committed state refers to (as read from the shared store at that moment).
    pub async fn sweep<F, Fut, E>(&self, live: F) -> Result<SweepReport, BucketError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<HashSet<Hash>, E>>,
        BucketError: From<E>,
    {
        let marker = self
            .markers_dir()
            .join(format!("{:032x}", rand::random::<u128>()));
        let first = Instant::now();
        self.store
            .put(&marker, PutPayload::default())
            .await
            .map_err(BucketError::store("put", &marker))?;
        // The marker is stamped every beat for as long as the collection runs (reading the
        // live set and listing included); deletes stop when the stamps do.
        let stamped = Arc::new(Mutex::new(first));
        let heart = Stops(tokio::spawn(heartbeat(
            Arc::clone(&self.store),
            marker.clone(),
            Arc::clone(&stamped),
            self.beat(),
        )));
        let result = self.sweep_announced(&marker, &stamped, live).await;
        drop(heart);
        let own = self
            .store
            .delete(&marker)
            .await
            .map_err(BucketError::store("delete", &marker));
        let mut report = result?;
        // What was removed stays said when the tidying after it fails.
        let tidied = match own {
            Ok(()) => self.remove_dead_markers(&marker).await,
            Err(e) => Err(e),
        };
        match tidied {
            Ok(dead) => {
                report.dead_markers = dead;
                Ok(report)
            }
            Err(e) => Err(BucketError::Untidy {
                report,
                source: Box::new(e),
            }),
        }
    }

    async fn sweep_announced<F, Fut, E>(
        &self,
        marker: &object_store::path::Path,
        stamped: &Mutex<Instant>,
        live: F,
    ) -> Result<SweepReport, BucketError>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<HashSet<Hash>, E>>,
        BucketError: From<E>,
    {
        let started = Instant::now();
        let limit = self.grace / 2;
        // The bucket's clock, not this machine's, dates the start: blobs' ages are the bucket's.
        let start = self
            .store
            .head(marker)
            .await
            .map_err(BucketError::store("head", marker))?
            .last_modified
            .timestamp_millis();
        let live = live().await?;
        // Buckets may date objects to the second only (HTTP dates): a second more is spared.
        let spare_after = start - ms(self.grace) - ms(TIMESTAMP_SLACK);
        let mut report = SweepReport::default();
        let mut doomed = Vec::new();
        let dir = self.blobs_dir();
        let mut listing = self.store.list(Some(&dir));
        while let Some(meta) = listing.next().await {
            let meta = meta.map_err(BucketError::store("list", &dir))?;
            // Only objects named as blobs are this store's; anything else is left alone.
            let Some(hash) = meta
                .location
                .filename()
                .and_then(|n| n.parse::<Hash>().ok())
            else {
                continue;
            };
            if live.contains(&hash) {
                report.live += 1;
            } else if meta.last_modified.timestamp_millis() >= spare_after {
                report.young += 1;
            } else {
                doomed.push(meta);
            }
        }
        // Deleted in batches (one DeleteObjects request each on S3), each batch within a beat
        // and only while the stamps go on, as a single delete would be.
        for batch in doomed.chunks(DELETE_BATCH) {
            let ran = started.elapsed();
            let since_stamp = stamped.lock().map(|t| t.elapsed()).unwrap_or(Duration::MAX);
            if ran > limit || since_stamp > 2 * self.beat() {
                return Err(BucketError::SweepTooSlow { ran, limit });
            }
            let sizes: HashMap<&Path, u64> = batch.iter().map(|m| (&m.location, m.size)).collect();
            let paths: Vec<_> = batch.iter().map(|m| Ok(m.location.clone())).collect();
            let deleted: Vec<_> = match tokio::time::timeout(
                self.beat(),
                self.store
                    .delete_stream(futures_util::stream::iter(paths).boxed())
                    .collect::<Vec<_>>(),
            )
            .await
            {
                Ok(results) => results,
                Err(_) => {
                    return Err(BucketError::SweepTooSlow {
                        ran: started.elapsed(),
                        limit,
                    });
                }
            };
            for result in deleted {
                match result {
                    Ok(path) => {
                        report.removed += 1;
                        report.bytes_removed += sizes.get(&path).copied().unwrap_or(0);
                    }
                    // Another collection removed it first.
                    Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(BucketError::store("delete", &dir)(e)),
                }
            }
        }
        Ok(report)
    }

    /// Removes the markers of collections that died (unstamped for twice a marker's life).
    async fn remove_dead_markers(
        &self,
        own: &object_store::path::Path,
    ) -> Result<u64, BucketError> {
        let dir = self.markers_dir();
        let mut dead = Vec::new();
        let mut markers = self.store.list(Some(&dir));
        while let Some(meta) = markers.next().await {
            let meta = meta.map_err(BucketError::store("list", &dir))?;
            if &meta.location != own
                && meta.last_modified.timestamp_millis() < now_ms() - 2 * ms(self.marker_life())
            {
                dead.push(meta.location);
            }
        }
        for key in &dead {
            match self.store.delete(key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(BucketError::store("delete", key)(e)),
            }
        }
        Ok(dead.len() as u64)
    }
}

/// Re-stamps `marker` every `beat`, noting when each stamp that landed was sent.
async fn heartbeat(
    store: Arc<dyn ObjectStore>,
    marker: Path,
    stamped: Arc<Mutex<Instant>>,
    beat: Duration,
) {
    loop {
        tokio::time::sleep(beat).await;
        let sent = Instant::now();
        if store.put(&marker, PutPayload::default()).await.is_ok()
            && let Ok(mut at) = stamped.lock()
        {
            *at = sent;
        }
    }
}

/// The heartbeat's task, stopped when the collection ends however it ends (a collection
/// dropped mid-way included: its marker then goes stale).
struct Stops(tokio::task::JoinHandle<()>);

impl Drop for Stops {
    fn drop(&mut self) {
        self.0.abort();
    }
}
