//! MSR indices and bit fields of the performance-monitoring facility, named as in the Intel SDM
//! (vol. 3B ch. 17-18, vol. 4). Every other module refers to these; none repeats a number.

// ---- Architectural counters (SDM 18.2) ----
/// IA32_PMC0; GP counter n is at `IA32_PMC0 + n`. Writes sign-extend from bit 31.
pub const IA32_PMC0: u32 = 0xC1;
/// IA32_PERFEVTSEL0; the selector of GP counter n is at `IA32_PERFEVTSEL0 + n`.
pub const IA32_PERFEVTSEL0: u32 = 0x186;
/// IA32_A_PMC0: full-width alias of IA32_PMC0 (only with PERF_CAPABILITIES.FW_WRITE).
pub const IA32_A_PMC0: u32 = 0x4C1;
/// IA32_FIXED_CTR0; fixed counter i is at `IA32_FIXED_CTR0 + i`.
pub const IA32_FIXED_CTR0: u32 = 0x309;
/// IA32_FIXED_CTR_CTRL: four bits per fixed counter (+ adaptive bit 32+4i, v5 / fmt4).
pub const IA32_FIXED_CTR_CTRL: u32 = 0x38D;
/// IA32_PERF_GLOBAL_STATUS (read-only).
pub const IA32_PERF_GLOBAL_STATUS: u32 = 0x38E;
/// IA32_PERF_GLOBAL_CTRL.
pub const IA32_PERF_GLOBAL_CTRL: u32 = 0x38F;
/// IA32_PERF_GLOBAL_OVF_CTRL (v2-v3), called IA32_PERF_GLOBAL_STATUS_RESET from v4.
pub const IA32_PERF_GLOBAL_OVF_CTRL: u32 = 0x390;
/// IA32_PERF_GLOBAL_STATUS_SET (v4+).
pub const IA32_PERF_GLOBAL_STATUS_SET: u32 = 0x391;
/// IA32_PERF_GLOBAL_INUSE (v4+).
pub const IA32_PERF_GLOBAL_INUSE: u32 = 0x392;
/// IA32_PERF_CAPABILITIES (read-only; present when CPUID.1:ECX.PDCM).
pub const IA32_PERF_CAPABILITIES: u32 = 0x345;
/// IA32_DEBUGCTL.
pub const IA32_DEBUGCTL: u32 = 0x1D9;
/// IA32_MISC_ENABLE.
pub const IA32_MISC_ENABLE: u32 = 0x1A0;

// ---- DS / PEBS (SDM 17.4.9, 18.4.4, 18.6.2.4, 18.9) ----
/// IA32_DS_AREA: linear address of the DS buffer management area.
pub const IA32_DS_AREA: u32 = 0x600;
/// IA32_PEBS_ENABLE (MSR_PEBS_ENABLE on NetBurst).
pub const IA32_PEBS_ENABLE: u32 = 0x3F1;
/// MSR_PEBS_DATA_CFG (adaptive PEBS, fmt4+).
pub const MSR_PEBS_DATA_CFG: u32 = 0x3F2;
/// MSR_PEBS_LD_LAT_THRESHOLD (Nehalem and later).
pub const MSR_PEBS_LD_LAT_THRESHOLD: u32 = 0x3F6;
/// MSR_PEBS_FRONTEND (Skylake and later).
pub const MSR_PEBS_FRONTEND: u32 = 0x3F7;

// ---- LBR (SDM 17.4.8, 17.5-17.13) ----
/// MSR_LBR_SELECT.
pub const MSR_LBR_SELECT: u32 = 0x1C8;
/// MSR_LASTBRANCH_TOS.
pub const MSR_LASTBRANCH_TOS: u32 = 0x1C9;
/// MSR_LASTBRANCH_0_FROM_IP (Nehalem and later).
pub const MSR_LASTBRANCH_0_FROM_IP: u32 = 0x680;
/// MSR_LASTBRANCH_0_TO_IP (Nehalem and later).
pub const MSR_LASTBRANCH_0_TO_IP: u32 = 0x6C0;
/// MSR_LASTBRANCH_0_FROM_IP on Core 2 (4 entries).
pub const CORE2_LASTBRANCH_0_FROM_IP: u32 = 0x40;
/// MSR_LASTBRANCH_0_TO_IP on Core 2.
pub const CORE2_LASTBRANCH_0_TO_IP: u32 = 0x60;
/// MSR_LBR_INFO_0 (Skylake and later).
pub const MSR_LBR_INFO_0: u32 = 0xDC0;

// ---- NetBurst (SDM 18.15) ----
/// MSR_BPU_COUNTER0: first of the 18 NetBurst counters (0x300-0x311).
pub const MSR_BPU_COUNTER0: u32 = 0x300;
/// Number of NetBurst counters.
pub const NETBURST_NUM_COUNTERS: u32 = 18;
/// MSR_IQ_COUNTER4: the only counter that can do PEBS on NetBurst.
pub const MSR_IQ_COUNTER4: u32 = 0x310;
/// MSR_BPU_CCCR0: first of the 18 CCCRs (0x360-0x371).
pub const MSR_BPU_CCCR0: u32 = 0x360;
/// MSR_IQ_CCCR4.
pub const MSR_IQ_CCCR4: u32 = 0x370;
/// First ESCR (MSR_BSU_ESCR0); ESCRs occupy 0x3A0-0x3E1 with holes.
pub const NETBURST_ESCR_FIRST: u32 = 0x3A0;
/// Last ESCR (MSR_CRU_ESCR5).
pub const NETBURST_ESCR_LAST: u32 = 0x3E1;
/// MSR_PEBS_MATRIX_VERT on NetBurst.
pub const NETBURST_PEBS_MATRIX_VERT: u32 = 0x3F2;

// ---- IA32_PERFEVTSELx bits (SDM Figure 18-1, 18-6) ----
/// Event select field.
pub const EVTSEL_EVENT_MASK: u64 = 0xFF;
/// Unit mask field.
pub const EVTSEL_UMASK_SHIFT: u32 = 8;
/// USR: count at CPL > 0.
pub const EVTSEL_USR: u64 = 1 << 16;
/// OS: count at CPL 0.
pub const EVTSEL_OS: u64 = 1 << 17;
/// E: edge detect.
pub const EVTSEL_EDGE: u64 = 1 << 18;
/// PC: pin control.
pub const EVTSEL_PC: u64 = 1 << 19;
/// INT: APIC interrupt on overflow.
pub const EVTSEL_INT: u64 = 1 << 20;
/// ANY: any thread (v3+).
pub const EVTSEL_ANY: u64 = 1 << 21;
/// EN: enable counter.
pub const EVTSEL_EN: u64 = 1 << 22;
/// INV: invert counter mask.
pub const EVTSEL_INV: u64 = 1 << 23;
/// CMASK field shift.
pub const EVTSEL_CMASK_SHIFT: u32 = 24;
/// IN_TX (Haswell+ TSX).
pub const EVTSEL_IN_TX: u64 = 1 << 32;
/// IN_TXCP (Haswell+ TSX).
pub const EVTSEL_IN_TXCP: u64 = 1 << 33;
/// Adaptive PEBS record enable for this counter (fmt4+; Linux's ICL_EVENTSEL_ADAPTIVE).
pub const EVTSEL_ADAPTIVE: u64 = 1 << 34;

// ---- IA32_FIXED_CTR_CTRL per-counter fields ----
/// Enable at CPL 0 (bit 0 of each 4-bit field).
pub const FIXED_CTRL_OS: u64 = 1 << 0;
/// Enable at CPL > 0.
pub const FIXED_CTRL_USR: u64 = 1 << 1;
/// AnyThread (v3+).
pub const FIXED_CTRL_ANY: u64 = 1 << 2;
/// PMI on overflow.
pub const FIXED_CTRL_PMI: u64 = 1 << 3;
/// Bit of the adaptive-PEBS enable for fixed counter i: `FIXED_CTRL_ADAPTIVE_SHIFT + 4 * i`.
pub const FIXED_CTRL_ADAPTIVE_SHIFT: u32 = 32;

// ---- IA32_PERF_GLOBAL_STATUS bits ----
/// First fixed-counter overflow bit (fixed i -> bit 32 + i).
pub const GLOBAL_FIXED_SHIFT: u32 = 32;
/// Trace ToPA PMI (bit 55).
pub const GLOBAL_STATUS_TRACE_TOPA_PMI: u64 = 1 << 55;
/// LBR_Frz (bit 58, v4+).
pub const GLOBAL_STATUS_LBR_FRZ: u64 = 1 << 58;
/// CTR_Frz (bit 59, v4+).
pub const GLOBAL_STATUS_CTR_FRZ: u64 = 1 << 59;
/// ASCI (bit 60, v4+).
pub const GLOBAL_STATUS_ASCI: u64 = 1 << 60;
/// Ovf_UncorePMU (bit 61, v3+).
pub const GLOBAL_STATUS_OVF_UNCORE: u64 = 1 << 61;
/// OvfBuffer: the DS PEBS buffer reached its interrupt threshold (bit 62).
pub const OVF_BUFFER: u64 = 1 << 62;
/// CondChgd (bit 63).
pub const GLOBAL_STATUS_COND_CHGD: u64 = 1 << 63;

// ---- IA32_PERF_CAPABILITIES fields (SDM Figure 18-63 / vol. 4) ----
/// LBR format, bits 5:0.
pub const PERF_CAP_LBR_FMT_MASK: u64 = 0x3F;
/// PEBS trap-like records (IP after the instruction), bit 6.
pub const PERF_CAP_PEBS_TRAP: u64 = 1 << 6;
/// PEBS saves architectural registers, bit 7.
pub const PERF_CAP_PEBS_ARCH_REG: u64 = 1 << 7;
/// PEBS record format, bits 11:8.
pub const PERF_CAP_PEBS_FMT_SHIFT: u32 = 8;
/// Freeze-while-SMM supported, bit 12.
pub const PERF_CAP_SMM_FREEZE: u64 = 1 << 12;
/// Full-width counter writes through IA32_A_PMCx, bit 13.
pub const PERF_CAP_FW_WRITE: u64 = 1 << 13;
/// PEBS baseline (adaptive PEBS), bit 14.
pub const PERF_CAP_PEBS_BASELINE: u64 = 1 << 14;

// ---- IA32_DEBUGCTL bits (SDM 17.4.1) ----
/// LBR.
pub const DEBUGCTL_LBR: u64 = 1 << 0;
/// BTF.
pub const DEBUGCTL_BTF: u64 = 1 << 1;
/// TR: branch trace messages.
pub const DEBUGCTL_TR: u64 = 1 << 6;
/// BTS: store branch messages in the DS area.
pub const DEBUGCTL_BTS: u64 = 1 << 7;
/// BTINT: interrupt when the BTS buffer reaches its threshold.
pub const DEBUGCTL_BTINT: u64 = 1 << 8;
/// BTS_OFF_OS.
pub const DEBUGCTL_BTS_OFF_OS: u64 = 1 << 9;
/// BTS_OFF_USR.
pub const DEBUGCTL_BTS_OFF_USR: u64 = 1 << 10;
/// FREEZE_LBRS_ON_PMI.
pub const DEBUGCTL_FREEZE_LBRS_ON_PMI: u64 = 1 << 11;
/// FREEZE_PERFMON_ON_PMI.
pub const DEBUGCTL_FREEZE_PERFMON_ON_PMI: u64 = 1 << 12;
/// FREEZE_WHILE_SMM.
pub const DEBUGCTL_FREEZE_WHILE_SMM: u64 = 1 << 14;
/// RTM_DEBUG.
pub const DEBUGCTL_RTM_DEBUG: u64 = 1 << 15;

// ---- IA32_MISC_ENABLE PMU bits ----
/// Performance monitoring available (bit 7).
pub const MISC_ENABLE_PERF_MON_AVAILABLE: u64 = 1 << 7;
/// Branch trace storage unavailable (bit 11).
pub const MISC_ENABLE_BTS_UNAVAILABLE: u64 = 1 << 11;
/// PEBS unavailable (bit 12).
pub const MISC_ENABLE_PEBS_UNAVAILABLE: u64 = 1 << 12;

// ---- MSR_PEBS_DATA_CFG (SDM 18.9.2.3) ----
/// Memory-info group.
pub const PEBS_DATACFG_MEMINFO: u64 = 1 << 0;
/// GPR group.
pub const PEBS_DATACFG_GPRS: u64 = 1 << 1;
/// XMM group.
pub const PEBS_DATACFG_XMMS: u64 = 1 << 2;
/// LBR group.
pub const PEBS_DATACFG_LBRS: u64 = 1 << 3;
/// Shift of the "LBR entries - 1" field (bits 31:24).
pub const PEBS_DATACFG_LBR_SHIFT: u32 = 24;

// ---- NetBurst MSR_PEBS_ENABLE ----
/// Enable PEBS on IQ_COUNTER4 (bit 24).
pub const NETBURST_PEBS_ENABLE_BIT: u64 = 1 << 24;
/// UOP_TAG (bit 25).
pub const NETBURST_PEBS_UOP_TAG: u64 = 1 << 25;
