//! CPUID, RDTSC, control registers and interrupt-flag helpers.

use core::arch::asm;

/// The four registers CPUID returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cpuid {
    /// EAX.
    pub eax: u32,
    /// EBX.
    pub ebx: u32,
    /// ECX.
    pub ecx: u32,
    /// EDX.
    pub edx: u32,
}

/// CPUID leaf 1 ECX bit 2: 64-bit DS area.
pub const CPUID1_ECX_DTES64: u32 = 1 << 2;
/// CPUID leaf 1 ECX bit 15: IA32_PERF_CAPABILITIES present.
pub const CPUID1_ECX_PDCM: u32 = 1 << 15;
/// CPUID leaf 1 EDX bit 21: debug store.
pub const CPUID1_EDX_DS: u32 = 1 << 21;
/// Leaf of the architectural performance-monitoring description.
pub const CPUID_LEAF_PMU: u32 = 0xA;

/// Execute CPUID with `leaf` in EAX and `subleaf` in ECX.
pub fn cpuid(leaf: u32, subleaf: u32) -> Cpuid {
    let r = core::arch::x86_64::__cpuid_count(leaf, subleaf);
    Cpuid {
        eax: r.eax,
        ebx: r.ebx,
        ecx: r.ecx,
        edx: r.edx,
    }
}

/// The 12-byte vendor string of leaf 0 (EBX, EDX, ECX).
pub fn vendor() -> [u8; 12] {
    let r = cpuid(0, 0);
    let mut v = [0u8; 12];
    v[0..4].copy_from_slice(&r.ebx.to_le_bytes());
    v[4..8].copy_from_slice(&r.edx.to_le_bytes());
    v[8..12].copy_from_slice(&r.ecx.to_le_bytes());
    v
}

/// Read the time-stamp counter.
pub fn rdtsc() -> u64 {
    // SAFETY: RDTSC only reads the TSC (CR4.TSD is clear at every CPL we run at).
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// The current CS selector (its low two bits are the CPL).
pub fn read_cs() -> u16 {
    let cs: u16;
    // SAFETY: reading a segment register has no side effects.
    unsafe { asm!("mov {0:x}, cs", out(reg) cs, options(nomem, nostack, preserves_flags)) }
    cs
}

/// Read CR0 (CPL0 only).
pub fn read_cr0() -> u64 {
    let v: u64;
    // SAFETY: reading CR0 has no side effects; the runtime runs it at CPL0.
    unsafe { asm!("mov {}, cr0", out(reg) v, options(nomem, nostack, preserves_flags)) }
    v
}

/// Read RFLAGS.
pub fn read_rflags() -> u64 {
    let v: u64;
    // SAFETY: pushfq/pop only touch the stack slot they use.
    unsafe { asm!("pushfq", "pop {}", out(reg) v, options(nomem, preserves_flags)) }
    v
}

/// Run `f` with interrupts enabled (STI; f; CLI), so pending fixed interrupts are delivered.
pub fn with_interrupts<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: the IDT is loaded before any test runs; handlers preserve all registers.
    unsafe { asm!("sti", options(nomem, nostack)) }
    let r = f();
    // SAFETY: clearing IF has no memory effects.
    unsafe { asm!("cli", options(nomem, nostack)) }
    r
}

/// Spin until `cond()` holds, at most `max_iters` times; returns whether it held.
///
/// Each iteration reads the UART's LSR: the port read exits to the vmm, and the re-entry is
/// where KVM injects pending interrupts and NMIs. On the PVM development host a pending event
/// is not delivered to emulated CPL0 code that never exits, so a pure `pause` loop can miss it.
pub fn spin_until(mut cond: impl FnMut() -> bool, max_iters: u32) -> bool {
    for _ in 0..max_iters {
        if cond() {
            return true;
        }
        crate::port::inb(crate::serial::COM1 + crate::serial::LSR);
    }
    cond()
}

/// Execute `pause` (spin-loop hint).
pub fn pause() {
    core::hint::spin_loop();
}

/// Park the CPU: CLI; HLT. Only an NMI or reset wakes it.
pub fn cli_hlt() {
    // SAFETY: halting has no memory effects.
    unsafe { asm!("cli", "hlt", options(nomem, nostack)) }
}
