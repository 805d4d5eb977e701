//! PMU test support: per-preset expectations ([`expect`]), counted regions ([`region`]) and
//! small helpers shared by the PMU guest programs.

pub mod expect;
pub mod region;

use crate::fault::VEC_GP;
use crate::msr;
use crate::test::{Msg, TestResult};
use crate::{cpu, lapic, pmi};

/// `wrmsr_safe` that must raise #GP.
pub fn expect_wr_gp(index: u32, value: u64, what: &str) -> TestResult {
    // SAFETY: only PMU MSRs are probed; a write that wrongly succeeds changes PMU state only.
    match unsafe { msr::wrmsr_safe(index, value) } {
        Err(VEC_GP) => Ok(()),
        Err(v) => Err(Msg::from_fmt(format_args!(
            "{what}: WRMSR {index:#x} <- {value:#x} raised #{v}, expected #GP"
        ))),
        Ok(()) => Err(Msg::from_fmt(format_args!(
            "{what}: WRMSR {index:#x} <- {value:#x} succeeded, expected #GP"
        ))),
    }
}

/// `rdmsr_safe` that must raise #GP.
pub fn expect_rd_gp(index: u32, what: &str) -> TestResult {
    match msr::rdmsr_safe(index) {
        Err(VEC_GP) => Ok(()),
        Err(v) => Err(Msg::from_fmt(format_args!(
            "{what}: RDMSR {index:#x} raised #{v}, expected #GP"
        ))),
        Ok(x) => Err(Msg::from_fmt(format_args!(
            "{what}: RDMSR {index:#x} returned {x:#x}, expected #GP"
        ))),
    }
}

/// `wrmsr_safe` that must succeed.
pub fn wr_ok(index: u32, value: u64) -> TestResult {
    // SAFETY: callers pass PMU MSRs only.
    unsafe { msr::wrmsr_safe(index, value) }
        .map_err(|v| Msg::from_fmt(format_args!("WRMSR {index:#x} <- {value:#x} raised #{v}")))
}

/// `rdmsr_safe` that must succeed.
pub fn rd_ok(index: u32) -> Result<u64, Msg> {
    msr::rdmsr_safe(index).map_err(|v| Msg::from_fmt(format_args!("RDMSR {index:#x} raised #{v}")))
}

/// Wait (interrupts enabled, forcing exits) until `pmi::pmi_count()` exceeds `before`, then
/// keep polling a while longer so a duplicate PMI would be seen; returns the PMIs seen since
/// `before`.
pub fn wait_pmis(before: u64) -> u64 {
    cpu::with_interrupts(|| {
        cpu::spin_until(|| pmi::pmi_count() > before, 20_000);
        // A second (wrong) PMI would be pending by now; give it some exits to arrive.
        cpu::spin_until(|| pmi::pmi_count() > before + 1, 200);
    });
    pmi::pmi_count() - before
}

/// Program LVTPC and read it back.
pub fn set_lvtpc(val: u32) -> TestResult {
    lapic::set_lvtpc(val);
    let got = lapic::lvtpc();
    if got & 0x1_07FF != val {
        return Err(Msg::from_fmt(format_args!(
            "LVTPC read back {got:#x} after writing {val:#x}"
        )));
    }
    Ok(())
}
