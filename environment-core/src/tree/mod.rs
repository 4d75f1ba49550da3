//! Views: content-addressed Merkle trees over the keyspace.
//!
//! The root directory holds one entry per namespace; below it, every path segment is a directory
//! level. Unchanged subtrees keep their hashes and are shared between versions, so writing k keys
//! creates O(k · depth) nodes and diffing two views descends only where hashes differ.

pub(crate) mod block;
pub(crate) mod dir;
pub(crate) mod node;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::key::{Key, KeyPrefix, Namespace};
use crate::value::Value;
pub(crate) use node::{Entry, NewNode, Node, NodeId, NodeSource, Ptr, TreeEdit};

/// One key whose value differs between two views.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyChange {
    /// The key.
    pub key: Key,
    /// Its value in the first view (`None`: absent).
    pub before: Option<Value>,
    /// Its value in the second view (`None`: absent).
    pub after: Option<Value>,
}

impl KeyChange {
    /// What happened to the key: `added`, `removed` or `modified`.
    pub fn change(&self) -> &'static str {
        match (&self.before, &self.after) {
            (None, _) => "added",
            (_, None) => "removed",
            _ => "modified",
        }
    }
}

fn ns_segment(ns: Namespace) -> &'static [u8] {
    ns.as_str().as_bytes()
}

/// The directory at `segments` below `root`, if there is one.
fn descend(src: &dyn NodeSource, root: &Ptr, segments: &[&[u8]]) -> Result<Option<Ptr>> {
    let mut dir = *root;
    for seg in segments {
        match dir::get(src, &dir, seg)?.and_then(|e| e.tree) {
            Some(h) => dir = h,
            None => return Ok(None),
        }
    }
    Ok(Some(dir))
}

/// The value at `key` in the view rooted at `root`.
pub(crate) fn get(src: &dyn NodeSource, root: &Ptr, key: &Key) -> Result<Option<Value>> {
    let mut segs: Vec<&[u8]> = vec![ns_segment(key.namespace())];
    segs.extend(key.segments());
    let Some((last, parents)) = segs.split_last() else {
        return Ok(None);
    };
    let Some(dir) = descend(src, root, parents)? else {
        return Ok(None);
    };
    Ok(dir::get(src, &dir, last)?.and_then(|e| e.value))
}

/// A change to apply: the key and its new value (`None` deletes).
pub(crate) type Put = (Key, Option<Value>);

/// What applying changes did to one key: whether it had a value before, and has one after.
pub(crate) struct Applied {
    pub key: Key,
    pub before: bool,
    pub after: bool,
}

impl From<KeyChange> for Applied {
    fn from(c: KeyChange) -> Applied {
        Applied {
            key: c.key,
            before: c.before.is_some(),
            after: c.after.is_some(),
        }
    }
}

/// Applies `changes` (each key once) to the view at `root`; returns the new root and, for every
/// key whose value actually changed, its before and after.
pub(crate) fn apply(
    edit: &mut TreeEdit<'_>,
    root: &Ptr,
    changes: &[Put],
) -> Result<(Ptr, Vec<Applied>)> {
    let mut items: Vec<(Vec<&[u8]>, &Put)> = changes
        .iter()
        .map(|c| {
            let mut segs: Vec<&[u8]> = vec![ns_segment(c.0.namespace())];
            segs.extend(c.0.segments());
            (segs, c)
        })
        .collect();
    items.sort_by(|a, b| a.0.cmp(&b.0));
    let mut applied = Vec::new();
    let new_root = apply_dir(edit, Some(root), &items, 0, &mut applied)?;
    let new_root = match new_root {
        Some(h) => h,
        None => edit.store(Node::Leaf(Vec::new())),
    };
    Ok((new_root, applied))
}

fn apply_dir(
    edit: &mut TreeEdit<'_>,
    dir: Option<&Ptr>,
    items: &[(Vec<&[u8]>, &Put)],
    depth: usize,
    applied: &mut Vec<Applied>,
) -> Result<Option<Ptr>> {
    let mut updates: Vec<(Vec<u8>, Option<Entry>)> = Vec::new();
    let mut i = 0;
    while i < items.len() {
        let name = items[i].0[depth];
        let mut j = i;
        while j < items.len() && items[j].0[depth] == name {
            j += 1;
        }
        let group = &items[i..j];
        let current = match dir {
            Some(d) => dir::get_named(edit, d, name)?,
            None => None,
        };
        let (value, tree) = match &current {
            Some(named) => (named.1.value.as_ref(), named.1.tree),
            None => (None, None),
        };
        // Sorted by segments, so a key ending here comes first in its group.
        let (here, below) = match group.first() {
            Some(first) if first.0.len() == depth + 1 => (Some(first), &group[1..]),
            _ => (None, group),
        };
        let mut new_value = None;
        if let Some((_, (key, put))) = here
            && value != put.as_ref()
        {
            applied.push(Applied {
                key: key.clone(),
                before: value.is_some(),
                after: put.is_some(),
            });
            new_value = Some(put);
        }
        let new_tree = match below {
            [] => tree,
            _ => apply_dir(edit, tree.as_ref(), below, depth + 1, applied)?,
        };
        if new_value.is_some() || new_tree != tree {
            let entry = Entry {
                value: match new_value {
                    Some(put) => put.clone(),
                    None => value.cloned(),
                },
                tree: new_tree,
            };
            updates.push((name.to_vec(), Some(entry).filter(|e| !e.is_empty())));
        }
        i = j;
    }
    dir::update(edit, dir, updates)
}

/// Every key under `prefix` (the prefix key itself included), ordered segment by segment.
pub(crate) fn list(
    src: &dyn NodeSource,
    root: &Ptr,
    prefix: &KeyPrefix,
) -> Result<Vec<(Key, Value)>> {
    let mut out = Vec::new();
    walk_prefix(src, root, prefix, &mut |k, v| {
        out.push((k, v));
        Ok(())
    })?;
    Ok(out)
}

fn walk_prefix(
    src: &dyn NodeSource,
    root: &Ptr,
    prefix: &KeyPrefix,
    f: &mut dyn FnMut(Key, Value) -> Result<()>,
) -> Result<()> {
    let ns = prefix.namespace();
    let mut segs: Vec<&[u8]> = vec![ns_segment(ns)];
    if !prefix.path().is_empty() {
        segs.extend(prefix.path().split(|b| *b == b'/'));
    }
    // The prefix names a key (its value is listed) and a directory (its subtree is walked).
    let (last, parents) = match segs.split_last() {
        Some(x) => x,
        None => return Ok(()),
    };
    let Some(parent) = descend(src, root, parents)? else {
        return Ok(());
    };
    let Some(entry) = dir::get(src, &parent, last)? else {
        return Ok(());
    };
    if !prefix.path().is_empty()
        && let Some(v) = entry.value
    {
        f(Key::new(ns, prefix.path().to_vec())?, v)?;
    }
    if let Some(t) = entry.tree {
        walk_dir(src, &t, ns, prefix.path().to_vec(), f)?;
    }
    Ok(())
}

fn join(base: &[u8], name: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(base.len() + 1 + name.len());
    if !base.is_empty() {
        p.extend_from_slice(base);
        p.push(b'/');
    }
    p.extend_from_slice(name);
    p
}

fn walk_dir(
    src: &dyn NodeSource,
    dir: &Ptr,
    ns: Namespace,
    path: Vec<u8>,
    f: &mut dyn FnMut(Key, Value) -> Result<()>,
) -> Result<()> {
    for (name, entry) in dir::entries(src, dir)? {
        let p = join(&path, &name);
        if let Some(v) = entry.value {
            f(Key::new(ns, p.clone())?, v)?;
        }
        if let Some(t) = entry.tree {
            walk_dir(src, &t, ns, p, f)?;
        }
    }
    Ok(())
}

/// The keys under `prefix` (all namespaces when `None`) whose values differ between two views,
/// in key order. Cost follows the difference: equal subtrees are skipped by hash.
pub(crate) fn diff(
    src: &dyn NodeSource,
    a: &Ptr,
    b: &Ptr,
    prefix: Option<&KeyPrefix>,
) -> Result<Vec<KeyChange>> {
    let mut out = Vec::new();
    let prefixes: Vec<KeyPrefix> = match prefix {
        Some(p) => vec![p.clone()],
        None => Namespace::ALL.into_iter().map(KeyPrefix::all).collect(),
    };
    for p in prefixes {
        let ns = p.namespace();
        let mut segs: Vec<&[u8]> = vec![ns_segment(ns)];
        if !p.path().is_empty() {
            segs.extend(p.path().split(|c| *c == b'/'));
        }
        let Some((last, parents)) = segs.split_last() else {
            continue;
        };
        let ea = match descend(src, a, parents)? {
            Some(d) => dir::get(src, &d, last)?,
            None => None,
        };
        let eb = match descend(src, b, parents)? {
            Some(d) => dir::get(src, &d, last)?,
            None => None,
        };
        diff_entry(
            src,
            ns,
            p.path().to_vec(),
            ea,
            eb,
            !p.path().is_empty(),
            &mut out,
        )?;
    }
    Ok(out)
}

fn diff_entry(
    src: &dyn NodeSource,
    ns: Namespace,
    path: Vec<u8>,
    a: Option<Entry>,
    b: Option<Entry>,
    is_key: bool,
    out: &mut Vec<KeyChange>,
) -> Result<()> {
    let (a, b) = (a.unwrap_or_default(), b.unwrap_or_default());
    if is_key && a.value != b.value {
        out.push(KeyChange {
            key: Key::new(ns, path.clone())?,
            before: a.value,
            after: b.value,
        });
    }
    if a.tree != b.tree {
        let mut entries = Vec::new();
        dir::diff(src, a.tree.as_ref(), b.tree.as_ref(), &mut entries)?;
        for (name, ea, eb) in entries {
            diff_entry(src, ns, join(&path, &name), ea, eb, true, out)?;
        }
    }
    Ok(())
}

/// Visits every node reachable from `root`: `seen` returns false for a node already visited,
/// which is then not descended into. `blob` is called for the content of every value that
/// refers to the blob store.
pub(crate) fn walk_nodes(
    src: &dyn NodeSource,
    root: &Ptr,
    seen: &mut dyn FnMut(&Ptr) -> bool,
    blob: &mut dyn FnMut(&crate::value::Content),
) -> Result<()> {
    let mut stack = vec![*root];
    while let Some(h) = stack.pop() {
        if !seen(&h) {
            continue;
        }
        match &*src.node(&h)? {
            Node::Leaf(es) => {
                for named in es {
                    let e = &named.1;
                    if let Some(v) = e.value.as_ref().filter(|v| v.blob().is_some()) {
                        blob(&v.content);
                    }
                    if let Some(t) = e.tree {
                        stack.push(t);
                    }
                }
            }
            Node::Split { children, .. } => stack.extend(children.iter().map(|(_, c)| *c)),
        }
    }
    Ok(())
}
