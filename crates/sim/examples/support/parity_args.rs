//! The parity flags of the simulator's examples.

/// `--parity [--parity-group G] [--parity-shards S]`: repairs by parity multicast (the ldm7
/// extension, docs/parity.md) rather than by unicast RETX_DATA.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct ParityArgs {
    /// Repair by parity multicast (the ldm7 extension) rather than by unicast RETX_DATA.
    #[arg(long)]
    pub parity: bool,
    /// Data blocks per parity group.
    #[arg(long, default_value_t = 256)]
    pub parity_group: u32,
    /// Parity shards per group.
    #[arg(long, default_value_t = 32)]
    pub parity_shards: u32,
}

impl ParityArgs {
    /// `config` with parity repair when `--parity` was given.
    pub fn apply(&self, config: ldm7_sim::SimConfig) -> ldm7_sim::SimConfig {
        if self.parity { config.with_parity(self.parity_group, self.parity_shards) } else { config }
    }
}
