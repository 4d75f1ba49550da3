//! The effect log's use cases: an effect on the world outside (a deploy, a payment, a message)
//! begun under an idempotency key, then completed or failed, so that a retried agent never
//! performs it twice; and the log read. Core decides each as the workspace's actor: beginning
//! and settling an effect are an `execute` of its target, reading the log is a read of the
//! environment.

use environment_core::{Action, EffectRecord, Resource};
use serde::Deserialize;
use serde_json::{Value, json};

use super::error::ServiceError;
use super::session::Session;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListParams {
    #[serde(default)]
    unfinished: bool,
}

/// The effect log, or only the effects not settled yet.
pub(super) fn list(g: &Session<'_>, p: ListParams) -> Result<Value, ServiceError> {
    g.allow(Action::Read, Resource::Environment, Some("effects"))?;
    let env = g.env();
    let list = if p.unfinished {
        env.effects_unfinished()
    } else {
        env.effects()
    }
    .map_err(ServiceError::from)?;
    Ok(json!({ "effects": list.iter().map(EffectRecord::to_json).collect::<Vec<_>>() }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct BeginParams {
    key: String,
    target: String,
    #[serde(default)]
    request: String,
}

/// Begins an effect, unless its key was seen: what was found says whether to perform it.
pub(super) fn begin(g: &Session<'_>, p: BeginParams) -> Result<Value, ServiceError> {
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
    Ok(json!({ "outcome": found.name(), "effect": found.record().to_json() }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SettleParams {
    id: u64,
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// Records how an effect ended: done with its result, or failed without taking effect. Core
/// authorizes it as the effect's beginning was.
pub(super) fn settle(g: &Session<'_>, p: SettleParams, done: bool) -> Result<Value, ServiceError> {
    let env = g.env();
    let record = match (done, p.result, p.error) {
        (true, result, None) => {
            env.effect_complete(g.actor(), p.id, result.unwrap_or_default().as_bytes())
        }
        (false, None, Some(error)) => env.effect_fail(g.actor(), p.id, &error),
        (true, _, Some(_)) => {
            return Err(ServiceError::invalid(
                "a completion takes `result`, not `error`",
            ));
        }
        (false, _, _) => {
            return Err(ServiceError::invalid(
                "a failure takes `error` (and no `result`)",
            ));
        }
    }
    .map_err(ServiceError::from)?;
    Ok(json!({ "effect": record.to_json() }))
}
