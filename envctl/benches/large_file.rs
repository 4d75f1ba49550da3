//! A 1 GiB file with one byte changed, without a supervisor: `envctl status` (the capture)
//! against a full copy with `cp`, and `envctl restore` between the two versions against
//! `rsync -a` of the whole file, in one run; then the peak memory of each envctl command.
//!
//! `cargo bench -p envctl --bench large_file`; run once as a test it uses a 16 MiB file.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Command, Stdio};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use environment_benches::bench_mode;

const ENVCTL: &str = env!("CARGO_BIN_EXE_envctl");

fn command(dir: &Path, program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args)
        .current_dir(dir)
        .env("ENVIRONMENT_MONITOR_IDLE", "3600")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn run(dir: &Path, program: &str, args: &[&str]) {
    let out = command(dir, program, args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs an envctl command to its end and returns its peak resident memory in MiB.
fn peak_mib(dir: &Path, args: &[&str]) -> f64 {
    let (ok, kib) =
        environment_benches::peak_memory(command(dir, ENVCTL, args).stderr(Stdio::null()));
    assert!(ok, "envctl {args:?} failed");
    kib as f64 / 1024.0
}

fn poke(path: &Path, at: u64, byte: u8) {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .write_all_at(&[byte], at)
        .unwrap();
}

fn large_file(c: &mut Criterion) {
    let size: u64 = if bench_mode() { 1 << 30 } else { 16 << 20 };
    let tmp = tempfile::tempdir().unwrap();
    let tree = tmp.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    let big = tree.join("big.bin");
    {
        use std::io::Write;
        let mut out = std::io::BufWriter::new(std::fs::File::create(&big).unwrap());
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..size / 8 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            out.write_all(&x.to_le_bytes()).unwrap();
        }
    }
    run(&tree, ENVCTL, &["init"]);
    run(&tree, ENVCTL, &["mark", "a"]);
    let (copy_a, copy_b) = (tmp.path().join("a.bin"), tmp.path().join("b.bin"));
    std::fs::copy(&big, &copy_a).unwrap();
    poke(&big, size / 2, 0x55);
    run(&tree, ENVCTL, &["status"]);
    run(&tree, ENVCTL, &["mark", "b"]);
    std::fs::copy(&big, &copy_b).unwrap();

    let mut g = c.benchmark_group("a 1 GiB file, one byte changed");
    g.sample_size(10);
    let mut n = 0u64;
    g.bench_function("envctl status (captures it)", |b| {
        b.iter_batched(
            || {
                n += 1;
                poke(&big, (n * 7_919_000) % size, n as u8);
            },
            |_| run(&tree, ENVCTL, &["status"]),
            BatchSize::PerIteration,
        )
    });
    let snap = tmp.path().join("snap.bin");
    g.bench_function("cp (a full copy)", |b| {
        b.iter(|| {
            run(
                &tree,
                "cp",
                &["--reflink=never", "big.bin", snap.to_str().unwrap()],
            )
        })
    });
    let _ = std::fs::remove_file(&snap);
    let mut side = false;
    g.bench_function("envctl restore", |b| {
        b.iter(|| {
            side = !side;
            run(&tree, ENVCTL, &["restore", if side { "a" } else { "b" }]);
        })
    });
    g.bench_function("rsync -a (the whole file)", |b| {
        b.iter(|| {
            side = !side;
            let from = if side { &copy_a } else { &copy_b };
            run(
                &tree,
                "rsync",
                &["-a", "--ignore-times", from.to_str().unwrap(), "big.bin"],
            );
        })
    });
    g.finish();

    poke(&big, 12345, 0xAA);
    let status = peak_mib(&tree, &["status"]);
    let restore = peak_mib(&tree, &["restore", "a"]);
    eprintln!(
        "peak memory with a {} MiB file: envctl status {status:.1} MiB, envctl restore {restore:.1} MiB",
        size >> 20
    );
}

criterion_group!(benches, large_file);
criterion_main!(benches);
