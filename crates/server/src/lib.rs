//! The ldm7 daemon (`ldm7 serve`): ldmd.conf ([`config`]), access control ([`access`]), the
//! upstream side of accepted connections, REQUEST downstreams, EXEC children, reload and
//! graceful shutdown ([`Server`]). Sessions are the sans-IO state machines of `ldm7-ldm-proto`
//! driven over blocking sockets, one thread per connection (LDM forks a process for each); the
//! same drivers serve the command-line clients ([`client`]: notify, push).
//!
//! Logging goes through `tracing` (targets and levels: `ldm7_io::log_target`); the binary
//! installs the subscriber.

use ldm7_client as client;
use ldm7_client::wait;
pub use ldm7_config::access;
pub use ldm7_config::ldmd as config;
pub use ldm7_config::settings;
mod conn;
pub mod limits;
pub mod multicast;
mod prometheus;
pub mod receive;
mod request;
pub mod rtstats;
mod server;
pub mod stats;

pub use conn::ConnectionError;
pub use request::{RequestError, RequestSpec};
pub use server::{Counters, Server, ServerError, ServerOptions, Shared};
