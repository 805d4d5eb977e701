//! Counting with the precise backend: exact counts of a counted region at CPL0, overflow into
//! IA32_PERF_GLOBAL_STATUS, PMI through LVTPC only when INT / the fixed PMI bit is set, LVTPC
//! masked after delivery, OVF_CTRL clearing status, freeze on PMI.

use crate::preset;
use guest_tests::msr_index::*;
use guest_tests::pmu::expect::{Preset, event, ones};
use guest_tests::pmu::region::{self, REGION_BRANCHES, REGION_CYCLES, REGION_INSNS};
use guest_tests::pmu::{rd_ok, set_lvtpc, wait_pmis, wr_ok};
use guest_tests::test::TestResult;
use guest_tests::{ensure, ensure_eq, lapic, pmi};

/// Counts from -OVERFLOW_AFTER overflow after that many counted instructions (inside the
/// region, which counts [`REGION_INSNS`]).
const OVERFLOW_AFTER: u64 = 50;

/// LVTPC for fixed delivery on the runtime's PMI vector, unmasked.
fn lvtpc_fixed() -> u32 {
    pmi::lvtpc_fixed()
}

/// Stop and clear everything: GLOBAL_CTRL, selectors, counters, status, DEBUGCTL; LVTPC
/// unmasked on the fixed PMI vector.
fn quiesce(p: &Preset) -> TestResult {
    wr_ok(IA32_PERF_GLOBAL_CTRL, 0)?;
    wr_ok(IA32_FIXED_CTR_CTRL, 0)?;
    for n in 0..p.num_gp() {
        wr_ok(IA32_PERFEVTSEL0 + n, 0)?;
        wr_ok(IA32_PMC0 + n, 0)?;
    }
    for i in (0..4).filter(|&i| p.has_fixed(i)) {
        wr_ok(IA32_FIXED_CTR0 + i, 0)?;
    }
    wr_ok(IA32_PERF_GLOBAL_OVF_CTRL, p.status_reset_writable())?;
    wr_ok(IA32_DEBUGCTL, 0)?;
    ensure_eq!(
        rd_ok(IA32_PERF_GLOBAL_STATUS)?,
        0,
        "GLOBAL_STATUS after clearing"
    );
    set_lvtpc(lvtpc_fixed())
}

/// Run the counted region enabling `global` in IA32_PERF_GLOBAL_CTRL and disabling all.
fn run_global(global: u64) {
    // SAFETY: PMU MSR writes only.
    unsafe { region::run(IA32_PERF_GLOBAL_CTRL, global, IA32_PERF_GLOBAL_CTRL) }
}

/// `-k` at a counter width.
fn minus(k: u64, width: u32) -> u64 {
    k.wrapping_neg() & ones(width)
}

/// PMC0 counts instructions retired (0xC0) at OS only: exactly the region; USR only: 0 (all of
/// it runs at CPL0); both: the region. PMC1 counts branches retired (0xC4) at the same time.
pub fn exact_count_os_usr() -> TestResult {
    let p = preset();
    quiesce(p)?;
    let cases = [
        (EVTSEL_OS, REGION_INSNS, REGION_BRANCHES),
        (EVTSEL_USR, 0, 0),
        (EVTSEL_OS | EVTSEL_USR, REGION_INSNS, REGION_BRANCHES),
    ];
    for (cpl, insns, branches) in cases {
        wr_ok(IA32_PMC0, 0)?;
        wr_ok(IA32_PMC0 + 1, 0)?;
        wr_ok(IA32_PERFEVTSEL0, event::INSTRUCTIONS | cpl | EVTSEL_EN)?;
        wr_ok(IA32_PERFEVTSEL0 + 1, event::BRANCHES | cpl | EVTSEL_EN)?;
        run_global(0b11);
        ensure_eq!(
            rd_ok(IA32_PMC0)?,
            insns,
            "instructions retired (USR=bit16 OS=bit17)"
        );
        ensure_eq!(rd_ok(IA32_PMC0 + 1)?, branches, "branches retired");
        ensure_eq!(
            rd_ok(IA32_PERF_GLOBAL_STATUS)?,
            0,
            "GLOBAL_STATUS without overflow"
        );
    }
    quiesce(p)
}

/// Fixed counter 0 (instructions retired) counts the region exactly at OS, nothing at USR.
pub fn fixed_counter_exact_count() -> TestResult {
    let p = preset();
    quiesce(p)?;
    for (ctrl, want) in [(0x1, REGION_INSNS), (0x2, 0), (0x3, REGION_INSNS)] {
        wr_ok(IA32_FIXED_CTR0, 0)?;
        wr_ok(IA32_FIXED_CTR_CTRL, ctrl)?;
        run_global(1 << 32);
        ensure_eq!(
            rd_ok(IA32_FIXED_CTR0)?,
            want,
            "IA32_FIXED_CTR0 (ctrl in low bits)"
        );
    }
    quiesce(p)
}

/// Unhalted core cycles (3CH umask 0 on PMC0, fixed counter 1) and reference cycles (fixed
/// counter 2) follow the precise backend's deterministic cost model exactly.
pub fn cycles_cost_model() -> TestResult {
    let p = preset();
    quiesce(p)?;
    wr_ok(IA32_PERFEVTSEL0, event::CORE_CYCLES | EVTSEL_OS | EVTSEL_EN)?;
    // Fixed counters 1 and 2 at OS (fields 1 and 2 of IA32_FIXED_CTR_CTRL).
    wr_ok(IA32_FIXED_CTR_CTRL, 0x110)?;
    run_global(1 | 0b110 << 32);
    ensure_eq!(rd_ok(IA32_PMC0)?, REGION_CYCLES, "core cycles on PMC0");
    ensure_eq!(
        rd_ok(IA32_FIXED_CTR0 + 1)?,
        REGION_CYCLES,
        "FIXED_CTR1 core cycles"
    );
    ensure_eq!(
        rd_ok(IA32_FIXED_CTR0 + 2)?,
        REGION_CYCLES,
        "FIXED_CTR2 reference cycles"
    );
    ensure_eq!(rd_ok(IA32_FIXED_CTR0)?, 0, "FIXED_CTR0 not enabled");
    quiesce(p)
}

/// A counter without EN, or whose GLOBAL_CTRL bit stays clear, does not count.
pub fn disabled_counters_do_not_count() -> TestResult {
    let p = preset();
    quiesce(p)?;
    // PMC0 enabled but its global bit clear; PMC1 global bit set but EN clear. Fixed 0 enabled
    // so that the region does count something.
    wr_ok(
        IA32_PERFEVTSEL0,
        event::INSTRUCTIONS | EVTSEL_OS | EVTSEL_EN,
    )?;
    wr_ok(IA32_PERFEVTSEL0 + 1, event::INSTRUCTIONS | EVTSEL_OS)?;
    wr_ok(IA32_FIXED_CTR_CTRL, 0x1)?;
    run_global(0b10 | 1 << 32);
    ensure_eq!(rd_ok(IA32_PMC0)?, 0, "PMC0 with GLOBAL_CTRL bit 0 clear");
    ensure_eq!(rd_ok(IA32_PMC0 + 1)?, 0, "PMC1 with EN clear");
    ensure_eq!(rd_ok(IA32_FIXED_CTR0)?, REGION_INSNS, "fixed counter 0");
    quiesce(p)
}

/// Program PMC0 for an overflow after [`OVERFLOW_AFTER`] instructions; `int` sets EVTSEL.INT.
fn arm_pmc0(p: &Preset, int: bool) -> TestResult {
    // A legacy write of the negative 32-bit value sign-extends to the full width.
    wr_ok(IA32_PMC0, minus(OVERFLOW_AFTER, 32))?;
    ensure_eq!(
        rd_ok(IA32_PMC0)?,
        minus(OVERFLOW_AFTER, p.gp_width()),
        "PMC0 armed"
    );
    let int = if int { EVTSEL_INT } else { 0 };
    wr_ok(
        IA32_PERFEVTSEL0,
        event::INSTRUCTIONS | EVTSEL_OS | EVTSEL_EN | int,
    )
}

/// After the overflowing region: PMC0 holds what it counted past the wrap.
fn check_wrapped_pmc0() -> TestResult {
    ensure_eq!(
        rd_ok(IA32_PMC0)?,
        REGION_INSNS - OVERFLOW_AFTER,
        "PMC0 after the wrap"
    );
    Ok(())
}

/// Overflow with INT and LVTPC on the fixed vector: GLOBAL_STATUS bit 0, exactly one PMI on
/// the vector, LVTPC then reads back masked.
pub fn overflow_status_and_pmi() -> TestResult {
    let p = preset();
    quiesce(p)?;
    arm_pmc0(p, true)?;
    let (fixed0, nmi0) = (pmi::fixed_count(), pmi::nmi_count());
    run_global(1);
    ensure_eq!(
        rd_ok(IA32_PERF_GLOBAL_STATUS)?,
        1,
        "GLOBAL_STATUS after PMC0 overflow"
    );
    check_wrapped_pmc0()?;
    let seen = wait_pmis(fixed0 + nmi0);
    ensure_eq!(seen, 1, "PMIs delivered");
    ensure_eq!(pmi::fixed_count() - fixed0, 1, "PMIs on the fixed vector");
    ensure_eq!(pmi::nmi_count() - nmi0, 0, "NMIs");
    ensure_eq!(
        lapic::lvtpc(),
        lvtpc_fixed() | lapic::LVT_MASKED,
        "LVTPC after the PMI"
    );
    quiesce(p)
}

/// Overflow without INT: the status bit is set, no PMI, LVTPC stays unmasked.
pub fn overflow_no_int_no_pmi() -> TestResult {
    let p = preset();
    quiesce(p)?;
    arm_pmc0(p, false)?;
    let before = pmi::pmi_count();
    run_global(1);
    ensure_eq!(
        rd_ok(IA32_PERF_GLOBAL_STATUS)?,
        1,
        "GLOBAL_STATUS after PMC0 overflow"
    );
    check_wrapped_pmc0()?;
    ensure_eq!(wait_pmis(before), 0, "PMIs without INT");
    ensure_eq!(lapic::lvtpc(), lvtpc_fixed(), "LVTPC without a PMI");
    quiesce(p)
}

/// Two counters overflow; OVF_CTRL clears exactly the bits written.
pub fn ovf_ctrl_clears_status() -> TestResult {
    let p = preset();
    quiesce(p)?;
    for n in 0..2 {
        wr_ok(IA32_PMC0 + n, minus(OVERFLOW_AFTER + u64::from(n), 32))?;
        wr_ok(
            IA32_PERFEVTSEL0 + n,
            event::INSTRUCTIONS | EVTSEL_OS | EVTSEL_EN,
        )?;
    }
    run_global(0b11);
    ensure_eq!(
        rd_ok(IA32_PERF_GLOBAL_STATUS)?,
        0b11,
        "GLOBAL_STATUS, two overflows"
    );
    ensure_eq!(
        rd_ok(IA32_PMC0 + 1)?,
        REGION_INSNS - OVERFLOW_AFTER - 1,
        "PMC1 after the wrap"
    );
    wr_ok(IA32_PERF_GLOBAL_OVF_CTRL, 0b01)?;
    ensure_eq!(
        rd_ok(IA32_PERF_GLOBAL_STATUS)?,
        0b10,
        "after clearing bit 0"
    );
    wr_ok(IA32_PERF_GLOBAL_OVF_CTRL, 0b10)?;
    ensure_eq!(rd_ok(IA32_PERF_GLOBAL_STATUS)?, 0, "after clearing bit 1");
    // Clearing does not touch the counters.
    check_wrapped_pmc0()?;
    quiesce(p)
}

/// LVTPC in NMI mode: the overflow arrives as one NMI, LVTPC is masked afterwards. (The NMI
/// may land inside the region, so the counts are not checked here.)
pub fn nmi_mode_pmi() -> TestResult {
    let p = preset();
    quiesce(p)?;
    set_lvtpc(pmi::lvtpc_nmi())?;
    arm_pmc0(p, true)?;
    let (fixed0, nmi0) = (pmi::fixed_count(), pmi::nmi_count());
    run_global(1);
    let seen = wait_pmis(fixed0 + nmi0);
    ensure_eq!(seen, 1, "PMIs delivered");
    ensure_eq!(pmi::nmi_count() - nmi0, 1, "NMIs");
    ensure_eq!(pmi::fixed_count() - fixed0, 0, "fixed-vector PMIs");
    ensure!(
        rd_ok(IA32_PERF_GLOBAL_STATUS)? & 1 == 1,
        "GLOBAL_STATUS bit 0 not set"
    );
    ensure_eq!(
        lapic::lvtpc(),
        pmi::lvtpc_nmi() | lapic::LVT_MASKED,
        "LVTPC after the NMI"
    );
    quiesce(p)
}

/// FREEZE_PERFMON_ON_PMI: PMC0 overflows with INT after [`OVERFLOW_AFTER`] instructions while
/// PMC1 counts the same instructions from 0. The PMI freezes every counter, so PMC1 stops at
/// exactly OVERFLOW_AFTER. v4+: GLOBAL_STATUS.CTR_Frz (59) is set, GLOBAL_CTRL is kept and the
/// counters stay frozen until CTR_Frz is cleared through STATUS_RESET (SDM 18.2.4.1). v2/v3:
/// the PMI clears IA32_PERF_GLOBAL_CTRL (SDM 17.4.7).
pub fn freeze_on_pmi() -> TestResult {
    let p = preset();
    quiesce(p)?;
    wr_ok(IA32_DEBUGCTL, DEBUGCTL_FREEZE_PERFMON_ON_PMI)?;
    arm_pmc0(p, true)?;
    wr_ok(
        IA32_PERFEVTSEL0 + 1,
        event::INSTRUCTIONS | EVTSEL_OS | EVTSEL_EN,
    )?;
    let before = pmi::pmi_count();
    // Disable through FIXED_CTR_CTRL (0, fixed counters unused) so that GLOBAL_CTRL shows
    // what the freeze did to it.
    // SAFETY: PMU MSR writes only.
    unsafe { region::run(IA32_PERF_GLOBAL_CTRL, 0b11, IA32_FIXED_CTR_CTRL) };
    let status = rd_ok(IA32_PERF_GLOBAL_STATUS)?;
    let ctrl = rd_ok(IA32_PERF_GLOBAL_CTRL)?;
    let (pmc0, pmc1) = (rd_ok(IA32_PMC0)?, rd_ok(IA32_PMC0 + 1)?);
    ensure_eq!(wait_pmis(before), 1, "PMIs delivered");
    ensure_eq!(pmc0, 0, "PMC0 frozen at the wrap");
    ensure_eq!(pmc1, OVERFLOW_AFTER, "PMC1 frozen at the PMI");
    if p.version() >= 4 {
        ensure_eq!(status, 1 | GLOBAL_STATUS_CTR_FRZ, "GLOBAL_STATUS (v4+)");
        ensure_eq!(ctrl, 0b11, "GLOBAL_CTRL kept (v4+)");
        // Still frozen: another region counts nothing.
        wr_ok(IA32_PERFEVTSEL0, 0)?;
        run_global(0b11);
        ensure_eq!(
            rd_ok(IA32_PMC0 + 1)?,
            OVERFLOW_AFTER,
            "PMC1 while CTR_Frz is set"
        );
        wr_ok(IA32_PERF_GLOBAL_OVF_CTRL, 1 | GLOBAL_STATUS_CTR_FRZ)?;
        ensure_eq!(
            rd_ok(IA32_PERF_GLOBAL_STATUS)?,
            0,
            "GLOBAL_STATUS after reset"
        );
    } else {
        ensure_eq!(status, 1, "GLOBAL_STATUS (v2/v3)");
        ensure_eq!(ctrl, 0, "GLOBAL_CTRL cleared by the PMI (v2/v3)");
        wr_ok(IA32_PERF_GLOBAL_OVF_CTRL, 1)?;
        wr_ok(IA32_PERFEVTSEL0, 0)?;
    }
    // Unfrozen: PMC1 counts the next region in full.
    set_lvtpc(lvtpc_fixed())?;
    run_global(0b10);
    ensure_eq!(
        rd_ok(IA32_PMC0 + 1)?,
        OVERFLOW_AFTER + REGION_INSNS,
        "PMC1 after unfreezing"
    );
    quiesce(p)
}

/// Fixed counter 0 overflows: GLOBAL_STATUS bit 32; a PMI only with the PMI bit (3).
pub fn fixed_counter_overflow() -> TestResult {
    let p = preset();
    quiesce(p)?;
    for pmi_bit in [true, false] {
        set_lvtpc(lvtpc_fixed())?;
        wr_ok(IA32_FIXED_CTR0, minus(OVERFLOW_AFTER, p.fixed_width()))?;
        wr_ok(IA32_FIXED_CTR_CTRL, if pmi_bit { 0x9 } else { 0x1 })?;
        let before = pmi::pmi_count();
        run_global(1 << 32);
        ensure_eq!(rd_ok(IA32_PERF_GLOBAL_STATUS)?, 1 << 32, "GLOBAL_STATUS");
        ensure_eq!(
            rd_ok(IA32_FIXED_CTR0)?,
            REGION_INSNS - OVERFLOW_AFTER,
            "FIXED_CTR0 after the wrap"
        );
        ensure_eq!(
            wait_pmis(before),
            u64::from(pmi_bit),
            "PMIs (1 iff PMI bit)"
        );
        let want = if pmi_bit {
            lvtpc_fixed() | lapic::LVT_MASKED
        } else {
            lvtpc_fixed()
        };
        ensure_eq!(lapic::lvtpc(), want, "LVTPC");
        wr_ok(IA32_PERF_GLOBAL_OVF_CTRL, 1 << 32)?;
    }
    quiesce(p)
}
