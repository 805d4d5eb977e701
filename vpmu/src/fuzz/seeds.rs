//! Seed inputs for the fuzz targets, built with small encoders that mirror the decoders, so the
//! seeds stay meaningful when the input format changes. The committed corpus under
//! `fuzz/corpus/<target>/` is written from these by the ignored test
//! `fuzz_corpus::regenerate_corpus`; `fuzz_corpus` also runs them directly.

use crate::counter::CounterId;
use crate::model::{CpuModel, PRESET_NAMES};
use crate::msr::*;

use super::guest::{DS_AREA, PEBS_BASE};

/// Builds a binary `msr_traps` input.
#[derive(Debug, Clone)]
pub struct MsrOps {
    bytes: Vec<u8>,
    num_gp: u8,
}

impl MsrOps {
    /// A sequence on preset `model` (a name from [`PRESET_NAMES`]).
    pub fn new(model: &str) -> Self {
        let idx = PRESET_NAMES.iter().position(|n| *n == model).unwrap_or(0);
        let num_gp = CpuModel::preset(model).map_or(0, |m| m.num_gp);
        Self {
            bytes: vec![u8::try_from(idx).unwrap_or(0)],
            num_gp,
        }
    }

    fn raw_value(&mut self, v: u64) {
        self.bytes.push(5);
        self.bytes.extend(v.to_le_bytes());
    }

    fn raw_msr(&mut self, index: u32) {
        self.bytes.push(250);
        self.bytes.extend(index.to_le_bytes());
    }

    fn counter(&mut self, id: CounterId) {
        let idx = match id {
            CounterId::Gp(n) | CounterId::Netburst(n) => u16::from(n),
            CounterId::Fixed(i) => u16::from(self.num_gp) + u16::from(i),
        };
        self.bytes.push(0);
        self.bytes.extend(idx.to_le_bytes());
    }

    /// RDMSR `index`.
    pub fn rdmsr(mut self, index: u32) -> Self {
        self.bytes.push(0);
        self.raw_msr(index);
        self
    }

    /// WRMSR `index`, `value` (unmasked).
    pub fn wrmsr(mut self, index: u32, value: u64) -> Self {
        self.bytes.push(1);
        self.raw_msr(index);
        self.raw_value(value);
        self.bytes.push(0);
        self
    }

    /// RDPMC with `ecx`.
    pub fn rdpmc(mut self, ecx: u32) -> Self {
        self.bytes.extend([3, 2]);
        self.bytes.extend(ecx.to_le_bytes());
        self
    }

    /// Advances `id` to `k` events past its wrap (negative: before it), then handles overflows.
    pub fn to_wrap(mut self, id: CounterId, k: i8) -> Self {
        self.bytes.extend([4, 0]);
        self.counter(id);
        self.bytes.extend([1, k.to_le_bytes()[0]]);
        self
    }

    /// Advances `id` by `delta`, then handles overflows.
    pub fn count(mut self, id: CounterId, delta: u64) -> Self {
        self.bytes.extend([4, 0]);
        self.counter(id);
        self.bytes.push(0);
        self.raw_value(delta);
        self
    }

    /// `handle_overflow` for `ids` directly (1 to 3 counters).
    pub fn overflow(mut self, ids: &[CounterId]) -> Self {
        let n = u8::try_from(ids.len().clamp(1, 3) - 1).unwrap_or(0);
        self.bytes.extend([6, n]);
        for &id in ids.iter().take(3) {
            self.counter(id);
        }
        self
    }

    /// Paging mode `mode`: 0 off, 1 32-bit, 2 PAE, 3 4-level, 4 5-level.
    pub fn paging(mut self, mode: u8) -> Self {
        self.bytes.extend([7, mode % 5]);
        self
    }

    /// A guest store of `value` at physical `gpa` (below the RAM size).
    pub fn store(mut self, gpa: u64, value: u64) -> Self {
        self.bytes.extend([8, 3]);
        self.bytes
            .extend(u32::try_from(gpa).unwrap_or(0).to_le_bytes());
        self.bytes.extend([1, 5]);
        self.raw_value(value);
        self
    }

    /// Takes the PMI request.
    pub fn take_pmi(mut self) -> Self {
        self.bytes.extend([8, 0, 0, 0]);
        self
    }

    /// The input bytes.
    pub fn build(self) -> Vec<u8> {
        self.bytes
    }
}

const EN_USR_OS: u64 = EVTSEL_EN | EVTSEL_USR | EVTSEL_OS;
const INST_RETIRED: u64 = 0xC0;

/// A hand-written trace (Skylake): counting, an overflow with a PMI, a refused write.
pub const SKYLAKE_TRACE: &str = "# vpmu-trace v1 model=skylake vcpu=0
rdmsr 0x38f -> 0xf
wrmsr 0x186 0x5300c0 -> ok
wrmsr 0xc1 0xfffffff0 -> ok
rdmsr 0xc1 -> 0xfffffffffff0
wrmsr 0x38e 0x1 -> #GP
wrmsr 0x186 0x10000000000 -> #GP
count gp0:0x20 -> wrapped gp0
overflow gp0 rip=0x401000 -> pmi=1 records=0 pebs=0x0 status=0x1 values=gp0:0x10 dropped=-
pmi delivered
rdmsr 0x38e -> 0x1
wrmsr 0x390 0x1 -> ok
rdmsr 0x38e -> 0x0
rdpmc 0x0 -> 0x10
rdpmc 0x40000005 -> #GP
";

/// Seeds of `msr_traps`: (file name, bytes).
pub fn msr_traps_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let gp0 = CounterId::Gp(0);
    let fixed0 = CounterId::Fixed(0);
    let ds = |m: &str| MsrOps::new(m).wrmsr(IA32_DS_AREA, DS_AREA);
    vec![
        (
            "skylake-pmi",
            ds("skylake")
                .wrmsr(IA32_PERFEVTSEL0, EN_USR_OS | EVTSEL_INT | INST_RETIRED)
                .wrmsr(IA32_PMC0, 0xFFFF_FF00)
                .to_wrap(gp0, 0)
                .take_pmi()
                .rdmsr(IA32_PERF_GLOBAL_STATUS)
                .wrmsr(IA32_PERF_GLOBAL_OVF_CTRL, 1)
                .rdpmc(0)
                .build(),
        ),
        (
            "skylake-pebs",
            ds("skylake")
                .paging(3)
                .wrmsr(IA32_PEBS_ENABLE, 1)
                .wrmsr(IA32_PERFEVTSEL0, EN_USR_OS | INST_RETIRED)
                .store(DS_AREA + 0x40, 0xFFFF_FFFF_FF00)
                .to_wrap(gp0, 3)
                .to_wrap(gp0, 0)
                .store(DS_AREA + 0x38, PEBS_BASE)
                .to_wrap(gp0, 1)
                .take_pmi()
                .build(),
        ),
        (
            "icelake-adaptive",
            ds("icelake-server")
                .paging(4)
                .wrmsr(MSR_PEBS_DATA_CFG, 0xF | 3 << 24)
                .wrmsr(IA32_PEBS_ENABLE, 1 | 1 << 32)
                .wrmsr(IA32_FIXED_CTR_CTRL, 0x3 | 1 << 32)
                .wrmsr(IA32_PERF_GLOBAL_CTRL, 0xF | 0xF << 32)
                .wrmsr(IA32_PERFEVTSEL0, EN_USR_OS | EVTSEL_ADAPTIVE | 0x1C0)
                .to_wrap(fixed0, 0)
                .to_wrap(gp0, 2)
                .store(DS_AREA + 0x30, PEBS_BASE + 0x100)
                .to_wrap(gp0, 0)
                .build(),
        ),
        (
            "sapphire-freeze",
            ds("sapphire-rapids")
                .wrmsr(
                    IA32_DEBUGCTL,
                    DEBUGCTL_FREEZE_PERFMON_ON_PMI | DEBUGCTL_FREEZE_LBRS_ON_PMI,
                )
                .wrmsr(IA32_FIXED_CTR_CTRL, 0xB)
                .wrmsr(IA32_PERF_GLOBAL_CTRL, 1 << 32)
                .to_wrap(fixed0, 0)
                .count(fixed0, 5)
                .wrmsr(IA32_PERF_GLOBAL_STATUS_SET, 1 << 62)
                .wrmsr(IA32_PERF_GLOBAL_OVF_CTRL, u64::MAX)
                .wrmsr(IA32_PERF_GLOBAL_OVF_CTRL, 0xF << 58 | 3 << 62 | 1)
                .take_pmi()
                .build(),
        ),
        (
            // Format 3 records are 0xC8 bytes: one fits exactly, the next misses by 8 bytes.
            "skylake-buffer-edge",
            ds("skylake")
                .wrmsr(IA32_PEBS_ENABLE, 1)
                .wrmsr(IA32_PERFEVTSEL0, EN_USR_OS | INST_RETIRED)
                .store(DS_AREA + 0x30, PEBS_BASE + 0xC8)
                .store(DS_AREA + 0x38, PEBS_BASE + 0xC8)
                .to_wrap(gp0, 0)
                .take_pmi()
                .store(DS_AREA + 0x28, PEBS_BASE + 8)
                .to_wrap(gp0, 0)
                .build(),
        ),
        (
            "core2-v2-freeze",
            ds("core2")
                .paging(1)
                .wrmsr(IA32_DEBUGCTL, DEBUGCTL_FREEZE_PERFMON_ON_PMI)
                .wrmsr(IA32_PEBS_ENABLE, 1)
                .wrmsr(IA32_PERFEVTSEL0, EN_USR_OS | EVTSEL_INT | INST_RETIRED)
                .to_wrap(gp0, 0)
                .rdmsr(IA32_PERF_GLOBAL_CTRL)
                .build(),
        ),
        (
            "nehalem-pae-reserved",
            ds("nehalem")
                .paging(2)
                .wrmsr(IA32_PERFEVTSEL0, 1 << 40)
                .wrmsr(IA32_PERF_GLOBAL_CTRL, 1 << 40)
                .wrmsr(IA32_DS_AREA, 0x0000_8000_0000_0000)
                .wrmsr(IA32_PEBS_ENABLE, 1 << 32 | 1)
                .wrmsr(IA32_PERFEVTSEL0, EN_USR_OS | INST_RETIRED)
                .store(DS_AREA + 0x28, PEBS_BASE - 8)
                .to_wrap(gp0, 0)
                .build(),
        ),
        (
            "haswell-ds-moved",
            ds("haswell")
                .paging(3)
                .wrmsr(IA32_DS_AREA, 0xFFFF_8000_0000_C000)
                .wrmsr(IA32_PEBS_ENABLE, 0b11)
                .wrmsr(IA32_PERFEVTSEL0 + 1, EN_USR_OS | INST_RETIRED)
                .to_wrap(CounterId::Gp(1), 0)
                .store(0x5000 + 0xC * 8, 0)
                .to_wrap(CounterId::Gp(1), 0)
                .build(),
        ),
        (
            "netburst-iq4",
            ds("netburst")
                .wrmsr(IA32_PEBS_ENABLE, NETBURST_PEBS_ENABLE_BIT | 1)
                .wrmsr(MSR_CRU_ESCR0, 2 << 25 | 1 << 9 | ESCR_T0_OS | ESCR_T0_USR)
                .wrmsr(
                    MSR_IQ_CCCR4,
                    CCCR_ENABLE | 4 << 13 | 3 << 16 | CCCR_OVF_PMI_T0,
                )
                .to_wrap(CounterId::Netburst(16), 0)
                .take_pmi()
                .rdmsr(MSR_IQ_CCCR4)
                .build(),
        ),
        ("skylake-trace", SKYLAKE_TRACE.as_bytes().to_vec()),
    ]
}

/// Seeds of `pebs_records`: one per format, a few adaptive group sets.
pub fn pebs_records_seeds() -> Vec<(&'static str, Vec<u8>)> {
    let names = ["netburst", "fmt0", "fmt1", "fmt2", "fmt3", "fmt4", "fmt5"];
    let mut out = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let mut b = vec![2, u8::try_from(i).unwrap_or(0)];
        // Adaptive: a raw record-format quadword with every group and 4 LBRs.
        b.push(5);
        b.extend((0xFu64 | 3 << 24).to_le_bytes());
        b.extend((0u8..=255).map(|x| x.wrapping_mul(37)));
        out.push((*name, b));
    }
    out
}

/// Seeds of `page_walk`: each paging mode with entries pointing into RAM.
pub fn page_walk_seeds() -> Vec<(&'static str, Vec<u8>)> {
    // mode bits: 1 PG, 2 PAE, 4 LMA, 8 LA57, 16 PSE, 32 NXE, 64 WP.
    let modes: [(&str, u8); 6] = [
        ("off", 0),
        ("bits32-pse", 1 | 16 | 64),
        ("pae", 1 | 2 | 32 | 64),
        ("level4", 1 | 2 | 4 | 32 | 64),
        ("level5", 1 | 2 | 4 | 8 | 64),
        ("level4-nonx", 1 | 2 | 4),
    ];
    modes
        .iter()
        .map(|&(name, mode)| {
            // CR3 page 1, MAXPHYADDR 46, 6 entries chaining pages 1 -> 2 -> 3 -> 4 -> 5.
            let mut b = vec![mode, 1, 0, 0, 46, 6];
            for (page, target) in [(1u8, 2u8), (2, 3), (3, 4), (4, 5), (5, 6), (6, 7)] {
                b.extend([page, 0, 0, 0x3, 0x00, 0, target, 0]);
            }
            b.extend([0, 0x34, 0x12, 0, 0, 1, 0, 0x10, 0, 0, 3]);
            b.extend(0xFFFF_FFFF_FFFF_F000u64.to_le_bytes());
            (name, b)
        })
        .collect()
}

/// Physical (and identity-mapped linear) address of the fuzz guest's DS area, for tests that
/// build their own PEBS set-ups on a [`super::FuzzGuest`].
pub const DS_PHYS_FOR_TESTS: u64 = DS_AREA;
