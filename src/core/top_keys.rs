//! Ranking keys: a score and a rank packed into one `u64` whose integer order
//! is the order of quality, and [`TopKeys`], which keeps the best `k` of them.
//!
//! Shared by the vector index (`index.rs`) and the lexical index
//! (`lexical.rs`), which rank candidates the same way; it sits below both so
//! neither imports the other for it.

/// A key whose integer order is the order of quality: the score by
/// `f32::total_cmp` in the high half, then the lower rank in the low half.
/// Ranks are unique, so keys are.
pub fn quality_key(score: f32, rank: u32) -> u64 {
    let bits = score.to_bits();
    // Negative floats order backwards as integers: flip them whole; flip only the sign of the others.
    let ordered = if bits & 0x8000_0000 != 0 { !bits } else { bits | 0x8000_0000 };
    (u64::from(ordered) << 32) | u64::from(u32::MAX - rank)
}

/// The score a [`quality_key`] was made of, bit for bit.
pub fn key_score(key: u64) -> f32 {
    let ordered = (key >> 32) as u32;
    f32::from_bits(if ordered & 0x8000_0000 != 0 { ordered & 0x7FFF_FFFF } else { !ordered })
}

/// The rank a [`quality_key`] was made of.
pub fn key_rank(key: u64) -> u32 {
    u32::MAX - key as u32
}

/// The `k` largest of the keys offered, largest first. Keys above a running
/// threshold are buffered; a buffer of `4k` is cut to its best `k` (a
/// selection, linear), whose smallest becomes the threshold. Most keys are
/// turned away by one comparison, and the few taken cost O(1) each.
pub struct TopKeys {
    k: usize,
    buffer: Vec<u64>,
    /// Keys at or below it cannot be among the best `k`; `None` until the first cut.
    threshold: Option<u64>,
}

impl TopKeys {
    pub fn new(k: usize) -> TopKeys {
        TopKeys { k, buffer: Vec::with_capacity(4 * k.max(1)), threshold: None }
    }

    /// Whether `key` could be among the best `k` of the keys taken so far.
    pub fn could_take(&self, key: u64) -> bool {
        self.k > 0 && self.threshold.is_none_or(|threshold| key > threshold)
    }

    /// A score no key below can enter with, whatever its rank: a key whose
    /// score is `< bar()` is turned away by one float comparison (a key at
    /// or above it may still be, by [`TopKeys::could_take`]). Negative
    /// infinity until the first cut.
    pub fn bar(&self) -> f32 {
        self.threshold.map_or(f32::NEG_INFINITY, key_score)
    }

    /// Takes `key`, which [`TopKeys::could_take`] said could enter.
    pub fn take(&mut self, key: u64) {
        self.buffer.push(key);
        if self.buffer.len() >= 4 * self.k {
            self.cut();
        }
    }

    /// Keeps the best `k` of the buffer.
    fn cut(&mut self) {
        if self.buffer.len() > self.k {
            self.buffer.select_nth_unstable_by(self.k - 1, |a, b| b.cmp(a));
            self.buffer.truncate(self.k);
        }
        if self.buffer.len() == self.k {
            self.threshold = self.buffer.iter().min().copied();
        }
    }

    /// The best `k` keys, largest first.
    pub fn into_best_first(mut self) -> Vec<u64> {
        if self.k == 0 {
            return Vec::new();
        }
        self.cut();
        self.buffer.sort_unstable_by(|a, b| b.cmp(a));
        self.buffer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Keys order as `(score by total_cmp, lower rank)` and give both back bit for bit.
        #[test]
        fn quality_keys_order_as_score_then_rank(
            a in proptest::num::f32::ANY, b in proptest::num::f32::ANY, ra in 0u32..5, rb in 0u32..5,
        ) {
            let expected = a.total_cmp(&b).then_with(|| rb.cmp(&ra));
            prop_assert_eq!(quality_key(a, ra).cmp(&quality_key(b, rb)), expected);
            prop_assert_eq!(key_score(quality_key(a, ra)).to_bits(), a.to_bits());
            prop_assert_eq!(key_rank(quality_key(a, ra)), ra);
        }

        /// TopKeys keeps exactly the best k keys, best first, whatever the offer order.
        #[test]
        fn top_keys_match_a_full_sort(keys in proptest::collection::hash_set(proptest::num::u64::ANY, 0..300), k in 0usize..20) {
            let keys: Vec<u64> = keys.into_iter().collect();
            let mut top = TopKeys::new(k);
            for &key in &keys {
                if top.could_take(key) {
                    top.take(key);
                }
            }
            let mut all = keys.clone();
            all.sort_unstable_by(|a, b| b.cmp(a));
            all.truncate(k);
            prop_assert_eq!(top.into_best_first(), all);
        }

        /// A score below the bar is never a key TopKeys could take, whatever its rank.
        #[test]
        fn nothing_below_the_bar_could_be_taken(
            taken in proptest::collection::vec((proptest::num::f32::ANY, 0u32..50), 0..200),
            k in 1usize..10,
            score in proptest::num::f32::ANY,
            rank in 0u32..60,
        ) {
            let mut top = TopKeys::new(k);
            for (score, rank) in taken {
                let key = quality_key(score, rank);
                if top.could_take(key) {
                    top.take(key);
                }
            }
            if score < top.bar() {
                prop_assert!(!top.could_take(quality_key(score, rank)));
            }
        }
    }
}
