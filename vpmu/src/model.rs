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
    /// A model file could not be read.
    #[error("cannot read CPU model file {path}: {source}")]
    Io {
        /// The path given.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
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
    /// CPUID.0AH:EDX[15]: AnyThread deprecated (Ice Lake and later); the ANY bits of
    /// IA32_PERFEVTSELx and IA32_FIXED_CTR_CTRL are then reserved.
    #[serde(default)]
    pub anythread_deprecated: bool,
    /// TSX: IA32_PERFEVTSELx IN_TX (bit 32) and, on PMC2 only, IN_TXCP (bit 33);
    /// IA32_DEBUGCTL.RTM_DEBUG.
    #[serde(default)]
    pub tsx: bool,
    /// IA32_PERF_CAPABILITIES[12]: IA32_DEBUGCTL.FREEZE_WHILE_SMM is supported.
    #[serde(default)]
    pub smm_freeze: bool,
    /// Where the LBR FROM/TO MSRs live.
    #[serde(default)]
    pub lbr_layout: LbrLayout,
}

/// Addresses of the LBR stack MSRs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LbrLayout {
    /// Core 2: FROM at 0x40+, TO at 0x60+, no MSR_LBR_SELECT.
    Core2,
    /// Nehalem and later: FROM at 0x680+, TO at 0x6C0+, MSR_LBR_SELECT, LBR_INFO at 0xDC0+
    /// for formats that have it.
    #[default]
    Nehalem,
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

/// The preset TOML texts, in [`PRESET_NAMES`] order.
const PRESET_TEXTS: &[(&str, &str)] = &[
    (
        "netburst",
        include_str!("../../resources/cpu-models/netburst.toml"),
    ),
    (
        "core2",
        include_str!("../../resources/cpu-models/core2.toml"),
    ),
    (
        "nehalem",
        include_str!("../../resources/cpu-models/nehalem.toml"),
    ),
    (
        "haswell",
        include_str!("../../resources/cpu-models/haswell.toml"),
    ),
    (
        "skylake",
        include_str!("../../resources/cpu-models/skylake.toml"),
    ),
    (
        "icelake-server",
        include_str!("../../resources/cpu-models/icelake-server.toml"),
    ),
    (
        "sapphire-rapids",
        include_str!("../../resources/cpu-models/sapphire-rapids.toml"),
    ),
];

/// `n` low bits set (`n` >= 64 gives all ones).
pub fn low_bits(n: u32) -> u64 {
    if n >= 64 { u64::MAX } else { (1u64 << n) - 1 }
}

impl CpuModel {
    /// A built-in preset by name.
    pub fn preset(name: &str) -> Result<CpuModel, ModelError> {
        let text = PRESET_TEXTS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, t)| *t)
            .ok_or_else(|| ModelError::UnknownPreset {
                name: name.to_string(),
                presets: PRESET_NAMES.join(", "),
            })?;
        Self::from_toml(text)
    }

    /// Parses and validates a model in the preset TOML format.
    pub fn from_toml(text: &str) -> Result<CpuModel, ModelError> {
        let model: CpuModel = toml::from_str(text)?;
        model.validate()?;
        Ok(model)
    }

    /// A preset name, or else the path of a TOML model file.
    pub fn load(name_or_path: &str) -> Result<CpuModel, ModelError> {
        if PRESET_NAMES.contains(&name_or_path) {
            return Self::preset(name_or_path);
        }
        let path = std::path::Path::new(name_or_path);
        if !path.exists() && !name_or_path.contains(['/', '.']) {
            // A bare word that is no file: the user meant a preset.
            return Self::preset(name_or_path);
        }
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: name_or_path.to_string(),
            source,
        })?;
        Self::from_toml(&text)
    }

    fn invalid(&self, why: impl Into<String>) -> ModelError {
        ModelError::Invalid {
            name: self.name.clone(),
            why: why.into(),
        }
    }

    /// Checks that the model is one the vPMU can present consistently.
    pub fn validate(&self) -> Result<(), ModelError> {
        use crate::msr::{MAX_FIXED_COUNTERS, MAX_GP_COUNTERS, NETBURST_COUNTER_WIDTH};
        if self.name.is_empty() {
            return Err(self.invalid("empty name"));
        }
        if self.stepping > 0xF {
            return Err(self.invalid("stepping does not fit CPUID.1:EAX[3:0]"));
        }
        if self.family == 0 || self.family > 0xF + 0xFF {
            return Err(self.invalid("family must be 1..=0x10E"));
        }
        let ext_model_ok = self.family == 6 || self.family >= 0xF;
        if self.model > 0xFF || (!ext_model_ok && self.model > 0xF) {
            return Err(self.invalid("model does not fit CPUID.1:EAX"));
        }
        if self.tsc_hz == 0 {
            return Err(self.invalid("tsc_hz must be > 0"));
        }
        if self.dtes64 && !self.ds {
            return Err(self.invalid("dtes64 needs ds"));
        }
        if self.lbr_depth != 0 && (!self.lbr_depth.is_power_of_two() || self.lbr_depth > 32) {
            return Err(self.invalid("lbr_depth must be 0 or a power of two <= 32"));
        }
        if self.pebs_format != PebsFormat::None && !self.ds {
            return Err(self.invalid("PEBS needs the DS feature"));
        }
        if self.pebs_baseline && !self.pebs_format.is_adaptive() {
            return Err(self.invalid("pebs_baseline needs PEBS format 4 or 5"));
        }
        if self.pebs_format.capabilities_field() > 0 && !self.pdcm {
            return Err(self.invalid("PEBS format >= 1 is enumerated through PDCM"));
        }
        let pebs_level = self.pebs_format.capabilities_field();
        if self.pebs_load_latency && (self.arch != PmuArch::Architectural || pebs_level < 1) {
            return Err(self.invalid("load-latency PEBS needs PEBS format >= 1"));
        }
        if self.pebs_frontend && pebs_level < 3 {
            return Err(self.invalid("MSR_PEBS_FRONTEND needs PEBS format >= 3"));
        }
        match self.arch {
            PmuArch::Netburst => {
                if self.pmu_version != 0
                    || self.num_gp != 0
                    || self.num_fixed != 0
                    || self.fixed_bitmap != 0
                    || self.events_mask_len != 0
                {
                    return Err(self.invalid("NetBurst has no architectural PMU (leaf 0xA)"));
                }
                if self.gp_width != NETBURST_COUNTER_WIDTH {
                    return Err(self.invalid("NetBurst counters are 40 bits wide"));
                }
                if !matches!(self.pebs_format, PebsFormat::None | PebsFormat::Netburst) {
                    return Err(self.invalid("NetBurst PEBS uses the netburst format"));
                }
                if self.lbr_depth != 0 {
                    return Err(self.invalid("NetBurst LBRs (TOS at 0x1DA) are not modelled"));
                }
                if self.pdcm || self.fw_write || self.pebs_baseline || self.lbr_format != 0 {
                    return Err(self.invalid("NetBurst has no IA32_PERF_CAPABILITIES"));
                }
            }
            PmuArch::Architectural => {
                if !(1..=5).contains(&self.pmu_version) {
                    return Err(self.invalid("pmu_version must be 1..=5"));
                }
                if self.num_gp == 0 || self.num_gp > MAX_GP_COUNTERS {
                    return Err(self.invalid("num_gp must be 1..=8"));
                }
                if !(32..=48).contains(&self.gp_width) {
                    return Err(self.invalid("gp_width must be 32..=48"));
                }
                if self.events_mask_len > 32 {
                    return Err(self.invalid("events_mask_len must be <= 32"));
                }
                if self.pebs_format == PebsFormat::Netburst {
                    return Err(self.invalid("the netburst PEBS format needs arch = netburst"));
                }
                if self.pmu_version < 2 && (self.num_fixed != 0 || self.fixed_bitmap != 0) {
                    return Err(self.invalid("fixed counters need pmu_version >= 2"));
                }
                if self.pmu_version < 5 && self.fixed_bitmap != 0 {
                    return Err(self.invalid("fixed_bitmap needs pmu_version 5"));
                }
                if self.num_fixed > MAX_FIXED_COUNTERS
                    || self.fixed_bitmap >> MAX_FIXED_COUNTERS != 0
                {
                    return Err(self.invalid("at most 4 fixed counters"));
                }
                if self.fixed_counter_mask() != 0 && !(32..=48).contains(&self.fixed_width) {
                    return Err(self.invalid("fixed_width must be 32..=48"));
                }
                if self.lbr_layout == LbrLayout::Core2 && self.lbr_format >= 5 {
                    return Err(self.invalid("LBR_INFO formats need the Nehalem LBR layout"));
                }
            }
        }
        if u64::from(self.lbr_format) > crate::msr::PERF_CAP_LBR_FMT_MASK {
            return Err(self.invalid("lbr_format must fit 6 bits"));
        }
        Ok(())
    }

    /// Fixed counter `i` exists: `i < num_fixed` or bit `i` of the v5 bitmap (SDM 18.2.5.1).
    pub fn has_fixed(&self, i: u8) -> bool {
        u32::from(i) < 32
            && (i < self.num_fixed || (self.pmu_version >= 5 && self.fixed_bitmap >> i & 1 == 1))
    }

    /// Bitmap of the fixed counters that exist (bit i = fixed counter i).
    pub fn fixed_counter_mask(&self) -> u64 {
        (0..crate::msr::MAX_FIXED_COUNTERS)
            .filter(|&i| self.has_fixed(i))
            .fold(0, |m, i| m | 1 << i)
    }

    /// Mask of a GP counter value (the counter width).
    pub fn gp_mask(&self) -> u64 {
        low_bits(u32::from(self.gp_width))
    }

    /// Mask of a fixed counter value.
    pub fn fixed_mask(&self) -> u64 {
        low_bits(u32::from(self.fixed_width))
    }

    /// Bitmap of the GP counters (bit n = PMCn).
    pub fn gp_counter_mask(&self) -> u64 {
        low_bits(u32::from(self.num_gp))
    }

    /// The counter bits of IA32_PERF_GLOBAL_CTRL / STATUS: GP n at n, fixed i at 32+i.
    pub fn global_counter_bits(&self) -> u64 {
        self.gp_counter_mask() | self.fixed_counter_mask() << crate::msr::GLOBAL_FIXED_SHIFT
    }

    /// IA32_PERF_CAPABILITIES as the model reports it (0 when PDCM is clear).
    pub fn perf_capabilities(&self) -> u64 {
        use crate::msr::*;
        if !self.pdcm {
            return 0;
        }
        let mut caps = u64::from(self.lbr_format) & PERF_CAP_LBR_FMT_MASK;
        caps |= self.pebs_format.capabilities_field() << PERF_CAP_PEBS_FMT_SHIFT;
        if self.pebs_trap {
            caps |= PERF_CAP_PEBS_TRAP;
        }
        if self.pebs_arch_regs {
            caps |= PERF_CAP_PEBS_ARCH_REG;
        }
        if self.smm_freeze {
            caps |= PERF_CAP_SMM_FREEZE;
        }
        if self.fw_write {
            caps |= PERF_CAP_FW_WRITE;
        }
        if self.pebs_baseline {
            caps |= PERF_CAP_PEBS_BASELINE;
        }
        caps
    }

    /// The read-only PMU bits of IA32_MISC_ENABLE: 7 (performance monitoring available),
    /// 11 (BTS unavailable), 12 (PEBS unavailable).
    pub fn misc_enable(&self) -> u64 {
        use crate::msr::*;
        let mut v = MISC_ENABLE_PERF_MON_AVAILABLE;
        if self.bts_unavailable || !self.ds {
            v |= MISC_ENABLE_BTS_UNAVAILABLE;
        }
        if self.pebs_format == PebsFormat::None {
            v |= MISC_ENABLE_PEBS_UNAVAILABLE;
        }
        v
    }

    /// The model has LBR_INFO MSRs: LBR formats 5 (INFO) and 7 (INFO2). Format 6 (TIME) keeps
    /// its cycle count in TO_IP[63:48] and has none (SDM 17.4.8.1; Linux `intel_pmu_lbr_init`).
    pub fn has_lbr_info(&self) -> bool {
        self.lbr_depth > 0
            && self.lbr_layout == LbrLayout::Nehalem
            && matches!(
                self.lbr_format,
                crate::msr::LBR_FORMAT_INFO | crate::msr::LBR_FORMAT_INFO2
            )
    }

    /// Whether the ANY (AnyThread) bits are writable: v3+ unless deprecated.
    pub fn any_thread(&self) -> bool {
        self.pmu_version >= 3 && !self.anythread_deprecated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_loads_and_validates() {
        for name in PRESET_NAMES {
            let m = CpuModel::preset(name).unwrap();
            assert_eq!(m.name, *name);
            assert_eq!(CpuModel::load(name).unwrap(), m);
        }
        assert_eq!(PRESET_TEXTS.len(), PRESET_NAMES.len());
        assert!(matches!(
            CpuModel::preset("k6"),
            Err(ModelError::UnknownPreset { .. })
        ));
    }

    #[test]
    fn perf_capabilities_match_real_parts() {
        // Skylake-SP reports 0x33c5 (LBR fmt 5, trap, arch regs, PEBS fmt 3, SMM freeze,
        // full-width writes).
        assert_eq!(
            CpuModel::preset("skylake").unwrap().perf_capabilities(),
            0x33c5
        );
        let icx = CpuModel::preset("icelake-server").unwrap();
        assert_eq!(icx.perf_capabilities() >> 8 & 0xF, 4);
        assert_ne!(
            icx.perf_capabilities() & crate::msr::PERF_CAP_PEBS_BASELINE,
            0
        );
        assert_eq!(CpuModel::preset("netburst").unwrap().perf_capabilities(), 0);
    }

    #[test]
    fn misc_enable_bits() {
        use crate::msr::*;
        let nb = CpuModel::preset("netburst").unwrap();
        assert_eq!(nb.misc_enable() & MISC_ENABLE_PEBS_UNAVAILABLE, 0);
        assert_ne!(nb.misc_enable() & MISC_ENABLE_PERF_MON_AVAILABLE, 0);
        let mut m = CpuModel::preset("skylake").unwrap();
        m.pebs_format = PebsFormat::None;
        assert_ne!(m.misc_enable() & MISC_ENABLE_PEBS_UNAVAILABLE, 0);
    }

    #[test]
    fn validation_rejects_inconsistent_models() {
        let base = CpuModel::preset("skylake").unwrap();
        type Mutate = fn(&mut CpuModel);
        let cases: Vec<(&str, Mutate)> = vec![
            ("version", |m| m.pmu_version = 6),
            ("gp", |m| m.num_gp = 9),
            ("width", |m| m.gp_width = 64),
            ("bitmap below v5", |m| m.fixed_bitmap = 1),
            ("baseline", |m| m.pebs_baseline = true),
            ("lbr depth", |m| m.lbr_depth = 12),
            ("stepping", |m| m.stepping = 16),
            ("pebs without ds", |m| m.ds = false),
            ("netburst fmt", |m| m.pebs_format = PebsFormat::Netburst),
        ];
        for (what, f) in cases {
            let mut m = base.clone();
            f(&mut m);
            assert!(m.validate().is_err(), "{what} accepted");
        }
        let mut v1 = base.clone();
        v1.pmu_version = 1;
        assert!(v1.validate().is_err(), "v1 with fixed counters accepted");
        v1.num_fixed = 0;
        v1.pebs_format = PebsFormat::None;
        v1.pebs_load_latency = false;
        v1.pebs_frontend = false;
        v1.validate().unwrap();
    }

    #[test]
    fn toml_rejects_unknown_fields_and_defaults_extensions() {
        let text = PRESET_TEXTS[4].1;
        assert!(CpuModel::from_toml(&format!("{text}\nbogus = 1\n")).is_err());
        let stripped: String = text
            .lines()
            .filter(|l| !l.starts_with("lbr_layout"))
            .collect::<Vec<_>>()
            .join("\n");
        assert_eq!(
            CpuModel::from_toml(&stripped).unwrap().lbr_layout,
            LbrLayout::Nehalem
        );
    }

    #[test]
    fn fixed_counters_from_bitmap() {
        let mut m = CpuModel::preset("icelake-server").unwrap();
        m.num_fixed = 1;
        m.fixed_bitmap = 0b1001;
        assert!(m.has_fixed(0) && !m.has_fixed(1) && !m.has_fixed(2) && m.has_fixed(3));
        assert_eq!(m.fixed_counter_mask(), 0b1001);
    }
}
