//! Segment-aware globs: `*` matches within one segment, `**` matches any number of whole segments.
//!
//! Patterns are compiled once at load so that matching a request walks bytes without allocating.
//! The matcher is the classic greedy wildcard algorithm applied twice: over segments (where `**`
//! is the star) and, inside a segment, over bytes (where `*` is the star). One backtracking point
//! per level suffices because every non-star token consumes exactly one element.

use std::fmt;

/// Why a glob pattern was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GlobError {
    /// The pattern was empty.
    #[error("empty pattern")]
    Empty,
    /// Two separators in a row, or a leading or trailing separator.
    #[error("empty segment in pattern `{0}`")]
    EmptySegment(String),
    /// `**` mixed with other characters in one segment.
    #[error("`**` must be a whole segment in pattern `{0}`")]
    BadGlobstar(String),
    /// A control character.
    #[error("control character in pattern `{0:?}`")]
    Control(String),
}

#[derive(Clone, Debug)]
enum Token {
    /// `**`: any number (zero included) of whole segments.
    AnySegments,
    /// A segment without `*`: compared byte for byte.
    Literal(Box<[u8]>),
    /// A segment with `*`.
    Wild(Box<[u8]>),
}

/// A compiled glob over `sep`-separated names.
#[derive(Clone)]
pub struct Glob {
    text: Box<str>,
    sep: u8,
    tokens: Box<[Token]>,
    /// The bytes every match starts with; a cheap filter before the real match.
    literal_prefix: Box<[u8]>,
    /// The bytes every match ends with (`.pem` for `**/*.pem`); the same kind of filter.
    literal_suffix: Box<[u8]>,
    /// `**` followed only by single-segment tokens: a match is decided by the last segments
    /// alone, without backtracking.
    tail_only: bool,
}

impl PartialEq for Glob {
    fn eq(&self, other: &Glob) -> bool {
        self.text == other.text && self.sep == other.sep
    }
}
impl Eq for Glob {}

impl fmt::Debug for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Glob({:?})", self.text)
    }
}

impl fmt::Display for Glob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Glob {
    /// Compiles a `/`-separated pattern (paths, branches, programs).
    pub fn path(pattern: &str) -> Result<Glob, GlobError> {
        Glob::new(pattern, b'/')
    }

    /// Compiles a pattern whose segments are separated by `sep` (`.` for topics and hosts).
    pub fn new(pattern: &str, sep: u8) -> Result<Glob, GlobError> {
        if pattern.is_empty() {
            return Err(GlobError::Empty);
        }
        if pattern.chars().any(char::is_control) {
            return Err(GlobError::Control(pattern.to_owned()));
        }
        let mut tokens = Vec::new();
        for seg in pattern.as_bytes().split(|b| *b == sep) {
            if seg.is_empty() {
                return Err(GlobError::EmptySegment(pattern.to_owned()));
            }
            if seg == b"**" {
                // `**/**` means the same as `**`; keeping one keeps matching linear.
                if !matches!(tokens.last(), Some(Token::AnySegments)) {
                    tokens.push(Token::AnySegments);
                }
            } else if seg.windows(2).any(|w| w == b"**") {
                return Err(GlobError::BadGlobstar(pattern.to_owned()));
            } else if seg.contains(&b'*') {
                tokens.push(Token::Wild(seg.into()));
            } else {
                tokens.push(Token::Literal(seg.into()));
            }
        }
        let mut literal_prefix = Vec::new();
        for t in &tokens {
            match t {
                Token::Literal(l) => {
                    if !literal_prefix.is_empty() {
                        literal_prefix.push(sep);
                    }
                    literal_prefix.extend_from_slice(l);
                }
                Token::Wild(w) => {
                    if !literal_prefix.is_empty() {
                        literal_prefix.push(sep);
                    }
                    let lit = w.iter().take_while(|b| **b != b'*').copied();
                    literal_prefix.extend(lit);
                    break;
                }
                Token::AnySegments => break,
            }
        }
        let literal_suffix: Vec<u8> = match tokens.last() {
            Some(Token::Literal(l)) => l.to_vec(),
            Some(Token::Wild(w)) => {
                let tail = w.iter().rposition(|b| *b == b'*').map_or(0, |i| i + 1);
                w[tail..].to_vec()
            }
            _ => Vec::new(),
        };
        let tail_only = matches!(tokens.first(), Some(Token::AnySegments))
            && tokens[1..].iter().all(|t| !matches!(t, Token::AnySegments));
        Ok(Glob {
            text: pattern.into(),
            sep,
            tokens: tokens.into(),
            literal_prefix: literal_prefix.into(),
            literal_suffix: literal_suffix.into(),
            tail_only,
        })
    }

    /// The pattern as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the pattern has no wildcard at all.
    pub fn is_literal(&self) -> bool {
        self.tokens.iter().all(|t| matches!(t, Token::Literal(_)))
    }

    /// The first segment when it has no wildcard (an index key: every match starts with it).
    pub(crate) fn first_literal(&self) -> Option<&[u8]> {
        match self.tokens.first() {
            Some(Token::Literal(l)) => Some(l),
            _ => None,
        }
    }

    /// Whether the pattern matches every name (`**`).
    pub fn matches_everything(&self) -> bool {
        matches!(&*self.tokens, [Token::AnySegments])
    }

    /// Whether `name` matches the pattern.
    pub fn matches(&self, name: &[u8]) -> bool {
        if !has_prefix(name, &self.literal_prefix) || !has_suffix(name, &self.literal_suffix) {
            return false;
        }
        let toks = &*self.tokens;
        if self.tail_only {
            let tail = &toks[1..];
            if name.is_empty() {
                return tail.is_empty();
            }
            let mut segs = name.rsplit(|b| *b == self.sep);
            return tail.iter().rev().all(|t| match segs.next() {
                Some(seg) => token_matches(t, seg),
                None => false,
            });
        }
        let end = name.len() + 1;
        let mut ti = 0;
        // Zero segments for the empty name.
        let mut pos = if name.is_empty() { end } else { 0 };
        let mut star: Option<(usize, usize)> = None;
        loop {
            if let Some(tok) = toks.get(ti) {
                match tok {
                    Token::AnySegments => {
                        ti += 1;
                        star = Some((ti, pos));
                        continue;
                    }
                    Token::Literal(l) => {
                        if let Some((seg, next)) = segment(name, pos, self.sep)
                            && seg == &**l
                        {
                            ti += 1;
                            pos = next;
                            continue;
                        }
                    }
                    Token::Wild(w) => {
                        if let Some((seg, next)) = segment(name, pos, self.sep)
                            && wild_match(w, seg)
                        {
                            ti += 1;
                            pos = next;
                            continue;
                        }
                    }
                }
            } else if pos >= end {
                return true;
            }
            // Let the last `**` swallow one more segment and retry from there.
            let Some((sti, spos)) = star else {
                return false;
            };
            let Some((_, next)) = segment(name, spos, self.sep) else {
                return false;
            };
            star = Some((sti, next));
            ti = sti;
            pos = next;
        }
    }

    /// Whether some name equal to `prefix` or under it (segment-wise) may match.
    pub fn may_match_under(&self, prefix: &[u8]) -> bool {
        let start = if prefix.is_empty() {
            prefix.len() + 1
        } else {
            0
        };
        self.live(0, prefix, start)
    }

    fn live(&self, ti: usize, name: &[u8], pos: usize) -> bool {
        if pos > name.len() {
            // Every remaining token can match some segment, so an extension exists.
            return true;
        }
        let Some(tok) = self.tokens.get(ti) else {
            return false;
        };
        let Some((seg, next)) = segment(name, pos, self.sep) else {
            return false;
        };
        match tok {
            Token::AnySegments => self.live(ti + 1, name, pos) || self.live(ti, name, next),
            Token::Literal(l) => seg == &**l && self.live(ti + 1, name, next),
            Token::Wild(w) => wild_match(w, seg) && self.live(ti + 1, name, next),
        }
    }

    /// Whether every name equal to `prefix` or under it matches (conservative: may say no for
    /// unusual patterns that do cover it, never yes for one that does not).
    pub fn covers_prefix(&self, prefix: &[u8]) -> bool {
        let start = if prefix.is_empty() {
            prefix.len() + 1
        } else {
            0
        };
        self.covers(0, prefix, start)
    }

    fn covers(&self, ti: usize, name: &[u8], pos: usize) -> bool {
        if pos > name.len() {
            let rest = &self.tokens[ti.min(self.tokens.len())..];
            return !rest.is_empty() && rest.iter().all(|t| matches!(t, Token::AnySegments));
        }
        let Some(tok) = self.tokens.get(ti) else {
            return false;
        };
        let Some((seg, next)) = segment(name, pos, self.sep) else {
            return false;
        };
        match tok {
            Token::AnySegments => self.covers(ti + 1, name, pos) || self.covers(ti, name, next),
            Token::Literal(l) => seg == &**l && self.covers(ti + 1, name, next),
            Token::Wild(w) => wild_match(w, seg) && self.covers(ti + 1, name, next),
        }
    }
}

/// `starts_with` without a call into `memcmp`: the filters are short and usually fail on the
/// first byte, where the call itself would cost more than the comparison.
#[inline]
fn has_prefix(name: &[u8], pre: &[u8]) -> bool {
    pre.len() <= name.len() && pre.iter().zip(name).all(|(a, b)| a == b)
}

#[inline]
fn has_suffix(name: &[u8], suf: &[u8]) -> bool {
    suf.len() <= name.len() && suf.iter().rev().zip(name.iter().rev()).all(|(a, b)| a == b)
}

#[inline]
fn token_matches(t: &Token, seg: &[u8]) -> bool {
    match t {
        Token::AnySegments => true,
        Token::Literal(l) => seg == &**l,
        Token::Wild(w) => wild_match(w, seg),
    }
}

/// The segment starting at `pos` and the start of the next one (`name.len() + 1` past the end).
#[inline]
fn segment(name: &[u8], pos: usize, sep: u8) -> Option<(&[u8], usize)> {
    let rest = name.get(pos..)?;
    if pos > name.len() {
        return None;
    }
    match rest.iter().position(|b| *b == sep) {
        Some(i) => Some((&rest[..i], pos + i + 1)),
        None => Some((rest, name.len() + 1)),
    }
}

/// `*` matches any bytes (none included); everything else matches itself.
#[inline]
pub(crate) fn wild_match(pat: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        match pat.get(pi) {
            Some(b'*') => {
                pi += 1;
                star = Some((pi, si));
            }
            Some(c) if *c == s[si] => {
                pi += 1;
                si += 1;
            }
            _ => match star {
                Some((sp, ss)) => {
                    pi = sp;
                    si = ss + 1;
                    star = Some((sp, ss + 1));
                }
                None => return false,
            },
        }
    }
    pat[pi..].iter().all(|b| *b == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, s: &str) -> bool {
        Glob::path(p).unwrap().matches(s.as_bytes())
    }

    #[test]
    fn segments() {
        assert!(m("src/*.rs", "src/main.rs"));
        assert!(!m("src/*.rs", "src/a/main.rs"));
        assert!(m("src/**/*.rs", "src/main.rs"));
        assert!(m("src/**/*.rs", "src/a/b/main.rs"));
        assert!(m("secrets/**", "secrets"));
        assert!(m("secrets/**", "secrets/a/b"));
        assert!(!m("secrets/**", "secretsx/a"));
        assert!(m("**", "a/b/c"));
        assert!(m("**/x", "x"));
        assert!(m("a/**/b/**/c", "a/b/c"));
        assert!(m("a/**/b/**/c", "a/q/b/r/s/c"));
        assert!(!m("a/**/b/**/c", "a/q/r/s/c"));
        assert!(m("*", "abc"));
        assert!(!m("*", "a/b"));
        assert!(m("a*b*c", "aXbYc"));
        assert!(!m("a*b*c", "aXbY"));
        assert!(!m("a", ""));
        assert!(m("**", ""));
        assert!(m("**/*.pem", "a/b/key.pem"));
        assert!(m("**/*.pem", "key.pem"));
        assert!(!m("**/*.pem", "a/key.pem/x"));
        assert!(m("**/keys/*.pem", "a/keys/k.pem"));
        assert!(!m("**/keys/*.pem", "k.pem"));
        assert!(!m("**/*", ""));
    }

    #[test]
    fn prefixes() {
        let g = Glob::path("src/**").unwrap();
        assert!(g.covers_prefix(b"src"));
        assert!(g.covers_prefix(b"src/a"));
        assert!(!g.covers_prefix(b""));
        assert!(g.may_match_under(b""));
        assert!(!g.may_match_under(b"doc"));
        let g = Glob::path("src/*.rs").unwrap();
        assert!(!g.covers_prefix(b"src"));
        assert!(g.may_match_under(b"src"));
        assert!(g.may_match_under(b"src/a.rs"));
        assert!(!g.may_match_under(b"src/a.rs/x"));
    }

    #[test]
    fn refusals() {
        assert_eq!(Glob::path(""), Err(GlobError::Empty));
        assert!(matches!(
            Glob::path("a//b"),
            Err(GlobError::EmptySegment(_))
        ));
        assert!(matches!(
            Glob::path("a/**b"),
            Err(GlobError::BadGlobstar(_))
        ));
        assert!(matches!(Glob::path("/a"), Err(GlobError::EmptySegment(_))));
    }
}
