//! Capability tokens: the holder's rights intersected with limits, tamper-evident.
//!
//! A token is a chain of caveats (limits). Its tag is a keyed MAC over the header and then over
//! each caveat in turn, keyed by a secret only the environment holds, so only the environment can
//! mint or extend a token, and any change to a caveat breaks the chain. Every caveat must hold for
//! a request to pass, so appending one (attenuating) can only narrow what the token allows.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use environment_core::Spend;
use serde::{Deserialize, Serialize};

use crate::glob::Glob;
use crate::resource::{EndpointPattern, Target};

use crate::error::PolicyError;
use crate::policy::{Policy, lock, random_id};
use crate::rule::ActorKind;

const PREFIX: &str = "ept1.";
const DOMAIN: &[u8] = b"environment-policy capability token v1\0";

/// Why a token was refused. A refused token never allows anything.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// It does not decode.
    #[error("malformed capability token")]
    Malformed,
    /// Its MAC does not verify: it was altered or minted elsewhere.
    #[error("capability token failed verification (tampered with or not ours)")]
    Tampered,
    /// A caveat's expiry has passed.
    #[error("capability token expired at {at} ms")]
    Expired {
        /// The expiry (ms).
        at: i64,
    },
    /// A caveat's use count is spent.
    #[error("capability token used up ({max} use(s) allowed)")]
    Exhausted {
        /// The limit.
        max: u32,
    },
    /// Presented by someone other than its bearer.
    #[error("capability token belongs to `{bearer}`, presented by `{presenter}`")]
    WrongActor {
        /// Who may present it.
        bearer: String,
        /// Who did.
        presenter: String,
    },
    /// The request is outside the token's limits.
    #[error("the request is outside the capability token's limits")]
    OutOfScope,
    /// Limits that do not compile.
    #[error("bad token limits: {0}")]
    BadLimits(String),
}

/// One caveat: every field that is set narrows what the token allows.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenLimits {
    /// Only these actions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actions: Option<Vec<String>>,
    /// Workspace path globs. When any of `paths`, `programs`, `endpoints` is set, the request's
    /// resource must be of one of the set kinds and match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<String>>,
    /// Program globs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub programs: Option<Vec<String>>,
    /// Endpoint patterns (`https://api.example.com/v1`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Vec<String>>,
    /// Not valid from this instant (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<i64>,
    /// At most this many allowed uses of this token and everything attenuated from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uses: Option<u32>,
    /// Only this actor may present the token from here on (handing it to a sub-agent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer: Option<String>,
}

/// A capability token. Build with `Policy::issue_token`, narrow with `Policy::attenuate_token`,
/// carry as text with [`CapabilityToken::encode`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapabilityToken {
    /// A random id.
    pub id: String,
    /// Whose rights the token carries.
    pub principal: String,
    /// The limits, oldest first.
    pub caveats: Vec<TokenLimits>,
    /// The MAC chain's last link, hex.
    pub tag: String,
}

impl CapabilityToken {
    /// The token as compact text (for `Context::token`).
    pub fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        format!("{PREFIX}{}", URL_SAFE_NO_PAD.encode(json))
    }

    /// Reads a token from text; says nothing about its validity.
    pub fn decode(s: &str) -> Result<CapabilityToken, TokenError> {
        let body = s.strip_prefix(PREFIX).ok_or(TokenError::Malformed)?;
        let bytes = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| TokenError::Malformed)?;
        serde_json::from_slice(&bytes).map_err(|_| TokenError::Malformed)
    }

    /// Who may present the token: the last caveat that names a bearer, else the principal.
    pub fn bearer(&self) -> &str {
        self.caveats
            .iter()
            .rev()
            .find_map(|c| c.bearer.as_deref())
            .unwrap_or(&self.principal)
    }
}

pub(crate) fn root_tag(key: &[u8; 32], id: &str, principal: &str) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(DOMAIN);
    h.update(id.as_bytes());
    h.update(b"\0");
    h.update(principal.as_bytes());
    h.finalize()
}

pub(crate) fn link(key: &[u8; 32], prev: &blake3::Hash, caveat: &TokenLimits) -> blake3::Hash {
    let mut h = blake3::Hasher::new_keyed(key);
    h.update(prev.as_bytes());
    // serde_json writes struct fields in declaration order, so the bytes are canonical.
    h.update(&serde_json::to_vec(caveat).unwrap_or_default());
    h.finalize()
}

/// The tags after each caveat, or `Tampered`.
pub(crate) fn verify_chain(
    key: &[u8; 32],
    t: &CapabilityToken,
) -> Result<Vec<blake3::Hash>, TokenError> {
    let mut tag = root_tag(key, &t.id, &t.principal);
    let mut tags = Vec::with_capacity(t.caveats.len());
    for c in &t.caveats {
        tag = link(key, &tag, c);
        tags.push(tag);
    }
    let claimed = blake3::Hash::from_hex(&t.tag).map_err(|_| TokenError::Tampered)?;
    // blake3::Hash compares in constant time.
    if t.caveats.is_empty() || claimed != tag {
        return Err(TokenError::Tampered);
    }
    Ok(tags)
}

/// A caveat ready to test requests.
#[derive(Debug)]
pub(crate) struct CompiledCaveat {
    actions: Option<Vec<String>>,
    paths: Option<Vec<Glob>>,
    programs: Option<Vec<Glob>>,
    endpoints: Option<Vec<EndpointPattern>>,
}

impl CompiledCaveat {
    pub(crate) fn new(c: &TokenLimits) -> Result<CompiledCaveat, TokenError> {
        let bad = |e: String| TokenError::BadLimits(e);
        let globs = |v: &Option<Vec<String>>| -> Result<Option<Vec<Glob>>, TokenError> {
            v.as_ref()
                .map(|v| {
                    v.iter()
                        .map(|p| Glob::path(p).map_err(|e| bad(e.to_string())))
                        .collect()
                })
                .transpose()
        };
        if c.max_uses == Some(0) {
            return Err(bad("max_uses must be positive".into()));
        }
        if let Some(b) = &c.bearer
            && crate::rule::ActorKind::of(b).is_none()
        {
            return Err(bad(format!("bearer `{b}` is not an actor id")));
        }
        Ok(CompiledCaveat {
            actions: c.actions.clone(),
            paths: globs(&c.paths)?,
            programs: globs(&c.programs)?,
            endpoints: c
                .endpoints
                .as_ref()
                .map(|v| {
                    v.iter()
                        .map(|p| EndpointPattern::parse(p).map_err(|e| bad(e.to_string())))
                        .collect()
                })
                .transpose()?,
        })
    }

    pub(crate) fn admits(&self, action: &str, target: &Target<'_>) -> bool {
        if let Some(a) = &self.actions
            && !a.iter().any(|x| x == action)
        {
            return false;
        }
        if self.paths.is_none() && self.programs.is_none() && self.endpoints.is_none() {
            return true;
        }
        match target {
            Target::Path(p) => self
                .paths
                .as_ref()
                .is_some_and(|g| g.iter().any(|g| g.matches(p))),
            Target::PathPrefix(p) => self
                .paths
                .as_ref()
                .is_some_and(|g| g.iter().any(|g| g.covers_prefix(p))),
            Target::Program(p, _) => self
                .programs
                .as_ref()
                .is_some_and(|g| g.iter().any(|g| g.matches(p.as_bytes()))),
            Target::Endpoint(e) => self
                .endpoints
                .as_ref()
                .is_some_and(|g| g.iter().any(|g| g.matches(e))),
            _ => false,
        }
    }
}

impl Policy {
    /// Mints a token carrying `principal`'s rights within `limits`.
    pub fn issue_token(
        &self,
        principal: &str,
        limits: TokenLimits,
    ) -> crate::error::Result<CapabilityToken> {
        if ActorKind::of(principal).is_none() {
            return Err(PolicyError::BadEntity(principal.to_owned()));
        }
        CompiledCaveat::new(&limits)?;
        let id = random_id("");
        let root = root_tag(&self.token_key, &id, principal);
        let tag = link(&self.token_key, &root, &limits);
        Ok(CapabilityToken {
            id,
            principal: principal.to_owned(),
            caveats: vec![limits],
            tag: tag.to_hex().to_string(),
        })
    }

    /// Narrows a token: the result allows at most what `token` allows, within `limits` too.
    /// Only the token's current bearer may attenuate it (`by`).
    pub fn attenuate_token(
        &self,
        token: &CapabilityToken,
        by: &str,
        limits: TokenLimits,
    ) -> crate::error::Result<CapabilityToken> {
        let tags = self.verified_tags(token, by)?;
        CompiledCaveat::new(&limits)?;
        let Some(last) = tags.last() else {
            return Err(TokenError::Tampered.into());
        };
        let tag = link(&self.token_key, last, &limits);
        let mut t = token.clone();
        t.caveats.push(limits);
        t.tag = tag.to_hex().to_string();
        Ok(t)
    }

    /// Checks a token's MAC, expiry, remaining uses and bearer (what the supervisor does when a
    /// sandboxed agent calls back with one). Whether it covers a request is for [`Policy::check`].
    pub fn verify_token(
        &self,
        token: &CapabilityToken,
        presenter: &str,
    ) -> std::result::Result<(), TokenError> {
        self.verified_tags(token, presenter).map(drop)
    }

    /// [`Policy::verify_token`], returning the MAC chain's links (the keys of use counters).
    pub(crate) fn verified_tags(
        &self,
        token: &CapabilityToken,
        presenter: &str,
    ) -> std::result::Result<Vec<blake3::Hash>, TokenError> {
        let tags = verify_chain(&self.token_key, token)?;
        let now = self.clock.now_ms();
        for c in &token.caveats {
            if let Some(at) = c.expires_at
                && now >= at
            {
                return Err(TokenError::Expired { at });
            }
        }
        if token.bearer() != presenter {
            return Err(TokenError::WrongActor {
                bearer: token.bearer().to_owned(),
                presenter: presenter.to_owned(),
            });
        }
        let rt = lock(&self.runtime);
        for (c, tag) in token.caveats.iter().zip(&tags) {
            if let Some(max) = c.max_uses
                && rt
                    .token_uses
                    .get(&tag.to_hex().to_string())
                    .copied()
                    .unwrap_or(0)
                    >= max
            {
                return Err(TokenError::Exhausted { max });
            }
        }
        Ok(tags)
    }

    /// The uses a request under `token` consumes (one per caveat with a use limit), or why
    /// the token has none left. Spent with the action (see `Policy::spend_uses`).
    pub(crate) fn token_uses(
        &self,
        token: &CapabilityToken,
        tags: &[blake3::Hash],
    ) -> std::result::Result<Vec<Spend>, TokenError> {
        let rt = lock(&self.runtime);
        let mut uses = Vec::new();
        for (c, tag) in token.caveats.iter().zip(tags) {
            if let Some(max) = c.max_uses {
                let tag = tag.to_hex().to_string();
                crate::spend::token_used(&rt, &tag, max)?;
                uses.push(Spend::TokenUse { tag, max });
            }
        }
        Ok(uses)
    }
}
