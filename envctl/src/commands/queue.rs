//! `envctl queue`: the durable queue through which agents and humans hand work to each other,
//! through the workspace's door (in process, or the running supervisor's), rendered here.

use environment_core::{Clock, SystemClock};
use environment_workspace::Request;
use environment_workspace::queue::{
    AckParams, ClaimParams, DeadParams, Lease, LeasesParams, NackParams, PublishParams,
    RedriveParams, StatsParams, SubscribeParams,
};
use serde::Serialize;

use crate::cli::QueueCommand;
use crate::door::Door;
use crate::failure::{Failure, Outcome};
use crate::output::print_json;

fn read_payload(payload: &str) -> Outcome<Vec<u8>> {
    match payload.strip_prefix('@') {
        Some(path) => {
            let p = std::path::Path::new(path);
            std::fs::read(p).map_err(|e| Failure::io("read the payload file", p, e))
        }
        None => Ok(payload.as_bytes().to_vec()),
    }
}

/// Runs a queue command.
pub fn run(door: &Door, cmd: &QueueCommand, json: bool) -> Outcome<()> {
    // Sends a typed request and shows its typed answer: as JSON, or in words by `human`.
    fn show<R: Request>(
        door: &Door,
        json: bool,
        request: R,
        human: impl FnOnce(&R::Answer),
    ) -> Outcome<()>
    where
        R::Answer: Serialize,
    {
        let answer = door.request(request)?;
        if json {
            print_json(&serde_json::to_value(&answer).unwrap_or_default());
        } else {
            human(&answer);
        }
        Ok(())
    }
    match cmd {
        QueueCommand::Publish {
            topic,
            payload,
            key,
            dedup,
        } => {
            let bytes = read_payload(payload)?;
            let text = String::from_utf8(bytes).map_err(|_| {
                Failure::usage("the payload is not UTF-8 text")
                    .hint("encode binary payloads (e.g. base64) before publishing them")
            })?;
            let request = PublishParams {
                topic: topic.clone(),
                payload: text,
                ordering_key: key.clone(),
                dedup_id: dedup.clone(),
                delay_ms: None,
                correlation_id: None,
            };
            show(door, json, request, |p| {
                if p.duplicate {
                    println!(
                        "Already published to {topic} (message {}): not delivered again.",
                        p.id
                    );
                } else {
                    println!("Published message {} to {topic}.", p.id);
                }
            })
        }
        QueueCommand::Subscribe { group, topics } => {
            let request = SubscribeParams {
                group: group.clone(),
                topics: topics.clone(),
            };
            show(door, json, request, |s| {
                println!("Group {} now receives {}.", s.group, s.topics.join(", "));
            })
        }
        QueueCommand::Claim { group, lease, max } => {
            let request = ClaimParams {
                group: group.clone(),
                consumer: None,
                max: Some(*max),
                lease_ms: Some(lease.saturating_mul(1000)),
            };
            show(door, json, request, |c| {
                if c.leases.is_empty() {
                    println!("Nothing to claim in {group}.");
                }
                print_leases(&c.leases);
            })
        }
        QueueCommand::Ack {
            receipt,
            next,
            lease,
        } => {
            let request = AckParams {
                receipt: receipt.clone(),
                next: *next,
                lease_ms: Some(lease.saturating_mul(1000)),
            };
            show(door, json, request, |s| {
                println!("Acknowledged {}.", s.receipt);
                print_leases(&s.leases);
            })
        }
        QueueCommand::Nack { receipt, error } => {
            let request = NackParams {
                receipt: receipt.clone(),
                delay_ms: None,
                error: error.clone(),
            };
            show(door, json, request, |s| {
                println!("Gave back {}; it is retried after a backoff.", s.receipt)
            })
        }
        QueueCommand::Dead { group } => {
            let dead = door.every(
                |after| DeadParams {
                    group: group.clone(),
                    limit: Some(1000),
                    after,
                },
                |page| (page.dead, page.next),
            )?;
            if json {
                print_json(&serde_json::json!({ "group": group, "dead": dead, "next": null }));
                return Ok(());
            }
            if dead.is_empty() {
                println!("No dead letters in {group}.");
            }
            for l in &dead {
                println!(
                    "#{} {} after {} attempt(s): {}",
                    l.message_id,
                    l.topic,
                    l.attempts,
                    l.last_error.as_deref().unwrap_or("-")
                );
            }
            Ok(())
        }
        QueueCommand::Redrive { group } => {
            let request = RedriveParams {
                group: group.clone(),
            };
            show(door, json, request, |r| {
                println!("Sent {} dead letter(s) of {} back.", r.redriven, r.group)
            })
        }
        QueueCommand::Stats => show(door, json, StatsParams::default(), |s| {
            for t in &s.topics {
                println!("{} ({} retained)", t.topic, t.retained);
                for g in &t.groups {
                    println!(
                        "  {}: {} waiting, {} in flight, {} dead",
                        g.group, g.depth, g.in_flight, g.dead_letters
                    );
                }
            }
        }),
        QueueCommand::Leases { group } => {
            let request = LeasesParams {
                group: group.clone(),
                limit: Some(1000),
                after: None,
            };
            show(door, json, request, |l| {
                if l.leases.is_empty() {
                    println!("No lease in flight.");
                }
                let now = SystemClock.now_ms();
                for l in &l.leases {
                    println!(
                        "{} #{} {} held by {} (attempt {}), {}s left",
                        l.group,
                        l.message_id,
                        l.topic,
                        l.consumer,
                        l.attempt,
                        (l.lease_until_ms - now).max(0) / 1000
                    );
                }
            })
        }
    }
}

/// One line per lease: its receipt, topic, message, attempt and payload.
fn print_leases(leases: &[Lease]) {
    for l in leases {
        println!(
            "{} {} #{} attempt {}: {}",
            l.receipt,
            l.topic,
            l.message_id,
            l.attempt,
            l.payload.as_deref().unwrap_or("(binary)")
        );
    }
}
