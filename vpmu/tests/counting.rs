//! Counting semantics through the in-memory backend: enable/disable, USR/OS filtering, wrap at
//! the width (status + PMI only with INT), OVF_CTRL, freeze on PMI, sign extension, NetBurst,
//! and the serde round trip.

use vpmu::Vpmu;
use vpmu::backend::InMemoryBackend;
use vpmu::counter::{CounterId, Event};
use vpmu::mem::VecMemory;
use vpmu::model::CpuModel;
use vpmu::msr::*;
use vpmu::state::{EventInfo, GuestState};

const INST_ANY: u64 = 0xC0;
fn user() -> GuestState {
    let mut s = GuestState {
        cpl: 3,
        ..Default::default()
    };
    s.gprs.rip = 0x40_1000;
    s
}

fn kernel() -> GuestState {
    GuestState { cpl: 0, ..user() }
}

struct Rig {
    pmu: Vpmu,
    backend: InMemoryBackend,
    mem: VecMemory,
}

impl Rig {
    fn new(name: &str) -> Rig {
        Rig {
            pmu: Vpmu::new(CpuModel::preset(name).unwrap()),
            backend: InMemoryBackend::new(),
            mem: VecMemory::new(1 << 16),
        }
    }
    fn w(&mut self, msr: u32, v: u64) {
        self.pmu.wrmsr(msr, v).unwrap();
    }
    fn r(&mut self, msr: u32) -> u64 {
        self.pmu.rdmsr(msr).unwrap()
    }
    /// Programs the backend, retires `n` events at `state` and feeds the counts back.
    fn run(&mut self, event: Event, n: u64, state: GuestState) -> vpmu::OverflowOutcome {
        self.pmu
            .sync_backend(&mut self.backend, &mut self.mem)
            .unwrap();
        self.backend.retire(event, n, state, EventInfo::default());
        self.pmu
            .sync_backend(&mut self.backend, &mut self.mem)
            .unwrap()
    }
}

#[test]
fn enable_disable_and_global_ctrl() {
    let mut t = Rig::new("skylake");
    assert_eq!(t.r(IA32_PERF_GLOBAL_CTRL), 0xF, "GP enables set at reset");
    t.w(IA32_PERFEVTSEL0, INST_ANY | EVTSEL_USR | EVTSEL_OS);
    t.run(Event::InstructionsRetired, 100, user());
    assert_eq!(t.r(IA32_PMC0), 0, "EN clear: no counting");
    t.w(
        IA32_PERFEVTSEL0,
        INST_ANY | EVTSEL_USR | EVTSEL_OS | EVTSEL_EN,
    );
    t.run(Event::InstructionsRetired, 100, user());
    assert_eq!(t.r(IA32_PMC0), 100);
    assert_eq!(t.pmu.rdpmc(0), Ok(100));
    t.w(IA32_PERF_GLOBAL_CTRL, 0);
    assert!(t.pmu.programs().is_empty());
    t.run(Event::InstructionsRetired, 100, user());
    assert_eq!(t.r(IA32_PMC0), 100, "GLOBAL_CTRL clear: no counting");
    t.w(IA32_PERF_GLOBAL_CTRL, 1 << 33);
    t.w(IA32_FIXED_CTR_CTRL, (FIXED_CTRL_OS | FIXED_CTRL_USR) << 4);
    t.run(Event::CoreCycles, 7, kernel());
    assert_eq!(t.r(IA32_FIXED_CTR0 + 1), 7);
    assert_eq!(t.r(IA32_PERF_GLOBAL_INUSE), 1 | 1 << 33);
}

#[test]
fn usr_os_filter() {
    let mut t = Rig::new("nehalem");
    t.w(IA32_PERFEVTSEL0 + 1, INST_ANY | EVTSEL_USR | EVTSEL_EN);
    t.w(IA32_PERFEVTSEL0 + 2, INST_ANY | EVTSEL_OS | EVTSEL_EN);
    t.run(Event::InstructionsRetired, 5, user());
    t.run(Event::InstructionsRetired, 9, kernel());
    assert_eq!(t.r(IA32_PMC0 + 1), 5);
    assert_eq!(t.r(IA32_PMC0 + 2), 9);
}

#[test]
fn wrap_sets_status_and_pmi_only_with_int() {
    for int in [false, true] {
        let mut t = Rig::new("skylake");
        // -10 through the legacy alias: sign-extended to the 48-bit width.
        t.w(IA32_PMC0, 0xFFFF_FFF6);
        assert_eq!(t.r(IA32_PMC0), (1 << 48) - 10);
        let sel = INST_ANY | EVTSEL_USR | EVTSEL_EN | if int { EVTSEL_INT } else { 0 };
        t.w(IA32_PERFEVTSEL0, sel);
        assert_eq!(t.pmu.programs()[0].distance, 10);
        let out = t.run(Event::InstructionsRetired, 9, user());
        assert!(!out.pmi);
        assert_eq!(t.r(IA32_PERF_GLOBAL_STATUS), 0);
        let out = t.run(Event::InstructionsRetired, 3, user());
        assert_eq!(t.r(IA32_PMC0), 2, "wrapped at 2^48");
        assert_eq!(t.r(IA32_PERF_GLOBAL_STATUS), 1);
        assert_eq!(out.pmi, int);
        assert_eq!(t.pmu.take_pmi_request(), int);
        assert!(!t.pmu.take_pmi_request());
        assert_eq!(t.pmu.programs()[0].distance, (1 << 48) - 2, "reprogrammed");
        t.w(IA32_PERF_GLOBAL_OVF_CTRL, 1);
        assert_eq!(t.r(IA32_PERF_GLOBAL_STATUS), 0, "OVF_CTRL clears");
    }
}

#[test]
fn full_width_alias_and_fixed_pmi() {
    let mut t = Rig::new("icelake-server");
    t.w(IA32_A_PMC0 + 3, 0x8000_0000);
    assert_eq!(t.r(IA32_PMC0 + 3), 0x8000_0000, "A_PMC: no sign extension");
    t.w(IA32_FIXED_CTR0 + 2, (1 << 48) - 1);
    t.w(IA32_FIXED_CTR_CTRL, (FIXED_CTRL_OS | FIXED_CTRL_PMI) << 8);
    t.w(IA32_PERF_GLOBAL_CTRL, 1 << 34);
    let out = t.run(Event::RefCycles, 1, kernel());
    assert!(out.pmi);
    assert_eq!(t.r(IA32_PERF_GLOBAL_STATUS), 1 << 34);
}

#[test]
fn freeze_perfmon_on_pmi_v4_and_v3() {
    // v4: CTR_Frz stops counting until cleared through STATUS_RESET.
    let mut t = Rig::new("skylake");
    t.w(
        IA32_DEBUGCTL,
        DEBUGCTL_FREEZE_PERFMON_ON_PMI | DEBUGCTL_FREEZE_LBRS_ON_PMI,
    );
    t.w(IA32_PMC0, (1 << 48) - 1);
    t.w(
        IA32_PERFEVTSEL0,
        INST_ANY | EVTSEL_USR | EVTSEL_EN | EVTSEL_INT,
    );
    assert!(t.run(Event::InstructionsRetired, 1, user()).pmi);
    let status = t.r(IA32_PERF_GLOBAL_STATUS);
    assert_eq!(status, 1 | GLOBAL_STATUS_CTR_FRZ | GLOBAL_STATUS_LBR_FRZ);
    assert!(t.pmu.programs().is_empty());
    t.run(Event::InstructionsRetired, 5, user());
    assert_eq!(t.r(IA32_PMC0), 0, "frozen");
    t.w(IA32_PERF_GLOBAL_OVF_CTRL, status);
    t.run(Event::InstructionsRetired, 5, user());
    assert_eq!(t.r(IA32_PMC0), 5, "unfrozen");

    // v3: the PMI clears GLOBAL_CTRL and DEBUGCTL.LBR.
    let mut t = Rig::new("haswell");
    t.w(
        IA32_DEBUGCTL,
        DEBUGCTL_FREEZE_PERFMON_ON_PMI | DEBUGCTL_FREEZE_LBRS_ON_PMI | DEBUGCTL_LBR,
    );
    t.w(IA32_PMC0, (1 << 48) - 1);
    t.w(
        IA32_PERFEVTSEL0,
        INST_ANY | EVTSEL_USR | EVTSEL_EN | EVTSEL_INT,
    );
    assert!(t.run(Event::InstructionsRetired, 1, user()).pmi);
    assert_eq!(t.r(IA32_PERF_GLOBAL_CTRL), 0);
    assert_eq!(t.r(IA32_DEBUGCTL) & DEBUGCTL_LBR, 0);
    assert_eq!(t.r(IA32_PERF_GLOBAL_STATUS), 1);
}

#[test]
fn without_freeze_counting_continues() {
    let mut t = Rig::new("skylake");
    t.w(IA32_PMC0, (1 << 48) - 1);
    t.w(
        IA32_PERFEVTSEL0,
        INST_ANY | EVTSEL_USR | EVTSEL_EN | EVTSEL_INT,
    );
    assert!(t.run(Event::InstructionsRetired, 1, user()).pmi);
    t.run(Event::InstructionsRetired, 4, user());
    assert_eq!(t.r(IA32_PMC0), 4);
}

#[test]
fn netburst_counting_and_ovf() {
    let mut t = Rig::new("netburst");
    // INSTR_RETIRED on CRU_ESCR0 (select 4) counted by IQ_COUNTER0 (0x30C / CCCR 0x36C).
    t.w(
        MSR_CRU_ESCR0,
        0x02 << ESCR_EVENT_SELECT_SHIFT | 0x3 << ESCR_EVENT_MASK_SHIFT | ESCR_T0_USR,
    );
    let cccr = 12;
    t.w(MSR_BPU_COUNTER0 + cccr, (1 << 40) - 3);
    t.w(
        MSR_BPU_CCCR0 + cccr,
        CCCR_ENABLE | 4 << CCCR_ESCR_SELECT_SHIFT | 3 << CCCR_ACTIVE_THREAD_SHIFT | CCCR_OVF_PMI_T0,
    );
    let p = t.pmu.programs();
    assert_eq!(p.len(), 1);
    assert_eq!(p[0].id, CounterId::Netburst(12));
    assert_eq!(p[0].event, Event::InstructionsRetired);
    t.run(Event::InstructionsRetired, 2, kernel());
    assert_eq!(t.r(MSR_BPU_COUNTER0 + cccr), (1 << 40) - 3, "T0_OS clear");
    let out = t.run(Event::InstructionsRetired, 5, user());
    assert!(out.pmi);
    assert_eq!(t.r(MSR_BPU_COUNTER0 + cccr), 2);
    assert_ne!(t.r(MSR_BPU_CCCR0 + cccr) & CCCR_OVF, 0);
    // Wrong ESCR select for the counter group: nothing counts.
    t.w(
        MSR_BPU_CCCR0 + cccr,
        CCCR_ENABLE | 7 << CCCR_ESCR_SELECT_SHIFT,
    );
    assert!(t.pmu.programs().is_empty());
}

#[test]
fn unmapped_ds_area_drops_pebs_without_pmi() {
    let mut t = Rig::new("skylake");
    t.w(IA32_DS_AREA, 0xFFFF_FE00_0000_0000);
    t.w(IA32_PEBS_ENABLE, 1);
    t.w(IA32_PMC0, (1 << 48) - 1);
    t.w(IA32_PERFEVTSEL0, INST_ANY | EVTSEL_USR | EVTSEL_EN);
    assert!(t.pmu.programs()[0].pebs);
    let out = t.run(Event::InstructionsRetired, 1, user());
    assert!(!out.pmi);
    assert_eq!(out.records_written, 0);
    assert_eq!(out.pebs_counters, 1);
    assert_eq!(out.dropped.len(), 1);
    assert_eq!(t.r(IA32_PERF_GLOBAL_STATUS), 1, "own bit set, no OvfBuffer");
}

#[test]
fn serde_round_trip_gives_identical_msr_reads() {
    for name in vpmu::model::PRESET_NAMES {
        let m = CpuModel::preset(name).unwrap();
        let mut p = Vpmu::new(m.clone());
        // Dirty every MSR that takes a value.
        let mut seed = 0x1234_5678_9ABC_DEF1u64;
        for r in vpmu::trapped_msrs(&m) {
            for i in r {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let _ = p.wrmsr(i, seed);
                let _ = p.wrmsr(i, seed & 0xFFFF);
            }
        }
        let text = serde_json::to_string(&p).unwrap();
        let mut q: Vpmu = serde_json::from_str(&text).unwrap();
        for r in vpmu::trapped_msrs(&m) {
            for i in r {
                assert_eq!(p.rdmsr(i), q.rdmsr(i), "{name} {i:#x}");
            }
        }
        assert_eq!(p.programs(), q.programs());
        assert_eq!(p.generation(), q.generation());
    }
}
