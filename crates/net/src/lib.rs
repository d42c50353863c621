//! Path services, host configuration and the namespace lab.
