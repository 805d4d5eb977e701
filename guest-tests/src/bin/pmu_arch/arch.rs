//! Architectural PMU MSRs without counting: reset values, read-back of writable bits, #GP on
//! reserved bits, on counters the model lacks and on MSRs of later PMU versions.

use crate::preset;
use guest_tests::msr_index::*;
use guest_tests::pmu::expect::{Preset, ones};
use guest_tests::pmu::{expect_rd_gp, expect_wr_gp, rd_ok, wr_ok};
use guest_tests::test::TestResult;
use guest_tests::{ensure, ensure_eq};

/// xorshift64: deterministic patterns.
pub struct Rng(u64);

impl Rng {
    /// A generator with a fixed seed.
    pub const fn new() -> Self {
        Self(0x9E37_79B9_7F4A_7C15)
    }

    /// Next value.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Bits 31:0 sign-extended to 64 bits (legacy IA32_PMCx write, SDM 18.2.6).
pub fn sext32(v: u64) -> u64 {
    let low = v & ones(32);
    if low >> 31 == 1 { low | !ones(32) } else { low }
}

fn gp_indices(p: &Preset) -> core::ops::Range<u32> {
    0..p.num_gp()
}

fn fixed_indices(p: &Preset) -> impl Iterator<Item = u32> + '_ {
    (0..4u32).filter(|&i| p.has_fixed(i))
}

/// Every counter, selector and global MSR reads its reset value. Runs before any test writes.
pub fn reset_values() -> TestResult {
    let p = preset();
    for n in gp_indices(p) {
        ensure_eq!(rd_ok(IA32_PMC0 + n)?, 0, "IA32_PMC reset");
        ensure_eq!(rd_ok(IA32_PERFEVTSEL0 + n)?, 0, "IA32_PERFEVTSEL reset");
        if p.fw_write() {
            ensure_eq!(rd_ok(IA32_A_PMC0 + n)?, 0, "IA32_A_PMC reset");
        }
    }
    for i in fixed_indices(p) {
        ensure_eq!(rd_ok(IA32_FIXED_CTR0 + i)?, 0, "IA32_FIXED_CTR reset");
    }
    ensure_eq!(rd_ok(IA32_FIXED_CTR_CTRL)?, 0, "IA32_FIXED_CTR_CTRL reset");
    // SDM 18.2.2: at reset the PMC enable bits of IA32_PERF_GLOBAL_CTRL are set (so that
    // v1-style software enabling through IA32_PERFEVTSELx.EN alone works), fixed ones clear.
    ensure_eq!(
        rd_ok(IA32_PERF_GLOBAL_CTRL)?,
        ones(p.num_gp()),
        "IA32_PERF_GLOBAL_CTRL reset"
    );
    ensure_eq!(rd_ok(IA32_PERF_GLOBAL_STATUS)?, 0, "GLOBAL_STATUS reset");
    ensure_eq!(rd_ok(IA32_PERF_GLOBAL_OVF_CTRL)?, 0, "GLOBAL_OVF_CTRL read");
    if p.version() >= 4 {
        ensure_eq!(rd_ok(IA32_PERF_GLOBAL_STATUS_SET)?, 0, "STATUS_SET read");
        ensure_eq!(rd_ok(IA32_PERF_GLOBAL_INUSE)?, 0, "GLOBAL_INUSE reset");
    }
    ensure_eq!(rd_ok(IA32_DEBUGCTL)?, 0, "IA32_DEBUGCTL reset");
    Ok(())
}

/// #GP on MSRs the model does not have: PMC/EVTSEL/A_PMC n for n = num_gp, A_PMC without
/// FW_WRITE, FIXED_CTR i for the first absent i, STATUS_SET / INUSE below v4.
pub fn absent_msrs_gp() -> TestResult {
    let p = preset();
    let n = p.num_gp();
    for (msr, what) in [
        (IA32_PMC0 + n, "IA32_PMC[num_gp]"),
        (IA32_PERFEVTSEL0 + n, "IA32_PERFEVTSEL[num_gp]"),
        (IA32_A_PMC0 + n, "IA32_A_PMC[num_gp]"),
    ] {
        expect_rd_gp(msr, what)?;
        expect_wr_gp(msr, 0, what)?;
    }
    if !p.fw_write() {
        for k in gp_indices(p) {
            expect_rd_gp(IA32_A_PMC0 + k, "IA32_A_PMC without FW_WRITE")?;
            expect_wr_gp(IA32_A_PMC0 + k, 0, "IA32_A_PMC without FW_WRITE")?;
        }
    }
    if let Some(i) = (0..5u32).find(|&i| !p.has_fixed(i)) {
        expect_rd_gp(IA32_FIXED_CTR0 + i, "absent IA32_FIXED_CTR")?;
        expect_wr_gp(IA32_FIXED_CTR0 + i, 0, "absent IA32_FIXED_CTR")?;
    }
    if p.version() < 4 {
        for (msr, what) in [
            (IA32_PERF_GLOBAL_STATUS_SET, "STATUS_SET below v4"),
            (IA32_PERF_GLOBAL_INUSE, "GLOBAL_INUSE below v4"),
        ] {
            expect_rd_gp(msr, what)?;
            expect_wr_gp(msr, 0, what)?;
        }
    }
    Ok(())
}

/// Writable mask reads back, random patterns within it read back, every reserved bit alone
/// raises #GP and leaves the MSR unchanged.
fn check_rw(msr: u32, mask: u64, rng: &mut Rng, what: &str) -> TestResult {
    wr_ok(msr, mask)?;
    ensure_eq!(rd_ok(msr)?, mask, what);
    for _ in 0..4 {
        let v = rng.next() & mask;
        wr_ok(msr, v)?;
        ensure_eq!(rd_ok(msr)?, v, what);
    }
    wr_ok(msr, 0)?;
    for b in (0..64).filter(|b| mask >> b & 1 == 0) {
        expect_wr_gp(msr, 1 << b, what)?;
    }
    ensure_eq!(rd_ok(msr)?, 0, what);
    Ok(())
}

/// Read-back and reserved-bit rules of the counters, selectors and global controls.
pub fn readback_and_reserved_bits() -> TestResult {
    let p = preset();
    let mut rng = Rng::new();
    // Nothing counts while the selectors take arbitrary values.
    wr_ok(IA32_PERF_GLOBAL_CTRL, 0)?;
    let width = ones(p.gp_width());
    for n in gp_indices(p) {
        let pmc = IA32_PMC0 + n;
        // Legacy writes: bits 31:0 sign-extended to the counter width (SDM 18.2.6).
        for v in [
            0,
            1,
            0x7FFF_FFFF,
            0x8000_0000,
            0xFFFF_FFFF,
            u64::MAX,
            0x1234_5678_9ABC_DEF0,
            rng.next(),
        ] {
            wr_ok(pmc, v)?;
            ensure_eq!(rd_ok(pmc)?, sext32(v) & width, "IA32_PMC legacy write");
            if p.fw_write() {
                ensure_eq!(
                    rd_ok(IA32_A_PMC0 + n)?,
                    sext32(v) & width,
                    "IA32_A_PMC alias"
                );
            }
        }
        if p.fw_write() {
            // Full-width writes: any value within the width; bits above it are reserved.
            let a = IA32_A_PMC0 + n;
            for v in [width, 0x1_0000_0000, rng.next() & width] {
                wr_ok(a, v)?;
                ensure_eq!(rd_ok(a)?, v, "IA32_A_PMC full-width write");
                ensure_eq!(rd_ok(pmc)?, v, "IA32_PMC after full-width write");
            }
            expect_wr_gp(a, 1 << p.gp_width(), "IA32_A_PMC beyond the width")?;
            expect_wr_gp(a, 1 << 63, "IA32_A_PMC bit 63")?;
        }
        wr_ok(pmc, 0)?;
        check_rw(
            IA32_PERFEVTSEL0 + n,
            p.evtsel_writable(n),
            &mut rng,
            "IA32_PERFEVTSEL",
        )?;
    }
    let fwidth = ones(p.fixed_width());
    for i in fixed_indices(p) {
        let f = IA32_FIXED_CTR0 + i;
        for v in [fwidth, 0x8000_0000, rng.next() & fwidth] {
            wr_ok(f, v)?;
            ensure_eq!(rd_ok(f)?, v, "IA32_FIXED_CTR read-back");
        }
        expect_wr_gp(f, 1 << p.fixed_width(), "IA32_FIXED_CTR beyond the width")?;
        wr_ok(f, 0)?;
    }
    check_rw(
        IA32_FIXED_CTR_CTRL,
        p.fixed_ctrl_writable(),
        &mut rng,
        "IA32_FIXED_CTR_CTRL",
    )?;
    check_rw(
        IA32_PERF_GLOBAL_CTRL,
        p.counter_bits(),
        &mut rng,
        "IA32_PERF_GLOBAL_CTRL",
    )?;
    // GLOBAL_STATUS is read-only (SDM: writes #GP).
    expect_wr_gp(IA32_PERF_GLOBAL_STATUS, 0, "write to GLOBAL_STATUS")?;
    expect_wr_gp(IA32_PERF_GLOBAL_STATUS, 1, "write to GLOBAL_STATUS")?;
    // OVF_CTRL / STATUS_RESET: the clear bits are accepted, the others #GP.
    let reset = p.status_reset_writable();
    wr_ok(IA32_PERF_GLOBAL_OVF_CTRL, reset)?;
    for b in (0..64).filter(|b| reset >> b & 1 == 0) {
        expect_wr_gp(
            IA32_PERF_GLOBAL_OVF_CTRL,
            1 << b,
            "GLOBAL_OVF_CTRL reserved bit",
        )?;
    }
    ensure_eq!(rd_ok(IA32_PERF_GLOBAL_STATUS)?, 0, "GLOBAL_STATUS");
    Ok(())
}

/// v4+: STATUS_SET sets exactly the written GLOBAL_STATUS bits, STATUS_RESET clears them;
/// reserved bits of STATUS_SET #GP. Below v4 the MSRs are absent (see `absent_msrs_gp`).
pub fn status_set_reset() -> TestResult {
    let p = preset();
    if p.version() < 4 {
        return Ok(());
    }
    wr_ok(IA32_PERF_GLOBAL_CTRL, 0)?;
    let set = p.status_set_writable();
    let mut rng = Rng::new();
    for v in [1, 1 << 32, 1 << 62, 1 << 59, set, rng.next() & set] {
        wr_ok(IA32_PERF_GLOBAL_STATUS_SET, v)?;
        ensure_eq!(
            rd_ok(IA32_PERF_GLOBAL_STATUS)?,
            v,
            "GLOBAL_STATUS after STATUS_SET"
        );
        ensure_eq!(rd_ok(IA32_PERF_GLOBAL_STATUS_SET)?, 0, "STATUS_SET reads 0");
        wr_ok(IA32_PERF_GLOBAL_OVF_CTRL, v)?;
        ensure_eq!(
            rd_ok(IA32_PERF_GLOBAL_STATUS)?,
            0,
            "GLOBAL_STATUS after STATUS_RESET"
        );
    }
    // Partial clear: only the written bits go.
    wr_ok(IA32_PERF_GLOBAL_STATUS_SET, 0b11)?;
    wr_ok(IA32_PERF_GLOBAL_OVF_CTRL, 0b01)?;
    ensure_eq!(
        rd_ok(IA32_PERF_GLOBAL_STATUS)?,
        0b10,
        "partial STATUS_RESET"
    );
    wr_ok(IA32_PERF_GLOBAL_OVF_CTRL, 0b10)?;
    // Bit 55 (Trace_ToPA_PMI) is left out: the SDM's STATUS_SET table lists it for every v4
    // part while STATUS_RESET requires Intel PT; no preset has PT.
    for b in (0..64).filter(|&b| set >> b & 1 == 0 && b != 55) {
        expect_wr_gp(
            IA32_PERF_GLOBAL_STATUS_SET,
            1 << b,
            "STATUS_SET reserved bit",
        )?;
    }
    ensure_eq!(rd_ok(IA32_PERF_GLOBAL_STATUS)?, 0, "GLOBAL_STATUS");
    Ok(())
}

/// v4+ IA32_PERF_GLOBAL_INUSE (SDM 18.2.4.3): bit n when PERFEVTSELn[7:0] != 0, bit 32+i when
/// fixed counter i's enable field != 0, bit 63 when any INT / fixed PMI bit is set; read-only.
pub fn inuse() -> TestResult {
    let p = preset();
    if p.version() < 4 {
        return Ok(());
    }
    wr_ok(IA32_PERF_GLOBAL_CTRL, 0)?;
    ensure_eq!(rd_ok(IA32_PERF_GLOBAL_INUSE)?, 0, "INUSE idle");
    wr_ok(IA32_PERFEVTSEL0 + 1, 0xC0)?;
    ensure_eq!(
        rd_ok(IA32_PERF_GLOBAL_INUSE)?,
        0b10,
        "INUSE with EVTSEL1 event set"
    );
    // OS enable of fixed counter 1 only.
    wr_ok(IA32_FIXED_CTR_CTRL, 0x10)?;
    ensure_eq!(
        rd_ok(IA32_PERF_GLOBAL_INUSE)?,
        0b10 | 1 << 33,
        "INUSE with fixed 1 enabled"
    );
    // INT without an event: only the PMI bit.
    wr_ok(IA32_PERFEVTSEL0 + 1, 0)?;
    wr_ok(IA32_PERFEVTSEL0, EVTSEL_INT)?;
    ensure_eq!(
        rd_ok(IA32_PERF_GLOBAL_INUSE)?,
        1 << 33 | 1 << 63,
        "INUSE with EVTSEL0.INT"
    );
    expect_wr_gp(IA32_PERF_GLOBAL_INUSE, 0, "GLOBAL_INUSE is read-only")?;
    wr_ok(IA32_PERFEVTSEL0, 0)?;
    wr_ok(IA32_FIXED_CTR_CTRL, 0)?;
    ensure_eq!(rd_ok(IA32_PERF_GLOBAL_INUSE)?, 0, "INUSE cleared");
    Ok(())
}

/// IA32_DEBUGCTL (SDM 17.4.1): FREEZE_LBRS_ON_PMI (11) and FREEZE_PERFMON_ON_PMI (12) are
/// writable with PMU v2+, FREEZE_WHILE_SMM (14) only with PERF_CAPABILITIES[12], RTM_DEBUG (15)
/// only with TSX; bits 5:2 and 63:16 are reserved.
pub fn debugctl_freeze_bits() -> TestResult {
    let p = preset();
    for b in [11u32, 12] {
        wr_ok(IA32_DEBUGCTL, 1 << b)?;
        ensure_eq!(rd_ok(IA32_DEBUGCTL)?, 1 << b, "DEBUGCTL freeze bit");
    }
    for (b, present) in [(14u32, p.smm_freeze()), (15, p.tsx)] {
        if present {
            wr_ok(IA32_DEBUGCTL, 1 << b)?;
            ensure_eq!(rd_ok(IA32_DEBUGCTL)?, 1 << b, "DEBUGCTL bit");
        } else {
            expect_wr_gp(IA32_DEBUGCTL, 1 << b, "DEBUGCTL bit of an absent feature")?;
        }
    }
    wr_ok(IA32_DEBUGCTL, 0)?;
    for b in (2..6).chain(16..64) {
        expect_wr_gp(IA32_DEBUGCTL, 1 << b, "DEBUGCTL reserved bit")?;
    }
    ensure!(
        rd_ok(IA32_DEBUGCTL)? == 0,
        "DEBUGCTL changed by a faulting write"
    );
    Ok(())
}
