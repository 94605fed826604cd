//! The vector index: ids and unit vectors, exact top-k by cosine.
//!
//! Vectors live in one flat `Vec<f32>` (row `i` belongs to `ids[i]`), so a
//! search is a single linear scan with a bounded heap: O(n·d + n·log k).

use crate::core::embedder::dot;
use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

/// One search hit.
#[derive(Clone, Debug, PartialEq)]
pub struct Hit {
    pub id: String,
    pub score: f32,
}

/// Errors from index updates.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum IndexError {
    #[error("vector for {id} has {actual} dimensions, the index holds {expected}")]
    Dimension { id: String, expected: usize, actual: usize },
}

/// Exact nearest-neighbour index over unit vectors.
#[derive(Clone, Debug, Default)]
pub struct VectorIndex {
    dimensions: usize,
    ids: Vec<String>,
    vectors: Vec<f32>,
    rows: HashMap<String, usize>,
}

impl VectorIndex {
    /// Returns an empty index for vectors of `dimensions`.
    pub fn new(dimensions: usize) -> VectorIndex {
        VectorIndex { dimensions, ..VectorIndex::default() }
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn dimensions(&self) -> usize {
        self.dimensions
    }

    pub fn contains(&self, id: &str) -> bool {
        self.rows.contains_key(id)
    }

    /// Inserts or replaces the vector of `id`.
    pub fn upsert(&mut self, id: &str, vector: &[f32]) -> Result<(), IndexError> {
        if vector.len() != self.dimensions {
            return Err(IndexError::Dimension { id: id.to_string(), expected: self.dimensions, actual: vector.len() });
        }
        match self.rows.get(id) {
            Some(&row) => self.vectors[row * self.dimensions..(row + 1) * self.dimensions].copy_from_slice(vector),
            None => {
                self.rows.insert(id.to_string(), self.ids.len());
                self.ids.push(id.to_string());
                self.vectors.extend_from_slice(vector);
            }
        }
        debug_assert_eq!(self.vectors.len(), self.ids.len() * self.dimensions);
        Ok(())
    }

    /// Removes `id`; returns whether it was present. The last row moves into its place.
    pub fn remove(&mut self, id: &str) -> bool {
        let Some(row) = self.rows.remove(id) else { return false };
        let last = self.ids.len() - 1;
        if row != last {
            let (head, tail) = self.vectors.split_at_mut(last * self.dimensions);
            head[row * self.dimensions..(row + 1) * self.dimensions].copy_from_slice(&tail[..self.dimensions]);
            self.ids.swap(row, last);
            self.rows.insert(self.ids[row].clone(), row);
        }
        self.ids.pop();
        self.vectors.truncate(last * self.dimensions);
        true
    }

    /// Returns the cosine of `query` with the vector of `id`, if indexed.
    pub fn cosine(&self, id: &str, query: &[f32]) -> Option<f32> {
        if query.len() != self.dimensions {
            return None;
        }
        let row = *self.rows.get(id)?;
        Some(dot(query, &self.vectors[row * self.dimensions..(row + 1) * self.dimensions]))
    }

    /// Returns the `k` ids closest to `query` that pass `keep`, best first.
    /// Ties are broken by id so results never depend on insertion order.
    pub fn search(&self, query: &[f32], k: usize, keep: impl Fn(&str) -> bool) -> Vec<Hit> {
        if k == 0 || query.len() != self.dimensions {
            return Vec::new();
        }
        let mut heap: BinaryHeap<Scored<'_>> = BinaryHeap::with_capacity(k + 1);
        for (row, id) in self.ids.iter().enumerate() {
            if !keep(id) {
                continue;
            }
            let score = dot(query, &self.vectors[row * self.dimensions..(row + 1) * self.dimensions]);
            heap.push(Scored { score, id });
            if heap.len() > k {
                heap.pop();
            }
        }
        let mut hits: Vec<Hit> =
            heap.into_iter().map(|scored| Hit { id: scored.id.to_string(), score: scored.score }).collect();
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(&b.id)));
        hits
    }
}

/// Heap entry ordered so the *worst* hit is on top (a min-heap on quality).
struct Scored<'a> {
    score: f32,
    id: &'a str,
}

impl Ord for Scored<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        other.score.total_cmp(&self.score).then_with(|| self.id.cmp(other.id))
    }
}
impl PartialOrd for Scored<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl PartialEq for Scored<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Scored<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn unit(values: &[f32]) -> Vec<f32> {
        let mut vector = values.to_vec();
        crate::core::embedder::normalize(&mut vector);
        vector
    }

    #[test]
    fn search_returns_best_first_and_filters() {
        let mut index = VectorIndex::new(2);
        index.upsert("a", &unit(&[1.0, 0.0])).unwrap();
        index.upsert("b", &unit(&[1.0, 1.0])).unwrap();
        index.upsert("c", &unit(&[0.0, 1.0])).unwrap();
        let hits = index.search(&unit(&[1.0, 0.1]), 2, |_| true);
        assert_eq!(hits.iter().map(|hit| hit.id.as_str()).collect::<Vec<_>>(), vec!["a", "b"]);
        let hits = index.search(&unit(&[1.0, 0.1]), 2, |id| id != "a");
        assert_eq!(hits[0].id, "b");
        assert!(index.upsert("d", &[1.0]).is_err());
    }

    #[test]
    fn remove_keeps_rows_consistent() {
        let mut index = VectorIndex::new(2);
        for (id, v) in [("a", [1.0, 0.0]), ("b", [0.0, 1.0]), ("c", [0.6, 0.8])] {
            index.upsert(id, &v).unwrap();
        }
        assert!(index.remove("a"));
        assert!(!index.remove("a"));
        assert_eq!(index.len(), 2);
        let hits = index.search(&[0.0, 1.0], 1, |_| true);
        assert_eq!(hits[0].id, "b");
        index.upsert("c", &[1.0, 0.0]).unwrap();
        assert_eq!(index.search(&[1.0, 0.0], 1, |_| true)[0].id, "c");
        assert_eq!(index.cosine("c", &[1.0, 0.0]), Some(1.0));
        assert_eq!(index.cosine("b", &[1.0, 0.0]), Some(0.0));
        assert_eq!(index.cosine("a", &[1.0, 0.0]), None);
        assert_eq!(index.cosine("c", &[1.0]), None);
    }

    proptest! {
        #[test]
        fn top_k_matches_a_full_sort(
            rows in proptest::collection::vec(proptest::collection::vec(-1.0f32..1.0, 3), 0..40),
            query in proptest::collection::vec(-1.0f32..1.0, 3),
            k in 0usize..10,
        ) {
            let mut index = VectorIndex::new(3);
            for (i, row) in rows.iter().enumerate() {
                index.upsert(&format!("id{i:02}"), row).unwrap();
            }
            let hits = index.search(&query, k, |_| true);
            let mut all: Vec<Hit> = rows.iter().enumerate()
                .map(|(i, row)| Hit { id: format!("id{i:02}"), score: dot(&query, row) }).collect();
            all.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(&b.id)));
            all.truncate(k);
            prop_assert_eq!(hits, all);
        }
    }
}
