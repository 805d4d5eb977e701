//! PEBS record layouts per format, written from the SDM and Linux's `ds.c` structs (not from
//! the vpmu crate): NetBurst / format 0 (SDM Figure 17-10, `pebs_record_core`), format 1 (SDM
//! Table 18-23, `pebs_record_nhm`), format 2 (Table 18-44, `pebs_record_hsw`), format 3 (Table
//! 18-55, `pebs_record_skl`), formats 4/5 (SDM 18.9.2.2 adaptive PEBS, `pebs_basic`,
//! `pebs_meminfo`, `pebs_gprs`, `pebs_xmm`, `lbr_entry`); and what each preset uses.

/// PEBS record format (IA32_PERF_CAPABILITIES[11:8]; NetBurst has no such MSR).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fmt {
    /// Pentium 4: MSR_IQ_COUNTER4, 64-bit record of RFLAGS, RIP, RAX-R15.
    Netburst,
    /// Core 2.
    F0,
    /// Nehalem.
    F1,
    /// Haswell.
    F2,
    /// Skylake.
    F3,
    /// Ice Lake (adaptive).
    F4,
    /// Sapphire Rapids (adaptive, fixed-counter reset slots at 32 + i).
    F5,
}

/// One preset's PEBS facts, written out by hand from resources/cpu-models/*.toml.
#[derive(Clone, Copy, Debug)]
pub struct PebsPreset {
    /// `--cpu-model` name.
    pub name: &'static str,
    /// Record format.
    pub fmt: Fmt,
    /// PERF_CAPABILITIES[6] PEBS trap: the record's IP is the instruction after the one that
    /// caused the assist (SDM 18.6.2.4). NetBurst documents no such bit; the preset is
    /// fault-like (IP = the eventing instruction).
    pub trap: bool,
    /// Width of the PEBS counter (PMC0 / IQ_COUNTER4; fixed counters have the same width).
    pub width: u32,
    /// IA32_PERF_GLOBAL_CTRL / STATUS exist (architectural PMU version >= 2).
    pub global: bool,
    /// Architectural PMU version (0 for NetBurst).
    pub version: u32,
    /// PEBS baseline (PERF_CAPABILITIES[14]): adaptive records, PEBS on fixed counters.
    pub baseline: bool,
    /// MSR_PEBS_LD_LAT_THRESHOLD exists.
    pub ld_lat: bool,
    /// LBR stack depth.
    pub lbr_depth: u32,
}

/// Every preset.
pub const PRESETS: &[PebsPreset] = &[
    PebsPreset {
        name: "netburst",
        fmt: Fmt::Netburst,
        trap: false,
        width: 40,
        global: false,
        version: 0,
        baseline: false,
        ld_lat: false,
        lbr_depth: 0,
    },
    PebsPreset {
        name: "core2",
        fmt: Fmt::F0,
        trap: true,
        width: 40,
        global: true,
        version: 2,
        baseline: false,
        ld_lat: false,
        lbr_depth: 4,
    },
    PebsPreset {
        name: "nehalem",
        fmt: Fmt::F1,
        trap: true,
        width: 48,
        global: true,
        version: 3,
        baseline: false,
        ld_lat: true,
        lbr_depth: 16,
    },
    PebsPreset {
        name: "haswell",
        fmt: Fmt::F2,
        trap: true,
        width: 48,
        global: true,
        version: 3,
        baseline: false,
        ld_lat: true,
        lbr_depth: 16,
    },
    PebsPreset {
        name: "skylake",
        fmt: Fmt::F3,
        trap: true,
        width: 48,
        global: true,
        version: 4,
        baseline: false,
        ld_lat: true,
        lbr_depth: 32,
    },
    PebsPreset {
        name: "icelake-server",
        fmt: Fmt::F4,
        trap: true,
        width: 48,
        global: true,
        version: 5,
        baseline: true,
        ld_lat: true,
        lbr_depth: 32,
    },
    PebsPreset {
        name: "sapphire-rapids",
        fmt: Fmt::F5,
        trap: true,
        width: 48,
        global: true,
        version: 5,
        baseline: true,
        ld_lat: true,
        lbr_depth: 32,
    },
];

/// The preset called `name`.
pub fn preset(name: &str) -> Option<&'static PebsPreset> {
    PRESETS.iter().find(|p| p.name == name)
}

/// The preset using record format `fmt` (every preset has a distinct format).
pub fn preset_for(fmt: Fmt) -> Option<&'static PebsPreset> {
    PRESETS.iter().find(|p| p.fmt == fmt)
}

/// The format of the CPU we run on: NetBurst by CPUID family 0FH, otherwise
/// IA32_PERF_CAPABILITIES[11:8] (format 0 without PDCM).
pub fn detect() -> Option<Fmt> {
    let l1 = crate::cpu::cpuid(1, 0);
    if l1.eax >> 8 & 0xF == 0xF {
        return Some(Fmt::Netburst);
    }
    let caps = if l1.ecx & crate::cpu::CPUID1_ECX_PDCM != 0 {
        crate::msr::rdmsr_safe(crate::msr_index::IA32_PERF_CAPABILITIES).ok()?
    } else {
        0
    };
    [Fmt::F0, Fmt::F1, Fmt::F2, Fmt::F3, Fmt::F4, Fmt::F5]
        .into_iter()
        .find(|f| f.cap_value() == Some(caps >> 8 & 0xF))
}

impl Fmt {
    /// PERF_CAPABILITIES[11:8] (None for NetBurst).
    pub fn cap_value(self) -> Option<u64> {
        match self {
            Fmt::Netburst => None,
            Fmt::F0 => Some(0),
            Fmt::F1 => Some(1),
            Fmt::F2 => Some(2),
            Fmt::F3 => Some(3),
            Fmt::F4 => Some(4),
            Fmt::F5 => Some(5),
        }
    }

    /// Adaptive (basic group + optional groups).
    pub fn adaptive(self) -> bool {
        matches!(self, Fmt::F4 | Fmt::F5)
    }

    /// Size of a fixed-layout record, or of an adaptive record with `cfg` (MSR_PEBS_DATA_CFG
    /// as applied: 0 for a basic record).
    pub fn record_size(self, cfg: u64) -> usize {
        match self {
            Fmt::Netburst | Fmt::F0 => 0x90,
            Fmt::F1 => 0xB0,
            Fmt::F2 => 0xC0,
            Fmt::F3 => 0xC8,
            Fmt::F4 | Fmt::F5 => adaptive_size(cfg),
        }
    }

    /// Offset 0x90: IA32_PERF_GLOBAL_STATUS before the assist (formats 1 and 2).
    pub fn has_status(self) -> bool {
        matches!(self, Fmt::F1 | Fmt::F2)
    }

    /// Offset 0x90: applicable counters (format 3).
    pub fn has_applicable_legacy(self) -> bool {
        self == Fmt::F3
    }

    /// Offsets 0x98-0xA8: data linear address, data source, latency (formats 1-3).
    pub fn has_mem_legacy(self) -> bool {
        matches!(self, Fmt::F1 | Fmt::F2 | Fmt::F3)
    }

    /// Offset 0xB0 eventing IP and 0xB8 TSX tuning (formats 2-3).
    pub fn has_real_ip_legacy(self) -> bool {
        matches!(self, Fmt::F2 | Fmt::F3)
    }

    /// Offset 0xC0 TSC (format 3).
    pub fn has_tsc_legacy(self) -> bool {
        self == Fmt::F3
    }

    /// Counter-reset slot of fixed counter `i` (DS + 0x40 + 8 * slot): 8 + i before format 5,
    /// 32 + i from format 5 (Linux `MAX_PEBS_EVENTS_FMT4` / `INTEL_PMC_IDX_FIXED`).
    pub fn fixed_reset_slot(self, i: usize) -> usize {
        if self == Fmt::F5 { 32 + i } else { 8 + i }
    }
}

/// Legacy record (formats 0-3, NetBurst) field offsets.
pub mod legacy {
    /// RFLAGS.
    pub const FLAGS: usize = 0x00;
    /// RIP (trap-like: the instruction after the eventing one).
    pub const IP: usize = 0x08;
    /// Register order from 0x10: RAX, RBX, RCX, RDX, RSI, RDI, RBP, RSP, R8-R15.
    pub const GPRS: usize = 0x10;
    /// Status (fmt1/2) or applicable counters (fmt3).
    pub const STATUS: usize = 0x90;
    /// Data linear address.
    pub const DLA: usize = 0x98;
    /// Data source encoding.
    pub const DSE: usize = 0xA0;
    /// Load latency.
    pub const LAT: usize = 0xA8;
    /// Eventing IP.
    pub const REAL_IP: usize = 0xB0;
    /// TSX tuning.
    pub const TSX: usize = 0xB8;
    /// TSC.
    pub const TSC: usize = 0xC0;
}

/// Adaptive record offsets.
pub mod adaptive {
    /// Basic group: format (DATA_CFG bits 47:0) and record size (63:48).
    pub const FORMAT_SIZE: usize = 0x00;
    /// Basic group: eventing IP.
    pub const IP: usize = 0x08;
    /// Basic group: applicable counters.
    pub const APPLICABLE: usize = 0x10;
    /// Basic group: TSC.
    pub const TSC: usize = 0x18;
    /// Size of the basic group.
    pub const BASIC: usize = 32;
    /// Memory-info group: address, aux (data source), latency, TSX tuning.
    pub const MEMINFO: usize = 32;
    /// GPR group: flags, ip, ax, cx, dx, bx, sp, bp, si, di, r8-r15.
    pub const GPRS: usize = 18 * 8;
    /// XMM group: XMM0-15.
    pub const XMMS: usize = 16 * 16;
    /// One LBR entry: from, to, info.
    pub const LBR_ENTRY: usize = 24;
}

/// MSR_PEBS_DATA_CFG group bits (SDM 18.9.2.2; Linux `PEBS_DATACFG_*`).
pub const CFG_MEMINFO: u64 = 1 << 0;
/// GPRs group.
pub const CFG_GPRS: u64 = 1 << 1;
/// XMMs group.
pub const CFG_XMMS: u64 = 1 << 2;
/// LBR group.
pub const CFG_LBRS: u64 = 1 << 3;
/// LBR entries minus one, bits 31:24.
pub const CFG_LBR_SHIFT: u32 = 24;

/// LBR entries of an adaptive record with `cfg`.
pub fn lbr_entries(cfg: u64) -> usize {
    if cfg & CFG_LBRS == 0 {
        0
    } else {
        usize::from(u8::try_from(cfg >> CFG_LBR_SHIFT & 0xFF).unwrap_or(0)) + 1
    }
}

/// Size of an adaptive record: the basic group plus each selected group.
pub fn adaptive_size(cfg: u64) -> usize {
    let mut s = adaptive::BASIC;
    if cfg & CFG_MEMINFO != 0 {
        s += adaptive::MEMINFO;
    }
    if cfg & CFG_GPRS != 0 {
        s += adaptive::GPRS;
    }
    if cfg & CFG_XMMS != 0 {
        s += adaptive::XMMS;
    }
    s + lbr_entries(cfg) * adaptive::LBR_ENTRY
}

/// Offsets of the groups of an adaptive record with `cfg` (None if absent), in record order:
/// meminfo, GPRs, XMMs, LBRs.
pub fn adaptive_groups(cfg: u64) -> [Option<usize>; 4] {
    let mut at = adaptive::BASIC;
    let mut out = [None; 4];
    let sizes = [
        (CFG_MEMINFO, adaptive::MEMINFO),
        (CFG_GPRS, adaptive::GPRS),
        (CFG_XMMS, adaptive::XMMS),
        (CFG_LBRS, lbr_entries(cfg) * adaptive::LBR_ENTRY),
    ];
    for (slot, (bit, size)) in out.iter_mut().zip(sizes) {
        if cfg & bit != 0 {
            *slot = Some(at);
            at += size;
        }
    }
    out
}
