//! One directory as a canonical hash trie: lookup, batch update, listing and diff.

use std::sync::Arc;

use super::node::{Entry, LEAF_MAX, Named, Node, NodeSource, Ptr, TreeEdit, bucket};
use crate::error::Result;

/// The entry named `name` in the directory rooted at `root`.
pub(crate) fn get(src: &dyn NodeSource, root: &Ptr, name: &[u8]) -> Result<Option<Entry>> {
    Ok(get_named(src, root, name)?.map(|named| named.1.clone()))
}

/// The entry named `name` in the directory rooted at `root`, shared with the node holding it.
pub(crate) fn get_named(src: &dyn NodeSource, root: &Ptr, name: &[u8]) -> Result<Option<Named>> {
    let mut node = src.node(root)?;
    let mut level = 0;
    loop {
        let next = match &*node {
            Node::Leaf(es) => {
                return Ok(es
                    .binary_search_by(|named| named.0.as_slice().cmp(name))
                    .ok()
                    .map(|i| es[i].clone()));
            }
            Node::Split { children, .. } => {
                let b = bucket(name, level);
                match children.iter().find(|(cb, _)| *cb == b) {
                    Some((_, h)) => *h,
                    None => return Ok(None),
                }
            }
        };
        node = src.node(&next)?;
        level += 1;
    }
}

/// Every entry of the directory, sorted by name.
pub(crate) fn entries(src: &dyn NodeSource, root: &Ptr) -> Result<Vec<(Vec<u8>, Entry)>> {
    Ok(shared_entries(src, root)?
        .into_iter()
        .map(Arc::unwrap_or_clone)
        .collect())
}

/// Every entry of the directory, sorted by name, shared with the nodes holding them.
fn shared_entries(src: &dyn NodeSource, root: &Ptr) -> Result<Vec<Named>> {
    let mut out = Vec::new();
    collect(src, root, &mut out)?;
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

fn collect(src: &dyn NodeSource, h: &Ptr, out: &mut Vec<Named>) -> Result<()> {
    match &*src.node(h)? {
        Node::Leaf(es) => out.extend(es.iter().cloned()),
        Node::Split { children, .. } => {
            for (_, c) in children {
                collect(src, c, out)?;
            }
        }
    }
    Ok(())
}

/// A name's new entry (`None` removes it).
type Change = (Vec<u8>, Option<Entry>);

/// Applies `changes` (sorted by name, each name once; `None` removes) to the directory at `root`
/// (`None` for an empty one). Returns the new root, `None` if the directory became empty.
pub(crate) fn update(
    edit: &mut TreeEdit<'_>,
    root: Option<&Ptr>,
    changes: Vec<Change>,
) -> Result<Option<Ptr>> {
    update_at(edit, root, 0, changes)
}

fn update_at(
    edit: &mut TreeEdit<'_>,
    root: Option<&Ptr>,
    level: usize,
    changes: Vec<Change>,
) -> Result<Option<Ptr>> {
    if changes.is_empty() {
        return Ok(root.copied());
    }
    let node = match root {
        None => return Ok(build(edit, level, merge_sorted(&[], changes))),
        Some(h) => edit.node(h)?,
    };
    match &*node {
        Node::Leaf(es) => Ok(build(edit, level, merge_sorted(es, changes))),
        Node::Split { children, count } => {
            let mut new_children: Vec<(u8, Ptr)> = Vec::with_capacity(16);
            let mut count = *count;
            let mut groups: Vec<Vec<Change>> = vec![Vec::new(); 16];
            for c in changes {
                groups[bucket(&c.0, level) as usize].push(c);
            }
            for (b, group) in groups.into_iter().enumerate() {
                let b = b as u8;
                let old = children.iter().find(|(cb, _)| *cb == b).map(|(_, h)| *h);
                let new = if group.is_empty() {
                    old
                } else {
                    // The count changes by what this child's did: the others are not read.
                    let new = update_at(edit, old.as_ref(), level + 1, group)?;
                    let counted = |p: Option<Ptr>| match p {
                        Some(h) => edit.node(&h).map(|n| n.count()),
                        None => Ok(0),
                    };
                    count = count.saturating_sub(counted(old)?) + counted(new)?;
                    new
                };
                if let Some(h) = new {
                    new_children.push((b, h));
                }
            }
            if count as usize <= LEAF_MAX {
                // Collapse, so the shape stays a function of the names alone.
                let mut all = Vec::with_capacity(count as usize);
                for (_, h) in &new_children {
                    collect(edit, h, &mut all)?;
                }
                all.sort_by(|a, b| a.0.cmp(&b.0));
                return Ok(build(edit, level, all));
            }
            Ok(Some(edit.store(Node::Split {
                count,
                children: new_children,
            })))
        }
    }
}

/// `old` with `changes` applied (both sorted by name).
fn merge_sorted(old: &[Named], changes: Vec<Change>) -> Vec<Named> {
    let mut out = Vec::with_capacity(old.len() + changes.len());
    let mut old = old.iter().peekable();
    for (name, entry) in changes {
        while let Some(kept) = old.next_if(|o| o.0 < name) {
            out.push(kept.clone());
        }
        // The entry this change replaces, if any.
        old.next_if(|o| o.0 == name);
        if let Some(e) = entry.filter(|e| !e.is_empty()) {
            out.push(Arc::new((name, e)));
        }
    }
    out.extend(old.cloned());
    out
}

fn build(edit: &mut TreeEdit<'_>, level: usize, entries: Vec<Named>) -> Option<Ptr> {
    if entries.is_empty() {
        return None;
    }
    if entries.len() <= LEAF_MAX {
        return Some(edit.store(Node::Leaf(entries)));
    }
    let count = entries.len() as u64;
    let mut groups: Vec<Vec<Named>> = vec![Vec::new(); 16];
    for e in entries {
        groups[bucket(&e.0, level) as usize].push(e);
    }
    let children = groups
        .into_iter()
        .enumerate()
        .filter_map(|(b, g)| build(edit, level + 1, g).map(|h| (b as u8, h)))
        .collect();
    Some(edit.store(Node::Split { count, children }))
}

/// A name whose entry differs between two directories.
pub(crate) type EntryDiff = (Vec<u8>, Option<Entry>, Option<Entry>);

/// The names whose entries differ between two directories, sorted by name. Descends only into
/// trie nodes whose hashes differ.
pub(crate) fn diff(
    src: &dyn NodeSource,
    a: Option<&Ptr>,
    b: Option<&Ptr>,
    out: &mut Vec<EntryDiff>,
) -> Result<()> {
    let start = out.len();
    diff_at(src, a, b, &mut |d| out.push(d))?;
    out[start..].sort_by(|x, y| x.0.cmp(&y.0));
    Ok(())
}

fn diff_at(
    src: &dyn NodeSource,
    a: Option<&Ptr>,
    b: Option<&Ptr>,
    emit: &mut dyn FnMut(EntryDiff),
) -> Result<()> {
    if a == b {
        return Ok(());
    }
    let na: Option<Arc<Node>> = a.map(|h| src.node(h)).transpose()?;
    let nb: Option<Arc<Node>> = b.map(|h| src.node(h)).transpose()?;
    if let (Some(Node::Split { children: ca, .. }), Some(Node::Split { children: cb, .. })) =
        (na.as_deref(), nb.as_deref())
    {
        for bkt in 0u8..16 {
            let x = ca.iter().find(|(k, _)| *k == bkt).map(|(_, h)| h);
            let y = cb.iter().find(|(k, _)| *k == bkt).map(|(_, h)| h);
            diff_at(src, x, y, emit)?;
        }
        return Ok(());
    }
    // Shared, not copied: only the entries that differ are copied out.
    let ea = match a {
        Some(h) => shared_entries(src, h)?,
        None => Vec::new(),
    };
    let eb = match b {
        Some(h) => shared_entries(src, h)?,
        None => Vec::new(),
    };
    let (mut i, mut j) = (0, 0);
    while i < ea.len() || j < eb.len() {
        let ord = match (ea.get(i), eb.get(j)) {
            (Some(x), Some(y)) => x.0.cmp(&y.0),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, _) => std::cmp::Ordering::Greater,
        };
        match ord {
            std::cmp::Ordering::Less => {
                emit((ea[i].0.clone(), Some(ea[i].1.clone()), None));
                i += 1;
            }
            std::cmp::Ordering::Greater => {
                emit((eb[j].0.clone(), None, Some(eb[j].1.clone())));
                j += 1;
            }
            std::cmp::Ordering::Equal => {
                if ea[i].1 != eb[j].1 {
                    emit((
                        ea[i].0.clone(),
                        Some(ea[i].1.clone()),
                        Some(eb[j].1.clone()),
                    ));
                }
                i += 1;
                j += 1;
            }
        }
    }
    Ok(())
}
