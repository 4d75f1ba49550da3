//! A writer's window: the time within which an operation must commit on the blobs it stored.

use std::time::{Duration, Instant};

use crate::error::BucketError;

/// Opened before a writer stores the blobs of one operation; [`WriteWindow::check`] just
/// before the commit says whether the blobs are still safe from collection. A collection
/// spares blobs younger than its grace period, and a blob is stored or found fresh only after
/// the window opens, so a commit within a quarter of the grace period refers to blobs no
/// collection can have removed: the rest of the grace period absorbs clock skew when a blob's
/// age is judged (up to half of it), and the look after storing covers collections already
/// deleting (their markers need clocks within two beats, see the crate's `sweep`).
#[derive(Debug)]
pub struct WriteWindow {
    opened: Instant,
    limit: Duration,
}

impl WriteWindow {
    pub(crate) fn new(grace: Duration) -> WriteWindow {
        WriteWindow {
            opened: Instant::now(),
            limit: grace / 4,
        }
    }

    /// Fails with [`BucketError::WindowClosed`] once the window has been open too long to
    /// commit on its blobs.
    pub fn check(&self) -> Result<(), BucketError> {
        let open = self.opened.elapsed();
        if open > self.limit {
            return Err(BucketError::WindowClosed {
                open,
                limit: self.limit,
            });
        }
        Ok(())
    }

    /// How long a blob found in the bucket may have been there and still be reused as it is.
    pub(crate) fn fresh_for(&self) -> Duration {
        self.limit
    }
}
