//! The blob store: immutable files named by the blake3 hash of their content.
//!
//! A blob is written to a temporary file, fsynced, made read-only and renamed into place, so a
//! name either does not exist or holds the complete content. Garbage collection and writers are
//! kept apart by an advisory lock on `gc.lock`: writers hold it shared from the moment they store
//! a blob until the operation that refers to it has committed; the collector holds it exclusively
//! while it marks and sweeps, across processes as well as threads.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
#[cfg(test)]
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::error::BlobError;
use crate::hash::Hash;

/// The blob store of one environment.
#[derive(Debug)]
pub struct BlobStore {
    dir: PathBuf,
    tmp: PathBuf,
    lock_path: PathBuf,
    /// Which of the 256 fan-out directories this process knows to exist.
    fans: Vec<AtomicBool>,
}

/// Held while blobs are written and until the operation referring to them commits; garbage
/// collection waits for every guard to drop.
#[derive(Debug)]
pub struct WriteGuard(#[allow(dead_code)] File);

/// Held by garbage collection: no writer stores a blob meanwhile.
#[derive(Debug)]
pub struct SweepGuard(#[allow(dead_code)] File);

static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Temporary files start with this; no blob name does.
const TEMP_PREFIX: &str = ".tmp-";

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> BlobError + '_ {
    move |source| BlobError::Io {
        path: path.to_owned(),
        source,
    }
}

impl BlobStore {
    /// Opens (creating if needed) the blob store in `dir`.
    pub fn open(dir: impl Into<PathBuf>) -> Result<BlobStore, BlobError> {
        let dir = dir.into();
        let tmp = dir.join("tmp");
        fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
        let lock_path = dir.join("gc.lock");
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(&lock_path)
            .map_err(io_err(&lock_path))?;
        Ok(BlobStore {
            dir,
            tmp,
            lock_path,
            fans: (0..256).map(|_| AtomicBool::new(false)).collect(),
        })
    }

    /// Where the blob named `hash` lives (whether or not it exists).
    pub fn path_of(&self, hash: &Hash) -> PathBuf {
        let hex = hash.to_hex();
        self.dir.join(&hex[..2]).join(&hex[2..])
    }

    /// Takes the shared lock that keeps garbage collection away until the guard drops.
    pub fn write_guard(&self) -> Result<WriteGuard, BlobError> {
        let f = File::open(&self.lock_path).map_err(io_err(&self.lock_path))?;
        f.lock_shared().map_err(io_err(&self.lock_path))?;
        Ok(WriteGuard(f))
    }

    /// Takes the exclusive lock for a sweep; waits for writers to finish.
    pub fn sweep_guard(&self) -> Result<SweepGuard, BlobError> {
        let f = File::open(&self.lock_path).map_err(io_err(&self.lock_path))?;
        f.lock().map_err(io_err(&self.lock_path))?;
        Ok(SweepGuard(f))
    }

    /// Whether a blob exists.
    pub fn contains(&self, hash: &Hash) -> bool {
        self.path_of(hash).exists()
    }

    /// Stores `bytes` and returns their hash. Storing existing content is a cheap no-op.
    /// Call under a [`WriteGuard`] that lives until the referring operation commits.
    pub fn put(&self, bytes: &[u8]) -> Result<Hash, BlobError> {
        self.put_with(bytes, true)
    }

    /// Like [`BlobStore::put`] without the per-blob fsync: for storing many blobs at once,
    /// followed by one [`BlobStore::sync`] before anything refers to them.
    pub fn put_unsynced(&self, bytes: &[u8]) -> Result<Hash, BlobError> {
        self.put_with(bytes, false)
    }

    /// The hash known up front, the temporary file goes in the blob's own directory: a rename
    /// within one directory does not take the filesystem-wide lock a cross-directory rename
    /// takes, so parallel writers do not queue behind each other.
    fn put_with(&self, bytes: &[u8], durable: bool) -> Result<Hash, BlobError> {
        let hash = Hash(*blake3::hash(bytes).as_bytes());
        if self.contains(&hash) {
            return Ok(hash);
        }
        let fan = self.fan_dir(&hash)?;
        let (tmp_path, mut file) = self.temp_in(&fan)?;
        if let Err(e) = file.write_all(bytes) {
            let _ = fs::remove_file(&tmp_path);
            return Err(BlobError::Io {
                path: tmp_path,
                source: e,
            });
        }
        self.finish(hash, tmp_path, file, durable)?;
        Ok(hash)
    }

    /// Stores everything `reader` yields, hashing while copying, without holding it in memory.
    pub fn put_reader(&self, reader: impl Read) -> Result<(Hash, u64), BlobError> {
        self.put_reader_with(reader, true)
    }

    /// Like [`BlobStore::put_reader`] without the per-blob fsync.
    pub fn put_reader_unsynced(&self, reader: impl Read) -> Result<(Hash, u64), BlobError> {
        self.put_reader_with(reader, false)
    }

    /// Flushes everything written to the blob store's filesystem (one `syncfs`), making blobs
    /// stored without a per-blob fsync durable.
    pub fn sync(&self) -> Result<(), BlobError> {
        let dir = File::open(&self.dir).map_err(io_err(&self.dir))?;
        rustix::fs::syncfs(&dir).map_err(|e| BlobError::Io {
            path: self.dir.clone(),
            source: io::Error::from_raw_os_error(e.raw_os_error()),
        })
    }

    fn put_reader_with(
        &self,
        mut reader: impl Read,
        durable: bool,
    ) -> Result<(Hash, u64), BlobError> {
        let (tmp_path, mut file) = self.temp_in(&self.tmp)?;
        let mut hasher = blake3::Hasher::new();
        let mut buf = vec![0u8; 256 * 1024];
        let mut len = 0u64;
        let copied = (|| -> io::Result<()> {
            loop {
                let n = reader.read(&mut buf)?;
                if n == 0 {
                    return Ok(());
                }
                hasher.update(&buf[..n]);
                file.write_all(&buf[..n])?;
                len += n as u64;
            }
        })();
        if let Err(e) = copied {
            let _ = fs::remove_file(&tmp_path);
            return Err(BlobError::Io {
                path: tmp_path,
                source: e,
            });
        }
        let hash = Hash(*hasher.finalize().as_bytes());
        if self.contains(&hash) {
            let _ = fs::remove_file(&tmp_path);
            return Ok((hash, len));
        }
        self.fan_dir(&hash)?;
        self.finish(hash, tmp_path, file, durable)?;
        Ok((hash, len))
    }

    /// The directory of a blob, created on first use.
    fn fan_dir(&self, hash: &Hash) -> Result<PathBuf, BlobError> {
        let i = hash.0[0] as usize;
        let dir = self.dir.join(&hash.to_hex()[..2]);
        if !self.fans[i].load(Ordering::Relaxed) {
            match fs::create_dir(&dir) {
                Ok(()) => File::open(&self.dir)
                    .and_then(|d| d.sync_all())
                    .map_err(io_err(&self.dir))?,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(BlobError::Io {
                        path: dir,
                        source: e,
                    });
                }
            }
            self.fans[i].store(true, Ordering::Relaxed);
        }
        Ok(dir)
    }

    fn temp_in(&self, dir: &Path) -> Result<(PathBuf, File), BlobError> {
        let n = TMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("{TEMP_PREFIX}{}-{n}", std::process::id()));
        // Read-only from birth: the creating descriptor may still write, nobody else can, and
        // no chmod is needed before the rename.
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&path)
            .map_err(io_err(&path))?;
        Ok((path, file))
    }

    /// fsync, rename into place, fsync the directory: a durable blob is on disk before any
    /// operation can refer to it.
    fn finish(
        &self,
        hash: Hash,
        tmp_path: PathBuf,
        file: File,
        durable: bool,
    ) -> Result<(), BlobError> {
        let result = (|| -> io::Result<()> {
            if durable {
                file.sync_all()?;
            }
            drop(file);
            let dest = self.path_of(&hash);
            fs::rename(&tmp_path, &dest)?;
            if durable && let Some(parent) = dest.parent() {
                File::open(parent)?.sync_all()?;
            }
            Ok(())
        })();
        result.map_err(|e| {
            let _ = fs::remove_file(&tmp_path);
            BlobError::Io {
                path: tmp_path.clone(),
                source: e,
            }
        })
    }

    /// Reads a blob whole and checks that it still hashes to its name.
    pub fn get(&self, hash: &Hash) -> Result<Vec<u8>, BlobError> {
        let path = self.path_of(hash);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(BlobError::Missing(*hash)),
            Err(e) => return Err(BlobError::Io { path, source: e }),
        };
        let actual = Hash(*blake3::hash(&bytes).as_bytes());
        if actual != *hash {
            return Err(BlobError::Corrupt {
                expected: *hash,
                actual,
            });
        }
        Ok(bytes)
    }

    /// Every blob's hash (order unspecified). Stray files are skipped.
    pub fn list(&self) -> Result<Vec<Hash>, BlobError> {
        let mut out = Vec::new();
        for fan in fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let fan = fan.map_err(io_err(&self.dir))?;
            let name = fan.file_name();
            let Some(prefix) = name.to_str().filter(|n| n.len() == 2) else {
                continue;
            };
            let fan_path = fan.path();
            for entry in fs::read_dir(&fan_path).map_err(io_err(&fan_path))? {
                let entry = entry.map_err(io_err(&fan_path))?;
                if let Some(rest) = entry.file_name().to_str()
                    && let Ok(h) = format!("{prefix}{rest}").parse::<Hash>()
                {
                    out.push(h);
                }
            }
        }
        Ok(out)
    }

    /// Deletes a blob and returns its size. Only garbage collection calls this, under a
    /// [`SweepGuard`].
    pub(crate) fn remove(&self, hash: &Hash, _guard: &SweepGuard) -> Result<u64, BlobError> {
        let path = self.path_of(hash);
        let size = fs::symlink_metadata(&path).map(|m| m.len()).unwrap_or(0);
        match fs::remove_file(&path) {
            Ok(()) => Ok(size),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(e) => Err(BlobError::Io { path, source: e }),
        }
    }

    /// Removes temporary files of writers that died; under a [`SweepGuard`] no writer is alive.
    pub(crate) fn clear_temp(&self, _guard: &SweepGuard) -> Result<u64, BlobError> {
        let mut n = 0;
        let mut dirs = vec![self.tmp.clone()];
        for fan in fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let fan = fan.map_err(io_err(&self.dir))?;
            if fan.file_name().len() == 2 {
                dirs.push(fan.path());
            }
        }
        for dir in dirs {
            for entry in fs::read_dir(&dir).map_err(io_err(&dir))? {
                let entry = entry.map_err(io_err(&dir))?;
                let ours =
                    dir == self.tmp || entry.file_name().to_string_lossy().starts_with(TEMP_PREFIX);
                if ours && fs::remove_file(entry.path()).is_ok() {
                    n += 1;
                }
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_get_dedup_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let h = store.put(b"hello").unwrap();
        assert_eq!(store.put(b"hello").unwrap(), h);
        assert_eq!(store.get(&h).unwrap(), b"hello");
        let (h2, n) = store.put_reader(&b"hello"[..]).unwrap();
        assert_eq!((h2, n), (h, 5));
        let path = store.path_of(&h);
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o444
        );
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        fs::write(&path, b"hellp").unwrap();
        assert!(matches!(store.get(&h), Err(BlobError::Corrupt { .. })));
        assert_eq!(store.list().unwrap(), vec![h]);
    }
}
