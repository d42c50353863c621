//! docs/ARCHITECTURE.md stays true to the tree: the crates its workspace layout names are the
//! crates under `crates/`, and its list of dependencies between them is what the manifests say
//! (normal dependencies), both ways. Change the tree and the document in the same commit.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use ldm7_testkit::workspace::{crate_dir, crate_names, normal_dependencies};

fn architecture() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/ARCHITECTURE.md");
    fs::read_to_string(&path).unwrap_or_else(|error| panic!("cannot read {}: {error}", path.display()))
}

/// The lines of the first fenced block that opens with `opening` (the fence's own line).
fn block<'a>(text: &'a str, opening: &str) -> Vec<&'a str> {
    let mut lines = text.lines().skip_while(|line| line.trim_end() != opening);
    assert!(lines.next().is_some(), "docs/ARCHITECTURE.md has no block opening with {opening:?}");
    lines.take_while(|line| line.trim_end() != "```").collect()
}

/// The crates the layout block names (`  name/  what it is`).
fn layout_crates(text: &str) -> BTreeSet<String> {
    let lines = block(text, "```");
    assert_eq!(lines.first().map(|line| line.trim_end()), Some("crates/"), "the layout block starts with crates/");
    lines
        .iter()
        .filter(|line| line.starts_with("  ") && !line.starts_with("   "))
        .filter_map(|line| line.trim().split_once('/').map(|(name, _)| name.to_owned()))
        .collect()
}

/// The dependency list (`name → a, b`).
fn documented_edges(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    block(text, "```text")
        .iter()
        .map(|line| {
            let (name, deps) = line.split_once('→').unwrap_or_else(|| panic!("not `name → deps`: {line:?}"));
            let deps = deps.split(',').map(str::trim).filter(|dep| !dep.is_empty()).map(str::to_owned).collect();
            (name.trim().to_owned(), deps)
        })
        .collect()
}

/// What the manifests say: each crate's dependencies among the workspace's crates.
fn manifest_edges() -> BTreeMap<String, BTreeSet<String>> {
    let crates: BTreeSet<String> = crate_names().into_iter().collect();
    crates
        .iter()
        .map(|name| {
            let manifest = fs::read_to_string(crate_dir(name).join("Cargo.toml")).expect("manifest");
            let deps = normal_dependencies(&manifest)
                .into_iter()
                .filter_map(|dep| dep.strip_prefix("ldm7-").map(str::to_owned))
                .filter(|dep| crates.contains(dep))
                .collect();
            (name.clone(), deps)
        })
        .collect()
}

#[test]
fn the_layout_names_exactly_the_workspace_crates() {
    let named = layout_crates(&architecture());
    let present: BTreeSet<String> = crate_names().into_iter().collect();
    let missing: Vec<_> = named.difference(&present).collect();
    let unnamed: Vec<_> = present.difference(&named).collect();
    assert!(
        missing.is_empty() && unnamed.is_empty(),
        "docs/ARCHITECTURE.md names crates that do not exist: {missing:?}; crates it does not name: {unnamed:?}"
    );
}

#[test]
fn the_dependency_list_is_what_the_manifests_say() {
    let documented = documented_edges(&architecture());
    let actual = manifest_edges();
    let mut problems = Vec::new();
    for (name, deps) in &actual {
        match documented.get(name) {
            None => problems.push(format!("{name} is not in the list")),
            Some(listed) => {
                for dep in listed.difference(deps) {
                    problems.push(format!("{name} → {dep} is listed but {name} does not depend on {dep}"));
                }
                for dep in deps.difference(listed) {
                    problems.push(format!("{name} depends on {dep}, which the list does not say"));
                }
            }
        }
    }
    for name in documented.keys().filter(|name| !actual.contains_key(*name)) {
        problems.push(format!("{name} is listed but is no crate"));
    }
    assert!(problems.is_empty(), "docs/ARCHITECTURE.md's dependency list is out of date:\n{}", problems.join("\n"));
}
