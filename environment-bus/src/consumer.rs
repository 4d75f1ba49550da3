//! [`Consumer`]: waiting for messages without polling.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;

use crate::bus::Bus;
use crate::error::Result;
use crate::types::Lease;

/// One named consumer of a group. [`Consumer::next`] claims a message, or sleeps until a
/// publish (or nack, ack of a key's head, redrive) in this process wakes the group, or until
/// the group's next delayed message falls due.
///
/// `next` needs a Tokio runtime with the time driver enabled (it sleeps until the next due
/// message or [`BusConfig::idle_recheck`](crate::BusConfig::idle_recheck)).
#[derive(Debug)]
pub struct Consumer {
    bus: Bus,
    group: String,
    name: String,
    lease: Duration,
    notify: Arc<Notify>,
}

impl Consumer {
    pub(crate) fn new(
        bus: Bus,
        group: String,
        name: String,
        lease: Duration,
        notify: Arc<Notify>,
    ) -> Consumer {
        Consumer {
            bus,
            group,
            name,
            lease,
            notify,
        }
    }

    /// The group.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The consumer's name (recorded on its leases).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Waits for and claims the next message.
    pub async fn next(&self) -> Result<Lease> {
        loop {
            if let Some(lease) = self.next_batch(1).await?.pop() {
                return Ok(lease);
            }
        }
    }

    /// Waits until at least one message is claimable and claims up to `max`.
    pub async fn next_batch(&self, max: u32) -> Result<Vec<Lease>> {
        loop {
            // Registered before the claim, so a publish committed between the claim and the
            // sleep still wakes us.
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let claimed = self
                .bus
                .claim_detailed(&self.group, &self.name, max, self.lease)
                .await?;
            if !claimed.leases.is_empty() {
                return Ok(claimed.leases);
            }
            let config = self.bus.config();
            let mut wait = config.idle_recheck;
            if let Some(due) = claimed.next_due {
                let ms = (due - config.clock.now_ms()).max(1);
                wait = wait.min(Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX)));
            }
            // Either outcome leads to another claim.
            let _ = tokio::time::timeout(wait, notified).await;
        }
    }
}
