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

// ---- Limits and field masks used by the PMU state machine (h1) ----
/// Most GP counters any model may have (IA32_PMC0-7, IA32_PERFEVTSEL0-7).
pub const MAX_GP_COUNTERS: u8 = 8;
/// Most fixed counters any model may have (IA32_FIXED_CTR0-3).
pub const MAX_FIXED_COUNTERS: u8 = 4;
/// Bits of one IA32_FIXED_CTR_CTRL field (EN OS, EN USR, ANY, PMI).
pub const FIXED_CTRL_FIELD_BITS: u32 = 4;
/// Mask of one IA32_FIXED_CTR_CTRL field's enable bits (OS | USR).
pub const FIXED_CTRL_EN_MASK: u64 = FIXED_CTRL_OS | FIXED_CTRL_USR;
/// Unit mask field width mask (after shifting).
pub const EVTSEL_UMASK_MASK: u64 = 0xFF;
/// CMASK field width mask (after shifting).
pub const EVTSEL_CMASK_MASK: u64 = 0xFF;
/// IA32_MISC_ENABLE bit 0: fast-strings enable (set at reset on every model we present).
pub const MISC_ENABLE_FAST_STRING: u64 = 1 << 0;
/// MSR_LBR_SELECT bits 8:0 (CPL and branch-type filters, Nehalem and later).
pub const LBR_SELECT_FILTER_MASK: u64 = 0x1FF;
/// MSR_LBR_SELECT bit 9: EN_CALLSTACK (Haswell and later, LBR format >= 4).
pub const LBR_SELECT_EN_CALLSTACK: u64 = 1 << 9;
/// MSR_PEBS_LD_LAT_THRESHOLD: 16-bit threshold.
pub const PEBS_LD_LAT_MASK: u64 = 0xFFFF;
/// MSR_PEBS_FRONTEND writable bits (Linux's FE extra-reg mask 0x7fff17: event select [2:0],
/// bit 4, IDQ bubble length [19:8], bubble width [22:20]).
pub const PEBS_FRONTEND_MASK: u64 = 0x7F_FF17;
/// MSR_PEBS_DATA_CFG "LBR entries - 1" field width mask (after shifting).
pub const PEBS_DATACFG_LBR_MASK: u64 = 0xFF;
/// IA32_PEBS_ENABLE: first load-latency enable bit (PEBS_LD_LAT for PMC n at bit 32+n,
/// Nehalem to Skylake, PMC0-3 only).
pub const PEBS_ENABLE_LD_LAT_SHIFT: u32 = 32;
/// Number of PMCs with a load-latency enable bit in IA32_PEBS_ENABLE.
pub const PEBS_ENABLE_LD_LAT_COUNTERS: u8 = 4;
/// RDPMC ECX bit 30: read a fixed-function counter.
pub const RDPMC_FIXED: u32 = 1 << 30;
/// RDPMC ECX bit 31: fast read (low 32 bits), NetBurst only.
pub const RDPMC_FAST: u32 = 1 << 31;
/// Width of linear addresses for the IA32_DS_AREA canonical check (4-level paging).
pub const CANONICAL_ADDRESS_BITS: u32 = 48;

// ---- NetBurst counters, CCCRs, ESCRs (SDM 18.15, vol. 4 table 2-43) ----
/// NetBurst counters are 40 bits wide.
pub const NETBURST_COUNTER_WIDTH: u8 = 40;
/// Index of MSR_IQ_COUNTER4 among the 18 counters.
pub const NETBURST_IQ_COUNTER4_INDEX: u8 = 16;
/// CCCR bit 12: enable.
pub const CCCR_ENABLE: u64 = 1 << 12;
/// CCCR bits 15:13: ESCR select.
pub const CCCR_ESCR_SELECT_SHIFT: u32 = 13;
/// CCCR ESCR select field mask (after shifting).
pub const CCCR_ESCR_SELECT_MASK: u64 = 0x7;
/// CCCR bits 17:16: active thread.
pub const CCCR_ACTIVE_THREAD_SHIFT: u32 = 16;
/// CCCR bit 18: compare (threshold filtering).
pub const CCCR_COMPARE: u64 = 1 << 18;
/// CCCR bit 19: complement.
pub const CCCR_COMPLEMENT: u64 = 1 << 19;
/// CCCR bits 23:20: threshold.
pub const CCCR_THRESHOLD_SHIFT: u32 = 20;
/// CCCR threshold field mask (after shifting).
pub const CCCR_THRESHOLD_MASK: u64 = 0xF;
/// CCCR bit 24: edge.
pub const CCCR_EDGE: u64 = 1 << 24;
/// CCCR bit 25: FORCE_OVF.
pub const CCCR_FORCE_OVF: u64 = 1 << 25;
/// CCCR bit 26: OVF_PMI_T0 (PMI to logical processor 0 on overflow).
pub const CCCR_OVF_PMI_T0: u64 = 1 << 26;
/// CCCR bit 27: OVF_PMI_T1.
pub const CCCR_OVF_PMI_T1: u64 = 1 << 27;
/// CCCR bit 30: cascade.
pub const CCCR_CASCADE: u64 = 1 << 30;
/// CCCR bit 31: OVF (sticky overflow flag).
pub const CCCR_OVF: u64 = 1 << 31;
/// CCCR writable bits: 12-27, 30, 31 (0-11 and 28-29 reserved, upper half reserved).
pub const CCCR_WRITABLE: u64 = 0xCFFF_F000;
/// ESCR bit 0: T1_USR.
pub const ESCR_T1_USR: u64 = 1 << 0;
/// ESCR bit 1: T1_OS.
pub const ESCR_T1_OS: u64 = 1 << 1;
/// ESCR bit 2: T0_USR (USR on non-HT processors).
pub const ESCR_T0_USR: u64 = 1 << 2;
/// ESCR bit 3: T0_OS.
pub const ESCR_T0_OS: u64 = 1 << 3;
/// ESCR bits 24:9: event mask.
pub const ESCR_EVENT_MASK_SHIFT: u32 = 9;
/// ESCR event-mask field mask (after shifting).
pub const ESCR_EVENT_MASK_MASK: u64 = 0xFFFF;
/// ESCR bits 30:25: event select.
pub const ESCR_EVENT_SELECT_SHIFT: u32 = 25;
/// ESCR event-select field mask (after shifting).
pub const ESCR_EVENT_SELECT_MASK: u64 = 0x3F;
/// ESCR writable bits 30:0 (bit 31 and the upper half reserved).
pub const ESCR_WRITABLE: u64 = 0x7FFF_FFFF;
/// MSR_PEBS_ENABLE (NetBurst) bits 16:0: replay-tagging metric bits (Linux's p4 PEBS bind map
/// writes up to 0x18000).
pub const NETBURST_PEBS_METRIC_MASK: u64 = 0x1_FFFF;
/// MSR_PEBS_MATRIX_VERT writable bits 4:0 (Linux writes 0x1, 0x2, 0x3, 0x10).
pub const NETBURST_MATRIX_VERT_MASK: u64 = 0x1F;
/// NetBurst MSR_DEBUGCTLA (0x1D9) bit 0: LBR.
pub const NETBURST_DEBUGCTLA_LBR: u64 = 1 << 0;
/// MSR_DEBUGCTLA bit 1: BTF.
pub const NETBURST_DEBUGCTLA_BTF: u64 = 1 << 1;
/// MSR_DEBUGCTLA bit 2: TR.
pub const NETBURST_DEBUGCTLA_TR: u64 = 1 << 2;
/// MSR_DEBUGCTLA bit 3: BTS.
pub const NETBURST_DEBUGCTLA_BTS: u64 = 1 << 3;
/// MSR_DEBUGCTLA bit 4: BTINT.
pub const NETBURST_DEBUGCTLA_BTINT: u64 = 1 << 4;
/// MSR_DEBUGCTLA bit 5: BTS_OFF_OS.
pub const NETBURST_DEBUGCTLA_BTS_OFF_OS: u64 = 1 << 5;
/// MSR_DEBUGCTLA bit 6: BTS_OFF_USR.
pub const NETBURST_DEBUGCTLA_BTS_OFF_USR: u64 = 1 << 6;
/// MSR_BSU_ESCR0.
pub const MSR_BSU_ESCR0: u32 = 0x3A0;
/// MSR_BSU_ESCR1.
pub const MSR_BSU_ESCR1: u32 = 0x3A1;
/// MSR_FSB_ESCR0.
pub const MSR_FSB_ESCR0: u32 = 0x3A2;
/// MSR_FSB_ESCR1.
pub const MSR_FSB_ESCR1: u32 = 0x3A3;
/// MSR_FIRM_ESCR0.
pub const MSR_FIRM_ESCR0: u32 = 0x3A4;
/// MSR_FIRM_ESCR1.
pub const MSR_FIRM_ESCR1: u32 = 0x3A5;
/// MSR_FLAME_ESCR0.
pub const MSR_FLAME_ESCR0: u32 = 0x3A6;
/// MSR_FLAME_ESCR1.
pub const MSR_FLAME_ESCR1: u32 = 0x3A7;
/// MSR_DAC_ESCR0.
pub const MSR_DAC_ESCR0: u32 = 0x3A8;
/// MSR_DAC_ESCR1.
pub const MSR_DAC_ESCR1: u32 = 0x3A9;
/// MSR_MOB_ESCR0.
pub const MSR_MOB_ESCR0: u32 = 0x3AA;
/// MSR_MOB_ESCR1.
pub const MSR_MOB_ESCR1: u32 = 0x3AB;
/// MSR_PMH_ESCR0.
pub const MSR_PMH_ESCR0: u32 = 0x3AC;
/// MSR_PMH_ESCR1.
pub const MSR_PMH_ESCR1: u32 = 0x3AD;
/// MSR_SAAT_ESCR0.
pub const MSR_SAAT_ESCR0: u32 = 0x3AE;
/// MSR_SAAT_ESCR1.
pub const MSR_SAAT_ESCR1: u32 = 0x3AF;
/// MSR_U2L_ESCR0.
pub const MSR_U2L_ESCR0: u32 = 0x3B0;
/// MSR_U2L_ESCR1.
pub const MSR_U2L_ESCR1: u32 = 0x3B1;
/// MSR_BPU_ESCR0.
pub const MSR_BPU_ESCR0: u32 = 0x3B2;
/// MSR_BPU_ESCR1.
pub const MSR_BPU_ESCR1: u32 = 0x3B3;
/// MSR_IS_ESCR0.
pub const MSR_IS_ESCR0: u32 = 0x3B4;
/// MSR_IS_ESCR1.
pub const MSR_IS_ESCR1: u32 = 0x3B5;
/// MSR_ITLB_ESCR0.
pub const MSR_ITLB_ESCR0: u32 = 0x3B6;
/// MSR_ITLB_ESCR1.
pub const MSR_ITLB_ESCR1: u32 = 0x3B7;
/// MSR_CRU_ESCR0.
pub const MSR_CRU_ESCR0: u32 = 0x3B8;
/// MSR_CRU_ESCR1.
pub const MSR_CRU_ESCR1: u32 = 0x3B9;
/// MSR_IQ_ESCR0 (CPUID family 0FH models 1 and 2 only).
pub const MSR_IQ_ESCR0: u32 = 0x3BA;
/// MSR_IQ_ESCR1 (CPUID family 0FH models 1 and 2 only).
pub const MSR_IQ_ESCR1: u32 = 0x3BB;
/// MSR_RAT_ESCR0.
pub const MSR_RAT_ESCR0: u32 = 0x3BC;
/// MSR_RAT_ESCR1.
pub const MSR_RAT_ESCR1: u32 = 0x3BD;
/// MSR_SSU_ESCR0.
pub const MSR_SSU_ESCR0: u32 = 0x3BE;
/// MSR_MS_ESCR0.
pub const MSR_MS_ESCR0: u32 = 0x3C0;
/// MSR_MS_ESCR1.
pub const MSR_MS_ESCR1: u32 = 0x3C1;
/// MSR_TBPU_ESCR0.
pub const MSR_TBPU_ESCR0: u32 = 0x3C2;
/// MSR_TBPU_ESCR1.
pub const MSR_TBPU_ESCR1: u32 = 0x3C3;
/// MSR_TC_ESCR0.
pub const MSR_TC_ESCR0: u32 = 0x3C4;
/// MSR_TC_ESCR1.
pub const MSR_TC_ESCR1: u32 = 0x3C5;
/// MSR_IX_ESCR0.
pub const MSR_IX_ESCR0: u32 = 0x3C8;
/// MSR_IX_ESCR1.
pub const MSR_IX_ESCR1: u32 = 0x3C9;
/// MSR_ALF_ESCR0.
pub const MSR_ALF_ESCR0: u32 = 0x3CA;
/// MSR_ALF_ESCR1.
pub const MSR_ALF_ESCR1: u32 = 0x3CB;
/// MSR_CRU_ESCR2.
pub const MSR_CRU_ESCR2: u32 = 0x3CC;
/// MSR_CRU_ESCR3.
pub const MSR_CRU_ESCR3: u32 = 0x3CD;
/// MSR_CRU_ESCR4.
pub const MSR_CRU_ESCR4: u32 = 0x3E0;
/// MSR_CRU_ESCR5.
pub const MSR_CRU_ESCR5: u32 = 0x3E1;

// ---- LBR record formats, IA32_PERF_CAPABILITIES[5:0] (SDM 17.4.8.1; Linux lbr.c) ----
/// 32-bit offsets in the current CS.
pub const LBR_FORMAT_32: u8 = 0;
/// 64-bit linear addresses.
pub const LBR_FORMAT_LIP: u8 = 1;
/// 64-bit effective addresses.
pub const LBR_FORMAT_EIP: u8 = 2;
/// 64-bit EIP, mispredict in FROM bit 63.
pub const LBR_FORMAT_EIP_FLAGS: u8 = 3;
/// 64-bit EIP, mispredict / IN_TX / ABORT in FROM bits 63:61.
pub const LBR_FORMAT_EIP_FLAGS2: u8 = 4;
/// 64-bit EIP; mispredict, TSX flags and cycles in MSR_LBR_INFO_x.
pub const LBR_FORMAT_INFO: u8 = 5;
/// 64-bit LIP, mispredict in FROM bit 63, cycles in TO bits 63:48.
pub const LBR_FORMAT_TIME: u8 = 6;
/// 64-bit LIP; mispredict and cycles in MSR_LBR_INFO_x (no TSX flags).
pub const LBR_FORMAT_INFO2: u8 = 7;

// ---- LBR record fields (SDM Tables 17-8, 17-14, 17-16) ----
/// FROM_IP bit 63 (formats 3, 4, 6): the branch was mispredicted.
pub const LBR_FROM_MISPRED: u64 = 1 << 63;
/// FROM_IP bit 62 (format 4): the branch retired in a TSX region.
pub const LBR_FROM_IN_TX: u64 = 1 << 62;
/// FROM_IP bit 61 (format 4): TSX abort entry.
pub const LBR_FROM_ABORT: u64 = 1 << 61;
/// MSR_LBR_INFO_x bit 63: mispredicted.
pub const LBR_INFO_MISPRED: u64 = 1 << 63;
/// MSR_LBR_INFO_x bit 62: IN_TSX.
pub const LBR_INFO_IN_TX: u64 = 1 << 62;
/// MSR_LBR_INFO_x bit 61: TSX_ABORT.
pub const LBR_INFO_ABORT: u64 = 1 << 61;
/// MSR_LBR_INFO_x bits 15:0 (and format 6 TO_IP bits 63:48): saturating elapsed core cycles.
pub const LBR_CYCLES_MASK: u64 = 0xFFFF;
/// Format 6: the cycle count sits in TO_IP bits 63:48.
pub const LBR_TO_CYCLES_SHIFT: u32 = 48;

// ---- MSR_LBR_SELECT bits (SDM Tables 17-11, 17-12, 17-13): a set bit SUPPRESSES ----
/// CPL_EQ_0: do not capture branches occurring in ring 0.
pub const LBR_SELECT_CPL_EQ_0: u64 = 1 << 0;
/// CPL_NEQ_0: do not capture branches occurring in ring > 0.
pub const LBR_SELECT_CPL_NEQ_0: u64 = 1 << 1;
/// JCC: do not capture conditional branches.
pub const LBR_SELECT_JCC: u64 = 1 << 2;
/// NEAR_REL_CALL: do not capture near relative calls.
pub const LBR_SELECT_NEAR_REL_CALL: u64 = 1 << 3;
/// NEAR_IND_CALL: do not capture near indirect calls.
pub const LBR_SELECT_NEAR_IND_CALL: u64 = 1 << 4;
/// NEAR_RET: do not capture near returns.
pub const LBR_SELECT_NEAR_RET: u64 = 1 << 5;
/// NEAR_IND_JMP: do not capture near indirect jumps (except calls and returns).
pub const LBR_SELECT_NEAR_IND_JMP: u64 = 1 << 6;
/// NEAR_REL_JMP: do not capture near relative jumps (except calls).
pub const LBR_SELECT_NEAR_REL_JMP: u64 = 1 << 7;
/// FAR_BRANCH: do not capture far branches (far jumps/calls/returns, interrupts, exceptions).
pub const LBR_SELECT_FAR_BRANCH: u64 = 1 << 8;

// ---- Non-PMU architectural MSRs the guest tests use ----
/// IA32_APIC_BASE (SDM vol. 3A 11.4.4): bit 8 BSP, bit 11 global enable, bits 12+ base.
pub const IA32_APIC_BASE: u32 = 0x1B;
/// IA32_PERF_GLOBAL_INUSE bit 63: PMI in use (any EVTSEL.INT, fixed PMI or PEBS enable).
pub const GLOBAL_INUSE_PMI: u64 = 1 << 63;
