//! Path services, host configuration and the namespace lab — the network plane of ldm7.
//!
//! - [`path`]: the [`path::PathService`] interface for a feed's rate-guaranteed multipoint
//!   layer-2 path, with drivers `static`, `linux-bridge`, `vde` and `oess` (Internet2 AL2S);
//! - [`hostcfg`] and [`tc`]: the feed interface, its private address (which an LDM-7 subscriber
//!   configures itself with [`hostcfg::ensure_address`]), receive-side loss, and the
//!   publisher's HTB tree (multicast and retransmission classes, BFIFO) with its counters;
//! - [`pool`]: the private addresses of a feed's subnet that the publisher hands to its
//!   subscribers (a decision over addresses, no I/O);
//! - [`lab`]: the namespace lab behind `ldm7 lab up | down | status | exec` (the subcommands
//!   themselves live in the `ldm7` binary), hosts as network namespaces on one machine, joined by
//!   a control network and by one path per feed;
//! - [`command`], [`netns`]: the thin layer over `ip`, `tc`, `iptables` and the VDE tools, and
//!   running code inside a namespace.
//!
//! See `docs/lab.md` for what the lab emulates and how to build the research set-ups.

pub mod command;
pub mod hostcfg;
pub mod lab;
pub mod netns;
pub mod path;
pub mod pool;
pub mod tc;

pub use lab::{LabError, LabSpec, LabStatus};
pub use ldm7_types::units::{self, ByteSize, LossPercent, Rate};
pub use path::{Endpoint, Leg, PathError, PathInfo, PathService};
