//! The monitor (`ldm7 monitor`): the per-minute statistics products of LDM-7 servers and the
//! rtstats of LDM 6 hosts, stored in SQLite or PostgreSQL ([`store`]), from products
//! ([`ingest`]); the JSON API and the dashboard are served from them (docs/monitoring.md).

pub mod api;
pub mod ingest;
pub mod nodes;
pub mod store;

pub use ingest::{IngestCounters, Ingested, ingest};
pub use store::{LinkRow, NodeRow, Store, StoreError};
