#!/usr/bin/env bash
# The research's FMTP figures in the simulator (RESEARCH.md §6), each a command of its own:
# throughput degradation and sender buffer against rate, throughput against RTT, robustness
# against the retransmission timeout factor. CSV and PNG into experiments/results/sim/.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -p ldm7-sim --example figures
for figure in rate rtt timeout; do
  ./target/release/examples/figures "$figure" --out experiments/results/sim "$@"
done
