//! The sans-IO FMTP state machines driven from outside: one test binary (modules by subject).

mod block_run;
mod capture;
mod forged;
mod parity;
mod sink;
mod state_machines;
mod support;
