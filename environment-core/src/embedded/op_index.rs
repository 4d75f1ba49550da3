//! Finding an operation by its id.
//!
//! Operation ids are hashes, so a B-tree index over them puts every new operation on a random
//! page: with a few acts per commit, those pages were most of what a commit wrote, and the
//! share grew with the log. Here the index is in two parts instead:
//!
//! - **runs**: immutable sorted arrays of (id prefix, sequence number) for a contiguous range of
//!   the log, one row each in `op_runs`, loaded into memory when a lookup needs them (16 bytes
//!   per operation);
//! - **the tail**: the operations no run covers yet (fewer than [`RUN_SIZE`] plus a group), read
//!   straight from the end of the log, which is ordered by sequence number. Indexing a new
//!   operation therefore writes nothing: a table of its own for the tail put a few random
//!   pages in every commit.
//!
//! The writer turns the tail into a new run once it holds [`RUN_SIZE`] operations, and merges
//! the newest runs when [`FANOUT`] of them are the same size, so a log of n operations has
//! O(FANOUT · log n) runs. Every candidate a run gives is checked against the operation's row,
//! so a prefix shared by two ids, or a run cached by a process that has not seen a later merge,
//! never returns a wrong operation.
//!
//! A process keeps the runs and the tail it last read, and reads them again when a lookup finds
//! nothing there (an operation committed since, or by another process), so a lookup of a full
//! id that misses costs a re-read of the tail.

use std::sync::{Arc, Mutex};

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{EnvError, Result};
use crate::op::OpId;

/// The tail becomes a run at this many operations.
pub(crate) const RUN_SIZE: usize = 256;
/// This many runs of one size merge into one.
pub(crate) const FANOUT: usize = 8;

const ENTRY: usize = 16;

pub(crate) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS op_runs(first INTEGER PRIMARY KEY, last INTEGER NOT NULL, entries BLOB NOT NULL);
";

/// The first 8 bytes of an id, big-endian: ordered as the ids are.
fn prefix(id: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = id.len().min(8);
    b[..n].copy_from_slice(&id[..n]);
    u64::from_be_bytes(b)
}

/// One run: its range of the log and its entries, sorted.
struct Run {
    first: i64,
    last: i64,
    entries: Vec<(u64, i64)>,
}

impl Run {
    fn decode(first: i64, last: i64, bytes: &[u8]) -> Result<Run> {
        if !bytes.len().is_multiple_of(ENTRY) {
            return Err(EnvError::Integrity {
                at: format!("operation index run {first}..={last}"),
                detail: "the run is truncated".into(),
            });
        }
        let entries = bytes
            .chunks_exact(ENTRY)
            .map(|e| {
                let (p, s) = e.split_at(8);
                (
                    u64::from_be_bytes(p.try_into().unwrap_or_default()),
                    i64::from_le_bytes(s.try_into().unwrap_or_default()),
                )
            })
            .collect();
        Ok(Run {
            first,
            last,
            entries,
        })
    }

    /// Sequence numbers of the entries whose prefix lies in `lo..=hi`.
    fn seqs_between(&self, lo: u64, hi: u64, out: &mut Vec<i64>) {
        let start = self.entries.partition_point(|(p, _)| *p < lo);
        out.extend(
            self.entries[start..]
                .iter()
                .take_while(|(p, _)| *p <= hi)
                .map(|(_, s)| *s),
        );
    }
}

fn encode(entries: &[(u64, i64)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY);
    for (p, s) in entries {
        out.extend_from_slice(&p.to_be_bytes());
        out.extend_from_slice(&s.to_le_bytes());
    }
    out
}

/// The runs and the tail this process has read, shared by its connections. Runs never change
/// once written; a merge replaces several by one, which a refresh picks up.
#[derive(Default)]
pub(crate) struct OpIndex {
    read: Mutex<Read>,
}

#[derive(Clone, Default)]
struct Read {
    runs: Vec<Arc<Run>>,
    /// (id prefix, sequence number) of the operations after the last run, unsorted.
    tail: Arc<Vec<(u64, i64)>>,
}

impl OpIndex {
    /// The sequence numbers of operations whose id lies in `lo..=hi` (full 32-byte bounds):
    /// candidates, which the caller checks against the rows.
    fn candidates(&self, conn: &Connection, lo: &[u8], hi: &[u8], fresh: bool) -> Result<Vec<i64>> {
        let read = if fresh {
            self.refresh(conn)?
        } else {
            self.read.lock().map(|r| r.clone()).unwrap_or_default()
        };
        let (lo, hi) = (prefix(lo), prefix(hi));
        let mut out: Vec<i64> = read
            .tail
            .iter()
            .filter(|(p, _)| (lo..=hi).contains(p))
            .map(|(_, s)| *s)
            .collect();
        for run in &read.runs {
            run.seqs_between(lo, hi, &mut out);
        }
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }

    /// Reads the runs and the tail again: loads new runs, drops merged ones.
    fn refresh(&self, conn: &Connection) -> Result<Read> {
        // One snapshot for the listing and what it lists (a reader's statements would each see
        // their own); the writer's open transaction is one already.
        let _snapshot = conn
            .is_autocommit()
            .then(|| conn.unchecked_transaction())
            .transpose()?;
        let listed: Vec<(i64, i64)> = conn
            .prepare_cached("SELECT first, last FROM op_runs ORDER BY first")?
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let loaded: Vec<Arc<Run>> = self.read.lock().map(|r| r.runs.clone()).unwrap_or_default();
        let mut next = Vec::with_capacity(listed.len());
        for &(first, last) in &listed {
            if let Some(run) = loaded.iter().find(|r| r.first == first && r.last == last) {
                next.push(run.clone());
                continue;
            }
            let bytes: Option<Vec<u8>> = conn
                .prepare_cached("SELECT entries FROM op_runs WHERE first = ?1")?
                .query_row([first], |r| r.get(0))
                .optional()?;
            let bytes = bytes.ok_or_else(|| EnvError::Integrity {
                at: format!("operation index run {first}..={last}"),
                detail: "the run is listed but cannot be read".into(),
            })?;
            next.push(Arc::new(Run::decode(first, last, &bytes)?));
        }
        let indexed = listed.last().map_or(0, |(_, last)| *last);
        let read = Read {
            runs: next,
            tail: Arc::new(tail(conn, indexed, i64::MAX)?),
        };
        if let Ok(mut r) = self.read.lock() {
            *r = read.clone();
        }
        Ok(read)
    }

    /// Finds operations whose id lies in `lo..=hi`, calling `row` with each candidate's
    /// sequence number until it returns `Some`. A single id is looked up in what this process
    /// has read first, and the index is read again only when that has nothing; a range (a
    /// prefix) is looked up in a fresh read, so that every operation in it is found.
    pub(crate) fn find<T>(
        &self,
        conn: &Connection,
        lo: &[u8],
        hi: &[u8],
        mut row: impl FnMut(i64) -> Result<Option<T>>,
    ) -> Result<Vec<T>> {
        let passes: &[bool] = if lo == hi { &[false, true] } else { &[true] };
        for &fresh in passes {
            let mut found = Vec::new();
            for seq in self.candidates(conn, lo, hi, fresh)? {
                found.extend(row(seq)?);
            }
            if !found.is_empty() {
                return Ok(found);
            }
        }
        Ok(Vec::new())
    }
}

/// The (id prefix, sequence number) of the operations after `indexed` (the last one the runs
/// cover) up to `upto`.
fn tail(conn: &Connection, indexed: i64, upto: i64) -> Result<Vec<(u64, i64)>> {
    Ok(conn
        .prepare_cached("SELECT id, seq FROM ops WHERE seq > ?1 AND seq <= ?2")?
        .query_map([indexed, upto], |r| {
            Ok((prefix(r.get_ref(0)?.as_blob()?), r.get(1)?))
        })?
        .collect::<rusqlite::Result<_>>()?)
}

/// The last operation the runs cover (0 for none).
fn indexed(conn: &Connection) -> Result<i64> {
    Ok(conn
        .prepare_cached("SELECT last FROM op_runs ORDER BY first DESC LIMIT 1")?
        .query_row([], |r| r.get(0))
        .optional()?
        .unwrap_or(0))
}

/// Turns a full tail into a run, then merges runs while [`FANOUT`] of the newest are the same
/// size. Called by the writer at the end of a group, inside its transaction.
/// `last_seq` is the log's last sequence number: sequence numbers have no gaps, so counting
/// the tail needs no scan. `known` is what the writer last knew of the last indexed sequence
/// number (read when `None`), and is kept up to date.
pub(crate) fn compact(conn: &Connection, last_seq: i64, known: &mut Option<i64>) -> Result<()> {
    let indexed = match *known {
        Some(i) => i,
        None => indexed(conn)?,
    };
    *known = Some(indexed);
    if last_seq.saturating_sub(indexed) < RUN_SIZE as i64 {
        return Ok(());
    }
    let mut entries = tail(conn, indexed, last_seq)?;
    entries.sort_unstable();
    let first = entries.iter().map(|(_, s)| *s).min().unwrap_or(0);
    let last = entries.iter().map(|(_, s)| *s).max().unwrap_or(0);
    conn.prepare_cached("INSERT INTO op_runs(first, last, entries) VALUES (?1, ?2, ?3)")?
        .execute(params![first, last, encode(&entries)])?;
    merge(conn)?;
    // Merging keeps the newest run's last entry.
    *known = Some(last);
    Ok(())
}

/// The size class of a run of `n` entries: runs of one class merge together.
fn class(n: usize) -> u32 {
    (n / RUN_SIZE).max(1).ilog(FANOUT)
}

fn merge(conn: &Connection) -> Result<()> {
    loop {
        let newest: Vec<(i64, i64, i64)> = conn
            .prepare_cached(
                "SELECT first, last, length(entries) FROM op_runs ORDER BY first DESC LIMIT ?1",
            )?
            .query_map([FANOUT as i64], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
            .collect::<rusqlite::Result<_>>()?;
        let classes: Vec<u32> = newest
            .iter()
            .map(|(_, _, len)| class(*len as usize / ENTRY))
            .collect();
        if newest.len() < FANOUT || classes.iter().any(|c| *c != classes[0]) {
            return Ok(());
        }
        let mut entries = Vec::new();
        for (first, last, _) in &newest {
            let bytes: Vec<u8> = conn
                .prepare_cached("SELECT entries FROM op_runs WHERE first = ?1")?
                .query_row([first], |r| r.get(0))?;
            entries.extend(Run::decode(*first, *last, &bytes)?.entries);
            conn.prepare_cached("DELETE FROM op_runs WHERE first = ?1")?
                .execute([first])?;
        }
        entries.sort_unstable();
        let first = newest.iter().map(|r| r.0).min().unwrap_or(0);
        let last = newest.iter().map(|r| r.1).max().unwrap_or(0);
        conn.prepare_cached("INSERT INTO op_runs(first, last, entries) VALUES (?1, ?2, ?3)")?
            .execute(params![first, last, encode(&entries)])?;
    }
}

/// Checks that the index lists every operation of the log exactly once, under its id:
/// `ops` maps each id to its sequence number.
pub(crate) fn check<'a>(
    conn: &Connection,
    ops: impl IntoIterator<Item = (&'a OpId, &'a u64)>,
) -> Result<()> {
    let mut expected: Vec<(i64, u64)> = ops
        .into_iter()
        .map(|(id, seq)| (*seq as i64, prefix(&id.0.0)))
        .collect();
    expected.sort_unstable();
    let held = all_entries(conn)?;
    if held == expected {
        return Ok(());
    }
    let first_difference = held
        .iter()
        .zip(&expected)
        .position(|(a, b)| a != b)
        .unwrap_or(held.len().min(expected.len()));
    Err(EnvError::Integrity {
        at: "the operation index".into(),
        detail: format!(
            "it holds {} entries for {} operations; they first differ at entry {first_difference}",
            held.len(),
            expected.len()
        ),
    })
}

/// Every (sequence number, id prefix) the index holds: the runs' entries and the tail.
fn all_entries(conn: &Connection) -> Result<Vec<(i64, u64)>> {
    let mut out: Vec<(i64, u64)> = tail(conn, indexed(conn)?, i64::MAX)?
        .into_iter()
        .map(|(p, s)| (s, p))
        .collect();
    let mut stmt = conn.prepare("SELECT first, last, entries FROM op_runs")?;
    let mut rows = stmt.query([])?;
    while let Some(row) = rows.next()? {
        let run = Run::decode(row.get(0)?, row.get(1)?, &row.get::<_, Vec<u8>>(2)?)?;
        if run
            .entries
            .iter()
            .any(|(_, s)| *s < run.first || *s > run.last)
        {
            return Err(EnvError::Integrity {
                at: format!("operation index run {}..={}", run.first, run.last),
                detail: "the run lists an operation outside its range".into(),
            });
        }
        out.extend(run.entries.iter().map(|(p, s)| (*s, *p)));
    }
    out.sort_unstable();
    Ok(out)
}

/// Builds the index of every operation in the log (an environment whose log was indexed by a
/// B-tree over the ids, before this index existed), as the writer would have.
pub(crate) fn rebuild(conn: &Connection) -> Result<()> {
    conn.execute_batch("DELETE FROM op_runs")?;
    let last: i64 = conn.query_row("SELECT COALESCE(MAX(seq), 0) FROM ops", [], |r| r.get(0))?;
    let mut indexed = Some(0);
    for seq in (RUN_SIZE as i64..=last).step_by(RUN_SIZE) {
        compact(conn, seq, &mut indexed)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_grow_by_the_fanout() {
        assert_eq!(class(RUN_SIZE), 0);
        assert_eq!(class(RUN_SIZE * (FANOUT - 1)), 0);
        assert_eq!(class(RUN_SIZE * FANOUT), 1);
        assert_eq!(class(RUN_SIZE * FANOUT * FANOUT), 2);
    }

    #[test]
    fn prefixes_keep_the_order_of_ids() {
        let a = [0x01u8, 0xff, 0, 0, 0, 0, 0, 0, 9];
        let b = [0x02u8, 0, 0, 0, 0, 0, 0, 0, 0];
        assert!(prefix(&a) < prefix(&b));
        assert_eq!(prefix(&[0xab]), 0xab00_0000_0000_0000);
    }
}
