//! Opening a bucket from its address: `s3://BUCKET/PREFIX`, `file:///DIR` or `memory:///`.

use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use environment_core::BlobStore;
use futures_util::StreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};

use crate::Bucket;
use crate::error::BucketError;

/// How long a blob is spared by default after it was stored or last refreshed, whoever
/// refers to it: an hour, so a writer has a quarter of it to commit.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3600);

/// How a bucket is used from this machine.
#[derive(Clone, Debug)]
pub struct BucketOptions {
    /// The directory of this machine's read-through cache.
    pub cache: PathBuf,
    /// How long a collection spares a blob after it was stored or refreshed (every machine
    /// sharing the bucket must use the same).
    pub grace: Duration,
}

impl BucketOptions {
    /// Options with the cache in `cache` and the default grace period.
    pub fn new(cache: impl Into<PathBuf>) -> BucketOptions {
        BucketOptions {
            cache: cache.into(),
            grace: DEFAULT_GRACE,
        }
    }
}

impl Bucket {
    /// Opens the blobs at `url` and checks that the bucket answers.
    ///
    /// - `s3://BUCKET/PREFIX`: credentials, region and endpoint come from the usual `AWS_*`
    ///   variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT`
    ///   for MinIO, R2 or another S3-compatible server, `AWS_ALLOW_HTTP=true` for a plain-HTTP
    ///   one), never from the address, so no secret is on a command line;
    /// - `file:///DIR`: a directory (one machine, or a shared filesystem);
    /// - `memory:///`: this `Bucket` only, gone with it (tests, examples).
    pub async fn open(url: &str, options: BucketOptions) -> Result<Bucket, BucketError> {
        let bad = |reason: &str| BucketError::Config {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let (scheme, rest) = url.split_once("://").ok_or_else(|| {
            bad("not an address: use s3://BUCKET/PREFIX, file:///DIR or memory:///")
        })?;
        let (store, root): (Arc<dyn ObjectStore>, &str) = match scheme {
            "s3" => {
                let (name, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if name.is_empty() {
                    return Err(bad("no bucket named: s3://BUCKET/PREFIX"));
                }
                let s3 = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(name)
                    .build()
                    .map_err(|e| bad(&e.to_string()))?;
                (Arc::new(s3), prefix)
            }
            "file" => {
                let dir = FsPath::new(rest);
                if !dir.is_absolute() {
                    return Err(bad("a file bucket is an absolute directory: file:///DIR"));
                }
                std::fs::create_dir_all(dir).map_err(|e| bad(&e.to_string()))?;
                let local = object_store::local::LocalFileSystem::new_with_prefix(dir)
                    .map_err(|e| bad(&e.to_string()))?;
                (Arc::new(local), "")
            }
            "memory" => (Arc::new(object_store::memory::InMemory::new()), rest),
            other => {
                return Err(bad(&format!(
                    "{other:?} is not a kind of bucket: use s3://, file:// or memory://"
                )));
            }
        };
        let root = Path::parse(root.trim_matches('/')).map_err(|e| bad(&e.to_string()))?;
        Bucket::with_store(store, root, options)
            .await
            .map_err(|e| match e {
                BucketError::Config { reason, .. } => bad(&reason),
                other => other,
            })
    }

    /// The blobs under `root` in an object store built by the caller. The bucket must answer,
    /// and its grace period be this one: the first machine to open it records it (in
    /// `ROOT/settings`), and a machine that would collect or reuse blobs on another is refused.
    pub async fn with_store(
        store: Arc<dyn ObjectStore>,
        root: Path,
        options: BucketOptions,
    ) -> Result<Bucket, BucketError> {
        let bad = |reason: String| BucketError::Config {
            url: store.to_string(),
            reason,
        };
        if options.grace.is_zero() {
            return Err(bad("the grace period must be longer than zero".to_owned()));
        }
        let settings = root.clone().join("settings");
        let ours = format!("grace_ms={}\n", options.grace.as_millis());
        // An unreachable server, refused credentials or a missing bucket show now, not at the
        // first write.
        let markers = root.clone().join("gc");
        if let Some(Err(e)) = store.list(Some(&markers)).next().await {
            return Err(bad(format!("the bucket does not answer: {e}")));
        }
        // Written only where there is none (a conditional put): of two machines opening a new
        // bucket at once with different periods, the second finds the first's and is refused.
        loop {
            let theirs = match store.get(&settings).await {
                Ok(found) => Some(
                    found
                        .bytes()
                        .await
                        .map_err(|e| bad(format!("the bucket does not answer: {e}")))?,
                ),
                Err(object_store::Error::NotFound { .. }) => None,
                Err(e) => return Err(bad(format!("the bucket does not answer: {e}"))),
            };
            match theirs {
                Some(theirs) if theirs.as_ref() != ours.as_bytes() => {
                    return Err(bad(format!(
                        "the bucket's settings say {:?}, this machine's {:?}: every machine \
                         sharing it must use the same grace period",
                        String::from_utf8_lossy(&theirs).trim(),
                        ours.trim()
                    )));
                }
                Some(_) => break,
                None => {
                    let payload = PutPayload::from(ours.clone().into_bytes());
                    let create = PutOptions::from(PutMode::Create);
                    match store.put_opts(&settings, payload.clone(), create).await {
                        Ok(_) => break,
                        // Another machine wrote them first: read theirs.
                        Err(object_store::Error::AlreadyExists { .. }) => continue,
                        // A store without conditional writes: written as it is.
                        Err(object_store::Error::NotImplemented { .. }) => {
                            store
                                .put(&settings, payload)
                                .await
                                .map_err(BucketError::store("put", &settings))?;
                            break;
                        }
                        Err(e) => return Err(BucketError::store("put", &settings)(e)),
                    }
                }
            }
        }
        Ok(Bucket {
            store,
            root,
            cache: BlobStore::open(&options.cache)?,
            grace: options.grace,
        })
    }

    pub(crate) fn markers_dir(&self) -> Path {
        self.root.clone().join("gc")
    }

    pub(crate) fn blobs_dir(&self) -> Path {
        self.root.clone().join("blobs")
    }
}
