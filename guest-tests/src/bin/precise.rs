//! Exact counting and RDPMC emulation (run with `--pmu-backend precise`; the RDPMC tests also
//! run with `--pmu-backend off`, where RDPMC goes through the #GP-handler breakpoint).
//!
//! Every counted region is an `asm!` block whose instructions are listed in the comments, so
//! the expected counts are exact: the WRMSR that enables a counter is counted, the WRMSR that
//! disables it is not (SDM: counting starts/stops at the WRMSR's retirement as seen by the
//! counter). All counting happens at CPL0 (this host cannot single-step CPL3).

#![no_std]
#![no_main]

use core::arch::asm;
use core::sync::atomic::{AtomicU64, Ordering};

use guest_tests::idt::TrapFrame;
use guest_tests::msr_index::{
    IA32_A_PMC0, IA32_FIXED_CTR_CTRL, IA32_FIXED_CTR0, IA32_PERF_GLOBAL_CTRL,
    IA32_PERF_GLOBAL_OVF_CTRL, IA32_PERF_GLOBAL_STATUS, IA32_PERFEVTSEL0, IA32_PMC0,
};
use guest_tests::test::TestResult;
use guest_tests::{cpu, ensure, ensure_eq, entry, lapic, msr, pmi, println};

/// EVTSEL: event C0H (instructions retired), OS, EN.
const INST_OS: u64 = 0xc0 | 1 << 17 | 1 << 22;
/// ... USR only.
const INST_USR: u64 = 0xc0 | 1 << 16 | 1 << 22;
/// Branches retired, all (C4H/00H), OS, EN.
const BR_OS: u64 = 0xc4 | 1 << 17 | 1 << 22;
/// Conditional branches (C4H/01H), OS, EN.
const BR_COND_OS: u64 = 0xc4 | 0x01 << 8 | 1 << 17 | 1 << 22;
/// MEM_INST_RETIRED.ALL_LOADS (D0H/81H), OS, EN.
const LOADS_OS: u64 = 0xd0 | 0x81 << 8 | 1 << 17 | 1 << 22;
/// MEM_INST_RETIRED.ALL_STORES (D0H/82H), OS, EN.
const STORES_OS: u64 = 0xd0 | 0x82 << 8 | 1 << 17 | 1 << 22;
/// INT: PMI on overflow.
const EVTSEL_INT: u64 = 1 << 20;
/// 48-bit counters (skylake / icelake presets).
const WIDTH_MASK: u64 = (1 << 48) - 1;

#[unsafe(no_mangle)]
extern "C" fn guest_main(cpu: u64, mem_size: u64) -> ! {
    entry::init(cpu, mem_size);
    // SAFETY: enabling all GP counters globally is harmless; each test enables its own EVTSEL.
    unsafe { msr::wrmsr(IA32_PERF_GLOBAL_CTRL, 0xf | 0x7 << 32) };
    // `--cmdline rdpmc-only`: a run without a counting backend checks RDPMC emulation alone.
    if entry::cmdline().contains("rdpmc-only") {
        guest_tests::test::run_all(
            "precise-rdpmc",
            guest_tests::tests![
                rdpmc_matches_rdmsr,
                rdpmc_fixed_counter,
                rdpmc_invalid_index_gp,
                rdpmc_after_lidt,
            ],
        )
    }
    guest_tests::test::run_all(
        "precise",
        guest_tests::tests![
            straight_line_instructions,
            usr_only_counts_nothing_at_cpl0,
            loop_branches,
            loads_and_stores,
            fixed_counter_instructions,
            overflow_on_nth_instruction,
            rdpmc_matches_rdmsr,
            rdpmc_fixed_counter,
            rdpmc_invalid_index_gp,
            rdpmc_after_lidt,
            determinism_report,
        ],
    )
}

fn clear(evtsel: u32, pmc: u32) {
    // SAFETY: PMU MSRs only.
    unsafe {
        msr::wrmsr(evtsel, 0);
        msr::wrmsr(pmc, 0);
        msr::wrmsr(
            IA32_PERF_GLOBAL_OVF_CTRL,
            msr::rdmsr(IA32_PERF_GLOBAL_STATUS),
        );
    }
}

/// Enable EVTSEL0 with `sel`, run 10 NOPs, disable: counted = enabling WRMSR + 10 NOPs +
/// `mov ecx` + `xor eax` + `xor edx` = 14 instructions.
fn ten_nops(sel: u64) -> u64 {
    clear(IA32_PERFEVTSEL0, IA32_PMC0);
    // SAFETY: only the PMU MSRs are written.
    unsafe {
        asm!(
            "wrmsr",                 // counted: enables
            "nop", "nop", "nop", "nop", "nop", "nop", "nop", "nop", "nop", "nop",
            "mov ecx, {evtsel:e}",   // counted
            "xor eax, eax",          // counted
            "xor edx, edx",          // counted
            "wrmsr",                 // disables: not counted
            evtsel = in(reg) IA32_PERFEVTSEL0,
            inout("ecx") IA32_PERFEVTSEL0 => _,
            inout("eax") (sel & 0xffff_ffff) as u32 => _,
            inout("edx") (sel >> 32) as u32 => _,
            options(nostack),
        );
    }
    msr::rdmsr(IA32_PMC0)
}

fn straight_line_instructions() -> TestResult {
    let n = ten_nops(INST_OS);
    println!("  counts: straight-line {n}");
    ensure_eq!(n, 14);
    Ok(())
}

fn usr_only_counts_nothing_at_cpl0() -> TestResult {
    ensure_eq!(ten_nops(INST_USR), 0);
    Ok(())
}

/// `mov r8, 5; 1: dec r8; jnz 1b` between the WRMSRs: 5 JNZs, 4 taken, 1 not.
fn count_loop(sel: u64) -> u64 {
    clear(IA32_PERFEVTSEL0, IA32_PMC0);
    // SAFETY: only PMU MSRs are written; r8 is clobbered.
    unsafe {
        asm!(
            "wrmsr",
            "mov r8, 5",
            "2: dec r8",
            "jnz 2b",
            "mov ecx, {evtsel:e}",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            evtsel = in(reg) IA32_PERFEVTSEL0,
            inout("ecx") IA32_PERFEVTSEL0 => _,
            inout("eax") (sel & 0xffff_ffff) as u32 => _,
            inout("edx") (sel >> 32) as u32 => _,
            out("r8") _,
            options(nostack),
        );
    }
    msr::rdmsr(IA32_PMC0)
}

fn loop_branches() -> TestResult {
    let inst = count_loop(INST_OS);
    let br = count_loop(BR_OS);
    let cond = count_loop(BR_COND_OS);
    println!("  counts: loop instructions {inst} branches {br} conditional {cond}");
    // wrmsr + mov + 5 x (dec, jnz) + mov + xor + xor = 15.
    ensure_eq!(inst, 15);
    ensure_eq!(br, 5);
    ensure_eq!(cond, 5);
    Ok(())
}

/// Two loads, one store, one read-modify-write between the WRMSRs.
fn count_mem(sel: u64) -> u64 {
    clear(IA32_PERFEVTSEL0, IA32_PMC0);
    let mut cell = [0u64; 2];
    let p = cell.as_mut_ptr();
    // SAFETY: only PMU MSRs and the local `cell` are written.
    unsafe {
        asm!(
            "wrmsr",
            "mov r8, [{p}]",         // load
            "mov r9, [{p} + 8]",     // load
            "mov [{p}], r9",         // store
            "add qword ptr [{p} + 8], 1", // load + store
            "mov ecx, {evtsel:e}",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            p = in(reg) p,
            evtsel = in(reg) IA32_PERFEVTSEL0,
            inout("ecx") IA32_PERFEVTSEL0 => _,
            inout("eax") (sel & 0xffff_ffff) as u32 => _,
            inout("edx") (sel >> 32) as u32 => _,
            out("r8") _, out("r9") _,
            options(nostack),
        );
    }
    msr::rdmsr(IA32_PMC0)
}

fn loads_and_stores() -> TestResult {
    let loads = count_mem(LOADS_OS);
    let stores = count_mem(STORES_OS);
    println!("  counts: loads {loads} stores {stores}");
    ensure_eq!(loads, 3);
    ensure_eq!(stores, 2);
    Ok(())
}

fn fixed_counter_instructions() -> TestResult {
    // SAFETY: PMU MSRs only.
    unsafe {
        msr::wrmsr(IA32_FIXED_CTR0, 0);
        asm!(
            "wrmsr",                 // counted: enables fixed counter 0 at CPL0
            "nop", "nop", "nop",
            "mov ecx, {ctl:e}",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",                 // disables
            ctl = in(reg) IA32_FIXED_CTR_CTRL,
            inout("ecx") IA32_FIXED_CTR_CTRL => _,
            inout("eax") 0x1u32 => _,
            inout("edx") 0u32 => _,
            options(nostack),
        );
    }
    let n = msr::rdmsr(IA32_FIXED_CTR0);
    println!("  counts: fixed0 {n}");
    ensure_eq!(n, 7);
    Ok(())
}

static PMI_RIP: AtomicU64 = AtomicU64::new(0);

fn record_rip(frame: &mut TrapFrame) {
    PMI_RIP.store(frame.rip, Ordering::SeqCst);
}

fn overflow_on_nth_instruction() -> TestResult {
    clear(IA32_PERFEVTSEL0, IA32_PMC0);
    pmi::set_hook(Some(record_rip));
    lapic::set_lvtpc(pmi::lvtpc_nmi());
    let before = pmi::nmi_count();
    // Overflow after 5 instructions: the enabling WRMSR and 4 NOPs. The PMI (NMI) arrives
    // before the 5th NOP, so the interrupted RIP is its address.
    // SAFETY: PMU MSRs only.
    unsafe { msr::wrmsr(IA32_PMC0, WIDTH_MASK - 4) };
    let fifth: u64;
    // SAFETY: PMU MSRs only.
    unsafe {
        asm!(
            "lea {fifth}, [rip + 3f]",
            "mov ecx, {evtsel:e}",
            "wrmsr",                 // 1
            "nop",                   // 2
            "nop",                   // 3
            "nop",                   // 4
            "nop",                   // 5: wraps the counter
            "3: nop",
            "nop", "nop",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            fifth = out(reg) fifth,
            evtsel = in(reg) IA32_PERFEVTSEL0,
            out("ecx") _,
            inout("eax") ((INST_OS | EVTSEL_INT) & 0xffff_ffff) as u32 => _,
            inout("edx") 0u32 => _,
            options(nostack),
        );
    }
    let got = cpu::spin_until(|| pmi::nmi_count() > before, 1000);
    pmi::set_hook(None);
    let status = msr::rdmsr(IA32_PERF_GLOBAL_STATUS);
    let lvtpc = lapic::lvtpc();
    clear(IA32_PERFEVTSEL0, IA32_PMC0);
    lapic::set_lvtpc(pmi::lvtpc_nmi() | 1 << 16);
    ensure!(got, "no PMI");
    ensure_eq!(pmi::nmi_count() - before, 1);
    ensure_eq!(PMI_RIP.load(Ordering::SeqCst), fifth);
    ensure!(status & 1 != 0, "GLOBAL_STATUS {status:#x} lacks PMC0");
    ensure!(
        lvtpc & 1 << 16 != 0,
        "LVTPC {lvtpc:#x} not masked after the PMI"
    );
    Ok(())
}

fn rdpmc_matches_rdmsr() -> TestResult {
    clear(IA32_PERFEVTSEL0, IA32_PMC0);
    // Static value: RDPMC through the #GP intercept. IA32_A_PMC0 writes the full width
    // (IA32_PMC0 would sign-extend bit 31).
    // SAFETY: PMU MSRs only.
    unsafe { msr::wrmsr(IA32_A_PMC0, 0x12_3456_789a) };
    ensure_eq!(msr::rdpmc_safe(0), Ok(0x12_3456_789a));
    // Counting: RDPMC via the decoder while stepping. RDPMC reads before it retires, RDMSR
    // too, and three instructions (rdpmc, mov r8, mov ecx) retire in between.
    let (pmc, msrv): (u64, u64);
    // SAFETY: PMU MSRs only.
    unsafe {
        msr::wrmsr(IA32_PMC0, 0);
        msr::wrmsr(IA32_PERFEVTSEL0, INST_OS);
        asm!(
            "xor ecx, ecx",
            "rdpmc",
            "mov r8, rax",
            "mov ecx, {pmc:e}",
            "rdmsr",
            pmc = in(reg) IA32_PMC0,
            out("ecx") _, out("eax") msrv, out("edx") _, out("r8") pmc,
            options(nostack),
        );
        msr::wrmsr(IA32_PERFEVTSEL0, 0);
    }
    let msrv = msrv & 0xffff_ffff;
    println!("  rdpmc {pmc} rdmsr {msrv}");
    if cfg_precise() {
        ensure_eq!(msrv, pmc + 3);
    } else {
        ensure_eq!(msrv, pmc);
    }
    Ok(())
}

/// Whether this run counts (precise backend): decided by running a counted region.
fn cfg_precise() -> bool {
    ten_nops(INST_OS) != 0
}

fn rdpmc_fixed_counter() -> TestResult {
    // SAFETY: PMU MSRs only.
    unsafe { msr::wrmsr(IA32_FIXED_CTR0, 0xabc_def0_1234) };
    ensure_eq!(msr::rdpmc_safe(1 << 30), Ok(0xabc_def0_1234));
    ensure_eq!(msr::rdpmc_safe(1 << 30 | 5), Err(13));
    // SAFETY: PMU MSRs only.
    unsafe { msr::wrmsr(IA32_FIXED_CTR0, 0) };
    Ok(())
}

fn rdpmc_invalid_index_gp() -> TestResult {
    ensure_eq!(msr::rdpmc_safe(8), Err(13));
    ensure_eq!(msr::rdpmc_safe(0x1234), Err(13));
    Ok(())
}

#[repr(C, packed)]
struct Dtr {
    limit: u16,
    base: u64,
}

static mut IDT_COPY: [u64; 512] = [0; 512];

fn rdpmc_after_lidt() -> TestResult {
    let mut old = Dtr { limit: 0, base: 0 };
    // SAFETY: SIDT stores 10 bytes into `old`.
    unsafe { asm!("sidt [{}]", in(reg) &raw mut old, options(nostack)) };
    let (base, limit) = (old.base, old.limit);
    let n = (usize::from(limit) + 1) / 8;
    // SAFETY: copies the live IDT (n quadwords) into a static of 512 quadwords (4 KiB, the
    // largest IDT) and loads it: same gates, new address.
    unsafe {
        let copy = &raw mut IDT_COPY;
        core::ptr::copy_nonoverlapping(base as *const u64, copy.cast::<u64>(), n.min(512));
        let new = Dtr {
            limit,
            base: copy as u64,
        };
        asm!("lidt [{}]", in(reg) &raw const new, options(nostack));
        // A PMU MSR access lets the VMM see the new IDT.
        msr::wrmsr(IA32_PMC0, 0x4242);
    }
    let r = msr::rdpmc_safe(0);
    // SAFETY: restores the original IDT.
    unsafe { asm!("lidt [{}]", in(reg) &raw const old, options(nostack)) };
    ensure_eq!(r, Ok(0x4242));
    Ok(())
}

/// Prints the counts the host harness compares across two runs.
fn determinism_report() -> TestResult {
    let a = (ten_nops(INST_OS), count_loop(BR_OS), count_mem(LOADS_OS));
    println!("  determinism: {} {} {}", a.0, a.1, a.2);
    Ok(())
}
