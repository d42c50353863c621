//! What an ldm7 site configures, parsed and checked without opening a socket: `ldmd.conf`
//! ([`ldmd`]: ALLOW, ACCEPT, REQUEST, EXEC, INCLUDE, MULTICAST, RECEIVE), `ldm7.toml`
//! ([`settings`]) and the publisher's key files ([`keys`]); the decisions its ALLOW and ACCEPT
//! lines make for a peer ([`access`]). The daemon (`ldm7-server`) acts on
//! them; the fuzz targets and `ldm7 serve --check` need nothing more.

pub mod access;
pub mod hosts;
pub mod keys;
pub mod ldmd;
pub mod settings;
pub mod site;
