//! The rule file: TOML, validated as a whole with every problem reported at its line and column,
//! and rendered back so that a file round-trips.
//!
//! ```toml
//! [schema]
//! actions = ["deploy"]
//! attributes = { ticket = "int" }
//!
//! [[rule]]
//! id = "secrets-readonly"
//! effect = "forbid"
//! principal = "*"
//! actions = ["write", "delete"]
//! resource = { path = "secrets/**" }
//! advice = "ask a human with role maintainer"
//! ```

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::ops::Range;

use environment_core::AttrValue;
use serde::Deserialize;
use toml::{Spanned, Value};

use crate::condition::{Conditions, Quota, TimeWindow, attr_text, parse_risk, risk_name};
use crate::glob::Glob;
use crate::resource::{ResourcePattern, ResourceSpec};
use crate::rule::{Effect, Principal, Rule};
use crate::schema::{AttrType, Schema};

/// One problem in a rule file or a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadIssue {
    /// 1-based line (0 when the rule did not come from a file).
    pub line: usize,
    /// 1-based column (0 when unknown).
    pub column: usize,
    /// The id of the rule concerned, if any.
    pub rule: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for LoadIssue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line > 0 {
            write!(f, "line {}, column {}: ", self.line, self.column)?;
        }
        if let Some(r) = &self.rule {
            write!(f, "rule `{r}`: ")?;
        }
        f.write_str(&self.message)
    }
}

/// A parsed and validated rule file.
///
/// The format is TOML: an optional `[schema]` and any number of `[[rule]]` tables.
///
/// ```toml
/// [schema]
/// actions = ["deploy"]                     # beyond read, write, delete, execute, publish,
///                                          # consume, approve, delegate
/// attributes = { ticket = "int" }          # string | int | bool; `operation` and `kind`
///                                          # (strings) are always declared
///
/// [[rule]]
/// id = "deploy-after-review"               # unique; quoted in decisions
/// effect = "permit"                        # permit | forbid
/// principal = "group:coders"               # * | kind:<human|agent|service> | an actor,
///                                          # group: or role: id
/// actions = ["deploy"]                     # or ["*"]
/// resource = { environment = true }        # "*" or exactly one of: path, object (+ key),
///                                          # secret, endpoint, service, program (+ args),
///                                          # branch, topic, environment
/// # Conditions, all optional, all must hold:
/// hours = "09:00-17:00"                    # UTC; wraps midnight when end < start
/// branch = "release/*"                     # the request context's branch
/// risk_max = "medium"                      # also risk_min; low | medium | high
/// approval_from = ["role:maintainer"]      # permits only: NeedsApproval until granted
/// when = { operation = "merge", ticket = 7 } # context attributes, declared in the schema
/// advice = "ask a human with role maintainer" # what a refused agent should do
/// ```
///
/// `quota = { count = 10, window_secs = 3600 }` (permits only, not with `approval_from`)
/// allows at most `count` uses per actor in each fixed window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleFile {
    /// Declared actions and attributes.
    pub schema: Schema,
    /// The rules, in file order.
    pub rules: Vec<Rule>,
}

type RawRule = BTreeMap<Spanned<String>, Spanned<Value>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    schema: Option<Spanned<RawSchema>>,
    #[serde(default)]
    rule: Vec<Spanned<RawRule>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSchema {
    #[serde(default)]
    actions: Vec<Spanned<String>>,
    #[serde(default)]
    attributes: BTreeMap<Spanned<String>, Spanned<String>>,
}

struct Issues<'a> {
    src: &'a str,
    list: Vec<LoadIssue>,
}

impl Issues<'_> {
    fn at(&mut self, span: Range<usize>, rule: Option<&str>, message: impl Into<String>) {
        let (line, column) = line_col(self.src, span.start);
        self.list.push(LoadIssue {
            line,
            column,
            rule: rule.map(str::to_owned),
            message: message.into(),
        });
    }
}

fn line_col(src: &str, offset: usize) -> (usize, usize) {
    let before = src.get(..offset).unwrap_or(src);
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |i| before.len() - i - 1)
        + 1;
    (line, column)
}

impl RuleFile {
    /// Parses and validates a rule file; on failure returns every problem found.
    pub fn parse(src: &str) -> Result<RuleFile, Vec<LoadIssue>> {
        let mut issues = Issues {
            src,
            list: Vec::new(),
        };
        let raw: RawFile = match toml::from_str(src) {
            Ok(r) => r,
            Err(e) => {
                issues.at(
                    e.span().unwrap_or(0..0),
                    None,
                    e.message().trim().to_owned(),
                );
                return Err(issues.list);
            }
        };
        let mut schema = Schema::default();
        if let Some(s) = raw.schema {
            for a in s.get_ref().actions.iter() {
                let name = a.get_ref();
                if !valid_action_name(name) {
                    issues.at(a.span(), None, format!("bad action name `{name}`"));
                } else if schema.knows_action(name) {
                    issues.at(a.span(), None, format!("action `{name}` declared twice"));
                } else {
                    schema.actions.push(name.clone());
                }
            }
            for (k, v) in s.get_ref().attributes.iter() {
                match AttrType::parse(v.get_ref()) {
                    Some(t) if schema.attribute(k.get_ref()).is_none() => {
                        schema.attributes.insert(k.get_ref().clone(), t);
                    }
                    Some(_) => issues.at(
                        k.span(),
                        None,
                        format!("attribute `{}` declared twice", k.get_ref()),
                    ),
                    None => issues.at(
                        v.span(),
                        None,
                        format!(
                            "attribute `{}`: unknown type `{}` (string, int or bool)",
                            k.get_ref(),
                            v.get_ref()
                        ),
                    ),
                }
            }
        }
        let mut rules = Vec::new();
        let mut seen = HashSet::new();
        for raw_rule in &raw.rule {
            let id = raw_rule
                .get_ref()
                .iter()
                .find(|(k, _)| k.get_ref() == "id")
                .and_then(|(_, v)| Some((v.get_ref().as_str()?.to_owned(), v.span())));
            let before = issues.list.len();
            if let Some((id, span)) = id
                && !seen.insert(id.clone())
            {
                issues.at(span, Some(&id), "duplicate rule id".to_owned());
            }
            if let Some(rule) = parse_rule(raw_rule, &schema, &mut issues)
                && issues.list.len() == before
            {
                rules.push(rule);
            }
        }
        if issues.list.is_empty() {
            Ok(RuleFile { schema, rules })
        } else {
            Err(issues.list)
        }
    }

    /// Renders the file; [`RuleFile::parse`] of the result gives back an equal file.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if !self.schema.actions.is_empty() || !self.schema.attributes.is_empty() {
            out.push_str("[schema]\n");
            out.push_str(&format!("actions = {}\n", str_list(&self.schema.actions)));
            let attrs: Vec<String> = self
                .schema
                .attributes
                .iter()
                .map(|(k, t)| format!("{} = {}", key(k), q(t.as_str())))
                .collect();
            out.push_str(&format!("attributes = {{ {} }}\n", attrs.join(", ")));
            out.push('\n');
        }
        for r in &self.rules {
            out.push_str(&render_rule(r));
            out.push('\n');
        }
        out
    }
}

fn valid_action_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// Quotes a string as TOML does.
fn q(s: &str) -> String {
    Value::String(s.to_owned()).to_string()
}

fn key(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        s.to_owned()
    } else {
        q(s)
    }
}

fn str_list(v: &[String]) -> String {
    let items: Vec<String> = v.iter().map(|s| q(s)).collect();
    format!("[{}]", items.join(", "))
}

fn render_rule(r: &Rule) -> String {
    let mut out = String::from("[[rule]]\n");
    out.push_str(&format!("id = {}\n", q(&r.id)));
    out.push_str(&format!("effect = {}\n", q(r.effect.as_str())));
    out.push_str(&format!("principal = {}\n", q(&r.principal.to_string())));
    out.push_str(&format!("actions = {}\n", str_list(&r.actions)));
    match r.resource.to_spec() {
        None => out.push_str("resource = \"*\"\n"),
        Some(spec) => out.push_str(&format!("resource = {}\n", render_spec(&spec))),
    }
    let c = &r.conditions;
    if let Some(w) = &c.hours {
        out.push_str(&format!("hours = {}\n", q(&w.to_string())));
    }
    if let Some(b) = &c.branch {
        out.push_str(&format!("branch = {}\n", q(b.as_str())));
    }
    if let Some(qu) = &c.quota {
        out.push_str(&format!(
            "quota = {{ count = {}, window_secs = {} }}\n",
            qu.count, qu.window_secs
        ));
    }
    if let Some(x) = c.risk_max {
        out.push_str(&format!("risk_max = {}\n", q(risk_name(x))));
    }
    if let Some(x) = c.risk_min {
        out.push_str(&format!("risk_min = {}\n", q(risk_name(x))));
    }
    if !c.approval_from.is_empty() {
        out.push_str(&format!("approval_from = {}\n", str_list(&c.approval_from)));
    }
    if !c.attrs.is_empty() {
        let parts: Vec<String> = c
            .attrs
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    AttrValue::Str(s) => q(s),
                    other => attr_text(other),
                };
                format!("{} = {v}", key(k))
            })
            .collect();
        out.push_str(&format!("when = {{ {} }}\n", parts.join(", ")));
    }
    if let Some(a) = &r.advice {
        out.push_str(&format!("advice = {}\n", q(a)));
    }
    out
}

fn render_spec(s: &ResourceSpec) -> String {
    let mut parts = Vec::new();
    let mut field = |name: &str, v: &Option<String>| {
        if let Some(v) = v {
            parts.push(format!("{name} = {}", q(v)));
        }
    };
    field("path", &s.path);
    field("object", &s.object);
    field("key", &s.key);
    field("secret", &s.secret);
    field("endpoint", &s.endpoint);
    field("service", &s.service);
    field("program", &s.program);
    field("branch", &s.branch);
    field("topic", &s.topic);
    if let Some(args) = &s.args {
        parts.push(format!("args = {}", str_list(args)));
    }
    if let Some(e) = s.environment {
        parts.push(format!("environment = {e}"));
    }
    format!("{{ {} }}", parts.join(", "))
}

const RULE_FIELDS: [&str; 13] = [
    "id",
    "effect",
    "principal",
    "actions",
    "resource",
    "hours",
    "branch",
    "quota",
    "risk_max",
    "risk_min",
    "approval_from",
    "when",
    "advice",
];

fn parse_rule(raw: &Spanned<RawRule>, schema: &Schema, issues: &mut Issues<'_>) -> Option<Rule> {
    let fields = raw.get_ref();
    let get = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k.get_ref() == name)
            .map(|(_, v)| v)
    };
    let id = match get("id").map(|v| (v, v.get_ref())) {
        Some((_, Value::String(s))) if !s.is_empty() && !s.chars().any(char::is_control) => {
            s.clone()
        }
        Some((v, _)) => {
            issues.at(v.span(), None, "`id` must be a non-empty string");
            return None;
        }
        None => {
            issues.at(raw.span(), None, "rule without `id`");
            return None;
        }
    };
    let rid = Some(id.as_str());
    let before = issues.list.len();
    for k in fields.keys() {
        if !RULE_FIELDS.contains(&k.get_ref().as_str()) {
            issues.at(k.span(), rid, format!("unknown field `{}`", k.get_ref()));
        }
    }
    let string = |name: &str, issues: &mut Issues<'_>| -> Option<(String, Range<usize>)> {
        let v = get(name)?;
        match v.get_ref() {
            Value::String(s) => Some((s.clone(), v.span())),
            _ => {
                issues.at(v.span(), rid, format!("`{name}` must be a string"));
                None
            }
        }
    };
    let effect = match string("effect", issues) {
        Some((s, _)) if s == "permit" => Some(Effect::Permit),
        Some((s, _)) if s == "forbid" => Some(Effect::Forbid),
        Some((s, span)) => {
            issues.at(
                span,
                rid,
                format!("effect must be permit or forbid, not `{s}`"),
            );
            None
        }
        None => {
            if get("effect").is_none() {
                issues.at(raw.span(), rid, "missing `effect`");
            }
            None
        }
    };
    let principal = match string("principal", issues) {
        Some((s, span)) => {
            let p = Principal::parse(&s);
            if p.is_none() {
                issues.at(
                    span,
                    rid,
                    format!(
                        "bad principal `{s}`: expected *, kind:<human|agent|service> or kind:name"
                    ),
                );
            }
            p
        }
        None => {
            if get("principal").is_none() {
                issues.at(raw.span(), rid, "missing `principal`");
            }
            None
        }
    };
    let actions = match get("actions") {
        Some(v) => match string_array(v.get_ref()) {
            Some(list) if !list.is_empty() => {
                for a in &list {
                    if a != "*" && !schema.knows_action(a) {
                        issues.at(v.span(), rid, format!("unknown action `{a}`"));
                    }
                }
                Some(list)
            }
            _ => {
                issues.at(
                    v.span(),
                    rid,
                    "`actions` must be a non-empty list of strings",
                );
                None
            }
        },
        None => {
            issues.at(raw.span(), rid, "missing `actions`");
            None
        }
    };
    let resource = match get("resource") {
        Some(v) => match v.get_ref() {
            Value::String(s) if s == "*" => Some(ResourcePattern::Any),
            Value::Table(_) => match v.get_ref().clone().try_into::<ResourceSpec>() {
                Ok(spec) => match ResourcePattern::from_spec(&spec) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        issues.at(v.span(), rid, format!("resource: {e}"));
                        None
                    }
                },
                Err(e) => {
                    issues.at(v.span(), rid, format!("resource: {}", e.message().trim()));
                    None
                }
            },
            _ => {
                issues.at(v.span(), rid, "`resource` must be \"*\" or a table");
                None
            }
        },
        None => {
            issues.at(raw.span(), rid, "missing `resource`");
            None
        }
    };
    let mut c = Conditions::default();
    if let Some((s, span)) = string("hours", issues) {
        c.hours = TimeWindow::parse(&s);
        if c.hours.is_none() {
            issues.at(span, rid, format!("bad hours `{s}`: expected HH:MM-HH:MM"));
        }
    }
    if let Some((s, span)) = string("branch", issues) {
        match Glob::path(&s) {
            Ok(g) => c.branch = Some(g),
            Err(e) => issues.at(span, rid, format!("branch: {e}")),
        }
    }
    if let Some(v) = get("quota") {
        let t = v.get_ref().as_table();
        let int = |k: &str| t.and_then(|t| t.get(k)).and_then(Value::as_integer);
        let extra = t.is_some_and(|t| t.keys().any(|k| k != "count" && k != "window_secs"));
        match (int("count"), int("window_secs")) {
            (Some(n), Some(w)) if n > 0 && w > 0 && n <= i64::from(u32::MAX) && !extra => {
                c.quota = Some(Quota {
                    count: n as u32,
                    window_secs: w as u64,
                });
            }
            _ => issues.at(
                v.span(),
                rid,
                "`quota` must be { count = N, window_secs = S } with N, S > 0",
            ),
        }
    }
    for (name, slot) in [("risk_max", &mut c.risk_max), ("risk_min", &mut c.risk_min)] {
        if let Some((s, span)) = string(name, issues) {
            *slot = parse_risk(&s);
            if slot.is_none() {
                issues.at(
                    span,
                    rid,
                    format!("{name}: unknown risk `{s}` (low, medium, high)"),
                );
            }
        }
    }
    if let Some(v) = get("approval_from") {
        match string_array(v.get_ref()) {
            Some(list) if !list.is_empty() => {
                for p in &list {
                    if !matches!(Principal::parse(p), Some(Principal::Entity(_))) {
                        issues.at(
                            v.span(),
                            rid,
                            format!("approval_from: bad actor or group `{p}`"),
                        );
                    }
                }
                c.approval_from = list;
            }
            _ => issues.at(
                v.span(),
                rid,
                "`approval_from` must be a non-empty list of strings",
            ),
        }
    }
    if let Some(v) = get("when") {
        match v.get_ref().as_table() {
            Some(t) => {
                for (k, val) in t {
                    let val = match val {
                        Value::String(s) => AttrValue::Str(s.clone()),
                        Value::Integer(i) => AttrValue::Int(*i),
                        Value::Boolean(b) => AttrValue::Bool(*b),
                        _ => {
                            issues.at(
                                v.span(),
                                rid,
                                format!("when: `{k}` must be a string, integer or boolean"),
                            );
                            continue;
                        }
                    };
                    c.attrs.insert(k.clone(), val);
                }
            }
            None => issues.at(v.span(), rid, "`when` must be a table of attribute = value"),
        }
    }
    let advice = string("advice", issues).map(|(s, _)| s);
    if issues.list.len() != before {
        // Report semantic problems only once the fields themselves are sound.
        return None;
    }
    let rule = Rule {
        id: id.clone(),
        effect: effect?,
        principal: principal?,
        actions: actions?,
        resource: resource?,
        conditions: c,
        advice,
    };
    for message in check_rule(&rule, schema) {
        let span = get("when")
            .or(get("approval_from"))
            .or(get("quota"))
            .map_or(raw.span(), |v| v.span());
        issues.at(span, rid, message);
    }
    Some(rule)
}

fn string_array(v: &Value) -> Option<Vec<String>> {
    v.as_array()?
        .iter()
        .map(|x| x.as_str().map(str::to_owned))
        .collect()
}

/// Checks a rule against a schema; returns every problem (empty when it is sound).
pub(crate) fn check_rule(rule: &Rule, schema: &Schema) -> Vec<String> {
    let mut out = Vec::new();
    if rule.id.is_empty() || rule.id.chars().any(char::is_control) {
        out.push("`id` must be non-empty and printable".to_owned());
    }
    if rule.actions.is_empty() {
        out.push("no actions".to_owned());
    }
    for a in &rule.actions {
        if a != "*" && !schema.knows_action(a) {
            out.push(format!("unknown action `{a}`"));
        }
    }
    for (k, v) in &rule.conditions.attrs {
        match schema.attribute(k) {
            None => out.push(format!(
                "unknown attribute `{k}` (declare it in [schema] attributes)"
            )),
            Some(t) if !t.admits(v) => out.push(format!(
                "attribute `{k}` is declared {} but compared with {}",
                t.as_str(),
                attr_text(v)
            )),
            Some(_) => {}
        }
    }
    if rule.effect == Effect::Forbid {
        if !rule.conditions.approval_from.is_empty() {
            out.push("approval_from only makes sense on a permit".to_owned());
        }
        if rule.conditions.quota.is_some() {
            out.push("quota only makes sense on a permit".to_owned());
        }
    }
    if rule.conditions.quota.is_some() && !rule.conditions.approval_from.is_empty() {
        out.push("a rule takes either a quota or approval_from, not both".to_owned());
    }
    if let Some(q) = &rule.conditions.quota
        && (q.count == 0 || q.window_secs == 0)
    {
        out.push("quota count and window must be positive".to_owned());
    }
    for p in &rule.conditions.approval_from {
        if !matches!(Principal::parse(p), Some(Principal::Entity(_))) {
            out.push(format!("approval_from: bad actor or group `{p}`"));
        }
    }
    if let Principal::Entity(e) = &rule.principal
        && Principal::parse(e).is_none()
    {
        out.push(format!("bad principal `{e}`"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example in [`RuleFile`]'s documentation.
    const DOC_EXAMPLE: &str = r#"
[schema]
actions = ["deploy"]
attributes = { ticket = "int" }

[[rule]]
id = "deploy-after-review"
effect = "permit"
principal = "group:coders"
actions = ["deploy"]
resource = { environment = true }
hours = "09:00-17:00"
branch = "release/*"
risk_max = "medium"
approval_from = ["role:maintainer"]
when = { operation = "merge", ticket = 7 } # context attributes, declared in the schema
advice = "ask a human with role maintainer" # what a refused agent should do
"#;

    #[test]
    fn the_documented_example_parses_and_round_trips() {
        let f = RuleFile::parse(DOC_EXAMPLE).unwrap();
        assert_eq!(f.rules.len(), 1);
        assert_eq!(RuleFile::parse(&f.render()).unwrap(), f);
    }

    #[test]
    fn quota_and_approval_do_not_mix() {
        let text = DOC_EXAMPLE.replace(
            "hours =",
            "quota = { count = 1, window_secs = 60 }\nhours =",
        );
        let issues = RuleFile::parse(&text).unwrap_err();
        assert!(
            issues.iter().any(|i| i.message.contains("either a quota")),
            "{issues:?}"
        );
    }

    #[test]
    fn line_and_column() {
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
        assert_eq!(line_col("ab", 0), (1, 1));
    }
}
