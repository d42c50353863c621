//! FMTP and LDM-7 across real network namespaces (root; skipped otherwise): the lab lane of scripts/test-all, one lab at a time on the machine (`ldm7_testkit::lab_lock`).

mod lab_fmtp;
mod lab_idd;
mod lab_ipv6;
mod lab_ldm7;
