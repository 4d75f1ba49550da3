//! environment-sandbox against its peers, side by side on the same tree in one run:
//! capture after 1 and 1,000 changed files vs `git add -A && git commit`; restore of 1 and 1,000
//! files vs `rsync -a --delete` (a full scan), and of a 200,000-entry directory; the first
//! capture of the whole tree vs `cp -a`; a full rescan vs a parallel stat walk and `find -ls`;
//! attaching a new working copy of the whole tree vs `git clone` from a local bare repository,
//! from the embedded store and from PostgreSQL and a bucket (`ENVIRONMENT_TEST_POSTGRES` and
//! `ENVIRONMENT_TEST_S3`; without them that row is skipped with the reason, and fails under
//! `CI=true`).
//!
//! A recorded `exec` of `true` (authorize, run, store its output, capture, commit one operation)
//! vs spawning and waiting for `true` alone.
//!
//! `cargo bench -p environment-benches --bench sandbox` uses the reference shape `repo-100k-small`
//! from `shared/workloads/gen_tree.py`; run once as a test it uses a small tree.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use environment_benches::{bench_mode, gen_tree, mutate, small_files};
use environment_bucket::{BucketOptions, SharedBucket};
use environment_core::{ActorId, Intent, IntentKind, LocalEnvironment, OpFlags, OpId, Options};
use environment_postgres::{PgEffectStore, PgLogStore, PgStoreConfig};
use environment_sandbox::{ForkConfig, Forks, Tracker, TrackerConfig};

/// Whether a run filtered by name (`cargo bench --bench sandbox -- fork`) measures `group`: a
/// group left out does not build its tree (minutes for the reference shape).
fn wanted(group: &str) -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    // A filter names the group or one of its functions ("group/function").
    filters.is_empty()
        || filters
            .iter()
            .any(|f| group.contains(f.as_str()) || f.starts_with(group))
}

fn sh(dir: &Path, cmd: &str) {
    let st = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .current_dir(dir)
        .status()
        .unwrap();
    assert!(st.success(), "{cmd}");
}

fn sync_disk() {
    let _ = Command::new("sync").status();
}

/// Fresh directories under `scratch` for each iteration of a group, all deleted when it ends:
/// on ext4, writing into space that 100,000 files freed a moment ago waits on the journal,
/// which would make whichever side deletes more look slower.
struct FreshDirs<'a> {
    scratch: &'a Path,
    prefix: &'static str,
    made: std::cell::Cell<u32>,
}

impl FreshDirs<'_> {
    fn new<'a>(scratch: &'a Path, prefix: &'static str) -> FreshDirs<'a> {
        FreshDirs {
            scratch,
            prefix,
            made: std::cell::Cell::new(0),
        }
    }

    /// The next directory's path (not made), after a `sync` so the last one's writes are
    /// not paid for by this one.
    fn next(&self) -> PathBuf {
        self.made.set(self.made.get() + 1);
        sync_disk();
        self.scratch
            .join(format!("{}-{}", self.prefix, self.made.get()))
    }
}

impl Drop for FreshDirs<'_> {
    fn drop(&mut self) {
        for i in 1..=self.made.get() {
            let _ = std::fs::remove_dir_all(self.scratch.join(format!("{}-{i}", self.prefix)));
        }
    }
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success())
}

struct Fixture {
    _dir: tempfile::TempDir,
    tree: PathBuf,
    scratch: PathBuf,
    env: LocalEnvironment,
    tracker: Tracker,
    files: Vec<PathBuf>,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    gen_tree(&tree);
    let env = LocalEnvironment::open(dir.path().join("home"), Options::default()).unwrap();
    let mut cfg = TrackerConfig::new(&tree, ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    let tracker = Tracker::open(env.clone(), cfg).unwrap();
    let files = small_files(&tree, &[".git"]);
    let scratch = dir.path().join("scratch");
    std::fs::create_dir(&scratch).unwrap();
    Fixture {
        tree,
        scratch,
        env,
        tracker,
        files,
        _dir: dir,
    }
}

fn capture(f: &Fixture) -> Option<OpId> {
    f.tracker
        .capture_now(Intent::new(IntentKind::Command, "bench"), OpFlags::COMMAND)
        .unwrap()
        .map(|o| o.version)
}

fn bench_capture(c: &mut Criterion) {
    if !wanted("capture after changes") {
        return;
    }
    let f = fixture();
    // git keeps its repository outside the tree, so the tracker does not see it.
    let git_dir = f.scratch.join("git");
    let git = format!(
        "git --git-dir={} --work-tree=. -c user.name=bench -c user.email=bench@localhost",
        git_dir.display()
    );
    sh(
        &f.tree,
        &format!(
            "git init -q --bare {} && {git} add -A && {git} commit -q -m init",
            git_dir.display()
        ),
    );
    let mut next = 0usize;
    let mut g = c.benchmark_group("capture after changes");
    for n in [1usize, 1000] {
        g.bench_function(format!("environment, {n} changed"), |b| {
            b.iter_batched(
                || mutate(&f.files, n, &mut next),
                |_| capture(&f).expect("a change"),
                BatchSize::PerIteration,
            )
        });
        next += n;
        g.bench_function(format!("git add -A && git commit, {n} changed"), |b| {
            b.iter_batched(
                || mutate(&f.files, n, &mut next),
                |_| sh(&f.tree, &format!("{git} add -A && {git} commit -q -m x")),
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

/// A full rescan (after a lost event queue, or on first use) of the tree with nothing changed,
/// against a parallel stat walk of the same tree (the `ignore` crate's walker, every entry
/// stat'ed, on every core) and `find -ls`.
fn bench_rescan(c: &mut Criterion) {
    const GROUP: &str = "rescan of the whole tree, nothing changed";
    if !wanted(GROUP) {
        return;
    }
    let f = fixture();
    let mut g = c.benchmark_group(GROUP);
    g.sample_size(10);
    g.bench_function("environment", |b| {
        b.iter(|| assert!(f.tracker.rescan_now().unwrap().is_none()))
    });
    g.bench_function("parallel stat walk (ignore crate)", |b| {
        b.iter(|| {
            let n = std::sync::atomic::AtomicUsize::new(0);
            ignore::WalkBuilder::new(&f.tree)
                .standard_filters(false)
                .threads(environment_benches::cores())
                .build_parallel()
                .run(|| {
                    Box::new(|e| {
                        if let Ok(e) = e
                            && std::fs::symlink_metadata(e.path()).is_ok()
                        {
                            n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        ignore::WalkState::Continue
                    })
                });
            assert!(n.into_inner() > f.files.len());
        })
    });
    g.bench_function("find -ls", |b| {
        b.iter(|| sh(&f.tree, "find . -ls > /dev/null"))
    });
    g.finish();
}

fn bench_restore(c: &mut Criterion) {
    if !wanted("restore") {
        return;
    }
    let f = fixture();
    let agent = ActorId::new("agent:bench").unwrap();
    let mut g = c.benchmark_group("restore");
    let pristine = f.scratch.join("pristine");
    let rsync = have("rsync");
    if rsync {
        sh(&f.tree, &format!("cp -a . {}", pristine.display()));
    } else {
        eprintln!("rsync is not installed: the rsync peer is skipped");
    }
    let mut next = 0usize;
    for n in [1usize, 1000] {
        let good = f.env.head("main").unwrap();
        g.bench_function(format!("environment, {n} changed"), |b| {
            b.iter_batched(
                || {
                    mutate(&f.files, n, &mut next);
                    capture(&f);
                },
                |_| {
                    f.tracker
                        .restore(&agent, &good, Intent::new(IntentKind::Restore, "bench"))
                        .unwrap()
                },
                BatchSize::PerIteration,
            )
        });
        if rsync {
            g.bench_function(format!("rsync -a --delete (full scan), {n} changed"), |b| {
                b.iter_batched(
                    || mutate(&f.files, n, &mut next),
                    |_| {
                        sh(
                            &f.tree,
                            &format!("rsync -a --delete {}/ ./", pristine.display()),
                        )
                    },
                    BatchSize::PerIteration,
                )
            });
        }
        // Leave the tree as the tracker last saw it.
        f.tracker
            .restore(&agent, &good, Intent::new(IntentKind::Restore, "reset"))
            .unwrap();
    }
    g.finish();
}

/// One directory of 200,000 files (2,000 run as a test) brought back after it was deleted,
/// against `rsync -a --delete` from a copy.
fn bench_wide_directory(c: &mut Criterion) {
    const GROUP: &str = "restore of a 200,000-entry directory";
    if !wanted(GROUP) {
        return;
    }
    let n = if bench_mode() { 200_000 } else { 2_000 };
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("tree");
    let wide = tree.join("wide");
    std::fs::create_dir_all(&wide).unwrap();
    for i in 0..n {
        std::fs::write(wide.join(format!("entry-{i:06}")), format!("{i}\n")).unwrap();
    }
    let pristine = dir.path().join("pristine");
    sh(
        dir.path(),
        &format!("cp -a {} {}", tree.display(), pristine.display()),
    );
    let env = LocalEnvironment::open(dir.path().join("home"), Options::default()).unwrap();
    let mut cfg = TrackerConfig::new(&tree, ActorId::new("service:watcher").unwrap());
    cfg.auto = false;
    let tracker = Tracker::open(env.clone(), cfg).unwrap();
    let with = env.head("main").unwrap();
    let agent = ActorId::new("agent:bench").unwrap();
    // The directory leaves the tree by a rename, not a deletion: ext4 will not reuse an inode
    // freed in the last seconds (five, or five minutes while its inode table block is dirty)
    // and checks every such inode it passes while allocating, so creating 200,000 files right
    // after deleting 200,000 costs minutes in the kernel, whoever creates them (the profile
    // of this bench, both sides, was `recently_deleted` in `__ext4_new_inode`).
    let graveyard = dir.path().join("graveyard");
    std::fs::create_dir_all(&graveyard).unwrap();
    let buried = std::cell::Cell::new(0u32);
    let gone = || {
        buried.set(buried.get() + 1);
        std::fs::rename(&wide, graveyard.join(buried.get().to_string())).unwrap();
        sync_disk();
    };
    let mut g = c.benchmark_group(GROUP);
    g.sample_size(10);
    g.sampling_mode(criterion::SamplingMode::Flat);
    g.bench_function("environment", |b| {
        b.iter_batched(
            || {
                gone();
                tracker
                    .capture_now(Intent::new(IntentKind::Command, "rm"), OpFlags::COMMAND)
                    .unwrap();
            },
            |_| {
                tracker
                    .restore(&agent, &with, Intent::new(IntentKind::Restore, "bench"))
                    .unwrap()
            },
            BatchSize::PerIteration,
        )
    });
    if have("rsync") {
        g.bench_function("rsync -a --delete", |b| {
            b.iter_batched(
                gone,
                |_| {
                    sh(
                        &tree,
                        &format!("rsync -a --delete {}/ ./", pristine.display()),
                    )
                },
                BatchSize::PerIteration,
            )
        });
    } else {
        eprintln!("rsync is not installed: the rsync peer is skipped");
    }
    g.finish();
}

/// An environment kept in PostgreSQL and a bucket (what `envctl init --shared-log
/// --shared-blobs` makes): a schema and a bucket prefix of its own.
struct SharedStores {
    server: postgres::Config,
    bucket: String,
}

impl SharedStores {
    /// Both servers, when the variables name them.
    fn new() -> Option<SharedStores> {
        let server = environment_benches::postgres_schema("bench_attach")?;
        let s3 = environment_conformance::prerequisite::s3()?;
        let bucket = format!(
            "{}/attach{:016x}",
            s3.trim_end_matches('/'),
            rand::random::<u64>()
        );
        Some(SharedStores { server, bucket })
    }

    /// One machine's environment on the shared stores, its home (and blob cache) in `home`.
    fn open(&self, home: &Path) -> LocalEnvironment {
        let config = PgStoreConfig::default();
        let cache = BucketOptions::new(home.join("blobs"));
        let options = Options {
            log_store: Some(PgLogStore::opener_on(self.server.clone(), &config)),
            effects: Some(Arc::new(
                PgEffectStore::open(self.server.clone(), config).unwrap(),
            )),
            shared_blobs: Some(Arc::new(SharedBucket::open(&self.bucket, cache).unwrap())),
            ..Options::default()
        };
        LocalEnvironment::open(home, options).unwrap()
    }
}

/// A new working copy of the whole tree's version (what a second machine does to join): the
/// tree written into an empty directory and tracked from there, against `git clone` of the
/// same tree from a local bare repository (hard-linked objects, then a checkout). From the
/// embedded store, and from PostgreSQL and a bucket into a new home (each file's blob
/// fetched from the bucket, 64 requests in flight).
fn bench_attach(c: &mut Criterion) {
    const GROUP: &str = "attach a working copy of the whole tree";
    if !wanted(GROUP) {
        return;
    }
    let f = fixture();
    let bare = f.scratch.join("bare.git");
    let git = format!(
        "git --git-dir={} --work-tree=. -c user.name=bench -c user.email=bench@localhost",
        bare.display()
    );
    sh(
        &f.tree,
        &format!(
            "git init -q --bare {} && {git} add -A && {git} commit -q -m init",
            bare.display()
        ),
    );
    let mut g = c.benchmark_group(GROUP);
    g.sample_size(10);
    g.sampling_mode(criterion::SamplingMode::Flat);
    let fresh = FreshDirs::new(&f.scratch, "copy");
    let next = || fresh.next();
    g.bench_function("environment", |b| {
        b.iter_batched(
            next,
            |copy| {
                let mut cfg = TrackerConfig::new(&copy, ActorId::new("agent:second").unwrap());
                cfg.auto = false;
                drop(Tracker::attach(f.env.clone(), cfg).unwrap());
            },
            BatchSize::PerIteration,
        )
    });
    if let Some(shared) = SharedStores::new() {
        // The first machine: the tree captured into the shared stores, its blobs sent.
        let first = shared.open(&f.scratch.join("first-machine"));
        let mut cfg = TrackerConfig::new(&f.tree, ActorId::new("service:watcher").unwrap());
        cfg.auto = false;
        assert!(Tracker::begin_copy(&first, &cfg).unwrap());
        drop(Tracker::open(first.clone(), cfg).unwrap());
        let head = first.head("main").unwrap();
        let homes = FreshDirs::new(&f.scratch, "machine");
        g.bench_function("environment on PostgreSQL and a bucket", |b| {
            b.iter_batched(
                || (next(), homes.next()),
                |(copy, home)| {
                    let env = shared.open(&home);
                    let mut cfg = TrackerConfig::new(&copy, ActorId::new("agent:second").unwrap());
                    cfg.auto = false;
                    let tracker = Tracker::attach(env, cfg).unwrap();
                    assert_eq!(tracker.holds().unwrap(), head);
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.bench_function("git clone", |b| {
        b.iter_batched(
            next,
            |copy| {
                sh(
                    &f.scratch,
                    &format!("git clone -q {} {}", bare.display(), copy.display()),
                )
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn bench_first_capture(c: &mut Criterion) {
    if !wanted("first capture of the whole tree") {
        return;
    }
    let f = fixture();
    let mut g = c.benchmark_group("first capture of the whole tree");
    g.sample_size(10);
    g.sampling_mode(criterion::SamplingMode::Flat);
    let fresh = FreshDirs::new(&f.scratch, "first");
    let next = || fresh.next();
    g.bench_function("environment", |b| {
        b.iter_batched(
            next,
            |home| {
                let env = LocalEnvironment::open(&home, Options::default()).unwrap();
                let mut cfg = TrackerConfig::new(&f.tree, ActorId::new("service:watcher").unwrap());
                cfg.auto = false;
                drop(Tracker::open(env, cfg).unwrap());
            },
            BatchSize::PerIteration,
        )
    });
    g.bench_function("cp -a", |b| {
        b.iter_batched(
            next,
            |copy| {
                sh(
                    &f.scratch,
                    &format!("cp -a {} {}", f.tree.display(), copy.display()),
                )
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
    drop(fresh);
    drop(f.tracker);
}

fn bench_exec(c: &mut Criterion) {
    use environment_core::{ExecRequest, ShellExec};
    use environment_sandbox::{Isolation, IsolationSpec, Shell, Unconfined};
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    for i in 0..100 {
        let d = work.join(format!("d{}", i % 10));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}.txt")), format!("file {i}\n")).unwrap();
    }
    let env = LocalEnvironment::open(dir.path().join("home"), Options::default()).unwrap();
    // As a supervisor runs it: automatic captures on, held off while the command runs.
    let cfg = TrackerConfig::new(&work, ActorId::new("service:watcher").unwrap());
    let tracker = Arc::new(Tracker::open(env, cfg).unwrap());
    let shell = Shell::new(Arc::new(Unconfined::new(&work)), tracker.clone(), None).unwrap();
    // The same shell confined: user, mount and pid namespaces, the host read-only.
    let confined = Isolation::probe().ok().map(|_| {
        let isolation = Isolation::new(IsolationSpec::host(&work)).unwrap();
        Shell::new(Arc::new(isolation), tracker, None).unwrap()
    });
    let agent = ActorId::new("agent:bench").unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("exec");
    g.bench_function("recorded exec of true, capture included", |b| {
        b.iter(|| {
            let out = rt
                .block_on(shell.exec(ExecRequest::new(agent.clone(), ["true"])))
                .unwrap();
            assert!(out.exit.success());
        })
    });
    if let Some(confined) = &confined {
        g.bench_function("recorded exec of true in the sandbox", |b| {
            b.iter(|| {
                let out = rt
                    .block_on(confined.exec(ExecRequest::new(agent.clone(), ["true"])))
                    .unwrap();
                assert!(out.exit.success());
            })
        });
    } else {
        eprintln!("exec in the sandbox: skipped, this host refuses user namespaces");
    }
    g.bench_function("spawn and wait for true alone", |b| {
        b.iter(|| assert!(Command::new("true").status().unwrap().success()))
    });
    g.finish();
}

/// Forking the tree into 4 working trees (4 branches over one shared materialized base), beside
/// what forking replaces: one full copy with `cp -a`. The base is materialized once per version
/// before the measurement; its one-off cost is printed.
fn bench_fork(c: &mut Criterion) {
    if !wanted("fork") {
        return;
    }
    let f = fixture();
    let base = f.env.head("main").unwrap();
    let forks = Forks::open(f.env.clone(), ForkConfig::default()).unwrap();
    let started = std::time::Instant::now();
    forks.materialize(&base).unwrap();
    eprintln!(
        "materialization of the base ({} files), once per version: {:?}",
        f.files.len(),
        started.elapsed()
    );
    let agent = ActorId::new("agent:bench").unwrap();
    let mut g = c.benchmark_group("fork");
    let mut n = 0u64;
    g.bench_function("fork tree into 4 working trees", |b| {
        b.iter(|| {
            n += 1;
            forks
                .fork(&agent, &base, 4, &format!("bench/f{n}"))
                .unwrap()
        })
    });
    if bench_mode() {
        g.sample_size(10);
    }
    g.bench_function("peer: cp -a tree (one copy)", |b| {
        b.iter_batched(
            || {
                let _ = std::fs::remove_dir_all(f.scratch.join("copy"));
            },
            |()| sh(&f.scratch, &format!("cp -a {} copy", f.tree.display())),
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

/// Sandbox start to the first instruction: spawn `true` confined (host mode, every layer on:
/// namespaces, mounts, capabilities dropped, no_new_privs, Landlock, the seccomp filter) and
/// wait, against bubblewrap with the same layers but Landlock, which it lacks (`--unshare-all
/// --die-with-parent --cap-drop ALL`, our compiled filter through `--add-seccomp-fd`).
fn bench_sandbox_start(c: &mut Criterion) {
    use environment_sandbox::{Isolation, IsolationSpec, Launcher};
    if let Err(e) = Isolation::probe() {
        eprintln!("sandbox start: skipped, {e}");
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let mut spec = IsolationSpec::host(ws.path());
    let iso = Isolation::new(spec.clone()).unwrap();
    // Like bwrap's --unshare-all: a network namespace too.
    spec.network = false;
    let iso_no_net = Isolation::new(spec).unwrap();
    let mut g = c.benchmark_group("sandbox start to the first instruction");
    for (name, iso) in [
        ("environment launcher", &iso),
        ("environment launcher, network off", &iso_no_net),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                let mut cmd = Command::new("/bin/true");
                iso.confine(&mut cmd).unwrap();
                assert!(cmd.status().unwrap().success());
            })
        });
    }
    if have("bwrap") {
        let filters = environment_sandbox::isolate::compiled_filters().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<_> = filters
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let p = dir.path().join(format!("filter{i}"));
                std::fs::write(&p, f).unwrap();
                p
            })
            .collect();
        let ws_path = ws.path().to_str().unwrap().to_owned();
        g.bench_function("bwrap, same layers but Landlock", |b| {
            b.iter(|| {
                // Each run reads its filters from descriptors it inherits.
                let fds: Vec<std::fs::File> = files
                    .iter()
                    .map(|p| std::fs::File::open(p).unwrap())
                    .collect();
                let mut cmd = Command::new("bwrap");
                cmd.args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"])
                    .args(["--tmpfs", "/tmp", "--bind", &ws_path, &ws_path])
                    .args(["--unshare-all", "--die-with-parent", "--cap-drop", "ALL"]);
                for f in &fds {
                    rustix::io::fcntl_setfd(f, rustix::io::FdFlags::empty()).unwrap();
                    cmd.args(["--add-seccomp-fd", &f.as_raw_fd().to_string()]);
                }
                let st = cmd.arg("/bin/true").status().unwrap();
                assert!(st.success());
            })
        });
    } else {
        eprintln!("sandbox start: bwrap is not installed, peer skipped");
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).measurement_time(Duration::from_secs(5)).warm_up_time(Duration::from_secs(1));
    targets = bench_exec, bench_sandbox_start, bench_capture, bench_rescan, bench_restore, bench_wide_directory, bench_first_capture, bench_attach, bench_fork
}
criterion_main!(benches);
