//! CPU models: everything about a processor generation that the guest can observe through CPUID
//! and the PMU MSRs. Presets live in `resources/cpu-models/*.toml`; `--cpu-model FILE` takes the
//! same format.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Why a CPU model could not be loaded.
#[derive(Debug, Error)]
pub enum ModelError {
    /// No preset has that name.
    #[error("unknown CPU model '{name}'; presets: {presets}")]
    UnknownPreset {
        /// The name asked for.
        name: String,
        /// Comma-separated preset names.
        presets: String,
    },
    /// The TOML text did not parse as a model.
    #[error("CPU model TOML is invalid: {0}")]
    Parse(#[from] toml::de::Error),
    /// The model parsed but is inconsistent.
    #[error("CPU model '{name}' is inconsistent: {why}")]
    Invalid {
        /// Model name.
        name: String,
        /// What is wrong.
        why: String,
    },
}

/// Which performance-monitoring architecture the model has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PmuArch {
    /// Architectural performance monitoring (CPUID leaf 0xA), versions 1-5.
    Architectural,
    /// Intel NetBurst (Pentium 4): ESCR/CCCR counters, PEBS on MSR_IQ_COUNTER4.
    Netburst,
}

/// PEBS record format as enumerated by IA32_PERF_CAPABILITIES[11:8] (or NetBurst's own layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PebsFormat {
    /// No PEBS.
    None,
    /// NetBurst 64-bit PEBS record on IQ_COUNTER4.
    Netburst,
    /// Format 0: Core (0x90 bytes).
    Fmt0,
    /// Format 1: Nehalem (0xB0 bytes).
    Fmt1,
    /// Format 2: Haswell (0xC0 bytes).
    Fmt2,
    /// Format 3: Skylake (0xC8 bytes).
    Fmt3,
    /// Format 4: adaptive (Ice Lake).
    Fmt4,
    /// Format 5: adaptive with fixed-counter reset slots at 32+i (Sapphire Rapids).
    Fmt5,
}

impl PebsFormat {
    /// The value of IA32_PERF_CAPABILITIES[11:8] for this format (0 where there is none).
    pub fn capabilities_field(self) -> u64 {
        match self {
            PebsFormat::None | PebsFormat::Netburst | PebsFormat::Fmt0 => 0,
            PebsFormat::Fmt1 => 1,
            PebsFormat::Fmt2 => 2,
            PebsFormat::Fmt3 => 3,
            PebsFormat::Fmt4 => 4,
            PebsFormat::Fmt5 => 5,
        }
    }

    /// Adaptive (fmt4+) formats.
    pub fn is_adaptive(self) -> bool {
        matches!(self, PebsFormat::Fmt4 | PebsFormat::Fmt5)
    }
}

/// A CPU model. Field names follow the CPUID leaves and MSRs they set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuModel {
    /// Short name (`skylake`).
    pub name: String,
    /// Human-readable description.
    pub description: String,
    /// Architecture of the PMU.
    pub arch: PmuArch,
    /// CPUID family (display family).
    pub family: u32,
    /// CPUID model (display model, extended bits included).
    pub model: u32,
    /// CPUID stepping.
    pub stepping: u32,
    /// CPUID.0AH:EAX[7:0]: architectural PMU version (0 for NetBurst).
    pub pmu_version: u8,
    /// CPUID.0AH:EAX[15:8]: general-purpose counters per logical processor.
    pub num_gp: u8,
    /// CPUID.0AH:EAX[23:16]: bit width of the general-purpose counters.
    pub gp_width: u8,
    /// CPUID.0AH:EAX[31:24]: length of the EBX event-availability bit vector.
    pub events_mask_len: u8,
    /// CPUID.0AH:EBX: a set bit means the architectural event is NOT available.
    pub events_unavailable: u32,
    /// CPUID.0AH:EDX[4:0]: fixed-function counters (v2+).
    pub num_fixed: u8,
    /// CPUID.0AH:EDX[12:5]: bit width of the fixed counters.
    pub fixed_width: u8,
    /// CPUID.0AH:ECX: fixed-counter support bitmap (v5+); 0 below v5.
    pub fixed_bitmap: u32,
    /// CPUID.1:ECX.PDCM: IA32_PERF_CAPABILITIES exists.
    pub pdcm: bool,
    /// CPUID.1:ECX.DTES64: 64-bit DS area layout.
    pub dtes64: bool,
    /// CPUID.1:EDX.DS: debug store (BTS/PEBS).
    pub ds: bool,
    /// PEBS record format.
    pub pebs_format: PebsFormat,
    /// IA32_PERF_CAPABILITIES[6]: trap-like PEBS records.
    pub pebs_trap: bool,
    /// IA32_PERF_CAPABILITIES[7]: PEBS saves architectural registers.
    pub pebs_arch_regs: bool,
    /// IA32_PERF_CAPABILITIES[14]: PEBS baseline (adaptive PEBS, PEBS on fixed counters).
    pub pebs_baseline: bool,
    /// IA32_PERF_CAPABILITIES[13]: full-width writes through IA32_A_PMCx.
    pub fw_write: bool,
    /// IA32_PERF_CAPABILITIES[5:0]: LBR record format.
    pub lbr_format: u8,
    /// Number of LBR entries (0: no LBR).
    pub lbr_depth: u8,
    /// Load-latency PEBS (IA32_PEBS_ENABLE bits 32-35, MSR_PEBS_LD_LAT_THRESHOLD).
    pub pebs_load_latency: bool,
    /// MSR_PEBS_FRONTEND exists.
    pub pebs_frontend: bool,
    /// IA32_MISC_ENABLE bit 11 (BTS unavailable).
    pub bts_unavailable: bool,
    /// Guest TSC frequency in Hz (reference-cycle rate of the cost model).
    pub tsc_hz: u64,
}

/// Names of the built-in presets, in generation order.
pub const PRESET_NAMES: &[&str] = &[
    "netburst",
    "core2",
    "nehalem",
    "haswell",
    "skylake",
    "icelake-server",
    "sapphire-rapids",
];
