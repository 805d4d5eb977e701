//! The runtime's own GDT (same selectors as the vmm's boot GDT) plus a 64-bit TSS whose RSP0 is
//! the stack the CPU switches to when an exception or interrupt arrives at CPL3.

use crate::racy::Racy;
use core::arch::asm;

/// Kernel code selector (64-bit, DPL0).
pub const KERNEL_CS: u16 = 0x08;
/// Kernel data selector.
pub const KERNEL_DS: u16 = 0x10;
/// User data selector (DPL3), RPL 3 included.
pub const USER_DS: u16 = 0x18 | 3;
/// User code selector (64-bit, DPL3), RPL 3 included.
pub const USER_CS: u16 = 0x20 | 3;
/// TSS selector.
pub const TSS_SEL: u16 = 0x28;

/// Size of the stack used for traps from CPL3 (TSS.RSP0).
const TRAP_STACK_SIZE: usize = 16 * 1024;

#[repr(C, align(16))]
struct Stack([u8; TRAP_STACK_SIZE]);

static TRAP_STACK: Racy<Stack> = Racy::new(Stack([0; TRAP_STACK_SIZE]));

/// 64-bit TSS (SDM vol. 3A Figure 8-11); only RSP0 and the I/O-map base are used.
#[repr(C, packed(4))]
#[derive(Clone, Copy)]
struct Tss {
    reserved0: u32,
    rsp: [u64; 3],
    reserved1: u64,
    ist: [u64; 7],
    reserved2: u64,
    reserved3: u16,
    iomap_base: u16,
}

const TSS_SIZE: u16 = 104;
const _: () = assert!(core::mem::size_of::<Tss>() == TSS_SIZE as usize);

static TSS: Racy<Tss> = Racy::new(Tss {
    reserved0: 0,
    rsp: [0; 3],
    reserved1: 0,
    ist: [0; 7],
    reserved2: 0,
    reserved3: 0,
    // Base beyond the limit: no I/O bitmap, so port I/O at CPL3 with IOPL 0 raises #GP.
    iomap_base: TSS_SIZE,
});

/// null, kernel code, kernel data, user data, user code, TSS (two slots).
static GDT: Racy<[u64; 7]> = Racy::new([
    0,
    0x00af_9b00_0000_ffff,
    0x00cf_9300_0000_ffff,
    0x00cf_f300_0000_ffff,
    0x00af_fb00_0000_ffff,
    0,
    0,
]);

/// GDT limit: 7 descriptors of 8 bytes, minus one.
const GDT_LIMIT: u16 = 7 * 8 - 1;

#[repr(C, packed(2))]
struct Pseudo {
    limit: u16,
    base: u64,
}

/// Top of the CPL3 -> CPL0 trap stack.
pub fn trap_stack_top() -> u64 {
    TRAP_STACK.as_ptr() as u64 + TRAP_STACK_SIZE as u64
}

/// Build the TSS descriptor, load the GDT, reload all segment registers and the task register.
pub fn init() {
    let mut tss = TSS.get();
    tss.rsp[0] = trap_stack_top();
    TSS.set(tss);

    let base = TSS.as_ptr() as u64;
    let limit = u64::from(TSS_SIZE - 1);
    // Available 64-bit TSS (type 9), present, DPL0 (SDM vol. 3A Figure 8-4).
    let low = (limit & 0xffff)
        | (base & 0xff_ffff) << 16
        | 0x89 << 40
        | (limit >> 16 & 0xf) << 48
        | (base >> 24 & 0xff) << 56;
    let mut gdt = GDT.get();
    gdt[5] = low;
    gdt[6] = base >> 32;
    GDT.set(gdt);

    let gdtr = Pseudo {
        limit: GDT_LIMIT,
        base: GDT.as_ptr() as u64,
    };
    // SAFETY: the GDT keeps the selectors the code already runs on (0x08/0x10), so reloading CS
    // via a far return and the data segments is transparent; LTR marks our TSS busy once.
    unsafe {
        asm!(
            "lgdt [{gdtr}]",
            "push {cs}",
            "lea {tmp}, [rip + 2f]",
            "push {tmp}",
            "retfq",
            "2:",
            "mov ds, {ds:x}",
            "mov es, {ds:x}",
            "mov ss, {ds:x}",
            "mov fs, {ds:x}",
            "mov gs, {ds:x}",
            "ltr {tss:x}",
            gdtr = in(reg) &raw const gdtr,
            cs = const KERNEL_CS,
            ds = in(reg) u64::from(KERNEL_DS),
            tss = in(reg) u64::from(TSS_SEL),
            tmp = out(reg) _,
        )
    }
}
