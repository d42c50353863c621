//! The simulator: scenarios and random runs: one test binary.

mod random;
mod scenarios;
