//! The pqact configurations of a site: the files its ldmd.conf's EXEC entries give `pqact` (or
//! `ldm7 act`), INCLUDEd ldmd.conf files included, each checked as `pqact` would read it
//! (`ldmadmin pqactcheck`).

use std::path::{Path, PathBuf};

use ldm7_config::ldmd::Config;

use crate::Site;

/// pqact's options that take a value (LDM's and `ldm7 act`'s short forms).
const OPTIONS_WITH_VALUE: &[&str] = &["-l", "-d", "-q", "-p", "-f", "-i", "-t", "-o"];

/// One pqact configuration file and what checking it found.
#[derive(Debug)]
pub struct PqactCheck {
    /// The EXEC entry (its command line, file:line).
    pub exec: String,
    /// The configuration file.
    pub file: PathBuf,
    /// Its entries, or the first error with file:line.
    pub result: Result<usize, String>,
}

/// The configuration-file arguments of an EXEC command line that runs pqact (`pqact …` or
/// `ldm7 act …`), as written; `None` when it runs something else.
pub fn pqact_arguments(argv: &[String]) -> Option<Vec<String>> {
    let program = Path::new(argv.first()?).file_name()?.to_str()?;
    let rest = match program {
        "pqact" => &argv[1..],
        "ldm7" if argv.get(1).map(String::as_str) == Some("act") => &argv[2..],
        _ => return None,
    };
    let mut files = Vec::new();
    let mut args = rest.iter();
    while let Some(arg) = args.next() {
        if OPTIONS_WITH_VALUE.contains(&arg.as_str()) {
            args.next();
        } else if !arg.starts_with('-') {
            files.push(arg.clone());
        }
    }
    Some(files)
}

/// The configuration files of an EXEC command line that runs pqact; `None` when it runs
/// something else. Without a file argument, the site's default.
pub fn pqact_files(argv: &[String], site: &Site) -> Option<Vec<PathBuf>> {
    // EXEC children run in the site's home, as ldmd under ldmadmin runs in LDMHOME.
    let mut files: Vec<PathBuf> = pqact_arguments(argv)?.iter().map(|arg| site.site.home.join(arg)).collect();
    if files.is_empty() {
        files.push(site.site.pqact.config.clone());
    }
    Some(files)
}

/// Checks every pqact configuration the EXEC entries of `config` name.
pub fn check_execs(site: &Site, config: &Config) -> Vec<PqactCheck> {
    let mut checks = Vec::new();
    for exec in &config.execs {
        let Some(files) = pqact_files(&exec.argv, site) else { continue };
        let described =
            format!("EXEC \"{}\" ({}:{})", exec.argv.join(" "), exec.location.file.display(), exec.location.line);
        for file in files {
            checks.push(PqactCheck { exec: described.clone(), result: check_file(&file), file });
        }
    }
    checks
}

/// Checks one pqact configuration file: its entry count, or the first error.
pub fn check_file(file: &Path) -> Result<usize, String> {
    ldm7_act::run::load(&[file.to_owned()]).map(|conf| conf.entries.len()).map_err(|error| error.to_string())
}
