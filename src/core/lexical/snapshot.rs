//! The lexical index as bytes, so a restart loads it instead of building it.
//!
//! A restart of a large catalog spent about half its time rebuilding the
//! lexical index from the stored descriptors (two tokenisations of every
//! field of every capability). The snapshot holds what the build computes —
//! ids, filter attributes, terms, postings, length norms, exact names — and
//! a restart decodes it in bulk. What is cheap and derived (the id table,
//! the term table, idf, id ranks) is recomputed on load, not stored.
//!
//! A snapshot is only ever used for the catalog it was made from, and only
//! by code that would build the same index:
//! - it names the descriptors it was made from ([`Fingerprint`]: their count
//!   and a 128-bit hash of their stored bytes, computed by the store), and the
//!   caller compares that with what the store holds now;
//! - its bytes carry a checksum and are decoded with every bound checked: a
//!   truncated or damaged file is an error, never a panic or a wrong index;
//! - [`LexicalIndex::agrees_with`] checks it against the descriptors
//!   themselves: every id in build order, every document's filter attributes,
//!   and the terms, frequencies and length of a spread sample of documents
//!   re-tokenised now, so a snapshot written by a build with other
//!   tokenisation or field weights is refused.
//!
//! Any refusal means "build the index": a snapshot saves time, never decides
//! a ranking.
//!
//! Layout (little-endian): `MAGIC`, format `u32`, fingerprint (`u64` count,
//! two `u64` hash halves), body length `u64`, body checksum `u64`, body. The
//! body holds the sections in the order [`LexicalIndex::encode_snapshot`]
//! writes them.

use super::{contribution, length_norm, ExactMatch, LexicalIndex, FIELD_WEIGHTS};
use crate::core::descriptor::{CapabilityDescriptor, CapabilityKind};
use crate::core::id_table::IdTable;
use foldhash::{HashMap, HashMapExt};
use std::hash::{BuildHasher, Hasher};

/// The snapshot layout's version: a file of another version is not read.
/// Format 2: a posting holds the term's contribution, no longer its frequency.
pub const SNAPSHOT_FORMAT: u32 = 2;

const MAGIC: &[u8; 8] = b"capdexLX";
const HEADER_BYTES: usize = 8 + 4 + 8 + 16 + 8 + 8;
/// Documents re-tokenised by [`LexicalIndex::agrees_with`].
const SAMPLE: usize = 64;
const NO_SOURCE: u32 = u32::MAX;

/// What a snapshot was made from: the stored descriptors' count and a hash
/// of their bytes (the store computes it; equal fingerprints mean the same
/// stored descriptors).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fingerprint {
    pub count: u64,
    pub hash: [u64; 2],
}

/// Why a snapshot was not used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SnapshotError {
    #[error("not a snapshot of this kind (no magic number)")]
    NotASnapshot,
    #[error("snapshot format {found}, this build reads {expected}")]
    Format { found: u32, expected: u32 },
    #[error("snapshot truncated: {0}")]
    Truncated(&'static str),
    #[error("snapshot checksum does not match its bytes")]
    Checksum,
    #[error("snapshot malformed: {0}")]
    Malformed(&'static str),
    #[error("snapshot made from other descriptors than the store holds")]
    Stale,
    #[error("snapshot disagrees with the descriptors: {0}")]
    Disagrees(String),
}

/// The checksum of a snapshot's body (every snapshot file of capdex uses it).
pub(crate) fn checksum(body: &[u8]) -> u64 {
    foldhash::fast::FixedState::with_seed(0x6361_7064_6578_4c58).hash_one(body)
}

/// A streaming 128-bit hash for [`Fingerprint`]s (two seeded foldhash states).
pub struct FingerprintHasher {
    count: u64,
    halves: [foldhash::fast::FoldHasher<'static>; 2],
}

impl Default for FingerprintHasher {
    fn default() -> Self {
        FingerprintHasher {
            count: 0,
            halves: [
                foldhash::fast::FixedState::with_seed(0x9e37_79b9_7f4a_7c15).build_hasher(),
                foldhash::fast::FixedState::with_seed(0xc2b2_ae3d_27d4_eb4f).build_hasher(),
            ],
        }
    }
}

impl FingerprintHasher {
    /// Adds one stored entry.
    pub fn add(&mut self, key: &[u8], value: &[u8]) {
        self.count += 1;
        for half in &mut self.halves {
            half.write_usize(key.len());
            half.write(key);
            half.write_usize(value.len());
            half.write(value);
        }
    }

    pub fn finish(&self) -> Fingerprint {
        Fingerprint { count: self.count, hash: [self.halves[0].finish(), self.halves[1].finish()] }
    }
}

fn kind_code(kind: CapabilityKind) -> u8 {
    CapabilityKind::ALL.iter().position(|known| *known == kind).unwrap_or(0) as u8
}

fn exact_code(kind: ExactMatch) -> u8 {
    match kind {
        ExactMatch::DisplayName => 0,
        ExactMatch::Name => 1,
        ExactMatch::Id => 2,
    }
}

/// Appends little-endian values to a snapshot's bytes.
pub(crate) struct Writer(pub(crate) Vec<u8>);

impl Writer {
    pub(crate) fn u8(&mut self, value: u8) {
        self.0.push(value);
    }
    pub(crate) fn u32(&mut self, value: u32) {
        self.0.extend_from_slice(&value.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, value: u64) {
        self.0.extend_from_slice(&value.to_le_bytes());
    }
    pub(crate) fn f32(&mut self, value: f32) {
        self.0.extend_from_slice(&value.to_le_bytes());
    }
    pub(crate) fn str(&mut self, value: &str) {
        self.u32(value.len() as u32);
        self.0.extend_from_slice(value.as_bytes());
    }
}

/// Reads a snapshot's bytes, every bound checked.
pub(crate) struct Reader<'a> {
    pub(crate) bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads a snapshot's magic number and format, refusing another kind or format.
    pub(crate) fn magic_and_format(&mut self, magic: &[u8; 8], format: u32) -> Result<(), SnapshotError> {
        if self.take(magic.len(), "magic").map_err(|_| SnapshotError::NotASnapshot)? != magic {
            return Err(SnapshotError::NotASnapshot);
        }
        let found = self.u32("format")?;
        if found != format {
            return Err(SnapshotError::Format { found, expected: format });
        }
        Ok(())
    }
    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], SnapshotError> {
        if self.bytes.len() < n {
            return Err(SnapshotError::Truncated(what));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, SnapshotError> {
        Ok(self.take(1, what)?[0])
    }
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, SnapshotError> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().expect("four bytes")))
    }
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, SnapshotError> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().expect("eight bytes")))
    }
    pub(crate) fn f32(&mut self, what: &'static str) -> Result<f32, SnapshotError> {
        Ok(f32::from_le_bytes(self.take(4, what)?.try_into().expect("four bytes")))
    }
    pub(crate) fn str(&mut self, what: &'static str) -> Result<&'a str, SnapshotError> {
        let len = self.u32(what)? as usize;
        std::str::from_utf8(self.take(len, what)?).map_err(|_| SnapshotError::Malformed(what))
    }
    /// A count of items each at least `min_bytes` long: never more than the bytes left could hold.
    pub(crate) fn count(&mut self, min_bytes: usize, what: &'static str) -> Result<usize, SnapshotError> {
        let n = self.u32(what)? as usize;
        if n.saturating_mul(min_bytes.max(1)) > self.bytes.len() {
            return Err(SnapshotError::Truncated(what));
        }
        Ok(n)
    }
    pub(crate) fn strings(&mut self, what: &'static str) -> Result<Vec<String>, SnapshotError> {
        let n = self.count(4, what)?;
        (0..n).map(|_| self.str(what).map(str::to_string)).collect()
    }
}

impl LexicalIndex {
    /// The index as snapshot bytes, naming the descriptors it was built from.
    pub fn encode_snapshot(&self, made_from: Fingerprint) -> Vec<u8> {
        // One buffer: the header's place first, filled in once the body is written.
        let mut body = Writer(Vec::with_capacity(HEADER_BYTES + self.postings.len() * 8 + self.ids.len() * 64));
        body.0.resize(HEADER_BYTES, 0);
        body.u32(self.ids.len() as u32);
        for id in &self.ids {
            body.str(id);
        }
        for attributes in &self.attributes {
            body.u8(kind_code(attributes.kind));
            body.u8(u8::from(attributes.available));
            body.u32(attributes.category);
            body.u32(attributes.source.unwrap_or(NO_SOURCE));
        }
        for strings in [&self.categories, &self.sources] {
            body.u32(strings.len() as u32);
            for string in strings {
                body.str(string);
            }
        }
        let mut terms: Vec<(&str, u32)> = self.terms.iter().map(|(term, &id)| (term.as_str(), id)).collect();
        terms.sort_unstable_by_key(|&(_, id)| id);
        body.u32(terms.len() as u32);
        for (term, _) in terms {
            body.str(term);
        }
        for &start in &self.posting_starts {
            body.u32(start);
        }
        body.u32(self.postings.len() as u32);
        for &(doc, tf) in &self.postings {
            body.u32(doc);
            body.f32(tf);
        }
        body.f32(self.average_length);
        for &norm in &self.length_norms {
            body.f32(norm);
        }
        let mut exact: Vec<(&str, &[(u32, ExactMatch)])> =
            self.exact.iter().map(|(key, matches)| (&**key, &**matches)).collect();
        exact.sort_unstable_by_key(|&(key, _)| key);
        body.u32(exact.len() as u32);
        for (key, matches) in exact {
            body.str(key);
            body.u32(matches.len() as u32);
            for &(doc, kind) in matches {
                body.u32(doc);
                body.u8(exact_code(kind));
            }
        }
        let mut bytes = body.0;
        let body_len = (bytes.len() - HEADER_BYTES) as u64;
        let sum = checksum(&bytes[HEADER_BYTES..]);
        let mut header = Vec::with_capacity(HEADER_BYTES);
        header.extend_from_slice(MAGIC);
        header.extend_from_slice(&SNAPSHOT_FORMAT.to_le_bytes());
        header.extend_from_slice(&made_from.count.to_le_bytes());
        header.extend_from_slice(&made_from.hash[0].to_le_bytes());
        header.extend_from_slice(&made_from.hash[1].to_le_bytes());
        header.extend_from_slice(&body_len.to_le_bytes());
        header.extend_from_slice(&sum.to_le_bytes());
        bytes[..HEADER_BYTES].copy_from_slice(&header);
        bytes
    }

    /// Reads a snapshot's header: the descriptors it was made from. Cheap: a
    /// caller compares it with the store's before decoding the rest.
    pub fn snapshot_fingerprint(bytes: &[u8]) -> Result<Fingerprint, SnapshotError> {
        let mut reader = Reader { bytes };
        reader.magic_and_format(MAGIC, SNAPSHOT_FORMAT)?;
        let count = reader.u64("fingerprint")?;
        Ok(Fingerprint { count, hash: [reader.u64("fingerprint")?, reader.u64("fingerprint")?] })
    }

    /// Decodes snapshot bytes into an index (a new generation) and the
    /// fingerprint of the descriptors it was made from. Every bound is checked.
    pub fn decode_snapshot(bytes: &[u8]) -> Result<(LexicalIndex, Fingerprint), SnapshotError> {
        let made_from = LexicalIndex::snapshot_fingerprint(bytes)?;
        let mut header = Reader { bytes: &bytes[HEADER_BYTES - 16..] };
        let (body_len, sum) = (header.u64("body length")?, header.u64("checksum")?);
        let body = &bytes[HEADER_BYTES..];
        if body.len() as u64 != body_len {
            return Err(SnapshotError::Truncated("body"));
        }
        if checksum(body) != sum {
            return Err(SnapshotError::Checksum);
        }
        let mut reader = Reader { bytes: body };
        let mut index = LexicalIndex {
            generation: super::GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            ..LexicalIndex::default()
        };
        let n_docs = reader.count(4 + 10, "ids")?;
        index.ids = (0..n_docs).map(|_| reader.str("ids").map(Into::into)).collect::<Result<_, _>>()?;
        index.docs = IdTable::of_unique(&index.ids).ok_or(SnapshotError::Malformed("an id twice"))?;
        let mut attributes = Vec::with_capacity(n_docs);
        for _ in 0..n_docs {
            let kind = *CapabilityKind::ALL
                .get(reader.u8("attributes")? as usize)
                .ok_or(SnapshotError::Malformed("a capability kind"))?;
            let available = reader.u8("attributes")? != 0;
            let category = reader.u32("attributes")?;
            let source = Some(reader.u32("attributes")?).filter(|&source| source != NO_SOURCE);
            attributes.push(super::DocAttributes { kind, available, category, source });
        }
        index.categories = reader.strings("categories")?;
        index.sources = reader.strings("sources")?;
        if attributes.iter().any(|attributes| {
            attributes.category as usize >= index.categories.len()
                || attributes.source.is_some_and(|source| source as usize >= index.sources.len())
        }) {
            return Err(SnapshotError::Malformed("a category or source out of range"));
        }
        index.attributes = attributes;
        let n_terms = reader.count(4, "terms")?;
        index.terms = HashMap::with_capacity(n_terms);
        for id in 0..n_terms {
            if index.terms.insert(reader.str("terms")?.to_string(), id as u32).is_some() {
                return Err(SnapshotError::Malformed("a term twice"));
            }
        }
        index.posting_starts = (0..=n_terms).map(|_| reader.u32("posting starts")).collect::<Result<Vec<_>, _>>()?;
        let n_postings = reader.count(8, "postings")?;
        let starts_fit = index.posting_starts.first() == Some(&0)
            && index.posting_starts.windows(2).all(|pair| pair[0] <= pair[1])
            && index.posting_starts.last().copied() == Some(n_postings as u32);
        if !starts_fit {
            return Err(SnapshotError::Malformed("posting starts"));
        }
        index.postings = Vec::with_capacity(n_postings);
        for _ in 0..n_postings {
            let doc = reader.u32("postings")?;
            if doc as usize >= n_docs {
                return Err(SnapshotError::Malformed("a posting's document out of range"));
            }
            index.postings.push((doc, reader.f32("postings")?));
        }
        index.average_length = reader.f32("average length")?;
        index.length_norms = (0..n_docs).map(|_| reader.f32("length norms")).collect::<Result<_, _>>()?;
        let n_exact = reader.count(8, "exact names")?;
        index.exact = HashMap::with_capacity(n_exact);
        for _ in 0..n_exact {
            let key: Box<str> = reader.str("exact names")?.into();
            let n = reader.count(5, "exact names")?;
            let mut matches = Vec::with_capacity(n);
            for _ in 0..n {
                let doc = reader.u32("exact names")?;
                let kind = match reader.u8("exact names")? {
                    0 => ExactMatch::DisplayName,
                    1 => ExactMatch::Name,
                    2 => ExactMatch::Id,
                    _ => return Err(SnapshotError::Malformed("an exact match kind")),
                };
                if doc as usize >= n_docs {
                    return Err(SnapshotError::Malformed("an exact name's document out of range"));
                }
                matches.push((doc, kind));
            }
            index.exact.insert(key, matches.into_boxed_slice());
        }
        if !reader.bytes.is_empty() {
            return Err(SnapshotError::Malformed("bytes after the last section"));
        }
        index.texts = vec![super::DocTexts::default(); n_docs];
        index.fill_idf();
        index.rank_ids();
        Ok((index, made_from))
    }

    /// The index a snapshot holds, when it was made from the descriptors the
    /// store holds now (`expected`) and agrees with them (`descriptors`, in
    /// store order): the header is compared before anything is decoded.
    pub fn from_snapshot(
        bytes: &[u8],
        expected: Fingerprint,
        descriptors: &[&CapabilityDescriptor],
    ) -> Result<LexicalIndex, SnapshotError> {
        if LexicalIndex::snapshot_fingerprint(bytes)? != expected {
            return Err(SnapshotError::Stale);
        }
        let (index, _) = LexicalIndex::decode_snapshot(bytes)?;
        index.agrees_with(descriptors)?;
        Ok(index)
    }

    /// Checks that this index is the one [`LexicalIndex::build`] makes of
    /// `descriptors` (in that order): every id and every document's filter
    /// attributes, and, for a sample of documents spread over the catalog,
    /// every term's contribution and the document's length norm, tokenised now.
    pub fn agrees_with(&self, descriptors: &[&CapabilityDescriptor]) -> Result<(), SnapshotError> {
        let disagrees = |what: String| Err(SnapshotError::Disagrees(what));
        if descriptors.len() != self.ids.len() {
            return disagrees(format!("{} documents, {} descriptors", self.ids.len(), descriptors.len()));
        }
        for (doc, descriptor) in descriptors.iter().enumerate() {
            let attributes = self.attributes[doc];
            let source = descriptor.definition_ref.source_id();
            let same = *self.ids[doc] == *descriptor.id
                && attributes.kind == descriptor.kind
                && attributes.available == descriptor.available
                && self.categories[attributes.category as usize] == descriptor.category
                && attributes.source.map(|source| self.sources[source as usize].as_str()) == source;
            if !same {
                return disagrees(format!("document {doc} is not {}", descriptor.id));
            }
        }
        let step = descriptors.len().div_ceil(SAMPLE).max(1);
        let mut doc_terms = HashMap::new();
        for doc in (0..descriptors.len()).step_by(step) {
            let mut unknown = false;
            let length = super::doc_term_weights(descriptors[doc], FIELD_WEIGHTS, &[], &mut doc_terms, |term| {
                self.terms.get(&term).copied().unwrap_or_else(|| {
                    unknown = true;
                    u32::MAX
                })
            });
            if unknown {
                return disagrees(format!("document {doc} has a term the snapshot lacks"));
            }
            if length_norm(length, self.average_length).to_bits() != self.length_norms[doc].to_bits() {
                return disagrees(format!("document {doc}'s length"));
            }
            for (&term, &tf) in &doc_terms {
                let postings = self.term_postings(term);
                let found = postings.binary_search_by_key(&(doc as u32), |&(posting, _)| posting);
                let weight = contribution(self.idf[term as usize], tf, self.length_norms[doc]);
                if !found.is_ok_and(|at| postings[at].1.to_bits() == weight.to_bits()) {
                    return disagrees(format!("document {doc}'s contribution of a term"));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::descriptor::test_tool;
    use proptest::prelude::*;

    fn catalog(n: usize) -> Vec<CapabilityDescriptor> {
        (0..n)
            .map(|i| {
                let mut tool =
                    test_tool(&format!("tool_{i:03}"), &format!("does thing {} with widget {}", i % 7, i % 3));
                tool.category = ["files", "web", "mail"][i % 3].into();
                tool.tags = vec![format!("tag{}", i % 5)];
                tool
            })
            .collect()
    }

    fn same_scores(a: &LexicalIndex, b: &LexicalIndex, queries: &[&str]) {
        for query in queries {
            let (mut left, mut right) = (a.score(query).scores, b.score(query).scores);
            left.sort_by_key(|&(doc, _)| doc);
            right.sort_by_key(|&(doc, _)| doc);
            let bits = |scores: Vec<(u32, f32)>| scores.into_iter().map(|(d, s)| (d, s.to_bits())).collect::<Vec<_>>();
            assert_eq!(bits(left), bits(right), "{query}");
            assert_eq!(a.exact_matches(query), b.exact_matches(query), "{query}");
        }
    }

    #[test]
    fn a_decoded_snapshot_scores_as_the_build_bit_for_bit() {
        let descriptors = catalog(300);
        let built = LexicalIndex::build(&descriptors);
        let made_from = Fingerprint { count: 300, hash: [1, 2] };
        let (decoded, fingerprint) = LexicalIndex::decode_snapshot(&built.encode_snapshot(made_from)).unwrap();
        assert_eq!(fingerprint, made_from);
        assert_ne!(decoded.generation(), built.generation());
        same_scores(&built, &decoded, &["thing widget", "tool_007", "files tag3", "nothing here", "does 5"]);
        for doc in 0..built.len() as u32 {
            assert_eq!((built.id(doc), built.id_rank(doc)), (decoded.id(doc), decoded.id_rank(doc)));
            assert_eq!(built.attributes(doc), decoded.attributes(doc));
        }
        assert_eq!((built.categories(), built.sources()), (decoded.categories(), decoded.sources()));
        let all: Vec<&CapabilityDescriptor> = descriptors.iter().collect();
        assert_eq!(decoded.agrees_with(&all), Ok(()));
    }

    #[test]
    fn a_snapshot_is_used_only_for_the_fingerprint_it_names() {
        let descriptors = catalog(40);
        let all: Vec<&CapabilityDescriptor> = descriptors.iter().collect();
        let made_from = Fingerprint { count: 40, hash: [7, 8] };
        let bytes = LexicalIndex::build(&descriptors).encode_snapshot(made_from);
        assert!(LexicalIndex::from_snapshot(&bytes, made_from, &all).is_ok());
        let now = Fingerprint { count: 40, hash: [7, 9] };
        assert_eq!(LexicalIndex::from_snapshot(&bytes, now, &all).unwrap_err(), SnapshotError::Stale);
    }

    #[test]
    fn an_empty_index_round_trips() {
        let built = LexicalIndex::build(std::iter::empty());
        let (decoded, _) = LexicalIndex::decode_snapshot(&built.encode_snapshot(Fingerprint::default())).unwrap();
        assert!(decoded.is_empty());
        assert_eq!(decoded.agrees_with(&[]), Ok(()));
    }

    #[test]
    fn a_snapshot_of_other_descriptors_or_other_tokenisation_is_refused() {
        let descriptors = catalog(200);
        let built = LexicalIndex::build(&descriptors);
        let mut changed = descriptors.clone();
        changed[0].description = "a wholly different text".into();
        let changed: Vec<&CapabilityDescriptor> = changed.iter().collect();
        assert!(matches!(built.agrees_with(&changed), Err(SnapshotError::Disagrees(_))));
        let fewer: Vec<&CapabilityDescriptor> = descriptors.iter().skip(1).collect();
        assert!(matches!(built.agrees_with(&fewer), Err(SnapshotError::Disagrees(_))));
        // Other field weights: what a build by other code would have stored.
        let reweighted = LexicalIndex::build_with(&descriptors, FieldWeights { description: 0.9, ..FIELD_WEIGHTS });
        let all: Vec<&CapabilityDescriptor> = descriptors.iter().collect();
        assert!(matches!(reweighted.agrees_with(&all), Err(SnapshotError::Disagrees(_))));
    }

    #[test]
    fn damaged_bytes_are_an_error() {
        let bytes = LexicalIndex::build(&catalog(50)).encode_snapshot(Fingerprint::default());
        assert_eq!(LexicalIndex::decode_snapshot(b"nope").unwrap_err(), SnapshotError::NotASnapshot);
        let mut other_format = bytes.clone();
        other_format[8] = 9;
        assert_eq!(
            LexicalIndex::decode_snapshot(&other_format).unwrap_err(),
            SnapshotError::Format { found: 9, expected: SNAPSHOT_FORMAT }
        );
        assert_eq!(
            LexicalIndex::decode_snapshot(&bytes[..bytes.len() - 1]).unwrap_err(),
            SnapshotError::Truncated("body")
        );
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(LexicalIndex::decode_snapshot(&flipped).unwrap_err(), SnapshotError::Checksum);
    }

    use super::super::FieldWeights;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any bytes at all decode to an error or an index: never a panic. A
        /// valid header with a matching checksum makes the body reach the
        /// section checks, where most of the damage lands.
        #[test]
        fn any_body_is_an_error_or_an_index(body in proptest::collection::vec(any::<u8>(), 0..400)) {
            let mut bytes = Vec::new();
            bytes.extend_from_slice(MAGIC);
            bytes.extend_from_slice(&SNAPSHOT_FORMAT.to_le_bytes());
            bytes.extend_from_slice(&[0; 24]);
            bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
            bytes.extend_from_slice(&checksum(&body).to_le_bytes());
            bytes.extend_from_slice(&body);
            let _ = LexicalIndex::decode_snapshot(&bytes);
        }

        /// A real snapshot cut or damaged anywhere is an error or, when the
        /// damage misses what is checked, an index: never a panic.
        #[test]
        fn a_damaged_snapshot_never_panics(at in 0usize..4000, byte in any::<u8>(), cut in any::<bool>()) {
            let bytes = LexicalIndex::build(&catalog(20)).encode_snapshot(Fingerprint::default());
            let at = at % bytes.len();
            let mut damaged = bytes.clone();
            if cut { damaged.truncate(at) } else { damaged[at] = byte }
            let _ = LexicalIndex::decode_snapshot(&damaged);
        }
    }
}
