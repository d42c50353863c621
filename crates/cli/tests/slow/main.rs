//! The slow tests of the `ldm7` command on loopback: the demo, and LDM-7 publishers and
//! subscribers under loss, kills and restarts (mostly waiting on timers). A lane of its own in
//! scripts/test-all, beside the rest.

mod demo;
mod ldm7;
#[path = "../cli/support.rs"]
mod support;
