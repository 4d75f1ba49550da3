//! `envctl queue`: the durable queue through which agents and humans hand work to each other,
//! through the workspace's door (in process, or the running supervisor's), rendered here.

use environment_workspace::Method;
use serde_json::{Value as Json, json};

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
    let (method, params) = match cmd {
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
            (
                Method::QueuePublish,
                json!({ "topic": topic, "payload": text, "ordering_key": key, "dedup_id": dedup }),
            )
        }
        QueueCommand::Subscribe { group, topics } => (
            Method::QueueSubscribe,
            json!({ "group": group, "topics": topics }),
        ),
        QueueCommand::Claim { group, lease, max } => (
            Method::QueueClaim,
            json!({ "group": group, "max": max, "lease_ms": lease.saturating_mul(1000) }),
        ),
        QueueCommand::Ack { receipt } => (Method::QueueAck, json!({ "receipt": receipt })),
        QueueCommand::Nack { receipt, error } => (
            Method::QueueNack,
            json!({ "receipt": receipt, "error": error }),
        ),
        QueueCommand::Dead { group } => (Method::QueueDead, json!({ "group": group })),
        QueueCommand::Redrive { group } => (Method::QueueRedrive, json!({ "group": group })),
        QueueCommand::Stats => (Method::QueueStats, json!({})),
    };
    let out = door.call(method, params)?;
    if json {
        print_json(&out);
    } else {
        print_human(cmd, &out);
    }
    Ok(())
}

fn print_human(cmd: &QueueCommand, out: &Json) {
    match cmd {
        QueueCommand::Publish { topic, .. } => {
            if out["duplicate"].as_bool() == Some(true) {
                println!(
                    "Already published to {topic} (message {}): not delivered again.",
                    out["id"]
                );
            } else {
                println!("Published message {} to {topic}.", out["id"]);
            }
        }
        QueueCommand::Subscribe { group, topics } => {
            println!("Group {group} now receives {}.", topics.join(", "));
        }
        QueueCommand::Claim { group, .. } => {
            let leases = out["leases"].as_array().cloned().unwrap_or_default();
            if leases.is_empty() {
                println!("Nothing to claim in {group}.");
            }
            for l in leases {
                println!(
                    "{} {} #{} attempt {}: {}",
                    l["receipt"].as_str().unwrap_or_default(),
                    l["topic"].as_str().unwrap_or_default(),
                    l["message_id"],
                    l["attempt"],
                    l["payload"].as_str().unwrap_or_default()
                );
            }
        }
        QueueCommand::Ack { receipt } => println!("Acknowledged {receipt}."),
        QueueCommand::Nack { receipt, .. } => {
            println!("Gave back {receipt}; it is retried after a backoff.")
        }
        QueueCommand::Dead { group } => {
            let dead = out["dead"].as_array().cloned().unwrap_or_default();
            if dead.is_empty() {
                println!("No dead letters in {group}.");
            }
            for d in dead {
                println!(
                    "#{} {} after {} attempt(s): {}",
                    d["message_id"],
                    d["topic"].as_str().unwrap_or_default(),
                    d["attempts"],
                    d["last_error"].as_str().unwrap_or("-")
                );
            }
        }
        QueueCommand::Redrive { group } => {
            println!("Sent {} dead letter(s) of {group} back.", out["redriven"])
        }
        QueueCommand::Stats => {
            for t in out["topics"].as_array().cloned().unwrap_or_default() {
                println!(
                    "{} ({} retained)",
                    t["topic"].as_str().unwrap_or_default(),
                    t["retained"]
                );
                for g in t["groups"].as_array().cloned().unwrap_or_default() {
                    println!(
                        "  {}: {} waiting, {} in flight, {} dead",
                        g["group"].as_str().unwrap_or_default(),
                        g["depth"],
                        g["in_flight"],
                        g["dead_letters"]
                    );
                }
            }
        }
    }
}
