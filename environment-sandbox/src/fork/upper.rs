//! Capturing a fork from its overlay upper layer.
//!
//! The upper layer holds exactly what the fork changed: new and modified entries as themselves,
//! a deleted entry as a *whiteout* (a character device 0/0), and a directory that replaced one of
//! the base as an *opaque* directory (an `overlay.opaque` extended attribute: `user.` when the
//! overlay was mounted with `userxattr` in a user namespace, `trusted.` otherwise). Redirects and
//! metacopy are off in a user namespace, so these three are all there is.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use environment_core::{ActRequest, ActorId, Change, Intent, Key, Observation, OpFlags, Value};
use rustix::fs::FileType;

use super::{Forks, WorkingTree};
use crate::capture::read_values;
use crate::error::{Result, SandboxError};
use crate::fsops::{self, Root};

/// What the scan of an upper layer found.
#[derive(Default)]
struct Layer {
    /// Entries present in the layer (read afterwards).
    present: Vec<Vec<u8>>,
    /// Paths deleted (whiteouts) or replaced wholesale (opaque directories): everything the
    /// branch has under them goes, before what is present is put back.
    cleared: Vec<Vec<u8>>,
}

pub(super) fn capture(
    forks: &Forks,
    tree: &WorkingTree,
    actor: &ActorId,
    intent: Intent,
    flags: OpFlags,
    extra: Vec<Change>,
) -> Result<Option<Observation>> {
    let root = Root::open(&tree.upper).map_err(SandboxError::io("open", &tree.upper))?;
    let mut layer = Layer::default();
    scan(&root, forks, Vec::new(), &mut layer)?;
    let env = &forks.env;
    let head = env.head(&tree.branch)?;
    let system = ActorId::system();
    let mut changes: BTreeMap<Key, Option<Value>> = BTreeMap::new();
    for rel in &layer.cleared {
        for (k, _) in env.list(&system, &forks.keys.prefix(rel)?, &head)? {
            changes.insert(k, None);
        }
    }
    let guard = env
        .blobs()
        .write_guard()
        .map_err(environment_core::EnvError::from)?;
    for (rel, value) in read_values(&root, &forks.noise, env.blobs(), layer.present)? {
        changes.insert(forks.keys.key(&rel)?, value);
    }
    let mut req = ActRequest::new(actor.clone(), intent)
        .on(tree.branch.clone())
        .flags(flags);
    for (key, value) in changes {
        let before = env.read_unchecked(&key, &head)?;
        if before == value {
            continue;
        }
        req.changes.push(match value {
            Some(v) => Change::Put(key, v),
            None => Change::Delete(key),
        });
    }
    req.changes.extend(extra);
    let observation = if req.changes.is_empty() {
        None
    } else {
        Some(env.act_blocking(req)?)
    };
    drop(guard);
    Ok(observation)
}

fn scan(root: &Root, forks: &Forks, dir: Vec<u8>, layer: &mut Layer) -> Result<()> {
    let dir_path = Path::new(OsStr::from_bytes(&dir));
    let entries = root
        .scan_dir(dir_path)
        .map_err(SandboxError::io("list", dir_path))?;
    for (name, st) in entries {
        let mut rel = dir.clone();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(&name);
        let path = Path::new(OsStr::from_bytes(&rel));
        let st = st.map_err(SandboxError::io("lstat", path))?;
        let ft = fsops::file_type(&st);
        if forks.noise.is_ignored(path, ft == FileType::Directory) {
            continue;
        }
        if ft == FileType::CharacterDevice && st.st_rdev == 0 {
            layer.cleared.push(rel);
            continue;
        }
        if ft == FileType::Directory {
            if is_opaque(&root.path().join(path)) {
                layer.cleared.push(rel.clone());
            }
            layer.present.push(rel.clone());
            scan(root, forks, rel, layer)?;
            continue;
        }
        layer.present.push(rel);
    }
    Ok(())
}

fn is_opaque(dir: &Path) -> bool {
    ["user.overlay.opaque", "trusted.overlay.opaque"]
        .iter()
        .any(|name| {
            let mut buf = [0u8; 4];
            matches!(rustix::fs::lgetxattr(dir, *name, &mut buf), Ok(n) if buf[..n] == *b"y")
        })
}
