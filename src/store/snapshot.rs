//! The lexical index snapshot's file in the data dir, and the fingerprint of
//! the stored descriptors it names (`core::lexical`'s snapshot module says
//! what the file holds and when it is used).
//!
//! The file is a cache: written whole to a temporary name, synced, renamed
//! over the old one, so a reader sees an old snapshot or a new one, never
//! half of one; a missing, stale or damaged file only means the index is
//! built again. It is never a source of truth and never decides a ranking.

use super::{StoreError, StoredDescriptor, DESCRIPTORS};
use crate::core::catalog_snapshot::CatalogEpoch;
use crate::core::descriptor::CapabilityDescriptor;
use crate::core::lexical::snapshot::{Fingerprint, FingerprintHasher};
use serde::Serialize;
use std::io::Write;

/// The lexical snapshot's file name, beside sled's files in the data dir.
pub const LEXICAL_SNAPSHOT_FILE: &str = "lexical.snapshot";
/// The catalog snapshot's file name (`core::catalog_snapshot`), beside it.
pub const CATALOG_SNAPSHOT_FILE: &str = "catalog.snapshot";

/// A descriptor encoded exactly as [`StoredDescriptor`] is (same fields, same
/// names, same order), without copying it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StoredDescriptorRef<'a> {
    origin: &'a str,
    descriptor: &'a CapabilityDescriptor,
}

/// A snapshot file's bytes, mapped from the page cache: a restart decodes
/// them in place instead of copying them into fresh memory first (on a
/// virtual machine, faulting in fresh pages was most of a restart).
pub enum SnapshotFile {
    Mapped(memmap2::Mmap),
    Empty,
}

impl std::ops::Deref for SnapshotFile {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            SnapshotFile::Mapped(map) => map,
            SnapshotFile::Empty => &[],
        }
    }
}

impl std::fmt::Debug for SnapshotFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SnapshotFile({} bytes)", self.len())
    }
}

impl super::Store {
    /// Like [`super::Store::descriptors`], with the fingerprint of the stored
    /// bytes (keys and values, in id order), from the same pass.
    pub fn descriptors_fingerprinted(&self) -> Result<(Vec<StoredDescriptor>, Fingerprint), StoreError> {
        let mut hasher = FingerprintHasher::default();
        let mut rows = Vec::new();
        for entry in self.descriptors.iter() {
            let (key, bytes) =
                entry.map_err(|source| StoreError::Sled { action: "iterate", tree: DESCRIPTORS, source })?;
            hasher.add(&key, &bytes);
            rows.push(rmp_serde::from_slice(&bytes).map_err(|source| StoreError::Decode {
                tree: DESCRIPTORS,
                key: String::from_utf8_lossy(&key).into_owned(),
                source,
            })?);
        }
        Ok((rows, hasher.finish()))
    }

    /// The fingerprint the store would give for these descriptors with their
    /// origins, `(id order)`: what [`super::Store::descriptors_fingerprinted`]
    /// returns once exactly these are stored.
    pub fn descriptor_fingerprint<'a>(
        held: impl IntoIterator<Item = (&'a str, &'a CapabilityDescriptor)>,
    ) -> Result<Fingerprint, StoreError> {
        let mut hasher = FingerprintHasher::default();
        let mut bytes = Vec::new();
        for (origin, descriptor) in held {
            bytes.clear();
            rmp_serde::encode::write_named(&mut bytes, &StoredDescriptorRef { origin, descriptor })
                .map_err(|source| StoreError::Encode { tree: DESCRIPTORS, source })?;
            hasher.add(descriptor.id.as_bytes(), &bytes);
        }
        Ok(hasher.finish())
    }

    /// Stores `value` as the stored bytes of descriptor `id`, as they are: a
    /// test's stand-in for a descriptor an earlier version stored.
    #[cfg(test)]
    pub(crate) fn put_descriptor_bytes(&self, id: &str, value: Vec<u8>) {
        self.catalog_epoch
            .write(|| {
                self.descriptors.insert(id.as_bytes(), value).expect("a test store takes the insert");
                Ok(())
            })
            .expect("a test store takes the epoch");
    }

    /// The lexical snapshot file's bytes; `None` when there is none (or it cannot be read).
    pub fn read_lexical_snapshot(&self) -> Option<SnapshotFile> {
        self.read_snapshot_file(LEXICAL_SNAPSHOT_FILE)
    }

    /// Replaces the lexical snapshot file with `bytes`, atomically. Refused
    /// while the data dir is under its free-space reserve (a cache never
    /// takes the space acknowledged writes need).
    pub fn write_lexical_snapshot(&self, bytes: &[u8]) -> Result<(), StoreError> {
        self.write_snapshot_file(LEXICAL_SNAPSHOT_FILE, bytes)
    }

    /// The catalog snapshot file's bytes; `None` when there is none (or it cannot be read).
    pub fn read_catalog_snapshot(&self) -> Option<SnapshotFile> {
        self.read_snapshot_file(CATALOG_SNAPSHOT_FILE)
    }

    /// Replaces the catalog snapshot file with `bytes` (which name an epoch
    /// [`super::Store::hand_out_catalog_epoch`] gave), atomically, after a
    /// flush that makes that epoch durable: a file never names an epoch sled could lose.
    pub fn write_catalog_snapshot(&self, bytes: &[u8]) -> Result<(), StoreError> {
        self.check_space()?;
        self.flush()?;
        self.write_snapshot_file(CATALOG_SNAPSHOT_FILE, bytes)
    }

    /// The catalog trees' epoch now, to name a snapshot of what they hold
    /// (`catalog_epoch.rs`): the caller's catalog in memory must be exactly
    /// what the trees hold. `None` once a catalog write failed part way in
    /// this process (the trees and the catalog in memory may differ).
    pub fn hand_out_catalog_epoch(&self) -> Option<CatalogEpoch> {
        self.catalog_epoch.hand_out()
    }

    fn read_snapshot_file(&self, name: &str) -> Option<SnapshotFile> {
        let mapped = std::fs::File::open(self.space.dir.join(name)).and_then(|file| {
            if file.metadata()?.len() == 0 {
                return Ok(SnapshotFile::Empty);
            }
            // SAFETY: the mapping is only sound while nobody writes into the
            // file or cuts it. capdex never does: it replaces a snapshot by
            // renaming a new file over the old name, so the inode mapped here
            // keeps its bytes. Another writer of the data dir is trusted as
            // the process itself (docs/security.md), and a second capdex
            // cannot open the dir (sled's lock).
            let map = unsafe { memmap2::MmapOptions::new().map(&file)? };
            // Read ahead, not populated: pages not in the page cache (a cold
            // start) stream in while the decoding threads work through the
            // ones that came, both files at once.
            let _ = map.advise(memmap2::Advice::WillNeed);
            Ok(SnapshotFile::Mapped(map))
        });
        match mapped {
            Ok(file) => Some(file),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
            Err(err) => {
                tracing::warn!(%err, file = name, "a snapshot cannot be read; what it caches is read from the store");
                None
            }
        }
    }

    fn write_snapshot_file(&self, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
        self.check_space()?;
        let path = self.space.dir.join(name);
        let temporary = path.with_extension("snapshot.tmp");
        let written = (|| {
            let mut file = std::fs::File::create(&temporary)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            std::fs::rename(&temporary, &path)
        })();
        written.map_err(|err| {
            let _ = std::fs::remove_file(&temporary);
            StoreError::Durable { message: format!("failed to write {}: {err}", path.display()) }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[test]
    fn the_fingerprint_of_descriptors_is_the_fingerprint_of_their_stored_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let mut tools: Vec<CapabilityDescriptor> = ["b_tool", "a_tool", "c_tool"]
            .into_iter()
            .map(|name| crate::core::descriptor::test_tool(name, "does a thing"))
            .collect();
        for tool in &tools {
            store.put_descriptor("folder", tool).unwrap();
        }
        tools.sort_by(|a, b| a.id.cmp(&b.id));
        let (held, stored) = store.descriptors_fingerprinted().unwrap();
        assert_eq!(held.len(), 3);
        assert_eq!(stored.count, 3);
        let computed = Store::descriptor_fingerprint(tools.iter().map(|tool| ("folder", tool))).unwrap();
        assert_eq!(computed, stored);
        let other_origin = Store::descriptor_fingerprint(tools.iter().map(|tool| ("api", tool))).unwrap();
        assert_ne!(other_origin, stored);
        store.remove_capability(&tools[0].id).unwrap();
        assert_ne!(store.descriptors_fingerprinted().unwrap().1, stored);
    }

    #[test]
    fn the_snapshot_file_is_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        assert!(store.read_lexical_snapshot().is_none());
        store.write_lexical_snapshot(b"first").unwrap();
        store.write_lexical_snapshot(b"second").unwrap();
        assert_eq!(store.read_lexical_snapshot().as_deref(), Some(&b"second"[..]));
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
            .filter(|name| name.ends_with(".tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }
}
