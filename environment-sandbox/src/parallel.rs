//! Work on many paths spread over the cores: a large capture or restore makes thousands of file
//! system calls, and a few threads keep the kernel busy on every core.

use crate::error::{Result, SandboxError};

/// How many threads a bulk job uses.
pub(crate) fn threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8)
}

/// Runs `f` on every item, on up to `threads` scoped threads each taking a contiguous share,
/// and returns the results in the items' order; an error stops nothing already running, and
/// the first one (in item order) is returned.
pub(crate) fn map<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    what: &str,
    f: impl Fn(&T) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    if threads <= 1 || items.len() < 2 {
        return items.iter().map(&f).collect();
    }
    let chunk = items.len().div_ceil(threads);
    let f = &f;
    let results: Vec<Result<Vec<R>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(f).collect()))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(SandboxError::Watch(format!("a {what} thread panicked")))
                })
            })
            .collect()
    });
    let mut out = Vec::with_capacity(items.len());
    for r in results {
        out.extend(r?);
    }
    Ok(out)
}
