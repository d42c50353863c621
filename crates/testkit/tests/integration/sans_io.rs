//! The protocol crates stay sans-IO (ARCHITECTURE.md "The sans-IO boundary", STYLE.md rule 1):
//! no sockets, files, threads, processes, clocks, OS randomness or async runtime in their
//! sources, and none of the crates that bring those in among their dependencies, so that the
//! simulator and the property tests can drive them in virtual time.
//!
//! One test for every protocol crate: add a crate to [`PROTOCOL_CRATES`] when it is created.

use std::fs;
use std::path::Path;

use ldm7_testkit::workspace::{crate_dir, normal_dependencies, rust_files};

/// The sans-IO crates, by directory under `crates/`.
const PROTOCOL_CRATES: &[&str] = &["types", "xdr", "fmtp-proto", "ldm-proto", "metrics", "plan"];

/// What their sources must not use (comment lines are not looked at, so docs may name them).
const FORBIDDEN_IN_SOURCE: &[&str] = &[
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

/// What their `[dependencies]` must not name.
const FORBIDDEN_DEPENDENCIES: &[&str] = &["tokio", "socket2", "rand", "mio", "libc", "getrandom", "nix", "quinn-udp"];

#[test]
fn protocol_crate_sources_use_no_io() {
    let mut problems = Vec::new();
    for name in PROTOCOL_CRATES {
        let source = crate_dir(name).join("src");
        let files = rust_files(&source);
        assert!(!files.is_empty(), "no Rust sources under {}: is {name} still a protocol crate?", source.display());
        for path in files {
            let text =
                fs::read_to_string(&path).unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()));
            for (number, line) in text.lines().enumerate() {
                let code = line.trim_start();
                if code.starts_with("//") {
                    continue;
                }
                for needle in FORBIDDEN_IN_SOURCE {
                    if code.contains(needle) {
                        problems.push(format!("{}:{}: uses {needle}", path.display(), number + 1));
                    }
                }
            }
        }
    }
    assert!(
        problems.is_empty(),
        "protocol crates must stay sans-IO (time and randomness are arguments):\n{}",
        problems.join("\n")
    );
}

#[test]
fn protocol_crates_depend_on_no_io_crate() {
    let mut problems = Vec::new();
    for name in PROTOCOL_CRATES {
        let manifest = crate_dir(name).join("Cargo.toml");
        let text =
            fs::read_to_string(&manifest).unwrap_or_else(|error| panic!("cannot read {}: {error}", manifest.display()));
        for dependency in normal_dependencies(&text) {
            if FORBIDDEN_DEPENDENCIES.contains(&dependency.as_str()) {
                problems.push(format!("{} depends on {dependency}", manifest.display()));
            }
        }
    }
    assert!(problems.is_empty(), "protocol crates must stay sans-IO:\n{}", problems.join("\n"));
}

#[test]
fn the_scanner_sees_what_it_must() {
    let manifest = "[package]\nname = \"x\"\n[dependencies]\ntokio.workspace = true\nserde = \"1\"\n\
                    [dev-dependencies]\nrand = \"0.9\"\n[target.'cfg(unix)'.dependencies]\nlibc = \"0.2\"\n";
    assert_eq!(normal_dependencies(manifest), ["tokio", "serde", "libc"]);
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    assert!(rust_files(&here).iter().any(|path| path.ends_with("sans_io.rs")));
}
