//! Counter identities, event decoding and what the backend is told to count.

use serde::{Deserialize, Serialize};

use crate::model::{CpuModel, PebsFormat};
use crate::msr::*;

/// A counter of the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum CounterId {
    /// General-purpose counter IA32_PMCn.
    Gp(u8),
    /// Fixed-function counter IA32_FIXED_CTRi.
    Fixed(u8),
    /// NetBurst counter n (MSR_BPU_COUNTER0 + n).
    Netburst(u8),
}

impl CounterId {
    /// The IA32_PERF_GLOBAL_STATUS / PEBS "applicable counters" bit: GP n -> n, fixed i ->
    /// 32+i; NetBurst counters use their index (IQ_COUNTER4 is mapped to bit 0 only for the
    /// PEBS assist).
    pub fn status_bit(self) -> u32 {
        match self {
            CounterId::Gp(n) | CounterId::Netburst(n) => u32::from(n),
            CounterId::Fixed(i) => GLOBAL_FIXED_SHIFT + u32::from(i),
        }
    }

    /// The counter whose architectural status bit is `bit`.
    pub fn from_status_bit(bit: u32) -> Option<CounterId> {
        match bit {
            0..32 => u8::try_from(bit).ok().map(CounterId::Gp),
            32..64 => u8::try_from(bit - GLOBAL_FIXED_SHIFT)
                .ok()
                .map(CounterId::Fixed),
            _ => None,
        }
    }
}

/// What a counter counts, as far as a backend needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Event {
    /// Instructions retired (arch event C0H/00H, fixed counter 0, NetBurst instr_retired).
    InstructionsRetired,
    /// Branch instructions retired (C4H), with the unit mask selecting the branch kinds.
    BranchesRetired {
        /// Unit mask (0 = all branches).
        umask: u8,
    },
    /// Mispredicted branches retired (C5H).
    BranchMisses,
    /// Loads retired (model-specific encoding, see [`decode_evtsel`]).
    LoadsRetired,
    /// Stores retired.
    StoresRetired,
    /// Unhalted core cycles (3CH/00H, fixed counter 1, NetBurst global_power_events).
    CoreCycles,
    /// Unhalted reference cycles (3CH/01H, fixed counter 2).
    RefCycles,
    /// Any other architectural-style event.
    Other {
        /// Event select.
        event: u8,
        /// Unit mask.
        umask: u8,
    },
    /// A NetBurst event not mapped to the above.
    Netburst {
        /// ESCR MSR index.
        escr: u32,
        /// ESCR event select (bits 30:25).
        event: u8,
        /// ESCR event mask (bits 24:9).
        mask: u16,
    },
}

/// Architectural event codes (SDM Table 18-1).
const EV_CORE_CYCLES: u8 = 0x3C;
const EV_INST_RETIRED: u8 = 0xC0;
const EV_BRANCHES: u8 = 0xC4;
const EV_BRANCH_MISSES: u8 = 0xC5;
const UMASK_REF_CYCLES: u8 = 0x01;
/// UOPS_RETIRED.ALL (Sandy Bridge to Broadwell).
const EV_UOPS_RETIRED: u8 = 0xC2;
const UMASK_UOPS_ALL: u8 = 0x01;
/// TOPDOWN.SLOTS, counted by fixed counter 3.
const EV_TOPDOWN_SLOTS: u8 = 0xA4;
const UMASK_TOPDOWN_SLOTS: u8 = 0x01;
/// Core 2: INST_RETIRED.LOADS / .STORES (C0H umask 01H / 02H).
const CORE2_LOADS: (u8, u8) = (0xC0, 0x01);
const CORE2_STORES: (u8, u8) = (0xC0, 0x02);
/// Nehalem: MEM_INST_RETIRED.LOADS / .STORES (0BH umask 01H / 02H).
const NHM_LOADS: (u8, u8) = (0x0B, 0x01);
const NHM_STORES: (u8, u8) = (0x0B, 0x02);
/// Haswell and later: MEM_UOPS_RETIRED / MEM_INST_RETIRED.ALL_LOADS / ALL_STORES (D0H 81H/82H).
const HSW_LOADS: (u8, u8) = (0xD0, 0x81);
const HSW_STORES: (u8, u8) = (0xD0, 0x82);
/// A CMASK at or above the widest retirement makes `inv` count every cycle: Linux's precise
/// cycles alias (INST_RETIRED with INV and CMASK=16) relies on it.
const CMASK_ALWAYS: u8 = 16;

/// Bits 7:0 of `v`.
#[allow(clippy::cast_possible_truncation, reason = "masked to 8 bits first")]
pub fn low_byte(v: u64) -> u8 {
    (v & 0xFF) as u8
}

/// Decodes an IA32_PERFEVTSELx value for `model`. Loads/stores use the model generation's
/// encoding, taken from its PEBS format: fmt0 Core 2, fmt1 Nehalem, otherwise Haswell+.
pub fn decode_evtsel(model: &CpuModel, evtsel: u64) -> Event {
    let event = low_byte(evtsel & EVTSEL_EVENT_MASK);
    let umask = low_byte(evtsel >> EVTSEL_UMASK_SHIFT);
    let cmask = low_byte(evtsel >> EVTSEL_CMASK_SHIFT);
    let (loads, stores) = match model.pebs_format {
        PebsFormat::Fmt0 => (CORE2_LOADS, CORE2_STORES),
        PebsFormat::Fmt1 => (NHM_LOADS, NHM_STORES),
        _ => (HSW_LOADS, HSW_STORES),
    };
    if (event, umask) == loads {
        return Event::LoadsRetired;
    }
    if (event, umask) == stores {
        return Event::StoresRetired;
    }
    match (event, umask) {
        // Linux's precise-cycles aliases: INST_RETIRED (Skylake) or UOPS_RETIRED.ALL (C2H/01H,
        // Sandy Bridge to Broadwell) with INV and CMASK=16 are true on every cycle.
        (EV_INST_RETIRED, _) | (EV_UOPS_RETIRED, UMASK_UOPS_ALL)
            if evtsel & EVTSEL_INV != 0 && cmask >= CMASK_ALWAYS =>
        {
            Event::CoreCycles
        }
        (EV_INST_RETIRED, _) => Event::InstructionsRetired,
        (EV_CORE_CYCLES, UMASK_REF_CYCLES) => Event::RefCycles,
        (EV_CORE_CYCLES, 0) => Event::CoreCycles,
        (EV_BRANCHES, umask) => Event::BranchesRetired { umask },
        (EV_BRANCH_MISSES, _) => Event::BranchMisses,
        (event, umask) => Event::Other { event, umask },
    }
}

/// The event of fixed counter `i` (SDM Table 18-2 and 18.2.5).
pub fn fixed_event(i: u8) -> Event {
    match i {
        0 => Event::InstructionsRetired,
        1 => Event::CoreCycles,
        2 => Event::RefCycles,
        _ => Event::Other {
            event: EV_TOPDOWN_SLOTS,
            umask: UMASK_TOPDOWN_SLOTS,
        },
    }
}

/// What one enabled counter counts, as the backend must program it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CounterProgram {
    /// The counter.
    pub id: CounterId,
    /// The decoded event.
    pub event: Event,
    /// The raw selector (IA32_PERFEVTSELx, the fixed control field, or the ESCR value) for
    /// backends that can program it directly.
    pub raw: u64,
    /// Count at CPL > 0.
    pub usr: bool,
    /// Count at CPL 0.
    pub os: bool,
    /// Edge detect.
    pub edge: bool,
    /// Invert the CMASK comparison.
    pub inv: bool,
    /// Counter mask (threshold); 0 = count every event.
    pub cmask: u8,
    /// AnyThread.
    pub any: bool,
    /// Overflow goes through the PEBS assist.
    pub pebs: bool,
    /// An overflow requests a PMI (EVTSEL.INT, fixed PMI, CCCR OVF_PMI_T0).
    pub pmi: bool,
    /// Events until the counter wraps: 2^width - value (>= 1).
    pub distance: u64,
}

impl CounterProgram {
    /// A program counting `event` with the given privilege filters and distance to overflow,
    /// and nothing else set (no EDGE/INV/CMASK/ANY, no PEBS, no PMI): for backends' tests.
    pub fn plain(id: CounterId, event: Event, usr: bool, os: bool, distance: u64) -> Self {
        CounterProgram {
            id,
            event,
            raw: 0,
            usr,
            os,
            edge: false,
            inv: false,
            cmask: 0,
            any: false,
            pebs: false,
            pmi: false,
            distance,
        }
    }

    /// The counter counts at privilege level `cpl`.
    pub fn counts_at(&self, cpl: u8) -> bool {
        if cpl == 0 { self.os } else { self.usr }
    }
}

/// Events until a `width`-bit counter holding `value` wraps.
pub fn distance_to_overflow(value: u64, width: u8) -> u64 {
    let mask = crate::model::low_bits(u32::from(width));
    mask - (value & mask) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(name: &str) -> CpuModel {
        CpuModel::preset(name).unwrap()
    }

    #[test]
    fn precise_cycles_aliases_are_cycles() {
        // Linux: intel_pebs_aliases_snb (haswell) and _skl (skylake).
        assert_eq!(
            decode_evtsel(&model("haswell"), 0x1080_01c2),
            Event::CoreCycles
        );
        assert_eq!(
            decode_evtsel(&model("skylake"), 0x1080_00c0),
            Event::CoreCycles
        );
        assert_eq!(
            decode_evtsel(&model("haswell"), 0x01c2),
            Event::Other {
                event: 0xc2,
                umask: 0x01
            }
        );
    }

    #[test]
    fn architectural_events() {
        let m = model("skylake");
        assert_eq!(decode_evtsel(&m, 0x4300C0), Event::InstructionsRetired);
        assert_eq!(decode_evtsel(&m, 0x43003C), Event::CoreCycles);
        assert_eq!(decode_evtsel(&m, 0x43013C), Event::RefCycles);
        assert_eq!(
            decode_evtsel(&m, 0x4320C4),
            Event::BranchesRetired { umask: 0x20 }
        );
        assert_eq!(decode_evtsel(&m, 0x4300C5), Event::BranchMisses);
        assert_eq!(decode_evtsel(&m, 0x4381D0), Event::LoadsRetired);
        assert_eq!(decode_evtsel(&m, 0x4382D0), Event::StoresRetired);
        assert_eq!(
            decode_evtsel(&m, 0x434F2E),
            Event::Other {
                event: 0x2E,
                umask: 0x4F
            }
        );
        // Linux's cycles:pp alias on Skylake.
        assert_eq!(decode_evtsel(&m, 0x1083_00C0), Event::CoreCycles);
    }

    #[test]
    fn loads_and_stores_follow_the_generation() {
        assert_eq!(
            decode_evtsel(&model("core2"), 0x4301C0),
            Event::LoadsRetired
        );
        assert_eq!(
            decode_evtsel(&model("skylake"), 0x4301C0),
            Event::InstructionsRetired
        );
        assert_eq!(
            decode_evtsel(&model("nehalem"), 0x43020B),
            Event::StoresRetired
        );
        assert_eq!(
            decode_evtsel(&model("haswell"), 0x43020B),
            Event::Other {
                event: 0xB,
                umask: 2
            }
        );
    }

    #[test]
    fn status_bits_round_trip() {
        for id in [
            CounterId::Gp(0),
            CounterId::Gp(7),
            CounterId::Fixed(0),
            CounterId::Fixed(3),
        ] {
            assert_eq!(CounterId::from_status_bit(id.status_bit()), Some(id));
        }
        assert_eq!(CounterId::Fixed(1).status_bit(), 33);
        assert_eq!(CounterId::from_status_bit(64), None);
    }

    #[test]
    fn distance() {
        assert_eq!(distance_to_overflow(0, 48), 1 << 48);
        assert_eq!(distance_to_overflow((1 << 48) - 1, 48), 1);
        assert_eq!(distance_to_overflow(u64::MAX, 40), 1);
        assert_eq!(distance_to_overflow((1 << 48) - 100, 48), 100);
    }
}
