//! A file's changes between two versions: line by line when both sides are text (the diff of
//! `similar`, in hunks with context), and by size and content hash otherwise, so a person or an
//! agent sees what an operation did to a file without fetching both versions.

use environment_core::{Action, Content, EntryKind, Resource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use similar::{ChangeTag, TextDiff};

use super::error::ServiceError;
use super::files::{fs_key, version};
use super::session::{Session, resolve};

/// Texts larger than this (either side) are compared by size and hash only: a line diff of
/// them would be slow and unreadable.
const MAX_TEXT: usize = 2 << 20;
/// At most this many lines of hunks are listed.
const MAX_LINES: usize = 20_000;
/// A line diff that takes longer than this settles for a coarser result.
const DIFF_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// How a workspace file changed between two versions.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileDiffParams {
    /// The path relative to the workspace.
    pub path: String,
    /// The older version (an op id prefix, a mark, a branch, HEAD~N).
    pub from: String,
    /// The newer version (default: the workspace as it is now).
    #[serde(default)]
    pub to: Option<String>,
    /// Lines of context around each change (default 3, at most 100).
    #[serde(default)]
    #[schemars(range(max = 100))]
    pub context: Option<usize>,
}

/// A file's changes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileDiff {
    /// The path, escaped.
    pub path: String,
    /// The older version's id.
    pub from: String,
    /// The newer version's id.
    pub to: String,
    /// The file at the older version (none when it was not there).
    pub before: Option<Side>,
    /// The file at the newer version (none when it is not there).
    pub after: Option<Side>,
    /// Both sides are text (or absent) and small enough: `hunks` lists the changed lines.
    pub text: bool,
    /// The changed lines with their context, in order.
    pub hunks: Vec<Hunk>,
    /// More lines changed than are listed.
    pub truncated: bool,
}

/// One side of a file's diff.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Side {
    /// `file`, `symlink` or `dir` (only files are compared by lines).
    pub kind: String,
    /// In bytes.
    pub size: u64,
    /// The content's identity, in hex: the blake3 hash of its bytes for a file of up to 2 MiB
    /// (or a symlink's target), the store's content address (also blake3-based) beyond, so
    /// the two sides of a large file are compared without reading them; empty for a
    /// directory.
    pub hash: String,
    /// The Unix mode bits.
    pub mode: u32,
}

/// A run of changed lines with their context.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Hunk {
    /// Its first line in the older version (from 1).
    pub old_start: usize,
    /// Its lines in the older version.
    pub old_lines: usize,
    /// Its first line in the newer version (from 1).
    pub new_start: usize,
    /// Its lines in the newer version.
    pub new_lines: usize,
    /// The lines, each kept, removed or added.
    pub lines: Vec<Line>,
}

/// One line of a hunk.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Line {
    /// `keep`, `remove` or `add`.
    pub op: String,
    /// The line, without its end.
    pub text: String,
}

/// The changes in the unified format people and models read (`--- a/path`, `+++ b/path`,
/// `@@ -l,n +l,n @@`, then ` `, `-` and `+` lines); a file that is not compared by lines is
/// told by its size and hash on each side.
impl std::fmt::Display for FileDiff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let side = |s: &Option<Side>| match s {
            Some(s) => format!(
                "{} of {} bytes, {}",
                s.kind,
                s.size,
                &s.hash[..16.min(s.hash.len())]
            ),
            None => "absent".to_owned(),
        };
        if !self.text {
            return write!(
                f,
                "{}: not compared by lines (not text, or too large): {} → {}",
                self.path,
                side(&self.before),
                side(&self.after)
            );
        }
        if self.hunks.is_empty() && !self.truncated {
            return write!(f, "{}: no change between the two versions", self.path);
        }
        let name = |s: &Option<Side>, at: &str| match s {
            Some(_) => format!("{at}/{}", self.path),
            None => "/dev/null".to_owned(),
        };
        writeln!(f, "--- {}", name(&self.before, "a"))?;
        write!(f, "+++ {}", name(&self.after, "b"))?;
        for h in &self.hunks {
            write!(
                f,
                "\n@@ -{},{} +{},{} @@",
                h.old_start, h.old_lines, h.new_start, h.new_lines
            )?;
            for l in &h.lines {
                let mark = match l.op.as_str() {
                    "add" => '+',
                    "remove" => '-',
                    _ => ' ',
                };
                write!(f, "\n{mark}{}", l.text)?;
            }
        }
        if self.truncated {
            write!(f, "\n… (more changes are not listed)")?;
        }
        Ok(())
    }
}

/// One side as read: its description, and its bytes when it is a file small enough to compare
/// by lines.
type Read = (Side, Option<Vec<u8>>);

/// A path's entry at a version, read as the caller (core checks the read again).
fn side(
    g: &Session<'_>,
    key: &environment_core::Key,
    at: &environment_core::OpId,
) -> Result<Option<Read>, ServiceError> {
    let env = g.env();
    let Some(value) = env.read(g.actor(), key, at).map_err(ServiceError::from)? else {
        return Ok(None);
    };
    let meta = &value.meta;
    let small = meta.kind == EntryKind::File && meta.size <= MAX_TEXT as u64;
    let (hash, bytes) = match (&value.content, small) {
        (_, true) | (Content::Inline(_), _) => {
            let bytes = env.content(&value).map_err(ServiceError::from)?;
            (blake3::hash(&bytes).to_hex().to_string(), Some(bytes))
        }
        (Content::Blob(h) | Content::Chunks(h), false) => (h.to_hex(), None),
    };
    let side = Side {
        kind: format!("{:?}", meta.kind).to_lowercase(),
        size: meta.size,
        hash: if meta.kind == EntryKind::Dir {
            String::new()
        } else {
            hash
        },
        mode: meta.mode,
    };
    Ok(Some((side, bytes.filter(|_| small))))
}

pub(super) fn file_diff(g: &Session<'_>, p: FileDiffParams) -> Result<FileDiff, ServiceError> {
    let key = fs_key(&p.path)?;
    let context = p.context.unwrap_or(3);
    if context > 100 {
        return Err(ServiceError::invalid("`context` must be at most 100"));
    }
    g.allow_rechecked(Action::Read, Resource::Key(key.clone()), Some("read"))?;
    let from = resolve(g.shared(), &p.from)?;
    let to = version(g, p.to.as_deref())?;
    let before = side(g, &key, &from)?;
    let after = side(g, &key, &to)?;
    let (hunks, truncated, text) = match (text_of(&before), text_of(&after)) {
        (Some(old), Some(new)) => {
            let (hunks, truncated) = hunks(old, new, context);
            (hunks, truncated, true)
        }
        _ => (Vec::new(), false, false),
    };
    Ok(FileDiff {
        path: key.display_path(),
        from: from.to_string(),
        to: to.to_string(),
        before: before.map(|(s, _)| s),
        after: after.map(|(s, _)| s),
        text,
        hunks,
        truncated,
    })
}

/// A side's text: empty when the path is absent, none when it is not a file, not UTF-8 or too
/// large to compare by lines.
fn text_of(side: &Option<Read>) -> Option<&str> {
    match side {
        None => Some(""),
        Some((_, Some(bytes))) => std::str::from_utf8(bytes).ok(),
        Some((_, None)) => None,
    }
}

/// The hunks of a line diff of `old` and `new` with `context` lines around each change, and
/// whether some were left out (past [`MAX_LINES`]).
fn hunks(old: &str, new: &str, context: usize) -> (Vec<Hunk>, bool) {
    // A pathological pair settles for a coarser diff rather than holding the request.
    let diff = TextDiff::configure()
        .timeout(DIFF_TIME)
        .diff_lines(old, new);
    let mut out = Vec::new();
    let mut listed = 0;
    for group in diff.grouped_ops(context) {
        let (Some(first), Some(last)) = (group.first(), group.last()) else {
            continue;
        };
        let (old_range, new_range) = (
            first.old_range().start..last.old_range().end,
            first.new_range().start..last.new_range().end,
        );
        let mut lines = Vec::new();
        let mut cut = false;
        'ops: for op in &group {
            for change in diff.iter_changes(op) {
                if listed == MAX_LINES {
                    cut = true;
                    break 'ops;
                }
                listed += 1;
                let op = match change.tag() {
                    ChangeTag::Equal => "keep",
                    ChangeTag::Delete => "remove",
                    ChangeTag::Insert => "add",
                };
                let text = change.value();
                lines.push(Line {
                    op: op.to_owned(),
                    text: text.strip_suffix('\n').unwrap_or(text).to_owned(),
                });
            }
        }
        // As unified diffs number them: from 1, and an empty range by the line before it.
        let start = |r: &std::ops::Range<usize>| r.start + usize::from(!r.is_empty());
        out.push(Hunk {
            old_start: start(&old_range),
            old_lines: old_range.len(),
            new_start: start(&new_range),
            new_lines: new_range.len(),
            lines,
        });
        if cut {
            return (out, true);
        }
    }
    (out, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_line_is_a_hunk_with_its_context() {
        let old = "a\nb\nc\nd\ne\nf\ng\n";
        let new = "a\nb\nc\nD\ne\nf\ng\nh\n";
        let (hunks, truncated) = hunks(old, new, 1);
        assert!(!truncated);
        let shown: Vec<Vec<(String, String)>> = hunks
            .iter()
            .map(|h| {
                h.lines
                    .iter()
                    .map(|l| (l.op.clone(), l.text.clone()))
                    .collect()
            })
            .collect();
        let line = |op: &str, t: &str| (op.to_owned(), t.to_owned());
        assert_eq!(
            shown,
            [
                vec![
                    line("keep", "c"),
                    line("remove", "d"),
                    line("add", "D"),
                    line("keep", "e")
                ],
                vec![line("keep", "g"), line("add", "h")],
            ]
        );
        assert_eq!(
            (
                hunks[0].old_start,
                hunks[0].old_lines,
                hunks[0].new_start,
                hunks[0].new_lines
            ),
            (3, 3, 3, 3)
        );
        assert_eq!(
            (hunks[1].old_start, hunks[1].new_start, hunks[1].new_lines),
            (7, 7, 2)
        );
        let diff = FileDiff {
            path: "f.txt".into(),
            from: "a".into(),
            to: "b".into(),
            before: None,
            after: Some(Side {
                kind: "file".into(),
                size: 2,
                hash: "00".repeat(32),
                mode: 0o644,
            }),
            text: true,
            hunks: hunks[1..].to_vec(),
            truncated: false,
        };
        assert_eq!(
            diff.to_string(),
            "--- /dev/null\n+++ b/f.txt\n@@ -7,1 +7,2 @@\n g\n+h"
        );
    }

    #[test]
    fn a_new_file_numbers_its_empty_side_by_the_line_before_and_a_cut_diff_says_so() {
        let (new, _) = hunks("", "a\n", 3);
        let h = &new[0];
        assert_eq!(
            (h.old_start, h.old_lines, h.new_start, h.new_lines),
            (0, 0, 1, 1)
        );
        let long: String = (0..MAX_LINES + 10).map(|n| format!("{n}\n")).collect();
        let (cut, truncated) = hunks("", &long, 3);
        assert!(truncated);
        assert_eq!(cut[0].lines.len(), MAX_LINES, "the cut hunk is kept");
        let diff = FileDiff {
            path: "long.txt".into(),
            from: "a".into(),
            to: "b".into(),
            before: None,
            after: None,
            text: true,
            hunks: Vec::new(),
            truncated: true,
        };
        assert!(!diff.to_string().contains("no change"), "{diff}");
    }
}
