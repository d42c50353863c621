//! The `ldm7` command as a user runs it, with real processes on loopback: one test binary (modules by subject). The namespace lab tests are `lab`, the demo and the LDM-7 fault tests `slow`, the tests against reference builds `reference`.

mod act;
mod act_run;
mod admin;
mod classic_flags;
mod cli;
mod flags;
mod fmtp;
mod full_disk;
mod ipv6;
mod ldm6;
mod ldm6_bounds;
mod logging;
mod monitor;
mod package;
mod plan;
mod rtstats;
mod scour;
mod support;
mod trace;
