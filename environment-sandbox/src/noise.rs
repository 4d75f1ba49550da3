//! Noise: what is never captured (ignored) and what is captured without making history (quiet).
//!
//! Rules use gitignore syntax with gitignore's meaning: a pattern without a slash matches a name
//! at any depth; one with a slash (or a leading `/`) is anchored at the tracked root. So a rule
//! `/tmp/` swallows the root's `tmp/` and leaves a project's own `src/tmp/` alone.

use std::path::Path;

use ignore::gitignore::{Gitignore, GitignoreBuilder};

use crate::error::{Result, SandboxError};

/// Editor swap and backup files, interpreter caches, package-manager scratch: never worth a
/// snapshot, never restored, never deleted by a restore.
pub const DEFAULT_IGNORED: &[&str] = &[
    "*.swp",
    "*.swo",
    "*.swx",
    "*~",
    ".#*",
    "#*#",
    ".DS_Store",
    "__pycache__/",
    "*.pyc",
    ".pytest_cache/",
    ".mypy_cache/",
    ".ruff_cache/",
    ".npm/_cacache/",
    ".cache/pip/",
    ".environment/",
];

/// Captured and restorable, but a capture touching only these is no history node of its own:
/// build output and tool state that change with every command.
pub const DEFAULT_QUIET: &[&str] = &["target/", "node_modules/", ".git/", "*.log"];

/// How a path is classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Captured; makes history.
    Tracked,
    /// Captured; no history node on its own.
    Quiet,
    /// Never captured, restored or deleted.
    Ignored,
}

/// The compiled rules of one tracked root.
#[derive(Debug, Clone)]
pub struct Noise {
    ignored: Gitignore,
    quiet: Gitignore,
    precious: Gitignore,
}

/// Which rules to use.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NoiseRules {
    /// Start from [`DEFAULT_IGNORED`] and [`DEFAULT_QUIET`].
    pub defaults: bool,
    /// Further ignored patterns (a `!pattern` re-includes).
    pub ignored: Vec<String>,
    /// Further quiet patterns.
    pub quiet: Vec<String>,
    /// Ignored paths a restore must never delete, even inside a directory the target version
    /// lacks (which otherwise goes with everything in it, ignored content included). None by
    /// default beyond [`ALWAYS_PRECIOUS`].
    pub precious: Vec<String>,
}

/// Never deleted by a restore, whatever the rules say: an environment's own home.
pub const ALWAYS_PRECIOUS: &[&str] = &[".environment/"];

impl Default for NoiseRules {
    fn default() -> NoiseRules {
        NoiseRules {
            defaults: true,
            ignored: Vec::new(),
            quiet: Vec::new(),
            precious: Vec::new(),
        }
    }
}

/// Temporary files of an interrupted restore: the engine's own, never anyone's content.
pub(crate) const RESTORE_TEMP: &str = ".environment-restore-";

fn build(root: &Path, defaults: &[&str], extra: &[String]) -> Result<Gitignore> {
    let mut b = GitignoreBuilder::new(root);
    let own = format!("{RESTORE_TEMP}*");
    b.add_line(None, &own).map_err(|e| SandboxError::Rule {
        rule: own.clone(),
        detail: e.to_string(),
    })?;
    for rule in defaults
        .iter()
        .copied()
        .chain(extra.iter().map(String::as_str))
    {
        b.add_line(None, rule).map_err(|e| SandboxError::Rule {
            rule: rule.to_owned(),
            detail: e.to_string(),
        })?;
    }
    b.build().map_err(|e| SandboxError::Rule {
        rule: String::new(),
        detail: e.to_string(),
    })
}

impl Noise {
    /// Compiles `rules` for the tree at `root`.
    pub fn new(root: &Path, rules: &NoiseRules) -> Result<Noise> {
        let (di, dq): (&[&str], &[&str]) = if rules.defaults {
            (DEFAULT_IGNORED, DEFAULT_QUIET)
        } else {
            (&[], &[])
        };
        Ok(Noise {
            ignored: build(root, di, &rules.ignored)?,
            quiet: build(root, dq, &rules.quiet)?,
            precious: build(root, ALWAYS_PRECIOUS, &rules.precious)?,
        })
    }

    /// Classifies `rel` (relative to the root); a path under an ignored directory is ignored.
    pub fn classify(&self, rel: &Path, is_dir: bool) -> Class {
        if self
            .ignored
            .matched_path_or_any_parents(rel, is_dir)
            .is_ignore()
        {
            Class::Ignored
        } else if self
            .quiet
            .matched_path_or_any_parents(rel, is_dir)
            .is_ignore()
        {
            Class::Quiet
        } else {
            Class::Tracked
        }
    }

    /// Whether `rel` is ignored.
    pub fn is_ignored(&self, rel: &Path, is_dir: bool) -> bool {
        self.classify(rel, is_dir) == Class::Ignored
    }

    /// Whether `rel` is ignored, for a walk that never enters an ignored directory: its parents
    /// are known not to be, so only its own name is matched.
    pub fn is_ignored_below_kept(&self, rel: &Path, is_dir: bool) -> bool {
        self.ignored.matched(rel, is_dir).is_ignore()
    }

    /// Whether a restore must never delete `rel` (or anything under it).
    pub fn is_precious(&self, rel: &Path, is_dir: bool) -> bool {
        self.precious
            .matched_path_or_any_parents(rel, is_dir)
            .is_ignore()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchored_rules_do_not_swallow_nested_names() {
        let rules = NoiseRules {
            defaults: true,
            ignored: vec!["/tmp/".into(), "/dev/".into()],
            quiet: vec![],
            precious: vec![],
        };
        let n = Noise::new(Path::new("/w"), &rules).unwrap();
        assert_eq!(n.classify(Path::new("tmp/x"), false), Class::Ignored);
        assert_eq!(n.classify(Path::new("src/tmp/x"), false), Class::Tracked);
        assert_eq!(n.classify(Path::new("src/dev"), true), Class::Tracked);
        assert_eq!(
            n.classify(Path::new("a/b/.main.rs.swp"), false),
            Class::Ignored
        );
        assert_eq!(
            n.classify(Path::new("pkg/__pycache__/m.pyc"), false),
            Class::Ignored
        );
        assert_eq!(
            n.classify(Path::new("target/debug/app"), false),
            Class::Quiet
        );
        assert_eq!(
            n.classify(Path::new("src/target.rs"), false),
            Class::Tracked
        );
    }
}
