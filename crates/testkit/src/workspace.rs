//! The workspace as files: its crates' directories, sources and manifests, for the tests that
//! hold the tree to its rules (the sans-IO boundary, docs/ARCHITECTURE.md).

use std::fs;
use std::path::{Path, PathBuf};

/// The directory of the workspace crate `name` (under `crates/`).
pub fn crate_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name)
}

/// The workspace's crates: the directories under `crates/` that hold a `Cargo.toml`, sorted.
pub fn crate_names() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut names: Vec<String> = fs::read_dir(&root)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|entry| entry.path().join("Cargo.toml").is_file())
                .filter_map(|entry| entry.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Every `.rs` file under `dir`, recursively.
pub fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else { return files };
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|extension| extension == "rs") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// The names in `[dependencies]` and `[target.….dependencies]` (not dev- or build-).
pub fn normal_dependencies(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            let header = line.trim_matches(|c| c == '[' || c == ']');
            inside = header == "dependencies" || (header.starts_with("target.") && header.ends_with(".dependencies"));
            continue;
        }
        if !inside || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name = line.split(['=', '.']).next().unwrap_or("").trim().trim_matches('"');
        if !name.is_empty() {
            names.push(name.to_owned());
        }
    }
    names
}
