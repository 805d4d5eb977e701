//! Loader for 64-bit ELF guest programs (the `guest-tests` crate).
//!
//! # Entry contract (the guest-tests runtime relies on it)
//!
//! The image must be a little-endian x86-64 `ET_EXEC` whose PT_LOAD segments sit at physical
//! addresses (`p_paddr`) between 64 KiB and the end of RAM, outside [3 GiB, 4 GiB). Each segment
//! gets `p_filesz` bytes from the file; the rest up to `p_memsz` is zeroed.
//!
//! **Every** vCPU starts at `e_entry` at the same time, in 64-bit long mode at CPL0:
//!
//! | Register | Value |
//! |---|---|
//! | RDI | vCPU index (0 = BSP; APs must be parked by the guest) |
//! | RSI | RAM size in bytes (`--mem`) |
//! | RDX | GPA of the NUL-terminated `--cmdline` text (0xf000, empty string if none) |
//! | RSP | 0: the guest sets its own stack before any push |
//! | RFLAGS | 0x2 (IF = 0) |
//! | CR0 | 0x8000_0033 (PG, NE, ET, MP, PE) |
//! | CR3 | 0x9000: PML4 → PDPT 0xa000 → PDs 0xb000–0xefff, identity map of 0–4 GiB with 2 MiB pages, every entry P\|RW\|US (\|PS), so CPL3 code may access everything. RAM above 4 GiB is not mapped. |
//! | CR4 | 0x620 (PAE, OSFXSR, OSXMMEXCPT) |
//! | EFER | 0x500 (LME, LMA) |
//! | GDTR | base 0x500, limit 39: 0x00 null, 0x08 kernel code64 (DPL0), 0x10 kernel data, 0x18 user data (DPL3), 0x20 user code64 (DPL3) |
//! | CS / DS, ES, SS, FS, GS | 0x08 / 0x10, all bases 0 |
//! | IDTR | base 0, limit 0: any exception before the guest loads its own IDT shuts the VM down |
//! | TR, LDTR | KVM's reset values: load a TSS before entering CPL3 or taking interrupts |
//! | x87 / SSE | FCW 0x37f, MXCSR 0x1f80 |
//!
//! Everything below 64 KiB belongs to these boot structures; the guest may reuse it once it has
//! its own GDT and page tables.

use vm_memory::GuestMemoryMmap;

use super::elf::{ELFCLASS64, ElfImage, check_segments, load_segments};
use super::layout::{CMDLINE_ADDR, CMDLINE_MAX, write_cmdline};
use super::paging::{GDT_ELF64, write_gdt, write_identity_page_tables};
use super::{BootConfig, BootError, BootInfo, KernelFormat};

/// Start of the x86-64 kernel half of the address space: an entry point up there is a Linux
/// vmlinux (linked at __START_KERNEL_map), not a guest program.
const LINUX_KERNEL_VIRTUAL_BASE: u64 = 0xFFFF_8000_0000_0000;

/// Load a 64-bit ELF guest program and write its GDT, page tables and command line.
pub fn load(
    mem: &GuestMemoryMmap<()>,
    bytes: &[u8],
    cfg: &BootConfig,
) -> Result<BootInfo, BootError> {
    let image = ElfImage::parse(bytes, ELFCLASS64)?;
    if !image.contains(image.entry) {
        if image.entry >= LINUX_KERNEL_VIRTUAL_BASE {
            return Err(BootError::NoPvhEntry(format!(
                "entry {:#x} is a kernel virtual address: this looks like a Linux vmlinux",
                image.entry
            )));
        }
        return Err(BootError::EntryOutsideImage(image.entry));
    }
    check_segments(&image, cfg.mem_size)?;
    load_segments(mem, &image, bytes)?;
    write_gdt(mem, &GDT_ELF64)?;
    write_identity_page_tables(mem)?;
    write_cmdline(
        mem,
        CMDLINE_ADDR,
        cfg.cmdline,
        CMDLINE_MAX - 1,
        KernelFormat::Elf64,
    )?;
    Ok(BootInfo {
        format: KernelFormat::Elf64,
        entry: image.entry,
        mem_size: cfg.mem_size,
        boot_data: CMDLINE_ADDR,
        kernel_end: image.end(),
        initrd: None,
    })
}
