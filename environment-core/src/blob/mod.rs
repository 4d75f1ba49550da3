//! The blob store: immutable content named by its blake3 hash.
//!
//! Small blobs (up to [`PACKED_MAX`]) are appended to packs (see `pack`): a first capture of a
//! tree of 100,000 small files writes a few large files, not 100,000 tiny ones. A larger blob is
//! a file of its own, written to a temporary file, fsynced, made read-only and renamed into
//! place, so a name either does not exist or holds the complete content. Either way a blob is
//! re-hashed when read, so damage on disk is an error, never wrong content. Garbage collection and writers are
//! kept apart by an advisory lock on `gc.lock`: writers hold it shared from the moment they store
//! a blob until the operation that refers to it has committed; the collector holds it exclusively
//! while it marks and sweeps, across processes as well as threads.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
#[cfg(test)]
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::error::BlobError;
use crate::hash::Hash;

mod chunked;
mod pack;
mod shared;

pub use chunked::{CHUNK_AVG, CHUNK_MAX, CHUNK_MIN, ChunkedPut, Manifest, Piece};
pub use pack::PACKED_MAX;
pub use shared::{ShareWindow, SharedBlobs};

/// The blob store of one environment.
#[derive(Debug)]
pub struct BlobStore {
    dir: PathBuf,
    tmp: PathBuf,
    lock_path: PathBuf,
    /// Which of the 256 fan-out directories this process knows to exist.
    fans: Vec<AtomicBool>,
    packs: pack::Packs,
    /// Blob files stored or deduplicated against without an fsync since the last sync.
    loose_unsynced: Mutex<Vec<PathBuf>>,
    /// The store shared by the environment's machines, of which this one is then a cache.
    shared: Option<shared::Shared>,
}

/// Where a blob's bytes are: a file of its own (offset 0), or a range of a pack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobLocation {
    /// The file holding the bytes.
    pub path: PathBuf,
    /// Where they start in it.
    pub offset: u64,
    /// How many there are.
    pub len: u64,
}

/// What the blob store holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlobUsage {
    /// Blobs stored.
    pub blobs: u64,
    /// Their content, in bytes (each blob counted once, however often it is referred to).
    pub bytes: u64,
}

/// What a sweep of the blob store did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Blobs kept because they live.
    pub kept: u64,
    /// Blobs removed.
    pub removed: u64,
    /// Their content, in bytes.
    pub bytes_removed: u64,
    /// Packs rewritten without their dead blobs.
    pub packs_rewritten: u64,
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

fn poisoned(path: &Path) -> BlobError {
    BlobError::Io {
        path: path.to_owned(),
        source: io::Error::other("a lock of the blob store was poisoned"),
    }
}

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
        let packs = pack::Packs::open(dir.join("packs"))?;
        Ok(BlobStore {
            dir,
            tmp,
            lock_path,
            fans: (0..256).map(|_| AtomicBool::new(false)).collect(),
            packs,
            loose_unsynced: Mutex::new(Vec::new()),
            shared: None,
        })
    }

    /// Where a blob of its own lives (whether or not it exists).
    fn loose_path(&self, hash: &Hash) -> PathBuf {
        let hex = hash.to_hex();
        self.dir.join(&hex[..2]).join(&hex[2..])
    }

    /// Where the blob's bytes are, if it is stored: for tools and tests that look at the disk.
    pub fn location(&self, hash: &Hash) -> Option<BlobLocation> {
        if let Some((path, offset, len)) = self.packs.location(hash) {
            return Some(BlobLocation { path, offset, len });
        }
        let path = self.loose_path(hash);
        let len = fs::symlink_metadata(&path).ok()?.len();
        Some(BlobLocation {
            path,
            offset: 0,
            len,
        })
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

    /// Whether a blob exists (stored by this process or any other).
    pub fn contains(&self, hash: &Hash) -> bool {
        self.packs.known(hash)
            || self.loose_path(hash).exists()
            || self.packs.contains(hash).unwrap_or(false)
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
        if bytes.len() <= PACKED_MAX {
            self.packs.put(hash, bytes)?;
            if durable {
                self.packs.sync()?;
            }
            return Ok(hash);
        }
        if self.loose_present(&hash, durable)? {
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

    /// Makes every blob stored (or found already stored) without a per-blob fsync since the
    /// last sync durable: the packs written, then the blob files and their directories.
    pub fn sync(&self) -> Result<(), BlobError> {
        self.packs.sync()?;
        let files = std::mem::take(
            &mut *self
                .loose_unsynced
                .lock()
                .map_err(|_| poisoned(&self.dir))?,
        );
        let mut dirs = std::collections::BTreeSet::new();
        for path in files {
            match File::open(&path).and_then(|f| f.sync_all()) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err(&path)(e)),
            }
            if let Some(parent) = path.parent() {
                dirs.insert(parent.to_owned());
            }
        }
        for dir in dirs {
            File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(io_err(&dir))?;
        }
        Ok(())
    }

    /// Whether a blob file exists; one found without a durable store of our own is synced by
    /// the next [`BlobStore::sync`] (its writer may not have synced it yet).
    fn loose_present(&self, hash: &Hash, durable: bool) -> Result<bool, BlobError> {
        let path = self.loose_path(hash);
        if !path.exists() {
            return Ok(false);
        }
        if durable {
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(io_err(&path))?;
        } else {
            self.note_unsynced(path)?;
        }
        Ok(true)
    }

    fn note_unsynced(&self, path: PathBuf) -> Result<(), BlobError> {
        self.loose_unsynced
            .lock()
            .map_err(|_| poisoned(&self.dir))?
            .push(path);
        Ok(())
    }

    fn put_reader_with(
        &self,
        mut reader: impl Read,
        durable: bool,
    ) -> Result<(Hash, u64), BlobError> {
        // Read the first bytes in memory: content that ends within them is packed.
        let mut head = Vec::new();
        (&mut reader)
            .take(PACKED_MAX as u64 + 1)
            .read_to_end(&mut head)
            .map_err(io_err(&self.tmp))?;
        if head.len() <= PACKED_MAX {
            let hash = self.put_with(&head, durable)?;
            return Ok((hash, head.len() as u64));
        }
        let (tmp_path, mut file) = self.temp_in(&self.tmp)?;
        let mut hasher = blake3::Hasher::new();
        let mut buf = vec![0u8; 256 * 1024];
        let mut len = 0u64;
        let copied = (|| -> io::Result<()> {
            hasher.update(&head);
            file.write_all(&head)?;
            len += head.len() as u64;
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
        if self.loose_present(&hash, durable)? {
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
            let dest = self.loose_path(&hash);
            fs::rename(&tmp_path, &dest)?;
            if durable && let Some(parent) = dest.parent() {
                File::open(parent)?.sync_all()?;
            }
            Ok(())
        })();
        if result.is_ok() && !durable {
            self.note_unsynced(self.loose_path(&hash))?;
        }
        result.map_err(|e| {
            let _ = fs::remove_file(&tmp_path);
            BlobError::Io {
                path: tmp_path.clone(),
                source: e,
            }
        })
    }

    /// Reads a blob whole and checks that it still hashes to its name; one missing here is
    /// fetched from the shared store, if there is one.
    pub fn get(&self, hash: &Hash) -> Result<Vec<u8>, BlobError> {
        match self.get_here(hash) {
            Err(BlobError::Missing(_)) if self.shared.is_some() => self.fetch(hash),
            // A cached copy left torn (written without an fsync, then the power went) is
            // dropped and fetched again: this store is then a cache, not the record.
            Err(BlobError::Corrupt { .. })
                if self.shared.is_some() && self.loose_path(hash).exists() =>
            {
                let path = self.loose_path(hash);
                fs::remove_file(&path).map_err(io_err(&path))?;
                self.fetch(hash)
            }
            found => found,
        }
    }

    /// [`BlobStore::get`] from this machine's store alone.
    fn get_here(&self, hash: &Hash) -> Result<Vec<u8>, BlobError> {
        if let Some(bytes) = self.packs.get(hash)? {
            return Ok(bytes);
        }
        let path = self.loose_path(hash);
        let bytes = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Packed by another process since we last looked, or moved by its collection.
                self.packs.refresh()?;
                return self.packs.get(hash)?.ok_or(BlobError::Missing(*hash));
            }
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
        Ok(self.list_sized()?.into_iter().map(|(h, _)| h).collect())
    }

    /// How many blobs are stored and how many bytes of content they hold.
    pub fn usage(&self) -> Result<BlobUsage, BlobError> {
        let all = self.list_sized()?;
        Ok(BlobUsage {
            blobs: all.len() as u64,
            bytes: all.iter().map(|(_, n)| n).sum(),
        })
    }

    /// Every blob with its size, packed ones first; a blob both packed and loose once.
    fn list_sized(&self) -> Result<Vec<(Hash, u64)>, BlobError> {
        self.packs.refresh()?;
        let mut out = self.packs.list();
        let packed: HashSet<Hash> = out.iter().map(|(h, _)| *h).collect();
        for h in self.loose()? {
            if !packed.contains(&h) {
                let len = fs::symlink_metadata(self.loose_path(&h)).map_or(0, |m| m.len());
                out.push((h, len));
            }
        }
        Ok(out)
    }

    /// The hashes of the blobs stored as files of their own.
    fn loose(&self) -> Result<Vec<Hash>, BlobError> {
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

    /// Removes every blob not in `live`: files deleted, packs collected (see `pack`). Only
    /// garbage collection calls this, under a [`SweepGuard`]: no writer stores a blob meanwhile.
    pub(crate) fn sweep(
        &self,
        live: &HashSet<Hash>,
        _guard: &SweepGuard,
    ) -> Result<SweepReport, BlobError> {
        let packed = self.packs.sweep(live)?;
        let mut report = SweepReport {
            kept: packed.kept,
            removed: packed.removed,
            bytes_removed: packed.bytes_removed,
            packs_rewritten: packed.packs_rewritten,
        };
        for h in self.loose()? {
            if live.contains(&h) {
                report.kept += 1;
                continue;
            }
            let path = self.loose_path(&h);
            let size = fs::symlink_metadata(&path).map_or(0, |m| m.len());
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(BlobError::Io { path, source: e }),
            }
            report.removed += 1;
            report.bytes_removed += size;
        }
        Ok(report)
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

    fn corrupt(loc: &BlobLocation) {
        fs::set_permissions(&loc.path, fs::Permissions::from_mode(0o644)).unwrap();
        let mut bytes = fs::read(&loc.path).unwrap();
        bytes[loc.offset as usize] ^= 1;
        fs::write(&loc.path, bytes).unwrap();
    }

    #[test]
    fn put_get_dedup_and_corruption_packed_and_loose() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let big = vec![9u8; PACKED_MAX + 1];
        for content in [&b"hello"[..], &big[..]] {
            let h = store.put(content).unwrap();
            assert_eq!(store.put(content).unwrap(), h);
            assert_eq!(store.get(&h).unwrap(), content);
            let (h2, n) = store.put_reader(content).unwrap();
            assert_eq!((h2, n), (h, content.len() as u64));
            let loc = store.location(&h).unwrap();
            assert_eq!(loc.len, content.len() as u64);
            assert_eq!(
                fs::metadata(&loc.path).unwrap().permissions().mode() & 0o777,
                0o444,
                "blob files and packs are read-only"
            );
            corrupt(&loc);
            assert!(matches!(store.get(&h), Err(BlobError::Corrupt { .. })));
        }
        assert_eq!(store.list().unwrap().len(), 2);
        assert_eq!(
            store.usage().unwrap(),
            BlobUsage {
                blobs: 2,
                bytes: 5 + big.len() as u64
            }
        );
    }
}
