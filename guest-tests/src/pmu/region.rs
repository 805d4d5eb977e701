//! A counted region: one asm block that enables counting with a WRMSR, runs a fixed
//! straight-line body and disables counting with a second WRMSR, so no compiler-generated code
//! lands inside the window. With the vmm's precise backend the enabling WRMSR is counted and
//! the disabling one is not (as on hardware, where the enable takes effect at the WRMSR's
//! retirement and the disable before the next one retires).
//!
//! Body: [`BODY_NOPS`] `nop`s, then [`BODY_JMPS`] `jmp` to the next instruction; then
//! `mov ecx, <disable msr>`, `xor eax, eax`, `xor edx, edx` and the disabling WRMSR (value 0).

use core::arch::asm;

/// `nop`s in the body.
pub const BODY_NOPS: u64 = 100;
/// Unconditional direct `jmp`s in the body (each a retired branch).
pub const BODY_JMPS: u64 = 20;
/// Instructions retired at CPL0 between the two WRMSRs, counting the enabling WRMSR and the
/// three register set-ups before the disabling WRMSR.
pub const REGION_INSNS: u64 = 1 + BODY_NOPS + BODY_JMPS + 3;
/// Branch instructions retired in the window.
pub const REGION_BRANCHES: u64 = BODY_JMPS;
/// Unhalted core / reference cycles of the window under the vmm precise backend's cost model
/// (vmm/src/backend/precise.rs: 1 cycle per instruction, +1 per load, +1 per store, +1 per
/// taken branch; no instruction of the region touches memory, every `jmp` is taken). Not an
/// architectural value: real hardware only bounds it.
pub const REGION_CYCLES: u64 = REGION_INSNS + BODY_JMPS;

/// Run the region: WRMSR(`en_msr`, `en_val`), body, WRMSR(`dis_msr`, 0).
///
/// # Safety
/// Both writes must be harmless to the runtime (PMU MSRs only).
pub unsafe fn run(en_msr: u32, en_val: u64, dis_msr: u32) {
    #[allow(
        clippy::cast_possible_truncation,
        reason = "splitting into EDX:EAX halves"
    )]
    let (lo, hi) = (en_val as u32, (en_val >> 32) as u32);
    // SAFETY: the caller guarantees both MSR writes are harmless; the body only executes nops
    // and jumps to the next instruction; EAX/ECX/EDX are declared clobbered.
    unsafe {
        asm!(
            "wrmsr",
            ".rept {nops}",
            "nop",
            ".endr",
            ".rept {jmps}",
            "jmp 2f",
            "2:",
            ".endr",
            "mov ecx, {dis:e}",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            nops = const BODY_NOPS,
            jmps = const BODY_JMPS,
            dis = in(reg) dis_msr,
            inout("ecx") en_msr => _,
            inout("eax") lo => _,
            inout("edx") hi => _,
            options(nostack),
        )
    }
}
