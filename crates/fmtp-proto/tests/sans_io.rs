//! The protocol crate stays sans-IO (ARCHITECTURE.md, STYLE.md rule 1): no sockets, files,
//! threads, processes, clocks, OS randomness or async runtime in its sources, so that the
//! simulator can drive it with virtual time.

use std::fs;
use std::path::Path;

const FORBIDDEN: &[&str] = &[
    "std::net",
    "std::fs",
    "std::thread",
    "std::process",
    "std::io",
    "SystemTime::now",
    "Instant::now",
    "std::time::Instant",
    "rand::",
    "getrandom",
    "tokio",
    "async fn",
    "unsafe",
];

#[test]
fn source_has_no_io() {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut checked = 0;
    for entry in fs::read_dir(&source).expect("read src") {
        let path = entry.expect("dir entry").path();
        let text = fs::read_to_string(&path).expect("read source file");
        for needle in FORBIDDEN {
            assert!(!text.contains(needle), "{} uses {needle}: ldm7-fmtp-proto must stay sans-IO", path.display());
        }
        checked += 1;
    }
    assert!(checked >= 8, "expected the crate's source files under {}", source.display());
}
