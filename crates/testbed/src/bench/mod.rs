//! The benchmarks of `ldm7 bench`, each measured beside a baseline taken in the same run on the
//! same machine, or side by side with the reference build (medians of repeated runs):
//!
//! - [`queue`]: the product queue's insert and read rates and cross-process wake-up latency
//!   (`bench queue`);
//! - [`reference`](mod@reference): the two systems under test (ldm7 and Unidata LDM 6.15 through
//!   `LDM_REF_BIN`) and what every side-by-side benchmark needs, and inserting files
//!   (`bench insert`);
//! - [`ldm6`]: LDM-6 fan-out on loopback (`bench ldm6`);
//! - [`act`]: product actions through `ldm7 act` (`bench act`);
//! - [`scour`](mod@scour): deleting old files, `ldm7 scour` beside LDM's `scour` on the same
//!   generated tree (`bench scour`);
//! - [`compare`]: LDM-6 unicast against LDM-7 multicast on a lab path, with its figure
//!   (`bench compare`, root).
//!
//! Each takes a plain options struct (the `ldm7` binary fills it from its flags) and returns
//! `anyhow::Result`: any failure of a benchmark is a failure of its run.

pub mod act;
pub mod compare;
pub mod idd;
pub mod ldm6;
pub mod queue;
pub mod reference;
pub mod scour;
