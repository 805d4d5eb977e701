//! What each CPU-model preset must look like to the guest, written out by hand from the preset
//! definitions (resources/cpu-models/*.toml) and the SDM field layouts, independently of the
//! vpmu crate's own encoders and mask functions: CPUID leaf 1 / 0xA values are literal, and the
//! writable-bit masks are composed here from the SDM's per-bit rules.

use crate::msr_index::*;

/// One preset's guest-visible PMU facts.
#[derive(Debug, Clone, Copy)]
pub struct Preset {
    /// Preset name (the `--cpu-model` argument, passed to the guest as `--cmdline`).
    pub name: &'static str,
    /// NetBurst (ESCR/CCCR) PMU instead of the architectural one.
    pub netburst: bool,
    /// Display family and model (SDM vol. 2A CPUID: family + extended family, extended model
    /// << 4 + model).
    pub family: u32,
    /// Display model.
    pub model: u32,
    /// CPUID.1:EAX & 0x0FFF_3FFF (stepping, model, family, extended model / family).
    pub signature: u32,
    /// CPUID.0AH EAX, EBX, ECX, EDX.
    pub leaf_a: [u32; 4],
    /// CPUID.1:ECX.PDCM (bit 15).
    pub pdcm: bool,
    /// CPUID.1:ECX.DTES64 (bit 2).
    pub dtes64: bool,
    /// CPUID.1:EDX.DS (bit 21).
    pub ds: bool,
    /// IA32_PERF_CAPABILITIES (None: the MSR does not exist, PDCM clear).
    pub perf_caps: Option<u64>,
    /// IA32_MISC_ENABLE bits 7 (perfmon available), 11 (BTS unavailable), 12 (PEBS unavailable).
    pub misc_pmu_bits: u64,
    /// TSX: IN_TX / IN_TXCP in IA32_PERFEVTSELx, RTM_DEBUG in IA32_DEBUGCTL.
    pub tsx: bool,
    /// PERF_CAPABILITIES[14] PEBS baseline: adaptive-record bits in EVTSEL (34) / FIXED_CTR_CTRL.
    pub baseline: bool,
}

/// IA32_MISC_ENABLE bit 7 only: every preset has BTS (bit 11 clear) and PEBS (bit 12 clear).
const MISC_PERFMON_BTS_PEBS: u64 = 0x80;

/// Every preset, in generation order.
pub const PRESETS: &[Preset] = &[
    Preset {
        name: "netburst",
        netburst: true,
        family: 0xF,
        model: 6,
        signature: 0x0000_0F65,
        // No architectural PMU: version 0 and every field zero.
        leaf_a: [0, 0, 0, 0],
        pdcm: false,
        dtes64: true,
        ds: true,
        perf_caps: None,
        misc_pmu_bits: MISC_PERFMON_BTS_PEBS,
        tsx: false,
        baseline: false,
    },
    Preset {
        name: "core2",
        netburst: false,
        family: 6,
        model: 0x17,
        signature: 0x0001_067A,
        // v2, 2 GP x 40 bits, 7 events; 3 fixed x 40 bits.
        leaf_a: [0x0728_0202, 0, 0, 0x0000_0503],
        pdcm: true,
        dtes64: true,
        ds: true,
        // LBR format 1, PEBS trap (6), arch regs (7), PEBS format 0.
        perf_caps: Some(0xC1),
        misc_pmu_bits: MISC_PERFMON_BTS_PEBS,
        tsx: false,
        baseline: false,
    },
    Preset {
        name: "nehalem",
        netburst: false,
        family: 6,
        model: 0x1A,
        signature: 0x0001_06A5,
        // v3, 4 GP x 48 bits, 7 events; 3 fixed x 48 bits.
        leaf_a: [0x0730_0403, 0, 0, 0x0000_0603],
        pdcm: true,
        dtes64: true,
        ds: true,
        // LBR format 3, trap, arch regs, PEBS format 1, SMM freeze (12).
        perf_caps: Some(0x11C3),
        misc_pmu_bits: MISC_PERFMON_BTS_PEBS,
        tsx: false,
        baseline: false,
    },
    Preset {
        name: "haswell",
        netburst: false,
        family: 6,
        model: 0x3C,
        signature: 0x0003_06C3,
        leaf_a: [0x0730_0403, 0, 0, 0x0000_0603],
        pdcm: true,
        dtes64: true,
        ds: true,
        // LBR format 4, trap, arch regs, PEBS format 2, SMM freeze, full-width writes (13).
        perf_caps: Some(0x32C4),
        misc_pmu_bits: MISC_PERFMON_BTS_PEBS,
        tsx: true,
        baseline: false,
    },
    Preset {
        name: "skylake",
        netburst: false,
        family: 6,
        model: 0x55,
        signature: 0x0005_0654,
        // v4, 4 GP x 48 bits, 7 events; 3 fixed x 48 bits.
        leaf_a: [0x0730_0404, 0, 0, 0x0000_0603],
        pdcm: true,
        dtes64: true,
        ds: true,
        // Skylake-SP's real value: LBR format 5, trap, arch regs, PEBS format 3, SMM freeze, FW.
        perf_caps: Some(0x33C5),
        misc_pmu_bits: MISC_PERFMON_BTS_PEBS,
        tsx: true,
        baseline: false,
    },
    Preset {
        name: "icelake-server",
        netburst: false,
        family: 6,
        model: 0x6A,
        signature: 0x0006_06A6,
        // v5, 8 GP x 48 bits, 8 events; fixed bitmap 0xF; 4 fixed x 48 bits, AnyThread
        // deprecated (EDX bit 15).
        leaf_a: [0x0830_0805, 0, 0xF, 0x0000_8604],
        pdcm: true,
        dtes64: true,
        ds: true,
        // LBR format 5, trap, arch regs, PEBS format 4, SMM freeze, FW, baseline (14).
        perf_caps: Some(0x74C5),
        misc_pmu_bits: MISC_PERFMON_BTS_PEBS,
        tsx: true,
        baseline: true,
    },
    Preset {
        name: "sapphire-rapids",
        netburst: false,
        family: 6,
        model: 0x8F,
        signature: 0x0008_06F8,
        leaf_a: [0x0830_0805, 0, 0xF, 0x0000_8604],
        pdcm: true,
        dtes64: true,
        ds: true,
        // As Ice Lake with PEBS format 5.
        perf_caps: Some(0x75C5),
        misc_pmu_bits: MISC_PERFMON_BTS_PEBS,
        tsx: true,
        baseline: true,
    },
];

/// The preset called `name`.
pub fn by_name(name: &str) -> Option<&'static Preset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// `n` low bits set.
pub const fn ones(n: u32) -> u64 {
    if n >= 64 { u64::MAX } else { (1 << n) - 1 }
}

impl Preset {
    /// CPUID.0AH:EAX[7:0].
    pub fn version(&self) -> u32 {
        self.leaf_a[0] & 0xFF
    }

    /// CPUID.0AH:EAX[15:8].
    pub fn num_gp(&self) -> u32 {
        self.leaf_a[0] >> 8 & 0xFF
    }

    /// CPUID.0AH:EAX[23:16].
    pub fn gp_width(&self) -> u32 {
        self.leaf_a[0] >> 16 & 0xFF
    }

    /// CPUID.0AH:EDX[4:0].
    pub fn num_fixed(&self) -> u32 {
        self.leaf_a[3] & 0x1F
    }

    /// CPUID.0AH:EDX[12:5].
    pub fn fixed_width(&self) -> u32 {
        self.leaf_a[3] >> 5 & 0xFF
    }

    /// Fixed counter `i` exists (SDM 18.2.5.1: `i < EDX[4:0]` or ECX bit i on v5).
    pub fn has_fixed(&self, i: u32) -> bool {
        i < self.num_fixed() || (self.version() >= 5 && i < 32 && self.leaf_a[2] >> i & 1 == 1)
    }

    /// Bitmap of the fixed counters.
    pub fn fixed_bits(&self) -> u64 {
        (0..4)
            .filter(|&i| self.has_fixed(i))
            .fold(0, |m, i| m | 1 << i)
    }

    /// IA32_PERF_GLOBAL_* counter bits: PMCn at n, FIXED_CTRi at 32 + i.
    pub fn counter_bits(&self) -> u64 {
        ones(self.num_gp()) | self.fixed_bits() << 32
    }

    /// The ANY bits are writable: v3+ (SDM 18.2.3) unless CPUID.0AH:EDX[15] deprecates them.
    pub fn any_thread(&self) -> bool {
        self.version() >= 3 && self.leaf_a[3] & 1 << 15 == 0
    }

    /// PERF_CAPABILITIES bit `b`.
    fn cap(&self, b: u32) -> bool {
        self.perf_caps.is_some_and(|c| c >> b & 1 == 1)
    }

    /// Full-width writes through IA32_A_PMCx (PERF_CAPABILITIES[13]).
    pub fn fw_write(&self) -> bool {
        self.cap(13)
    }

    /// IA32_DEBUGCTL.FREEZE_WHILE_SMM supported (PERF_CAPABILITIES[12]).
    pub fn smm_freeze(&self) -> bool {
        self.cap(12)
    }

    /// Writable bits of IA32_PERFEVTSELn (SDM Figure 18-6): bits 31:0 (ANY only where
    /// [`Preset::any_thread`]); IN_TX (32) with TSX, IN_TXCP (33) on PERFEVTSEL2 only (SDM
    /// 18.3.6.5.1); Adaptive_Record (34) with PEBS baseline (SDM 18.9.2.3).
    pub fn evtsel_writable(&self, n: u32) -> u64 {
        let mut m = ones(32);
        if !self.any_thread() {
            m &= !(1 << 21);
        }
        if self.tsx {
            m |= 1 << 32;
            if n == 2 {
                m |= 1 << 33;
            }
        }
        if self.baseline {
            m |= 1 << 34;
        }
        m
    }

    /// Writable bits of IA32_FIXED_CTR_CTRL (SDM Figure 18-7/18-8): per existing counter i,
    /// EN_OS (4i), EN_USR (4i+1), ANY (4i+2, v3+ unless deprecated), PMI (4i+3); with PEBS
    /// baseline FCi_Adaptive_Record at 32 + 4i.
    pub fn fixed_ctrl_writable(&self) -> u64 {
        let field = if self.any_thread() { 0xF } else { 0xB };
        (0..4u32).filter(|&i| self.has_fixed(i)).fold(0, |m, i| {
            let adaptive = if self.baseline { 1 << (32 + 4 * i) } else { 0 };
            m | field << (4 * i) | adaptive
        })
    }

    /// Bits IA32_PERF_GLOBAL_OVF_CTRL / STATUS_RESET clears (SDM vol. 4 table 2-2): the
    /// counters, OvfBuf (62), CondChgd (63); v4+ also LBR_Frz (58), CTR_Frz (59), ASCI (60) and
    /// Ovf_Uncore (61). Bit 55 (Trace_ToPA_PMI) needs Intel PT, which no preset has.
    pub fn status_reset_writable(&self) -> u64 {
        let mut m = self.counter_bits() | 3 << 62;
        if self.version() >= 4 {
            m |= 0xF << 58;
        }
        m
    }

    /// Bits IA32_PERF_GLOBAL_STATUS_SET (v4+) sets: as STATUS_RESET without CondChgd (63 is
    /// reserved there).
    pub fn status_set_writable(&self) -> u64 {
        self.status_reset_writable() & !(1 << 63)
    }
}

/// IA32_PERFEVTSELx event select / umask of the architectural events (SDM table 18-1).
pub mod event {
    /// UnHalted Core Cycles.
    pub const CORE_CYCLES: u64 = 0x3C;
    /// Instructions Retired.
    pub const INSTRUCTIONS: u64 = 0xC0;
    /// Branch Instructions Retired.
    pub const BRANCHES: u64 = 0xC4;
}

/// The PMU-relevant bits of IA32_MISC_ENABLE.
pub const MISC_PMU_MASK: u64 =
    MISC_ENABLE_PERF_MON_AVAILABLE | MISC_ENABLE_BTS_UNAVAILABLE | MISC_ENABLE_PEBS_UNAVAILABLE;
