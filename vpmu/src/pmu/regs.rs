//! Which PMU MSRs a model has, and the writable-bit mask of each (SDM vol. 3B ch. 17-18,
//! vol. 4 tables 2-2 and the per-family tables).

use crate::model::{CpuModel, LbrLayout, PebsFormat, PmuArch, low_bits};
use crate::msr::*;
use crate::netburst;

/// One PMU MSR of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reg {
    /// IA32_PMCn (legacy alias: writes sign-extend from bit 31).
    Pmc(u8),
    /// IA32_A_PMCn (full-width alias).
    APmc(u8),
    /// IA32_PERFEVTSELn.
    EvtSel(u8),
    /// IA32_FIXED_CTRi.
    FixedCtr(u8),
    /// IA32_FIXED_CTR_CTRL.
    FixedCtrl,
    /// IA32_PERF_GLOBAL_STATUS.
    GlobalStatus,
    /// IA32_PERF_GLOBAL_CTRL.
    GlobalCtrl,
    /// IA32_PERF_GLOBAL_OVF_CTRL / STATUS_RESET.
    GlobalOvfCtrl,
    /// IA32_PERF_GLOBAL_STATUS_SET.
    GlobalStatusSet,
    /// IA32_PERF_GLOBAL_INUSE.
    GlobalInuse,
    /// IA32_PERF_CAPABILITIES.
    PerfCapabilities,
    /// IA32_DEBUGCTL (MSR_DEBUGCTLA on NetBurst).
    DebugCtl,
    /// IA32_MISC_ENABLE.
    MiscEnable,
    /// IA32_DS_AREA.
    DsArea,
    /// IA32_PEBS_ENABLE / MSR_PEBS_ENABLE.
    PebsEnable,
    /// MSR_PEBS_DATA_CFG.
    PebsDataCfg,
    /// MSR_PEBS_LD_LAT_THRESHOLD.
    PebsLdLat,
    /// MSR_PEBS_FRONTEND.
    PebsFrontend,
    /// MSR_PEBS_MATRIX_VERT (NetBurst).
    PebsMatrixVert,
    /// MSR_LBR_SELECT.
    LbrSelect,
    /// MSR_LASTBRANCH_TOS.
    LbrTos,
    /// MSR_LASTBRANCH_n_FROM_IP.
    LbrFrom(u8),
    /// MSR_LASTBRANCH_n_TO_IP.
    LbrTo(u8),
    /// MSR_LBR_INFO_n.
    LbrInfo(u8),
    /// NetBurst counter n.
    NbCounter(u8),
    /// NetBurst CCCR n.
    NbCccr(u8),
    /// NetBurst ESCR at this MSR index.
    NbEscr(u32),
}

/// `index - base` as a u8 if `index` lies in `base .. base + count`.
fn slot(index: u32, base: u32, count: u8) -> Option<u8> {
    let off = index.checked_sub(base)?;
    let off = u8::try_from(off).ok()?;
    (off < count).then_some(off)
}

/// The PMU MSR `index` of `model`, or None if the model does not have it.
pub fn decode(model: &CpuModel, index: u32) -> Option<Reg> {
    let common = decode_common(model, index);
    if common.is_some() {
        return common;
    }
    match model.arch {
        PmuArch::Architectural => decode_arch(model, index),
        PmuArch::Netburst => decode_netburst(model, index),
    }
}

/// MSRs every model family shares: DEBUGCTL, MISC_ENABLE, DS_AREA, PEBS_ENABLE, LBRs.
fn decode_common(model: &CpuModel, index: u32) -> Option<Reg> {
    let pebs = model.pebs_format != PebsFormat::None;
    let depth = model.lbr_depth;
    let r = match index {
        IA32_DEBUGCTL => Reg::DebugCtl,
        IA32_MISC_ENABLE => Reg::MiscEnable,
        IA32_DS_AREA if model.ds => Reg::DsArea,
        IA32_PEBS_ENABLE if pebs => Reg::PebsEnable,
        MSR_LASTBRANCH_TOS if depth > 0 => Reg::LbrTos,
        MSR_LBR_SELECT if depth > 0 && model.lbr_layout == LbrLayout::Nehalem => Reg::LbrSelect,
        _ => {
            let (from, to) = match model.lbr_layout {
                LbrLayout::Core2 => (CORE2_LASTBRANCH_0_FROM_IP, CORE2_LASTBRANCH_0_TO_IP),
                LbrLayout::Nehalem => (MSR_LASTBRANCH_0_FROM_IP, MSR_LASTBRANCH_0_TO_IP),
            };
            if let Some(n) = slot(index, from, depth) {
                Reg::LbrFrom(n)
            } else if let Some(n) = slot(index, to, depth) {
                Reg::LbrTo(n)
            } else if let Some(n) = slot(index, MSR_LBR_INFO_0, depth) {
                if !model.has_lbr_info() {
                    return None;
                }
                Reg::LbrInfo(n)
            } else {
                return None;
            }
        }
    };
    Some(r)
}

fn decode_arch(model: &CpuModel, index: u32) -> Option<Reg> {
    let v = model.pmu_version;
    if let Some(n) = slot(index, IA32_PMC0, model.num_gp) {
        return Some(Reg::Pmc(n));
    }
    if let Some(n) = slot(index, IA32_A_PMC0, model.num_gp) {
        return model.fw_write.then_some(Reg::APmc(n));
    }
    if let Some(n) = slot(index, IA32_PERFEVTSEL0, model.num_gp) {
        return Some(Reg::EvtSel(n));
    }
    if let Some(i) = slot(index, IA32_FIXED_CTR0, MAX_FIXED_COUNTERS) {
        return model.has_fixed(i).then_some(Reg::FixedCtr(i));
    }
    let r = match index {
        IA32_FIXED_CTR_CTRL if v >= 2 => Reg::FixedCtrl,
        IA32_PERF_GLOBAL_STATUS if v >= 2 => Reg::GlobalStatus,
        IA32_PERF_GLOBAL_CTRL if v >= 2 => Reg::GlobalCtrl,
        IA32_PERF_GLOBAL_OVF_CTRL if v >= 2 => Reg::GlobalOvfCtrl,
        IA32_PERF_GLOBAL_STATUS_SET if v >= 4 => Reg::GlobalStatusSet,
        IA32_PERF_GLOBAL_INUSE if v >= 4 => Reg::GlobalInuse,
        IA32_PERF_CAPABILITIES if model.pdcm => Reg::PerfCapabilities,
        MSR_PEBS_DATA_CFG if model.pebs_format.is_adaptive() => Reg::PebsDataCfg,
        MSR_PEBS_LD_LAT_THRESHOLD if model.pebs_load_latency => Reg::PebsLdLat,
        MSR_PEBS_FRONTEND if model.pebs_frontend => Reg::PebsFrontend,
        _ => return None,
    };
    Some(r)
}

fn decode_netburst(model: &CpuModel, index: u32) -> Option<Reg> {
    let count = u8::try_from(NETBURST_NUM_COUNTERS).unwrap_or(0);
    if let Some(n) = slot(index, MSR_BPU_COUNTER0, count) {
        return Some(Reg::NbCounter(n));
    }
    if let Some(n) = slot(index, MSR_BPU_CCCR0, count) {
        return Some(Reg::NbCccr(n));
    }
    if netburst::escr_exists(model, index) {
        return Some(Reg::NbEscr(index));
    }
    match index {
        NETBURST_PEBS_MATRIX_VERT if model.pebs_format == PebsFormat::Netburst => {
            Some(Reg::PebsMatrixVert)
        }
        _ => None,
    }
}

/// Writable bits of IA32_PERFEVTSELn (SDM Figure 18-6): event, umask, USR, OS, E, PC, INT,
/// EN, INV, CMASK; ANY from v3 unless deprecated; IN_TX everywhere and IN_TXCP on PMC2 only
/// with TSX; the adaptive-record bit 34 with PEBS baseline.
pub fn evtsel_mask(model: &CpuModel, n: u8) -> u64 {
    let mut m = low_bits(32) & !EVTSEL_ANY;
    if model.any_thread() {
        m |= EVTSEL_ANY;
    }
    if model.tsx {
        m |= EVTSEL_IN_TX;
        if n == 2 {
            m |= EVTSEL_IN_TXCP;
        }
    }
    if model.pebs_baseline {
        m |= EVTSEL_ADAPTIVE;
    }
    m
}

/// Writable bits of IA32_FIXED_CTR_CTRL: per existing counter OS, USR, PMI, ANY (v3+ unless
/// deprecated) and, with PEBS baseline, the adaptive bit 32+4i.
pub fn fixed_ctrl_mask(model: &CpuModel) -> u64 {
    let mut field = FIXED_CTRL_OS | FIXED_CTRL_USR | FIXED_CTRL_PMI;
    if model.any_thread() {
        field |= FIXED_CTRL_ANY;
    }
    (0..MAX_FIXED_COUNTERS)
        .filter(|&i| model.has_fixed(i))
        .fold(0, |m, i| {
            let shift = FIXED_CTRL_FIELD_BITS * u32::from(i);
            let adaptive = if model.pebs_baseline {
                1u64 << (FIXED_CTRL_ADAPTIVE_SHIFT + shift)
            } else {
                0
            };
            m | field << shift | adaptive
        })
}

/// Bits IA32_PERF_GLOBAL_OVF_CTRL / STATUS_RESET may clear: the counters, OvfBuffer, CondChgd;
/// from v4 also LBR_Frz, CTR_Frz, ASCI and Ovf_Uncore. Trace_ToPA_PMI (55) is reserved: no
/// model has Intel PT.
pub fn status_reset_mask(model: &CpuModel) -> u64 {
    let mut m = model.global_counter_bits() | OVF_BUFFER | GLOBAL_STATUS_COND_CHGD;
    if model.pmu_version >= 4 {
        m |= GLOBAL_STATUS_LBR_FRZ
            | GLOBAL_STATUS_CTR_FRZ
            | GLOBAL_STATUS_ASCI
            | GLOBAL_STATUS_OVF_UNCORE;
    }
    m
}

/// Bits IA32_PERF_GLOBAL_STATUS_SET (v4+) may set: as the reset mask without CondChgd.
pub fn status_set_mask(model: &CpuModel) -> u64 {
    status_reset_mask(model) & !GLOBAL_STATUS_COND_CHGD
}

/// Writable bits of IA32_DEBUGCTL (SDM 17.4.1) or NetBurst's MSR_DEBUGCTLA (SDM 17.4.x:
/// LBR, BTF, TR, BTS, BTINT, BTS_OFF_OS, BTS_OFF_USR in bits 0-6). BTS bits only where BTS is
/// available; the freeze bits from v2; FREEZE_WHILE_SMM with PERF_CAPABILITIES[12];
/// RTM_DEBUG with TSX.
pub fn debugctl_mask(model: &CpuModel) -> u64 {
    let bts = model.ds && !model.bts_unavailable;
    if model.arch == PmuArch::Netburst {
        let mut m = NETBURST_DEBUGCTLA_LBR | NETBURST_DEBUGCTLA_BTF | NETBURST_DEBUGCTLA_TR;
        if bts {
            m |= NETBURST_DEBUGCTLA_BTS
                | NETBURST_DEBUGCTLA_BTINT
                | NETBURST_DEBUGCTLA_BTS_OFF_OS
                | NETBURST_DEBUGCTLA_BTS_OFF_USR;
        }
        return m;
    }
    let mut m = DEBUGCTL_LBR | DEBUGCTL_BTF | DEBUGCTL_TR;
    if bts {
        m |= DEBUGCTL_BTS | DEBUGCTL_BTINT | DEBUGCTL_BTS_OFF_OS | DEBUGCTL_BTS_OFF_USR;
    }
    if model.pmu_version >= 2 {
        m |= DEBUGCTL_FREEZE_LBRS_ON_PMI | DEBUGCTL_FREEZE_PERFMON_ON_PMI;
    }
    if model.smm_freeze {
        m |= DEBUGCTL_FREEZE_WHILE_SMM;
    }
    if model.tsx {
        m |= DEBUGCTL_RTM_DEBUG;
    }
    m
}

/// Writable bits of IA32_PEBS_ENABLE: PMC0 only for format 0 (Core 2); every PMC from
/// format 1; the fixed counters at 32+i with PEBS baseline; without baseline, the load-latency
/// enables of PMC0-3 at bits 32-35 (Nehalem to Skylake). NetBurst: the replay-tagging metric
/// bits, Enable PEBS (24) and UOP_TAG (25).
pub fn pebs_enable_mask(model: &CpuModel) -> u64 {
    match model.pebs_format {
        PebsFormat::None => 0,
        PebsFormat::Netburst => {
            NETBURST_PEBS_METRIC_MASK | NETBURST_PEBS_ENABLE_BIT | NETBURST_PEBS_UOP_TAG
        }
        PebsFormat::Fmt0 => 1,
        _ => {
            let mut m = model.gp_counter_mask();
            if model.pebs_baseline {
                m |= model.fixed_counter_mask() << GLOBAL_FIXED_SHIFT;
            } else if model.pebs_load_latency {
                let n = model.num_gp.min(PEBS_ENABLE_LD_LAT_COUNTERS);
                m |= low_bits(u32::from(n)) << PEBS_ENABLE_LD_LAT_SHIFT;
            }
            m
        }
    }
}

/// Writable bits of MSR_PEBS_DATA_CFG: the four groups and the LBR entry count [31:24].
pub const fn pebs_data_cfg_mask() -> u64 {
    PEBS_DATACFG_MEMINFO
        | PEBS_DATACFG_GPRS
        | PEBS_DATACFG_XMMS
        | PEBS_DATACFG_LBRS
        | PEBS_DATACFG_LBR_MASK << PEBS_DATACFG_LBR_SHIFT
}

/// Writable bits of MSR_LBR_SELECT: the filters, plus EN_CALLSTACK from LBR format 4.
pub fn lbr_select_mask(model: &CpuModel) -> u64 {
    if model.lbr_format >= 4 {
        LBR_SELECT_FILTER_MASK | LBR_SELECT_EN_CALLSTACK
    } else {
        LBR_SELECT_FILTER_MASK
    }
}

/// Writable bits of MSR_LASTBRANCH_TOS (the guest's check_msr needs it writable).
pub fn lbr_tos_mask(model: &CpuModel) -> u64 {
    u64::from(model.lbr_depth).saturating_sub(1)
}

/// `value` is a canonical 48-bit linear address.
pub fn is_canonical(value: u64) -> bool {
    let top = value >> (CANONICAL_ADDRESS_BITS - 1);
    top == 0 || top == low_bits(64 - (CANONICAL_ADDRESS_BITS - 1))
}

/// Sign-extends bits 31:0 of `value` to 64 bits (the legacy IA32_PMCx write).
pub fn sign_extend_32(value: u64) -> u64 {
    let low = value & low_bits(32);
    if low >> 31 == 1 {
        low | !low_bits(32)
    } else {
        low
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_of_known_parts() {
        let skl = CpuModel::preset("skylake").unwrap();
        assert_eq!(evtsel_mask(&skl, 0), 0x1_FFFF_FFFF);
        assert_eq!(evtsel_mask(&skl, 2), 0x3_FFFF_FFFF);
        assert_eq!(fixed_ctrl_mask(&skl), 0xFFF);
        assert_eq!(pebs_enable_mask(&skl), 0xF_0000_000F);
        let icx = CpuModel::preset("icelake-server").unwrap();
        assert_eq!(evtsel_mask(&icx, 0) & EVTSEL_ANY, 0);
        assert_eq!(fixed_ctrl_mask(&icx), 0x1111_0000_BBBB);
        assert_eq!(pebs_enable_mask(&icx), 0xF_0000_00FF);
        assert_eq!(pebs_enable_mask(&CpuModel::preset("core2").unwrap()), 1);
        let c2 = CpuModel::preset("core2").unwrap();
        assert_eq!(evtsel_mask(&c2, 0), 0xFFDF_FFFF);
        assert_eq!(fixed_ctrl_mask(&c2), 0xBBB);
    }

    #[test]
    fn canonical_and_sign_extension() {
        assert!(is_canonical(0x0000_7FFF_FFFF_F000));
        assert!(is_canonical(0xFFFF_8000_0000_0000));
        assert!(!is_canonical(0x0000_8000_0000_0000));
        assert!(!is_canonical(0x8000_0000_0000_0000));
        assert_eq!(sign_extend_32(0x8000_0000), 0xFFFF_FFFF_8000_0000);
        assert_eq!(sign_extend_32(0xFFFF_FFFF_7FFF_FFFF), 0x7FFF_FFFF);
    }

    #[test]
    fn absent_msrs() {
        let c2 = CpuModel::preset("core2").unwrap();
        assert_eq!(decode(&c2, IA32_PMC0 + 2), None);
        assert_eq!(decode(&c2, IA32_A_PMC0), None);
        assert_eq!(decode(&c2, IA32_PERF_GLOBAL_STATUS_SET), None);
        assert_eq!(decode(&c2, MSR_LBR_SELECT), None);
        assert_eq!(
            decode(&c2, CORE2_LASTBRANCH_0_TO_IP + 3),
            Some(Reg::LbrTo(3))
        );
        let nb = CpuModel::preset("netburst").unwrap();
        assert_eq!(decode(&nb, IA32_FIXED_CTR0), Some(Reg::NbCounter(9)));
        assert_eq!(decode(&nb, IA32_PERF_GLOBAL_CTRL), None);
        assert_eq!(
            decode(&nb, NETBURST_PEBS_MATRIX_VERT),
            Some(Reg::PebsMatrixVert)
        );
        let icx = CpuModel::preset("icelake-server").unwrap();
        assert_eq!(decode(&icx, IA32_FIXED_CTR0 + 3), Some(Reg::FixedCtr(3)));
        assert_eq!(decode(&icx, MSR_LBR_INFO_0 + 31), Some(Reg::LbrInfo(31)));
        assert_eq!(decode(&icx, MSR_LBR_INFO_0 + 32), None);
    }
}
