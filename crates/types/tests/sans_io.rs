//! The vocabulary crate stays sans-IO (ARCHITECTURE.md): no sockets, files, threads, clocks or
//! randomness, so that every protocol crate built on it can be driven by a simulator.

use std::fs;
use std::path::Path;

const FORBIDDEN: &[&str] =
    &["std::net", "std::fs", "std::thread", "std::process", "SystemTime::now", "Instant::now", "rand::", "tokio"];

#[test]
fn source_has_no_io() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut checked = 0;
    for entry in fs::read_dir(&source).expect("read src") {
        let path = entry.expect("dir entry").path();
        let text = fs::read_to_string(&path).expect("read source file");
        for needle in FORBIDDEN {
            assert!(!text.contains(needle), "{} uses {needle}: ldm7-types must stay sans-IO", path.display());
        }
        checked += 1;
    }
    assert!(checked >= 5, "expected the crate's source files under {}", source.display());
}
