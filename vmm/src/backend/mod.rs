//! Counting backends that touch the host (single-step decoding, host perf events), the guest
//! debug state they share, and RDPMC emulation.

pub mod debug;
pub mod insn;
pub mod perf;
pub mod perf_attr;
pub mod precise;
pub mod probe;
pub mod rdpmc;
