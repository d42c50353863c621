//! The slow tests of the `ldm7` command on loopback: the demo, and LDM-7 publishers and
//! subscribers under loss, kills and restarts (mostly waiting on timers). After the lab tests in
//! scripts/test-all's side lane, beside the rest.

mod demo;
mod ldm7;
#[path = "../cli/support.rs"]
mod support;
