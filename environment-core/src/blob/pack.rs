//! Packs: small blobs appended to shared files instead of a file each.
//!
//! A file per 2 KiB blob costs an inode, a directory entry, a create and a rename: more than its
//! bytes. Small blobs are appended to a pack (`<name>.pack`) and named in the pack's index
//! (`<name>.idx`), a sequence of fixed-size records read whole into a map when the store is
//! first used for a blob (opening a store to read the history reads no index).
//!
//! - **Ownership.** A process appends only to packs it created, and holds an exclusive `flock`
//!   on each one's index while it may still append. A pack whose lock can be taken has no
//!   writer: garbage collection may rewrite it, and a loader may repair its torn tail.
//! - **Durability.** A sync fsyncs the pack, then writes the pending index records followed by a
//!   *confirmation* record and fsyncs the index. Records after the last confirmation may, after
//!   a power loss, name bytes that never reached the disk: the loader re-hashes those of packs
//!   without a writer, and the first bad one ends the index. Blob writers never trust a record
//!   they have not confirmed or checked, so a crash never leaves a name without its content.
//! - **Immutability.** Bytes once appended are never changed; collection marks dead records
//!   with a *dead* record, and rewrites a pack whose dead bytes outweigh its live ones into a
//!   fresh pack before deleting it (index first, so no name ever points into a deleted pack).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::{io_err, poisoned};
use crate::error::BlobError;
use crate::hash::{DigestMap, Hash};

/// Blobs up to this size are packed; larger ones get a file of their own.
pub const PACKED_MAX: usize = 64 * 1024;

/// A pack stops taking blobs past this size: collection rewrites whole packs, so smaller packs
/// mean less copying for the same garbage.
const PACK_TARGET: u64 = 64 * 1024 * 1024;

/// Packs smaller than this are merged by collection when there are several.
const SMALL_PACK: u64 = 4 * 1024 * 1024;

/// Pending index records are written out once this many bytes have gathered.
const PENDING_MAX: usize = 64 * 1024;

const MAGIC: &[u8; 8] = b"envpack1";
/// The extension of an index until its writer has locked it.
const NEW_INDEX: &str = "idx-new";
const RECORD: usize = 52;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// A blob: hash, offset and length in the pack.
    Blob = 0,
    /// The blob record with this hash and offset is dead (collected).
    Dead = 1,
    /// Every record before this one names bytes already synced to disk.
    Confirmed = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Record {
    hash: Hash,
    offset: u64,
    len: u32,
    kind: Kind,
}

impl Record {
    fn encode(&self) -> [u8; RECORD] {
        let mut out = [0u8; RECORD];
        out[..32].copy_from_slice(&self.hash.0);
        out[32..40].copy_from_slice(&self.offset.to_le_bytes());
        out[40..44].copy_from_slice(&self.len.to_le_bytes());
        out[44..48].copy_from_slice(&(self.kind as u32).to_le_bytes());
        let check = check_of(&out[..48]);
        out[48..].copy_from_slice(&check);
        out
    }

    /// `None` for a torn or damaged record.
    fn decode(b: &[u8]) -> Option<Record> {
        if b.len() < RECORD || b[48..RECORD] != check_of(&b[..48]) {
            return None;
        }
        let kind = match u32::from_le_bytes(b[44..48].try_into().ok()?) {
            0 => Kind::Blob,
            1 => Kind::Dead,
            2 => Kind::Confirmed,
            _ => return None,
        };
        Some(Record {
            hash: Hash::from_slice(&b[..32])?,
            offset: u64::from_le_bytes(b[32..40].try_into().ok()?),
            len: u32::from_le_bytes(b[40..44].try_into().ok()?),
            kind,
        })
    }

    fn confirmed(data_len: u64) -> Record {
        Record {
            hash: Hash([0; 32]),
            offset: data_len,
            len: 0,
            kind: Kind::Confirmed,
        }
    }
}

fn check_of(bytes: &[u8]) -> [u8; 4] {
    let h = blake3::hash(bytes);
    let mut c = [0u8; 4];
    c.copy_from_slice(&h.as_bytes()[..4]);
    c
}

/// An index file parsed: its valid records and where the valid part ends.
struct Parsed {
    records: Vec<Record>,
    /// Bytes of the file that hold whole, valid records (header included).
    valid_len: u64,
    /// Records before this position are confirmed durable.
    confirmed: usize,
}

fn parse(bytes: &[u8]) -> Parsed {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Parsed {
            records: Vec::new(),
            valid_len: 0,
            confirmed: 0,
        };
    }
    let mut records = Vec::with_capacity((bytes.len() - MAGIC.len()) / RECORD);
    let mut confirmed = 0;
    let mut pos = MAGIC.len();
    while let Some(r) = bytes.get(pos..pos + RECORD).and_then(Record::decode) {
        if r.kind == Kind::Confirmed {
            confirmed = records.len();
        }
        records.push(r);
        pos += RECORD;
    }
    Parsed {
        records,
        valid_len: pos as u64,
        confirmed,
    }
}

/// Where a packed blob lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Loc {
    pack: u32,
    offset: u64,
    len: u32,
}

/// A pack as this process knows it.
struct Pack {
    name: String,
    /// Read descriptor, opened on first read and kept: a pack deleted by another process's
    /// collection stays readable through it.
    reader: Option<Arc<File>>,
    /// Bytes of the index already read.
    idx_read: u64,
    /// Whether this process appends to it.
    ours: bool,
    /// Bytes of the pack known to be on disk (confirmed): a blob within them needs no sync.
    durable: u64,
    gone: bool,
}

#[derive(Default)]
struct Index {
    packs: Vec<Pack>,
    by_name: HashMap<String, u32>,
    map: DigestMap<Loc>,
}

impl Index {
    fn apply(&mut self, pack: u32, records: &[Record]) {
        for r in records {
            match r.kind {
                Kind::Blob => {
                    self.map.entry(r.hash).or_insert(Loc {
                        pack,
                        offset: r.offset,
                        len: r.len,
                    });
                }
                Kind::Dead => {
                    if self
                        .map
                        .get(&r.hash)
                        .is_some_and(|l| l.pack == pack && l.offset == r.offset)
                    {
                        self.map.remove(&r.hash);
                    }
                }
                Kind::Confirmed => {
                    let p = &mut self.packs[pack as usize];
                    p.durable = p.durable.max(r.offset);
                }
            }
        }
    }
}

/// The pack this process appends to.
struct Active {
    id: u32,
    data: File,
    /// The index, opened for appending and holding the pack's lock.
    idx: File,
    data_len: u64,
    /// Bytes of the index written out.
    idx_len: u64,
    /// Index records not yet written out.
    pending: Vec<u8>,
}

/// What a sweep of the packs did.
#[derive(Debug, Default)]
pub(super) struct PackSweep {
    pub kept: u64,
    pub removed: u64,
    pub bytes_removed: u64,
    pub packs_rewritten: u64,
}

/// The packs of one blob store.
pub(super) struct Packs {
    dir: PathBuf,
    /// Read through [`Packs::index`], which loads it first, where the whole map is needed
    /// (lookups); this process's own packs and appends are in it from the start.
    index: RwLock<Index>,
    /// The indexes were read once: from then on [`Packs::refresh`] reads only what is new.
    loaded: std::sync::atomic::AtomicBool,
    first_load: Mutex<()>,
    active: Mutex<Option<Active>>,
    /// Packs holding blobs written or deduplicated against since the last sync.
    unsynced: Mutex<BTreeSet<u32>>,
}

static PACK_COUNTER: AtomicU64 = AtomicU64::new(0);

impl Packs {
    pub fn open(dir: PathBuf) -> Result<Packs, BlobError> {
        fs::create_dir_all(&dir).map_err(io_err(&dir))?;
        let packs = Packs {
            dir,
            index: RwLock::new(Index::default()),
            loaded: std::sync::atomic::AtomicBool::new(false),
            first_load: Mutex::new(()),
            active: Mutex::new(None),
            unsynced: Mutex::new(BTreeSet::new()),
        };
        Ok(packs)
    }

    /// The index, read from disk the first time it is needed.
    fn index(&self) -> Result<&RwLock<Index>, BlobError> {
        if !self.loaded.load(Ordering::Acquire) {
            // One first load at a time: parallel writers all arrive here at once.
            let _first = self.first_load.lock().map_err(|_| poisoned(&self.dir))?;
            if !self.loaded.load(Ordering::Acquire) {
                self.refresh()?;
            }
        }
        Ok(&self.index)
    }

    fn path(&self, name: &str, ext: &str) -> PathBuf {
        self.dir.join(format!("{name}.{ext}"))
    }

    /// Reads packs and index records that appeared since the last look (written by other
    /// processes), and forgets packs that were deleted.
    pub fn refresh(&self) -> Result<(), BlobError> {
        // Our own records on disk first: a rebuild below reads them back from there.
        self.flush();
        let mut names = BTreeSet::new();
        for e in fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let e = e.map_err(io_err(&self.dir))?;
            if let Some(name) = e.file_name().to_str().and_then(|n| n.strip_suffix(".idx")) {
                names.insert(name.to_owned());
            }
        }
        let mut index = self.index.write().map_err(|_| poisoned(&self.dir))?;
        // A pack this process appends to holds its lock, so nobody else collects it; one that
        // is missing from the listing was created after the listing was read.
        if index
            .packs
            .iter()
            .any(|p| !p.gone && !p.ours && !names.contains(&p.name))
        {
            // Another process collected a pack: rebuild the map, so a blob it moved is found
            // where it now lives.
            // What this process appends meanwhile stays: its own packs are not reread.
            for p in index.packs.iter_mut().filter(|p| !p.ours) {
                if !names.contains(&p.name) {
                    p.gone = true;
                    p.reader = None;
                }
                p.idx_read = 0;
            }
            let packs = &index.packs;
            let ours: HashSet<u32> = (0..packs.len() as u32)
                .filter(|id| packs[*id as usize].ours)
                .collect();
            index.map.retain(|_, loc| ours.contains(&loc.pack));
        }
        for name in names {
            let id = match index.by_name.get(&name) {
                Some(id) => *id,
                None => {
                    let id = index.packs.len() as u32;
                    index.packs.push(Pack {
                        name: name.clone(),
                        reader: None,
                        idx_read: 0,
                        ours: false,
                        durable: 0,
                        gone: false,
                    });
                    index.by_name.insert(name, id);
                    id
                }
            };
            self.load(&mut index, id)?;
        }
        self.loaded.store(true, Ordering::Release);
        Ok(())
    }

    /// Reads the part of a pack's index not read yet. A pack without a writer has its
    /// unconfirmed records checked against its bytes first, and its index repaired.
    fn load(&self, index: &mut Index, id: u32) -> Result<(), BlobError> {
        let pack = &index.packs[id as usize];
        // This process knows its own records, unless the map is being rebuilt.
        if pack.gone || (pack.ours && pack.idx_read > 0) {
            return Ok(());
        }
        let (name, ours, from) = (pack.name.clone(), pack.ours, pack.idx_read);
        let idx_path = self.path(&name, "idx");
        let mut bytes = Vec::new();
        let mut f = match File::open(&idx_path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err(&idx_path)(e)),
        };
        if from == 0 && !ours && f.try_lock().is_ok() {
            // No writer: make the index trustworthy before anyone relies on it.
            let repaired = self.repair(&name, &f)?;
            index.apply(id, &repaired.records);
            index.packs[id as usize].idx_read = repaired.valid_len;
            return Ok(());
        }
        if from == 0 {
            f.read_to_end(&mut bytes).map_err(io_err(&idx_path))?;
            let parsed = parse(&bytes);
            index.apply(id, &parsed.records);
            index.packs[id as usize].idx_read = parsed.valid_len;
        } else {
            // Only the records appended since the last look: a reader that looks again after
            // every miss (a cache filling from a shared store) costs what is new, not the
            // whole index each time.
            f.seek(io::SeekFrom::Start(from))
                .map_err(io_err(&idx_path))?;
            f.read_to_end(&mut bytes).map_err(io_err(&idx_path))?;
            // Records are appended whole by their writer; a partial one at the end is still
            // being written and is read next time.
            let mut records = Vec::new();
            let mut pos = 0;
            while let Some(r) = bytes.get(pos..pos + RECORD).and_then(Record::decode) {
                records.push(r);
                pos += RECORD;
            }
            index.apply(id, &records);
            index.packs[id as usize].idx_read = from + pos as u64;
        }
        Ok(())
    }

    /// Under the pack's lock: drops a torn tail and any unconfirmed record whose bytes do not
    /// hash to its name, then confirms what is left.
    fn repair(&self, name: &str, locked: &File) -> Result<Parsed, BlobError> {
        let idx_path = self.path(name, "idx");
        let pack_path = self.path(name, "pack");
        let mut bytes = Vec::new();
        (&*locked)
            .read_to_end(&mut bytes)
            .map_err(io_err(&idx_path))?;
        let mut parsed = parse(&bytes);
        let unconfirmed = parsed.records.len() > parsed.confirmed
            && parsed.records.last().map(|r| r.kind) != Some(Kind::Confirmed);
        if !unconfirmed && parsed.valid_len == bytes.len() as u64 {
            return Ok(parsed);
        }
        let data = match File::open(&pack_path) {
            Ok(f) => Some(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(&pack_path)(e)),
        };
        let mut keep = parsed.confirmed;
        for r in &parsed.records[parsed.confirmed..] {
            let ok = match (r.kind, &data) {
                (Kind::Blob, Some(d)) => read_checked(d, r.hash, r.offset, r.len).is_ok(),
                (Kind::Blob, None) => false,
                (Kind::Dead | Kind::Confirmed, _) => true,
            };
            if !ok {
                break;
            }
            keep += 1;
        }
        parsed.records.truncate(keep);
        let valid_len = (MAGIC.len() + keep * RECORD) as u64;
        let data_len = data
            .as_ref()
            .and_then(|d| d.metadata().ok())
            .map_or(0, |m| m.len());
        let w = OpenOptions::new()
            .write(true)
            .open(&idx_path)
            .map_err(io_err(&idx_path))?;
        let fixed = (|| -> io::Result<()> {
            if parsed.valid_len == 0 {
                // Not even a header survived.
                w.set_len(0)?;
                w.write_all_at(MAGIC, 0)?;
            } else {
                w.set_len(valid_len)?;
            }
            if let Some(d) = &data {
                d.sync_all()?;
            }
            w.write_all_at(&Record::confirmed(data_len).encode(), valid_len)?;
            w.sync_all()
        })();
        fixed.map_err(io_err(&idx_path))?;
        parsed.records.push(Record::confirmed(data_len));
        parsed.valid_len = valid_len + RECORD as u64;
        parsed.confirmed = parsed.records.len() - 1;
        Ok(parsed)
    }

    /// Whether this process knows the blob (no look at other processes' new records). What it
    /// packed itself is known before the indexes are read, so a command that checks only the
    /// blobs it wrote never reads them.
    pub fn known(&self, hash: &Hash) -> bool {
        self.index.read().is_ok_and(|i| i.map.contains_key(hash))
            || self
                .index()
                .is_ok_and(|l| l.read().is_ok_and(|i| i.map.contains_key(hash)))
    }

    /// Whether the blob is packed, looking again at the packs on a miss.
    pub fn contains(&self, hash: &Hash) -> Result<bool, BlobError> {
        if self.known(hash) {
            return Ok(true);
        }
        self.refresh()?;
        Ok(self.known(hash))
    }

    /// Appends a blob unless it is already packed. `bytes` hash to `hash`.
    pub fn put(&self, hash: Hash, bytes: &[u8]) -> Result<(), BlobError> {
        // Before the indexes are read, only what this process packed is known: a blob packed
        // by an earlier process is packed again rather than every index read for a few writes
        // (a command that writes a few blobs costs what it writes; collection keeps one copy).
        let found = self.index.read().ok().and_then(|i| {
            let loc = i.map.get(&hash).copied()?;
            Some((
                loc,
                loc.offset + u64::from(loc.len) <= i.packs[loc.pack as usize].durable,
            ))
        });
        if let Some((loc, durable)) = found {
            if !durable {
                // The copy found (ours or another process's) may not be on disk yet: the next
                // sync makes sure of it before anything refers to it.
                self.unsynced
                    .lock()
                    .map_err(|_| poisoned(&self.dir))?
                    .insert(loc.pack);
            }
            return Ok(());
        }
        self.append(hash, bytes, false)
    }

    /// Appends a blob to our pack; `moving` appends even when the blob is known (elsewhere),
    /// and makes the new copy the one the map names.
    fn append(&self, hash: Hash, bytes: &[u8], moving: bool) -> Result<(), BlobError> {
        let mut active = self.active.lock().map_err(|_| poisoned(&self.dir))?;
        // Appended by another thread meanwhile? (The map as it is: loading the indexes takes
        // the lock held here.)
        if !moving && self.index.read().is_ok_and(|i| i.map.contains_key(&hash)) {
            return Ok(());
        }
        if active.as_ref().is_none_or(|a| a.data_len >= PACK_TARGET) {
            self.rotate(&mut active)?;
        }
        let a = active.as_mut().ok_or_else(|| poisoned(&self.dir))?;
        let offset = a.data_len;
        a.data.write_all_at(bytes, offset).map_err(|e| {
            let path = self.dir.clone();
            BlobError::Io { path, source: e }
        })?;
        a.data_len += bytes.len() as u64;
        let loc = Loc {
            pack: a.id,
            offset,
            len: bytes.len() as u32,
        };
        a.pending.extend_from_slice(
            &Record {
                hash,
                offset,
                len: loc.len,
                kind: Kind::Blob,
            }
            .encode(),
        );
        if a.pending.len() >= PENDING_MAX {
            self.write_pending(a)?;
        }
        self.index
            .write()
            .map_err(|_| poisoned(&self.dir))?
            .map
            .insert(hash, loc);
        self.unsynced
            .lock()
            .map_err(|_| poisoned(&self.dir))?
            .insert(a.id);
        Ok(())
    }

    fn write_pending(&self, a: &mut Active) -> Result<(), BlobError> {
        if a.pending.is_empty() {
            return Ok(());
        }
        a.idx.write_all(&a.pending).map_err(|e| BlobError::Io {
            path: self.dir.clone(),
            source: e,
        })?;
        a.idx_len += a.pending.len() as u64;
        a.pending.clear();
        Ok(())
    }

    /// Seals the active pack (if any) and starts a new one.
    fn rotate(&self, active: &mut Option<Active>) -> Result<(), BlobError> {
        if let Some(old) = active.take() {
            self.seal(old)?;
        }
        let n = PACK_COUNTER.fetch_add(1, Ordering::Relaxed);
        let seed = format!(
            "{}-{}-{n}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
            std::thread::current().id()
        );
        let name = blake3::hash(seed.as_bytes()).to_hex()[..20].to_owned();
        let idx_path = self.path(&name, "idx");
        let pack_path = self.path(&name, "pack");
        // The index is locked before it gets its name: a loader never finds it unlocked and
        // takes its writer for dead.
        let new_path = self.path(&name, NEW_INDEX);
        let mut idx = OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o644)
            .open(&new_path)
            .map_err(io_err(&new_path))?;
        idx.try_lock().map_err(|e| BlobError::Io {
            path: new_path.clone(),
            source: io::Error::other(e.to_string()),
        })?;
        idx.write_all(MAGIC).map_err(io_err(&new_path))?;
        fs::rename(&new_path, &idx_path).map_err(io_err(&idx_path))?;
        // Only this process writes into the pack, and only at offsets it has not written yet.
        let data = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&pack_path)
            .map_err(io_err(&pack_path))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io_err(&self.dir))?;
        let mut index = self.index.write().map_err(|_| poisoned(&self.dir))?;
        let id = index.packs.len() as u32;
        index.packs.push(Pack {
            name: name.clone(),
            reader: None,
            idx_read: MAGIC.len() as u64,
            ours: true,
            durable: 0,
            gone: false,
        });
        index.by_name.insert(name, id);
        *active = Some(Active {
            id,
            data,
            idx,
            data_len: 0,
            idx_len: MAGIC.len() as u64,
            pending: Vec::new(),
        });
        Ok(())
    }

    /// Stops appending to a pack: its records written out and its lock released (when the
    /// descriptor drops), it is a pack like any other process's from now on.
    fn seal(&self, mut a: Active) -> Result<(), BlobError> {
        self.write_pending(&mut a)?;
        let mut index = self.index.write().map_err(|_| poisoned(&self.dir))?;
        let pack = &mut index.packs[a.id as usize];
        pack.ours = false;
        pack.idx_read = a.idx_len;
        Ok(())
    }

    /// Makes every blob written or deduplicated against since the last sync durable.
    pub fn sync(&self) -> Result<(), BlobError> {
        let ids: Vec<u32> =
            std::mem::take(&mut *self.unsynced.lock().map_err(|_| poisoned(&self.dir))?)
                .into_iter()
                .collect();
        if ids.is_empty() {
            return Ok(());
        }
        let mut active = self.active.lock().map_err(|_| poisoned(&self.dir))?;
        for id in ids {
            match active.as_mut().filter(|a| a.id == id) {
                Some(a) => {
                    if self.durable_len(id)? >= a.data_len {
                        // Another caller's sync covered our bytes while we waited for the lock.
                        continue;
                    }
                    let io = |e| BlobError::Io {
                        path: self.dir.clone(),
                        source: e,
                    };
                    a.data.sync_data().map_err(io)?;
                    a.pending
                        .extend_from_slice(&Record::confirmed(a.data_len).encode());
                    self.write_pending(a)?;
                    a.idx.sync_data().map_err(io)?;
                    self.mark_durable(id, a.data_len)?;
                }
                None => {
                    // Another process's pack (or one of ours since sealed): its bytes and
                    // records must be on disk too.
                    let name = self.name_of(id)?;
                    let pack_path = self.path(&name, "pack");
                    let len = fs::metadata(&pack_path).map_or(0, |m| m.len());
                    for path in [pack_path, self.path(&name, "idx")] {
                        match File::open(&path).and_then(|f| f.sync_data()) {
                            Ok(()) => {}
                            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                            Err(e) => return Err(io_err(&path)(e)),
                        }
                    }
                    self.mark_durable(id, len)?;
                }
            }
        }
        Ok(())
    }

    fn durable_len(&self, id: u32) -> Result<u64, BlobError> {
        let index = self.index.read().map_err(|_| poisoned(&self.dir))?;
        Ok(index.packs[id as usize].durable)
    }

    fn mark_durable(&self, id: u32, len: u64) -> Result<(), BlobError> {
        let mut index = self.index.write().map_err(|_| poisoned(&self.dir))?;
        let pack = &mut index.packs[id as usize];
        pack.durable = pack.durable.max(len);
        Ok(())
    }

    fn name_of(&self, id: u32) -> Result<String, BlobError> {
        let index = self.index.read().map_err(|_| poisoned(&self.dir))?;
        Ok(index.packs[id as usize].name.clone())
    }

    /// Where a packed blob lives: (pack file, offset, length).
    pub fn location(&self, hash: &Hash) -> Option<(PathBuf, u64, u64)> {
        let index = self.index().ok()?.read().ok()?;
        let loc = index.map.get(hash)?;
        let name = &index.packs[loc.pack as usize].name;
        Some((self.path(name, "pack"), loc.offset, u64::from(loc.len)))
    }

    /// Reads a packed blob and checks it; `None` if it is not packed (as far as this process
    /// knows).
    pub fn get(&self, hash: &Hash) -> Result<Option<Vec<u8>>, BlobError> {
        let Some((reader, loc)) = self.reader_for(hash)? else {
            return Ok(None);
        };
        read_checked(&reader, *hash, loc.offset, loc.len).map(Some)
    }

    fn reader_for(&self, hash: &Hash) -> Result<Option<(Arc<File>, Loc)>, BlobError> {
        {
            let index = self.index()?.read().map_err(|_| poisoned(&self.dir))?;
            let Some(loc) = index.map.get(hash).copied() else {
                return Ok(None);
            };
            if let Some(r) = &index.packs[loc.pack as usize].reader {
                return Ok(Some((r.clone(), loc)));
            }
        }
        let mut index = self.index()?.write().map_err(|_| poisoned(&self.dir))?;
        let Some(loc) = index.map.get(hash).copied() else {
            return Ok(None);
        };
        let path = self.path(&index.packs[loc.pack as usize].name, "pack");
        let file = match File::open(&path) {
            Ok(f) => Arc::new(f),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(&path)(e)),
        };
        index.packs[loc.pack as usize].reader = Some(file.clone());
        Ok(Some((file, loc)))
    }

    /// Every packed blob with its size.
    pub fn list(&self) -> Vec<(Hash, u64)> {
        self.index()
            .ok()
            .and_then(|l| l.read().ok())
            .map_or_else(Vec::new, |i| {
                i.map.iter().map(|(h, l)| (*h, u64::from(l.len))).collect()
            })
    }

    /// Writes out pending index records (no fsync): at close, so the next opening of the
    /// store sees what this one packed.
    pub fn flush(&self) {
        if let Ok(mut active) = self.active.lock()
            && let Some(a) = active.as_mut()
        {
            let _ = self.write_pending(a);
        }
    }

    /// Collection, under the sweep guard (no writer anywhere): packs nobody appends to lose
    /// their dead blobs — marked dead in place, or the pack rewritten when dead bytes
    /// outweigh live ones, or deleted when nothing in it lives.
    pub fn sweep(&self, live: &HashSet<Hash>) -> Result<PackSweep, BlobError> {
        self.refresh()?;
        {
            // Our own pack is sealed first, so it can be collected like the others.
            let active = self.active.lock().map_err(|_| poisoned(&self.dir))?;
            if let Some(a) = active.as_ref() {
                self.unsynced
                    .lock()
                    .map_err(|_| poisoned(&self.dir))?
                    .insert(a.id);
            }
            drop(active);
            self.sync()?;
            let mut active = self.active.lock().map_err(|_| poisoned(&self.dir))?;
            if let Some(a) = active.take() {
                self.seal(a)?;
            }
        }
        let mut report = PackSweep::default();
        let candidates: Vec<(u32, String)> = {
            let index = self.index()?.read().map_err(|_| poisoned(&self.dir))?;
            index
                .packs
                .iter()
                .enumerate()
                .filter(|(_, p)| !p.gone && !p.ours)
                .map(|(i, p)| (i as u32, p.name.clone()))
                .collect()
        };
        // Every process that stores something starts a pack of its own, so short-lived ones
        // (a command-line call) leave many small packs: collection merges them, which also
        // keeps the number of index files read at open in check.
        let size = |name: &str| fs::metadata(self.path(name, "pack")).map_or(0, |m| m.len());
        let small = candidates
            .iter()
            .filter(|(_, name)| size(name) < SMALL_PACK)
            .count();
        for (id, name) in candidates {
            let merge = small >= 2 && size(&name) < SMALL_PACK;
            self.sweep_pack(id, &name, live, merge, &mut report)?;
        }
        self.sweep_orphans()?;
        Ok(report)
    }

    fn sweep_pack(
        &self,
        id: u32,
        name: &str,
        live: &HashSet<Hash>,
        merge: bool,
        report: &mut PackSweep,
    ) -> Result<(), BlobError> {
        let idx_path = self.path(name, "idx");
        let pack_path = self.path(name, "pack");
        let lock = match File::open(&idx_path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io_err(&idx_path)(e)),
        };
        if lock.try_lock().is_err() {
            // Another process still appends to it.
            return Ok(());
        }
        let parsed = self.repair(name, &lock)?;
        let data_len = fs::metadata(&pack_path).map_or(0, |m| m.len());
        let mut alive = Vec::new();
        let mut dead = Vec::new();
        {
            let index = self.index()?.read().map_err(|_| poisoned(&self.dir))?;
            for r in parsed.records.iter().filter(|r| r.kind == Kind::Blob) {
                let here = index
                    .map
                    .get(&r.hash)
                    .is_some_and(|l| l.pack == id && l.offset == r.offset);
                if !here {
                    continue;
                }
                if live.contains(&r.hash) {
                    alive.push(*r);
                } else {
                    dead.push(*r);
                }
            }
        }
        let live_bytes: u64 = alive.iter().map(|r| u64::from(r.len)).sum();
        report.kept += alive.len() as u64;
        report.removed += dead.len() as u64;
        report.bytes_removed += dead.iter().map(|r| u64::from(r.len)).sum::<u64>();
        if alive.is_empty() || merge || live_bytes * 2 < data_len {
            // Copy what lives into our pack, make it durable, then forget this one: index
            // first, so no record ever names bytes in a deleted pack.
            let reader = File::open(&pack_path).map_err(io_err(&pack_path))?;
            for r in &alive {
                let bytes = read_checked(&reader, r.hash, r.offset, r.len)?;
                self.append(r.hash, &bytes, true)?;
            }
            self.sync()?;
            let mut index = self.index()?.write().map_err(|_| poisoned(&self.dir))?;
            for r in &dead {
                index.map.remove(&r.hash);
            }
            index.packs[id as usize].gone = true;
            index.packs[id as usize].reader = None;
            drop(index);
            fs::remove_file(&idx_path).map_err(io_err(&idx_path))?;
            match fs::remove_file(&pack_path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(&pack_path)(e)),
            }
            if !alive.is_empty() {
                report.packs_rewritten += 1;
            }
        } else if !dead.is_empty() {
            let mut w = OpenOptions::new()
                .append(true)
                .open(&idx_path)
                .map_err(io_err(&idx_path))?;
            let mut buf = Vec::with_capacity(dead.len() * RECORD);
            for r in &dead {
                buf.extend_from_slice(
                    &Record {
                        kind: Kind::Dead,
                        ..*r
                    }
                    .encode(),
                );
            }
            buf.extend_from_slice(&Record::confirmed(data_len).encode());
            w.write_all(&buf)
                .and_then(|()| w.sync_data())
                .map_err(io_err(&idx_path))?;
            let mut index = self.index()?.write().map_err(|_| poisoned(&self.dir))?;
            for r in &dead {
                index.map.remove(&r.hash);
            }
            index.packs[id as usize].idx_read = parsed.valid_len + buf.len() as u64;
        }
        Ok(())
    }

    /// Pack files whose index is gone, left by a collection that died between its two
    /// deletions, and indexes a writer died before naming. (A writer names its index before it
    /// creates the pack, so a pack without an index has no writer.)
    fn sweep_orphans(&self) -> Result<(), BlobError> {
        for e in fs::read_dir(&self.dir).map_err(io_err(&self.dir))? {
            let e = e.map_err(io_err(&self.dir))?;
            let file_name = e.file_name();
            let Some(file_name) = file_name.to_str() else {
                continue;
            };
            if let Some(name) = file_name.strip_suffix(".pack") {
                if !self.path(name, "idx").exists() {
                    let _ = fs::remove_file(e.path());
                }
            } else if file_name.ends_with(NEW_INDEX)
                && File::open(e.path()).is_ok_and(|f| f.try_lock().is_ok())
            {
                let _ = fs::remove_file(e.path());
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for Packs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packs")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Drop for Packs {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Reads `len` bytes at `offset` and checks that they hash to `hash`.
fn read_checked(file: &File, hash: Hash, offset: u64, len: u32) -> Result<Vec<u8>, BlobError> {
    let mut buf = vec![0u8; len as usize];
    file.read_exact_at(&mut buf, offset)
        .map_err(|e| BlobError::Io {
            path: PathBuf::from(format!("pack offset {offset}")),
            source: e,
        })?;
    let actual = Hash(*blake3::hash(&buf).as_bytes());
    if actual != hash {
        return Err(BlobError::Corrupt {
            expected: hash,
            actual,
        });
    }
    Ok(buf)
}
