//! The methods on workspace files: read, list and write, at the head (after capturing what
//! changed) or, for reading, at any version. A write is an operation of the workspace's actor,
//! written into the tree like a merge.

use environment_core::{
    Action, EntryKind, ErrorKind, Intent, Key, KeyPrefix, Namespace, OpId, Resource,
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::commands::Bytes;
use super::error::ServiceError;
use super::session::{Session, resolve};
use environment_sandbox::error::SandboxError;

/// At most this many entries are listed.
const MAX_LISTED: usize = 10_000;

pub(super) fn fs_key(path: &str) -> Result<Key, ServiceError> {
    Key::fs(path.trim_start_matches("./")).map_err(|e| {
        ServiceError::new(
            ErrorKind::Invalid,
            format!("{path:?} is not a workspace path: {e}"),
            "use a path relative to the workspace, without `..`, a leading `/` or empty segments.",
        )
    })
}

/// The version to read: the one named, else the head after a capture of what changed.
pub(super) fn version(g: &Session<'_>, spec: Option<&str>) -> Result<OpId, ServiceError> {
    match spec {
        Some(v) => resolve(g.shared(), v),
        None => {
            g.capture("capture before a read")?;
            g.env().head(g.branch()).map_err(ServiceError::from)
        }
    }
}

/// Reads a workspace file, at the workspace as it is now or at a version.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadParams {
    /// The path relative to the workspace.
    pub path: String,
    /// The version to read (default: the workspace as it is now).
    #[serde(default)]
    pub version: Option<String>,
}

/// A file's content at a version.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileRead {
    /// The path, escaped.
    pub path: String,
    /// The version read.
    pub version: String,
    /// In bytes.
    pub size: usize,
    /// The Unix mode bits.
    pub mode: u32,
    /// The content.
    #[serde(flatten)]
    pub content: Bytes,
}

pub(super) fn read(g: &Session<'_>, p: ReadParams) -> Result<FileRead, ServiceError> {
    let key = fs_key(&p.path)?;
    // Core checks the same again when it reads.
    g.allow_rechecked(Action::Read, Resource::Key(key.clone()), Some("read"))?;
    let v = version(g, p.version.as_deref())?;
    let env = &g.env();
    let value = env
        .read(g.actor(), &key, &v)
        .map_err(ServiceError::from)?
        .filter(|value| value.meta.kind == EntryKind::File)
        .ok_or_else(|| {
            ServiceError::new(
                ErrorKind::NotFound,
                format!("there is no file {} at version {}", p.path, v.short()),
                "list the files with file.list.",
            )
        })?;
    let bytes = env.content(&value).map_err(ServiceError::from)?;
    Ok(FileRead {
        path: key.display_path(),
        version: v.to_string(),
        size: bytes.len(),
        mode: value.meta.mode,
        content: Bytes::of(&bytes),
    })
}

/// Lists workspace files, at the workspace as it is now or at a version.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// A directory relative to the workspace (default: all).
    #[serde(default)]
    pub prefix: Option<String>,
    /// The version (default: the workspace as it is now).
    #[serde(default)]
    pub version: Option<String>,
    /// The page after this path (the `next` of the previous page).
    #[serde(default)]
    pub after: Option<String>,
    /// At most this many entries (default and most 10,000).
    #[serde(default)]
    pub limit: Option<usize>,
}

/// Files at a version.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FileList {
    /// The version listed.
    pub version: String,
    /// Every entry under the prefix.
    pub total: usize,
    /// A page of them, by path.
    pub entries: Vec<Listed>,
    /// Where the next page starts (`after`), when more follow.
    #[serde(default)]
    pub next: Option<String>,
}

/// An entry of a listing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Listed {
    /// The path, escaped.
    pub path: String,
    /// `file`, `dir`, `symlink`…
    pub kind: String,
    /// In bytes.
    pub size: u64,
}

pub(super) fn list(g: &Session<'_>, p: ListParams) -> Result<FileList, ServiceError> {
    let prefix = match p.prefix.as_deref().map(|d| d.trim_matches('/')) {
        None | Some("") | Some(".") => KeyPrefix::all(Namespace::Fs),
        Some(d) => KeyPrefix::new(Namespace::Fs, d)
            .map_err(|e| ServiceError::invalid(format!("{d:?} is not a workspace path: {e}")))?,
    };
    g.allow_rechecked(Action::Read, Resource::Prefix(prefix.clone()), Some("list"))?;
    let v = version(g, p.version.as_deref())?;
    let entries = g
        .env()
        .list(g.actor(), &prefix, &v)
        .map_err(ServiceError::from)?;
    let total = entries.len();
    let entries = entries
        .iter()
        .map(|(k, value)| Listed {
            path: k.display_path(),
            kind: format!("{:?}", value.meta.kind).to_lowercase(),
            size: value.meta.size,
        })
        .collect();
    let limit = p.limit.unwrap_or(MAX_LISTED).min(MAX_LISTED);
    let (entries, next) = super::page::page(
        entries,
        |e: &Listed| e.path.clone(),
        p.after.as_ref(),
        limit,
    )?;
    Ok(FileList {
        version: v.to_string(),
        total,
        entries,
        next,
    })
}

/// Writes a whole workspace file (creating its directories), recorded as one operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteParams {
    /// The path relative to the workspace.
    pub path: String,
    /// The whole new content (UTF-8 text).
    pub content: String,
    /// Why, for the history (default "write PATH").
    #[serde(default)]
    pub intent: Option<String>,
}

/// A file written or deleted.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Edited {
    /// The path, escaped.
    pub path: String,
    /// The operation that recorded it.
    pub version: String,
}

pub(super) fn write(g: &Session<'_>, p: WriteParams) -> Result<Edited, ServiceError> {
    edit(g, &p.path, Some(p.content), p.intent)
}

/// Deletes a workspace file or symlink (not a directory), recorded as one operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteParams {
    /// The path relative to the workspace.
    pub path: String,
    /// Why, for the history (default "delete PATH").
    #[serde(default)]
    pub intent: Option<String>,
}

pub(super) fn delete(g: &Session<'_>, p: DeleteParams) -> Result<Edited, ServiceError> {
    edit(g, &p.path, None, p.intent)
}

/// Writes `content` at `path`, or deletes what is there (`None`), as one operation of the
/// workspace's actor with what the request presents.
fn edit(
    g: &Session<'_>,
    path: &str,
    content: Option<String>,
    intent: Option<String>,
) -> Result<Edited, ServiceError> {
    let key = fs_key(path)?;
    let (action, verb) = match content {
        Some(_) => (Action::Write, "write"),
        None => (Action::Delete, "delete"),
    };
    // Core checks the same again when it records the change.
    g.allow_rechecked(action, Resource::Key(key.clone()), Some(verb))?;
    let shared = g.shared();
    let rel = key.display_path();
    let intent = Intent::edit(intent.unwrap_or_else(|| format!("{verb} {path}")));
    let obs = shared
        .with_tracker(|t| {
            let as_asked = t.presenting(g.credentials());
            match content {
                Some(c) => as_asked.write_file(g.actor(), &rel, c.into_bytes(), intent),
                None => as_asked.delete_file(g.actor(), &rel, intent),
            }
        })
        .map_err(|e| match e {
            SandboxError::NotWritable { .. } => ServiceError::invalid(e),
            other => ServiceError::from(other),
        })?;
    Ok(Edited {
        path: rel,
        version: obs.version.to_string(),
    })
}
