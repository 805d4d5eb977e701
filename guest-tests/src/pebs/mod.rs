//! PEBS test support shared by the `pebs` and `demo` guests: per-format record layouts
//! ([`layout`]), the counted window ([`window`]), the DS save area and PEBS buffer (statics
//! in the identity-mapped image), and arming a PEBS counter on each preset.

pub mod check;
pub mod layout;
pub mod window;

use crate::msr;
use crate::msr_index::*;
use layout::{Fmt, PebsPreset};

/// One 4 KiB page.
#[repr(C, align(4096))]
pub struct Page(pub [u8; 4096]);

/// Pages of PEBS buffer in the image.
pub const BUF_PAGES: usize = 6;

static mut DS_PAGE: Page = Page([0; 4096]);
static mut BUF: [Page; BUF_PAGES] = [const { Page([0; 4096]) }; BUF_PAGES];

/// Linear (= physical) address of the DS save area page.
pub fn ds_page() -> u64 {
    (&raw mut DS_PAGE) as u64
}

/// Linear (= physical) address of buffer page `i`.
pub fn buf_page(i: usize) -> u64 {
    (&raw mut BUF) as u64 + 4096 * i as u64
}

/// DS buffer-management field offsets (SDM Figure 17-8; Linux `struct debug_store`).
pub mod ds {
    /// PEBS Buffer Base.
    pub const PEBS_BASE: u64 = 0x20;
    /// PEBS Index.
    pub const PEBS_INDEX: u64 = 0x28;
    /// PEBS Absolute Maximum.
    pub const PEBS_MAX: u64 = 0x30;
    /// PEBS Interrupt Threshold.
    pub const PEBS_THRESHOLD: u64 = 0x38;
    /// Counter reset slot 0.
    pub const RESET0: u64 = 0x40;
}

/// Read a quadword at linear address `a` (any alignment).
pub fn rd64(a: u64) -> u64 {
    let mut b = [0u8; 8];
    for (i, x) in b.iter_mut().enumerate() {
        // SAFETY: callers pass addresses of the DS page / buffers (or their high aliases),
        // which are mapped; the VMM writes them behind the compiler's back, hence volatile.
        *x = unsafe { (a as *const u8).add(i).read_volatile() };
    }
    u64::from_le_bytes(b)
}

/// Write a quadword at linear address `a`.
pub fn wr64(a: u64, v: u64) {
    for (i, x) in v.to_le_bytes().iter().enumerate() {
        // SAFETY: as in `rd64`.
        unsafe { (a as *mut u8).add(i).write_volatile(*x) };
    }
}

/// Fill `len` bytes at `a` with `byte`.
pub fn fill(a: u64, len: usize, byte: u8) {
    for i in 0..len {
        // SAFETY: callers pass ranges inside the buffers.
        unsafe { (a as *mut u8).add(i).write_volatile(byte) };
    }
}

/// First address in `[a, a + len)` whose byte is not `byte`.
pub fn first_not(a: u64, len: usize, byte: u8) -> Option<u64> {
    // SAFETY: callers pass ranges inside the buffers.
    (0..len as u64)
        .find(|&i| unsafe { ((a + i) as *const u8).read_volatile() } != byte)
        .map(|i| a + i)
}

/// Program the DS area at `ds_la`: PEBS base/index, absolute maximum, threshold; clear the
/// BTS fields and every reset slot (0..40).
pub fn ds_setup(ds_la: u64, base: u64, index: u64, max: u64, threshold: u64) {
    for off in (0..ds::PEBS_BASE).step_by(8) {
        wr64(ds_la + off, 0);
    }
    wr64(ds_la + ds::PEBS_BASE, base);
    wr64(ds_la + ds::PEBS_INDEX, index);
    wr64(ds_la + ds::PEBS_MAX, max);
    wr64(ds_la + ds::PEBS_THRESHOLD, threshold);
    for s in 0..40 {
        set_reset(ds_la, s, 0);
    }
}

/// Write counter-reset slot `slot`.
pub fn set_reset(ds_la: u64, slot: usize, v: u64) {
    wr64(ds_la + ds::RESET0 + 8 * slot as u64, v);
}

/// PEBS Index.
pub fn ds_index(ds_la: u64) -> u64 {
    rd64(ds_la + ds::PEBS_INDEX)
}

/// `2^width - n`: a counter value that wraps after `n` events.
pub fn minus(p: &PebsPreset, n: u64) -> u64 {
    (1u64 << p.width) - n
}

/// The counter a window samples on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counter {
    /// IA32_PMC0 (NetBurst: MSR_IQ_COUNTER4).
    Gp0,
    /// IA32_FIXED_CTR0 (PEBS baseline only).
    Fixed0,
}

/// Event a GP counter counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Instructions retired (C0H; NetBurst instr_retired on CRU_ESCR0).
    Instructions,
    /// Loads retired (the model's load event).
    Loads,
}

/// EVTSEL OS | EN.
const EVTSEL_OS_EN: u64 = 1 << 17 | 1 << 22;
/// NetBurst CRU_ESCR0 instr_retired (event select 02H) NBOGUSNTAG, T0_OS.
const NB_ESCR_INSTR: u64 =
    0x02 << ESCR_EVENT_SELECT_SHIFT | 1 << ESCR_EVENT_MASK_SHIFT | ESCR_T0_OS;
/// IQ_CCCR4: enable, ESCR select 4 (CRU_ESCR0), active thread "any" (3).
const NB_CCCR: u64 = CCCR_ENABLE | 4 << CCCR_ESCR_SELECT_SHIFT | 3 << CCCR_ACTIVE_THREAD_SHIFT;

/// The model's load event (umask and event select).
fn loads_evtsel(p: &PebsPreset) -> u64 {
    match p.fmt {
        Fmt::F0 => 0xC0 | 0x01 << 8,
        Fmt::F1 => 0x0B | 0x01 << 8,
        _ => 0xD0 | 0x81 << 8,
    }
}

/// Disable every counter and PEBS, clear overflow status, zero PEBS_DATA_CFG and DEBUGCTL.
pub fn disarm(p: &PebsPreset) {
    // SAFETY: PMU MSRs only.
    unsafe {
        if p.fmt == Fmt::Netburst {
            msr::wrmsr(MSR_IQ_CCCR4, 0);
            msr::wrmsr(MSR_CRU_ESCR0, 0);
            msr::wrmsr(IA32_PEBS_ENABLE, 0);
            return;
        }
        msr::wrmsr(IA32_PERFEVTSEL0, 0);
        msr::wrmsr(IA32_FIXED_CTR_CTRL, 0);
        msr::wrmsr(IA32_PEBS_ENABLE, 0);
        msr::wrmsr(IA32_DEBUGCTL, 0);
        if p.baseline {
            msr::wrmsr(MSR_PEBS_DATA_CFG, 0);
        }
        if p.ld_lat {
            msr::wrmsr(MSR_PEBS_LD_LAT_THRESHOLD, 0);
        }
        msr::wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
        let st = msr::rdmsr(IA32_PERF_GLOBAL_STATUS);
        msr::wrmsr(IA32_PERF_GLOBAL_OVF_CTRL, st);
    }
}

/// Arm `ctr` for PEBS: DS area, counter preset to wrap after `period` events, PEBS enabled,
/// globally enabled. Returns the window arguments whose enabling WRMSR starts counting
/// (adaptive: EVTSEL bit 34 / FIXED_CTR_CTRL bit 32 set).
pub fn arm(
    p: &PebsPreset,
    ds_la: u64,
    ctr: Counter,
    ev: Event,
    period: u64,
    adaptive: bool,
    cell: u64,
) -> window::WindowArgs {
    disarm(p);
    let start = minus(p, period);
    // SAFETY: PMU MSRs only; DS_AREA points at a mapped, writable page.
    unsafe {
        msr::wrmsr(IA32_DS_AREA, ds_la);
        if p.fmt == Fmt::Netburst {
            msr::wrmsr(MSR_IQ_COUNTER4, start);
            msr::wrmsr(MSR_CRU_ESCR0, NB_ESCR_INSTR);
            msr::wrmsr(IA32_PEBS_ENABLE, NETBURST_PEBS_ENABLE_BIT);
            return window::WindowArgs {
                en_msr: u64::from(MSR_IQ_CCCR4),
                en_val: NB_CCCR,
                // Clearing the ESCR's T0_OS stops counting and keeps CCCR.OVF readable.
                dis_msr: u64::from(MSR_CRU_ESCR0),
                cell,
            };
        }
        match ctr {
            Counter::Gp0 => {
                // IA32_PMC0 sign-extends bit 31 (every preset, even without full-width
                // writes), so -period reaches the full width.
                msr::wrmsr(IA32_PMC0, start & 0xFFFF_FFFF);
                msr::wrmsr(IA32_PEBS_ENABLE, 1);
                msr::wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
                let ev = match ev {
                    Event::Instructions => 0xC0,
                    Event::Loads => loads_evtsel(p),
                };
                let a = if adaptive { EVTSEL_ADAPTIVE } else { 0 };
                window::WindowArgs {
                    en_msr: u64::from(IA32_PERFEVTSEL0),
                    en_val: ev | EVTSEL_OS_EN | a,
                    dis_msr: u64::from(IA32_PERFEVTSEL0),
                    cell,
                }
            }
            Counter::Fixed0 => {
                msr::wrmsr(IA32_FIXED_CTR0, start);
                msr::wrmsr(IA32_PEBS_ENABLE, 1 << 32);
                msr::wrmsr(IA32_PERF_GLOBAL_CTRL, 1 << 32);
                let a = if adaptive {
                    1 << FIXED_CTRL_ADAPTIVE_SHIFT
                } else {
                    0
                };
                window::WindowArgs {
                    en_msr: u64::from(IA32_FIXED_CTR_CTRL),
                    en_val: FIXED_CTRL_OS | a,
                    dis_msr: u64::from(IA32_FIXED_CTR_CTRL),
                    cell,
                }
            }
        }
    }
}

/// Current value of `ctr`.
pub fn counter_value(p: &PebsPreset, ctr: Counter) -> u64 {
    match (p.fmt, ctr) {
        (Fmt::Netburst, _) => msr::rdmsr(MSR_IQ_COUNTER4),
        (_, Counter::Gp0) => msr::rdmsr(IA32_PMC0),
        (_, Counter::Fixed0) => msr::rdmsr(IA32_FIXED_CTR0),
    }
}

/// Status bit of `ctr` in IA32_PERF_GLOBAL_STATUS / applicable counters.
pub fn status_bit(ctr: Counter) -> u64 {
    match ctr {
        Counter::Gp0 => 1,
        Counter::Fixed0 => 1 << 32,
    }
}

/// Counter-reset slot of `ctr` (NetBurst: IQ_COUNTER4 uses slot 0).
pub fn reset_slot(p: &PebsPreset, ctr: Counter) -> usize {
    match ctr {
        Counter::Gp0 => 0,
        Counter::Fixed0 => p.fmt.fixed_reset_slot(0),
    }
}
