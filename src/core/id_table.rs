//! Row numbers found by id, without a second copy of the ids.
//!
//! An index that numbers its rows keeps each row's id in a `Vec` anyway; a
//! `HashMap<String, u32>` beside it held every id a second time (its bytes,
//! its `String`, and the map's slot). [`IdTable`] keeps only the row numbers,
//! hashed by the id each one indexes, and reads the id from the caller's
//! slice to compare.

use hashbrown::HashTable;
use std::hash::BuildHasher;

/// A set of row numbers keyed by `ids[row]`, for a slice `ids` the caller
/// keeps and passes to every call (the same slice, changed only through
/// these calls' contract).
#[derive(Clone, Debug, Default)]
pub struct IdTable {
    rows: HashTable<u32>,
}

fn hash(id: &str) -> u64 {
    foldhash::fast::FixedState::with_seed(0).hash_one(id)
}

impl IdTable {
    pub fn with_capacity(capacity: usize) -> IdTable {
        IdTable { rows: HashTable::with_capacity(capacity) }
    }

    /// The table of `ids` in order (`ids[row]` at `row`); `None` when an id repeats.
    pub fn of_unique<S: AsRef<str>>(ids: &[S]) -> Option<IdTable> {
        let mut table = IdTable::with_capacity(ids.len());
        for (row, id) in ids.iter().enumerate() {
            if table.get(ids, id.as_ref()).is_some() {
                return None;
            }
            table.insert(ids, id.as_ref(), row as u32);
        }
        Some(table)
    }

    /// The row whose id is `id`.
    pub fn get<S: AsRef<str>>(&self, ids: &[S], id: &str) -> Option<u32> {
        self.rows.find(hash(id), |&row| ids[row as usize].as_ref() == id).copied()
    }

    /// Records that `ids[row]` is `id`; `id` must not be recorded yet.
    pub fn insert<S: AsRef<str>>(&mut self, ids: &[S], id: &str, row: u32) {
        debug_assert!(self.get(ids, id).is_none());
        self.rows.insert_unique(hash(id), row, |&row| hash(ids[row as usize].as_ref()));
    }

    /// Forgets `id`; returns the row it had.
    pub fn remove<S: AsRef<str>>(&mut self, ids: &[S], id: &str) -> Option<u32> {
        match self.rows.find_entry(hash(id), |&row| ids[row as usize].as_ref() == id) {
            Ok(entry) => Some(entry.remove().0),
            Err(_) => None,
        }
    }

    /// Records that `id`, recorded at row `from`, is now at row `to`.
    pub fn moved(&mut self, id: &str, from: u32, to: u32) {
        if let Some(row) = self.rows.find_mut(hash(id), |&row| row == from) {
            *row = to;
        }
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Inserts and swap-removes, as the vector index does them, against a
        /// `HashMap` model.
        #[test]
        fn finds_what_a_map_finds(steps in proptest::collection::vec((any::<bool>(), 0u8..24), 0..120)) {
            let mut ids: Vec<Box<str>> = Vec::new();
            let mut table = IdTable::default();
            let mut model: HashMap<String, u32> = HashMap::new();
            for (insert, name) in steps {
                let id = format!("id{name}");
                if insert {
                    if table.get(&ids, &id).is_none() {
                        ids.push(id.clone().into());
                        table.insert(&ids, &id, ids.len() as u32 - 1);
                        model.insert(id, ids.len() as u32 - 1);
                    }
                } else if let Some(row) = table.remove(&ids, &id) {
                    prop_assert_eq!(model.remove(&id), Some(row));
                    let last = ids.len() as u32 - 1;
                    ids.swap_remove(row as usize);
                    if row < last {
                        table.moved(&ids[row as usize], last, row);
                        model.insert(ids[row as usize].to_string(), row);
                    }
                } else {
                    prop_assert!(!model.contains_key(&id));
                }
                prop_assert_eq!(table.len(), model.len());
                for name in 0u8..24 {
                    let id = format!("id{name}");
                    prop_assert_eq!(table.get(&ids, &id), model.get(&id).copied());
                }
            }
        }
    }
}
