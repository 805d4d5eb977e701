//! A virtual Intel PMU in user space: MSR file, CPU models, counters, the DS-area walker over a
//! guest-memory trait, PEBS encoders and decoders, and the overflow/PMI decisions.
//!
//! This crate is a pure state machine: no KVM, no ioctls, no threads. The VMM feeds it trapped
//! MSR accesses, counts from a backend and guest memory; unit tests, fuzzers and trace replay
//! feed it the same way.

#![warn(missing_docs)]

pub mod mem;
pub mod model;
pub mod msr;
pub mod state;

pub mod bts;
pub mod ds;
pub mod lbr;
pub mod paging;
pub mod pebs;

pub mod backend;
pub mod counter;
pub mod cpuid;
pub mod netburst;
pub mod pmu;

pub mod fuzz;
pub mod trace;

pub use pmu::{BranchOutcome, MsrError, OverflowOutcome, Vpmu, trapped_msrs};
