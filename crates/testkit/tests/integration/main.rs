//! Checks of the workspace as files (architecture, the sans-IO rule): one test binary.

mod architecture;
mod sans_io;
