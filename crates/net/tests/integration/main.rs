//! Path services and lab specifications without root: one test binary (the namespace lab tests are `lab`, in the lab lane of scripts/test-all).

mod oess;
mod specs;
