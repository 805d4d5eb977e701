//! Multiboot v1 test kernel, booted the way kvm-unit-tests' `.flat` images are: an ELF32 (after
//! `objcopy -O elf32-i386`) entered at `mb_entry` in 32-bit protected mode with paging off,
//! EAX = 0x2BADB002 and EBX = the multiboot info (MBI) address. The 32-bit entry records the
//! entry state, builds identity page tables for 0-4 GiB (2 MiB pages), enables long mode and
//! far-jumps to 64-bit code, which calls `mb_main(mbi)`; the checks run in Rust.
//!
//! Boot it with one vCPU and `--cmdline "arg1 arg2"`; the vmm provides the environment module
//! (`NR_CPUS=...`) and fw_cfg.

#![no_std]
#![no_main]

use core::arch::global_asm;
use guest_tests::test::TestResult;
use guest_tests::{ensure, ensure_eq, entry, fail, port, println};

/// EAX value a multiboot v1 loader passes.
const MULTIBOOT_BOOTLOADER_MAGIC: u32 = 0x2bad_b002;
/// MBI flags: mem_lower/mem_upper valid.
const MBI_FLAG_MEM: u32 = 1 << 0;
/// MBI flags: cmdline valid.
const MBI_FLAG_CMDLINE: u32 = 1 << 2;
/// MBI flags: mods_count/mods_addr valid.
const MBI_FLAG_MODS: u32 = 1 << 3;
/// CR0.PE and CR0.PG.
const CR0_PE: u32 = 1 << 0;
const CR0_PG: u32 = 1 << 31;
/// fw_cfg selector (16-bit write) and data (8-bit reads) ports, legacy I/O interface.
const FW_CFG_SELECTOR: u16 = 0x510;
const FW_CFG_DATA: u16 = 0x511;
/// fw_cfg key: number of CPUs (2 bytes, little-endian).
const FW_CFG_NB_CPUS: u16 = 0x05;
/// Bounds for reading guest-provided strings.
const MAX_CMDLINE: usize = 4096;
const MAX_MODULE: u32 = 16 * 1024;
/// The harness's `--cmdline`.
const EXPECTED_ARGS: [&str; 2] = ["arg1", "arg2"];

global_asm!(
    // Multiboot v1 header: magic, flags 0 (load addresses come from the ELF program headers),
    // checksum. link-mb.ld places it first in .text, inside the first 8 KiB of the file.
    ".pushsection .multiboot, \"a\"",
    ".balign 4",
    ".long 0x1BADB002",
    ".long 0",
    ".long -0x1BADB002",
    ".popsection",
    ".pushsection .data.mb_boot, \"aw\"",
    ".balign 8",
    ".globl mb_boot_eax, mb_boot_ebx, mb_boot_cr0",
    "mb_boot_eax: .long 0",
    "mb_boot_ebx: .long 0",
    "mb_boot_cr0: .long 0",
    ".balign 8",
    // null, 64-bit code (0x08), data (0x10)
    "mb_gdt: .quad 0, 0x00af9b000000ffff, 0x00cf93000000ffff",
    "mb_gdtr: .word 23",
    ".long mb_gdt",
    ".popsection",
    ".pushsection .bss.mb_pt, \"aw\", @nobits",
    ".balign 4096",
    "mb_pml4: .skip 4096",
    "mb_pdpt: .skip 4096",
    "mb_pd: .skip 16384",
    ".popsection",
    ".pushsection .text.mb_entry, \"ax\"",
    ".code32",
    ".globl mb_entry",
    "mb_entry:",
    "movl %eax, mb_boot_eax",
    "movl %ebx, mb_boot_ebx",
    "movl %cr0, %eax",
    "movl %eax, mb_boot_cr0",
    // PML4[0] -> PDPT; PDPT[0..4] -> the four PDs (present, writable, user).
    "movl $mb_pdpt + 7, mb_pml4",
    "movl $mb_pd + 7, %eax",
    "xorl %ecx, %ecx",
    "2:",
    "movl %eax, mb_pdpt(,%ecx,8)",
    "addl $4096, %eax",
    "incl %ecx",
    "cmpl $4, %ecx",
    "jb 2b",
    // 2048 identity 2 MiB pages: present, writable, user, PS. bss is zero (fresh RAM), so the
    // high halves of the entries already are.
    "movl $0x87, %eax",
    "xorl %ecx, %ecx",
    "3:",
    "movl %eax, mb_pd(,%ecx,8)",
    "addl $0x200000, %eax",
    "incl %ecx",
    "cmpl $2048, %ecx",
    "jb 3b",
    "movl $mb_pml4, %eax",
    "movl %eax, %cr3",
    // CR4: PAE | OSFXSR | OSXMMEXCPT.
    "movl %cr4, %eax",
    "orl $0x620, %eax",
    "movl %eax, %cr4",
    // EFER.LME (IA32_EFER = 0xC0000080, bit 8).
    "movl $0xC0000080, %ecx",
    "rdmsr",
    "orl $0x100, %eax",
    "wrmsr",
    // CR0: PG | PE -> IA-32e mode (compatibility until the far jump).
    "movl %cr0, %eax",
    "orl $0x80000001, %eax",
    "movl %eax, %cr0",
    "lgdt mb_gdtr",
    "ljmp $0x08, $4f",
    ".code64",
    "4:",
    "movw $0x10, %ax",
    "movw %ax, %ds",
    "movw %ax, %es",
    "movw %ax, %ss",
    "movw %ax, %fs",
    "movw %ax, %gs",
    "leaq __stack_top(%rip), %rsp",
    "movl mb_boot_ebx(%rip), %edi",
    "xorl %ebp, %ebp",
    "call mb_main",
    "5:",
    "cli",
    "hlt",
    "jmp 5b",
    ".popsection",
    options(att_syntax),
);

unsafe extern "C" {
    static mb_boot_eax: u32;
    static mb_boot_ebx: u32;
    static mb_boot_cr0: u32;
}

fn boot_reg(r: *const u32) -> u32 {
    // SAFETY: one of the mb_boot_* statics, written once by the 32-bit entry before any Rust
    // code ran.
    unsafe { r.read_volatile() }
}

#[unsafe(no_mangle)]
extern "C" fn mb_main(mbi: u32) -> ! {
    entry::init(0, 0);
    println!("mbtest: MBI at {mbi:#x}");
    guest_tests::test::run_all(
        "mbtest",
        guest_tests::tests![
            multiboot_magic,
            entry_protected_mode_paging_off,
            mbi_flags,
            mem_upper_consistent,
            cmdline_text,
            env_module,
            fw_cfg_nb_cpus,
        ],
    )
}

/// The multiboot info fields used here (multiboot v1 spec 3.3; offsets 0..24).
#[derive(Clone, Copy)]
struct Mbi {
    flags: u32,
    mem_lower: u32,
    mem_upper: u32,
    cmdline: u32,
    mods_count: u32,
    mods_addr: u32,
}

fn read_u32(addr: u32) -> u32 {
    // SAFETY: all of 0-4 GiB is identity-mapped; an unaligned read is fine on x86.
    unsafe { (addr as usize as *const u32).read_unaligned() }
}

fn mbi() -> Result<Mbi, guest_tests::test::Msg> {
    let base = boot_reg(&raw const mb_boot_ebx);
    let (start, end) = entry::image_range();
    ensure!(base != 0, "MBI address is 0");
    ensure!(
        u64::from(base) + 52 <= start || u64::from(base) >= end,
        "MBI at {base:#x} overlaps the image [{start:#x}, {end:#x})"
    );
    Ok(Mbi {
        flags: read_u32(base),
        mem_lower: read_u32(base + 4),
        mem_upper: read_u32(base + 8),
        cmdline: read_u32(base + 16),
        mods_count: read_u32(base + 20),
        mods_addr: read_u32(base + 24),
    })
}

/// The bytes of a NUL-terminated string at `addr`, up to `max`.
fn c_str(addr: u32, max: usize) -> Option<&'static [u8]> {
    // SAFETY: identity-mapped memory; the length is bounded by `max`.
    let bytes = unsafe { core::slice::from_raw_parts(addr as usize as *const u8, max) };
    bytes.iter().position(|&b| b == 0).map(|n| &bytes[..n])
}

fn multiboot_magic() -> TestResult {
    ensure_eq!(
        boot_reg(&raw const mb_boot_eax),
        MULTIBOOT_BOOTLOADER_MAGIC,
        "EAX at entry"
    );
    Ok(())
}

fn entry_protected_mode_paging_off() -> TestResult {
    let cr0 = boot_reg(&raw const mb_boot_cr0);
    ensure!(
        cr0 & CR0_PE != 0,
        "CR0 {cr0:#x} at entry: not in protected mode"
    );
    ensure!(cr0 & CR0_PG == 0, "CR0 {cr0:#x} at entry: paging on");
    Ok(())
}

fn mbi_flags() -> TestResult {
    let m = mbi()?;
    let want = MBI_FLAG_MEM | MBI_FLAG_CMDLINE | MBI_FLAG_MODS;
    ensure!(
        m.flags & want == want,
        "MBI flags {:#x} lack MEM|CMDLINE|MODS",
        m.flags
    );
    Ok(())
}

fn mem_upper_consistent() -> TestResult {
    let m = mbi()?;
    ensure!(
        m.mem_lower <= 640,
        "mem_lower {} KiB above 640",
        m.mem_lower
    );
    // mem_upper counts KiB from 1 MiB (QEMU); kvm-unit-tests reads mem_upper * 1 KiB as the end
    // of RAM. Both put RAM at [1 MiB, mem_upper KiB), which must hold the whole image.
    let top = u64::from(m.mem_upper) * 1024;
    let (_, end) = entry::image_range();
    ensure!(
        top > end,
        "mem_upper {} KiB ends below the image end {end:#x}",
        m.mem_upper
    );
    ensure!(top <= 4 << 30, "mem_upper {} KiB beyond 4 GiB", m.mem_upper);
    // The last word below that limit must be RAM.
    let p = (top - 8) as *mut u64;
    // SAFETY: the loader says this is free RAM above our image; identity-mapped.
    unsafe {
        p.write_volatile(0x0123_4567_89ab_cdef);
        ensure_eq!(
            p.read_volatile(),
            0x0123_4567_89ab_cdef,
            "readback below mem_upper"
        );
    }
    // The vmm's environment also states the RAM size (MEMSIZE, MiB): below the 4 GiB hole the
    // two must agree to within the 1 MiB the two mem_upper readings differ by.
    if let Some(mib) = env_value(module()?, b"MEMSIZE=") {
        let ram = u64::from(mib) << 20;
        ensure!(
            top <= ram,
            "mem_upper end {top:#x} beyond MEMSIZE {mib} MiB"
        );
        if ram <= 3 << 30 {
            ensure!(
                ram - top <= 1 << 20,
                "mem_upper end {top:#x} far below MEMSIZE {mib} MiB"
            );
        }
    }
    println!(
        "  mem_lower {} KiB, mem_upper {} KiB",
        m.mem_lower, m.mem_upper
    );
    Ok(())
}

fn cmdline_text() -> TestResult {
    let m = mbi()?;
    ensure!(m.flags & MBI_FLAG_CMDLINE != 0, "no cmdline flag");
    let Some(s) = c_str(m.cmdline, MAX_CMDLINE) else {
        fail!("cmdline not NUL-terminated")
    };
    let Ok(s) = core::str::from_utf8(s) else {
        fail!("cmdline not UTF-8")
    };
    println!("  cmdline {s:?}");
    // The vmm may put a program name first (as QEMU and kvm-unit-tests do): check the tail.
    let mut words = s.split_ascii_whitespace().rev();
    let (last, prev) = (words.next(), words.next());
    ensure!(
        prev == Some(EXPECTED_ARGS[0]) && last == Some(EXPECTED_ARGS[1]),
        "cmdline {s:?} does not end with \"arg1 arg2\""
    );
    Ok(())
}

/// The environment module's bytes (multiboot module entry: start, end, string, reserved).
fn module() -> Result<&'static [u8], guest_tests::test::Msg> {
    let m = mbi()?;
    ensure!(m.flags & MBI_FLAG_MODS != 0, "no mods flag");
    ensure_eq!(m.mods_count, 1, "mods_count");
    let (start, end) = (read_u32(m.mods_addr), read_u32(m.mods_addr + 4));
    ensure!(
        start < end && end - start <= MAX_MODULE,
        "module [{start:#x}, {end:#x})"
    );
    // SAFETY: identity-mapped, bounded length.
    Ok(unsafe { core::slice::from_raw_parts(start as usize as *const u8, (end - start) as usize) })
}

/// A numeric variable (`key` includes the `=`) from the environment: newline- or
/// NUL-separated KEY=VALUE lines.
fn env_value(env: &[u8], key: &[u8]) -> Option<u32> {
    env.split(|&b| b == b'\n' || b == 0)
        .filter_map(|line| line.strip_prefix(key))
        .filter_map(|v| core::str::from_utf8(v).ok()?.trim().parse().ok())
        .next()
}

fn env_module() -> TestResult {
    let env = module()?;
    ensure!(
        env.split(|&b| b == b'\n' || b == 0)
            .any(|l| l == b"NR_CPUS=1"),
        "environment lacks NR_CPUS=1 (mbtest boots with one vCPU): {:?}",
        core::str::from_utf8(env).unwrap_or("<non-UTF-8>")
    );
    Ok(())
}

fn fw_cfg_nb_cpus() -> TestResult {
    let Some(nr) = env_value(module()?, b"NR_CPUS=") else {
        fail!("no NR_CPUS in the environment")
    };
    port::outw(FW_CFG_SELECTOR, FW_CFG_NB_CPUS);
    let lo = port::inb(FW_CFG_DATA);
    let hi = port::inb(FW_CFG_DATA);
    ensure_eq!(
        u32::from(u16::from_le_bytes([lo, hi])),
        nr,
        "fw_cfg NB_CPUS vs environment NR_CPUS"
    );
    Ok(())
}
