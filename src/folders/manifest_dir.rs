//! Reads capability folders: `<dir>/<capability>/CAPABILITY.yaml` (or `.yml`),
//! with an optional `SKILL.md` and `schema.json` beside it.
//!
//! Files are read only when they are regular files reached through no
//! symbolic link, at most [`MAX_MANIFEST_BYTES`] / [`MAX_ATTACHMENT_BYTES`]
//! long; on Linux the opened file's real path (from `/proc/self/fd`) must lie
//! below the capability folder. A symbolic link to a capability folder is
//! refused, not followed. Anything refused is reported with its path,
//! field and problem, never fatal to the scan.

use crate::core::descriptor::CapabilityDescriptor;
use crate::core::manifest::{self, ManifestProblem};
/// The size limits of a scan live in `core::manifest`, where config finds them too.
pub use crate::core::manifest::{ScanLimits, MAX_ATTACHMENT_BYTES, MAX_MANIFEST_BYTES};

/// Whether the `/proc/self/fd` containment check ran for every file read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Containment {
    unchecked: bool,
}
use serde::Serialize;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// A capability folder that was left out, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Refusal {
    pub manifest_path: String,
    pub field: String,
    pub problem: String,
}

/// What one scan found.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ScanReport {
    pub descriptors: Vec<CapabilityDescriptor>,
    pub refused: Vec<Refusal>,
    /// Problems that left nothing out (a missing scan folder, say).
    pub warnings: Vec<String>,
}

const MANIFEST_NAMES: [&str; 2] = ["CAPABILITY.yaml", "CAPABILITY.yml"];

/// The one warning of a scan in which the `/proc/self/fd` containment check could not run.
pub const CONTAINMENT_UNCHECKED: &str = "the /proc/self/fd containment check could not run for every file read \
     (no /proc, or not Linux): those files were checked for symbolic links, type and size only";

/// Checks an opened file against its capability folder; `Ok(false)` when the check cannot run.
type ContainmentCheck = fn(&File, &Path) -> Result<bool, String>;

/// Scans `dirs` in order with the default limits; see [`scan_with_refusals`].
pub fn scan(dirs: &[PathBuf]) -> ScanReport {
    scan_with_refusals(dirs, ScanLimits::default())
}

/// Scans `dirs` in order; each subfolder holding a manifest is one capability.
/// A later manifest with an id already seen is refused, naming the first.
/// A symbolic link to a folder holding a manifest is refused, not followed.
/// When the Linux containment check cannot run, the report carries one warning.
pub fn scan_with_refusals(dirs: &[PathBuf], limits: ScanLimits) -> ScanReport {
    scan_checked(dirs, limits, check_opened_below)
}

fn scan_checked(dirs: &[PathBuf], limits: ScanLimits, check: ContainmentCheck) -> ScanReport {
    let mut report = ScanReport::default();
    let mut containment = Containment::default();
    let mut seen: BTreeMap<String, String> = BTreeMap::new();
    for dir in dirs {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(err) => {
                report.warnings.push(format!("capability folder {} cannot be read: {err}", dir.display()));
                continue;
            }
        };
        // Folders, and symbolic links to folders (`true`): those are refused below.
        let mut folders: Vec<(PathBuf, bool)> = entries
            .filter_map(Result::ok)
            .filter_map(|entry| {
                let kind = entry.file_type().ok()?;
                let path = entry.path();
                match (kind.is_dir(), kind.is_symlink() && path.is_dir()) {
                    (true, _) => Some((path, false)),
                    (false, true) => Some((path, true)),
                    (false, false) => None,
                }
            })
            .collect();
        folders.sort();
        for (folder, linked) in folders {
            let Some(manifest_path) =
                MANIFEST_NAMES.iter().map(|name| folder.join(name)).find(|p| p.symlink_metadata().is_ok())
            else {
                continue;
            };
            let shown = manifest_path.display().to_string();
            if linked {
                report.refused.push(Refusal {
                    manifest_path: shown,
                    field: "(folder)".into(),
                    problem: format!(
                        "{} is a symbolic link: capability folders are not followed through links",
                        folder.display()
                    ),
                });
                continue;
            }
            match read_checked(&folder, &manifest_path, limits, &mut containment, check) {
                Ok(descriptor) => match seen.get(&descriptor.id) {
                    Some(first) => report.refused.push(Refusal {
                        manifest_path: shown,
                        field: "id".into(),
                        problem: format!("duplicate id {}: already defined by {first}", descriptor.id),
                    }),
                    None => {
                        seen.insert(descriptor.id.clone(), shown);
                        report.descriptors.push(descriptor);
                    }
                },
                Err(problem) => report.refused.push(Refusal {
                    manifest_path: shown,
                    field: problem.field,
                    problem: problem.problem,
                }),
            }
        }
    }
    if containment.unchecked {
        report.warnings.push(CONTAINMENT_UNCHECKED.to_string());
    }
    report
}

/// Reads one capability folder into a descriptor, with the default limits.
pub fn read_capability(folder: &Path, manifest_path: &Path) -> Result<CapabilityDescriptor, ManifestProblem> {
    read_checked(folder, manifest_path, ScanLimits::default(), &mut Containment::default(), check_opened_below)
}

fn read_checked(
    folder: &Path,
    manifest_path: &Path,
    limits: ScanLimits,
    containment: &mut Containment,
    check: ContainmentCheck,
) -> Result<CapabilityDescriptor, ManifestProblem> {
    let mut read = |path: &Path, max_bytes: u64| -> Result<String, String> {
        let (text, checked) = read_contained_checked(folder, path, max_bytes, check)?;
        containment.unchecked |= !checked;
        Ok(text)
    };
    let text =
        read(manifest_path, limits.max_manifest_bytes).map_err(|problem| ManifestProblem::new("(file)", problem))?;
    let draft = manifest::parse_limited(&text, &limits.text)?;
    let skill_file = match &draft.skill_content_path {
        Some(relative) => Some(
            read(&folder.join(relative), limits.max_attachment_bytes)
                .map_err(|problem| ManifestProblem::new("skillContent", problem))?,
        ),
        None if draft.skill_content.is_none() => {
            read_optional(folder, "SKILL.md", &mut |path| read(path, limits.max_attachment_bytes))
                .map_err(|problem| ManifestProblem::new("SKILL.md", problem))?
        }
        None => None,
    };
    let schema_file = match &draft.input_schema {
        Some(_) => None,
        None => match read_optional(folder, "schema.json", &mut |path| read(path, limits.max_attachment_bytes))
            .map_err(|problem| ManifestProblem::new("schema.json", problem))?
        {
            Some(text) => match serde_json::from_str::<serde_json::Value>(&text) {
                Ok(schema @ serde_json::Value::Object(_)) => Some(schema),
                Ok(_) => return Err(ManifestProblem::new("schema.json", "must hold a JSON object")),
                Err(err) => return Err(ManifestProblem::new("schema.json", format!("not valid JSON: {err}"))),
            },
            None => None,
        },
    };
    Ok(draft.into_descriptor(&manifest_path.display().to_string(), skill_file, schema_file))
}

fn read_optional(
    folder: &Path,
    name: &str,
    read: &mut dyn FnMut(&Path) -> Result<String, String>,
) -> Result<Option<String>, String> {
    let path = folder.join(name);
    if path.symlink_metadata().is_err() {
        return Ok(None);
    }
    read(&path).map(Some)
}

/// Reads `path` if it is a regular file below `folder`, reached through no
/// symbolic link, and at most `max_bytes` long.
pub fn read_contained(folder: &Path, path: &Path, max_bytes: u64) -> Result<String, String> {
    read_contained_checked(folder, path, max_bytes, check_opened_below).map(|(text, _)| text)
}

/// Like [`read_contained`], with `check` as the containment check; also says whether it ran.
fn read_contained_checked(
    folder: &Path,
    path: &Path,
    max_bytes: u64,
    check: ContainmentCheck,
) -> Result<(String, bool), String> {
    let relative =
        path.strip_prefix(folder).map_err(|_| format!("{} is outside the capability folder", path.display()))?;
    let mut walked = folder.to_path_buf();
    for component in relative.components() {
        walked.push(component);
        let meta = walked.symlink_metadata().map_err(|err| format!("{} cannot be read: {err}", walked.display()))?;
        if meta.file_type().is_symlink() {
            return Err(format!("{} is a symbolic link", walked.display()));
        }
    }
    let meta = path.symlink_metadata().map_err(|err| format!("{} cannot be read: {err}", path.display()))?;
    if !meta.file_type().is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if meta.len() > max_bytes {
        return Err(format!("{} is {} bytes, more than the {max_bytes} allowed", path.display(), meta.len()));
    }
    let mut file = File::open(path).map_err(|err| format!("{} cannot be opened: {err}", path.display()))?;
    let checked = check(&file, folder)?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    (&mut file)
        .take(max_bytes + 1)
        .read_to_end(&mut bytes)
        .map_err(|err| format!("{} cannot be read: {err}", path.display()))?;
    if bytes.len() as u64 > max_bytes {
        return Err(format!("{} grew past the {max_bytes} bytes allowed while being read", path.display()));
    }
    let text = String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", path.display()))?;
    Ok((text, checked))
}

/// On Linux, checks through `/proc/self/fd` that the opened file lies below
/// `folder`; returns whether the check ran (it cannot without `/proc` or the
/// folder's real path, and never runs elsewhere), so the scan can warn once.
#[cfg(target_os = "linux")]
fn check_opened_below(file: &File, folder: &Path) -> Result<bool, String> {
    use std::os::fd::AsRawFd;
    let (Ok(real), Ok(real_folder)) =
        (std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())), folder.canonicalize())
    else {
        return Ok(false);
    };
    if real.starts_with(&real_folder) {
        Ok(true)
    } else {
        Err(format!("{} resolves outside the capability folder", real.display()))
    }
}

#[cfg(not(target_os = "linux"))]
fn check_opened_below(_file: &File, _folder: &Path) -> Result<bool, String> {
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn write(dir: &Path, folder: &str, file: &str, text: &str) {
        fs::create_dir_all(dir.join(folder)).unwrap();
        fs::write(dir.join(folder).join(file), text).unwrap();
    }

    #[test]
    fn scans_folders_and_reports_refusals() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        write(root, "notes", "CAPABILITY.yaml", "name: notes\nkind: skill\ndescription: Take notes\n");
        write(root, "notes", "SKILL.md", "# Notes\nWrite things down.\n");
        write(root, "search", "CAPABILITY.yml", "name: search\nkind: tool\ndescription: Search\n");
        write(root, "search", "schema.json", r#"{"type":"object","properties":{"q":{"type":"string"}}}"#);
        write(root, "broken", "CAPABILITY.yaml", "name: broken\nkind: tool\n");
        write(root, "zdupe", "CAPABILITY.yaml", "id: skill:notes\nname: other\nkind: skill\ndescription: d\n");
        write(
            root,
            "escape",
            "CAPABILITY.yaml",
            "name: e\nkind: skill\ndescription: d\nskillContent: ../notes/SKILL.md\n",
        );
        write(root, "badschema", "CAPABILITY.yaml", "name: b\nkind: tool\ndescription: d\n");
        write(root, "badschema", "schema.json", "{not json");
        fs::create_dir_all(root.join("no-manifest")).unwrap();
        let report = scan(&[root.to_path_buf(), root.join("missing")]);
        let ids: Vec<&str> = report.descriptors.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(ids, vec!["skill:notes", "tool:search"]);
        assert_eq!(report.descriptors[0].full_content.as_deref(), Some("# Notes\nWrite things down.\n"));
        assert!(report.descriptors[1].full_schema.is_some());
        let refused: Vec<(&str, &str)> =
            report.refused.iter().map(|r| (r.manifest_path.rsplit('/').nth(1).unwrap(), r.field.as_str())).collect();
        assert_eq!(
            refused,
            vec![("badschema", "schema.json"), ("broken", "description"), ("escape", "skillContent"), ("zdupe", "id")]
        );
        assert_eq!(report.warnings.len(), 1);
    }

    #[cfg(unix)]
    #[test]
    fn symlinks_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        fs::write(root.join("secret.md"), "secret").unwrap();
        write(root, "linked", "CAPABILITY.yaml", "name: l\nkind: skill\ndescription: d\n");
        std::os::unix::fs::symlink(root.join("secret.md"), root.join("linked").join("SKILL.md")).unwrap();
        let report = scan(&[root.to_path_buf()]);
        assert!(report.descriptors.is_empty());
        assert_eq!(report.refused[0].field, "SKILL.md");
        assert!(report.refused[0].problem.contains("symbolic link"));
    }

    #[cfg(unix)]
    #[test]
    fn a_symlinked_capability_folder_is_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        write(outside.path(), "real", "CAPABILITY.yaml", "name: elsewhere\nkind: tool\ndescription: d\n");
        write(dir.path(), "plain", "CAPABILITY.yaml", "name: plain\nkind: tool\ndescription: d\n");
        std::os::unix::fs::symlink(outside.path().join("real"), dir.path().join("linked")).unwrap();
        // A link to a folder without a manifest is skipped like such a folder; a link to a file is no folder.
        fs::create_dir_all(outside.path().join("empty")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("empty"), dir.path().join("linked-empty")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("real/CAPABILITY.yaml"), dir.path().join("file-link")).unwrap();
        let report = scan(&[dir.path().to_path_buf()]);
        assert_eq!(report.descriptors.iter().map(|d| d.id.as_str()).collect::<Vec<_>>(), vec!["tool:plain"]);
        assert_eq!(report.refused.len(), 1, "{:?}", report.refused);
        let refusal = &report.refused[0];
        assert_eq!(refusal.manifest_path, dir.path().join("linked/CAPABILITY.yaml").display().to_string());
        assert_eq!(refusal.field, "(folder)");
        assert!(refusal.problem.contains("is a symbolic link"), "{refusal:?}");
        assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    }

    #[test]
    fn a_scan_warns_once_when_the_containment_check_cannot_run() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "one", "CAPABILITY.yaml", "name: one\nkind: skill\ndescription: d\n");
        write(dir.path(), "one", "SKILL.md", "# One\n");
        write(dir.path(), "two", "CAPABILITY.yaml", "name: two\nkind: tool\ndescription: d\n");
        let cannot_run: ContainmentCheck = |_, _| Ok(false);
        let report = scan_checked(&[dir.path().to_path_buf()], ScanLimits::default(), cannot_run);
        assert_eq!(report.descriptors.len(), 2, "the files are still read");
        assert_eq!(report.warnings, vec![CONTAINMENT_UNCHECKED.to_string()], "one warning for three files");
        let ran: ContainmentCheck = |_, _| Ok(true);
        let report = scan_checked(&[dir.path().to_path_buf()], ScanLimits::default(), ran);
        assert!(report.warnings.is_empty(), "{:?}", report.warnings);
        // On Linux with /proc the real check runs, so a plain scan has nothing to warn about.
        if cfg!(target_os = "linux") && Path::new("/proc/self/fd").is_dir() {
            assert!(scan(&[dir.path().to_path_buf()]).warnings.is_empty());
        }
    }

    #[test]
    fn oversized_manifests_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let big = format!("name: b\nkind: tool\ndescription: {}\n", "x".repeat(MAX_MANIFEST_BYTES as usize));
        write(dir.path(), "big", "CAPABILITY.yaml", &big);
        let report = scan(&[dir.path().to_path_buf()]);
        assert!(report.refused[0].problem.contains("more than"), "{:?}", report.refused);
    }
}
