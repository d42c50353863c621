//! Every example spec in `examples/lab/` is valid (no root needed).

use ldm7_net::lab::LabSpec;

#[test]
fn example_specs_are_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/lab");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("examples/lab exists") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let spec = LabSpec::from_file(&path).unwrap_or_else(|e| panic!("{e}"));
            assert!(!spec.feeds.is_empty(), "{}", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 5, "found {checked} example specs in {}", dir.display());
}
