//! Every input of the committed corpora (`fuzz/corpus/<target>/`, what the campaigns kept) and
//! of the kept crash inputs (`fuzz/regressions/<target>/`, each a bug fixed) through its target,
//! on the stable toolchain: a change that breaks what a campaign once covered fails here. Also
//! the seeds as made now, so a new seed cannot fail its target unnoticed.

use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

/// Runs each file of `dir/<target>/` through its target; returns the count per target. A
/// panic names the file.
fn replay(dir: &Path) -> Vec<(&'static str, usize)> {
    let mut counts = Vec::new();
    for target in ldm7_fuzz::TARGETS {
        let Ok(entries) = std::fs::read_dir(dir.join(target.name)) else {
            counts.push((target.name, 0));
            continue;
        };
        let mut files: Vec<PathBuf> = entries.map(|entry| entry.expect("a directory entry").path()).collect();
        files.sort();
        for file in &files {
            let bytes = std::fs::read(file).unwrap_or_else(|error| panic!("{}: {error}", file.display()));
            let outcome = std::panic::catch_unwind(|| (target.run)(&bytes));
            assert!(
                outcome.is_ok(),
                "{} fails on {} (replay: cargo +nightly fuzz run {} {})",
                target.name,
                file.display(),
                target.name,
                file.display()
            );
        }
        counts.push((target.name, files.len()));
    }
    counts
}

#[test]
fn every_corpus_input_runs_through_its_target() {
    let counts = replay(&fuzz_dir().join("corpus"));
    for (name, count) in &counts {
        assert!(*count >= 5, "fuzz/corpus/{name} holds {count} inputs: its seeds are missing (scripts/fuzz seed)");
    }
    eprintln!("corpus inputs per target: {counts:?}");
}

#[test]
fn every_kept_crash_input_runs_through_its_target() {
    let counts = replay(&fuzz_dir().join("regressions"));
    eprintln!("kept crash inputs per target: {counts:?}");
}

#[test]
fn the_seeds_as_made_now_run_through_their_targets() {
    let captures = ldm7_testkit::shared_data_or_skip("captures");
    let examples = fuzz_dir().join("../examples/lab");
    let seeds = ldm7_fuzz::seeds::all(captures.as_deref(), Some(&examples)).expect("the seeds' sources read");
    for target in ldm7_fuzz::TARGETS {
        let count = seeds.iter().filter(|(name, _)| *name == target.name).count();
        assert!(count >= 2, "{}: {count} seeds", target.name);
    }
    for (name, bytes) in &seeds {
        (ldm7_fuzz::target(name).expect("a seed names a target").run)(bytes);
    }
}
