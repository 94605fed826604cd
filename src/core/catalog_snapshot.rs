//! The catalog as one file, so a restart reads it in bulk instead of walking
//! sled's descriptor and embedding trees.
//!
//! A restart of a large catalog spent most of its time reading those trees
//! entry by entry (sled pages in, copied out, decoded, and the memory they
//! went through faulted in and given back many times over). The snapshot holds
//! what the load builds from them — every descriptor with its origin, and the
//! vector index's columns as they lie in memory — and is read with one file read.
//!
//! It is a cache, used only for the store state it was made from:
//! - it names a [`CatalogEpoch`]: the store changes its epoch before any
//!   write to the catalog trees after an epoch was handed out, and makes an
//!   epoch durable before a snapshot naming it is written, so an equal epoch
//!   at start means the trees hold exactly what the snapshot was made from
//!   (the store module explains why);
//! - it names the embedding model its vectors were made by, and the
//!   [`Fingerprint`] of its descriptors' stored bytes (what the lexical
//!   snapshot is checked against);
//! - its body carries a checksum and is decoded with every bound checked.
//!
//! Any refusal means "read the trees": a snapshot saves time, never decides
//! what the catalog holds.
//!
//! Layout (little-endian): `MAGIC`, format `u32`, epoch (two `u64`),
//! fingerprint (`u64` count, two `u64` hash halves), model id (`u32` length,
//! bytes), body length `u64`, body checksum `u64`, body. The body: the
//! descriptors section's length `u64`, then that section (count `u32`, then
//! per descriptor its origin and its MessagePack bytes, named fields as the
//! store writes them), then the vector section (`VectorIndex`'s own).

use crate::core::descriptor::CapabilityDescriptor;
use crate::core::index::VectorIndex;
use crate::core::lexical::snapshot::{checksum, Fingerprint, Reader, SnapshotError, Writer};

/// The layout's version: a file of another version is not read.
pub const CATALOG_SNAPSHOT_FORMAT: u32 = 1;

const MAGIC: &[u8; 8] = b"capdexCT";

/// A state of the store's catalog trees: the store's own random id and a
/// counter it moves forward before the first write after the epoch was handed out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CatalogEpoch {
    pub store: u64,
    pub counter: u64,
}

impl CatalogEpoch {
    pub fn to_bytes(self) -> [u8; 16] {
        let mut bytes = [0; 16];
        bytes[..8].copy_from_slice(&self.store.to_be_bytes());
        bytes[8..].copy_from_slice(&self.counter.to_be_bytes());
        bytes
    }

    pub fn from_bytes(bytes: &[u8]) -> Option<CatalogEpoch> {
        let bytes: &[u8; 16] = bytes.try_into().ok()?;
        Some(CatalogEpoch {
            store: u64::from_be_bytes(bytes[..8].try_into().ok()?),
            counter: u64::from_be_bytes(bytes[8..].try_into().ok()?),
        })
    }
}

/// What a snapshot names: read before anything else is decoded.
#[derive(Clone, Debug, PartialEq)]
pub struct CatalogSnapshotHeader {
    pub epoch: CatalogEpoch,
    /// The fingerprint of the descriptors' stored bytes.
    pub made_from: Fingerprint,
    /// The embedding model of the vectors.
    pub model_id: String,
}

/// A snapshot whose checksum held, split into its two sections so a caller
/// can decode them on two threads.
pub struct CatalogSnapshotParts<'a> {
    pub header: CatalogSnapshotHeader,
    descriptors: &'a [u8],
    vectors: &'a [u8],
}

/// The catalog's descriptors with their origins, and its vector index, as bytes.
pub fn encode<'a>(
    header: &CatalogSnapshotHeader,
    descriptors: impl ExactSizeIterator<Item = (&'a str, &'a CapabilityDescriptor)>,
    vectors: &VectorIndex,
) -> Result<Vec<u8>, rmp_serde::encode::Error> {
    let mut body = Writer(Vec::with_capacity(descriptors.len() * 512 + vectors.len() * (vectors.dimensions() + 48)));
    body.0.extend_from_slice(&[0; 8]);
    body.u32(descriptors.len() as u32);
    let mut entry = Vec::new();
    for (origin, descriptor) in descriptors {
        body.str(origin);
        entry.clear();
        rmp_serde::encode::write_named(&mut entry, descriptor)?;
        body.u32(entry.len() as u32);
        body.0.extend_from_slice(&entry);
    }
    let section = (body.0.len() - 8) as u64;
    body.0[..8].copy_from_slice(&section.to_le_bytes());
    vectors.encode_section(&mut body);

    let mut bytes = Writer(Vec::with_capacity(body.0.len() + 96 + header.model_id.len()));
    bytes.0.extend_from_slice(MAGIC);
    bytes.u32(CATALOG_SNAPSHOT_FORMAT);
    for value in [
        header.epoch.store,
        header.epoch.counter,
        header.made_from.count,
        header.made_from.hash[0],
        header.made_from.hash[1],
    ] {
        bytes.u64(value);
    }
    bytes.str(&header.model_id);
    bytes.u64(body.0.len() as u64);
    bytes.u64(checksum(&body.0));
    bytes.0.extend_from_slice(&body.0);
    Ok(bytes.0)
}

/// Reads the header, and the rest only as far as its length: cheap, so a
/// caller compares epoch and model before paying for the checksum.
fn read_header<'a>(bytes: &'a [u8]) -> Result<(CatalogSnapshotHeader, Reader<'a>), SnapshotError> {
    let mut reader = Reader { bytes };
    reader.magic_and_format(MAGIC, CATALOG_SNAPSHOT_FORMAT)?;
    let epoch = CatalogEpoch { store: reader.u64("epoch")?, counter: reader.u64("epoch")? };
    let count = reader.u64("fingerprint")?;
    let made_from = Fingerprint { count, hash: [reader.u64("fingerprint")?, reader.u64("fingerprint")?] };
    let model_id = reader.str("model id")?.to_string();
    Ok((CatalogSnapshotHeader { epoch, made_from, model_id }, reader))
}

/// The header alone.
pub fn header(bytes: &[u8]) -> Result<CatalogSnapshotHeader, SnapshotError> {
    read_header(bytes).map(|(header, _)| header)
}

/// Checks the body's length and checksum and finds its two sections.
pub fn split(bytes: &[u8]) -> Result<CatalogSnapshotParts<'_>, SnapshotError> {
    let (header, mut reader) = read_header(bytes)?;
    let (body_len, sum) = (reader.u64("body length")?, reader.u64("checksum")?);
    if reader.bytes.len() as u64 != body_len {
        return Err(SnapshotError::Truncated("body"));
    }
    if checksum(reader.bytes) != sum {
        return Err(SnapshotError::Checksum);
    }
    let section = reader.u64("descriptors length")?;
    let section = usize::try_from(section).map_err(|_| SnapshotError::Truncated("descriptors"))?;
    let descriptors = reader.take(section, "descriptors")?;
    Ok(CatalogSnapshotParts { header, descriptors, vectors: reader.bytes })
}

impl CatalogSnapshotParts<'_> {
    /// The descriptors with their origins, in the order they were written.
    pub fn descriptors(&self) -> Result<Vec<(String, CapabilityDescriptor)>, SnapshotError> {
        let mut reader = Reader { bytes: self.descriptors };
        let n = reader.count(4 + 4 + 1, "descriptors")?;
        let mut held = Vec::with_capacity(n);
        for _ in 0..n {
            let origin = reader.str("an origin")?.to_string();
            let len = reader.u32("a descriptor")? as usize;
            let descriptor: CapabilityDescriptor = rmp_serde::from_slice(reader.take(len, "a descriptor")?)
                .map_err(|_| SnapshotError::Malformed("a descriptor"))?;
            held.push((origin, descriptor));
        }
        if !reader.bytes.is_empty() {
            return Err(SnapshotError::Malformed("bytes after the descriptors"));
        }
        Ok(held)
    }

    /// The vector index.
    pub fn vectors(&self) -> Result<VectorIndex, SnapshotError> {
        let mut reader = Reader { bytes: self.vectors };
        let index = VectorIndex::decode_section(&mut reader)?;
        if !reader.bytes.is_empty() {
            return Err(SnapshotError::Malformed("bytes after the vectors"));
        }
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::descriptor::test_tool;
    use proptest::prelude::*;

    fn catalog(n: usize) -> (Vec<(String, CapabilityDescriptor)>, VectorIndex) {
        let mut index = VectorIndex::new(4);
        let held: Vec<(String, CapabilityDescriptor)> = (0..n)
            .map(|i| {
                let mut tool = test_tool(&format!("t{i}"), &format!("does thing {i}"));
                tool.tags = vec![format!("tag{i}")];
                if i % 2 == 0 {
                    tool.full_schema = Some(serde_json::json!({"type": "object"}).into());
                }
                (format!("origin{}", i % 3), tool)
            })
            .collect();
        for (i, (_, tool)) in held.iter().enumerate() {
            // One in three without a vector (pending), like a store can hold.
            if i % 3 != 1 {
                index.upsert(&tool.id, &[i as f32, 1.0, -0.5, 0.25]).unwrap();
            }
        }
        (held, index)
    }

    fn header_of(held: &[(String, CapabilityDescriptor)]) -> CatalogSnapshotHeader {
        CatalogSnapshotHeader {
            epoch: CatalogEpoch { store: 7, counter: 42 },
            made_from: Fingerprint { count: held.len() as u64, hash: [1, 2] },
            model_id: "builtin-hash-512".into(),
        }
    }

    fn encoded(n: usize) -> Vec<u8> {
        let (held, index) = catalog(n);
        encode(&header_of(&held), held.iter().map(|(origin, tool)| (origin.as_str(), tool)), &index).unwrap()
    }

    #[test]
    fn a_catalog_comes_back_as_it_was_encoded() {
        let (held, index) = catalog(50);
        let bytes = encode(&header_of(&held), held.iter().map(|(o, t)| (o.as_str(), t)), &index).unwrap();
        assert_eq!(header(&bytes).unwrap(), header_of(&held));
        let parts = split(&bytes).unwrap();
        assert_eq!(parts.header, header_of(&held));
        assert_eq!(parts.descriptors().unwrap(), held);
        let vectors = parts.vectors().unwrap();
        assert_eq!(vectors.len(), index.len());
        for row in 0..index.len() {
            let id = index.id(row);
            assert_eq!(vectors.id(row), id);
            assert_eq!(vectors.stored_vector(id), index.stored_vector(id));
        }
        let query = [0.3, 0.9, 0.1, -0.2];
        assert_eq!(vectors.search(&query, 10, |_| true), index.search(&query, 10, |_| true));
    }

    #[test]
    fn an_empty_catalog_round_trips() {
        let bytes = encode(&header_of(&[]), std::iter::empty(), &VectorIndex::new(0)).unwrap();
        let parts = split(&bytes).unwrap();
        assert!(parts.descriptors().unwrap().is_empty());
        assert!(parts.vectors().unwrap().is_empty());
    }

    #[test]
    fn a_file_of_another_kind_or_format_is_refused() {
        assert_eq!(split(b"capdexLX\x01\0\0\0").err(), Some(SnapshotError::NotASnapshot));
        let mut other = encoded(3);
        other[8] = 9;
        assert_eq!(split(&other).err(), Some(SnapshotError::Format { found: 9, expected: CATALOG_SNAPSHOT_FORMAT }));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Any damaged byte or cut gives an error or a catalog, never a panic.
        #[test]
        fn damaged_or_cut_bytes_never_panic(at in any::<prop::sample::Index>(), flip in 1u8.., cut in any::<bool>()) {
            let mut bytes = encoded(12);
            let at = at.index(bytes.len());
            if cut {
                bytes.truncate(at);
            } else {
                bytes[at] ^= flip;
            }
            if let Ok(parts) = split(&bytes) {
                let _ = parts.descriptors();
                let _ = parts.vectors();
            }
        }

        /// Any body under a checksum that holds: an error or a catalog, never
        /// a panic or a huge allocation (the bounds, not the checksum, hold).
        #[test]
        fn any_body_with_a_good_checksum_is_an_error_or_a_catalog(
            descriptors in prop::collection::vec(any::<u8>(), 0..64),
            vectors in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let mut body = Writer(Vec::new());
            body.u64(descriptors.len() as u64);
            body.0.extend_from_slice(&descriptors);
            body.0.extend_from_slice(&vectors);
            let good = encoded(0);
            let (_, rest) = read_header(&good).unwrap();
            let mut bytes = good[..good.len() - rest.bytes.len()].to_vec();
            bytes.extend_from_slice(&(body.0.len() as u64).to_le_bytes());
            bytes.extend_from_slice(&checksum(&body.0).to_le_bytes());
            bytes.extend_from_slice(&body.0);
            let parts = split(&bytes).unwrap();
            let _ = parts.descriptors();
            let _ = parts.vectors();
        }

        /// Any bytes at all: an error, never a panic or a huge allocation.
        #[test]
        fn arbitrary_bytes_never_panic(tail in prop::collection::vec(any::<u8>(), 0..256)) {
            let mut bytes = encoded(2)[..40].to_vec();
            bytes.extend(tail);
            if let Ok(parts) = split(&bytes) {
                let _ = parts.descriptors();
                let _ = parts.vectors();
            }
        }
    }
}
