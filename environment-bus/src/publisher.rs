//! [`EventPublisher`]: environment-core's `Publisher` port on the bus.

use std::time::Duration;

use environment_core::{Event, PublishError, Publisher};

use crate::bus::Bus;
use crate::types::{Headers, PublishOptions};

/// Publishes each committed operation's event (JSON) to one topic, with the op id as dedup id:
/// the environment may offer an event again after a crash, and the repeat is absorbed.
///
/// The dedup window defaults to 7 days, longer than the bus's default, because a re-offer
/// comes on reopen after a crash, which may be much later than 5 minutes.
#[derive(Clone, Debug)]
pub struct EventPublisher {
    bus: Bus,
    topic: String,
    dedup_window: Duration,
    order_by_branch: bool,
}

impl EventPublisher {
    /// A publisher to `topic`, which must exist (see [`Bus::create_topic`]).
    pub fn new(bus: Bus, topic: impl Into<String>) -> EventPublisher {
        EventPublisher {
            bus,
            topic: topic.into(),
            dedup_window: Duration::from_secs(7 * 24 * 3600),
            order_by_branch: true,
        }
    }

    /// Sets the dedup window.
    pub fn dedup_window(mut self, window: Duration) -> EventPublisher {
        self.dedup_window = window;
        self
    }

    /// With `true` (the default) the branch is the ordering key, so a group sees one branch's
    /// events one at a time in commit order; `false` lets them be processed in parallel.
    pub fn order_by_branch(mut self, on: bool) -> EventPublisher {
        self.order_by_branch = on;
        self
    }

    fn options(&self, event: &Event) -> PublishOptions {
        PublishOptions {
            ordering_key: self.order_by_branch.then(|| event.branch.clone()),
            dedup_id: Some(event.id.to_string()),
            dedup_window: Some(self.dedup_window),
            delay: None,
            headers: Headers {
                actor: Some(event.actor.as_str().to_owned()),
                correlation_id: None,
                causing_op: Some(event.id.to_string()),
            },
        }
    }
}

impl Publisher for EventPublisher {
    /// Blocks until the bus committed the message; called from the environment's outbox
    /// thread, not from async code.
    fn publish(&self, event: &Event) -> Result<(), PublishError> {
        let fail = |message: String| PublishError {
            event: event.id,
            message,
        };
        let payload = serde_json::to_vec(event).map_err(|e| fail(e.to_string()))?;
        self.bus
            .publish(&self.topic, payload, self.options(event))
            .wait()
            .map(|_| ())
            .map_err(|e| fail(e.to_string()))
    }
}
