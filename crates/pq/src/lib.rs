//! The product queue (placeholder while the implementation lands).
