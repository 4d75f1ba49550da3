//! Large and sparse files in chunks.
//!
//! A file is read extent by extent (`SEEK_DATA`/`SEEK_HOLE`): a hole is recorded as a gap
//! between pieces, never as zeros, and the data is cut at content-defined boundaries (FastCDC),
//! so a one-byte change moves at most the boundaries around it and stores about one chunk.
//! Each chunk is an ordinary blob, deduplicated across files and versions; the list of pieces
//! (the *manifest*) is a blob too, and the tree refers to it ([`crate::Content::Chunks`]).
//! Reading and writing go one chunk at a time: no file needs more memory than [`CHUNK_MAX`].

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use serde::{Deserialize, Serialize};

use super::{BlobStore, io_err};
use crate::error::BlobError;
use crate::hash::Hash;

/// Chunks are at least this long (but the last of an extent).
pub const CHUNK_MIN: usize = 256 << 10;
/// The average chunk.
pub const CHUNK_AVG: usize = 1 << 20;
/// No chunk is longer: the most memory a chunked read or write holds.
pub const CHUNK_MAX: usize = 4 << 20;

/// The version byte every manifest starts with.
const MANIFEST_V1: u8 = 1;

/// How a chunked file is made: its size and where its data is. What lies between pieces (and
/// after the last, up to `size`) is a hole.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// The file's length.
    pub size: u64,
    /// Its data, in order of offset, never overlapping.
    pub pieces: Vec<Piece>,
}

/// A run of a file's bytes stored as one blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Piece {
    /// Where it starts in the file.
    pub offset: u64,
    /// How long it is.
    pub len: u64,
    /// The blob holding it.
    pub hash: Hash,
}

impl Manifest {
    /// The bytes held in data (the rest are holes).
    pub fn data_bytes(&self) -> u64 {
        self.pieces.iter().map(|p| p.len).sum()
    }

    fn encode(&self) -> Vec<u8> {
        let mut out = vec![MANIFEST_V1];
        crate::encoding::encode_into(self, &mut out);
        out
    }

    fn decode(hash: &Hash, bytes: &[u8]) -> Result<Manifest, BlobError> {
        let bad = |reason: &str| BlobError::BadManifest {
            hash: *hash,
            reason: reason.to_owned(),
        };
        let (&version, rest) = bytes.split_first().ok_or_else(|| bad("it is empty"))?;
        if version != MANIFEST_V1 {
            return Err(bad(&format!("unknown version {version}")));
        }
        let m: Manifest = postcard::from_bytes(rest).map_err(|e| bad(&e.to_string()))?;
        let mut end = 0u64;
        for p in &m.pieces {
            let last = p
                .offset
                .checked_add(p.len)
                .ok_or_else(|| bad("a piece overflows"))?;
            if p.offset < end || p.len == 0 || last > m.size {
                return Err(bad("its pieces overlap, are empty or pass its size"));
            }
            end = last;
        }
        Ok(m)
    }
}

/// What storing a file in chunks did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkedPut {
    /// The manifest's blob, which the tree refers to.
    pub manifest: Hash,
    /// The file's length.
    pub size: u64,
    /// The bytes held in data (the rest were holes).
    pub data: u64,
}

/// The file's data extents from `from` on, as (start, end): holes are what lies between. A
/// filesystem without `SEEK_DATA` has one extent, the whole file.
fn next_extent(file: &File, from: u64, size: u64) -> io::Result<Option<(u64, u64)>> {
    use rustix::fs::{SeekFrom, seek};
    if from >= size {
        return Ok(None);
    }
    let start = match seek(file.as_fd(), SeekFrom::Data(from)) {
        Ok(s) => s,
        // No data after `from`: the rest is a hole.
        Err(rustix::io::Errno::NXIO) => return Ok(None),
        Err(rustix::io::Errno::INVAL | rustix::io::Errno::OPNOTSUPP) => {
            return Ok(Some((from, size)));
        }
        Err(e) => return Err(e.into()),
    };
    let end = match seek(file.as_fd(), SeekFrom::Hole(start)) {
        Ok(e) => e.min(size),
        Err(rustix::io::Errno::NXIO) => size,
        Err(e) => return Err(e.into()),
    };
    Ok((start < end).then_some((start, end.min(size))))
}

/// Reads `len` bytes of `file` from `offset` with positioned reads (the descriptor's offset is
/// left alone).
struct At<'a> {
    file: &'a File,
    pos: u64,
    end: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let want = buf.len().min((self.end - self.pos) as usize);
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl BlobStore {
    /// Stores an open regular file in chunks, holes as holes, and returns its manifest. Holds
    /// at most one chunk in memory. Call under a [`super::WriteGuard`], like
    /// [`BlobStore::put`]; with `durable` false, follow with [`BlobStore::sync`].
    ///
    /// ```
    /// # let dir = tempfile::tempdir().unwrap();
    /// use environment_core::BlobStore;
    /// let store = BlobStore::open(dir.path().join("blobs"))?;
    /// let path = dir.path().join("big");
    /// let file = std::fs::File::create(&path)?;
    /// file.set_len(1 << 30)?; // a 1 GiB hole
    /// let put = store.put_chunked(&std::fs::File::open(&path)?, true)?;
    /// assert_eq!((put.size, put.data), (1 << 30, 0));
    /// let out = std::fs::File::create(dir.path().join("copy"))?;
    /// store.write_chunked(&put.manifest, &out)?;
    /// assert_eq!(out.metadata()?.len(), 1 << 30);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn put_chunked(&self, file: &File, durable: bool) -> Result<ChunkedPut, BlobError> {
        let size = file.metadata().map_err(io_err(&self.tmp))?.len();
        let mut manifest = Manifest {
            size,
            pieces: Vec::new(),
        };
        let mut from = 0;
        while let Some((start, end)) = next_extent(file, from, size).map_err(io_err(&self.tmp))? {
            let source = At {
                file,
                pos: start,
                end,
            };
            for chunk in fastcdc::v2020::StreamCDC::new(source, CHUNK_MIN, CHUNK_AVG, CHUNK_MAX) {
                let chunk =
                    chunk.map_err(|e| io_err(&self.tmp)(io::Error::other(e.to_string())))?;
                let hash = self.put_with(&chunk.data, false)?;
                manifest.pieces.push(Piece {
                    offset: start + chunk.offset,
                    len: chunk.length as u64,
                    hash,
                });
            }
            from = end;
        }
        let data = manifest.data_bytes();
        let manifest = self.put_with(&manifest.encode(), false)?;
        if durable {
            self.sync()?;
        }
        Ok(ChunkedPut {
            manifest,
            size,
            data,
        })
    }

    /// The manifest stored under `hash`.
    pub fn manifest(&self, hash: &Hash) -> Result<Manifest, BlobError> {
        Manifest::decode(hash, &self.get(hash)?)
    }

    /// Writes the file a manifest describes into `out` (an empty file): each piece at its
    /// offset, holes left as holes, the length set last. Holds one chunk in memory.
    pub fn write_chunked(&self, manifest: &Hash, out: &File) -> Result<Manifest, BlobError> {
        let m = self.manifest(manifest)?;
        for p in &m.pieces {
            let bytes = self.piece(manifest, p)?;
            out.write_all_at(&bytes, p.offset)
                .map_err(io_err(&self.tmp))?;
        }
        out.set_len(m.size).map_err(io_err(&self.tmp))?;
        Ok(m)
    }

    /// The bytes of one piece of `manifest`, which must be as long as it says.
    fn piece(&self, manifest: &Hash, p: &Piece) -> Result<Vec<u8>, BlobError> {
        let bytes = self.get(&p.hash)?;
        if bytes.len() as u64 != p.len {
            return Err(BlobError::BadManifest {
                hash: *manifest,
                reason: format!(
                    "piece at {} is {} bytes, not {}",
                    p.offset,
                    bytes.len(),
                    p.len
                ),
            });
        }
        Ok(bytes)
    }

    /// Turns `out`, which holds the file `from` describes, into the file `to` describes by
    /// writing only what differs: the pieces of `to` that `from` lacks at the same offset, and
    /// holes (punched) where `from` had data and `to` has none. A one-byte change to a large
    /// file rewrites about one chunk. Cut short, `out` holds pieces of both: a caller that
    /// cannot tell it still holds `from` writes it whole with [`BlobStore::write_chunked`].
    /// Returns how many bytes of data it wrote.
    pub fn patch_chunked(&self, from: &Hash, to: &Hash, out: &File) -> Result<u64, BlobError> {
        let old = self.manifest(from)?;
        let new = self.manifest(to)?;
        let kept: std::collections::HashSet<Piece> = old.pieces.iter().copied().collect();
        let wanted: std::collections::HashSet<Piece> = new.pieces.iter().copied().collect();
        // The pieces of one manifest never overlap, so a stale piece's range holds nothing
        // that stays: it becomes a hole, and the new pieces are written over it after.
        for p in old.pieces.iter().filter(|p| !wanted.contains(p)) {
            let end = p.offset.saturating_add(p.len).min(new.size);
            if p.offset < end {
                punch(out, p.offset, end - p.offset).map_err(io_err(&self.tmp))?;
            }
        }
        let mut written = 0;
        for p in new.pieces.iter().filter(|p| !kept.contains(p)) {
            let bytes = self.piece(to, p)?;
            out.write_all_at(&bytes, p.offset)
                .map_err(io_err(&self.tmp))?;
            written += p.len;
        }
        out.set_len(new.size).map_err(io_err(&self.tmp))?;
        Ok(written)
    }

    /// The bytes a manifest describes, whole: for callers that asked for them in memory.
    pub fn read_chunked(&self, manifest: &Hash) -> Result<Vec<u8>, BlobError> {
        let m = self.manifest(manifest)?;
        let mut out = vec![
            0u8;
            usize::try_from(m.size).map_err(|_| BlobError::BadManifest {
                hash: *manifest,
                reason: "larger than memory can hold".into(),
            })?
        ];
        for p in &m.pieces {
            let bytes = self.get(&p.hash)?;
            let at = p.offset as usize;
            out.get_mut(at..at + bytes.len())
                .ok_or_else(|| BlobError::BadManifest {
                    hash: *manifest,
                    reason: format!("piece at {} passes its size", p.offset),
                })?
                .copy_from_slice(&bytes);
        }
        Ok(out)
    }
}

/// Makes `len` bytes at `offset` a hole, or zeros where the file system cannot punch holes.
fn punch(out: &File, offset: u64, len: u64) -> io::Result<()> {
    use rustix::fs::{FallocateFlags, fallocate};
    match fallocate(
        out.as_fd(),
        FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
        offset,
        len,
    ) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => {
            let zeros = vec![0u8; 64 << 10];
            let mut at = offset;
            while at < offset + len {
                let n = (offset + len - at).min(zeros.len() as u64) as usize;
                out.write_all_at(&zeros[..n], at)?;
                at += n as u64;
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};

    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn one_byte_changed_stores_about_one_chunk_and_holes_stay_holes() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path().join("blobs")).unwrap();
        let path = dir.path().join("f");
        let mut f = File::create(&path).unwrap();
        let data = noise(24 << 20, 7);
        f.write_all(&data).unwrap();
        // A 64 MiB hole, then a little data at the end.
        f.seek(SeekFrom::Current(64 << 20)).unwrap();
        f.write_all(b"tail").unwrap();
        drop(f);
        let a = store
            .put_chunked(&File::open(&path).unwrap(), true)
            .unwrap();
        assert_eq!(a.size, (24 << 20) + (64 << 20) + 4);
        let holes_seen = a.data < a.size;
        let before = store.usage().unwrap();

        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(b"!", 10 << 20).unwrap();
        drop(f);
        let b = store
            .put_chunked(&File::open(&path).unwrap(), true)
            .unwrap();
        assert_ne!(a.manifest, b.manifest);
        let after = store.usage().unwrap();
        // One new chunk (perhaps two, if the change moved a boundary) and the new manifest.
        assert!(after.blobs - before.blobs <= 3, "{before:?} → {after:?}");
        assert!(after.bytes - before.bytes <= 2 * CHUNK_MAX as u64 + 4096);

        for (put, changed) in [(a, false), (b, true)] {
            let out_path = dir.path().join("out");
            let _ = std::fs::remove_file(&out_path);
            let out = File::create(&out_path).unwrap();
            store.write_chunked(&put.manifest, &out).unwrap();
            drop(out);
            let back = std::fs::read(&out_path).unwrap();
            assert_eq!(back.len() as u64, put.size);
            let mut want = data.clone();
            if changed {
                want[10 << 20] = b'!';
            }
            assert_eq!(&back[..data.len()], &want[..]);
            assert!(back[data.len()..back.len() - 4].iter().all(|b| *b == 0));
            assert_eq!(&back[back.len() - 4..], b"tail");
            assert_eq!(store.read_chunked(&put.manifest).unwrap(), back);
            if holes_seen {
                use std::os::unix::fs::MetadataExt;
                let blocks = std::fs::metadata(&out_path).unwrap().blocks() * 512;
                assert!(
                    blocks < put.size - (32 << 20),
                    "the hole was written: {blocks}"
                );
            }
        }
    }

    #[test]
    fn a_patch_writes_what_differs_and_ends_byte_for_byte_the_target() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path().join("blobs")).unwrap();
        let path = dir.path().join("f");
        let data = noise(16 << 20, 11);
        std::fs::write(&path, &data).unwrap();
        let put = |p: &std::path::Path| store.put_chunked(&File::open(p).unwrap(), true).unwrap();
        let a = put(&path);
        // b: one byte changed.
        let mut b_bytes = data.clone();
        b_bytes[5 << 20] ^= 0xff;
        std::fs::write(&path, &b_bytes).unwrap();
        let b = put(&path);
        // c: the first 8 MiB a hole, the rest as b, and longer by a tail after a hole.
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(0).unwrap();
        f.write_all_at(&b_bytes[8 << 20..], 8 << 20).unwrap();
        f.write_all_at(b"tail", (40 << 20) - 4).unwrap();
        drop(f);
        let c = put(&path);
        let mut c_bytes = vec![0u8; 40 << 20];
        c_bytes[8 << 20..16 << 20].copy_from_slice(&b_bytes[8 << 20..]);
        c_bytes[(40 << 20) - 4..].copy_from_slice(b"tail");
        // d: shorter than all of them.
        std::fs::write(&path, &data[..3 << 20]).unwrap();
        let d = put(&path);

        let out_path = dir.path().join("out");
        let out = File::create(&out_path).unwrap();
        store.write_chunked(&a.manifest, &out).unwrap();
        let steps = [
            (&a, &b, &b_bytes[..]),
            (&b, &c, &c_bytes[..]),
            (&c, &d, &data[..3 << 20]),
            (&d, &a, &data[..]),
        ];
        for (i, (from, to, want)) in steps.into_iter().enumerate() {
            let written = store
                .patch_chunked(&from.manifest, &to.manifest, &out)
                .unwrap();
            let back = std::fs::read(&out_path).unwrap();
            assert!(back == want, "step {i}: the patched file differs");
            if i == 0 {
                assert!(written <= 2 * CHUNK_MAX as u64, "one byte cost {written}");
            }
        }
    }

    #[test]
    fn a_damaged_manifest_is_an_error_not_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path()).unwrap();
        let junk = store.put(b"\x01not postcard at all, and too long").unwrap();
        assert!(matches!(
            store.manifest(&junk),
            Err(BlobError::BadManifest { .. })
        ));
        let overlapping = Manifest {
            size: 10,
            pieces: vec![
                Piece {
                    offset: 0,
                    len: 6,
                    hash: junk,
                },
                Piece {
                    offset: 5,
                    len: 2,
                    hash: junk,
                },
            ],
        };
        let h = store.put(&overlapping.encode()).unwrap();
        assert!(matches!(
            store.manifest(&h),
            Err(BlobError::BadManifest { .. })
        ));
    }
}
