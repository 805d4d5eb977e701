//! Foundation tests of the guest runtime and the vmm boot contract. Boot with `--vcpus 2`: one
//! test checks that the AP entered `guest_main` with index 1.
//!
//! No int3 test: on the PVM development host an `int3` at CPL0 stops the vCPU with a KVM internal
//! error (the instruction emulator cannot emulate it), so #BP is not exercised.

#![no_std]
#![no_main]

use core::arch::global_asm;
use core::hint::black_box;
use guest_tests::fault::{VEC_DE, VEC_GP, VEC_UD};
use guest_tests::msr_index::IA32_APIC_BASE;
use guest_tests::test::TestResult;
use guest_tests::{cpu, ensure, ensure_eq, entry, lapic, msr, pmi, println, serial, user};

#[unsafe(no_mangle)]
extern "C" fn guest_main(cpu: u64, mem_size: u64) -> ! {
    entry::init(cpu, mem_size);
    guest_tests::test::run_all(
        "smoke",
        guest_tests::tests![
            serial_lsr_and_scratch,
            cpuid_vendor,
            ud2_at_cpl0_caught,
            user_runs_at_cpl3,
            user_loop_10m,
            user_gp_noncanonical,
            user_divide_error,
            rdmsr_safe_nonexistent,
            apic_base_msr,
            tsc_advances,
            lapic_id_bsp_zero,
            ap_entered_guest_main,
            mem_size_sane,
            self_ipi_pmi_vector,
            self_nmi,
        ],
    )
}

fn serial_lsr_and_scratch() -> TestResult {
    let lsr = guest_tests::port::inb(serial::COM1 + serial::LSR);
    ensure!(lsr & serial::LSR_THRE != 0, "LSR {lsr:#x} lacks THRE");
    for v in [0x5au8, 0xa5] {
        guest_tests::port::outb(serial::COM1 + serial::SCR, v);
        ensure_eq!(
            guest_tests::port::inb(serial::COM1 + serial::SCR),
            v,
            "scratch register"
        );
    }
    Ok(())
}

fn cpuid_vendor() -> TestResult {
    let max = cpu::cpuid(0, 0).eax;
    ensure!(max >= 1, "max basic leaf {max}");
    let v = cpu::vendor();
    ensure!(
        v.iter().all(|b| b.is_ascii_graphic()),
        "vendor bytes {v:x?} not printable"
    );
    println!(
        "  vendor {} max leaf {max:#x}",
        core::str::from_utf8(&v).unwrap_or("?")
    );
    Ok(())
}

fn ud2_at_cpl0_caught() -> TestResult {
    let (addr, fault) = guest_tests::fault::probe_ud2();
    let Some(f) = fault else {
        guest_tests::fail!("no #UD recorded")
    };
    ensure_eq!(f.vector, VEC_UD, "vector");
    ensure_eq!(f.rip, addr, "RIP of ud2");
    ensure_eq!(f.cs & 3, 0, "CPL");
    Ok(())
}

extern "C" fn user_cs_plus(arg: u64) -> u64 {
    u64::from(cpu::read_cs()) << 32 | (arg + 1)
}

fn user_runs_at_cpl3() -> TestResult {
    let r = user::run_user(user_cs_plus, 41).map_err(|f| fmt_fault("run_user", f))?;
    ensure_eq!(r >> 32 & 3, 3, "CPL seen by user code");
    ensure_eq!(r & 0xffff_ffff, 42, "user return value");
    ensure_eq!(cpu::read_cs() & 3, 0, "CPL after return");
    Ok(())
}

/// Iterations of the CPL3 loop: far too many for emulated CPL0 code, instant at CPL3.
const LOOP_ITERATIONS: u64 = 10_000_000;

extern "C" fn sum_of_squares(n: u64) -> u64 {
    let mut acc = 0u64;
    for i in 0..n {
        // black_box keeps LLVM from replacing the loop with its closed form.
        acc = acc.wrapping_add(black_box(i).wrapping_mul(i));
    }
    acc
}

fn user_loop_10m() -> TestResult {
    let t0 = cpu::rdtsc();
    let got =
        user::run_user(sum_of_squares, LOOP_ITERATIONS).map_err(|f| fmt_fault("run_user", f))?;
    let t1 = cpu::rdtsc();
    // Closed form: sum_{i<n} i^2 = (n-1) n (2n-1) / 6, reduced mod 2^64 as the loop wraps.
    let n = u128::from(LOOP_ITERATIONS);
    let want = u64::try_from((n - 1) * n * (2 * n - 1) / 6 % (1u128 << 64)).unwrap_or(0);
    ensure_eq!(got, want, "sum of squares");
    println!(
        "  {LOOP_ITERATIONS} iterations at CPL3 in {} TSC ticks",
        t1.wrapping_sub(t0)
    );
    Ok(())
}

global_asm!(
    ".pushsection .text.smoke_user, \"ax\"",
    ".global smoke_noncanonical_load",
    "smoke_noncanonical_load:",
    "mov rax, 0x8000000000000000",
    ".global smoke_noncanonical_insn",
    "smoke_noncanonical_insn:",
    "mov rax, [rax]",
    "ret",
    ".global smoke_div_zero",
    "smoke_div_zero:",
    "xor ecx, ecx",
    "mov eax, 1",
    "xor edx, edx",
    ".global smoke_div_insn",
    "smoke_div_insn:",
    "div rcx",
    "ret",
    ".popsection",
);

unsafe extern "C" {
    static smoke_noncanonical_load: u8;
    static smoke_noncanonical_insn: u8;
    static smoke_div_zero: u8;
    static smoke_div_insn: u8;
}

fn user_gp_noncanonical() -> TestResult {
    let entry = (&raw const smoke_noncanonical_load) as u64;
    let insn = (&raw const smoke_noncanonical_insn) as u64;
    match user::run_user_at(entry, 0) {
        Ok(v) => guest_tests::fail!("non-canonical load returned {v:#x}"),
        Err(f) => {
            ensure_eq!(f.vector, VEC_GP, "vector");
            ensure_eq!(f.rip, insn, "RIP");
            ensure_eq!(f.cs & 3, 3, "CPL of the faulting code");
            ensure_eq!(f.error, 0, "error code");
        }
    }
    Ok(())
}

fn user_divide_error() -> TestResult {
    let entry = (&raw const smoke_div_zero) as u64;
    let insn = (&raw const smoke_div_insn) as u64;
    match user::run_user_at(entry, 0) {
        Ok(v) => guest_tests::fail!("division by zero returned {v:#x}"),
        Err(f) => {
            ensure_eq!(f.vector, VEC_DE, "vector");
            ensure_eq!(f.rip, insn, "RIP");
        }
    }
    Ok(())
}

fn rdmsr_safe_nonexistent() -> TestResult {
    const BOGUS_MSR: u32 = 0x1234_5678;
    ensure_eq!(
        msr::rdmsr_safe(BOGUS_MSR),
        Err(VEC_GP),
        "rdmsr_safe of a nonexistent MSR"
    );
    // SAFETY: a write to a nonexistent MSR cannot succeed, so it cannot disturb the runtime.
    let w = unsafe { msr::wrmsr_safe(BOGUS_MSR, 1) };
    ensure_eq!(w, Err(VEC_GP), "wrmsr_safe of a nonexistent MSR");
    Ok(())
}

fn apic_base_msr() -> TestResult {
    /// IA32_APIC_BASE bit 8: this is the bootstrap processor.
    const APIC_BASE_BSP: u64 = 1 << 8;
    /// IA32_APIC_BASE bit 11: APIC global enable.
    const APIC_BASE_ENABLE: u64 = 1 << 11;
    let v = msr::rdmsr_safe(IA32_APIC_BASE).map_err(|v| fmt_vec("rdmsr IA32_APIC_BASE", v))?;
    ensure_eq!(v & !0xfff, lapic::LAPIC_BASE, "APIC base address");
    ensure!(v & APIC_BASE_BSP != 0, "BSP bit clear in {v:#x}");
    ensure!(v & APIC_BASE_ENABLE != 0, "enable bit clear in {v:#x}");
    Ok(())
}

fn tsc_advances() -> TestResult {
    let t0 = cpu::rdtsc();
    for _ in 0..1000 {
        cpu::pause();
    }
    let t1 = cpu::rdtsc();
    ensure!(t1 > t0, "TSC went from {t0:#x} to {t1:#x}");
    Ok(())
}

fn lapic_id_bsp_zero() -> TestResult {
    ensure_eq!(lapic::id(), 0, "BSP APIC ID");
    // Version register: bits 7:0 version (0x1x = integrated APIC), bits 23:16 max LVT entry.
    let ver = lapic::read(lapic::REG_VERSION);
    ensure!(
        ver & 0xf0 == 0x10,
        "APIC version {ver:#x} is not an integrated APIC"
    );
    Ok(())
}

fn ap_entered_guest_main() -> TestResult {
    // The AP starts with the BSP; allow it ample (emulated) time, bounded.
    let mut spins = 0u32;
    while entry::aps_seen() & 0b10 == 0 && spins < 2_000_000 {
        cpu::pause();
        spins += 1;
    }
    ensure!(
        entry::aps_seen() & 0b10 != 0,
        "vCPU 1 never reached guest_main (boot with --vcpus 2)"
    );
    ensure_eq!(entry::ap_apic_id(1), Some(1), "APIC ID read by vCPU 1");
    Ok(())
}

fn mem_size_sane() -> TestResult {
    let mem = entry::mem_size();
    let (start, end) = entry::image_range();
    ensure!(
        mem > end,
        "RAM size {mem:#x} does not cover the image [{start:#x}, {end:#x})"
    );
    ensure_eq!(mem % (1 << 20), 0, "RAM size modulo 1 MiB");
    // The last word below the reported size must be RAM (identity-mapped up to 4 GiB).
    if mem <= 1 << 32 {
        let p = (mem - 8) as *mut u64;
        // SAFETY: the vmm says [0, mem) is RAM and nothing of ours lives at its very end.
        unsafe {
            p.write_volatile(0x1122_3344_5566_7788);
            ensure_eq!(
                p.read_volatile(),
                0x1122_3344_5566_7788,
                "top of RAM readback"
            );
        }
    }
    Ok(())
}

fn self_ipi_pmi_vector() -> TestResult {
    fn hook(_: &mut guest_tests::idt::TrapFrame) {
        HOOK_CALLS.fetch_add(1, core::sync::atomic::Ordering::SeqCst);
    }
    static HOOK_CALLS: core::sync::atomic::AtomicU32 = core::sync::atomic::AtomicU32::new(0);
    let before = pmi::fixed_count();
    pmi::set_hook(Some(hook));
    lapic::send_ipi(lapic::id(), lapic::ICR_ASSERT | u32::from(pmi::PMI_VECTOR));
    cpu::with_interrupts(|| cpu::spin_until(|| pmi::fixed_count() != before, 1000));
    pmi::set_hook(None);
    ensure_eq!(pmi::fixed_count() - before, 1, "PMI-vector interrupts");
    ensure_eq!(
        HOOK_CALLS.load(core::sync::atomic::Ordering::SeqCst),
        1,
        "hook calls"
    );
    Ok(())
}

fn self_nmi() -> TestResult {
    let before = pmi::nmi_count();
    lapic::send_ipi(lapic::id(), lapic::ICR_ASSERT | lapic::DELIVERY_NMI);
    // NMIs ignore IF.
    cpu::spin_until(|| pmi::nmi_count() != before, 1000);
    ensure_eq!(pmi::nmi_count() - before, 1, "NMIs");
    Ok(())
}

fn fmt_fault(what: &str, f: guest_tests::fault::Fault) -> guest_tests::test::Msg {
    guest_tests::test::Msg::from_fmt(format_args!(
        "{what}: exception #{} err={:#x} at {:#x}",
        f.vector, f.error, f.rip
    ))
}

fn fmt_vec(what: &str, v: u8) -> guest_tests::test::Msg {
    guest_tests::test::Msg::from_fmt(format_args!("{what}: exception #{v}"))
}
