//! scour: deletes old files from the directories a scour.conf names, as Unidata LDM's
//! `scour(1)` does, in parallel (docs/operations.md "scour"). Sites run it from cron to keep the
//! directories that `pqact` files products into from filling up.
//!
//! - [`conf`]: scour.conf (`DIRECTORY AGE [PATTERN]` lines) parsed into entries and per-line
//!   problems, directories resolved (`~`, `~user`, relative to the data directory), the
//!   excludes file;
//! - [`age`]: the AGE field (`D`, `-hh`, `-hh:mm`, `D-hh`, `D-hh:mm`);
//! - [`pattern`]: the PATTERN field, matched by the C library's `fnmatch` as LDM matches it;
//! - [`walk`]: the deletion rules, applied to every entry and within every tree in parallel;
//! - [`sentinel`]: the optional "nothing new since the last scour" rule of LDM's scour.sh.
//!
//! The library logs through `tracing`: one INFO line (target `ldm7::product`, shown with `-v`)
//! per file, link or directory removed, a warning per failure; the `ldm7 scour` command logs
//! the problems of the configuration and the reports.

pub mod age;
pub mod conf;
pub mod pattern;
pub mod sentinel;
pub mod walk;

use std::path::Path;

pub use age::Age;
pub use conf::{Excludes, Problem, Resolver};
pub use pattern::Pattern;
pub use walk::{Counts, Job, Options, Outcome, Report, scour, threads_default};

/// The entries of a scour.conf ready to run, and the problems of its other lines.
#[derive(Debug, Default)]
pub struct Plan {
    /// The jobs, in file order.
    pub jobs: Vec<Job>,
    /// Lines that are not entries, and entries whose directory cannot be scoured.
    pub problems: Vec<Problem>,
}

/// Parses the text of a scour.conf named `file` and resolves each entry's directory.
pub fn plan(text: &[u8], file: &Path, resolver: &Resolver) -> Plan {
    let parsed = conf::parse(text, file);
    let mut plan = Plan { jobs: Vec::new(), problems: parsed.problems };
    for entry in parsed.entries {
        match resolver.resolve(&entry.directory) {
            Ok(directory) => plan.jobs.push(Job {
                directory,
                age: entry.age,
                pattern: entry.pattern,
                origin: format!("{}:{}", file.display(), entry.line),
            }),
            Err(error) => {
                plan.problems.push(Problem { file: file.to_path_buf(), line: entry.line, kind: error.into() })
            }
        }
    }
    plan.problems.sort_by_key(|problem| problem.line);
    plan
}

#[cfg(test)]
mod tests;
