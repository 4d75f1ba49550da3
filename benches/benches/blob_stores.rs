//! Blobs kept in a bucket shared by machines against the embedded blob store, side by side in
//! one run: 256 new blobs of 16 KiB stored (one write window, sent 16 at a time), the same
//! blobs stored again (found fresh, nothing sent), and read back by another machine through
//! an empty cache (16 at a time); and 256 blobs nothing refers to collected (the bucket's
//! collection against the embedded environment's `gc`). The bucket is the S3-compatible server named by `ENVIRONMENT_TEST_S3`
//! (with its `AWS_*` endpoint and credentials); without one the bucket rows are skipped with
//! the reason (under `CI=true` that fails).
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashSet;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use environment_bucket::{Bucket, BucketOptions};
use environment_core::{ActorId, BlobStore, Hash, LocalEnvironment, Options};

const BLOBS: usize = 256;
const SIZE: usize = 16 * 1024;

/// `BLOBS` blobs no store has seen.
fn fresh_blobs() -> Vec<Vec<u8>> {
    let seed: u64 = rand::random();
    (0..BLOBS)
        .map(|i| {
            let mut b = vec![0u8; SIZE];
            b[..8].copy_from_slice(&seed.to_le_bytes());
            b[8..16].copy_from_slice(&(i as u64).to_le_bytes());
            b
        })
        .collect()
}

fn blob_stores(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("blobs");
    g.sample_size(10);
    g.throughput(Throughput::Elements(BLOBS as u64));

    // The peer: the embedded store, one fsync for the lot.
    let local = tempfile::tempdir().unwrap();
    let store = BlobStore::open(local.path()).unwrap();
    g.bench_function("store 256 new blobs of 16 KiB, embedded", |b| {
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            for _ in 0..iters {
                let blobs = fresh_blobs();
                let t = Instant::now();
                for blob in &blobs {
                    store.put_unsynced(blob).unwrap();
                }
                store.sync().unwrap();
                took += t.elapsed();
            }
            took
        })
    });
    let kept: Vec<Hash> = fresh_blobs()
        .iter()
        .map(|b| store.put(b).unwrap())
        .collect();
    g.bench_function("read 256 blobs of 16 KiB, embedded", |b| {
        b.iter(|| {
            for h in &kept {
                store.get(h).unwrap();
            }
        })
    });
    let home = tempfile::tempdir().unwrap();
    let env = LocalEnvironment::open(home.path(), Options::default()).unwrap();
    let admin = ActorId::new("human:admin").unwrap();
    g.bench_function("collect 256 dead blobs of 16 KiB, embedded gc", |b| {
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            for _ in 0..iters {
                for blob in fresh_blobs() {
                    env.blobs().put_unsynced(&blob).unwrap();
                }
                env.blobs().sync().unwrap();
                let t = Instant::now();
                let report = env.gc(&admin).unwrap();
                took += t.elapsed();
                assert_eq!(report.removed, BLOBS as u64);
            }
            took
        })
    });

    let Some(base) = environment_conformance::prerequisite::s3() else {
        return;
    };
    let root = format!(
        "{}/bench{:016x}",
        base.trim_end_matches('/'),
        rand::random::<u64>()
    );
    let caches = tempfile::tempdir().unwrap();
    let machine = |name: &str| {
        let options = BucketOptions::new(caches.path().join(name));
        rt.block_on(Bucket::open(&root, options)).unwrap()
    };
    let writer = machine("writer");
    g.bench_function("store 256 new blobs of 16 KiB, bucket", |b| {
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            for _ in 0..iters {
                let blobs = fresh_blobs();
                let slices: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
                let t = Instant::now();
                let window = writer.window();
                rt.block_on(writer.put_many(&window, &slices)).unwrap();
                window.check().unwrap();
                took += t.elapsed();
            }
            took
        })
    });
    let blobs = fresh_blobs();
    let slices: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
    let window = writer.window();
    let hashes = rt.block_on(writer.put_many(&window, &slices)).unwrap();
    g.bench_function("store 256 blobs of 16 KiB it has, bucket", |b| {
        b.iter(|| {
            let window = writer.window();
            rt.block_on(writer.put_many(&window, &slices)).unwrap();
        })
    });
    let mut n = 0;
    g.bench_function("read 256 blobs of 16 KiB on another machine, bucket", |b| {
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            for _ in 0..iters {
                n += 1;
                let reader = machine(&format!("reader{n}"));
                let t = Instant::now();
                rt.block_on(reader.get_many(&hashes)).unwrap();
                took += t.elapsed();
            }
            took
        })
    });

    // A bucket of its own, with a grace period of a second, whose blobs are all dead.
    let dead_root = format!("{root}-dead");
    let mut options = BucketOptions::new(caches.path().join("collector"));
    options.grace = Duration::from_secs(1);
    let collector = rt.block_on(Bucket::open(&dead_root, options)).unwrap();
    g.bench_function("collect 256 dead blobs of 16 KiB, bucket", |b| {
        b.iter_custom(|iters| {
            let mut took = Duration::ZERO;
            for _ in 0..iters {
                let blobs = fresh_blobs();
                let slices: Vec<&[u8]> = blobs.iter().map(Vec::as_slice).collect();
                let window = collector.window();
                rt.block_on(collector.put_many(&window, &slices)).unwrap();
                // Past the grace period, its second of slack, and the second the bucket dates to.
                std::thread::sleep(Duration::from_millis(3_200));
                let t = Instant::now();
                let report = rt
                    .block_on(collector.sweep(|| async {
                        Ok::<_, environment_bucket::BucketError>(HashSet::new())
                    }))
                    .unwrap();
                took += t.elapsed();
                assert_eq!(report.removed, BLOBS as u64);
            }
            took
        })
    });
    g.finish();
}

criterion_group!(benches, blob_stores);
criterion_main!(benches);
