//! `_start` and boot-time setup.
//!
//! The vmm enters every vCPU at `_start` (64-bit, CPL0, IF=0) with RDI = vCPU index and RSI = RAM
//! size. The BSP runs on the 64 KiB stack ending at `__stack_top`, AP n on 8 KiB at
//! `__ap_stacks_top - (n - 1) * 8 KiB`; vCPUs beyond [`MAX_CPUS`] halt at once. All of them call
//! the bin's `guest_main(cpu, mem_size)`, which calls [`init`]: the BSP sets up the runtime, APs
//! record their arrival and park (CLI; HLT) without touching runtime state.

use crate::racy::Racy;
use crate::{cpu, gdt, idt, lapic, port};
use core::arch::global_asm;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// vCPUs with a stack (BSP + 7 APs).
pub const MAX_CPUS: u64 = CPU_SLOTS as u64;
const CPU_SLOTS: usize = 8;
/// Stack size of each AP (see link.ld).
const AP_STACK_SIZE: u64 = 0x2000;

global_asm!(
    ".pushsection .text._start, \"ax\"",
    ".global _start",
    "_start:",
    "test rdi, rdi",
    "jnz 2f",
    // BSP only: remember the --cmdline pointer (RDX) before any Rust code runs.
    "mov [rip + {cmdline}], rdx",
    "lea rsp, [rip + __stack_top]",
    "jmp 4f",
    "2:",
    "cmp rdi, {max}",
    "jae 5f",
    "lea rax, [rdi - 1]",
    "imul rax, rax, {apsz}",
    "lea rsp, [rip + __ap_stacks_top]",
    "sub rsp, rax",
    "4:",
    "xor ebp, ebp",
    "call guest_main",
    "5:",
    "cli",
    "hlt",
    "jmp 5b",
    ".popsection",
    max = const MAX_CPUS,
    apsz = const AP_STACK_SIZE,
    cmdline = sym CMDLINE_PTR,
);

/// RDX at the BSP's `_start`: GPA of the NUL-terminated `--cmdline` text (0 if the guest was
/// entered some other way, e.g. through multiboot).
static CMDLINE_PTR: AtomicU64 = AtomicU64::new(0);
/// The longest command line the vmm passes (its CMDLINE_MAX, NUL included).
const CMDLINE_MAX: usize = 0x1000;

/// Bit n set once vCPU n (n >= 1) reached [`init`].
static AP_SEEN: AtomicU64 = AtomicU64::new(0);
/// APIC ID each AP read from its own LAPIC (index = vCPU index).
static AP_APIC_ID: [AtomicU32; CPU_SLOTS] = [const { AtomicU32::new(u32::MAX) }; CPU_SLOTS];
static MEM_SIZE: Racy<u64> = Racy::new(0);

unsafe extern "C" {
    static __image_start: u8;
    static __image_end: u8;
}

/// Per-vCPU entry work. On the BSP (cpu 0): load the runtime's GDT/TSS and IDT, software-enable
/// the LAPIC, mask the 8259 and remember `mem_size`; then return. APs record their arrival and
/// APIC ID and never return.
pub fn init(cpu: u64, mem_size: u64) {
    if cpu != 0 {
        park_ap(cpu);
    }
    MEM_SIZE.set(mem_size);
    gdt::init();
    idt::init();
    // Legacy PIC interrupts are not used: mask both 8259s (as kvm-unit-tests does).
    port::outb(0x21, 0xff);
    port::outb(0xa1, 0xff);
    lapic::enable();
}

fn park_ap(cpu: u64) -> ! {
    if let Some(slot) = usize::try_from(cpu).ok().and_then(|i| AP_APIC_ID.get(i)) {
        slot.store(lapic::id(), Ordering::SeqCst);
        AP_SEEN.fetch_or(1 << cpu, Ordering::SeqCst);
    }
    loop {
        cpu::cli_hlt();
    }
}

/// Bitmask of APs that entered `guest_main` (bit n = vCPU n).
pub fn aps_seen() -> u64 {
    AP_SEEN.load(Ordering::SeqCst)
}

/// The APIC ID AP `cpu` read, if it arrived.
pub fn ap_apic_id(cpu: usize) -> Option<u32> {
    AP_APIC_ID
        .get(cpu)
        .map(|a| a.load(Ordering::SeqCst))
        .filter(|&id| id != u32::MAX)
}

/// RAM size the vmm passed in RSI (0 for multiboot guests, which get it from the MBI).
pub fn mem_size() -> u64 {
    MEM_SIZE.get()
}

/// First and one-past-last byte of the loaded image (including bss and stacks).
pub fn image_range() -> (u64, u64) {
    (
        (&raw const __image_start) as u64,
        (&raw const __image_end) as u64,
    )
}

/// The `--cmdline` text the vmm passed in RDX (boot contract in vmm/src/boot/elf64.rs): empty
/// if there was none, if the pointer is 0 or if the text is not NUL-terminated UTF-8 within
/// [`CMDLINE_MAX`] bytes.
pub fn cmdline() -> &'static str {
    let p = CMDLINE_PTR.load(Ordering::SeqCst);
    if p == 0 {
        return "";
    }
    // SAFETY: the vmm wrote at most CMDLINE_MAX bytes at this identity-mapped low address,
    // which the runtime never reuses; only reads happen.
    let bytes = unsafe { core::slice::from_raw_parts(p as *const u8, CMDLINE_MAX) };
    let len = bytes.iter().position(|&b| b == 0).unwrap_or(0);
    core::str::from_utf8(&bytes[..len]).unwrap_or("")
}
