//! The `ldm7` command as a user runs it, with real processes on loopback: one test binary (modules by subject). The namespace lab tests are `lab`, the tests against reference builds `reference`.

mod act;
mod act_run;
mod cli;
mod demo;
mod flags;
mod fmtp;
mod full_disk;
mod ldm6;
mod ldm6_bounds;
mod ldm7;
mod logging;
mod monitor;
mod plan;
mod scour;
mod support;
mod trace;
