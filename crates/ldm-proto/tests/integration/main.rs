//! The sans-IO LDM-6 and LDM-7 sessions driven from outside: one test binary (modules by subject).

mod downstream7;
mod sessions;
mod v7;
mod virtual_time;
