//! The parity flag of the simulator's examples.

use ldm7_fmtp_proto::ParityChoice;

/// `--parity auto|off|GROUP/SHARDS`: how LDM-7 repairs, as an ldm7 publisher and its ldm7
/// subscribers agree by default (docs/parity.md): `auto` (the default, also a bare `--parity`)
/// is the publisher's rule for the receivers and loss simulated; `off` repairs every loss by
/// unicast RETX_DATA, as the reference's FMTP does.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct ParityArgs {
    /// Parity repair: `auto` (the publisher's rule for these receivers and this loss), `off`
    /// (unicast repairs only, as the reference) or GROUP/SHARDS.
    #[arg(long, value_name = "auto|off|GROUP/SHARDS", default_value = "auto", num_args = 0..=1, default_missing_value = "auto")]
    pub parity: ParityChoice,
}

impl ParityArgs {
    /// Whether parity repair is on.
    #[allow(dead_code)] // Not every example that includes this file asks.
    pub fn is_on(&self) -> bool {
        self.parity != ParityChoice::Off
    }

    /// `config` with the parity coding chosen for `receivers` at `loss` (unchanged with `off`).
    pub fn apply(&self, config: ldm7_sim::SimConfig, receivers: usize, loss: f64) -> ldm7_sim::SimConfig {
        match self.parity.resolve(u32::try_from(receivers).unwrap_or(u32::MAX), loss) {
            Some(parity) => config.with_parity(parity.group_blocks, parity.shards),
            None => config,
        }
    }
}
