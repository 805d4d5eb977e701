//! NetBurst (Pentium 4) PMU: 18 40-bit counters at 0x300-0x311, their CCCRs at 0x360-0x371 and
//! the ESCRs at 0x3A0-0x3E1 with holes (SDM 18.15 and vol. 4 table 2-43 for a 64-bit,
//! family 0FH model 6 part, which has no MSR_IQ_ESCR0/1). No architectural PMU MSRs.

use crate::arch::Rng;
use guest_tests::msr_index::*;
use guest_tests::pmu::expect::ones;
use guest_tests::pmu::region::{self, REGION_INSNS};
use guest_tests::pmu::{expect_rd_gp, expect_wr_gp, rd_ok, set_lvtpc, wait_pmis, wr_ok};
use guest_tests::test::TestResult;
use guest_tests::{ensure_eq, lapic, pmi};

/// Counter width (SDM 18.15.2: 40-bit counters).
const WIDTH: u32 = 40;
/// CCCR writable bits (SDM 18.15.3 and 18.16.4, the CCCR with Hyper-Threading): enable (12), ESCR select (15:13),
/// active thread (17:16), compare (18), complement (19), threshold (23:20), edge (24),
/// FORCE_OVF (25), OVF_PMI_T0 (26), OVF_PMI_T1 (27), cascade (30), OVF (31).
const CCCR_MASK: u64 = 0xCFFF_F000;
/// ESCR writable bits 30:0: T1/T0 USR/OS (3:0), tag enable (4), tag value (8:5), event mask
/// (24:9), event select (30:25); bit 31 reserved.
const ESCR_MASK: u64 = 0x7FFF_FFFF;
/// MSR_IQ_COUNTER4 / MSR_IQ_CCCR4.
const IQ_COUNTER4: u32 = 0x310;
const IQ_CCCR4: u32 = 0x370;
/// MSR_CRU_ESCR0: INSTR_RETIRED (event select 2) for IQ counters 12, 13, 16 with CCCR ESCR
/// select 4.
const CRU_ESCR0: u32 = 0x3B8;
/// Instructions retired, non-bogus non-tagged (event mask bit 0), at OS (T0_OS, bit 3) / USR
/// (T0_USR, bit 2).
const ESCR_INSTR_RETIRED: u64 = 2 << 25 | 1 << 9;
const ESCR_T0_OS_BIT: u64 = 1 << 3;
const ESCR_T0_USR_BIT: u64 = 1 << 2;
/// CCCR: enable, ESCR select 4, active thread 11b (any), OVF_PMI_T0 optional.
const CCCR_COUNT_CRU0: u64 = 1 << 12 | 4 << 13 | 3 << 16;
const CCCR_OVF_PMI: u64 = 1 << 26;
const CCCR_OVF_FLAG: u64 = 1 << 31;
const OVERFLOW_AFTER: u64 = 50;

/// The ESCRs of a 64-bit family 0FH model 3+ Pentium 4 (vol. 4 table 2-43).
fn is_escr(i: u32) -> bool {
    (0x3A0..=0x3B9).contains(&i)
        || (0x3BC..=0x3BE).contains(&i)
        || (0x3C0..=0x3C5).contains(&i)
        || (0x3C8..=0x3CD).contains(&i)
        || i == 0x3E0
        || i == 0x3E1
}

fn escrs() -> impl Iterator<Item = u32> {
    (0x3A0..=0x3E1).filter(|&i| is_escr(i))
}

/// Counters, CCCRs and ESCRs all reset to 0.
pub fn nb_reset_values() -> TestResult {
    for k in 0..18 {
        ensure_eq!(rd_ok(MSR_BPU_COUNTER0 + k)?, 0, "counter reset");
        ensure_eq!(rd_ok(MSR_BPU_CCCR0 + k)?, 0, "CCCR reset");
    }
    for e in escrs() {
        ensure_eq!(rd_ok(e)?, 0, "ESCR reset");
    }
    Ok(())
}

/// No architectural PMU: IA32_PMC0, IA32_PERFEVTSEL0, the global controls and
/// IA32_PERF_CAPABILITIES #GP.
pub fn nb_arch_msrs_absent() -> TestResult {
    for (msr, what) in [
        (IA32_PMC0, "IA32_PMC0"),
        (IA32_PERFEVTSEL0, "IA32_PERFEVTSEL0"),
        (IA32_FIXED_CTR_CTRL, "IA32_FIXED_CTR_CTRL"),
        (IA32_PERF_GLOBAL_STATUS, "IA32_PERF_GLOBAL_STATUS"),
        (IA32_PERF_GLOBAL_CTRL, "IA32_PERF_GLOBAL_CTRL"),
        (IA32_PERF_GLOBAL_OVF_CTRL, "IA32_PERF_GLOBAL_OVF_CTRL"),
        (IA32_PERF_CAPABILITIES, "IA32_PERF_CAPABILITIES"),
    ] {
        expect_rd_gp(msr, what)?;
        expect_wr_gp(msr, 0, what)?;
    }
    Ok(())
}

/// Counters take any 40-bit value; bit 40 and up are reserved.
pub fn nb_counter_readback() -> TestResult {
    let mut rng = Rng::new();
    for k in 0..18 {
        let c = MSR_BPU_COUNTER0 + k;
        for v in [ones(WIDTH), 0x80_0000_0000, rng.next() & ones(WIDTH)] {
            wr_ok(c, v)?;
            ensure_eq!(rd_ok(c)?, v, "counter read-back");
        }
        expect_wr_gp(c, 1 << WIDTH, "counter bit 40")?;
        expect_wr_gp(c, 1 << 63, "counter bit 63")?;
        wr_ok(c, 0)?;
    }
    Ok(())
}

fn check_rw(msr: u32, mask: u64, rng: &mut Rng, what: &str) -> TestResult {
    wr_ok(msr, mask)?;
    ensure_eq!(rd_ok(msr)?, mask, what);
    let v = rng.next() & mask;
    wr_ok(msr, v)?;
    ensure_eq!(rd_ok(msr)?, v, what);
    wr_ok(msr, 0)?;
    for b in (0..64).filter(|b| mask >> b & 1 == 0) {
        expect_wr_gp(msr, 1 << b, what)?;
    }
    ensure_eq!(rd_ok(msr)?, 0, what);
    Ok(())
}

/// CCCR writable bits read back; reserved bits 11:0, 29:28, 63:32 #GP.
pub fn nb_cccr_readback() -> TestResult {
    let mut rng = Rng::new();
    for k in 0..18 {
        // ESCRs are all 0, so an enabled CCCR counts nothing (no CPL selected).
        check_rw(MSR_BPU_CCCR0 + k, CCCR_MASK, &mut rng, "CCCR")?;
    }
    Ok(())
}

/// ESCR bits 30:0 read back, bit 31 and up #GP; the holes in 0x3A0-0x3E1 (IQ_ESCR0/1 at
/// 0x3BA/0x3BB on this model, 0x3BF, 0x3C6-0x3C7, 0x3CE-0x3DF) and 0x3E2 #GP.
pub fn nb_escr_readback_and_holes() -> TestResult {
    let mut rng = Rng::new();
    for e in escrs() {
        check_rw(e, ESCR_MASK, &mut rng, "ESCR")?;
    }
    for i in (0x3A0..=0x3E2).filter(|&i| !is_escr(i)) {
        expect_rd_gp(i, "ESCR hole")?;
        expect_wr_gp(i, 0, "ESCR hole")?;
    }
    Ok(())
}

/// Count the region on IQ_COUNTER4: enable through the CCCR, disable by clearing the ESCR
/// (which keeps the CCCR's OVF flag for inspection).
fn run_iq4(cccr: u64) {
    // SAFETY: PMU MSR writes only.
    unsafe { region::run(IQ_CCCR4, cccr, CRU_ESCR0) }
}

/// INSTR_RETIRED on IQ_COUNTER4 counts the region exactly with T0_OS, nothing with T0_USR.
pub fn nb_exact_count() -> TestResult {
    for (cpl, want) in [(ESCR_T0_OS_BIT, REGION_INSNS), (ESCR_T0_USR_BIT, 0)] {
        wr_ok(IQ_CCCR4, 0)?;
        wr_ok(IQ_COUNTER4, 0)?;
        wr_ok(CRU_ESCR0, ESCR_INSTR_RETIRED | cpl)?;
        run_iq4(CCCR_COUNT_CRU0);
        ensure_eq!(
            rd_ok(IQ_COUNTER4)?,
            want,
            "IQ_COUNTER4 (T0_USR=bit2 T0_OS=bit3)"
        );
        ensure_eq!(rd_ok(IQ_CCCR4)?, CCCR_COUNT_CRU0, "CCCR without overflow");
    }
    wr_ok(IQ_CCCR4, 0)
}

fn overflow(pmi_bit: bool) -> TestResult {
    set_lvtpc(pmi::lvtpc_fixed())?;
    wr_ok(IQ_CCCR4, 0)?;
    wr_ok(IQ_COUNTER4, OVERFLOW_AFTER.wrapping_neg() & ones(WIDTH))?;
    wr_ok(CRU_ESCR0, ESCR_INSTR_RETIRED | ESCR_T0_OS_BIT)?;
    let cccr = CCCR_COUNT_CRU0 | if pmi_bit { CCCR_OVF_PMI } else { 0 };
    let before = pmi::pmi_count();
    run_iq4(cccr);
    ensure_eq!(
        rd_ok(IQ_CCCR4)?,
        cccr | CCCR_OVF_FLAG,
        "CCCR OVF (bit 31) after the wrap"
    );
    ensure_eq!(
        rd_ok(IQ_COUNTER4)?,
        REGION_INSNS - OVERFLOW_AFTER,
        "IQ_COUNTER4 after the wrap"
    );
    ensure_eq!(
        wait_pmis(before),
        u64::from(pmi_bit),
        "PMIs (1 iff OVF_PMI_T0)"
    );
    let want = if pmi_bit {
        pmi::lvtpc_fixed() | lapic::LVT_MASKED
    } else {
        pmi::lvtpc_fixed()
    };
    ensure_eq!(lapic::lvtpc(), want, "LVTPC");
    // OVF is sticky until software clears it.
    wr_ok(IQ_CCCR4, cccr)?;
    ensure_eq!(rd_ok(IQ_CCCR4)?, cccr, "CCCR after clearing OVF");
    wr_ok(IQ_CCCR4, 0)?;
    wr_ok(IQ_COUNTER4, 0)
}

/// IQ_COUNTER4 overflow with OVF_PMI_T0: CCCR.OVF set, one PMI through LVTPC, LVTPC masked.
pub fn nb_iq_counter4_overflow_pmi() -> TestResult {
    overflow(true)
}

/// The same overflow without OVF_PMI_T0: CCCR.OVF set, no PMI.
pub fn nb_overflow_no_pmi() -> TestResult {
    overflow(false)
}
