//! A stand-alone `lab` binary for testing `ldm7 lab` before it is wired into the `ldm7` CLI:
//! `cargo run -p ldm7-net --example lab -- up --spec examples/lab/one-receiver.toml`.

use clap::Parser;

/// The namespace lab (the same subcommands as `ldm7 lab`).
#[derive(Debug, Parser)]
#[command(name = "lab")]
struct Arguments {
    #[command(subcommand)]
    command: ldm7_net::LabCommand,
}

fn main() {
    let arguments = Arguments::parse();
    if let Err(error) = ldm7_net::run_lab(arguments.command) {
        if !matches!(error, ldm7_net::LabError::ExecStatus(_)) {
            eprintln!("error: {error}");
        }
        std::process::exit(error.exit_code());
    }
}
