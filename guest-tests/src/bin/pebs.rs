//! Virtual PEBS end to end, once per CPU-model preset:
//! `vmm run --kernel pebs --cpu-model <preset> --pmu-backend precise --cmdline <preset>`.
//!
//! Every test samples instructions retired (or loads) on the counted window of
//! `guest_tests::pebs::window`, whose instruction addresses and register values are known, so
//! each record is checked field by field against the per-format layout of
//! `guest_tests::pebs::layout` (SDM / Linux ds.c): record count and size, IP and eventing IP,
//! registers, status / applicable counters, memory fields, TSC range; plus the counter reload
//! from the reset slot, the threshold PMI with OvfBuffer, buffer full, a buffer crossing pages
//! and a buffer at a high linear address (4-level paging); on adaptive formats the 16
//! MSR_PEBS_DATA_CFG group combinations and PEBS on fixed counter 0.

#![no_std]
#![no_main]

use core::arch::asm;
use core::sync::atomic::{AtomicU64, Ordering};

use guest_tests::idt::TrapFrame;
use guest_tests::msr_index::*;
use guest_tests::pebs::check::{self, Expect, Mem, Plan, Sim};
use guest_tests::pebs::layout::{
    self, CFG_GPRS, CFG_LBR_SHIFT, CFG_LBRS, CFG_MEMINFO, Fmt, PebsPreset,
};
use guest_tests::pebs::window::{self, WindowArgs};
use guest_tests::pebs::{self as pb, Counter, Event};
use guest_tests::racy::Racy;
use guest_tests::test::{Test, TestResult};
use guest_tests::{cpu, ensure, ensure_eq, entry, fail, lapic, msr, pmi, println};

static PRESET: Racy<Option<&'static PebsPreset>> = Racy::new(None);

fn p() -> &'static PebsPreset {
    match PRESET.get() {
        Some(p) => p,
        None => panic!("no preset"),
    }
}

const COMMON: &[Test] = guest_tests::tests![
    capabilities,
    one_record_exact,
    many_records_reload,
    threshold_pmi_one_record,
    threshold_pmi_many_records,
    buffer_full_no_signal,
    buffer_crosses_page,
    high_memory_4level,
];
const MEMORY: &[Test] = guest_tests::tests![memory_fields];
const BASELINE: &[Test] = guest_tests::tests![fixed_counter0, adaptive_configs];

#[unsafe(no_mangle)]
extern "C" fn guest_main(cpu: u64, mem_size: u64) -> ! {
    entry::init(cpu, mem_size);
    let name = entry::cmdline().trim();
    let Some(preset) = layout::preset(name) else {
        println!("pebs: unknown preset {name:?} on the command line");
        guest_tests::exit::exit(1)
    };
    PRESET.set(Some(preset));
    lapic::set_lvtpc(pmi::lvtpc_nmi() | lapic::LVT_MASKED);
    let mut all = [COMMON[0]; 16];
    let mut n = 0;
    let mem: &[Test] = if preset.fmt.has_mem_legacy() || preset.baseline {
        MEMORY
    } else {
        &[]
    };
    let base: &[Test] = if preset.baseline { BASELINE } else { &[] };
    for t in COMMON.iter().chain(mem).chain(base) {
        all[n] = *t;
        n += 1;
    }
    guest_tests::test::run_all("pebs", &all[..n])
}

/// Value the window's load reads.
const LOAD_VALUE: u64 = 0x10AD_0000_CAFE_F00D;
/// Buffer sentinel byte.
const SENTINEL: u8 = 0xA5;

/// PMI bookkeeping.
static NMI_RIP: AtomicU64 = AtomicU64::new(0);

fn on_pmi(frame: &mut TrapFrame) {
    // NetBurst has no freeze on PMI: stop the counter here (ESCR T0_OS off).
    if p().fmt == Fmt::Netburst {
        // SAFETY: PMU MSR only.
        unsafe { msr::wrmsr(MSR_CRU_ESCR0, 0) };
    }
    NMI_RIP.store(frame.rip, Ordering::SeqCst);
}

/// Where a window's DS area and buffer are.
#[derive(Clone, Copy)]
struct Buf {
    /// Linear address of the DS area.
    ds: u64,
    /// PEBS Buffer Base.
    base: u64,
    /// PEBS Index at the start.
    index: u64,
    /// Absolute maximum.
    max: u64,
    /// Interrupt threshold.
    threshold: u64,
}

impl Buf {
    /// A buffer at `base` (identity DS page) holding `capacity` records of `size`, threshold
    /// after `threshold` records.
    fn records(base: u64, size: usize, capacity: usize, threshold: usize) -> Buf {
        Buf {
            ds: pb::ds_page(),
            base,
            index: base,
            max: base + (capacity * size) as u64,
            threshold: base + (threshold * size) as u64,
        }
    }
}

/// One window's setup.
#[derive(Clone, Copy)]
struct Setup {
    ctr: Counter,
    ev: Event,
    plan: Plan,
    buf: Buf,
    /// EVTSEL bit 34 / FIXED_CTR_CTRL bit 32.
    adaptive: bool,
    /// MSR_PEBS_DATA_CFG.
    data_cfg: u64,
    /// LVTPC unmasked in NMI mode (with freeze on PMI on architectural PMUs).
    pmi: bool,
    /// Extra reset slots (slot, events until wrap) written after the counter's own.
    extra_resets: [(usize, u64); 2],
    cell: u64,
}

impl Setup {
    fn new(plan: Plan, buf: Buf) -> Setup {
        Setup {
            ctr: Counter::Gp0,
            ev: Event::Instructions,
            plan,
            buf,
            adaptive: false,
            data_cfg: 0,
            pmi: false,
            extra_resets: [(usize::MAX, 0); 2],
            cell: cell(0),
        }
    }
}

/// Address of load cell `n`: 64-byte lines on the last buffer page (never touched by a window
/// unless chosen, so the VMM's model cache has not seen it).
fn cell(n: u64) -> u64 {
    pb::buf_page(pb::BUF_PAGES - 1) + 64 * (n % 64)
}

/// What a window did.
struct Outcome {
    args: WindowArgs,
    tsc: (u64, u64),
    rsp: u64,
    pmis: u64,
    nmi_rip: u64,
    lvtpc: u32,
    status: u64,
    cccr: u64,
    counter: u64,
    index: u64,
}

fn run(s: &Setup) -> Outcome {
    let p = p();
    for i in 0..pb::BUF_PAGES {
        pb::fill(pb::buf_page(i), 4096, SENTINEL);
    }
    let args = pb::arm(p, s.buf.ds, s.ctr, s.ev, s.plan.period, s.adaptive, s.cell);
    pb::ds_setup(
        s.buf.ds,
        s.buf.base,
        s.buf.index,
        s.buf.max,
        s.buf.threshold,
    );
    pb::set_reset(
        s.buf.ds,
        pb::reset_slot(p, s.ctr),
        pb::minus(p, s.plan.reset),
    );
    for &(slot, n) in &s.extra_resets {
        if slot != usize::MAX {
            pb::set_reset(s.buf.ds, slot, pb::minus(p, n));
        }
    }
    pb::wr64(s.cell, LOAD_VALUE);
    pb::wr64(s.cell + 8, 0);
    // SAFETY: PMU MSRs only.
    unsafe {
        if p.baseline {
            msr::wrmsr(MSR_PEBS_DATA_CFG, s.data_cfg);
        }
        if s.pmi && p.global {
            msr::wrmsr(IA32_DEBUGCTL, DEBUGCTL_FREEZE_PERFMON_ON_PMI);
        }
    }
    NMI_RIP.store(0, Ordering::SeqCst);
    pmi::set_hook(Some(on_pmi));
    lapic::set_lvtpc(if s.pmi {
        pmi::lvtpc_nmi()
    } else {
        pmi::lvtpc_nmi() | lapic::LVT_MASKED
    });
    let before = pmi::pmi_count();
    let t0 = cpu::rdtsc();
    // SAFETY: the window writes the PMU MSRs of `args` and the cell only.
    unsafe { window::run(&args) };
    let t1 = cpu::rdtsc();
    // An NMI is delivered at the instruction boundary after the assist; give a late one exits.
    cpu::spin_until(|| false, 50);
    let out = Outcome {
        args,
        tsc: (t0, t1),
        rsp: window::window_rsp(),
        pmis: pmi::pmi_count() - before,
        nmi_rip: NMI_RIP.load(Ordering::SeqCst),
        lvtpc: lapic::lvtpc(),
        status: if p.global {
            msr::rdmsr(IA32_PERF_GLOBAL_STATUS)
        } else {
            0
        },
        cccr: if p.fmt == Fmt::Netburst {
            msr::rdmsr(MSR_IQ_CCCR4)
        } else {
            0
        },
        counter: pb::counter_value(p, s.ctr),
        index: pb::ds_index(s.buf.ds),
    };
    pmi::set_hook(None);
    lapic::set_lvtpc(pmi::lvtpc_nmi() | lapic::LVT_MASKED);
    pb::disarm(p);
    out
}

/// Expected IA32_PERF_GLOBAL_STATUS after a window.
fn expected_status(s: &Setup, sim: &Sim) -> u64 {
    let p = p();
    let mut st = 0;
    if sim.wraps > 0 {
        st |= pb::status_bit(s.ctr);
    }
    if sim.threshold_at.is_some() {
        st |= OVF_BUFFER;
        if s.pmi && p.version >= 4 {
            st |= GLOBAL_STATUS_CTR_FRZ;
        }
    }
    st
}

/// Run `s` and check everything: records (count, every field), PEBS Index, bytes past it,
/// counter value, status, PMI. `mem` gives the memory fields of the record on instruction k;
/// `lbr` the expected LBR entries.
fn run_and_check(
    s: &Setup,
    mem: &dyn Fn(usize) -> Mem,
    lbr: &[(u64, u64, u64)],
) -> Result<(Outcome, Sim), guest_tests::test::Msg> {
    let p = p();
    let sim = check::simulate(&s.plan);
    let o = run(s);
    let cfg = if s.adaptive { s.data_cfg } else { 0 };
    let size = p.fmt.record_size(cfg) as u64;
    let n = u64::try_from(sim.n).unwrap_or(0);
    ensure_eq!(
        o.index,
        s.buf.index + n * size,
        "PEBS Index (records written)"
    );
    for j in 0..sim.n {
        let k = sim.recs[j];
        let earlier_threshold = sim.threshold_at.is_some_and(|t| t < k);
        let status = pb::status_bit(s.ctr) | if earlier_threshold { OVF_BUFFER } else { 0 };
        let e = Expect {
            p,
            ctr: s.ctr,
            args: &o.args,
            load_value: LOAD_VALUE,
            rsp: o.rsp,
            cfg,
            status,
            tsc: o.tsc,
            mem: mem(k),
            lbr,
        };
        check::check_record(s.buf.index + j as u64 * size, k, &e)?;
    }
    // Nothing written past the records (the buffer pages are identity mapped or aliased; the
    // caller checks aliases itself).
    if s.buf.ds == pb::ds_page() {
        let end = pb::buf_page(pb::BUF_PAGES - 1);
        if o.index < end {
            let len = usize::try_from(end - o.index).unwrap_or(0);
            if let Some(a) = pb::first_not(o.index, len, SENTINEL) {
                fail!("byte at {a:#x} past PEBS Index {:#x} was written", o.index);
            }
        }
    }
    let frozen_unknown = s.pmi && p.fmt == Fmt::Netburst && sim.threshold_at.is_some();
    if !frozen_unknown {
        ensure_eq!(
            o.counter,
            pb::minus(p, sim.left),
            "counter after the window"
        );
    }
    if p.global {
        ensure_eq!(
            o.status,
            expected_status(s, &sim),
            "IA32_PERF_GLOBAL_STATUS"
        );
    } else {
        ensure_eq!(o.cccr & CCCR_OVF != 0, sim.wraps > 0, "IQ_CCCR4.OVF");
    }
    match (s.pmi, sim.threshold_at) {
        (true, Some(k)) => {
            ensure_eq!(o.pmis, 1, "PMIs");
            ensure_eq!(
                o.nmi_rip,
                window::ip(k + 1),
                "PMI RIP (after the threshold record)"
            );
            ensure!(
                o.lvtpc & lapic::LVT_MASKED != 0,
                "LVTPC {:#x} not masked after the PMI",
                o.lvtpc
            );
        }
        _ => ensure_eq!(o.pmis, 0, "PMIs"),
    }
    Ok((o, sim))
}

fn no_mem(_: usize) -> Mem {
    Mem::default()
}

fn basic_size() -> usize {
    p().fmt.record_size(0)
}

fn capabilities() -> TestResult {
    let p = p();
    let l1 = cpu::cpuid(1, 0);
    // CPUID.1:EDX.DS cannot be advertised on the development host (KVM filters it; see
    // /work/shared/reference/linux-guest.md B.3): reported, not required.
    println!(
        "  CPUID.1:EDX.DS={}",
        u8::from(l1.edx & cpu::CPUID1_EDX_DS != 0)
    );
    ensure!(
        l1.ecx & cpu::CPUID1_ECX_DTES64 != 0,
        "CPUID.1:ECX.DTES64 clear"
    );
    let misc = msr::rdmsr(IA32_MISC_ENABLE);
    ensure!(
        misc & MISC_ENABLE_PEBS_UNAVAILABLE == 0,
        "MISC_ENABLE {misc:#x}: PEBS unavailable"
    );
    if let Some(f) = p.fmt.cap_value() {
        let caps = msr::rdmsr(IA32_PERF_CAPABILITIES);
        println!("  perf_capabilities {caps:#x}");
        ensure_eq!(caps >> PERF_CAP_PEBS_FMT_SHIFT & 0xF, f, "PEBS format");
        ensure_eq!(caps & PERF_CAP_PEBS_TRAP != 0, p.trap, "PEBS trap");
        ensure_eq!(
            caps & PERF_CAP_PEBS_BASELINE != 0,
            p.baseline,
            "PEBS baseline"
        );
    }
    Ok(())
}

fn std_buf(capacity: usize, threshold: usize) -> Buf {
    Buf::records(pb::buf_page(0), basic_size(), capacity, threshold)
}

/// One record on the 20th counted instruction; the threshold is one record (no PMI: LVTPC
/// masked, so only OvfBuffer shows it).
fn one_record_exact() -> TestResult {
    let plan = Plan {
        period: 20,
        reset: 1000,
        capacity: 8,
        threshold: 1,
        freeze: false,
    };
    let s = Setup::new(plan, std_buf(8, 1));
    let (_, sim) = run_and_check(&s, &no_mem, &[])?;
    ensure_eq!(sim.n, 1);
    Ok(())
}

/// Period 5, reset slot 7: records on instructions 5, 12, 19, ... (the distance proves the
/// reload comes from the reset slot, not the initial value).
fn many_records_reload() -> TestResult {
    let plan = Plan {
        period: 5,
        reset: 7,
        capacity: 20,
        threshold: 20,
        freeze: false,
    };
    let s = Setup::new(plan, std_buf(20, 20));
    let (_, sim) = run_and_check(&s, &no_mem, &[])?;
    println!(
        "  {} records on instructions {:?}",
        sim.n,
        &sim.recs[..sim.n]
    );
    ensure_eq!(sim.n, 8);
    Ok(())
}

/// A one-record threshold with LVTPC in NMI mode: one PMI right after the record's
/// instruction, OvfBuffer set, counting frozen (architectural) with the counter at its reset
/// value (reset 3 would wrap again on instruction 23 if counting went on).
fn threshold_pmi_one_record() -> TestResult {
    let nb = p().fmt == Fmt::Netburst;
    let reset = if nb { 100_000 } else { 3 };
    let cap = if nb { 1 } else { 8 };
    let plan = Plan {
        period: 20,
        reset,
        capacity: cap,
        threshold: 1,
        freeze: !nb,
    };
    let mut s = Setup::new(plan, std_buf(cap, 1));
    s.pmi = true;
    run_and_check(&s, &no_mem, &[])?;
    Ok(())
}

/// Threshold after three records: no PMI at the first two, one at the third.
fn threshold_pmi_many_records() -> TestResult {
    let nb = p().fmt == Fmt::Netburst;
    let plan = Plan {
        period: 5,
        reset: 5,
        capacity: 3,
        threshold: 3,
        freeze: !nb,
    };
    let mut s = Setup::new(plan, std_buf(3, 3));
    s.pmi = true;
    let (_, sim) = run_and_check(&s, &no_mem, &[])?;
    ensure_eq!(sim.threshold_at, Some(15));
    Ok(())
}

/// Room for two records and a bit: later overflows write nothing and signal nothing (LVTPC
/// unmasked), and the counter is still reloaded at each. Then a buffer that is full from the
/// start with PEBS Index = threshold = absolute maximum: no record, no PMI, no OvfBuffer.
fn buffer_full_no_signal() -> TestResult {
    let size = basic_size();
    let base = pb::buf_page(0);
    let max = base + (3 * size - 8) as u64;
    let plan = Plan {
        period: 5,
        reset: 7,
        capacity: 2,
        threshold: 100,
        freeze: false,
    };
    let buf = Buf {
        ds: pb::ds_page(),
        base,
        index: base,
        max,
        threshold: max,
    };
    let mut s = Setup::new(plan, buf);
    s.pmi = true;
    let (_, sim) = run_and_check(&s, &no_mem, &[])?;
    ensure_eq!((sim.n, sim.wraps), (2, 8));
    let full = base + (2 * size) as u64;
    let plan = Plan {
        period: 5,
        reset: 7,
        capacity: 0,
        threshold: 0,
        freeze: false,
    };
    let buf = Buf {
        ds: pb::ds_page(),
        base,
        index: full,
        max: full,
        threshold: full,
    };
    let mut s = Setup::new(plan, buf);
    s.pmi = true;
    let sim = check::simulate(&plan);
    ensure_eq!(sim.n, 0);
    // simulate() reports the threshold as reached by a write; none happens here.
    let o = run(&s);
    ensure_eq!(o.index, full, "PEBS Index of a full buffer");
    ensure_eq!(o.pmis, 0, "PMIs from a full buffer");
    ensure_eq!(
        o.status,
        if p().global { 1 } else { 0 },
        "GLOBAL_STATUS with a full buffer"
    );
    ensure_eq!(
        o.counter,
        pb::minus(p(), sim.left),
        "counter (reloaded at each overflow)"
    );
    Ok(())
}

/// The first record straddles a 4 KiB boundary of the identity-mapped buffer.
fn buffer_crosses_page() -> TestResult {
    let size = basic_size();
    let base = pb::buf_page(1) - 0x48;
    let plan = Plan {
        period: 20,
        reset: 15,
        capacity: 6,
        threshold: 6,
        freeze: false,
    };
    let s = Setup::new(plan, Buf::records(base, size, 6, 6));
    let (_, sim) = run_and_check(&s, &no_mem, &[])?;
    ensure_eq!(sim.n, 3);
    Ok(())
}

/// Linear address of the high alias (PML4 slot 256, PDPT slot 1).
const HIGH: u64 = 0xffff_8000_4000_0000;
static mut HI_PDPT: pb::Page = pb::Page([0; 4096]);
static mut HI_PD: pb::Page = pb::Page([0; 4096]);
static mut HI_PT: pb::Page = pb::Page([0; 4096]);

fn read_cr3() -> u64 {
    let v: u64;
    // SAFETY: reading CR3 has no side effects.
    unsafe { asm!("mov {}, cr3", out(reg) v, options(nomem, nostack, preserves_flags)) };
    v
}

fn read_cr4() -> u64 {
    let v: u64;
    // SAFETY: reading CR4 has no side effects.
    unsafe { asm!("mov {}, cr4", out(reg) v, options(nomem, nostack, preserves_flags)) };
    v
}

fn flush_tlb() {
    // SAFETY: reloading CR3 with its own value flushes non-global TLB entries only.
    unsafe { asm!("mov {0}, cr3", "mov cr3, {0}", out(reg) _, options(nostack, preserves_flags)) };
}

/// DS area and buffer at a high canonical linear address under 4-level paging: page-table
/// entries added under the VMM's PML4 map HIGH -> the DS page, HIGH + 4 KiB -> buffer page 3
/// and HIGH + 8 KiB -> buffer page 1 (physically below: the linear buffer is not physically
/// contiguous). The first record straddles HIGH + 8 KiB. 5-level paging is not exercised here
/// (see the note printed).
fn high_memory_4level() -> TestResult {
    let la57_cpu = cpu::cpuid(7, 0).ecx & 1 << 16 != 0;
    let cr4 = read_cr4();
    println!(
        "  CPUID.7.0:ECX.LA57={} CR4.LA57={}: 5-level paging is covered by vpmu unit tests only",
        u8::from(la57_cpu),
        cr4 >> 12 & 1
    );
    ensure!(cr4 & 1 << 12 == 0, "guest runs with 5-level paging");
    let pml4 = read_cr3() & !0xFFF;
    let slot = pml4 + 8 * 256;
    ensure_eq!(pb::rd64(slot), 0, "PML4[256] in use");
    let (pdpt, pd, pt) = (
        (&raw mut HI_PDPT) as u64,
        (&raw mut HI_PD) as u64,
        (&raw mut HI_PT) as u64,
    );
    const P_RW: u64 = 3;
    for t in [pdpt, pd, pt] {
        pb::fill(t, 4096, 0);
    }
    let (page_a, page_b) = (pb::buf_page(3), pb::buf_page(1));
    pb::wr64(pdpt + 8, pd | P_RW);
    pb::wr64(pd, pt | P_RW);
    pb::wr64(pt, pb::ds_page() | P_RW);
    pb::wr64(pt + 8, page_a | P_RW);
    pb::wr64(pt + 16, page_b | P_RW);
    pb::wr64(slot, pdpt | P_RW);
    flush_tlb();
    let r = high_inner(page_a, page_b);
    pb::wr64(slot, 0);
    flush_tlb();
    r
}

fn high_inner(page_a: u64, page_b: u64) -> TestResult {
    let size = basic_size();
    let base = HIGH + 0x2000 - 0x50;
    let mut buf = Buf::records(base, size, 2, 2);
    buf.ds = HIGH;
    let plan = Plan {
        period: 20,
        reset: 15,
        capacity: 2,
        threshold: 2,
        freeze: false,
    };
    let s = Setup::new(plan, buf);
    let (o, sim) = run_and_check(&s, &no_mem, &[])?;
    ensure_eq!(sim.n, 2);
    ensure_eq!(
        pb::rd64(pb::ds_page() + pb::ds::PEBS_INDEX),
        o.index,
        "PEBS Index via the identity map"
    );
    // The record's first 0x50 bytes end page A; the rest starts page B.
    ensure_eq!(
        pb::rd64(page_a + 0xFB0),
        pb::rd64(base),
        "first quadword in page A"
    );
    ensure_eq!(pb::rd64(page_b), pb::rd64(HIGH + 0x2000), "page B start");
    let end_b = usize::try_from(o.index - (HIGH + 0x2000)).unwrap_or(0);
    if let Some(a) = pb::first_not(page_b + end_b as u64, 4096 - end_b, SENTINEL) {
        fail!("byte at {a:#x} in page B past the records written");
    }
    // The physical page after A is not part of the linear buffer.
    if let Some(a) = pb::first_not(pb::buf_page(4), 4096, SENTINEL) {
        fail!("byte at {a:#x} (physically after page A) written");
    }
    if let Some(a) = pb::first_not(pb::buf_page(2), 4096, SENTINEL) {
        fail!("byte at {a:#x} (physically after page B) written");
    }
    Ok(())
}

/// Loads event, period 1: the record lands on the window's only load (instruction 13) with its
/// data linear address; the first load of a fresh cache line misses the VMM's model cache
/// (latency 60, data source 3 = DRAM), the second hits (4, 1 = L1) (vmm precise.rs cost model).
fn memory_fields() -> TestResult {
    static NEXT_CELL: AtomicU64 = AtomicU64::new(1);
    let p = p();
    let cfg = if p.baseline {
        CFG_MEMINFO | CFG_GPRS
    } else {
        0
    };
    let c = cell(NEXT_CELL.fetch_add(1, Ordering::SeqCst));
    for (lat, dse) in [(60, 3), (4, 1)] {
        let plan = Plan {
            period: 1,
            reset: 1000,
            capacity: 4,
            threshold: 4,
            freeze: false,
        };
        let size = p.fmt.record_size(cfg);
        let mut s = Setup::new(plan, Buf::records(pb::buf_page(0), size, 4, 4));
        s.ev = Event::Loads;
        s.adaptive = p.baseline;
        s.data_cfg = cfg;
        s.cell = c;
        // Loads count only the load: simulate() counts instructions, so plan on instruction
        // 13 directly (period 13 in instruction terms, nothing after it: reset 1000).
        let mut plan_i = plan;
        plan_i.period = 13;
        let sim = check::simulate(&plan_i);
        let o = run(&s);
        let mem = Mem { dla: c, dse, lat };
        ensure_eq!(o.index, s.buf.base + size as u64, "PEBS Index (one record)");
        let e = Expect {
            p,
            ctr: Counter::Gp0,
            args: &o.args,
            load_value: LOAD_VALUE,
            rsp: o.rsp,
            cfg,
            status: 1,
            tsc: o.tsc,
            mem,
            lbr: &[],
        };
        check::check_record(s.buf.base, sim.recs[0], &e)?;
        ensure_eq!(
            o.counter,
            pb::minus(p, 1000),
            "loads counter (one load, reloaded)"
        );
    }
    Ok(())
}

/// PEBS on fixed counter 0 with adaptive records (GPRs + meminfo): reset slot 8 (format 4)
/// or 32 (format 5) decides the distance to the second record; the other slot holds a
/// different value.
fn fixed_counter0() -> TestResult {
    let p = p();
    let (own, other) = if p.fmt == Fmt::F5 { (32, 8) } else { (8, 32) };
    let cfg = CFG_MEMINFO | CFG_GPRS;
    let size = p.fmt.record_size(cfg);
    let plan = Plan {
        period: 20,
        reset: 9,
        capacity: 8,
        threshold: 8,
        freeze: false,
    };
    let mut s = Setup::new(plan, Buf::records(pb::buf_page(0), size, 8, 8));
    s.ctr = Counter::Fixed0;
    s.adaptive = true;
    s.data_cfg = cfg;
    s.extra_resets = [(other, 6), (usize::MAX, 0)];
    ensure_eq!(pb::reset_slot(p, Counter::Fixed0), own);
    let (_, sim) = run_and_check(&s, &no_mem, &[])?;
    println!(
        "  fixed0 records on instructions {:?} (reset slot {own})",
        &sim.recs[..sim.n]
    );
    ensure_eq!(sim.n, 5);
    // Without FIXED_CTR_CTRL's adaptive bit the record is basic (32 bytes) whatever DATA_CFG.
    s.adaptive = false;
    s.buf = Buf::records(pb::buf_page(0), basic_size(), 8, 8);
    run_and_check(&s, &no_mem, &[])?;
    Ok(())
}

/// LBR values written to the stack before sampling (DEBUGCTL.LBR stays clear, so the stack
/// does not change; the record's LBR group copies it newest first from TOS).
const LBR_TOS: usize = 5;

fn lbr_value(i: usize) -> (u64, u64, u64) {
    let i64_ = i as u64;
    (
        0xffff_ffff_8100_0000 + 0x10 * i64_,
        0xffff_ffff_8200_0000 + 0x20 * i64_,
        0x100 + i64_,
    )
}

/// The 16 MSR_PEBS_DATA_CFG group combinations (meminfo, GPRs, XMMs, LBRs with 1-4 entries)
/// with EVTSEL's adaptive bit, then DATA_CFG with every group but the adaptive bit clear (a
/// basic record). Checked: size field, format field, every group's contents (XMM values the
/// window loads; LBR entries from the values written to the LBR MSRs).
fn adaptive_configs() -> TestResult {
    let p = p();
    let depth = usize::try_from(p.lbr_depth).unwrap_or(0);
    for i in 0..depth {
        let (f, t, inf) = lbr_value(i);
        let i32_ = u32::try_from(i).unwrap_or(0);
        // SAFETY: LBR MSRs only.
        unsafe {
            msr::wrmsr(MSR_LASTBRANCH_0_FROM_IP + i32_, f);
            msr::wrmsr(MSR_LASTBRANCH_0_TO_IP + i32_, t);
            msr::wrmsr(MSR_LBR_INFO_0 + i32_, inf);
        }
    }
    // SAFETY: LBR MSR only.
    unsafe { msr::wrmsr(MSR_LASTBRANCH_TOS, LBR_TOS as u64) };
    let mut lbr = [(0, 0, 0); 4];
    for (j, e) in lbr.iter_mut().enumerate() {
        *e = lbr_value((LBR_TOS + depth - j) % depth);
    }
    for c in 0..16u64 {
        let n_lbr = c >> 1 & 3;
        let cfg = if c & CFG_LBRS != 0 {
            c | n_lbr << CFG_LBR_SHIFT
        } else {
            c
        };
        let size = p.fmt.record_size(cfg);
        let plan = Plan {
            period: 20,
            reset: 1000,
            capacity: 4,
            threshold: 1,
            freeze: false,
        };
        let mut s = Setup::new(plan, Buf::records(pb::buf_page(0), size, 4, 1));
        s.adaptive = true;
        s.data_cfg = cfg;
        run_and_check(&s, &no_mem, &lbr).map_err(|m| {
            guest_tests::test::Msg::from_fmt(format_args!("DATA_CFG {cfg:#x}: {m}"))
        })?;
    }
    let all = 0xF | 3 << CFG_LBR_SHIFT;
    let plan = Plan {
        period: 20,
        reset: 1000,
        capacity: 4,
        threshold: 1,
        freeze: false,
    };
    let mut s = Setup::new(plan, Buf::records(pb::buf_page(0), basic_size(), 4, 1));
    s.data_cfg = all;
    run_and_check(&s, &no_mem, &lbr)?;
    Ok(())
}
