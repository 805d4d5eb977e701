//! IDT for all 256 vectors. Each stub pushes a dummy error code where the CPU pushes none, then
//! its vector, and jumps to a common path that saves every GPR into a [`TrapFrame`] and calls
//! [`rt_trap`]. Handlers change the frame (RIP, GPRs, CS/SS) to redirect the IRETQ: that is how
//! exception fixups, the return from CPL3 and test recovery work.

use crate::fault::{self, Fault};
use crate::gdt::KERNEL_CS;
use crate::racy::Racy;
use crate::{pmi, test, user};
use core::arch::{asm, global_asm};

/// Vector of NMI.
pub const VEC_NMI: u8 = 2;
/// Spurious-interrupt vector programmed into the LAPIC SVR (needs no EOI).
pub const VEC_SPURIOUS: u8 = 0xff;

/// Bytes per entry stub (each is aligned to this, so stub n is at `rt_isr_stubs + 16 n`).
const STUB_SIZE: u64 = 16;

/// Registers saved on trap entry, in stack order (lowest address first).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[allow(missing_docs)]
pub struct TrapFrame {
    pub rax: u64,
    pub rbx: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rbp: u64,
    pub r8: u64,
    pub r9: u64,
    pub r10: u64,
    pub r11: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
    /// Vector number pushed by the stub.
    pub vector: u64,
    /// Error code (CPU-pushed, or 0 from the stub).
    pub error: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

impl TrapFrame {
    /// The exception as a [`Fault`].
    pub fn fault(&self) -> Fault {
        Fault {
            vector: self.vector.to_le_bytes()[0],
            error: self.error,
            rip: self.rip,
            cs: self.cs,
        }
    }
}

global_asm!(
    ".pushsection .text.rt_isr, \"ax\"",
    ".balign 16",
    ".global rt_isr_stubs",
    "rt_isr_stubs:",
    ".set rt_vec, 0",
    ".rept 256",
    ".balign 16",
    // Vectors for which the CPU pushes an error code: #DF #TS #NP #SS #GP #PF #AC #CP #VC #SX.
    ".if (rt_vec == 8) || (rt_vec == 10) || (rt_vec == 11) || (rt_vec == 12) || (rt_vec == 13) || (rt_vec == 14) || (rt_vec == 17) || (rt_vec == 21) || (rt_vec == 29) || (rt_vec == 30)",
    ".else",
    "push 0",
    ".endif",
    "push rt_vec",
    "jmp rt_isr_common",
    ".set rt_vec, rt_vec + 1",
    ".endr",
    ".balign 16",
    ".global rt_isr_stubs_end",
    "rt_isr_stubs_end:",
    "rt_isr_common:",
    "push r15",
    "push r14",
    "push r13",
    "push r12",
    "push r11",
    "push r10",
    "push r9",
    "push r8",
    "push rbp",
    "push rdi",
    "push rsi",
    "push rdx",
    "push rcx",
    "push rbx",
    "push rax",
    // The CPU aligned RSP to 16 before its pushes; 22 qwords keep it aligned for the call.
    "mov rdi, rsp",
    "cld",
    "call rt_trap",
    "pop rax",
    "pop rbx",
    "pop rcx",
    "pop rdx",
    "pop rsi",
    "pop rdi",
    "pop rbp",
    "pop r8",
    "pop r9",
    "pop r10",
    "pop r11",
    "pop r12",
    "pop r13",
    "pop r14",
    "pop r15",
    "add rsp, 16",
    "iretq",
    ".popsection",
);

unsafe extern "C" {
    static rt_isr_stubs: u8;
    static rt_isr_stubs_end: u8;
}

static IDT: Racy<[u64; 512]> = Racy::new([0; 512]);

#[repr(C, packed(2))]
struct Pseudo {
    limit: u16,
    base: u64,
}

/// Fill and load the IDT (interrupt gates, DPL0, kernel CS, no IST).
pub fn init() {
    let base = (&raw const rt_isr_stubs) as u64;
    let end = (&raw const rt_isr_stubs_end) as u64;
    assert_eq!(
        end - base,
        256 * STUB_SIZE,
        "ISR stubs are not 16 bytes apart"
    );
    let mut idt = [0u64; 512];
    for (v, gate) in idt.chunks_exact_mut(2).enumerate() {
        let off = base + v as u64 * STUB_SIZE;
        // 64-bit interrupt gate, present, DPL0 (SDM vol. 3A Figure 6-8).
        gate[0] =
            (off & 0xffff) | u64::from(KERNEL_CS) << 16 | 0x8e << 40 | (off >> 16 & 0xffff) << 48;
        gate[1] = off >> 32;
    }
    IDT.set(idt);
    let idtr = Pseudo {
        limit: 256 * 16 - 1,
        base: IDT.as_ptr() as u64,
    };
    // SAFETY: the IDT is a static with 256 valid gates pointing at the stubs above.
    unsafe { asm!("lidt [{}]", in(reg) &raw const idtr, options(nostack)) }
}

/// Common trap dispatcher, called by `rt_isr_common` with the saved frame.
#[unsafe(no_mangle)]
extern "C" fn rt_trap(frame: &mut TrapFrame) {
    let fault = frame.fault();
    match fault.vector {
        VEC_NMI => return pmi::on_nmi(frame),
        v if v == pmi::PMI_VECTOR => return pmi::on_pmi(frame),
        VEC_SPURIOUS => return,
        _ => {}
    }
    if frame.cs & 3 == 3 && user::on_user_exception(frame, fault) {
        return;
    }
    if fault::fixup(frame, fault) {
        return;
    }
    if test::recover(frame, fault) {
        return;
    }
    crate::println!(
        "FATAL: unexpected exception #{} err={:#x} at {:#x} (cs={:#x}) outside any test",
        fault.vector,
        fault.error,
        fault.rip,
        fault.cs
    );
    crate::exit::exit(crate::EXIT_ABORT);
}

/// True if the trap came from an instruction that is `ud2` (0F 0B).
pub(crate) fn is_ud2_at(rip: u64) -> bool {
    // SAFETY: RIP is an identity-mapped address we just executed from (all of 0-4 GiB is mapped).
    let bytes = unsafe { core::ptr::read_unaligned(rip as *const [u8; 2]) };
    bytes == [0x0f, 0x0b]
}
