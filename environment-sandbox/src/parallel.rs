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
    map_with(items, threads, what, || (), |(), item| f(item))
}

/// [`map`] with a state of each thread's own, made by `init` (a cache of what neighbouring
/// items share, such as their directory).
pub(crate) fn map_with<T: Sync, S, R: Send>(
    items: &[T],
    threads: usize,
    what: &str,
    init: impl Fn() -> S + Sync,
    f: impl Fn(&mut S, &T) -> Result<R> + Sync,
) -> Result<Vec<R>> {
    if threads <= 1 || items.len() < 2 {
        let mut state = init();
        return items.iter().map(|item| f(&mut state, item)).collect();
    }
    let chunk = items.len().div_ceil(threads);
    let (f, init) = (&f, &init);
    let results: Vec<Result<Vec<R>>> = std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|part| {
                scope.spawn(move || {
                    let mut state = init();
                    part.iter().map(|item| f(&mut state, item)).collect()
                })
            })
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
