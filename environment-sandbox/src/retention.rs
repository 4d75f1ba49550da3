//! Retention: keep every recent capture, thin older ones on a stable exponential schedule.
//!
//! An automatic capture of age `a` (older than the recent window) is judged at a granularity
//! `g = base · 2^⌊log2(a / base)⌋`: it is kept if it is the earliest capture ever made in its
//! interval `[k·g, (k+1)·g)` of absolute time. Intervals are aligned to absolute time and nest as
//! they double, so a capture kept at a coarser granularity was kept at every finer one: the
//! schedule only ever drops more as time passes, never something it kept and then dropped, and
//! about two captures survive per doubling of age — `K + O(log N)` in all, not "the root plus the
//! last K". Branch heads, marks, fork points, merge parents and rollback targets are never
//! dropped; core keeps the log intact and re-attaches history around what was dropped.

use std::collections::HashSet;
use std::time::Duration;

use environment_core::{ActorId, GcReport, LocalEnvironment, OpFlags, OpId};

use crate::error::Result;

/// What to keep.
#[derive(Clone, Debug)]
pub struct RetentionPolicy {
    /// The most recent captures kept whatever their age.
    pub keep_last: usize,
    /// Captures younger than this are all kept.
    pub keep_within: Duration,
    /// The finest granularity of the schedule.
    pub base: Duration,
}

impl Default for RetentionPolicy {
    fn default() -> RetentionPolicy {
        RetentionPolicy {
            keep_last: 50,
            keep_within: Duration::from_secs(3600),
            base: Duration::from_secs(60),
        }
    }
}

/// One capture as the schedule sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capture {
    /// Its version.
    pub id: OpId,
    /// When it was committed, ms since the epoch.
    pub time_ms: i64,
}

/// Which of `captures` (every capture ever made on the branch, dropped ones included, in any
/// order) the schedule keeps at `now_ms`. A pure function of its inputs.
pub fn kept(captures: &[Capture], now_ms: i64, policy: &RetentionPolicy) -> HashSet<OpId> {
    let mut by_age: Vec<Capture> = captures.to_vec();
    by_age.sort_by_key(|c| std::cmp::Reverse(c.time_ms));
    let base = (policy.base.as_millis() as i64).max(1);
    let within = policy.keep_within.as_millis() as i64;
    let mut keep: HashSet<OpId> = by_age.iter().take(policy.keep_last).map(|c| c.id).collect();
    // The earliest capture of each (granularity, interval) pair.
    let mut earliest: std::collections::HashMap<(u32, i64), Capture> =
        std::collections::HashMap::new();
    let mut judged = Vec::new();
    for c in &by_age {
        let age = (now_ms - c.time_ms).max(0);
        if age < within || age < base {
            keep.insert(c.id);
            continue;
        }
        let level = (age / base).ilog2();
        judged.push((*c, level));
    }
    // Every capture competes for the interval it falls in at each level in use, so the earliest
    // of an interval is found whatever the ages of the others.
    let levels: std::collections::BTreeSet<u32> = judged.iter().map(|(_, l)| *l).collect();
    for &level in &levels {
        let g = base.saturating_mul(1i64 << level.min(62));
        for c in captures {
            earliest
                .entry((level, c.time_ms.div_euclid(g)))
                .and_modify(|e| {
                    if (c.time_ms, c.id) < (e.time_ms, e.id) {
                        *e = *c;
                    }
                })
                .or_insert(*c);
        }
    }
    for (c, level) in judged {
        let g = base.saturating_mul(1i64 << level.min(62));
        if earliest
            .get(&(level, c.time_ms.div_euclid(g)))
            .is_some_and(|e| e.id == c.id)
        {
            keep.insert(c.id);
        }
    }
    keep
}

/// What a thinning did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ThinReport {
    /// Automatic captures on the branch, dropped ones included.
    pub captures: usize,
    /// Newly dropped by this run.
    pub dropped: usize,
    /// Kept after this run.
    pub kept: usize,
    /// What garbage collection reclaimed.
    pub gc: GcReport,
}

/// Applies the schedule to the automatic captures of `branch` at `now_ms`, then collects the
/// content only dropped versions used.
pub fn thin(
    env: &LocalEnvironment,
    actor: &ActorId,
    branch: &str,
    policy: &RetentionPolicy,
    now_ms: i64,
) -> Result<ThinReport> {
    let mut captures = Vec::new();
    let mut already = HashSet::new();
    // History hides dropped versions; the schedule needs them all, so walk the records.
    let mut cur = Some(env.head(branch)?);
    while let Some(id) = cur {
        let op = env.op(&id)?;
        cur = op.parents.first().copied();
        let capture = op.flags.contains(OpFlags::AUTO_CAPTURE)
            && !op.flags.intersects(
                OpFlags::FAILED | OpFlags::ROLLBACK | OpFlags::MERGE | OpFlags::COMMAND,
            );
        if capture {
            if env.is_dropped(&op.id)? {
                already.insert(op.id);
            }
            captures.push(Capture {
                id: op.id,
                time_ms: op.time_ms,
            });
        }
    }
    let keep = kept(&captures, now_ms, policy);
    let protected = env.protected_versions()?;
    let mut drop = Vec::new();
    for c in &captures {
        if !keep.contains(&c.id) && !protected.contains_key(&c.id) && !already.contains(&c.id) {
            drop.push(c.id);
        }
    }
    let dropped = env.drop_versions(actor, &drop)?;
    let gc = env.gc(actor)?;
    Ok(ThinReport {
        captures: captures.len(),
        dropped,
        kept: captures.len() - already.len() - dropped,
        gc,
    })
}
