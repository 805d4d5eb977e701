//! RDMSR/WRMSR, and fault-tolerant variants that report a #GP (or any fault) as `Err(vector)`.

use crate::fault;
use core::arch::asm;

/// Read an MSR. A #GP here is an unexpected exception and fails the current test.
pub fn rdmsr(msr: u32) -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: RDMSR has no memory effects; a fault is handled by the IDT (fails the test).
    unsafe {
        asm!("rdmsr", in("ecx") msr, out("eax") lo, out("edx") hi, options(nomem, nostack, preserves_flags))
    }
    u64::from(hi) << 32 | u64::from(lo)
}

/// Write an MSR. A #GP here is an unexpected exception and fails the current test.
///
/// # Safety
/// The write must not break the runtime (e.g. EFER, APIC base, GS base are off limits).
pub unsafe fn wrmsr(msr: u32, val: u64) {
    let (lo, hi) = split(val);
    // SAFETY: the caller guarantees the write is harmless to the runtime.
    unsafe {
        asm!("wrmsr", in("ecx") msr, in("eax") lo, in("edx") hi, options(nostack, preserves_flags))
    }
}

/// Read an MSR; a fault on the RDMSR is returned as `Err(vector)` (13 for #GP).
pub fn rdmsr_safe(msr: u32) -> Result<u64, u8> {
    let (lo, hi): (u32, u32);
    let status: u64;
    // SAFETY: RDMSR has no memory effects; its fault is fixed up through the extable entry, which
    // resumes after the instruction with R11 = FAULT_FLAG | vector.
    unsafe {
        asm!(
            "2: rdmsr",
            "3:",
            crate::extable!("2b", "3b"),
            in("ecx") msr, out("eax") lo, out("edx") hi, inout("r11") 0u64 => status,
            options(nostack, preserves_flags),
        )
    }
    fault::status_to_result(status)?;
    Ok(u64::from(hi) << 32 | u64::from(lo))
}

/// Write an MSR; a fault on the WRMSR is returned as `Err(vector)`.
///
/// # Safety
/// As for [`wrmsr`]: a write that succeeds must not break the runtime.
pub unsafe fn wrmsr_safe(msr: u32, val: u64) -> Result<(), u8> {
    let (lo, hi) = split(val);
    let status: u64;
    // SAFETY: the caller guarantees a successful write is harmless; a fault is fixed up as in
    // `rdmsr_safe`.
    unsafe {
        asm!(
            "2: wrmsr",
            "3:",
            crate::extable!("2b", "3b"),
            in("ecx") msr, in("eax") lo, in("edx") hi, inout("r11") 0u64 => status,
            options(nostack, preserves_flags),
        )
    }
    fault::status_to_result(status)
}

/// RDPMC; a fault is returned as `Err(vector)` (13 for #GP: a bad index, or CPL > 0 with
/// CR4.PCE clear).
pub fn rdpmc_safe(ecx: u32) -> Result<u64, u8> {
    let (lo, hi): (u32, u32);
    let status: u64;
    // SAFETY: RDPMC reads a counter; a fault is fixed up through the extable entry as in
    // `rdmsr_safe`.
    unsafe {
        asm!(
            "2: rdpmc",
            "3:",
            crate::extable!("2b", "3b"),
            in("ecx") ecx, out("eax") lo, out("edx") hi, inout("r11") 0u64 => status,
            options(nostack, preserves_flags),
        )
    }
    fault::status_to_result(status)?;
    Ok(u64::from(hi) << 32 | u64::from(lo))
}

fn split(val: u64) -> (u32, u32) {
    #[allow(
        clippy::cast_possible_truncation,
        reason = "splitting into EDX:EAX halves"
    )]
    let parts = (val as u32, (val >> 32) as u32);
    parts
}
