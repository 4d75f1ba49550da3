//! Blobs in a real S3-compatible bucket (the server `.ci/run` starts): shared between
//! machines, checked on the way back, refused when the address is bad, and collected while
//! other machines write without losing a blob that committed state refers to.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{blob_key, raw};
use environment_bucket::{Bucket, BucketError, BucketOptions};
use environment_core::Hash;
use object_store::path::Path;
use object_store::throttle::{ThrottleConfig, ThrottledStore};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// A machine: the bucket under `root`, with a cache of its own.
struct Machine {
    bucket: Bucket,
    _cache: tempfile::TempDir,
}

async fn machine(root: &str, grace: Duration) -> Machine {
    let cache = tempfile::tempdir().unwrap();
    let mut options = BucketOptions::new(cache.path());
    options.grace = grace;
    Machine {
        bucket: Bucket::open(root, options).await.unwrap(),
        _cache: cache,
    }
}

/// A fresh prefix in the test bucket, or `None` (skipped; a failure under `CI=true`).
fn root() -> Option<String> {
    let base = environment_conformance::prerequisite::s3()?;
    Some(format!(
        "{}/t{:016x}",
        base.trim_end_matches('/'),
        rand::random::<u64>()
    ))
}

const GRACE: Duration = Duration::from_secs(1);

/// Long enough for a blob to be collectable: the grace period, and two seconds for the
/// bucket's dating to the second (the collection's start and the blob's age).
const AGED: Duration = Duration::from_millis(3200);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blob_stored_on_one_machine_is_read_on_another() {
    let Some(root) = root() else { return };
    // Nothing is collected here: a long grace period, so that a slow machine's window (a
    // quarter of it) does not close before its 3 MB are sent.
    let grace = Duration::from_secs(40);
    let (a, b, c) = (
        machine(&root, grace).await,
        machine(&root, grace).await,
        machine(&root, grace).await,
    );
    let small = b"a config file\n".to_vec();
    let large: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    let w = a.bucket.window();
    let hashes = a.bucket.put_many(&w, &[&small, &large]).await.unwrap();
    w.check().unwrap();
    assert_eq!(b.bucket.get(&hashes[0]).await.unwrap(), small);
    assert_eq!(b.bucket.get(&hashes[1]).await.unwrap(), large);

    // B read them through its cache: gone from the bucket, B still has them; C never did.
    let (store, prefix) = raw(&root);
    for h in &hashes {
        store.delete(&blob_key(&prefix, h)).await.unwrap();
    }
    assert_eq!(b.bucket.get(&hashes[1]).await.unwrap(), large);
    assert!(matches!(
        c.bucket.get(&hashes[0]).await,
        Err(BucketError::Missing(h)) if h == hashes[0]
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_object_is_an_error_and_is_not_cached() {
    let Some(root) = root() else { return };
    let (a, b) = (machine(&root, GRACE).await, machine(&root, GRACE).await);
    let w = a.bucket.window();
    let hash = a.bucket.put(&w, b"the real content").await.unwrap();
    let (store, prefix) = raw(&root);
    let key = blob_key(&prefix, &hash);
    store
        .put(&key, PutPayload::from_static(b"replaced"))
        .await
        .unwrap();
    for _ in 0..2 {
        assert!(matches!(
            b.bucket.get(&hash).await,
            Err(BucketError::Damaged { expected, .. }) if expected == hash
        ));
    }
    // Repaired in the bucket, it reads: the damaged bytes had not been cached.
    store
        .put(&key, PutPayload::from_static(b"the real content"))
        .await
        .unwrap();
    assert_eq!(b.bucket.get(&hash).await.unwrap(), b"the real content");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_address_is_refused_with_a_typed_error() {
    let cache = tempfile::tempdir().unwrap();
    let mut bad = vec![
        "nonsense".to_owned(),
        "ftp://host/x".to_owned(),
        "s3://".to_owned(),
        "file://relative/dir".to_owned(),
    ];
    if let Some(root) = root() {
        // A bucket the server does not have.
        let (_, rest) = root.split_once("://").unwrap();
        let prefix = rest.split_once('/').unwrap().1;
        bad.push(format!(
            "s3://no-such-bucket-{:08x}/{prefix}",
            rand::random::<u32>()
        ));
    }
    for url in &bad {
        let err = Bucket::open(url, BucketOptions::new(cache.path()))
            .await
            .unwrap_err();
        assert!(matches!(err, BucketError::Config { .. }), "{url}: {err}");
    }
    if let Some(root) = root() {
        // Machines that disagree on the grace period would collect what the others reuse.
        let _first = machine(&root, GRACE).await;
        let mut other = BucketOptions::new(cache.path());
        other.grace = GRACE * 2;
        let err = Bucket::open(&root, other).await.unwrap_err();
        assert!(matches!(err, BucketError::Config { .. }), "{err}");
    }
    let mut zero = BucketOptions::new(cache.path());
    zero.grace = Duration::ZERO;
    assert!(matches!(
        Bucket::open("memory:///", zero).await,
        Err(BucketError::Config { .. })
    ));
}

/// Machines opening a new bucket at the same moment with different grace periods: the
/// settings are written once (a conditional put), and every machine that disagrees with them
/// is refused, so no two machines ever work on one bucket with different periods. On a
/// `file://` bucket, whose conditional put is atomic; the S3 server of the tests checks the
/// condition and then writes, so two puts at one instant may both pass there (S3 itself, R2
/// and MinIO decide it atomically).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machines_opening_a_new_bucket_at_once_agree_on_its_grace_period() {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..8 {
        let root = format!("file://{}/b{round}", dir.path().display());
        let caches: Vec<_> = (0..6).map(|_| tempfile::tempdir().unwrap()).collect();
        let opens = caches.iter().enumerate().map(|(i, cache)| {
            let mut options = BucketOptions::new(cache.path());
            options.grace = GRACE * (1 + (i as u32 % 2));
            let root = root.clone();
            async move { (options.grace, Bucket::open(&root, options).await) }
        });
        let opened = futures_util::future::join_all(opens).await;
        let agreed: HashSet<Duration> = opened
            .iter()
            .filter(|(_, r)| r.is_ok())
            .map(|(grace, _)| *grace)
            .collect();
        assert_eq!(agreed.len(), 1, "round {round}: opened with {agreed:?}");
        for (grace, r) in &opened {
            if !agreed.contains(grace) {
                assert!(matches!(r, Err(BucketError::Config { .. })), "{r:?}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_removes_only_old_blobs_nothing_refers_to() {
    let Some(root) = root() else { return };
    let m = machine(&root, GRACE).await;
    let w = m.bucket.window();
    let old = m.bucket.put_many(&w, &[b"live", b"dead"]).await.unwrap();
    // Past the grace period and the bucket's one-second dating.
    tokio::time::sleep(AGED).await;
    let w = m.bucket.window();
    let young = m.bucket.put(&w, b"young").await.unwrap();
    let live: HashSet<Hash> = [old[0]].into();
    let report = m
        .bucket
        .sweep(|| async { Ok::<_, BucketError>(live) })
        .await
        .unwrap();
    assert_eq!((report.live, report.young, report.removed), (1, 1, 1));
    let other = machine(&root, GRACE).await;
    assert!(other.bucket.contains(&old[0]).await.unwrap());
    assert!(!other.bucket.contains(&old[1]).await.unwrap());
    assert!(other.bucket.contains(&young).await.unwrap());
    // The collection's marker is gone with it.
    let (store, prefix) = raw(&root);
    let markers: Vec<_> =
        futures_util::StreamExt::collect::<Vec<_>>(store.list(Some(&prefix.clone().join("gc"))))
            .await;
    assert!(markers.is_empty(), "{markers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_blob_reused_is_refreshed_and_survives_the_next_collection() {
    let Some(root) = root() else { return };
    let m = machine(&root, GRACE).await;
    let w = m.bucket.window();
    let hash = m.bucket.put(&w, b"reused").await.unwrap();
    tokio::time::sleep(AGED).await;
    // A new operation refers to the same content: it is sent again, so a collection that
    // read the live set before this operation committed spares it.
    let w = m.bucket.window();
    m.bucket.put(&w, b"reused").await.unwrap();
    let report = m
        .bucket
        .sweep(|| async { Ok::<_, BucketError>(HashSet::new()) })
        .await
        .unwrap();
    assert_eq!((report.young, report.removed), (1, 0));
    assert!(m.bucket.contains(&hash).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_open_too_long_refuses_the_commit() {
    let cache = tempfile::tempdir().unwrap();
    let mut options = BucketOptions::new(cache.path());
    options.grace = Duration::from_millis(400);
    let bucket = Bucket::open("memory:///", options).await.unwrap();
    let w = bucket.window();
    bucket.put(&w, b"x").await.unwrap();
    w.check().unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(matches!(w.check(), Err(BucketError::WindowClosed { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_that_died_holds_writers_only_briefly_and_is_cleared() {
    let Some(root) = root() else { return };
    let (store, prefix) = raw(&root);
    let dead = prefix.clone().join("gc").join("died-mid-sweep");
    store.put(&dead, PutPayload::default()).await.unwrap();
    let m = machine(&root, GRACE).await;
    // The upload waits for the marker to go stale (a few beats), then lands.
    let w = m.bucket.window();
    let hash = m.bucket.put(&w, b"after a crash").await.unwrap();
    assert!(m.bucket.contains(&hash).await.unwrap());
    tokio::time::sleep(AGED).await;
    let report = m
        .bucket
        .sweep(|| async { Ok::<_, BucketError>([hash].into()) })
        .await
        .unwrap();
    assert_eq!(report.dead_markers, 1);
    assert!(matches!(
        store.head(&dead).await,
        Err(object_store::Error::NotFound { .. })
    ));
}

/// Three machines commit operations on blobs drawn from a hundred contents (so they reuse
/// blobs that have aged and lost their referrers) while a fourth collects again and
/// again. After every collection, and at the end, every blob that committed state refers to
/// is in the bucket and reads back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collections_racing_writers_lose_nothing_committed() {
    let Some(root) = root() else { return };
    // What committed state refers to: each writer's last operation.
    let refs: Arc<Mutex<Vec<Vec<Hash>>>> = Arc::new(Mutex::new(vec![Vec::new(); 3]));
    let live = |refs: &Arc<Mutex<Vec<Vec<Hash>>>>| -> HashSet<Hash> {
        refs.lock().unwrap().iter().flatten().copied().collect()
    };
    let until = Instant::now() + Duration::from_secs(10);
    let mut writers = Vec::new();
    for w in 0..3usize {
        let (root, refs) = (root.clone(), refs.clone());
        writers.push(tokio::spawn(async move {
            let m = machine(&root, GRACE).await;
            let mut commits = 0u32;
            let mut n = w as u64;
            while Instant::now() < until {
                n = n
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let contents: Vec<Vec<u8>> = (0..1 + n % 3)
                    .map(|i| format!("content {}", (n >> 8).wrapping_add(i) % 100).into_bytes())
                    .collect();
                let slices: Vec<&[u8]> = contents.iter().map(Vec::as_slice).collect();
                let window = m.bucket.window();
                let hashes = m.bucket.put_many(&window, &slices).await.unwrap();
                if window.check().is_ok() {
                    refs.lock().unwrap()[w] = hashes;
                    commits += 1;
                }
                tokio::time::sleep(Duration::from_millis(n % 150)).await;
            }
            commits
        }));
    }
    let collector = machine(&root, GRACE).await;
    let checker = machine(&root, GRACE).await;
    let mut removed = 0;
    while Instant::now() < until {
        let refs2 = refs.clone();
        let report = collector
            .bucket
            .sweep(|| async move { Ok::<_, BucketError>(live(&refs2)) })
            .await
            .unwrap();
        removed += report.removed;
        for h in live(&refs) {
            assert!(
                checker.bucket.contains(&h).await.unwrap(),
                "blob {h} is referred to and was collected"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut commits = 0;
    for w in writers {
        commits += w.await.unwrap();
    }
    for h in live(&refs) {
        let fresh = machine(&root, GRACE).await;
        fresh.bucket.get(&h).await.unwrap();
    }
    eprintln!("{commits} operations committed while collections removed {removed} blobs");
    assert!(commits > 10, "the writers committed {commits} times");
    assert!(
        removed > 0,
        "the race is real only if collections removed blobs"
    );
}

/// A bucket in memory that refuses to delete markers: a collection's tidying fails after its
/// work.
#[derive(Debug)]
struct RefusesMarkerDeletes(Arc<object_store::memory::InMemory>);

impl std::fmt::Display for RefusesMarkerDeletes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RefusesMarkerDeletes")
    }
}

#[async_trait::async_trait]
impl ObjectStore for RefusesMarkerDeletes {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        self.0.put_opts(location, payload, opts).await
    }
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.0.put_multipart_opts(location, opts).await
    }
    async fn get_opts(
        &self,
        location: &Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.0.get_opts(location, options).await
    }
    fn delete_stream(
        &self,
        locations: futures_util::stream::BoxStream<'static, object_store::Result<Path>>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<Path>> {
        use futures_util::StreamExt;
        let inner = Arc::clone(&self.0);
        locations
            .then(move |p| {
                let inner = Arc::clone(&inner);
                async move {
                    let p = p?;
                    if p.as_ref().contains("/gc/") {
                        return Err(object_store::Error::Generic {
                            store: "test",
                            source: "marker deletes refused".into(),
                        });
                    }
                    inner.delete(&p).await.map(|()| p)
                }
            })
            .boxed()
    }
    fn list(
        &self,
        prefix: Option<&Path>,
    ) -> futures_util::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>>
    {
        self.0.list(prefix)
    }
    async fn list_with_delimiter(
        &self,
        prefix: Option<&Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.0.list_with_delimiter(prefix).await
    }
    async fn copy_opts(
        &self,
        from: &Path,
        to: &Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.0.copy_opts(from, to, options).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_that_cannot_tidy_still_says_what_it_removed() {
    let cache = tempfile::tempdir().unwrap();
    let mut options = BucketOptions::new(cache.path());
    options.grace = GRACE;
    let store = Arc::new(RefusesMarkerDeletes(Arc::new(
        object_store::memory::InMemory::new(),
    )));
    let bucket = Bucket::with_store(store, Path::from("env"), options)
        .await
        .unwrap();
    let w = bucket.window();
    let dead = bucket.put(&w, b"nothing refers to this").await.unwrap();
    tokio::time::sleep(AGED).await;
    let err = bucket
        .sweep(|| async { Ok::<_, BucketError>(HashSet::new()) })
        .await
        .unwrap_err();
    let BucketError::Untidy { report, .. } = err else {
        panic!("{err}");
    };
    assert_eq!(report.removed, 1);
    assert!(!bucket.contains(&dead).await.unwrap());
}

/// Set in the child that the crash test kills mid-collection: the bucket's address.
const SWEEPING_CHILD: &str = "ENVIRONMENT_BUCKET_TEST_SWEEPING";
/// The child's live set, as hex hashes separated by commas.
const CHILD_LIVE: &str = "ENVIRONMENT_BUCKET_TEST_LIVE";

/// The grace period of the crash test: its beat (an eighth) outlasts one throttled batch.
const KILL_GRACE: Duration = Duration::from_secs(8);

/// How long the killed collection's store waits before each delete: a batch of 100 takes
/// 300 ms, time enough to see the first batch land and kill the collection before the second.
const THROTTLED_DELETE: Duration = Duration::from_millis(3);

/// A collection SIGKILLed while it deletes: every blob something refers to is still there, a
/// writer gets past the dead collection's marker, and the next collection finishes the work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_killed_mid_way_loses_nothing_live() {
    if let Ok(root) = std::env::var(SWEEPING_CHILD) {
        let live: HashSet<Hash> = std::env::var(CHILD_LIVE)
            .unwrap()
            .split(',')
            .map(|h| h.parse().unwrap())
            .collect();
        // Throttled, so that the kill lands between two batches however fast the server is.
        let (store, prefix) = raw(&root);
        let config = ThrottleConfig {
            wait_delete_per_call: THROTTLED_DELETE,
            ..ThrottleConfig::default()
        };
        let throttled = Arc::new(ThrottledStore::new(store, config));
        let cache = tempfile::tempdir().unwrap();
        let mut options = BucketOptions::new(cache.path());
        options.grace = KILL_GRACE;
        let bucket = Bucket::with_store(throttled, prefix, options)
            .await
            .unwrap();
        bucket
            .sweep(|| async { Ok::<_, BucketError>(live) })
            .await
            .unwrap();
        return;
    }
    let Some(root) = root() else { return };
    let m = machine(&root, KILL_GRACE).await;
    let contents: Vec<Vec<u8>> = (0..300).map(|i| format!("blob {i}").into_bytes()).collect();
    let slices: Vec<&[u8]> = contents.iter().map(Vec::as_slice).collect();
    let w = m.bucket.window();
    let hashes = m.bucket.put_many(&w, &slices).await.unwrap();
    let live: Vec<Hash> = hashes.iter().step_by(3).copied().collect();
    tokio::time::sleep(KILL_GRACE + Duration::from_millis(2200)).await;

    let (store, prefix) = raw(&root);
    let blobs_dir = prefix.clone().join("blobs");
    let count = || async {
        futures_util::StreamExt::collect::<Vec<_>>(store.list(Some(&blobs_dir)))
            .await
            .len()
    };
    let before = count().await;
    let hex: Vec<String> = live.iter().map(Hash::to_hex).collect();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_collection_killed_mid_way_loses_nothing_live",
            "--nocapture",
        ])
        .env(SWEEPING_CHILD, &root)
        .env(CHILD_LIVE, hex.join(","))
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // A collection deletes in the listing's order, by name: the first dead blob goes first.
    let first = *hashes
        .iter()
        .filter(|h| !live.contains(h))
        .min_by_key(|h| h.to_hex())
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while m.bucket.contains(&first).await.unwrap() {
        assert!(
            Instant::now() < deadline,
            "the collection never started deleting"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let left = count().await;
    assert!(
        left < before && left > live.len(),
        "killed mid-way: {left} of {before} blobs left, {} live",
        live.len()
    );

    for h in &live {
        assert!(m.bucket.contains(h).await.unwrap(), "live blob {h} lost");
    }
    let w = m.bucket.window();
    let after = m.bucket.put(&w, b"after the kill").await.unwrap();
    let mut still: HashSet<Hash> = live.iter().copied().collect();
    still.insert(after);
    let report = m
        .bucket
        .sweep(|| async { Ok::<_, BucketError>(still) })
        .await
        .unwrap();
    assert_eq!(report.live, live.len() as u64 + 1);
    assert_eq!(
        count().await,
        live.len() + 1,
        "the next collection finished the work"
    );
}
