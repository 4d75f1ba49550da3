//! External effects under the policy: how an effect ended is recorded only by an actor who may
//! perform effects on its target, and a refused transition leaves the record as it was.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use environment_core::{BeginOutcome, EffectState, EnvError};

const RULES: &str = r#"
[[rule]]
id = "deployer-deploys"
effect = "permit"
principal = "agent:deployer"
actions = ["execute"]
resource = { service = "deploy" }
"#;

#[test]
fn only_who_may_perform_an_effect_records_how_it_ended() {
    let (_dir, env) = governed(RULES);
    let (deployer, intruder) = (actor("agent:deployer"), actor("agent:intruder"));
    let rec = match env
        .effect_begin(&deployer, "deploy-1", "deploy", b"v1")
        .unwrap()
    {
        BeginOutcome::New(r) => r,
        other => panic!("{other:?}"),
    };
    let refused: [Result<_, EnvError>; 4] = [
        env.effect_complete(&intruder, rec.id, b"forged"),
        env.effect_fail(&intruder, rec.id, "forged"),
        env.effect_mark_unknown(&intruder, rec.id, "forged"),
        env.effect_compensate(&intruder, rec.id, "forged"),
    ];
    for r in refused {
        assert!(matches!(r, Err(EnvError::NotAllowed(_))), "{r:?}");
    }
    let still = env.effect("deploy-1").unwrap().unwrap();
    assert_eq!(still.state, EffectState::InFlight);
    assert_eq!((still.result, still.note), (None, None));
    // An unknown effect is unknown whoever asks, before any check.
    assert!(matches!(
        env.effect_complete(&intruder, 999, b""),
        Err(EnvError::UnknownEffect(999))
    ));

    let done = env.effect_complete(&deployer, rec.id, b"ok").unwrap();
    assert_eq!(done.state, EffectState::Done);
    assert_eq!(
        env.effect("deploy-1").unwrap().unwrap().result.as_deref(),
        Some(&b"ok"[..])
    );
    assert!(env.effects_unfinished().unwrap().is_empty());
}
