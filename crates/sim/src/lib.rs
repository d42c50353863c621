//! Deterministic network simulator for the sans-IO FMTP state machines.
