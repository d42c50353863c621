//! The product queue through its public interface, in one process and across processes: one test binary.

mod processes;
mod queue;
