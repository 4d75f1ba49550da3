//! Typed resources: what rules name (patterns) and what requests touch (targets).

use std::fmt;

use environment_core::{Namespace, Resource};
use serde::{Deserialize, Serialize};

use crate::glob::{Glob, GlobError, wild_match};

/// A resource pattern as written in a rule file: exactly one kind field (plus `key` for objects,
/// `args` for programs), or the string `"*"` for every resource.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceSpec {
    /// A workspace path glob (`src/**/*.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// A domain object kind (`review`, `*`); paired with `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// The object key glob under its kind (default `**`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// A secret reference name glob.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// A network endpoint: `scheme://host[:port][/path-prefix]`; `*` allowed for scheme and port,
    /// `*` segments in the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    /// A named external service glob (a target that is not a URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// A program glob (`cargo`, `/usr/bin/*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    /// Argument patterns, one per argument (`*` any bytes); a final `...` allows any further ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// A branch name glob.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// A queue topic glob, `.`-separated (`task.*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic: Option<String>,
    /// The environment as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<bool>,
}

/// Why a resource pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResourceError {
    /// A glob that does not compile.
    #[error("{field}: {source}")]
    Glob {
        /// The field holding it.
        field: &'static str,
        /// What is wrong with it.
        source: GlobError,
    },
    /// No kind field, or more than one.
    #[error(
        "a resource names exactly one of path, object, secret, endpoint, service, program, branch, topic, environment"
    )]
    Kinds,
    /// A field that belongs to another kind (`args` without `program`, `key` without `object`).
    #[error("`{0}` does not go with this resource kind")]
    Stray(&'static str),
    /// An endpoint that does not parse.
    #[error("bad endpoint `{0}`: expected scheme://host[:port][/path]")]
    Endpoint(String),
    /// `environment = false`.
    #[error("`environment` can only be true")]
    Environment,
}

/// The kinds of resources, as rules and explanations name them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResourceKind {
    /// Workspace paths.
    Path,
    /// Domain objects.
    Object,
    /// Secrets.
    Secret,
    /// URL endpoints.
    Endpoint,
    /// Named services.
    Service,
    /// Programs.
    Program,
    /// Branches.
    Branch,
    /// Queue topics.
    Topic,
    /// The environment.
    Environment,
}

/// A compiled endpoint pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointPattern {
    text: String,
    scheme: Option<String>,
    host: Glob,
    port: Option<u16>,
    path: String,
}

impl EndpointPattern {
    /// Parses `scheme://host[:port][/path-prefix]`.
    pub fn parse(text: &str) -> Result<EndpointPattern, ResourceError> {
        let bad = || ResourceError::Endpoint(text.to_owned());
        let (scheme, rest) = text.split_once("://").ok_or_else(bad)?;
        if scheme.is_empty() {
            return Err(bad());
        }
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        let (host, port_text) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        };
        let host = Glob::new(host, b'.').map_err(|_| bad())?;
        let port = match port_text {
            Some("*") => None,
            Some(p) => Some(p.parse::<u16>().map_err(|_| bad())?),
            None => default_port(scheme),
        };
        let scheme = (scheme != "*").then(|| scheme.to_owned());
        Ok(EndpointPattern {
            text: text.to_owned(),
            scheme,
            host,
            port,
            path: path.trim_end_matches('/').to_owned(),
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    pub(crate) fn matches(&self, e: &Endpoint<'_>) -> bool {
        if let Some(s) = &self.scheme
            && s != e.scheme
        {
            return false;
        }
        if let Some(p) = self.port
            && Some(p) != e.port
        {
            return false;
        }
        self.host.matches(e.host.as_bytes()) && path_under(e.path, &self.path)
    }
}

fn default_port(scheme: &str) -> Option<u16> {
    match scheme {
        "https" | "wss" => Some(443),
        "http" | "ws" => Some(80),
        "ssh" => Some(22),
        _ => None,
    }
}

/// Whether `path` is `prefix` or under it, segment-wise (`/repos` covers `/repos/x`, not `/reposx`).
fn path_under(path: &str, prefix: &str) -> bool {
    let path = path.trim_end_matches('/');
    path.starts_with(prefix)
        && (path.len() == prefix.len() || path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// A request's URL, split without allocating.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Endpoint<'a> {
    pub scheme: &'a str,
    pub host: &'a str,
    pub port: Option<u16>,
    pub path: &'a str,
}

impl<'a> Endpoint<'a> {
    pub(crate) fn parse(url: &'a str) -> Option<Endpoint<'a>> {
        let (scheme, rest) = url.split_once("://")?;
        let end = rest.find(['?', '#']).unwrap_or(rest.len());
        let rest = &rest[..end];
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, ""),
        };
        // Credentials in the URL never take part in matching.
        let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p.parse::<u16>().ok()?)),
            None => (authority, default_port(scheme)),
        };
        if host.is_empty() {
            return None;
        }
        Some(Endpoint {
            scheme,
            host,
            port,
            path,
        })
    }
}

/// A compiled resource pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ResourcePattern {
    /// Every resource of every kind.
    Any,
    /// Workspace paths.
    Path(Glob),
    /// Domain objects: the kind segment and the key glob, compiled as one glob over `kind/key`.
    Object {
        /// The kind as written.
        kind: String,
        /// The key glob as written.
        key: String,
        /// `kind/key` compiled.
        glob: Glob,
    },
    /// Secrets by reference name.
    Secret(Glob),
    /// URL endpoints.
    Endpoint(EndpointPattern),
    /// Named services.
    Service(Glob),
    /// Programs, with optional argument patterns.
    Program {
        /// The program glob.
        program: Glob,
        /// Per-argument patterns; a final `...` allows more arguments.
        args: Option<Vec<String>>,
    },
    /// Branches.
    Branch(Glob),
    /// Queue topics.
    Topic(Glob),
    /// The environment as a whole.
    Environment,
}

impl ResourcePattern {
    /// Compiles a spec.
    pub fn from_spec(spec: &ResourceSpec) -> Result<ResourcePattern, ResourceError> {
        let glob = |field: &'static str, text: &str, sep: u8| {
            Glob::new(text, sep).map_err(|source| ResourceError::Glob { field, source })
        };
        let kinds = [
            spec.path.is_some(),
            spec.object.is_some(),
            spec.secret.is_some(),
            spec.endpoint.is_some(),
            spec.service.is_some(),
            spec.program.is_some(),
            spec.branch.is_some(),
            spec.topic.is_some(),
            spec.environment.is_some(),
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(ResourceError::Kinds);
        }
        if spec.key.is_some() && spec.object.is_none() {
            return Err(ResourceError::Stray("key"));
        }
        if spec.args.is_some() && spec.program.is_none() {
            return Err(ResourceError::Stray("args"));
        }
        Ok(if let Some(p) = &spec.path {
            ResourcePattern::Path(glob("path", p, b'/')?)
        } else if let Some(kind) = &spec.object {
            if kind.contains('/') || kind.contains("**") {
                return Err(ResourceError::Glob {
                    field: "object",
                    source: GlobError::BadGlobstar(kind.clone()),
                });
            }
            let key = spec.key.clone().unwrap_or_else(|| "**".to_owned());
            let full = glob("key", &format!("{kind}/{key}"), b'/')?;
            ResourcePattern::Object {
                kind: kind.clone(),
                key,
                glob: full,
            }
        } else if let Some(s) = &spec.secret {
            ResourcePattern::Secret(glob("secret", s, b'/')?)
        } else if let Some(e) = &spec.endpoint {
            ResourcePattern::Endpoint(EndpointPattern::parse(e)?)
        } else if let Some(s) = &spec.service {
            ResourcePattern::Service(glob("service", s, b'/')?)
        } else if let Some(p) = &spec.program {
            if let Some(args) = &spec.args
                && args.iter().any(|a| a.chars().any(char::is_control))
            {
                return Err(ResourceError::Glob {
                    field: "args",
                    source: GlobError::Control(args.join(" ")),
                });
            }
            ResourcePattern::Program {
                program: glob("program", p, b'/')?,
                args: spec.args.clone(),
            }
        } else if let Some(b) = &spec.branch {
            ResourcePattern::Branch(glob("branch", b, b'/')?)
        } else if let Some(t) = &spec.topic {
            ResourcePattern::Topic(glob("topic", t, b'.')?)
        } else if spec.environment == Some(true) {
            ResourcePattern::Environment
        } else {
            return Err(ResourceError::Environment);
        })
    }

    /// The spec this pattern was compiled from (for rendering and storage).
    pub fn to_spec(&self) -> Option<ResourceSpec> {
        let mut s = ResourceSpec::default();
        match self {
            ResourcePattern::Any => return None,
            ResourcePattern::Path(g) => s.path = Some(g.to_string()),
            ResourcePattern::Object { kind, key, .. } => {
                s.object = Some(kind.clone());
                s.key = Some(key.clone());
            }
            ResourcePattern::Secret(g) => s.secret = Some(g.to_string()),
            ResourcePattern::Endpoint(e) => s.endpoint = Some(e.text.clone()),
            ResourcePattern::Service(g) => s.service = Some(g.to_string()),
            ResourcePattern::Program { program, args } => {
                s.program = Some(program.to_string());
                s.args = args.clone();
            }
            ResourcePattern::Branch(g) => s.branch = Some(g.to_string()),
            ResourcePattern::Topic(g) => s.topic = Some(g.to_string()),
            ResourcePattern::Environment => s.environment = Some(true),
        }
        Some(s)
    }

    /// A glob over workspace paths (shorthand for rules built in code).
    pub fn path(glob: &str) -> Result<ResourcePattern, ResourceError> {
        ResourcePattern::from_spec(&ResourceSpec {
            path: Some(glob.to_owned()),
            ..ResourceSpec::default()
        })
    }

    /// The kind of resource, `None` for [`ResourcePattern::Any`].
    pub fn kind(&self) -> Option<ResourceKind> {
        Some(match self {
            ResourcePattern::Any => return None,
            ResourcePattern::Path(_) => ResourceKind::Path,
            ResourcePattern::Object { .. } => ResourceKind::Object,
            ResourcePattern::Secret(_) => ResourceKind::Secret,
            ResourcePattern::Endpoint(_) => ResourceKind::Endpoint,
            ResourcePattern::Service(_) => ResourceKind::Service,
            ResourcePattern::Program { .. } => ResourceKind::Program,
            ResourcePattern::Branch(_) => ResourceKind::Branch,
            ResourcePattern::Topic(_) => ResourceKind::Topic,
            ResourcePattern::Environment => ResourceKind::Environment,
        })
    }

    /// Whether the pattern applies to `target`. For a listing (a prefix), a permit must cover
    /// everything under it while a forbid applies as soon as anything under it may match: both
    /// err on the side of denying.
    #[inline]
    pub(crate) fn matches(&self, target: &Target<'_>, forbid: bool) -> bool {
        match (self, target) {
            (ResourcePattern::Any, _) => true,
            (ResourcePattern::Path(g), Target::Path(p)) => g.matches(p),
            (ResourcePattern::Object { glob, .. }, Target::Object(p)) => glob.matches(p),
            (ResourcePattern::Path(g), Target::PathPrefix(p))
            | (ResourcePattern::Object { glob: g, .. }, Target::ObjectPrefix(p)) => {
                if forbid {
                    g.may_match_under(p)
                } else {
                    g.covers_prefix(p)
                }
            }
            (ResourcePattern::Secret(g), Target::Secret(s)) => g.matches(s.as_bytes()),
            (ResourcePattern::Endpoint(e), Target::Endpoint(t)) => e.matches(t),
            (ResourcePattern::Service(g), Target::Service(s)) => g.matches(s.as_bytes()),
            (ResourcePattern::Program { program, args }, Target::Program(p, a)) => {
                program.matches(p.as_bytes())
                    && args.as_ref().is_none_or(|pats| args_match(pats, a))
            }
            (ResourcePattern::Branch(g), Target::Branch(b)) => g.matches(b.as_bytes()),
            (ResourcePattern::Topic(g), Target::Topic(t)) => g.matches(t.as_bytes()),
            (ResourcePattern::Environment, Target::Environment) => true,
            _ => false,
        }
    }
}

fn args_match(pats: &[String], args: &[String]) -> bool {
    let (pats, rest_ok) = match pats.split_last() {
        Some((last, init)) if last == "..." => (init, true),
        _ => (pats, false),
    };
    if args.len() < pats.len() || (!rest_ok && args.len() != pats.len()) {
        return false;
    }
    pats.iter()
        .zip(args)
        .all(|(p, a)| wild_match(p.as_bytes(), a.as_bytes()))
}

impl fmt::Display for ResourcePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResourcePattern::Any => f.write_str("*"),
            ResourcePattern::Path(g) => write!(f, "{g}"),
            ResourcePattern::Object { glob, .. } => write!(f, "obj:{glob}"),
            ResourcePattern::Secret(g) => write!(f, "secret:{g}"),
            ResourcePattern::Endpoint(e) => f.write_str(&e.text),
            ResourcePattern::Service(g) => write!(f, "service:{g}"),
            ResourcePattern::Program { program, args } => {
                write!(f, "program:{program}")?;
                if let Some(args) = args {
                    for a in args {
                        write!(f, " {a}")?;
                    }
                }
                Ok(())
            }
            ResourcePattern::Branch(g) => write!(f, "branch:{g}"),
            ResourcePattern::Topic(g) => write!(f, "topic:{g}"),
            ResourcePattern::Environment => f.write_str("environment"),
        }
    }
}

impl Serialize for ResourcePattern {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.to_spec() {
            Some(spec) => spec.serialize(s),
            None => s.serialize_str("*"),
        }
    }
}

impl<'de> Deserialize<'de> for ResourcePattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Any(String),
            Spec(Box<ResourceSpec>),
        }
        match Repr::deserialize(d)? {
            Repr::Any(s) if s == "*" => Ok(ResourcePattern::Any),
            Repr::Any(s) => Err(serde::de::Error::custom(format!(
                "resource must be \"*\" or a table, not {s:?}"
            ))),
            Repr::Spec(spec) => ResourcePattern::from_spec(&spec).map_err(serde::de::Error::custom),
        }
    }
}

/// What a request touches, borrowed from the request (matching must not allocate).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Target<'a> {
    Path(&'a [u8]),
    PathPrefix(&'a [u8]),
    Object(&'a [u8]),
    ObjectPrefix(&'a [u8]),
    Secret(&'a str),
    Endpoint(Endpoint<'a>),
    Service(&'a str),
    Program(&'a str, &'a [String]),
    Branch(&'a str),
    Topic(&'a str),
    Environment,
}

impl<'a> Target<'a> {
    pub(crate) fn of(r: &'a Resource) -> Option<Target<'a>> {
        Some(match r {
            Resource::Key(k) => match k.namespace() {
                Namespace::Fs => Target::Path(k.path()),
                Namespace::Obj => Target::Object(k.path()),
                _ => return None,
            },
            Resource::Prefix(p) => match p.namespace() {
                Namespace::Fs => Target::PathPrefix(p.path()),
                Namespace::Obj => Target::ObjectPrefix(p.path()),
                _ => return None,
            },
            Resource::Branch(b) => Target::Branch(b),
            Resource::Secret(s) => Target::Secret(s),
            Resource::Service(s) => match Endpoint::parse(s) {
                Some(e) => Target::Endpoint(e),
                None if s.contains("://") => return None,
                None => Target::Service(s),
            },
            Resource::Program { program, args } => Target::Program(program, args),
            Resource::Topic(t) => Target::Topic(t),
            Resource::Environment => Target::Environment,
            // A resource kind this crate does not know yet is never matched by a permit.
            _ => return None,
        })
    }
}

/// A stable one-line name for a resource, used to tie an approval to exactly one request.
pub fn resource_label(r: &Resource) -> String {
    match r {
        Resource::Key(k) => k.to_string(),
        Resource::Prefix(p) => format!("{p}/**"),
        Resource::Branch(b) => format!("branch:{b}"),
        Resource::Secret(s) => format!("secret:{s}"),
        Resource::Service(s) => format!("service:{s}"),
        Resource::Program { program, args } => {
            let mut s = format!("program:{program}");
            for a in args {
                s.push(' ');
                s.push_str(&format!("{a:?}"));
            }
            s
        }
        Resource::Topic(t) => format!("topic:{t}"),
        Resource::Environment => "environment".to_owned(),
        other => format!("{other:?}"),
    }
}

/// The part of a resource that a pattern is compared with, for explanations.
pub(crate) fn resource_short(r: &Resource) -> String {
    match r {
        Resource::Key(k) => k.display_path(),
        Resource::Secret(s) | Resource::Service(s) | Resource::Branch(s) | Resource::Topic(s) => {
            s.clone()
        }
        other => resource_label(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let p = EndpointPattern::parse("https://*.github.com/repos/").unwrap();
        let e = Endpoint::parse("https://api.github.com/repos/x/y?q=1").unwrap();
        assert!(p.matches(&e));
        let e = Endpoint::parse("https://api.github.com:8443/repos/x").unwrap();
        assert!(!p.matches(&e));
        let e = Endpoint::parse("https://api.github.com/reposx").unwrap();
        assert!(!p.matches(&e));
        let p = EndpointPattern::parse("*://localhost:*").unwrap();
        assert!(p.matches(&Endpoint::parse("http://localhost:8080/a").unwrap()));
    }

    #[test]
    fn args() {
        let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(args_match(&a(&["test", "..."]), &a(&["test", "-p", "x"])));
        assert!(!args_match(&a(&["test"]), &a(&["test", "-p"])));
        assert!(args_match(&a(&["--*"]), &a(&["--release"])));
    }
}
