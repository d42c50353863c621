//! `ldm7 man DIR` (hidden; the package's build runs it): man pages generated from the command
//! definitions themselves — `ldm7(1)`, one `ldm7-SUBCOMMAND(1)` per subcommand, and one per
//! classic name (`pqact(1)`, `ldmadmin(1)` …) — so the pages say what the binary does.

use std::path::{Path, PathBuf};

use clap::CommandFactory;

use crate::exit::{CmdResult, runtime};

/// Arguments of `ldm7 man`.
#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Where the pages are written (NAME.1).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,
}

/// Writes every page; prints their number.
pub fn run(args: &ManArgs, classic: &[(&'static str, clap::Command)]) -> CmdResult {
    std::fs::create_dir_all(&args.dir).map_err(runtime)?;
    let top = crate::Cli::command();
    let mut written = 0;
    write_page(&args.dir, "ldm7", top.clone())?;
    written += 1;
    for sub in top.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        let name = format!("ldm7-{}", sub.get_name());
        write_page(&args.dir, &name, sub.clone().name(name.clone()).bin_name(format!("ldm7 {}", sub.get_name())))?;
        written += 1;
    }
    for (name, command) in classic {
        write_page(&args.dir, name, command.clone())?;
        written += 1;
    }
    println!("{written} man pages in {}", args.dir.display());
    Ok(())
}

fn write_page(dir: &Path, name: &str, command: clap::Command) -> CmdResult {
    let mut page = Vec::new();
    clap_mangen::Man::new(command.name(name.to_owned()))
        .title(name.to_uppercase())
        .section("1")
        .source(format!("ldm7 {}", env!("CARGO_PKG_VERSION")))
        .manual("ldm7")
        .render(&mut page)
        .map_err(runtime)?;
    std::fs::write(dir.join(format!("{name}.1")), page).map_err(runtime)
}
