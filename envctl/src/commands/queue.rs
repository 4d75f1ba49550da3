//! `envctl queue`: the durable queue through which agents and humans hand work to each other.
//! The functions return JSON so that the MCP server shares them.

use std::time::Duration;

use environment_bus::{Bus, GroupOptions, Headers, Lease, PublishOptions, Receipt};
use environment_core::{Action, Resource};
use serde_json::{Value as Json, json};

use crate::cli::QueueCommand;
use crate::failure::{Failure, Outcome};
use crate::output::print_json;
use crate::workspace::Session;

/// The consumer name of an actor (the bus allows fewer characters than actor ids do).
fn consumer_of(s: &Session) -> String {
    s.actor
        .as_str()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._:/-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn lease_json(l: &Lease) -> Json {
    json!({
        "receipt": l.receipt.to_string(),
        "message": l.message.id.0,
        "topic": l.message.topic,
        "group": l.group,
        "attempt": l.attempt,
        "lease_until_ms": l.lease_until_ms,
        "ordering_key": l.message.ordering_key,
        "publisher": l.message.headers.actor,
        "payload": String::from_utf8_lossy(&l.message.payload),
    })
}

fn parse_receipt(r: &str) -> Outcome<Receipt> {
    Ok(r.parse::<Receipt>()?)
}

/// Publishes `payload` to `topic` (created if new), as the session's actor.
pub fn publish(
    s: &Session,
    bus: &Bus,
    topic: &str,
    payload: Vec<u8>,
    key: Option<&str>,
    dedup: Option<&str>,
) -> Outcome<Json> {
    s.authorize(Action::Publish, Resource::Topic(topic.to_owned()))?;
    let mut opts = PublishOptions::default().headers(Headers {
        actor: Some(s.actor.as_str().to_owned()),
        ..Headers::default()
    });
    if let Some(k) = key {
        opts = opts.ordering_key(k);
    }
    if let Some(d) = dedup {
        opts = opts.dedup_id(d);
    }
    let p = bus.publish_creating(topic, payload, opts).wait()?;
    Ok(json!({"topic": topic, "message": p.id.0, "duplicate": p.duplicate}))
}

/// Subscribes `group` to `topics`.
pub fn subscribe(s: &Session, bus: &Bus, group: &str, topics: &[String]) -> Outcome<Json> {
    for t in topics {
        s.authorize(Action::Consume, Resource::Topic(t.clone()))?;
    }
    for t in topics {
        bus.create_topic(t).wait()?;
    }
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    bus.create_group(group, &names, GroupOptions::default())
        .wait()?;
    Ok(json!({"group": group, "topics": topics}))
}

/// Leases up to `max` messages of `group` for `lease`.
pub fn claim(s: &Session, bus: &Bus, group: &str, lease: Duration, max: u32) -> Outcome<Json> {
    let topics: Vec<String> = bus
        .metrics()?
        .into_iter()
        .filter(|t| t.groups.iter().any(|g| g.group == group))
        .map(|t| t.topic)
        .collect();
    for t in &topics {
        s.authorize(Action::Consume, Resource::Topic(t.clone()))?;
    }
    let leases = bus.claim(group, &consumer_of(s), max, lease).wait()?;
    Ok(json!({"group": group, "leases": leases.iter().map(lease_json).collect::<Vec<_>>()}))
}

/// Acknowledges a receipt as the session's consumer. Settling needs no further decision: only
/// a claim, which passed the policy, hands out a receipt, and only its claimer may settle it.
pub fn ack(s: &Session, bus: &Bus, receipt: &str) -> Outcome<Json> {
    let r = parse_receipt(receipt)?;
    bus.ack_as(&consumer_of(s), &r).wait()?;
    Ok(json!({"acked": receipt}))
}

/// Gives a lease back, to be retried after a backoff (only its claimer may).
pub fn nack(s: &Session, bus: &Bus, receipt: &str, error: Option<&str>) -> Outcome<Json> {
    let r = parse_receipt(receipt)?;
    bus.nack_as(&consumer_of(s), &r, None, error).wait()?;
    Ok(json!({"nacked": receipt}))
}

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
pub fn run(s: &Session, cmd: &QueueCommand, json: bool) -> Outcome<()> {
    let bus = s.ws.open_bus()?;
    let out = match cmd {
        QueueCommand::Publish {
            topic,
            payload,
            key,
            dedup,
        } => {
            let bytes = read_payload(payload)?;
            publish(s, &bus, topic, bytes, key.as_deref(), dedup.as_deref())?
        }
        QueueCommand::Subscribe { group, topics } => subscribe(s, &bus, group, topics)?,
        QueueCommand::Claim { group, lease, max } => {
            claim(s, &bus, group, Duration::from_secs(*lease), *max)?
        }
        QueueCommand::Ack { receipt } => ack(s, &bus, receipt)?,
        QueueCommand::Nack { receipt, error } => nack(s, &bus, receipt, error.as_deref())?,
        QueueCommand::Dead { group } => {
            let list = bus.dead_letters(group, 100)?;
            json!({"group": group, "dead": list.iter().map(|d| json!({
                "message": d.message.id.0,
                "topic": d.message.topic,
                "attempts": d.attempts,
                "last_error": d.last_error,
                "dead_at_ms": d.dead_at_ms,
                "payload": String::from_utf8_lossy(&d.message.payload),
            })).collect::<Vec<_>>()})
        }
        QueueCommand::Redrive { group } => {
            let n = bus.redrive(group, None).wait()?;
            json!({"group": group, "redriven": n})
        }
        QueueCommand::Stats => {
            let m = bus.metrics()?;
            json!({"topics": m.iter().map(|t| json!({
                "topic": t.topic,
                "retained": t.retained,
                "groups": t.groups.iter().map(|g| json!({
                    "group": g.group, "depth": g.depth, "in_flight": g.in_flight,
                    "oldest_age_ms": g.oldest_age_ms, "dead_letters": g.dead_letters,
                    "redeliveries": g.redeliveries,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>()})
        }
    };
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
                    out["message"]
                );
            } else {
                println!("Published message {} to {topic}.", out["message"]);
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
                    l["message"],
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
                    d["message"],
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
