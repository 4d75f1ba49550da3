//! The effect log's use cases: an effect on the world outside (a deploy, a payment, a message)
//! begun under an idempotency key, then completed or failed, so that a retried agent never
//! performs it twice; and the log read. Core decides each as the workspace's actor: beginning
//! and settling an effect are an `execute` of its target, reading the log is a read of the
//! environment.

use environment_core::{Action, Resource, json};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::error::ServiceError;
use super::page::page;
use super::session::Session;

/// The most effects a page holds.
const MAX_PAGE: usize = 1000;

/// The effect log, or only the effects not settled yet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Only the effects not settled yet (default false).
    #[serde(default)]
    pub unfinished: bool,
    /// The page after this effect (the `next` of the previous page).
    #[serde(default)]
    pub after: Option<u64>,
    /// At most this many (default and most 1000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// Effects, oldest first, a page at a time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Effects {
    /// Oldest first.
    pub effects: Vec<json::Effect>,
    /// Where the next page starts (`after`), when more follow.
    #[serde(default)]
    pub next: Option<u64>,
}

pub(super) fn list(g: &Session<'_>, p: ListParams) -> Result<Effects, ServiceError> {
    g.allow(Action::Read, Resource::Environment, Some("effects"))?;
    let env = g.env();
    let list = if p.unfinished {
        env.effects_unfinished()
    } else {
        env.effects()
    }
    .map_err(ServiceError::from)?;
    let all: Vec<json::Effect> = list.iter().map(json::Effect::from).collect();
    let limit = p.limit.unwrap_or(MAX_PAGE).min(MAX_PAGE);
    let (effects, next) = page(all, |e| e.id, p.after.as_ref(), limit)?;
    Ok(Effects { effects, next })
}

/// Begins an effect on the world outside (a deploy, a payment, a message) under an
/// idempotency key, unless the key was seen: what was found says whether to perform it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BeginParams {
    /// The idempotency key: the same key is never performed twice.
    pub key: String,
    /// The service or endpoint acted on, e.g. `https://deploy.example/v1`.
    pub target: String,
    /// What is asked of it (text, often JSON).
    #[serde(default)]
    pub request: String,
}

/// What beginning an effect found.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Begun {
    /// `perform` (new: do it now), `done` (already performed: use its result), `in_flight`,
    /// `needs_reconciliation` or `compensated`.
    pub outcome: String,
    /// The effect's record.
    pub effect: json::Effect,
}

pub(super) fn begin(g: &Session<'_>, p: BeginParams) -> Result<Begun, ServiceError> {
    // Core asks the same again when it records the beginning.
    g.allow_rechecked(
        Action::Execute,
        Resource::Service(p.target.clone()),
        Some("effect"),
    )?;
    let found = g
        .env()
        .effect_begin(g.actor(), &p.key, &p.target, p.request.as_bytes())
        .map_err(ServiceError::from)?;
    Ok(Begun {
        outcome: found.name().to_owned(),
        effect: json::Effect::from(found.record()),
    })
}

/// Records an effect's result: it took effect. Core authorizes it as the effect's beginning
/// was.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CompleteParams {
    /// The effect's id, as effect.begin gave it.
    pub id: u64,
    /// What the effect returned (text).
    #[serde(default)]
    pub result: Option<String>,
}

/// Records that an effect failed without taking effect.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FailParams {
    /// The effect's id, as effect.begin gave it.
    pub id: u64,
    /// Why it failed.
    pub error: String,
}

/// An effect settled.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Settled {
    /// Its record now.
    pub effect: json::Effect,
}

pub(super) fn complete(g: &Session<'_>, p: CompleteParams) -> Result<Settled, ServiceError> {
    let result = p.result.unwrap_or_default();
    let record = g
        .env()
        .effect_complete(g.actor(), p.id, result.as_bytes())
        .map_err(ServiceError::from)?;
    Ok(Settled {
        effect: json::Effect::from(&record),
    })
}

pub(super) fn fail(g: &Session<'_>, p: FailParams) -> Result<Settled, ServiceError> {
    let record = g
        .env()
        .effect_fail(g.actor(), p.id, &p.error)
        .map_err(ServiceError::from)?;
    Ok(Settled {
        effect: json::Effect::from(&record),
    })
}
