//! Capability folders on disk. `manifest_dir` reads CAPABILITY.yaml folders;
//! the judging of what it reads is done by `core::manifest`.

pub mod manifest_dir;
