//! Adapters: the ports implemented on concrete backends.
//!
//! Each adapter keeps its backend's types inside its own module.

pub mod embedded;
