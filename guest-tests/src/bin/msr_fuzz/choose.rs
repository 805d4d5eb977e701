//! Seeded choices: the PRNG, the MSR candidate lists (weighted towards the interesting ones)
//! and value generation (random bits, within / just outside the writable mask, edge values).

use crate::model::{DEBUGCTL_UNDECIDED, Kind, Model};
use guest_tests::msr_index::*;
use guest_tests::pmu::expect::{MISC_PMU_MASK, ones};

/// splitmix64: every seed (0 included) gives a full-period, well-mixed stream.
pub struct Rng(u64);

impl Rng {
    /// Generator for `seed`.
    pub const fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// Next value.
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        let n64 = u64::try_from(n.max(1)).unwrap_or(u64::MAX);
        usize::try_from(self.next() % n64).unwrap_or(0)
    }

    /// True with probability `pct` percent.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }
}

/// Candidate lists (fixed capacity, no allocator).
pub struct Candidates {
    present: [u32; 512],
    n_present: usize,
    key: [u32; 32],
    n_key: usize,
    absent: [u32; 256],
    n_absent: usize,
}

/// Indices outside every range the VMM traps (vmm traps 40-43, 60-63, C1-C8, 186-18D, 1A0-1D9,
/// 300-3F2, 3F6-3F7, 4C1-4C8, 600, 680-69F, 6C0-6DF, DC0-DDF for every preset), one step
/// beyond each edge, that name no MSR of any preset in vol. 4 and so must #GP. Left out:
/// 2FFH (IA32_MTRR_DEF_TYPE), 6E0H (IA32_TSC_DEADLINE), 3F8H (MSR_PKG_C3_RESIDENCY) and 1DAH
/// (NetBurst MSR_LASTBRANCH_TOS: real but not in the netburst preset) — real MSRs.
const OUTSIDE: &[u32] = &[
    0x44, 0x5F, 0x64, 0xC0, 0xC9, 0x185, 0x18E, 0x3F3, 0x3F5, 0x4C0, 0x4C9, 0x5FF, 0x601, 0x67F,
    0x6BF, 0xDBF, 0xDE0,
];

/// Absent indices inside the trapped PMU blocks worth probing (those no preset names are
/// absent on every preset; the model decides per preset for the rest).
fn in_block_probes() -> impl Iterator<Item = u32> {
    (IA32_PMC0..IA32_PMC0 + 8)
        .chain(IA32_PERFEVTSEL0..IA32_PERFEVTSEL0 + 8)
        .chain(IA32_A_PMC0..IA32_A_PMC0 + 8)
        .chain(0x300..0x312)
        .chain(0x312..0x320)
        .chain(0x340..0x348)
        .chain(0x360..0x372)
        .chain(0x38D..0x394)
        .chain(0x3A0..0x3E2)
        .chain(0x3E2..0x3F0)
        .chain(0x3F1..0x3F3)
        .chain([0x3F6, 0x3F7, 0x600, 0x1C8, 0x1C9, 0x1D9])
        .chain(0x40..0x44)
        .chain(0x60..0x64)
        .chain(0x680..0x6A0)
        .chain(0x6C0..0x6E0)
        .chain(0xDC0..0xDE0)
}

/// Real MSRs of a family 0FH model 3+ part (vol. 4 table 2-43) that the netburst preset leaves
/// out: the 16-entry LBR stack at 680H/6C0H (the preset has no LBRs); MSR_TC_PRECISE_EVENT
/// (3F0H) is not probed at all. Neither is probed.
fn netburst_unmodelled(i: u32) -> bool {
    (0x680..0x690).contains(&i) || (0x6C0..0x6D0).contains(&i)
}

impl Candidates {
    /// Build the lists for the model's preset.
    pub fn new(m: &Model) -> Self {
        let mut c = Self {
            present: [0; 512],
            n_present: 0,
            key: [0; 32],
            n_key: 0,
            absent: [0; 256],
            n_absent: 0,
        };
        for i in in_block_probes() {
            let present = m.kind(i) != Kind::Absent;
            if !present && m.p.netburst && netburst_unmodelled(i) {
                continue;
            }
            if present && !c.present[..c.n_present].contains(&i) && c.n_present < c.present.len() {
                c.present[c.n_present] = i;
                c.n_present += 1;
            } else if !present
                && !c.absent[..c.n_absent].contains(&i)
                && c.n_absent < c.absent.len()
            {
                c.absent[c.n_absent] = i;
                c.n_absent += 1;
            }
        }
        for &i in OUTSIDE {
            if c.n_absent < c.absent.len() {
                c.absent[c.n_absent] = i;
                c.n_absent += 1;
            }
        }
        let keys = [
            IA32_PERF_GLOBAL_CTRL,
            IA32_PERF_GLOBAL_STATUS,
            IA32_PERF_GLOBAL_OVF_CTRL,
            IA32_PERF_GLOBAL_STATUS_SET,
            IA32_PERF_GLOBAL_INUSE,
            IA32_FIXED_CTR_CTRL,
            IA32_PERF_CAPABILITIES,
            IA32_DEBUGCTL,
            IA32_MISC_ENABLE,
            IA32_DS_AREA,
            IA32_PEBS_ENABLE,
            MSR_PEBS_DATA_CFG,
            MSR_PEBS_LD_LAT_THRESHOLD,
            MSR_PEBS_FRONTEND,
            MSR_LASTBRANCH_TOS,
            MSR_LBR_SELECT,
            IA32_PMC0,
            IA32_PERFEVTSEL0,
            IA32_A_PMC0,
            IA32_FIXED_CTR0,
            MSR_IQ_COUNTER4,
            MSR_IQ_CCCR4,
            MSR_CRU_ESCR0,
        ];
        for k in keys {
            if c.n_key < c.key.len() {
                c.key[c.n_key] = k;
                c.n_key += 1;
            }
        }
        c
    }

    /// Number of present and absent candidates.
    pub fn sizes(&self) -> (usize, usize) {
        (self.n_present, self.n_absent)
    }

    /// Pick an MSR: 55% any present one, 30% a key register (present or not), 15% an absent
    /// one (inside a trapped block or just outside).
    pub fn pick(&self, rng: &mut Rng) -> u32 {
        let r = rng.below(100);
        if r < 55 && self.n_present > 0 {
            self.present[rng.below(self.n_present)]
        } else if r < 85 {
            self.key[rng.below(self.n_key)]
        } else {
            self.absent[rng.below(self.n_absent)]
        }
    }
}

/// A value to write to `msr` whose model value is `cur`.
pub fn value(m: &Model, msr: u32, cur: u64, rng: &mut Rng) -> u64 {
    let mask = m.writable(msr);
    let v = match m.kind(msr) {
        // Only the read-only PMU bits are flipped: the rest of MISC_ENABLE controls the CPU.
        Kind::MiscEnable => return m.misc() ^ (rng.next() & MISC_PMU_MASK),
        _ => match rng.below(10) {
            0 => rng.next(),
            1..=3 => rng.next() & mask,
            4 => (rng.next() & mask) | 1 << rng.below(64),
            5 => cur ^ 1 << rng.below(64),
            6 => mask,
            7 => rng.next() & mask & ones(u32::try_from(rng.below(65)).unwrap_or(64)),
            _ => edge(rng),
        },
    };
    if msr == IA32_DEBUGCTL {
        v & !DEBUGCTL_UNDECIDED
    } else {
        v
    }
}

fn edge(rng: &mut Rng) -> u64 {
    const EDGES: [u64; 16] = [
        0,
        1,
        u64::MAX,
        1 << 63,
        0x7FFF_FFFF,
        0x8000_0000,
        0xFFFF_FFFF,
        0x1_0000_0000,
        0xFF_FFFF_FFFF,
        0x100_0000_0000,
        0xFFFF_FFFF_FFFF,
        0x1_0000_0000_0000,
        0x0000_7FFF_FFFF_FFFF,
        0x0000_8000_0000_0000,
        0xFFFF_8000_0000_0000,
        0xFFFF_7FFF_FFFF_FFFF,
    ];
    EDGES[rng.below(EDGES.len())]
}

/// Every present candidate and key register (for the reset-value pass).
pub fn all_candidates(c: &Candidates) -> impl Iterator<Item = u32> + '_ {
    c.present[..c.n_present]
        .iter()
        .chain(c.key[..c.n_key].iter())
        .copied()
}
