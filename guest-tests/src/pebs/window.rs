//! The counted PEBS window: one assembly routine that loads known values into every GPR,
//! RFLAGS and XMM0-15, enables a counter with a WRMSR, runs a fixed instruction sequence and
//! disables the counter with a second WRMSR. Every counted instruction's address goes into a
//! table (`.rodata.pebs_ips`), so the expected IP, eventing IP and registers of a record on the
//! k-th counted instruction are exact: [`ip`] and [`regs_after`].
//!
//! Counted instructions (1-based), see [`OPS`]: 1 the enabling WRMSR; 2-9 `lea r8, [r8 + 1]`;
//! 10 `jmp` (taken, over a `ud2`); 11 `lea`; 12 `jmp`; 13 `mov r10, [r11]` (load); 14
//! `mov [r11 + 8], r8` (store); 15-54 `lea`; 55 `mov ecx, r9d`; 56 `mov eax, 0`; 57 `mov edx, 0`
//! (none of them changes RFLAGS); then the disabling WRMSR, which is not counted.

use core::arch::global_asm;
use core::sync::atomic::{AtomicU64, Ordering};

/// What a counted instruction does to the registers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// The enabling WRMSR.
    Wrmsr,
    /// `lea r8, [r8 + 1]`.
    Lea,
    /// `jmp` forward over a `ud2`.
    Jmp,
    /// `mov r10, [r11]`.
    Load,
    /// `mov [r11 + 8], r8`.
    Store,
    /// `mov ecx, r9d`.
    MovEcx,
    /// `mov eax, 0`.
    MovEax0,
    /// `mov edx, 0`.
    MovEdx0,
}

const LEAS_AFTER: usize = 40;
/// Counted instructions in the window.
pub const COUNTED: usize = 14 + LEAS_AFTER + 3;

const fn build_ops() -> [Op; COUNTED] {
    let mut ops = [Op::Lea; COUNTED];
    ops[0] = Op::Wrmsr;
    ops[9] = Op::Jmp;
    ops[11] = Op::Jmp;
    ops[12] = Op::Load;
    ops[13] = Op::Store;
    ops[COUNTED - 3] = Op::MovEcx;
    ops[COUNTED - 2] = Op::MovEax0;
    ops[COUNTED - 1] = Op::MovEdx0;
    ops
}

/// The counted instructions in order (index k - 1 for the k-th).
pub const OPS: [Op; COUNTED] = build_ops();

/// RFLAGS in the window: OF SF ZF AF PF CF and the reserved bit 1 (IF, TF, DF clear).
pub const FLAGS: u64 = 0x8D7;
/// Initial register values.
pub const RBX: u64 = 0xB0B0_1111_2222_0B0B;
/// RBP.
pub const RBP: u64 = 0xB9B9_3333_4444_0B9B;
/// RSI.
pub const RSI: u64 = 0x5151_5555_6666_0515;
/// RDI.
pub const RDI: u64 = 0xD1D1_7777_8888_0D1D;
/// R8 before the first `lea`.
pub const R8: u64 = 0x8888_0000_0000_0000;
/// R10 before the load.
pub const R10: u64 = 0xA0A0_9999_AAAA_0A0A;
/// R12.
pub const R12: u64 = 0xC12C_BBBB_CCCC_0C12;
/// R13.
pub const R13: u64 = 0xC13C_DDDD_EEEE_0C13;
/// R14.
pub const R14: u64 = 0xC14C_FFFF_0000_0C14;
/// R15.
pub const R15: u64 = 0xC15C_1234_5678_0C15;

/// XMM register `i`'s value in the window.
pub const fn xmm_value(i: usize) -> u128 {
    let lo = 0x0101_0101_0101_0101u64.wrapping_mul(i as u64 + 1) ^ 0xA5A5_0000_0000_5A5A;
    let hi = lo.rotate_left(17) ^ (i as u64) << 8;
    (hi as u128) << 64 | lo as u128
}

const fn build_xmm() -> [u128; 16] {
    let mut a = [0u128; 16];
    let mut i = 0;
    while i < 16 {
        a[i] = xmm_value(i);
        i += 1;
    }
    a
}

/// XMM0-15 loaded before the window (movdqu).
#[unsafe(no_mangle)]
static PEBS_XMM_INIT: [u128; 16] = build_xmm();

/// RSP inside the window, stored by the routine.
#[unsafe(no_mangle)]
static PEBS_WINDOW_RSP: AtomicU64 = AtomicU64::new(0);

/// Arguments of one window.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WindowArgs {
    /// MSR whose WRMSR enables counting (counted instruction 1).
    pub en_msr: u64,
    /// Value written to it.
    pub en_val: u64,
    /// MSR written with 0 at the end (not counted).
    pub dis_msr: u64,
    /// Address of two quadwords: the load reads the first, the store writes R8 to the second.
    pub cell: u64,
}

unsafe extern "C" {
    fn pebs_window(args: *const WindowArgs);
    static pebs_ips_start: u64;
    static pebs_ips_end: u64;
}

/// One counted-instruction IP entry (assembly text): record the address of what follows.
macro_rules! pi {
    ($insn:literal) => {
        concat!(
            ".pushsection .rodata.pebs_ips,\"a\"\n.quad 771f\n.popsection\n771: ",
            $insn
        )
    };
}

global_asm!(
    ".pushsection .rodata.pebs_ips,\"a\"",
    ".balign 8",
    ".global pebs_ips_start",
    "pebs_ips_start:",
    ".popsection",
    ".pushsection .text.pebs_window,\"ax\"",
    ".global pebs_window",
    "pebs_window:",
    "push rbx",
    "push rbp",
    "push r12",
    "push r13",
    "push r14",
    "push r15",
    "mov ecx, [rdi]",
    "mov eax, [rdi + 8]",
    "mov edx, [rdi + 12]",
    "mov r9, [rdi + 16]",
    "mov r11, [rdi + 24]",
    "movdqu xmm0, [rip + {x}]",
    "movdqu xmm1, [rip + {x} + 16]",
    "movdqu xmm2, [rip + {x} + 32]",
    "movdqu xmm3, [rip + {x} + 48]",
    "movdqu xmm4, [rip + {x} + 64]",
    "movdqu xmm5, [rip + {x} + 80]",
    "movdqu xmm6, [rip + {x} + 96]",
    "movdqu xmm7, [rip + {x} + 112]",
    "movdqu xmm8, [rip + {x} + 128]",
    "movdqu xmm9, [rip + {x} + 144]",
    "movdqu xmm10, [rip + {x} + 160]",
    "movdqu xmm11, [rip + {x} + 176]",
    "movdqu xmm12, [rip + {x} + 192]",
    "movdqu xmm13, [rip + {x} + 208]",
    "movdqu xmm14, [rip + {x} + 224]",
    "movdqu xmm15, [rip + {x} + 240]",
    "mov rbx, {rbx}",
    "mov rbp, {rbp}",
    "mov rsi, {rsi}",
    "mov rdi, {rdi}",
    "mov r8, {r8}",
    "mov r10, {r10}",
    "mov r12, {r12}",
    "mov r13, {r13}",
    "mov r14, {r14}",
    "mov r15, {r15}",
    "push {flags}",
    "popfq",
    "mov [rip + {rsp}], rsp",
    pi!("wrmsr"),
    ".rept 8",
    pi!("lea r8, [r8 + 1]"),
    ".endr",
    pi!("jmp 772f"),
    "ud2",
    "772:",
    pi!("lea r8, [r8 + 1]"),
    pi!("jmp 773f"),
    "ud2",
    "773:",
    pi!("mov r10, [r11]"),
    pi!("mov [r11 + 8], r8"),
    ".rept {leas}",
    pi!("lea r8, [r8 + 1]"),
    ".endr",
    pi!("mov ecx, r9d"),
    pi!("mov eax, 0"),
    pi!("mov edx, 0"),
    pi!("wrmsr"),
    "pop r15",
    "pop r14",
    "pop r13",
    "pop r12",
    "pop rbp",
    "pop rbx",
    "ret",
    ".popsection",
    ".pushsection .rodata.pebs_ips,\"a\"",
    ".global pebs_ips_end",
    "pebs_ips_end:",
    ".popsection",
    x = sym PEBS_XMM_INIT,
    rsp = sym PEBS_WINDOW_RSP,
    rbx = const RBX,
    rbp = const RBP,
    rsi = const RSI,
    rdi = const RDI,
    r8 = const R8,
    r10 = const R10,
    r12 = const R12,
    r13 = const R13,
    r14 = const R14,
    r15 = const R15,
    flags = const FLAGS,
    leas = const LEAS_AFTER,
);

/// The IP table: entry k - 1 is the address of counted instruction k; the last entry is the
/// disabling WRMSR.
pub fn ips() -> &'static [u64] {
    let start = &raw const pebs_ips_start;
    let end = &raw const pebs_ips_end;
    let len = (end as usize - start as usize) / 8;
    // SAFETY: the assembly above emits `len` quadwords between the two symbols in one section.
    unsafe { core::slice::from_raw_parts(start, len) }
}

/// Address of counted instruction `k` (1-based); `k = COUNTED + 1` is the disabling WRMSR.
pub fn ip(k: usize) -> u64 {
    ips().get(k.wrapping_sub(1)).copied().unwrap_or(0)
}

/// Run the window.
///
/// # Safety
/// Both MSR writes must be harmless to the runtime; `args.cell` must point to 16 writable bytes.
pub unsafe fn run(args: &WindowArgs) {
    // SAFETY: the routine saves the callee-saved registers, writes only the two MSRs, the cell
    // and PEBS_WINDOW_RSP, and leaves RFLAGS.DF clear; XMM registers are caller-saved and the
    // soft-float Rust code keeps nothing in them.
    unsafe { pebs_window(args) }
}

/// RSP inside the last window.
pub fn window_rsp() -> u64 {
    PEBS_WINDOW_RSP.load(Ordering::SeqCst)
}

/// The general-purpose registers and RFLAGS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regs {
    /// RAX.
    pub rax: u64,
    /// RBX.
    pub rbx: u64,
    /// RCX.
    pub rcx: u64,
    /// RDX.
    pub rdx: u64,
    /// RSI.
    pub rsi: u64,
    /// RDI.
    pub rdi: u64,
    /// RBP.
    pub rbp: u64,
    /// RSP.
    pub rsp: u64,
    /// R8-R15.
    pub r: [u64; 8],
    /// RFLAGS.
    pub rflags: u64,
}

/// Registers after counted instruction `k` of a window run with `args`, given the value the
/// load reads and the window's RSP.
pub fn regs_after(k: usize, args: &WindowArgs, load_value: u64, rsp: u64) -> Regs {
    let mut g = Regs {
        rax: args.en_val & 0xFFFF_FFFF,
        rbx: RBX,
        rcx: args.en_msr & 0xFFFF_FFFF,
        rdx: args.en_val >> 32,
        rsi: RSI,
        rdi: RDI,
        rbp: RBP,
        rsp,
        r: [R8, args.dis_msr, R10, args.cell, R12, R13, R14, R15],
        rflags: FLAGS,
    };
    for op in OPS.iter().take(k) {
        match op {
            Op::Lea => g.r[0] = g.r[0].wrapping_add(1),
            Op::Load => g.r[2] = load_value,
            Op::MovEcx => g.rcx = args.dis_msr & 0xFFFF_FFFF,
            Op::MovEax0 => g.rax = 0,
            Op::MovEdx0 => g.rdx = 0,
            Op::Wrmsr | Op::Jmp | Op::Store => {}
        }
    }
    g
}
