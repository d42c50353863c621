//! `ldm7 trace`: product traces (the format: [`ldm7_types::trace`]).

use crate::exit::CmdResult;

/// `ldm7 trace` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum TraceCommand {}

/// Runs a `ldm7 trace` subcommand.
pub fn run(command: &TraceCommand) -> CmdResult {
    match *command {}
}
