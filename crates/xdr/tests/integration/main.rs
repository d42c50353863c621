//! The XDR and RPC codecs against captures and properties: one test binary (modules by subject).

mod captures;
mod ldm7;
mod properties;
