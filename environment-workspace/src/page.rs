//! Lists answered a page at a time: at most `limit` items after a cursor (the key of the last
//! item a caller has), and the cursor of the next page when more follow.

use super::error::ServiceError;

/// At most `limit` of `items` (in their order) after the one whose key is `after`, and the key
/// to continue after when more follow. A cursor that names no item is invalid: what it named
/// is gone, and the caller starts again from the first page.
pub(crate) fn page<T, K: PartialEq + std::fmt::Debug>(
    items: Vec<T>,
    key: impl Fn(&T) -> K,
    after: Option<&K>,
    limit: usize,
) -> Result<(Vec<T>, Option<K>), ServiceError> {
    let start = match after {
        None => 0,
        Some(cursor) => {
            items
                .iter()
                .position(|i| &key(i) == cursor)
                .ok_or_else(|| {
                    ServiceError::invalid(format!(
                        "`after` names nothing in the list ({cursor:?}); start again without it"
                    ))
                })?
                + 1
        }
    };
    let limit = limit.max(1);
    let more = items.len() > start + limit;
    let page: Vec<T> = items.into_iter().skip(start).take(limit).collect();
    let next = if more { page.last().map(&key) } else { None };
    Ok((page, next))
}

/// [`page`] for a list sorted by its keys: the page starts after the cursor's place in the
/// order, so a cursor whose item went away meanwhile (a branch deleted between two pages)
/// still continues where it was.
pub(crate) fn page_sorted<T, K: Ord + Clone>(
    items: Vec<T>,
    key: impl Fn(&T) -> K,
    after: Option<&K>,
    limit: usize,
) -> (Vec<T>, Option<K>) {
    let start = after.map_or(0, |cursor| items.partition_point(|i| &key(i) <= cursor));
    let limit = limit.max(1);
    let more = items.len() > start + limit;
    let page: Vec<T> = items.into_iter().skip(start).take(limit).collect();
    let next = if more { page.last().map(&key) } else { None };
    (page, next)
}

/// Whether `items`, read with one more than `limit`, has more than `limit`; it keeps `limit`.
pub(crate) fn more_than<T>(items: &mut Vec<T>, limit: usize) -> bool {
    let more = items.len() > limit;
    items.truncate(limit);
    more
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_walk_the_whole_list_once() {
        let items: Vec<u32> = (1..=7).collect();
        let (mut seen, mut after) = (Vec::new(), None);
        loop {
            let (p, next) = page(items.clone(), |i| *i, after.as_ref(), 3).unwrap();
            seen.extend(p);
            match next {
                Some(n) => after = Some(n),
                None => break,
            }
        }
        assert_eq!(seen, items);
        assert!(page(items, |i| *i, Some(&99), 3).is_err());
    }

    #[test]
    fn a_sorted_list_goes_on_after_a_cursor_that_went_away() {
        let items = vec!["a", "b", "d", "e"];
        let (p, next) = page_sorted(items.clone(), |i| i.to_string(), Some(&"c".to_owned()), 1);
        assert_eq!((p, next), (vec!["d"], Some("d".to_owned())));
        let (p, next) = page_sorted(items, |i| i.to_string(), Some(&"d".to_owned()), 5);
        assert_eq!((p, next), (vec!["e"], None));
    }
}
