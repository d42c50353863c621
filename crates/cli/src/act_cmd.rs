//! `ldm7 act` (pqact): product actions from a `pqact.conf`, unchanged (ldm-formats.md §2).
//! `--check` reads the configuration files, reports the first error with file:line (exit 1),
//! and prints every entry as it was understood.

use std::path::PathBuf;

use anyhow::Context;

use crate::exit::{CmdResult, bad_input, input};

/// Arguments of `ldm7 act`.
#[derive(clap::Args, Debug)]
pub struct ActArgs {
    /// Check the configuration: print each entry as parsed, or the first error with its
    /// file:line (exit 1). (Running the actions on the queue is the next step of this command.)
    #[arg(long, required = true)]
    pub check: bool,
    /// The configuration files, in order [default: pqact.conf].
    #[arg(value_name = "CONF")]
    pub conf: Vec<PathBuf>,
}

/// Runs `ldm7 act`.
pub fn run(args: &ActArgs) -> CmdResult {
    let files = if args.conf.is_empty() { vec![PathBuf::from("pqact.conf")] } else { args.conf.clone() };
    let mut entries = 0;
    for file in &files {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read the configuration {}", file.display()))
            .map_err(input)?;
        let conf = ldm7_server::act::parse(&file.display().to_string(), &text).map_err(bad_input)?;
        for entry in &conf.entries {
            println!("{entry}");
        }
        entries += conf.entries.len();
    }
    eprintln!("{entries} entries in {} file(s): valid", files.len());
    Ok(())
}
