//! NetBurst (Pentium 4) counters: 18 40-bit counters, each with a CCCR whose ESCR select picks
//! one of the ESCRs wired to its counter group (SDM 18.15, Table 18-69 "Performance Counter
//! MSRs and Associated CCCR and ESCR MSRs"; vol. 4 table 2-43).
//!
//! Honoured: CCCR enable (bit 12), ESCR select, the selected ESCR's T0_OS/T0_USR filters and
//! event select/mask, CCCR OVF (bit 31, set on wrap, cleared by software), OVF_PMI_T0 (bit 26;
//! this model is one logical processor, thread 0, so OVF_PMI_T1 requests nothing), compare /
//! complement / threshold / edge passed to the backend as cmask / inv / edge. Stored only:
//! FORCE_OVF, cascade, active-thread, tagging.

use serde::{Deserialize, Serialize};

use crate::counter::{CounterId, CounterProgram, Event, distance_to_overflow, low_byte};
use crate::model::CpuModel;
use crate::msr::*;

/// Number of ESCR slots from MSR_BSU_ESCR0 to MSR_CRU_ESCR5.
pub const ESCR_SLOTS: usize = (NETBURST_ESCR_LAST - NETBURST_ESCR_FIRST + 1) as usize;
/// Number of counters (= CCCRs).
pub const COUNTERS: usize = NETBURST_NUM_COUNTERS as usize;

/// Every ESCR of a 64-bit Pentium 4 except the IQ pair, in address order.
const ESCRS: &[u32] = &[
    MSR_BSU_ESCR0,
    MSR_BSU_ESCR1,
    MSR_FSB_ESCR0,
    MSR_FSB_ESCR1,
    MSR_FIRM_ESCR0,
    MSR_FIRM_ESCR1,
    MSR_FLAME_ESCR0,
    MSR_FLAME_ESCR1,
    MSR_DAC_ESCR0,
    MSR_DAC_ESCR1,
    MSR_MOB_ESCR0,
    MSR_MOB_ESCR1,
    MSR_PMH_ESCR0,
    MSR_PMH_ESCR1,
    MSR_SAAT_ESCR0,
    MSR_SAAT_ESCR1,
    MSR_U2L_ESCR0,
    MSR_U2L_ESCR1,
    MSR_BPU_ESCR0,
    MSR_BPU_ESCR1,
    MSR_IS_ESCR0,
    MSR_IS_ESCR1,
    MSR_ITLB_ESCR0,
    MSR_ITLB_ESCR1,
    MSR_CRU_ESCR0,
    MSR_CRU_ESCR1,
    MSR_RAT_ESCR0,
    MSR_RAT_ESCR1,
    MSR_SSU_ESCR0,
    MSR_MS_ESCR0,
    MSR_MS_ESCR1,
    MSR_TBPU_ESCR0,
    MSR_TBPU_ESCR1,
    MSR_TC_ESCR0,
    MSR_TC_ESCR1,
    MSR_IX_ESCR0,
    MSR_IX_ESCR1,
    MSR_ALF_ESCR0,
    MSR_ALF_ESCR1,
    MSR_CRU_ESCR2,
    MSR_CRU_ESCR3,
    MSR_CRU_ESCR4,
    MSR_CRU_ESCR5,
];

/// MSR_IQ_ESCR0/1 exist only on family 0FH models 1 and 2 (vol. 4 table 2-43 notes).
const IQ_ESCR_LAST_MODEL: u32 = 2;

/// Whether `msr` is an ESCR of `model`. 0x3BF (Linux lists an SSU_ESCR1 there), 0x3C6-0x3C7
/// and 0x3CE-0x3DF are holes per the SDM and raise #GP.
pub fn escr_exists(model: &CpuModel, msr: u32) -> bool {
    ESCRS.contains(&msr)
        || (model.model <= IQ_ESCR_LAST_MODEL && (msr == MSR_IQ_ESCR0 || msr == MSR_IQ_ESCR1))
}

/// The ESCR that CCCR ESCR-select `select` names for counter `counter` (SDM table of counter /
/// CCCR / ESCR associations): counters 0-1, 4-5, 8-9, 12-13 and 16 use the ESCR0 side, the
/// others the ESCR1 side.
pub fn escr_for(counter: u8, select: u8) -> Option<u32> {
    let side1 = matches!(counter, 2 | 3 | 6 | 7 | 10 | 11 | 14 | 15 | 17);
    let pair = |a: u32, b: u32| Some(if side1 { b } else { a });
    match (counter, select) {
        (0..=3, 0) => pair(MSR_BPU_ESCR0, MSR_BPU_ESCR1),
        (0..=3, 1) => pair(MSR_IS_ESCR0, MSR_IS_ESCR1),
        (0..=3, 2) => pair(MSR_MOB_ESCR0, MSR_MOB_ESCR1),
        (0..=3, 3) => pair(MSR_ITLB_ESCR0, MSR_ITLB_ESCR1),
        (0..=3, 4) => pair(MSR_PMH_ESCR0, MSR_PMH_ESCR1),
        (0..=3, 5) => pair(MSR_IX_ESCR0, MSR_IX_ESCR1),
        (0..=3, 6) => pair(MSR_FSB_ESCR0, MSR_FSB_ESCR1),
        (0..=3, 7) => pair(MSR_BSU_ESCR0, MSR_BSU_ESCR1),
        (4..=7, 0) => pair(MSR_MS_ESCR0, MSR_MS_ESCR1),
        (4..=7, 1) => pair(MSR_TC_ESCR0, MSR_TC_ESCR1),
        (4..=7, 2) => pair(MSR_TBPU_ESCR0, MSR_TBPU_ESCR1),
        (8..=11, 0) => pair(MSR_FLAME_ESCR0, MSR_FLAME_ESCR1),
        (8..=11, 1) => pair(MSR_FIRM_ESCR0, MSR_FIRM_ESCR1),
        (8..=11, 2) => pair(MSR_SAAT_ESCR0, MSR_SAAT_ESCR1),
        (8..=11, 3) => pair(MSR_U2L_ESCR0, MSR_U2L_ESCR1),
        (8..=11, 5) => pair(MSR_DAC_ESCR0, MSR_DAC_ESCR1),
        (12..=17, 0) => pair(MSR_IQ_ESCR0, MSR_IQ_ESCR1),
        (12..=17, 1) => pair(MSR_ALF_ESCR0, MSR_ALF_ESCR1),
        (12..=17, 2) => pair(MSR_RAT_ESCR0, MSR_RAT_ESCR1),
        (12..=17, 3) if !side1 => Some(MSR_SSU_ESCR0),
        (12..=17, 4) => pair(MSR_CRU_ESCR0, MSR_CRU_ESCR1),
        (12..=17, 5) => pair(MSR_CRU_ESCR2, MSR_CRU_ESCR3),
        (12..=17, 6) => pair(MSR_CRU_ESCR4, MSR_CRU_ESCR5),
        _ => None,
    }
}

/// NetBurst event selects used by Linux's generic events (arch/x86/events/intel/p4.c).
const EV_INSTR_RETIRED: u8 = 0x02;
const EV_MISPRED_BRANCH_RETIRED: u8 = 0x03;
const EV_RETIRED_BRANCH_TYPE: u8 = 0x04;
const EV_GLOBAL_POWER_EVENTS: u8 = 0x13;

/// Decodes an ESCR value at `escr`.
pub fn decode_escr(escr: u32, value: u64) -> Event {
    let event = low_byte((value >> ESCR_EVENT_SELECT_SHIFT) & ESCR_EVENT_SELECT_MASK);
    let mask = u16::try_from((value >> ESCR_EVENT_MASK_SHIFT) & ESCR_EVENT_MASK_MASK).unwrap_or(0);
    let cru01 = escr == MSR_CRU_ESCR0 || escr == MSR_CRU_ESCR1;
    match event {
        EV_INSTR_RETIRED if cru01 => Event::InstructionsRetired,
        EV_MISPRED_BRANCH_RETIRED if cru01 => Event::BranchMisses,
        EV_GLOBAL_POWER_EVENTS if escr == MSR_FSB_ESCR0 || escr == MSR_FSB_ESCR1 => {
            Event::CoreCycles
        }
        EV_RETIRED_BRANCH_TYPE if escr == MSR_TBPU_ESCR0 || escr == MSR_TBPU_ESCR1 => {
            Event::BranchesRetired {
                umask: low_byte(u64::from(mask)),
            }
        }
        _ => Event::Netburst { escr, event, mask },
    }
}

/// NetBurst counter state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetburstPmu {
    /// Counter values (40 bits).
    pub counters: [u64; COUNTERS],
    /// CCCRs.
    pub cccrs: [u64; COUNTERS],
    /// ESCRs by `msr - NETBURST_ESCR_FIRST` (holes stay 0).
    pub escrs: Vec<u64>,
}

impl Default for NetburstPmu {
    fn default() -> Self {
        Self {
            counters: [0; COUNTERS],
            cccrs: [0; COUNTERS],
            escrs: vec![0; ESCR_SLOTS],
        }
    }
}

impl NetburstPmu {
    /// The ESCR value at `msr` (0 outside the range).
    pub fn escr(&self, msr: u32) -> u64 {
        msr.checked_sub(NETBURST_ESCR_FIRST)
            .and_then(|i| self.escrs.get(usize::try_from(i).ok()?))
            .copied()
            .unwrap_or(0)
    }

    /// Stores an ESCR value.
    pub fn set_escr(&mut self, msr: u32, value: u64) {
        let slot = msr
            .checked_sub(NETBURST_ESCR_FIRST)
            .and_then(|i| usize::try_from(i).ok())
            .and_then(|i| self.escrs.get_mut(i));
        if let Some(s) = slot {
            *s = value;
        }
    }

    /// What counter `c` counts, if it is enabled and its ESCR lets it count at some CPL.
    pub fn program(&self, model: &CpuModel, c: u8, pebs: bool) -> Option<CounterProgram> {
        let cccr = *self.cccrs.get(usize::from(c))?;
        if cccr & CCCR_ENABLE == 0 {
            return None;
        }
        let select = low_byte((cccr >> CCCR_ESCR_SELECT_SHIFT) & CCCR_ESCR_SELECT_MASK);
        let escr = escr_for(c, select).filter(|&e| escr_exists(model, e))?;
        let value = self.escr(escr);
        let (usr, os) = (value & ESCR_T0_USR != 0, value & ESCR_T0_OS != 0);
        if !usr && !os {
            return None;
        }
        let threshold = low_byte((cccr >> CCCR_THRESHOLD_SHIFT) & CCCR_THRESHOLD_MASK);
        Some(CounterProgram {
            id: CounterId::Netburst(c),
            event: decode_escr(escr, value),
            raw: value,
            usr,
            os,
            edge: cccr & CCCR_EDGE != 0,
            inv: cccr & CCCR_COMPLEMENT != 0,
            cmask: if cccr & CCCR_COMPARE != 0 {
                threshold
            } else {
                0
            },
            any: false,
            pebs,
            pmi: cccr & CCCR_OVF_PMI_T0 != 0,
            distance: distance_to_overflow(self.counters[usize::from(c)], NETBURST_COUNTER_WIDTH),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linux_generic_event_bindings() {
        // INSTR_RETIRED: CRU_ESCR0/1 with ESCR select 4 on IQ counters 12,13,16 / 14,15,17.
        assert_eq!(escr_for(12, 4), Some(MSR_CRU_ESCR0));
        assert_eq!(escr_for(16, 4), Some(MSR_CRU_ESCR0));
        assert_eq!(escr_for(17, 4), Some(MSR_CRU_ESCR1));
        // GLOBAL_POWER_EVENTS: FSB_ESCR0/1, select 6, BPU counters 0,1 / 2,3.
        assert_eq!(escr_for(1, 6), Some(MSR_FSB_ESCR0));
        assert_eq!(escr_for(3, 6), Some(MSR_FSB_ESCR1));
        assert_eq!(escr_for(4, 5), None);
        assert_eq!(escr_for(14, 3), None);
        let instr = (u64::from(EV_INSTR_RETIRED) << ESCR_EVENT_SELECT_SHIFT) | ESCR_T0_OS;
        assert_eq!(
            decode_escr(MSR_CRU_ESCR0, instr),
            Event::InstructionsRetired
        );
        assert!(matches!(
            decode_escr(MSR_CRU_ESCR2, instr),
            Event::Netburst { event: 2, .. }
        ));
    }

    #[test]
    fn escr_holes() {
        let m = CpuModel::preset("netburst").unwrap();
        let present = (NETBURST_ESCR_FIRST..=NETBURST_ESCR_LAST).filter(|&i| escr_exists(&m, i));
        assert_eq!(present.count(), ESCRS.len());
        assert!(!escr_exists(&m, MSR_IQ_ESCR0) && !escr_exists(&m, 0x3BF));
        let mut old = m.clone();
        old.model = 2;
        assert!(escr_exists(&old, MSR_IQ_ESCR1));
    }
}
