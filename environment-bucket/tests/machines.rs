//! Machines of one environment: the log in PostgreSQL, the blobs in a bucket, each machine with
//! a home of its own whose blob store caches the bucket. What one machine stores another reads
//! (whole, in a blob, in chunks), checked against its hash; `verify` passes from a machine
//! that has cached nothing; a collection run from any machine removes only what no version
//! refers to; and the bodies every store of the log runs (`environment-conformance`) hold on
//! these stores: machines acting at once lose no update, and a machine SIGKILLed at random
//! moments (while it acts, and collects the bucket with a short grace period) loses nothing it
//! acknowledged.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use environment_bucket::{BucketOptions, SharedBucket};
use environment_conformance::log_crash;
use environment_conformance::log_port::{self, Backend, Place};
use environment_core::error::BlobError;
use environment_core::{
    ActRequest, ActorId, Content, EnvError, ErrorKind, Hash, Intent, Key, LocalEnvironment,
    Options, Value,
};
use environment_postgres::{PgEffectStore, PgLogStore, PgStoreConfig};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

/// One environment's shared stores: a schema of the test server and a prefix of the bucket.
struct Shared {
    server: postgres::Config,
    root: String,
}

/// A machine: its own home (whose blob store is its cache of the bucket) on the shared stores.
struct Machine {
    env: LocalEnvironment,
    home: tempfile::TempDir,
}

/// The schema and bucket prefix of a new environment.
fn fresh_stores(name: &str) -> Option<(String, String)> {
    let url = environment_conformance::prerequisite::postgres()?;
    let base = environment_conformance::prerequisite::s3()?;
    let schema = format!(
        "m_{name}_{}_{:08x}",
        std::process::id(),
        rand::random::<u32>()
    );
    let server: postgres::Config = url.parse().unwrap();
    server
        .connect(postgres::NoTls)
        .unwrap()
        .batch_execute(&format!("CREATE SCHEMA {schema}"))
        .unwrap();
    let root = format!(
        "{}/m{:016x}",
        base.trim_end_matches('/'),
        rand::random::<u64>()
    );
    Some((schema, root))
}

fn in_schema(schema: &str) -> postgres::Config {
    let url = environment_conformance::prerequisite::postgres().expect("the test server");
    let mut server: postgres::Config = url.parse().unwrap();
    server.options(&format!("-c search_path={schema}"));
    server
}

fn shared(name: &str) -> Option<Shared> {
    let (schema, root) = fresh_stores(name)?;
    Some(Shared {
        server: in_schema(&schema),
        root,
    })
}

/// Opens the environment of the machine whose home is `home` on the shared stores.
fn open_machine(
    server: &postgres::Config,
    root: &str,
    home: &std::path::Path,
    grace: Duration,
    options: Options,
) -> LocalEnvironment {
    let mut bucket = BucketOptions::new(home.join("blobs"));
    bucket.grace = grace;
    let config = PgStoreConfig::default();
    LocalEnvironment::open(
        home,
        Options {
            log_store: Some(PgLogStore::opener_on(server.clone(), &config)),
            effects: Some(Arc::new(
                PgEffectStore::open(server.clone(), config).unwrap(),
            )),
            shared_blobs: Some(Arc::new(SharedBucket::open(root, bucket).unwrap())),
            ..options
        },
    )
    .unwrap()
}

impl Shared {
    fn machine(&self, grace: Duration) -> Machine {
        let home = tempfile::tempdir().unwrap();
        let env = open_machine(
            &self.server,
            &self.root,
            home.path(),
            grace,
            Options::default(),
        );
        Machine { env, home }
    }

    /// Where the blob named `hash` is kept, seen past the environment.
    fn object(&self, hash: &Hash) -> (Arc<dyn ObjectStore>, Path) {
        let (store, prefix) = common::raw(&self.root);
        (store, common::blob_key(&prefix, hash))
    }

    /// Whether the bucket holds the blob.
    fn holds(&self, hash: &Hash) -> bool {
        let (store, key) = self.object(hash);
        match block_on(store.head(&key)) {
            Ok(_) => true,
            Err(object_store::Error::NotFound { .. }) => false,
            Err(e) => panic!("{e}"),
        }
    }

    fn overwrite(&self, hash: &Hash, bytes: &'static [u8]) {
        let (store, key) = self.object(hash);
        block_on(store.put(&key, PutPayload::from_static(bytes))).unwrap();
    }
}

/// Runs `work` to its end on a runtime of its own (the tests are not async).
fn block_on<T>(work: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(work)
}

/// The grace period of the tests that collect nothing: a writer's window (a quarter of it)
/// stays open on a loaded machine.
const GRACE: Duration = Duration::from_secs(60);
/// The grace period of the collection test: short enough to wait out, long enough that its
/// writers' windows (a second) stay open on a loaded machine.
const COLLECT_GRACE: Duration = Duration::from_secs(4);
/// Long enough for a blob to be collectable: the grace period, and two seconds for the
/// bucket's dating to the second.
const AGED: Duration = Duration::from_millis(6200);

fn actor() -> ActorId {
    ActorId::new("agent:machines").unwrap()
}

fn put(env: &LocalEnvironment, path: &str, value: Value) -> environment_core::OpId {
    env.act_blocking(
        ActRequest::new(actor(), Intent::edit(format!("write {path}")))
            .put(Key::fs(path).unwrap(), value),
    )
    .unwrap()
    .version
}

fn read(env: &LocalEnvironment, path: &str) -> Value {
    let head = env.head("main").unwrap();
    env.read(&actor(), &Key::fs(path).unwrap(), &head)
        .unwrap()
        .expect(path)
}

/// Bytes that do not repeat (so chunking finds no duplicates), the same for the same seed.
fn varied(len: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore, SeedableRng};
    let mut bytes = vec![0; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut bytes);
    bytes
}

/// A file's value with `bytes` stored in chunks.
fn chunked(env: &LocalEnvironment, bytes: &[u8]) -> Value {
    let mut file = tempfile::tempfile().unwrap();
    file.write_all(bytes).unwrap();
    let put = env.blobs().put_chunked(&file, true).unwrap();
    let mut value = Value::file("");
    value.content = Content::Chunks(put.manifest);
    value.meta.size = put.size;
    value
}

#[test]
fn what_one_machine_stores_another_reads_and_verifies() {
    let Some(shared) = shared("read") else { return };
    let (a, b) = (shared.machine(GRACE), shared.machine(GRACE));

    let small = b"inline".to_vec();
    let blob = varied(10_000, 1);
    let large = varied(3 << 20, 3);
    put(&a.env, "small.txt", Value::file(small.clone()));
    put(&a.env, "data.bin", Value::file(blob.clone()));
    let last = put(&a.env, "large.bin", chunked(&a.env, &large));

    // The other machine sees the same head, and has cached none of the content yet.
    assert_eq!(b.env.head("main").unwrap(), last);
    let data = read(&b.env, "data.bin");
    let data_hash = data.blob().expect("10 KB is kept in a blob");
    assert!(!b.env.blobs().contains(&data_hash));
    // verify finds every referenced blob in the bucket without fetching it.
    b.env.verify(&ActorId::system()).unwrap();
    assert!(!b.env.blobs().contains(&data_hash));

    assert_eq!(b.env.content(&read(&b.env, "small.txt")).unwrap(), small);
    assert_eq!(b.env.content(&data).unwrap(), blob);
    assert_eq!(b.env.content(&read(&b.env, "large.bin")).unwrap(), large);
    assert!(
        b.env.blobs().contains(&data_hash),
        "fetched content is cached"
    );
    b.env.verify_deep(&ActorId::system()).unwrap();

    // What the second machine stores, the first reads.
    put(&b.env, "reply.bin", Value::file(varied(5_000, 13)));
    assert_eq!(
        a.env.content(&read(&a.env, "reply.bin")).unwrap(),
        varied(5_000, 13)
    );
}

#[test]
fn content_damaged_in_the_bucket_is_an_error_never_wrong_content() {
    let Some(shared) = shared("damaged") else {
        return;
    };
    let (a, b) = (shared.machine(GRACE), shared.machine(GRACE));
    put(&a.env, "data.bin", Value::file(varied(10_000, 15)));
    let value = read(&b.env, "data.bin");
    let hash = value.blob().unwrap();
    shared.overwrite(&hash, b"replaced by someone");
    for _ in 0..2 {
        let err = b.env.content(&value).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
        assert!(
            !b.env.blobs().contains(&hash),
            "damaged bytes are not cached"
        );
    }
    assert!(b.env.verify_deep(&ActorId::system()).is_err());
    // The machine that stored it still has its own copy.
    assert_eq!(a.env.content(&value).unwrap(), varied(10_000, 15));
}

/// The bytes of the packs in a blob store's directory: what it keeps on disk.
fn packed_bytes(blobs: &std::path::Path) -> u64 {
    std::fs::read_dir(blobs.join("packs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "pack"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

#[test]
fn a_new_machine_obtains_many_contents_at_once_each_checked_and_kept_once() {
    let Some(shared) = shared("obtain") else {
        return;
    };
    let (a, b) = (shared.machine(GRACE), shared.machine(GRACE));
    const FILES: u64 = 300;
    let mut request = ActRequest::new(actor(), Intent::edit("many files"));
    for i in 0..FILES {
        request = request.put(
            Key::fs(format!("src/f{i}.bin")).unwrap(),
            Value::file(varied(3_000, 100 + i)),
        );
    }
    a.env.act_blocking(request).unwrap();
    put(&a.env, "large.bin", chunked(&a.env, &varied(3 << 20, 7)));

    let values: Vec<Value> = (0..FILES)
        .map(|i| read(&b.env, &format!("src/f{i}.bin")))
        .chain([read(&b.env, "large.bin")])
        .collect();
    let dangling = Hash([9; 32]);
    let mut never_shared = Value::file("");
    never_shared.content = Content::Blob(dangling);
    never_shared.meta.size = 3_000;
    let absent = b
        .env
        .blobs()
        .obtain_contents(values.iter().chain([&never_shared]))
        .unwrap();
    assert_eq!(
        absent,
        vec![dangling],
        "only what no machine shared is absent"
    );

    // Every content is now read here: with the bucket's objects gone, it still is.
    let (store, prefix) = common::raw(&shared.root);
    let keys: Vec<Path> = block_on(async {
        use futures_util::TryStreamExt;
        store
            .list(Some(&prefix))
            .map_ok(|m| m.location)
            .try_collect()
            .await
    })
    .unwrap();
    assert!(keys.len() as u64 > FILES);
    for key in &keys {
        block_on(store.delete(key)).unwrap();
    }
    for (i, v) in values.iter().take(FILES as usize).enumerate() {
        assert_eq!(b.env.content(v).unwrap(), varied(3_000, 100 + i as u64));
    }
    assert_eq!(
        b.env.content(&values[FILES as usize]).unwrap(),
        varied(3 << 20, 7)
    );
    // Kept once on this machine: the bucket does not cache a second copy of what the
    // environment's store keeps.
    // The small files' blobs are packed (the large file's chunks are files of their own).
    let content = FILES * 3_000;
    let on_disk = packed_bytes(&b.home.path().join("blobs"));
    assert!(
        on_disk >= content && on_disk < content + content / 4,
        "{on_disk} bytes packed for {content} bytes of content"
    );
}

#[test]
fn contents_obtained_together_are_checked_and_the_damaged_one_is_not_kept() {
    let Some(shared) = shared("obtaindamaged") else {
        return;
    };
    let (a, b) = (shared.machine(GRACE), shared.machine(GRACE));
    let mut request = ActRequest::new(actor(), Intent::edit("files"));
    for i in 0..40 {
        request = request.put(
            Key::fs(format!("f{i}.bin")).unwrap(),
            Value::file(varied(3_000, 500 + i)),
        );
    }
    a.env.act_blocking(request).unwrap();
    let values: Vec<Value> = (0..40)
        .map(|i| read(&b.env, &format!("f{i}.bin")))
        .collect();
    let damaged = values[17].blob().unwrap();
    shared.overwrite(&damaged, b"replaced by someone");
    let err = EnvError::from(b.env.blobs().obtain_contents(&values).unwrap_err());
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
    assert!(
        !b.env.blobs().contains(&damaged),
        "damaged bytes are not kept"
    );
    let err = b.env.content(&values[17]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "{err}");
}

#[test]
fn content_no_machine_stored_is_refused_and_changes_nothing() {
    let Some(shared) = shared("missing") else {
        return;
    };
    let a = shared.machine(GRACE);
    let before = a.env.head("main").unwrap();
    let mut value = Value::file("");
    value.content = Content::Blob(Hash([7; 32]));
    let err = a
        .env
        .act_blocking(
            ActRequest::new(actor(), Intent::edit("dangling")).put(Key::fs("x").unwrap(), value),
        )
        .unwrap_err();
    assert!(
        matches!(err, EnvError::Blob(BlobError::Missing(h)) if h == Hash([7; 32])),
        "{err}"
    );
    assert_eq!(a.env.head("main").unwrap(), before);
}

#[test]
fn a_collection_from_any_machine_removes_only_what_no_version_refers_to() {
    let Some(shared) = shared("gc") else { return };
    let (a, b) = (shared.machine(COLLECT_GRACE), shared.machine(COLLECT_GRACE));
    let (old, new) = (varied(4_000, 5), varied(4_000, 9));
    put(&a.env, "data.bin", Value::file(old.clone()));
    put(&a.env, "data.bin", Value::file(new.clone()));
    // A blob shared and never committed on (a writer that died before its act committed).
    let orphan = varied(4_000, 11);
    let orphan_hash = a.env.blobs().put(&orphan).unwrap();
    a.env
        .blobs()
        .shared()
        .unwrap()
        .share(a.env.blobs(), &[orphan_hash])
        .unwrap();
    assert!(shared.holds(&orphan_hash));
    std::thread::sleep(AGED);

    let report = b.env.gc(&ActorId::system()).unwrap();
    assert_eq!(report.shared_removed, 1, "{report:?}");
    assert!(!shared.holds(&orphan_hash));
    // Both versions of the file still read on a machine that has cached nothing.
    let c = shared.machine(COLLECT_GRACE);
    assert_eq!(c.env.content(&read(&c.env, "data.bin")).unwrap(), new);
    let first_write = c.env.resolve("main~1").unwrap();
    let old_value = c
        .env
        .read(&actor(), &Key::fs("data.bin").unwrap(), &first_write)
        .unwrap()
        .unwrap();
    assert_eq!(c.env.content(&old_value).unwrap(), old);
    c.env.verify_deep(&ActorId::system()).unwrap();
}

/// Environments on a schema of the test server and a prefix of the bucket; each place is one
/// machine's home (opened again, the same machine; the bodies' several handles on one place
/// are several processes of it).
struct Fleet;

/// A grace period short enough that the crash test's collections remove what killed acts
/// shared and never committed on while the machine writes, long enough that a writer's window
/// (1.5 s) stays open on a loaded machine.
const FLEET_GRACE: Duration = Duration::from_secs(6);

struct FleetPlace {
    schema: String,
    root: String,
    home: std::path::PathBuf,
    _made: Option<tempfile::TempDir>,
}

impl Backend for Fleet {
    fn fresh(&self) -> Box<dyn Place> {
        // The helper's client blocks: off the async test's runtime.
        let (schema, root) = std::thread::scope(|s| s.spawn(|| fresh_stores("fleet")).join())
            .unwrap()
            .expect("the test server and bucket");
        let made = tempfile::tempdir().unwrap();
        Box::new(FleetPlace {
            schema,
            root,
            home: made.path().to_owned(),
            _made: Some(made),
        })
    }

    fn at(&self, described: &str) -> Box<dyn Place> {
        let mut parts = described.splitn(3, ' ');
        let (schema, root, home) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        Box::new(FleetPlace {
            schema: schema.to_owned(),
            root: root.to_owned(),
            home: home.into(),
            _made: None,
        })
    }
}

impl Place for FleetPlace {
    fn open(&self, options: Options) -> LocalEnvironment {
        open_machine(
            &in_schema(&self.schema),
            &self.root,
            &self.home,
            FLEET_GRACE,
            options,
        )
    }

    fn describe(&self) -> String {
        format!(
            "{} {} {}",
            self.schema,
            self.root,
            self.home.to_str().unwrap()
        )
    }
}

fn servers() -> bool {
    environment_conformance::prerequisite::postgres().is_some()
        && environment_conformance::prerequisite::s3().is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_machines_acting_at_once_lose_no_update() {
    if servers() {
        log_port::no_lost_update_and_exact_conflicts(&Fleet, 2).await;
    }
}

#[test]
fn crash_child_entry() {
    log_crash::child_entry(&Fleet);
}

#[test]
fn a_machine_killed_at_random_moments_loses_nothing_it_acknowledged() {
    if servers() {
        log_crash::killed_at_random_moments(&Fleet, "crash_child_entry", 15);
    }
}

/// The port blocks, and an environment's async methods may call it from a runtime's worker
/// threads: an act with a blob and a read that fetches one, both through the async trait, and
/// the environments dropped inside the runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_trait_shares_and_fetches_from_inside_a_runtime() {
    use environment_core::Environment;
    let Some(shared) = std::thread::scope(|s| s.spawn(|| shared("async")).join()).unwrap() else {
        return;
    };
    let (a, b) = (shared.machine(GRACE), shared.machine(GRACE));
    let bytes = varied(20_000, 17);
    let key = Key::fs("async.bin").unwrap();
    let obs = Environment::act(
        &a.env,
        ActRequest::new(actor(), Intent::edit("async"))
            .put(key.clone(), Value::file(bytes.clone())),
    )
    .await
    .unwrap();
    let value = Environment::read(&b.env, &actor(), &key, &obs.version)
        .await
        .unwrap()
        .unwrap();
    assert!(!b.env.blobs().contains(&value.blob().unwrap()));
    assert_eq!(Environment::content(&b.env, &value).await.unwrap(), bytes);
    drop((a, b));
}
