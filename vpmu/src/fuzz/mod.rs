//! Fuzz targets over the pure vPMU, as library code: the cargo-fuzz crate in `fuzz/` calls these
//! functions from libFuzzer, and `vpmu/tests/fuzz_corpus.rs` runs them on stable over the
//! committed corpus and a few thousand deterministic pseudo-random inputs.
//!
//! Every target accepts any byte string and panics (with `assert!`) only when an invariant of
//! the vPMU is violated:
//! - [`msr_traps`]: sequences of MSR traps, counter progress, overflows, paging changes and
//!   guest writes into the DS area against an in-memory guest; see that module for the exact
//!   invariants. A `vpmu-trace` text file ([`crate::trace`]) is accepted as an input too.
//! - [`pebs_records`]: encode then decode every PEBS format and adaptive configuration.
//! - [`page_walk`]: the page walker against an independent reference walker.
//!
//! Inputs are decoded by hand ([`Bytes`]) rather than with `arbitrary`: the decoder is total
//! (an exhausted input reads as zeros) and small.

use std::sync::OnceLock;

use crate::model::{CpuModel, PRESET_NAMES};

mod guest;
mod msr_traps;
mod page_walk;
mod pebs_records;
mod reference;
pub mod seeds;

pub use guest::{FuzzGuest, RecordingMemory, WriteLog};
pub use msr_traps::msr_traps;
pub use page_walk::page_walk;
pub use pebs_records::pebs_records;
pub use reference::{RefError, RefTranslation, reference_translate};

/// The preset models, parsed once (parsing TOML per input would dominate the run time).
pub fn presets() -> &'static [CpuModel] {
    static PRESETS: OnceLock<Vec<CpuModel>> = OnceLock::new();
    PRESETS.get_or_init(|| {
        PRESET_NAMES
            .iter()
            .filter_map(|n| CpuModel::preset(n).ok())
            .collect()
    })
}

/// A total reader over fuzz input bytes: reads past the end yield zeros, so every byte string
/// decodes to some operation sequence.
#[derive(Debug, Clone)]
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    /// A reader at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }

    /// No bytes left.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// Bytes consumed so far (may exceed the input length once reads ran past its end).
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The next byte (0 past the end).
    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos = self.pos.saturating_add(1);
        b
    }

    /// A little-endian u16.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// A little-endian u32.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// A little-endian u64.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | u64::from(self.u32()) << 32
    }

    /// A u64 drawn from a mix of shapes fuzzers find boundaries with: small, all-ones, a single
    /// bit, near a power of two, or raw.
    pub fn value(&mut self) -> u64 {
        match self.u8() % 6 {
            0 => u64::from(self.u8()),
            1 => u64::MAX >> (self.u8() % 64),
            2 => 1u64 << (self.u8() % 64),
            3 => (1u64 << (self.u8() % 64)).wrapping_sub(u64::from(self.u8() % 4)),
            4 => u64::from(self.u32()),
            _ => self.u64(),
        }
    }

    /// An index below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            usize::from(self.u16()) % n
        }
    }
}

/// A small deterministic PRNG (xorshift64*) for generating inputs in tests.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    /// The next pseudo-random u64.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0.max(1);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// `len` pseudo-random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64().to_le_bytes()[0]).collect()
    }
}
