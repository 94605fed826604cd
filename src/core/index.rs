//! The vector index: ids and unit vectors, exact top-k by cosine.
//!
//! Vectors are stored column-major and quantised: one `Vec<i8>` per
//! dimension, entry `i` belonging to `ids[i]`, and one scale per row, so a
//! row's value in dimension `d` is `scale[i] · column_d[i]` (symmetric
//! quantisation, `scale = max|v| / 127`: a quarter of the bytes of `f32`,
//! and an error of at most `scale / 2` per entry). A query takes one of two
//! forms ([`IndexQuery`]), decided by the query alone:
//!
//! - **Sparse** (at most half its entries non-zero: the built-in hashing
//!   embedder's, where a short message touches a few dozen of 512 buckets): a
//!   search adds `q_d · column_d` into one sum per row for every dimension `d`
//!   where the query is not zero, in `f32`, then multiplies each sum by its
//!   row's scale: O(nnz(q)·n), reading a small share of the index where a
//!   row-major scan would read all of it.
//! - **Dense** (a model's: every entry non-zero): the query is quantised too,
//!   to 16-bit codes, and each row's score is the integer dot product of the
//!   two rows of codes times both steps, read from a row-major copy of the
//!   codes (`row_major`) that a bulk load of dense rows or the first dense
//!   query makes ([`VectorIndex::prepare`]) and every change keeps up to date
//!   from then on. Adding a whole column per dimension in `f32` takes about
//!   twice the time (a conversion and a multiply per entry); an integer sum
//!   is exact, so the AVX2 loop, the portable one and a single row read from
//!   the columns give the same float. The query's
//!   codes are capped so that no sum can leave `i32`
//!   (`127 · cap · dimensions ≤ i32::MAX`); the error is a few parts in
//!   100,000 of the cosine.
//!
//! Either way the best `k` are kept with a bounded heap: O(n·log k) more.
//!
//! Rows are the index's own numbering (a removal moves the last row into the
//! hole), so retrieval, which numbers candidates by lexical document, asks for
//! an [`Alignment`] between the two: computed once per pair of index versions
//! and cached here (the last [`ALIGNMENTS_KEPT`], for an index ranked beside
//! two lexical indexes in turn), it turns "which row is document `d`" into an
//! array read.

use crate::core::id_table::IdTable;
use crate::core::lexical::snapshot::{Reader, SnapshotError, Writer};
use crate::core::lexical::LexicalIndex;
use crate::core::top_keys::{key_rank, key_score, quality_key, TopKeys};
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::{Arc, OnceLock, RwLock};

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
#[derive(Debug, Default)]
pub struct VectorIndex {
    dimensions: usize,
    ids: Vec<Box<str>>,
    /// `columns[d][row]`: dimension `d` of the vector of `ids[row]`, quantised.
    columns: Vec<Vec<i8>>,
    /// `scales[row]`: what one step of `ids[row]`'s quantised entries is worth.
    scales: Vec<f32>,
    /// The row of each id (read through `ids`).
    rows: IdTable,
    /// The last [`ALIGNMENTS_KEPT`] [`Alignment`]s made, the latest first;
    /// cleared by every change.
    alignment: RwLock<[Option<Arc<Alignment>>; ALIGNMENTS_KEPT]>,
    /// The codes again, row-major (`row · dimensions + d`): made by a bulk load
    /// of dense rows or the first dense query ([`IndexQuery::Dense`]) and kept
    /// up to date by every change from then on, so a dense query reads each
    /// row's codes in one run.
    row_major: OnceLock<Vec<i8>>,
}

impl Clone for VectorIndex {
    fn clone(&self) -> Self {
        VectorIndex {
            dimensions: self.dimensions,
            ids: self.ids.clone(),
            columns: self.columns.clone(),
            scales: self.scales.clone(),
            rows: self.rows.clone(),
            alignment: RwLock::new(self.alignment.read().map(|kept| kept.clone()).unwrap_or_default()),
            row_major: self.row_major.clone(),
        }
    }
}

/// The correspondence between a vector index's rows and a lexical index's
/// documents (the same capability id), for one version of each.
#[derive(Debug, PartialEq)]
pub struct Alignment {
    /// [`LexicalIndex::generation`] of the documents' index.
    lexical_generation: u64,
    /// Row of each document, [`NONE`] when it has no vector (pending).
    pub row_of_doc: Vec<u32>,
    /// Document of each row, [`NONE`] when the lexical index does not hold its id.
    pub doc_of_row: Vec<u32>,
    /// Rows whose id the lexical index does not hold.
    pub unmatched_rows: usize,
    /// [`LexicalIndex::id_rank`] of each row's document ([`NONE`] for an
    /// unmatched row): comparing two rows' ranks compares their ids.
    pub rank_of_row: Vec<u32>,
    /// The row of each id rank ([`NONE`] when that document has no vector).
    pub row_of_rank: Vec<u32>,
}

/// Loads many vectors already quantised (a restart reading the store) into
/// a [`VectorIndex`]: rows gather in a small row-major tile that is appended
/// to the columns a tile at a time, so each column is written a cache line at
/// a time instead of one byte per row (the per-row scatter over every column
/// was most of a restart's time). Holds exactly what the same
/// [`VectorIndex::upsert_quantised`] calls would.
pub struct QuantisedLoader {
    index: VectorIndex,
    /// Rows not yet in the columns, row-major (`TILE_ROWS` × dimensions).
    tile: Vec<i8>,
    tile_scales: Vec<f32>,
}

/// Rows per tile: 64 rows of 512 dimensions are 32 KiB, an L1 cache.
const TILE_ROWS: usize = 64;

/// Rows [`VectorIndex::prepare`] reads to tell dense rows from sparse ones.
const DENSITY_SAMPLE: usize = 256;

impl QuantisedLoader {
    /// A loader for about `capacity` vectors of `dimensions` (0: the first
    /// vector's).
    pub fn new(dimensions: usize, capacity: usize) -> QuantisedLoader {
        QuantisedLoader {
            index: VectorIndex::with_capacity(dimensions, capacity),
            tile: Vec::with_capacity(TILE_ROWS * dimensions),
            tile_scales: Vec::with_capacity(TILE_ROWS),
        }
    }

    /// Adds (or, for an id already added, replaces) the vector of `id`.
    pub fn push(&mut self, id: &str, codes: &[i8], scale: f32) -> Result<(), IndexError> {
        let index = &mut self.index;
        let is_new = index.rows.get(&index.ids, id).is_none();
        if !is_new || (index.dimensions == 0 && index.ids.is_empty()) {
            // Rare (a repeated id) or the first vector (which fixes the
            // dimension): the plain path, after the tile so rows stay in order.
            self.flush();
            return self.index.upsert_quantised(id, codes, scale);
        }
        if codes.len() != index.dimensions || codes.is_empty() {
            return Err(IndexError::Dimension { id: id.to_string(), expected: index.dimensions, actual: codes.len() });
        }
        let scale = if scale.is_finite() && scale > 0.0 { scale } else { 0.0 };
        index.ids.push(id.into());
        index.rows.insert(&index.ids, id, index.ids.len() as u32 - 1);
        if scale == 0.0 {
            self.tile.extend(std::iter::repeat_n(0, codes.len()));
        } else {
            self.tile.extend_from_slice(codes);
        }
        self.tile_scales.push(scale);
        if self.tile_scales.len() == TILE_ROWS {
            self.flush();
        }
        Ok(())
    }

    /// The index of every vector pushed.
    pub fn finish(mut self) -> VectorIndex {
        self.flush();
        self.index.forget_alignment();
        // `flush` appends to the columns alone.
        self.index.row_major = OnceLock::new();
        self.index.prepare();
        self.index
    }

    /// Appends the tile's rows to the columns.
    fn flush(&mut self) {
        let dimensions = self.index.dimensions;
        if self.tile_scales.is_empty() || dimensions == 0 {
            return;
        }
        for (dimension, column) in self.index.columns.iter_mut().enumerate() {
            column.extend(self.tile.iter().skip(dimension).step_by(dimensions).copied());
        }
        self.index.scales.append(&mut self.tile_scales);
        self.tile.clear();
        debug_assert!(self.index.columns.iter().all(|column| column.len() == self.index.ids.len()));
    }
}

/// The most dimensions a snapshot's vector section may name (models have hundreds to a few thousand).
const MAX_SNAPSHOT_DIMENSIONS: usize = 1 << 16;

/// How many [`Alignment`]s a [`VectorIndex`] keeps (each four `u32`s a row).
pub const ALIGNMENTS_KEPT: usize = 2;

/// "No row" or "no document" in an [`Alignment`].
pub const NONE: u32 = u32::MAX;

impl VectorIndex {
    /// Returns an empty index for vectors of `dimensions`.
    pub fn new(dimensions: usize) -> VectorIndex {
        VectorIndex { dimensions, columns: vec![Vec::new(); dimensions], ..VectorIndex::default() }
    }

    /// Returns an empty index with room for `capacity` vectors, so a bulk
    /// load does not grow (and transiently double) its columns.
    pub fn with_capacity(dimensions: usize, capacity: usize) -> VectorIndex {
        VectorIndex {
            dimensions,
            ids: Vec::with_capacity(capacity),
            columns: (0..dimensions).map(|_| Vec::with_capacity(capacity)).collect(),
            scales: Vec::with_capacity(capacity),
            rows: IdTable::with_capacity(capacity),
            alignment: RwLock::new(Default::default()),
            row_major: OnceLock::new(),
        }
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
        self.rows.get(&self.ids, id).is_some()
    }

    /// Returns the id of `row`.
    pub fn id(&self, row: usize) -> &str {
        &self.ids[row]
    }

    /// Returns the [`Alignment`] of this index's rows with `lexical`'s
    /// documents, computed on the first call for this pair and cached until
    /// either changes (O(n) id lookups once, then an `Arc` clone). The last
    /// [`ALIGNMENTS_KEPT`] are kept, so one vector index ranked beside two
    /// lexical indexes in turn (the published one and the outcome memory's
    /// with its learned words) does not make its alignment again each time.
    pub fn alignment(&self, lexical: &LexicalIndex) -> Arc<Alignment> {
        let current = |cached: &&Arc<Alignment>| {
            cached.lexical_generation == lexical.generation() && cached.doc_of_row.len() == self.ids.len()
        };
        if let Ok(kept) = self.alignment.read() {
            if let Some(cached) = kept.iter().flatten().find(current) {
                return cached.clone();
            }
        }
        let mut row_of_doc = vec![NONE; lexical.len()];
        let mut unmatched_rows = 0;
        let doc_of_row: Vec<u32> = self
            .ids
            .iter()
            .enumerate()
            .map(|(row, id)| match lexical.doc(id) {
                Some(doc) => {
                    row_of_doc[doc as usize] = row as u32;
                    doc
                }
                None => {
                    unmatched_rows += 1;
                    NONE
                }
            })
            .collect();
        let rank_of_row: Vec<u32> =
            doc_of_row.iter().map(|&doc| if doc == NONE { NONE } else { lexical.id_rank(doc) }).collect();
        let mut row_of_rank = vec![NONE; lexical.len()];
        for (row, &rank) in rank_of_row.iter().enumerate() {
            if rank != NONE {
                row_of_rank[rank as usize] = row as u32;
            }
        }
        let alignment = Arc::new(Alignment {
            lexical_generation: lexical.generation(),
            row_of_doc,
            doc_of_row,
            unmatched_rows,
            rank_of_row,
            row_of_rank,
        });
        if let Ok(mut kept) = self.alignment.write() {
            kept.rotate_right(1);
            kept[0] = Some(alignment.clone());
        }
        alignment
    }

    fn forget_alignment(&mut self) {
        if let Ok(kept) = self.alignment.get_mut() {
            *kept = Default::default();
        }
    }

    /// Inserts or replaces the vector of `id`. An empty index of dimension 0
    /// (a remote model whose dimension is not known yet) takes the dimension
    /// of its first vector.
    pub fn upsert(&mut self, id: &str, vector: &[f32]) -> Result<(), IndexError> {
        let scale = quantisation_scale(vector);
        self.upsert_codes(id, vector.len(), vector.iter().map(|value| quantise(*value, scale)), scale)
    }

    /// Like [`VectorIndex::upsert`], for a vector already quantised as the
    /// index keeps it (`codes` in steps of `scale`, as [`Quantised`] holds
    /// it): what a restart reads back from the store goes in as it is, not
    /// widened to `f32` and quantised again (which would give the same codes).
    pub fn upsert_quantised(&mut self, id: &str, codes: &[i8], scale: f32) -> Result<(), IndexError> {
        let scale = if scale.is_finite() && scale > 0.0 { scale } else { 0.0 };
        self.upsert_codes(id, codes.len(), codes.iter().map(|code| if scale == 0.0 { 0 } else { *code }), scale)
    }

    fn upsert_codes(
        &mut self,
        id: &str,
        dimensions: usize,
        codes: impl Iterator<Item = i8>,
        scale: f32,
    ) -> Result<(), IndexError> {
        if self.dimensions == 0 && self.ids.is_empty() && dimensions > 0 {
            self.dimensions = dimensions;
            self.columns = vec![Vec::new(); dimensions];
            self.row_major = OnceLock::new();
        }
        if dimensions != self.dimensions || dimensions == 0 {
            return Err(IndexError::Dimension { id: id.to_string(), expected: self.dimensions, actual: dimensions });
        }
        self.forget_alignment();
        match self.rows.get(&self.ids, id) {
            Some(row) => {
                let row = row as usize;
                for (column, code) in self.columns.iter_mut().zip(codes) {
                    column[row] = code;
                }
                self.scales[row] = scale;
                if let Some(row_major) = self.row_major.get_mut() {
                    let at = row * dimensions;
                    for (entry, column) in row_major[at..at + dimensions].iter_mut().zip(&self.columns) {
                        *entry = column[row];
                    }
                }
            }
            None => {
                self.ids.push(id.into());
                self.rows.insert(&self.ids, id, self.ids.len() as u32 - 1);
                for (column, code) in self.columns.iter_mut().zip(codes) {
                    column.push(code);
                }
                self.scales.push(scale);
                if let Some(row_major) = self.row_major.get_mut() {
                    let row = self.ids.len() - 1;
                    row_major.extend(self.columns.iter().map(|column| column[row]));
                }
            }
        }
        debug_assert!(self.columns.iter().all(|column| column.len() == self.ids.len()));
        debug_assert!(self.row_major.get().is_none_or(|codes| codes.len() == self.ids.len() * self.dimensions));
        debug_assert_eq!(self.scales.len(), self.ids.len());
        Ok(())
    }

    /// The vector of `id` as the index holds it (each entry within half a
    /// step of what was inserted), if indexed.
    pub fn stored_vector(&self, id: &str) -> Option<Vec<f32>> {
        let row = self.rows.get(&self.ids, id)? as usize;
        Some(self.columns.iter().map(|column| f32::from(column[row]) * self.scales[row]).collect())
    }

    /// Gives back the room a load by single upserts left over (columns grow
    /// by doubling).
    pub fn shrink_to_fit(&mut self) {
        for column in &mut self.columns {
            column.shrink_to_fit();
        }
        if let Some(row_major) = self.row_major.get_mut() {
            row_major.shrink_to_fit();
        }
        self.scales.shrink_to_fit();
        self.ids.shrink_to_fit();
    }

    /// Appends the index to `out` as a snapshot section: dimensions, row
    /// count, ids, scales, then each column as it lies in memory (read back
    /// by [`VectorIndex::decode_section`] without a transposition).
    pub(crate) fn encode_section(&self, out: &mut Writer) {
        out.u32(self.dimensions as u32);
        out.u32(self.ids.len() as u32);
        for id in &self.ids {
            out.str(id);
        }
        for &scale in &self.scales {
            out.f32(scale);
        }
        for column in &self.columns {
            out.0.extend(column.iter().map(|&code| code.to_le_bytes()[0]));
        }
    }

    /// Reads a section [`VectorIndex::encode_section`] wrote, every bound
    /// checked: a repeated id, a scale that is not finite and non-negative, or
    /// a short column is an error, never a panic or a wrong index.
    pub(crate) fn decode_section(reader: &mut Reader<'_>) -> Result<VectorIndex, SnapshotError> {
        let dimensions = reader.u32("vector dimensions")? as usize;
        if dimensions > MAX_SNAPSHOT_DIMENSIONS {
            return Err(SnapshotError::Malformed("vector dimensions"));
        }
        let n = reader.count(4 + 4 + dimensions, "vector rows")?;
        let mut index = VectorIndex::with_capacity(dimensions, 0);
        index.ids = (0..n).map(|_| reader.str("vector ids").map(Into::into)).collect::<Result<_, _>>()?;
        index.rows = IdTable::of_unique(&index.ids).ok_or(SnapshotError::Malformed("a vector id twice"))?;
        index.scales = (0..n).map(|_| reader.f32("vector scales")).collect::<Result<_, _>>()?;
        if index.scales.iter().any(|scale| !scale.is_finite() || *scale < 0.0) {
            return Err(SnapshotError::Malformed("a vector scale"));
        }
        for column in &mut index.columns {
            *column = reader.take(n, "vector columns")?.iter().map(|&byte| i8::from_le_bytes([byte])).collect();
        }
        index.prepare();
        Ok(index)
    }

    /// Removes `id`; returns whether it was present. The last row moves into its place.
    pub fn remove(&mut self, id: &str) -> bool {
        let Some(row) = self.rows.remove(&self.ids, id) else { return false };
        let (row, last) = (row as usize, self.ids.len() - 1);
        self.forget_alignment();
        for column in &mut self.columns {
            column.swap_remove(row);
        }
        if let Some(row_major) = self.row_major.get_mut() {
            let d = self.dimensions;
            row_major.copy_within(last * d..(last + 1) * d, row * d);
            row_major.truncate(last * d);
        }
        self.scales.swap_remove(row);
        self.ids.swap_remove(row);
        if row < last {
            self.rows.moved(&self.ids[row], last as u32, row as u32);
        }
        true
    }

    /// Returns the cosine of `query` with the vector of `id`, if indexed: the
    /// float [`VectorIndex::scores`] gives its row.
    pub fn cosine(&self, id: &str, query: &[f32]) -> Option<f32> {
        let query = self.query_vector(query)?;
        let row = self.rows.get(&self.ids, id)? as usize;
        Some(self.row_score(&query, row))
    }

    /// Returns the row of `id`, if indexed (rows index [`VectorIndex::scores`]).
    pub fn row(&self, id: &str) -> Option<usize> {
        self.rows.get(&self.ids, id).map(|row| row as usize)
    }

    /// Returns the cosine of `query` with every row, in row order, or `None`
    /// when `query` is not of the index's dimension. One sequential pass per
    /// non-zero query dimension: this is what [`VectorIndex::search`] ranks,
    /// and what a caller scoring many candidates on one query should read
    /// (equal to [`VectorIndex::cosine`], without a random access
    /// per candidate and dimension).
    pub fn scores(&self, query: &[f32]) -> Option<Vec<f32>> {
        let mut scores = Vec::new();
        self.scores_into(query, &mut scores).then_some(scores)
    }

    /// [`VectorIndex::scores`] into `scores` (resized to the row count), so a
    /// caller can reuse one buffer; returns false, leaving `scores` empty, when
    /// `query` is not of the index's dimension.
    pub fn scores_into(&self, query: &[f32], scores: &mut Vec<f32>) -> bool {
        scores.clear();
        let Some(query) = self.query_vector(query) else { return false };
        scores.resize(self.ids.len(), 0.0);
        match &query {
            IndexQuery::Sparse(sparse) => add_dimensions(&self.sparse_columns(sparse), scores, &self.scales),
            IndexQuery::Dense(dense) => self.dense_block(dense, 0..self.ids.len(), scores),
        }
        true
    }

    /// The columns of the dimensions of a sparse query, with its values: what a scoring pass adds.
    fn sparse_columns(&self, sparse: &[(u32, f32)]) -> Vec<(f32, &[i8])> {
        sparse.iter().map(|&(d, value)| (value, self.columns[d as usize].as_slice())).collect()
    }

    /// Makes the row-major copy of the codes now, when the rows are dense
    /// (more than half of the entries of the first rows are not zero, as a
    /// model's are, and its queries will be too): a bulk load calls it, so
    /// the first dense query does not pay for the copy, and the copy counts
    /// with the index it belongs to.
    pub fn prepare(&self) {
        let sample = self.ids.len().min(DENSITY_SAMPLE);
        if sample == 0 {
            return;
        }
        let non_zero: usize =
            self.columns.iter().map(|column| column[..sample].iter().filter(|&&code| code != 0).count()).sum();
        if non_zero * 2 > sample * self.dimensions {
            self.row_major();
        }
    }

    /// The codes of every row, row-major, made on first use.
    fn row_major(&self) -> &[i8] {
        self.row_major.get_or_init(|| {
            let (n, d) = (self.ids.len(), self.dimensions);
            let mut codes = vec![0i8; n * d];
            // A band of rows at a time, so the columns' bytes a band reads stay in the cache.
            for start in (0..n).step_by(TILE_ROWS) {
                let rows = start..(start + TILE_ROWS).min(n);
                for (dimension, column) in self.columns.iter().enumerate() {
                    for (row, &code) in rows.clone().zip(&column[rows.clone()]) {
                        codes[row * d + dimension] = code;
                    }
                }
            }
            codes
        })
    }

    /// The scores of `rows` on a dense query into `scores` (one per row).
    fn dense_block(&self, query: &DenseQuery, rows: std::ops::Range<usize>, scores: &mut [f32]) {
        let d = self.dimensions;
        let codes = &self.row_major()[rows.start * d..rows.end * d];
        dot_rows(codes, query, &self.scales[rows], scores);
    }

    /// Returns `query` as the index scores it ([`IndexQuery`]), or `None`
    /// when it is not of the index's dimension.
    pub fn query_vector(&self, query: &[f32]) -> Option<IndexQuery> {
        if query.len() != self.dimensions || self.dimensions == 0 {
            return None;
        }
        Some(IndexQuery::of(query))
    }

    /// Returns the cosine of `query` (from [`VectorIndex::query_vector`]) with
    /// the vector of `row`: the very float [`VectorIndex::scores`] gives that
    /// row, for scoring a few candidates without a full pass. A sparse query
    /// adds the same terms in the same order; a dense one sums integers,
    /// which is exact in any order.
    pub fn row_score(&self, query: &IndexQuery, row: usize) -> f32 {
        match query {
            IndexQuery::Sparse(sparse) => {
                let mut score = 0.0f32;
                for &(d, value) in sparse {
                    score += value * f32::from(self.columns[d as usize][row]);
                }
                score * self.scales[row]
            }
            IndexQuery::Dense(dense) => {
                let sum = match self.row_major.get() {
                    Some(codes) => {
                        let d = self.dimensions;
                        dot_row(&codes[row * d..(row + 1) * d], &dense.codes)
                    }
                    None => self
                        .columns
                        .iter()
                        .zip(&dense.codes)
                        .map(|(column, &q)| i32::from(column[row]) * i32::from(q))
                        .sum(),
                };
                dense_cosine(sum, dense.scale, self.scales[row])
            }
        }
    }

    /// Returns the `k` ids closest to `query` that pass `keep`, best first.
    /// Ties are broken by id so results never depend on insertion order.
    pub fn search(&self, query: &[f32], k: usize, keep: impl Fn(&str) -> bool) -> Vec<Hit> {
        match self.scores(query) {
            Some(scores) => self.top(&scores, k, keep),
            None => Vec::new(),
        }
    }

    /// Returns the best `k` rows of `scores` (from [`VectorIndex::scores`]) that pass `keep`, best first.
    pub fn top(&self, scores: &[f32], k: usize, keep: impl Fn(&str) -> bool) -> Vec<Hit> {
        self.top_rows(scores, k, |row| keep(&self.ids[row]))
            .into_iter()
            .map(|(row, score)| Hit { id: self.ids[row].to_string(), score })
            .collect()
    }

    /// [`VectorIndex::top`] by row: the best `k` `(row, score)` whose row
    /// passes `keep`, best first, ties by id.
    pub fn top_rows(&self, scores: &[f32], k: usize, keep: impl Fn(usize) -> bool) -> Vec<(usize, f32)> {
        if k == 0 || scores.len() != self.ids.len() {
            return Vec::new();
        }
        let mut heap: BinaryHeap<Scored<'_>> = BinaryHeap::with_capacity(k + 1);
        for (row, (id, &score)) in self.ids.iter().zip(scores).enumerate() {
            // A row that cannot enter the heap is skipped before its id is
            // read: most rows lose on the score alone.
            if heap.len() == k {
                if let Some(worst) = heap.peek() {
                    match worst.score.total_cmp(&score) {
                        Ordering::Greater => continue,
                        Ordering::Equal if &**id > worst.id => continue,
                        _ => {}
                    }
                }
            }
            // The filter may cost a lookup, so it only runs for rows that would enter the heap.
            if !keep(row) {
                continue;
            }
            heap.push(Scored { score, id, row });
            if heap.len() > k {
                heap.pop();
            }
        }
        let mut hits: Vec<Scored<'_>> = heap.into_vec();
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(b.id)));
        hits.into_iter().map(|scored| (scored.row, scored.score)).collect()
    }
}

/// A query as the index scores it. A hashing embedder's query touches a few
/// dozen of its dimensions: each is added from its column, in `f32`. A
/// model's query touches all of them: it is quantised to 16-bit codes and
/// each row's score is an integer dot product with the row's codes, read in
/// one run from the row-major copy (half the time of adding column after
/// column in `f32`, and exact, so every way of summing gives the same float).
/// Which form a query takes depends on the query alone.
#[derive(Clone, Debug, PartialEq)]
pub enum IndexQuery {
    /// The non-zero dimensions with their values, in dimension order.
    Sparse(Vec<(u32, f32)>),
    Dense(DenseQuery),
}

/// A dense query's codes and the step they count in.
#[derive(Clone, Debug, PartialEq)]
pub struct DenseQuery {
    codes: Vec<i16>,
    scale: f32,
}

impl IndexQuery {
    /// `query` as the index scores it: dense when more than half of its
    /// entries are not zero.
    pub fn of(query: &[f32]) -> IndexQuery {
        let non_zero = query.iter().filter(|value| **value != 0.0).count();
        if non_zero * 2 <= query.len() {
            return IndexQuery::Sparse(
                query
                    .iter()
                    .enumerate()
                    .filter(|(_, value)| **value != 0.0)
                    .map(|(d, value)| (d as u32, *value))
                    .collect(),
            );
        }
        // The largest code keeps every dot product within `i32`: |Σ r·q| ≤ 127 · limit · dimensions.
        let limit = (i32::MAX as usize / (127 * query.len())).min(i16::MAX as usize) as f32;
        let largest =
            query.iter().filter(|value| value.is_finite()).fold(0.0f32, |largest, value| largest.max(value.abs()));
        if largest == 0.0 {
            return IndexQuery::Dense(DenseQuery { codes: vec![0; query.len()], scale: 0.0 });
        }
        let scale = largest / limit;
        let codes = query
            .iter()
            .map(|value| if value.is_finite() { (value / scale).round().clamp(-limit, limit) as i16 } else { 0 })
            .collect();
        IndexQuery::Dense(DenseQuery { codes, scale })
    }
}

/// A dense query's score for a row: the dot product of their codes in both steps.
#[inline(always)]
fn dense_cosine(sum: i32, query_scale: f32, row_scale: f32) -> f32 {
    sum as f32 * query_scale * row_scale
}

/// The dot product of one row's codes with a dense query's codes (as long).
#[inline(always)]
fn dot_row(row: &[i8], query: &[i16]) -> i32 {
    row.iter().zip(query).map(|(&r, &q)| i32::from(r) * i32::from(q)).sum()
}

/// The [`dense_cosine`] of every row of `codes` (row-major, a query's
/// length a row, with its step in `scales`) with `query`, into `scores`.
fn dot_rows(codes: &[i8], query: &DenseQuery, scales: &[f32], scores: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        unsafe { dot_rows_avx2(codes, query, scales, scores) };
        return;
    }
    let rows = codes.chunks_exact(query.codes.len()).zip(scales);
    for (score, (row, &scale)) in scores.iter_mut().zip(rows) {
        *score = dense_cosine(dot_row(row, &query.codes), query.scale, scale);
    }
}

/// [`dot_rows`] sixteen entries an instruction: each sixteen codes of a row
/// widened to 16 bits, multiplied with the query's and summed in pairs into
/// eight 32-bit sums (`vpmaddwd`); the entries left over after the last
/// sixteen as [`dot_row`] adds them. Integers: the sums are [`dot_row`]'s exactly.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dot_rows_avx2(codes: &[i8], dense: &DenseQuery, scales: &[f32], scores: &mut [f32]) {
    use std::arch::x86_64::*;
    let query = dense.codes.as_slice();
    let d = query.len();
    let whole = d - d % 16;
    for (score, (row, &scale)) in scores.iter_mut().zip(codes.chunks_exact(d).zip(scales)) {
        let mut acc = _mm256_setzero_si256();
        let mut k = 0;
        while k < whole {
            // SAFETY: k + 16 ≤ whole ≤ d, the length of `row` and of `query`;
            // both loads are unaligned.
            let (r, q) = unsafe {
                (
                    _mm256_cvtepi8_epi16(_mm_loadu_si128(row.as_ptr().add(k).cast())),
                    _mm256_loadu_si256(query.as_ptr().add(k).cast()),
                )
            };
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(r, q));
            k += 16;
        }
        let halves = _mm_add_epi32(_mm256_castsi256_si128(acc), _mm256_extracti128_si256::<1>(acc));
        let pairs = _mm_add_epi32(halves, _mm_shuffle_epi32::<0b01_00_11_10>(halves));
        let total = _mm_add_epi32(pairs, _mm_shuffle_epi32::<0b10_11_00_01>(pairs));
        let sum = _mm_cvtsi128_si32(total) + dot_row(&row[whole..], &query[whole..]);
        *score = dense_cosine(sum, dense.scale, scale);
    }
}

/// The step of a row's quantised entries: its largest magnitude maps to 127.
/// Zero for a zero (or non-finite) vector, whose entries all quantise to 0.
///
/// The step is rounded up to 16 significant bits, so that `code · step` is
/// exact in `f32` for every code (7 bits and 16 bits fit in the 24 of the
/// mantissa): a vector read back from its codes ([`Quantised::to_f32`])
/// quantises again to the very same codes and step, so a vector that goes
/// through the store and back ranks with the very floats it ranked with.
fn quantisation_scale(vector: &[f32]) -> f32 {
    let largest = vector.iter().fold(0.0f32, |largest, value| largest.max(value.abs()));
    if !(largest.is_finite() && largest > 0.0) {
        return 0.0;
    }
    let step = largest / 127.0;
    if !step.is_normal() {
        // Too small for 16 significant bits to matter (and to round up safely).
        return step;
    }
    const DROPPED: u32 = (1 << 8) - 1;
    let bits = step.to_bits();
    let kept = bits & !DROPPED;
    f32::from_bits(if kept == bits { bits } else { kept + (1 << 8) })
}

/// A vector as the index keeps it: one signed byte per dimension and the
/// step they count in. The store keeps vectors in this form too.
#[derive(Clone, Debug, PartialEq)]
pub struct Quantised {
    pub codes: Vec<i8>,
    pub scale: f32,
}

impl Quantised {
    /// Quantises `vector` as [`VectorIndex::upsert`] does.
    pub fn of(vector: &[f32]) -> Quantised {
        let scale = quantisation_scale(vector);
        Quantised { codes: vector.iter().map(|value| quantise(*value, scale)).collect(), scale }
    }

    /// The vector the codes stand for: quantising it again gives these codes and step.
    pub fn to_f32(&self) -> Vec<f32> {
        self.codes.iter().map(|code| f32::from(*code) * self.scale).collect()
    }
}

/// `value` in steps of `scale`, rounded to the nearest, halves away from
/// zero (|code| ≤ 127).
fn quantise(value: f32, scale: f32) -> i8 {
    if scale == 0.0 || !value.is_finite() {
        return 0;
    }
    let steps = value / scale;
    // `as` truncates toward zero: adding a signed half first rounds, without
    // `f32::round`'s library call (a restart quantises every stored vector).
    (steps + 0.5f32.copysign(steps)).clamp(-127.0, 127.0) as i8
}

/// The oracle [`VectorIndex::top_aligned`] is tested against.
#[cfg(test)]
impl Alignment {
    /// [`VectorIndex::top_rows`] over the matched rows, with ties broken by
    /// [`Alignment::rank_of_row`] instead of the id strings: the same rows in
    /// the same order, without a heap or a string comparison.
    pub fn top_rows(&self, scores: &[f32], k: usize, keep: impl Fn(usize) -> bool) -> Vec<(usize, f32)> {
        if k == 0 || scores.len() != self.rank_of_row.len() {
            return Vec::new();
        }
        let mut top = TopKeys::new(k);
        for (row, (&score, &rank)) in scores.iter().zip(&self.rank_of_row).enumerate() {
            // A row whose id the lexical index lacks has no rank and is never a candidate.
            if rank == NONE {
                continue;
            }
            let key = quality_key(score, rank);
            // The filter may cost a lookup, so it only runs for rows that could enter.
            if top.could_take(key) && keep(row) {
                top.take(key);
            }
        }
        top.into_best_first()
            .into_iter()
            .map(|key| {
                let row = self.row_of_rank[key_rank(key) as usize] as usize;
                (row, scores[row])
            })
            .collect()
    }
}

/// Heap entry ordered so the *worst* hit is on top (a min-heap on quality).
struct Scored<'a> {
    score: f32,
    id: &'a str,
    row: usize,
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

impl VectorIndex {
    /// The best `k` matched rows (ties by the lexical rank of their ids) of the scores [`VectorIndex::scores`] gives
    /// `query`, the same rows and floats, without the scores of all rows:
    /// each block of rows is scored and offered while it is in the cache,
    /// and a row's rank is read only when its score could enter. Each row of
    /// `watch` (ascending) gets its score on the way (the same float). `None`
    /// when `query` is not of the index's dimension.
    pub fn top_aligned(
        &self,
        query: &[f32],
        alignment: &Alignment,
        k: usize,
        keep: impl Fn(usize) -> bool,
        watch: &mut [(usize, f32)],
    ) -> Option<Vec<(usize, f32)>> {
        if query.len() != self.dimensions || self.dimensions == 0 {
            return None;
        }
        if alignment.rank_of_row.len() != self.ids.len() {
            return Some(Vec::new());
        }
        let query = self.query_vector(query)?;
        let dims = match &query {
            IndexQuery::Sparse(sparse) => self.sparse_columns(sparse),
            IndexQuery::Dense(_) => Vec::new(),
        };
        let mut top = TopKeys::new(k);
        let mut bar = top.bar();
        let mut watched = 0;
        // The thread's block of scores, kept between calls: a buffer made and
        // freed per query costs fresh pages from the system each time.
        let mut kept = BLOCK_SCORES.with(|cell| cell.take());
        kept.resize(ROWS_PER_BLOCK.min(self.ids.len()), 0.0);
        let block = &mut kept;
        for start in (0..self.ids.len()).step_by(ROWS_PER_BLOCK) {
            let rows = start..(start + ROWS_PER_BLOCK).min(self.ids.len());
            let scores = &mut block[..rows.len()];
            match &query {
                IndexQuery::Sparse(_) => {
                    scores.fill(0.0);
                    score_block(&dims, scores, &self.scales[rows.clone()], rows.clone());
                }
                IndexQuery::Dense(dense) => self.dense_block(dense, rows.clone(), scores),
            }
            while let Some((row, score)) = watch.get_mut(watched).filter(|(row, _)| *row < rows.end) {
                if *row >= rows.start {
                    *score = scores[*row - rows.start];
                }
                watched += 1;
            }
            for (row, &score) in rows.zip(scores.iter()) {
                // Most rows lose on the score alone, before their rank is read.
                if score < bar {
                    continue;
                }
                let rank = alignment.rank_of_row[row];
                // A row whose id the lexical index lacks has no rank and is never a candidate.
                if rank == NONE {
                    continue;
                }
                let key = quality_key(score, rank);
                if top.could_take(key) && keep(row) {
                    top.take(key);
                    bar = top.bar();
                }
            }
        }
        BLOCK_SCORES.with(|cell| cell.replace(kept));
        Some(
            top.into_best_first()
                .into_iter()
                .map(|key| {
                    let row = alignment.row_of_rank[key_rank(key) as usize] as usize;
                    (row, key_score(key))
                })
                .collect(),
        )
    }
}

/// Adds each query dimension's terms to every row's score, then scales each
/// row: the body of [`VectorIndex::scores_into`]. On a CPU with AVX2 the same
/// code is compiled for it (eight rows an instruction, not four), chosen at
/// run time; the operations and their order are the same (no fused
/// multiply-add), so the floats are too.
fn add_dimensions(dims: &[(f32, &[i8])], scores: &mut [f32], scales: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        unsafe { add_dimensions_avx2(dims, scores, scales) };
        return;
    }
    add_dimensions_portable(dims, scores, scales);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn add_dimensions_avx2(dims: &[(f32, &[i8])], scores: &mut [f32], scales: &[f32]) {
    add_dimensions_portable(dims, scores, scales);
}

thread_local! {
    /// Per-thread block of scores of [`VectorIndex::top_aligned`].
    static BLOCK_SCORES: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Rows a block of [`add_dimensions_portable`]: their scores (16 KiB) stay in
/// the first-level cache while every dimension is added to them.
const ROWS_PER_BLOCK: usize = 4096;

#[inline(always)]
fn add_dimensions_portable(dims: &[(f32, &[i8])], scores: &mut [f32], scales: &[f32]) {
    // A block of rows at a time, every dimension added to the block before
    // the next: each score is read from and written to memory once, and each
    // column read once, where a pass per dimension over all rows would move
    // every score through memory once per pass.
    for (block, scores) in scores.chunks_mut(ROWS_PER_BLOCK).enumerate() {
        let rows = block * ROWS_PER_BLOCK..block * ROWS_PER_BLOCK + scores.len();
        score_block_portable(dims, scores, &scales[rows.clone()], rows);
    }
}

/// The scores of `rows` (zeros on entry) into `scores`, scaled by their
/// `scales`: one block of [`add_dimensions`], with the same choice of code.
fn score_block(dims: &[(f32, &[i8])], scores: &mut [f32], scales: &[f32], rows: std::ops::Range<usize>) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        unsafe { score_block_avx2(dims, scores, scales, rows) };
        return;
    }
    score_block_portable(dims, scores, scales, rows);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn score_block_avx2(dims: &[(f32, &[i8])], scores: &mut [f32], scales: &[f32], rows: std::ops::Range<usize>) {
    score_block_portable(dims, scores, scales, rows);
}

#[inline(always)]
fn score_block_portable(dims: &[(f32, &[i8])], scores: &mut [f32], scales: &[f32], rows: std::ops::Range<usize>) {
    add_dimensions_to_block(dims, scores, rows);
    for (score, scale) in scores.iter_mut().zip(scales) {
        *score *= scale;
    }
}

/// The terms of `dims` for `rows`, into their `scores`.
#[inline(always)]
fn add_dimensions_to_block(dims: &[(f32, &[i8])], scores: &mut [f32], rows: std::ops::Range<usize>) {
    // Four dimensions a pass: each score still gets its terms added one at
    // a time in dimension order, so the floats are those of one pass per
    // dimension.
    let mut fours = dims.chunks_exact(4);
    for four in &mut fours {
        let [(a, column_a), (b, column_b), (c, column_c), (d, column_d)] = four else { continue };
        let columns = column_a[rows.clone()]
            .iter()
            .zip(&column_b[rows.clone()])
            .zip(&column_c[rows.clone()])
            .zip(&column_d[rows.clone()]);
        for (score, (((x, y), z), w)) in scores.iter_mut().zip(columns) {
            *score = *score + a * f32::from(*x) + b * f32::from(*y) + c * f32::from(*z) + d * f32::from(*w);
        }
    }
    for (value, column) in fours.remainder() {
        for (score, entry) in scores.iter_mut().zip(&column[rows.clone()]) {
            *score += value * f32::from(*entry);
        }
    }
}

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
    fn an_index_of_unknown_dimension_takes_its_first_vectors() {
        let mut index = VectorIndex::new(0);
        assert!(index.search(&[1.0, 0.0], 1, |_| true).is_empty());
        assert!(index.upsert("a", &[]).is_err());
        index.upsert("a", &[0.6, 0.8]).unwrap();
        assert_eq!(index.dimensions(), 2);
        assert!(index.upsert("b", &[1.0, 0.0, 0.0]).is_err());
        assert_eq!(index.search(&[0.6, 0.8], 1, |_| true)[0].id, "a");
    }

    #[test]
    fn remove_keeps_rows_consistent() {
        let mut index = VectorIndex::with_capacity(2, 3);
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
        // 127 steps of 1/127, the step rounded up to 16 significant bits.
        let one = index.cosine("c", &[1.0, 0.0]).unwrap();
        assert!((1.0..1.0 + 1e-4).contains(&one), "{one}");
        assert_eq!(Some(one), index.stored_vector("c").map(|vector| vector[0]));
        assert_eq!(index.cosine("b", &[1.0, 0.0]), Some(0.0));
        assert_eq!(index.cosine("a", &[1.0, 0.0]), None);
        assert_eq!(index.cosine("c", &[1.0]), None);
    }

    #[test]
    fn an_index_ranked_beside_two_lexical_indexes_in_turn_keeps_both_alignments() {
        let mut index = VectorIndex::new(2);
        index.upsert("a", &[1.0, 0.0]).unwrap();
        index.upsert("b", &[0.0, 1.0]).unwrap();
        let descriptors = [descriptor("b"), descriptor("a")];
        let (published, learned, newer) =
            (LexicalIndex::build(&descriptors), LexicalIndex::build(&descriptors), LexicalIndex::build(&descriptors));
        let first = index.alignment(&published);
        let beside_learned = index.alignment(&learned);
        assert_eq!((first.doc_of_row.as_slice(), beside_learned.doc_of_row.as_slice()), (&[1, 0][..], &[1, 0][..]));
        for _ in 0..3 {
            assert!(Arc::ptr_eq(&index.alignment(&published), &first), "made once");
            assert!(Arc::ptr_eq(&index.alignment(&learned), &beside_learned), "made once");
        }
        // A third lexical index takes the place of the one made first; a change forgets them all.
        index.alignment(&newer);
        assert!(!Arc::ptr_eq(&index.alignment(&published), &first));
        assert!(Arc::ptr_eq(&index.clone().alignment(&newer), &index.alignment(&newer)), "a copy shares them");
        let kept = index.alignment(&learned);
        index.upsert("c", &[1.0, 1.0]).unwrap();
        let again = index.alignment(&learned);
        assert!(!Arc::ptr_eq(&again, &kept) && again.unmatched_rows == 1);
    }

    /// Many rows, many ties, a filter: the blockwise top is the top of all the scores.
    #[test]
    fn the_blockwise_top_is_the_top_of_all_scores() {
        let n = 9_007;
        let mut index = VectorIndex::with_capacity(3, n);
        let mut descriptors = Vec::with_capacity(n);
        for i in 0..n {
            let vector = [((i * 7) % 5) as f32 - 2.0, ((i * 3) % 4) as f32, 1.0];
            index.upsert(&format!("id{i:05}"), &vector).unwrap();
            descriptors.push(descriptor(&format!("id{i:05}")));
        }
        // Documents numbered in another order than rows.
        descriptors.reverse();
        let lexical = LexicalIndex::build(&descriptors);
        let alignment = index.alignment(&lexical);
        for query in [[0.5, 0.25, 0.0], [-1.0, 0.0, 0.3], [0.0, 0.0, 0.0]] {
            let scores = index.scores(&query).unwrap();
            for k in [0, 1, 5, 40, 200] {
                for modulus in [1, 3] {
                    let keep = |row: usize| row.is_multiple_of(modulus);
                    let expected = alignment.top_rows(&scores, k, keep);
                    let mut watch: Vec<(usize, f32)> = (0..n).step_by(97).map(|row| (row, f32::NAN)).collect();
                    assert_eq!(index.top_aligned(&query, &alignment, k, keep, &mut watch).unwrap(), expected, "k {k}");
                    assert!(watch.iter().all(|&(row, score)| score.to_bits() == scores[row].to_bits()));
                }
            }
        }
        assert_eq!(index.top_aligned(&[1.0], &alignment, 5, |_| true, &mut []), None);
    }

    /// Many rows (whichever code the CPU runs): every score is the float one
    /// addition per dimension gives (sparse) or one integer dot product gives
    /// (dense), read from the columns or from the row-major copy.
    #[test]
    fn scores_of_many_rows_are_the_per_row_sums_bit_for_bit() {
        let n = 9_007;
        // 37 dimensions: two runs of sixteen and five left over for a dense query.
        let mut index = VectorIndex::with_capacity(37, n);
        for i in 0..n {
            let vector: Vec<f32> = (0..37).map(|d| (((i * 31 + d * 17) % 23) as f32 - 11.0) / 11.0).collect();
            index.upsert(&format!("id{i}"), &vector).unwrap();
        }
        let dense: Vec<f32> = (0..37).map(|d| ((d * 7 % 13) as f32 - 6.0) / 6.5).collect();
        let sparse: Vec<f32> = (0..37).map(|d| if d % 3 == 0 { dense[d] } else { 0.0 }).collect();
        for query in [sparse, dense] {
            let form = index.query_vector(&query).unwrap();
            // Before any dense pass (the columns), then after (the row-major copy).
            let from_columns: Vec<f32> = (0..n).map(|row| index.row_score(&form, row)).collect();
            let scores = index.scores(&query).unwrap();
            assert_eq!(scores.len(), n);
            for (row, score) in scores.iter().enumerate() {
                assert_eq!(score.to_bits(), index.row_score(&form, row).to_bits(), "row {row}");
                assert_eq!(score.to_bits(), from_columns[row].to_bits(), "row {row}");
                assert_eq!(Some(*score), index.cosine(index.id(row), &query));
            }
        }
    }

    /// A bulk load makes the row-major copy for dense rows only; a sparse
    /// index makes it when a dense query first asks.
    #[test]
    fn the_row_major_copy_is_made_for_dense_rows() {
        let load = |rows: &[Vec<f32>]| {
            let mut loader = QuantisedLoader::new(4, rows.len());
            for (i, row) in rows.iter().enumerate() {
                let quantised = Quantised::of(row);
                loader.push(&format!("id{i}"), &quantised.codes, quantised.scale).unwrap();
            }
            loader.finish()
        };
        let dense = load(&[vec![0.5, -0.5, 0.5, 0.5], vec![0.1, 0.2, 0.3, 0.9]]);
        assert_eq!(dense.row_major.get().map(Vec::len), Some(8));
        let sparse = load(&[vec![1.0, 0.0, 0.0, 0.0], vec![0.0, 0.6, 0.0, 0.8]]);
        assert!(sparse.row_major.get().is_none());
        let sparse_scores = sparse.scores(&[1.0, 0.0, 0.0, 0.0]).unwrap();
        assert!(sparse.row_major.get().is_none());
        let dense_scores = sparse.scores(&[0.5, 0.5, 0.5, 0.5]).unwrap();
        assert_eq!(sparse.row_major.get().map(Vec::len), Some(8));
        assert!(
            (sparse_scores[0] - 1.0).abs() < 0.01 && (dense_scores[1] - 0.7).abs() < 0.01,
            "{sparse_scores:?} {dense_scores:?}"
        );
        let mut empty = VectorIndex::new(4);
        empty.prepare();
        assert!(empty.row_major.get().is_none());
        empty.upsert("a", &[0.5, 0.5, 0.5, 0.5]).unwrap();
        assert_eq!(empty.scores(&[0.5, 0.5, 0.5, 0.5]).map(|scores| scores.len()), Some(1));
    }

    /// A dense query is quantised finely enough that its scores are the
    /// `f32` ones within a small error, and it keeps every sum within `i32`
    /// at the extreme (every entry at its largest, all of one sign).
    #[test]
    fn dense_scores_are_the_exact_ones_within_a_small_error_and_never_overflow() {
        let dimensions = 768;
        let flat = vec![1.0 / (dimensions as f32).sqrt(); dimensions];
        let mut index = VectorIndex::new(dimensions);
        index.upsert("flat", &flat).unwrap();
        let varied: Vec<f32> = (0..dimensions).map(|d| ((d * 37 % 101) as f32 - 50.0) / 50.0).collect();
        index.upsert("varied", &varied).unwrap();
        for query in [flat.clone(), varied.clone()] {
            assert!(matches!(index.query_vector(&query), Some(IndexQuery::Dense(_))));
            let scores = index.scores(&query).unwrap();
            for (row, vector) in [&flat, &varied].iter().enumerate() {
                let stored = index.stored_vector(index.id(row)).unwrap();
                let exact: f32 = stored.iter().zip(&query).map(|(a, b)| a * b).sum();
                let norm =
                    vector.iter().map(|v| v * v).sum::<f32>().sqrt() * query.iter().map(|v| v * v).sum::<f32>().sqrt();
                assert!((scores[row] - exact).abs() <= 1e-4 * norm.max(1.0), "{} against {exact}", scores[row]);
            }
        }
    }

    proptest! {
        /// Many dimensions, some zero in the query: the passes of four give
        /// each row the very float one addition per dimension gives.
        #[test]
        fn scores_are_the_per_row_sums_bit_for_bit(
            rows in proptest::collection::vec(proptest::collection::vec(-1.0f32..1.0, 11), 1..30),
            query in proptest::collection::vec(prop_oneof![Just(0.0f32), -1.0f32..1.0], 11),
        ) {
            let mut index = VectorIndex::new(11);
            for (i, row) in rows.iter().enumerate() {
                index.upsert(&format!("id{i:02}"), row).unwrap();
            }
            let scores = index.scores(&query).unwrap();
            let form = index.query_vector(&query).unwrap();
            for (i, vector) in rows.iter().enumerate() {
                let row = index.row(&format!("id{i:02}")).unwrap();
                let scale = quantisation_scale(vector);
                let one_at_a_time = match &form {
                    IndexQuery::Sparse(sparse) => {
                        let mut sum = 0.0f32;
                        for &(d, value) in sparse {
                            sum += value * f32::from(quantise(vector[d as usize], scale));
                        }
                        sum * scale
                    }
                    IndexQuery::Dense(dense) => {
                        let mut sum = 0i32;
                        for (value, &code) in vector.iter().zip(&dense.codes) {
                            sum += i32::from(quantise(*value, scale)) * i32::from(code);
                        }
                        dense_cosine(sum, dense.scale, scale)
                    }
                };
                prop_assert_eq!(scores[row].to_bits(), one_at_a_time.to_bits());
                prop_assert_eq!(scores[row].to_bits(), index.row_score(&form, row).to_bits());
            }
        }

        /// The row-major copy a dense query made follows every later change:
        /// after upserts, replacements and removals, a dense query scores as it
        /// does on an index built afresh from the same vectors.
        #[test]
        fn the_row_major_copy_follows_every_change(
            first in proptest::collection::vec((0usize..20, proptest::collection::vec(-1.0f32..1.0, 5)), 1..30),
            changes in proptest::collection::vec(
                (0usize..20, proptest::option::of(proptest::collection::vec(-1.0f32..1.0, 5))), 0..30),
            query in proptest::collection::vec(0.1f32..1.0, 5),
        ) {
            let mut index = VectorIndex::new(5);
            let mut model = std::collections::BTreeMap::new();
            for (id, vector) in &first {
                index.upsert(&format!("id{id:02}"), vector).unwrap();
                model.insert(format!("id{id:02}"), vector.clone());
            }
            prop_assert!(matches!(index.query_vector(&query), Some(IndexQuery::Dense(_))));
            index.scores(&query).unwrap();
            for (id, change) in &changes {
                let id = format!("id{id:02}");
                match change {
                    Some(vector) => {
                        index.upsert(&id, vector).unwrap();
                        model.insert(id, vector.clone());
                    }
                    None => {
                        index.remove(&id);
                        model.remove(&id);
                    }
                }
            }
            let mut fresh = VectorIndex::new(5);
            for (id, vector) in &model {
                fresh.upsert(id, vector).unwrap();
            }
            let scores = index.scores(&query).unwrap();
            let form = index.query_vector(&query).unwrap();
            prop_assert_eq!(scores.len(), model.len());
            for (id, vector) in &model {
                let row = index.row(id).unwrap();
                prop_assert_eq!(Some(scores[row]), fresh.cosine(id, &query));
                prop_assert_eq!(index.stored_vector(id), fresh.stored_vector(id));
                let scale = quantisation_scale(vector);
                let IndexQuery::Dense(dense) = &form else { unreachable!() };
                let sum: i32 = vector.iter().zip(&dense.codes).map(|(v, &q)| i32::from(quantise(*v, scale)) * i32::from(q)).sum();
                prop_assert_eq!(scores[row].to_bits(), dense_cosine(sum, dense.scale, scale).to_bits());
            }
        }

        /// A vector read back from its codes quantises to the same codes and
        /// step, so the store's copy ranks exactly as the inserted vector did.
        #[test]
        fn quantising_what_was_read_back_changes_nothing(
            vector in proptest::collection::vec(prop_oneof![Just(0.0f32), -1.0f32..1.0, -1e-30f32..1e-30, -1e30f32..1e30], 1..64),
        ) {
            let once = Quantised::of(&vector);
            let twice = Quantised::of(&once.to_f32());
            prop_assert_eq!(&twice, &once);
            prop_assert!(once.codes.iter().all(|code| *code != i8::MIN));
            if once.scale > 0.0 {
                prop_assert!(once.codes.iter().any(|code| code.unsigned_abs() == 127), "{:?}", once);
            }
        }

        /// The loader holds exactly what one `upsert_quantised` per row
        /// holds, repeated ids, a wrong dimension and tiles' ends included.
        #[test]
        fn the_loader_holds_what_single_upserts_hold(
            rows in proptest::collection::vec((0usize..150, proptest::collection::vec(-1.0f32..1.0, 3)), 0..200),
            short in 0usize..200,
        ) {
            let (mut one_at_a_time, mut loader) = (VectorIndex::new(0), QuantisedLoader::new(0, 10));
            for (at, (id, vector)) in rows.iter().enumerate() {
                let quantised = Quantised::of(if at == short { &vector[..2] } else { vector });
                let id = format!("c{id}");
                let single = one_at_a_time.upsert_quantised(&id, &quantised.codes, quantised.scale);
                prop_assert_eq!(single.is_ok(), loader.push(&id, &quantised.codes, quantised.scale).is_ok());
            }
            let loaded = loader.finish();
            prop_assert_eq!(loaded.len(), one_at_a_time.len());
            for row in 0..loaded.len() {
                prop_assert_eq!(loaded.id(row), one_at_a_time.id(row));
                prop_assert_eq!(loaded.stored_vector(loaded.id(row)), one_at_a_time.stored_vector(loaded.id(row)));
            }
        }

        /// A vector given as its codes (a restart reading the store) is held
        /// exactly as the same vector given in `f32`: same scores, bit for bit.
        #[test]
        fn codes_go_in_as_the_vector_they_stand_for(
            vector in proptest::collection::vec(prop_oneof![Just(0.0f32), -1.0f32..1.0, -1e30f32..1e30], 4..5),
            query in proptest::collection::vec(-1.0f32..1.0, 4..5),
        ) {
            let quantised = Quantised::of(&vector);
            let (mut widened, mut direct) = (VectorIndex::new(4), VectorIndex::with_capacity(4, 1));
            widened.upsert("a", &quantised.to_f32()).unwrap();
            direct.upsert_quantised("a", &quantised.codes, quantised.scale).unwrap();
            prop_assert_eq!(widened.stored_vector("a"), direct.stored_vector("a"));
            prop_assert_eq!(widened.cosine("a", &query).map(f32::to_bits), direct.cosine("a", &query).map(f32::to_bits));
            prop_assert!(direct.upsert_quantised("b", &quantised.codes[1..], quantised.scale).is_err());
        }

        /// Quantisation keeps each entry within half a step (`max|v| / 254`)
        /// of the inserted value, and a zero vector stays zero.
        #[test]
        fn stored_entries_are_within_half_a_step(
            vector in proptest::collection::vec(prop_oneof![Just(0.0f32), -1.0f32..1.0], 1..64),
        ) {
            let mut index = VectorIndex::new(vector.len());
            index.upsert("a", &vector).unwrap();
            let step = quantisation_scale(&vector);
            let stored = index.stored_vector("a").unwrap();
            for (stored, inserted) in stored.iter().zip(&vector) {
                prop_assert!((stored - inserted).abs() <= step / 2.0 + 1e-7, "{} {} {}", stored, inserted, step);
                if *inserted == 0.0 {
                    prop_assert_eq!(*stored, 0.0);
                }
            }
        }

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
            if let Some(scores) = index.scores(&query) {
                for i in 0..rows.len() {
                    let id = format!("id{i:02}");
                    prop_assert_eq!(scores[index.row(&id).unwrap()], index.cosine(&id, &query).unwrap());
                }
            }
            let mut all: Vec<Hit> = rows.iter().enumerate()
                .map(|(i, _)| Hit { id: format!("id{i:02}"), score: index.cosine(&format!("id{i:02}"), &query).unwrap() }).collect();
            for (i, row) in rows.iter().enumerate() {
                let plain: f32 = query.iter().zip(row).map(|(a, b)| a * b).sum();
                let id = format!("id{i:02}");
                let stored = index.cosine(&id, &query).unwrap();
                // Each entry is within half a step of the inserted one.
                let bound = query.iter().map(|a| a.abs()).sum::<f32>() * quantisation_scale(row) / 2.0 + 1e-5;
                prop_assert!((stored - plain).abs() <= bound, "{} {} {} {}", id, stored, plain, bound);
            }
            all.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(&b.id)));
            let mut even: Vec<Hit> = all.iter().filter(|hit| hit.id.ends_with(['0', '2', '4', '6', '8'])).cloned().collect();
            all.truncate(k);
            prop_assert_eq!(hits, all);
            even.truncate(k);
            prop_assert_eq!(index.search(&query, k, |id| id.ends_with(['0', '2', '4', '6', '8'])), even);
        }

        /// The alignment's rank-keyed top equals the id-keyed one, ties (many
        /// equal scores, both zeros, negatives) and filters included, whatever
        /// order ids were inserted and documents numbered in.
        #[test]
        fn ranked_top_rows_match_the_id_keyed_ones(
            rows in proptest::collection::vec((0u32..1000, -2i8..3), 0..60),
            k in 0usize..12,
            modulus in 1usize..4,
        ) {
            let mut index = VectorIndex::new(1);
            for &(name, value) in &rows {
                index.upsert(&format!("id{name}"), &[f32::from(value) * 0.5]).unwrap();
            }
            // Documents numbered in another order than rows.
            let mut descriptors: Vec<_> = rows.iter().map(|&(name, _)| descriptor(&format!("id{name}"))).collect();
            descriptors.reverse();
            let lexical = LexicalIndex::build(&descriptors);
            let alignment = index.alignment(&lexical);
            prop_assert_eq!(alignment.unmatched_rows, 0);
            let mut scores = index.scores(&[1.0]).unwrap_or_default();
            // Both zeros tie-break the same way on both sides.
            for score in scores.iter_mut().step_by(3) {
                if *score == 0.0 {
                    *score = -0.0;
                }
            }
            let keep = |row: usize| row.is_multiple_of(modulus);
            prop_assert_eq!(alignment.top_rows(&scores, k, keep), index.top_rows(&scores, k, keep));
            if !rows.is_empty() {
                let unsigned = index.scores(&[1.0]).unwrap();
                let top = index.top_aligned(&[1.0], &alignment, k, keep, &mut []).unwrap();
                prop_assert_eq!(top, alignment.top_rows(&unsigned, k, keep));
            }
        }
    }

    /// A capability that differs from a built-in only by its id.
    fn descriptor(id: &str) -> crate::core::descriptor::CapabilityDescriptor {
        let builtin = crate::core::dispatch_rules::Builtin::ALL[0].descriptor();
        crate::core::descriptor::CapabilityDescriptor { id: id.to_string(), ..builtin }
    }
}
