//! Bad input gets a clear typed error (or a Deny) and changes nothing; never a panic, never an
//! Allow.
// Helpers outside #[test] functions panic on purpose: a broken fixture is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use environment_core::{Action, Resource};
use environment_policy::{
    Outcome, PolicyError, Principal, Reason, ResourcePattern, Rule, RuleFile, TokenError,
    TokenLimits,
};
use proptest::prelude::*;

fn issues(text: &str) -> Vec<environment_policy::LoadIssue> {
    match RuleFile::parse(text) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(i) => i,
    }
}

#[test]
fn syntax_errors_have_a_location() {
    let i = issues("[[rule]]\nid = \"x\"\neffect = permit\n");
    assert_eq!(i.len(), 1);
    assert_eq!(i[0].line, 3, "{:?}", i[0]);
}

#[test]
fn every_problem_is_reported_with_its_line() {
    let text = r#"
[schema]
actions = ["deploy"]
attributes = { ticket = "int" }

[[rule]]
id = "a"
effect = "permit"
principal = "*"
actions = ["deplo"]
resource = { path = "src/**" }

[[rule]]
id = "b"
effect = "allow"
principal = "group:x"
actions = ["read"]
resource = { path = "src/**/x**" }

[[rule]]
id = "c"
effect = "permit"
principal = "*"
actions = ["read"]
resource = { path = "a" }
when = { color = "red" }

[[rule]]
id = "d"
effect = "permit"
principal = "*"
actions = ["read"]
resource = { path = "a" }
when = { ticket = "seven" }
colour = "blue"

[[rule]]
id = "a"
effect = "forbid"
principal = "*"
actions = ["read"]
resource = { path = "a" }
approval_from = ["role:x"]
"#;
    let i = issues(text);
    let line_of = |needle: &str| text.lines().position(|l| l.contains(needle)).unwrap() + 1;
    let find = |rule: &str, msg: &str| {
        i.iter()
            .find(|x| x.rule.as_deref() == Some(rule) && x.message.contains(msg))
            .unwrap_or_else(|| panic!("no issue `{msg}` for {rule} in {i:#?}"))
    };
    assert_eq!(
        find("a", "unknown action `deplo`").line,
        line_of("[\"deplo\"]")
    );
    assert_eq!(
        find("b", "effect must be permit or forbid").line,
        line_of("\"allow\"")
    );
    assert_eq!(
        find("b", "`**` must be a whole segment").line,
        line_of("x**")
    );
    assert!(find("c", "unknown attribute `color`").line > 0);
    assert!(find("d", "unknown field `colour`").line == line_of("colour"));
    find("a", "duplicate rule id");
    // Every issue renders with its place.
    for x in &i {
        assert!(x.to_string().starts_with("line "), "{x}");
    }
    // Through the policy, the same problems come back typed and nothing changes.
    let (p, _) = policy();
    let v = p.version();
    match p.load_rules(text) {
        Err(PolicyError::Invalid(list)) => assert_eq!(list.len(), i.len()),
        other => panic!("{other:?}"),
    }
    assert_eq!(p.version(), v);
    assert!(p.rules().rules.is_empty());
}

#[test]
fn malformed_rules_are_refused() {
    for (text, needle) in [
        ("[[rule]]\nid = \"\"\n", "`id`"),
        ("[[rule]]\nid = \"x\"\n", "missing `effect`"),
        (
            "[[rule]]\nid = \"x\"\neffect = \"permit\"\nprincipal = \"nobody\"\nactions = [\"read\"]\nresource = \"*\"\n",
            "bad principal",
        ),
        (
            "[[rule]]\nid = \"x\"\neffect = \"permit\"\nprincipal = \"*\"\nactions = []\nresource = \"*\"\n",
            "non-empty list",
        ),
        (
            "[[rule]]\nid = \"x\"\neffect = \"permit\"\nprincipal = \"*\"\nactions = [\"read\"]\nresource = { path = \"a\", secret = \"b\" }\n",
            "exactly one",
        ),
        (
            "[[rule]]\nid = \"x\"\neffect = \"permit\"\nprincipal = \"*\"\nactions = [\"read\"]\nresource = { file = \"a\" }\n",
            "unknown field",
        ),
        (
            "[[rule]]\nid = \"x\"\neffect = \"permit\"\nprincipal = \"*\"\nactions = [\"read\"]\nresource = { endpoint = \"nohost\" }\n",
            "bad endpoint",
        ),
        (
            "[[rule]]\nid = \"x\"\neffect = \"permit\"\nprincipal = \"*\"\nactions = [\"read\"]\nresource = \"everything\"\n",
            "resource",
        ),
        (
            "[[rule]]\nid = \"x\"\neffect = \"permit\"\nprincipal = \"*\"\nactions = [\"read\"]\nresource = \"*\"\nhours = \"9-5\"\n",
            "bad hours",
        ),
        (
            "[[rule]]\nid = \"x\"\neffect = \"permit\"\nprincipal = \"*\"\nactions = [\"read\"]\nresource = \"*\"\nquota = { count = 0, window_secs = 60 }\n",
            "quota",
        ),
        (
            "[[rule]]\nid = \"x\"\neffect = \"permit\"\nprincipal = \"*\"\nactions = [\"read\"]\nresource = \"*\"\nrisk_max = \"extreme\"\n",
            "unknown risk",
        ),
        ("[schema]\nattributes = { a = \"float\" }\n", "unknown type"),
        ("[schema]\nactions = [\"read\"]\n", "declared twice"),
        ("[policy]\n", "unknown field"),
    ] {
        let i = issues(text);
        assert!(
            i.iter().any(|x| x.message.contains(needle)),
            "{needle} not in {i:#?} for\n{text}"
        );
    }
}

#[test]
fn rules_added_in_code_are_validated_too() {
    let (p, _) = policy();
    let r = Rule::permit("x", Principal::Anyone, &["fly"], ResourcePattern::Any);
    assert!(matches!(p.add_rule(r), Err(PolicyError::Invalid(_))));
    let mut r = Rule::permit("y", Principal::Anyone, &["read"], ResourcePattern::Any);
    r.conditions
        .attrs
        .insert("unknown".into(), environment_core::AttrValue::Bool(true));
    assert!(matches!(p.add_rule(r), Err(PolicyError::Invalid(_))));
    assert!(matches!(
        p.remove_rule("nope"),
        Err(PolicyError::UnknownRule(_))
    ));
    assert_eq!(p.version(), 0);
}

#[test]
fn cyclic_groups_are_refused_and_change_nothing() {
    let (p, _) = policy();
    p.add_member("group:a", "group:b").unwrap();
    p.add_member("group:b", "role:c").unwrap();
    let v = p.version();
    assert!(matches!(
        p.add_member("role:c", "group:a"),
        Err(PolicyError::Cycle { .. })
    ));
    assert!(matches!(
        p.add_member("group:a", "group:a"),
        Err(PolicyError::Cycle { .. })
    ));
    assert!(matches!(
        p.add_member("agent:x", "agent:y"),
        Err(PolicyError::NotAGroup(_))
    ));
    assert!(matches!(
        p.add_member("nonsense", "group:a"),
        Err(PolicyError::BadEntity(_))
    ));
    assert!(matches!(
        p.add_member("*", "group:a"),
        Err(PolicyError::BadEntity(_))
    ));
    assert_eq!(p.version(), v);
    assert_eq!(p.relations().len(), 2);
}

#[test]
fn unknown_actions_and_resources_are_denied() {
    let (p, _) = policy();
    p.add_rule(Rule::permit(
        "all",
        Principal::Anyone,
        &["*"],
        ResourcePattern::Any,
    ))
    .unwrap();
    let d = p.check(&req(
        "agent:a",
        Action::Custom("launch-missiles".into()),
        path("x"),
    ));
    assert_eq!(d.outcome(), Outcome::Deny);
    assert_eq!(*d.reason(), Reason::UnknownAction);
    let d = p.check(&req(
        "agent:a",
        Action::Read,
        Resource::Service("https://:99999/".into()),
    ));
    assert_eq!(d.outcome(), Outcome::Deny);
}

fn token_setup() -> (environment_policy::Policy, environment_core::ManualClock) {
    let (p, clock) = policy();
    p.add_rule(Rule::permit(
        "a-writes",
        Principal::parse("agent:a").unwrap(),
        &["write", "read"],
        ResourcePattern::path("**").unwrap(),
    ))
    .unwrap();
    (p, clock)
}

fn with_token(who: &str, p: &str, token: String) -> environment_core::AccessRequest {
    let mut r = write(who, p);
    r.context.token = Some(token);
    r
}

fn token_error(d: &environment_policy::Decision) -> TokenError {
    match d.reason() {
        Reason::Token(e) => e.clone(),
        other => panic!("not a token refusal: {other:?}"),
    }
}

#[test]
fn expired_tokens_are_refused() {
    let (p, clock) = token_setup();
    let t = p
        .issue_token(
            "agent:a",
            TokenLimits {
                expires_at: Some(11 * HOUR),
                ..Default::default()
            },
        )
        .unwrap();
    assert!(
        p.check(&with_token("agent:a", "x", t.encode()))
            .is_allowed()
    );
    clock.advance(HOUR);
    let d = p.check(&with_token("agent:a", "x", t.encode()));
    assert_eq!(d.outcome(), Outcome::Deny);
    assert!(matches!(token_error(&d), TokenError::Expired { .. }));
    assert!(matches!(
        p.attenuate_token(&t, "agent:a", TokenLimits::default()),
        Err(PolicyError::Token(TokenError::Expired { .. }))
    ));
}

#[test]
fn exhausted_tokens_are_refused() {
    let (p, _) = token_setup();
    let t = p
        .issue_token(
            "agent:a",
            TokenLimits {
                max_uses: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
    let child = p
        .attenuate_token(
            &t,
            "agent:a",
            TokenLimits {
                paths: Some(vec!["src/**".into()]),
                ..Default::default()
            },
        )
        .unwrap();
    assert!(
        p.check(&with_token("agent:a", "src/x", child.encode()))
            .is_allowed()
    );
    // Dry runs spend nothing.
    assert!(
        p.evaluate(&with_token("agent:a", "x", t.encode()))
            .is_allowed()
    );
    assert!(
        p.check(&with_token("agent:a", "x", t.encode()))
            .is_allowed()
    );
    // The child's use counted against the parent's limit too.
    for token in [&t, &child] {
        let d = p.check(&with_token("agent:a", "src/x", token.encode()));
        assert_eq!(token_error(&d), TokenError::Exhausted { max: 2 });
    }
}

#[test]
fn tampered_tokens_are_refused() {
    let (p, _) = token_setup();
    let t = p
        .issue_token(
            "agent:a",
            TokenLimits {
                paths: Some(vec!["src/**".into()]),
                max_uses: Some(1),
                ..Default::default()
            },
        )
        .unwrap();
    let mut widened = t.clone();
    widened.caveats[0].paths = Some(vec!["**".into()]);
    let mut more_uses = t.clone();
    more_uses.caveats[0].max_uses = Some(1000);
    let mut other = t.clone();
    other.principal = "agent:root".into();
    let mut dropped = t.clone();
    dropped.caveats.clear();
    let mut bad_tag = t.clone();
    bad_tag.tag = "00".repeat(32);
    let foreign = {
        let (q, _) = token_setup();
        q.issue_token("agent:a", TokenLimits::default()).unwrap()
    };
    for bad in [widened, more_uses, other, dropped, bad_tag, foreign] {
        let d = p.check(&with_token("agent:a", "src/x", bad.encode()));
        assert_eq!(token_error(&d), TokenError::Tampered, "{bad:?}");
    }
    let mut text = t.encode();
    text.push('A');
    for garbage in [
        text,
        "ept1.%%%".into(),
        "nonsense".into(),
        String::new(),
        "ept1.e30".into(),
    ] {
        let d = p.check(&with_token("agent:a", "src/x", garbage.clone()));
        assert_eq!(d.outcome(), Outcome::Deny, "{garbage}");
    }
}

#[test]
fn tokens_presented_by_the_wrong_actor_are_refused() {
    let (p, _) = token_setup();
    let t = p.issue_token("agent:a", TokenLimits::default()).unwrap();
    let d = p.check(&with_token("agent:b", "x", t.encode()));
    assert!(matches!(token_error(&d), TokenError::WrongActor { .. }));
    // Handing it to a sub-agent changes who may present it, and only the bearer may do that.
    let handed = p
        .attenuate_token(
            &t,
            "agent:a",
            TokenLimits {
                bearer: Some("agent:sub".into()),
                paths: Some(vec!["src/**".into()]),
                ..Default::default()
            },
        )
        .unwrap();
    assert!(
        p.check(&with_token("agent:sub", "src/x", handed.encode()))
            .is_allowed()
    );
    assert!(
        !p.check(&with_token("agent:sub", "docs/x", handed.encode()))
            .is_allowed()
    );
    assert!(matches!(
        token_error(&p.check(&with_token("agent:a", "src/x", handed.encode()))),
        TokenError::WrongActor { .. }
    ));
    assert!(matches!(
        p.attenuate_token(
            &handed,
            "agent:a",
            TokenLimits {
                bearer: Some("agent:a".into()),
                ..Default::default()
            }
        ),
        Err(PolicyError::Token(TokenError::WrongActor { .. }))
    ));
    assert!(matches!(
        p.issue_token("nobody", TokenLimits::default()),
        Err(PolicyError::BadEntity(_))
    ));
    assert!(matches!(
        p.issue_token(
            "agent:a",
            TokenLimits {
                paths: Some(vec!["a//b".into()]),
                ..Default::default()
            }
        ),
        Err(PolicyError::Token(TokenError::BadLimits(_)))
    ));
}

#[test]
fn bad_approvals_are_refused() {
    let (p, _) = policy();
    assert!(matches!(
        p.grant("apr-nope", "human:x", Default::default()),
        Err(PolicyError::UnknownApproval(_))
    ));
    assert!(matches!(
        p.request_approval(&read("agent:a", "x")),
        Err(PolicyError::NoApprovalNeeded(_))
    ));
    // An unknown or ungranted approval id never allows.
    let mut r = read("agent:a", "x");
    r.context.approval = Some("apr-forged".into());
    assert!(!p.check(&r).is_allowed());
}

proptest! {
    #![proptest_config(config(256))]

    /// Arbitrary text never panics the loader.
    #[test]
    fn arbitrary_rule_text_never_panics(text in "\\PC{0,200}") {
        let _ = RuleFile::parse(&text);
    }

    /// Arbitrary text presented as a token never allows.
    #[test]
    fn arbitrary_tokens_never_allow(text in "(ept1\\.)?[A-Za-z0-9_-]{0,120}") {
        let (p, _) = token_setup();
        prop_assert!(!p.check(&with_token("agent:a", "x", text)).is_allowed());
    }

    /// Arbitrary globs either compile or are refused; never a panic.
    #[test]
    fn arbitrary_globs_never_panic(g in "[ab*/.]{0,14}", s in "[ab/.]{0,14}") {
        if let Ok(glob) = environment_policy::Glob::path(&g) {
            let _ = glob.matches(s.as_bytes());
            prop_assert_eq!(glob.matches(s.as_bytes()), common::reference::glob(&g, &s, '/'), "{} vs {}", g, s);
        }
    }
}

#[test]
fn no_actor_is_named_like_a_principal_for_many() {
    // An actor whose id spelled `kind:agent` used to match every rule written for all agents.
    for id in [
        "*",
        "kind:agent",
        "kind:human",
        "kind:service",
        "kind:anything",
    ] {
        assert!(
            environment_core::ActorId::new(id).is_err(),
            "{id} is accepted as an actor id"
        );
    }
    for id in ["agent:kind", "human:kind:agent", "agent:*"] {
        assert!(environment_core::ActorId::new(id).is_ok(), "{id}");
    }
}
