//! Retention, whatever keeps the log: protected versions are never dropped (a refusal drops
//! nothing), dropped versions read as dropped on every handle, and garbage collection removes
//! exactly the nodes only they used, while every kept version still reads back in full from a
//! handle that has cached nothing.

use std::collections::BTreeMap;

use environment_core::{
    ActRequest, ActorId, EnvError, Intent, Key, KeyPrefix, Namespace, OpId, Options, Value,
};

use crate::log_port::Backend;

/// Forty acts, each rewriting two of four directories (the next act replaces one of them, the
/// other lives on for three more versions), a mark on the sixth; ten versions dropped in the
/// middle, then collected.
pub fn protected_dropped_and_collected(backend: &dyn Backend) {
    let place = backend.fresh();
    let env = place.open(Options::default());
    let actor = ActorId::new("agent:retention").unwrap();
    let system = ActorId::system();
    let mut state = BTreeMap::new();
    let mut versions = Vec::new();
    for i in 0..40 {
        let mut r = ActRequest::new(actor.clone(), Intent::edit("two directories"));
        for (dir, name) in [(i % 4, "x"), ((i + 1) % 4, "y")] {
            let key = Key::fs(format!("d{dir}/{name}")).unwrap();
            let value = Value::file(format!("{i} {dir} {name}"));
            state.insert(key.clone(), value.clone());
            r = r.put(key, value);
        }
        versions.push((env.act_blocking(r).unwrap().version, state.clone()));
    }
    let marked = versions[5].0;
    env.mark(&actor, "kept", &marked).unwrap();
    let (first, head) = (env.first_version().unwrap(), env.head("main").unwrap());
    let protected = env.protected_versions().unwrap();
    for v in [first, head, marked] {
        assert!(protected.contains_key(&v), "{v} is protected");
        // Refused whole: the unprotected version asked with it is not dropped either.
        let err = env
            .drop_versions(&actor, &[versions[12].0, v])
            .expect_err("a protected version is refused");
        assert!(
            matches!(err, EnvError::ProtectedVersion { id, .. } if id == v),
            "{err}"
        );
        assert!(!env.is_dropped(&versions[12].0).unwrap());
    }
    let dropped: Vec<OpId> = versions[10..20].iter().map(|(v, _)| *v).collect();
    assert_eq!(env.drop_versions(&actor, &dropped).unwrap(), 10);
    assert_eq!(env.drop_versions(&actor, &dropped).unwrap(), 0, "once");
    let all = KeyPrefix::all(Namespace::Fs);
    assert!(matches!(
        env.list(&actor, &all, &dropped[0]),
        Err(EnvError::VersionDropped(v)) if v == dropped[0]
    ));
    let nodes = env.verify(&system).unwrap().nodes;
    let report = env.gc(&actor).unwrap();
    assert!(report.nodes_removed >= 1, "{report:?}");
    assert_eq!(
        env.verify(&system).unwrap().nodes,
        nodes - report.nodes_removed
    );
    drop(env);
    // Another handle, nothing cached: every kept version in full, every dropped one dropped.
    let other = place.open(Options::default());
    for (v, expected) in versions.iter().filter(|(v, _)| !dropped.contains(v)) {
        let listed: BTreeMap<Key, Value> =
            other.list(&actor, &all, v).unwrap().into_iter().collect();
        assert_eq!(&listed, expected, "{v}");
    }
    for v in &dropped {
        assert!(other.is_dropped(v).unwrap());
        assert!(matches!(
            other.list(&actor, &all, v),
            Err(EnvError::VersionDropped(_))
        ));
    }
    other.verify(&system).unwrap();
}
