//! Saved kernel contexts the trap handler can resume: `rt_ctx_call` runs a function and comes
//! back either normally or, after an unexpected exception, through the handler; `rt_enter_user`
//! IRETQs to CPL3 and only comes back through the handler (#UD from the user code).
//!
//! Resuming rewrites the trap frame so its IRETQ lands on `rt_ctx_resume` (a `ret`) with the
//! saved callee-saved registers and stack pointer and the given RAX:RDX as the return value.

use crate::gdt::{KERNEL_CS, KERNEL_DS, USER_CS, USER_DS};
use crate::idt::TrapFrame;
use core::arch::global_asm;

/// Callee-saved state of the kernel at the point a context was saved.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct JmpCtx {
    rbx: u64,
    rbp: u64,
    r12: u64,
    r13: u64,
    r14: u64,
    r15: u64,
    rsp: u64,
    rip: u64,
}

impl JmpCtx {
    /// An empty context (nothing saved yet).
    pub const ZERO: Self = Self {
        rbx: 0,
        rbp: 0,
        r12: 0,
        r13: 0,
        r14: 0,
        r15: 0,
        rsp: 0,
        rip: 0,
    };
}

/// A two-register return value (RAX, RDX in the SysV ABI).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetPair {
    /// RAX.
    pub a: u64,
    /// RDX.
    pub b: u64,
}

/// User-mode RFLAGS: IF set (PMIs and other fixed interrupts arrive), IOPL 0, reserved bit 1.
const USER_RFLAGS: u64 = 0x202;
/// Kernel RFLAGS after a resume: interrupts off, as the runtime always runs.
const KERNEL_RFLAGS: u64 = 0x2;

global_asm!(
    ".pushsection .text.rt_ctx, \"ax\"",
    // fn rt_ctx_call(ctx: *mut JmpCtx, f: extern "C" fn(*mut ()), arg: *mut ()) -> RetPair
    ".global rt_ctx_call",
    "rt_ctx_call:",
    "mov [rdi], rbx",
    "mov [rdi + 8], rbp",
    "mov [rdi + 16], r12",
    "mov [rdi + 24], r13",
    "mov [rdi + 32], r14",
    "mov [rdi + 40], r15",
    "mov [rdi + 48], rsp",
    "lea rax, [rip + rt_ctx_resume]",
    "mov [rdi + 56], rax",
    "mov rdi, rdx",
    // Entry RSP is 8 mod 16; the callee must see the same after our call.
    "sub rsp, 8",
    "call rsi",
    "add rsp, 8",
    "xor eax, eax",
    "xor edx, edx",
    "ret",
    // fn rt_enter_user(ctx: *mut JmpCtx, entry: u64, user_rsp: u64, arg: u64) -> RetPair
    ".global rt_enter_user",
    "rt_enter_user:",
    "mov [rdi], rbx",
    "mov [rdi + 8], rbp",
    "mov [rdi + 16], r12",
    "mov [rdi + 24], r13",
    "mov [rdi + 32], r14",
    "mov [rdi + 40], r15",
    "mov [rdi + 48], rsp",
    "lea rax, [rip + rt_ctx_resume]",
    "mov [rdi + 56], rax",
    "push {uds}",
    "push rdx",
    "push {uflags}",
    "push {ucs}",
    "push rsi",
    "mov rdi, rcx",
    "xor eax, eax",
    "xor ebx, ebx",
    "xor ecx, ecx",
    "xor edx, edx",
    "xor esi, esi",
    "xor ebp, ebp",
    "iretq",
    "rt_ctx_resume:",
    "ret",
    // User code returns here (or executes its own ud2): #UD at CPL3 ends the user run.
    ".global rt_user_exit",
    "rt_user_exit:",
    "ud2",
    ".popsection",
    uds = const USER_DS,
    ucs = const USER_CS,
    uflags = const USER_RFLAGS,
);

unsafe extern "C" {
    /// Save the context into `ctx` and call `f(arg)`; returns (0, 0) when `f` returns, or the
    /// pair passed to [`resume`].
    pub fn rt_ctx_call(ctx: *mut JmpCtx, f: extern "C" fn(*mut ()), arg: *mut ()) -> RetPair;
    /// Save the context into `ctx` and IRETQ to `entry` at CPL3 with RSP `user_rsp`, RDI `arg`;
    /// returns only through [`resume`].
    pub fn rt_enter_user(ctx: *mut JmpCtx, entry: u64, user_rsp: u64, arg: u64) -> RetPair;
    /// A `ud2` that user functions return into.
    pub static rt_user_exit: u8;
}

/// Make the trap frame's IRETQ return from the `rt_ctx_call`/`rt_enter_user` that saved `ctx`,
/// with `ret` as its return value. Works whatever the CPL of the trapped code.
pub fn resume(frame: &mut TrapFrame, ctx: &JmpCtx, ret: RetPair) {
    frame.rbx = ctx.rbx;
    frame.rbp = ctx.rbp;
    frame.r12 = ctx.r12;
    frame.r13 = ctx.r13;
    frame.r14 = ctx.r14;
    frame.r15 = ctx.r15;
    frame.rsp = ctx.rsp;
    frame.rip = ctx.rip;
    frame.cs = u64::from(KERNEL_CS);
    frame.ss = u64::from(KERNEL_DS);
    frame.rflags = KERNEL_RFLAGS;
    frame.rax = ret.a;
    frame.rdx = ret.b;
}
