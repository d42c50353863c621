//! Writes the seed corpora: `ldm7-fuzz-seeds DIR` puts each seed in `DIR/<target>/<name>`, the
//! name being the SHA-1 of its bytes as cargo-fuzz names corpus files (a seed already there is
//! left alone). The captures come from the shared data (`$LDM7_SHARED/data/captures`, else
//! `../shared/data/captures`), the lab specs from `examples/lab`.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    let (Some(out), None) = (args.next(), args.next()) else {
        eprintln!("usage: ldm7-fuzz-seeds DIR   (writes DIR/<target>/<sha1> for each seed)");
        return ExitCode::from(1);
    };
    let out = PathBuf::from(out);
    let captures = ldm7_testkit::shared_root().join("captures");
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/lab");
    if !captures.is_dir() {
        eprintln!("warning: {} is absent: no seeds from captures of real traffic", captures.display());
    }
    let seeds = match ldm7_fuzz::seeds::all(Some(captures.as_path()).filter(|c| c.is_dir()), Some(&examples)) {
        Ok(seeds) => seeds,
        Err(error) => {
            eprintln!("error: reading the seeds' sources: {error}");
            return ExitCode::from(1);
        }
    };
    let mut written = 0;
    for (target, bytes) in &seeds {
        let dir = out.join(target);
        let path = dir.join(ldm7_fuzz::corpus_name(bytes));
        let result = std::fs::create_dir_all(&dir)
            .and_then(|()| if path.exists() { Ok(false) } else { std::fs::write(&path, bytes).map(|()| true) });
        match result {
            Ok(new) => written += usize::from(new),
            Err(error) => {
                eprintln!("error: {}: {error}", path.display());
                return ExitCode::from(1);
            }
        }
    }
    println!("{} seeds, {written} new, in {}", seeds.len(), out.display());
    ExitCode::SUCCESS
}
