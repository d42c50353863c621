//! The ldm7 daemon (`ldm7 serve`): ldmd.conf ([`config`]), access control ([`access`]), the
//! upstream side of accepted connections, REQUEST downstreams, EXEC children, reload and
//! graceful shutdown ([`Server`]). Sessions are the sans-IO state machines of `ldm7-ldm-proto`
//! driven over blocking sockets, one thread per connection (LDM forks a process for each).

pub mod access;
pub mod config;
mod conn;
pub mod log;
pub mod multicast;
pub mod receive;
mod request;
mod server;
pub mod settings;
pub mod wait;

pub use request::RequestSpec;
pub use server::{Counters, Server, ServerError, ServerOptions, Shared};
