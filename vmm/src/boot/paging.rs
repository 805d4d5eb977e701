//! Identity page tables and GDTs written by the VMM for the guest's first instruction.

use vm_memory::GuestMemoryMmap;

use super::BootError;
use super::layout::write;

/// GDT base for every format.
pub const GDT_ADDR: u64 = 0x500;
/// PML4 (CR3).
pub const PML4_ADDR: u64 = 0x9000;
/// PDPT, referenced by PML4[0].
pub const PDPT_ADDR: u64 = 0xA000;
/// First of four page directories (0xb000–0xefff), one per GiB.
pub const PD_ADDR: u64 = 0xB000;
/// Page directories written (4 × 1 GiB = 0–4 GiB).
pub const PD_COUNT: u64 = 4;

/// Present.
pub const PTE_P: u64 = 1 << 0;
/// Writable.
pub const PTE_RW: u64 = 1 << 1;
/// User accessible (so CPL3 workloads may touch every page).
pub const PTE_US: u64 = 1 << 2;
/// 2 MiB page (in a PD entry).
pub const PTE_PS: u64 = 1 << 7;

/// 64-bit kernel code, DPL0 (L=1, type 0xb).
pub const GDT_KERNEL_CODE64: u64 = 0x00af_9b00_0000_ffff;
/// Flat data, DPL0.
pub const GDT_KERNEL_DATA: u64 = 0x00cf_9300_0000_ffff;
/// Flat data, DPL3.
pub const GDT_USER_DATA: u64 = 0x00cf_f300_0000_ffff;
/// 64-bit user code, DPL3.
pub const GDT_USER_CODE64: u64 = 0x00af_fb00_0000_ffff;
/// Flat 32-bit code, DPL0 (D=1, G=1, type 0xb).
pub const GDT_CODE32: u64 = 0x00cf_9b00_0000_ffff;
/// 32-bit TSS at base 0, limit 0x67, busy (type 0xb) — what the PVH ABI asks TR to hold.
pub const GDT_TSS32: u64 = 0x0000_8b00_0000_0067;

/// GDT of 64-bit guest programs: null, 0x08 kernel code64, 0x10 kernel data, 0x18 user data,
/// 0x20 user code64 (the SYSRET-friendly order).
pub const GDT_ELF64: [u64; 5] = [
    0,
    GDT_KERNEL_CODE64,
    GDT_KERNEL_DATA,
    GDT_USER_DATA,
    GDT_USER_CODE64,
];

/// GDT for the Linux 64-bit boot protocol (Documentation/arch/x86/boot.rst): `__BOOT_CS` =
/// 0x10 (flat code, here 64-bit) and `__BOOT_DS` = 0x18; 0x08 is a spare code64 descriptor.
pub const GDT_LINUX64: [u64; 4] = [0, GDT_KERNEL_CODE64, GDT_KERNEL_CODE64, GDT_KERNEL_DATA];

/// GDT for 32-bit protected-mode entry (multiboot, PVH): null, 0x08 flat code32, 0x10 flat
/// data, 0x18 32-bit TSS.
pub const GDT_PROTECTED32: [u64; 4] = [0, GDT_CODE32, GDT_KERNEL_DATA, GDT_TSS32];

/// Write a GDT at [`GDT_ADDR`]; returns its limit (size − 1) for GDTR.
pub fn write_gdt(mem: &GuestMemoryMmap<()>, entries: &[u64]) -> Result<u16, BootError> {
    let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
    write(mem, GDT_ADDR, &bytes, "GDT")?;
    // At most a handful of entries: fits in u16.
    Ok(u16::try_from(bytes.len() - 1).unwrap_or(u16::MAX))
}

/// Identity-map 0–4 GiB with 2 MiB pages, every entry P|RW|US (PDEs also PS).
pub fn write_identity_page_tables(mem: &GuestMemoryMmap<()>) -> Result<(), BootError> {
    let table = PTE_P | PTE_RW | PTE_US;
    let mut pml4 = vec![0u8; 4096];
    pml4[..8].copy_from_slice(&(PDPT_ADDR | table).to_le_bytes());
    write(mem, PML4_ADDR, &pml4, "PML4")?;

    let mut pdpt = vec![0u8; 4096];
    for i in 0..PD_COUNT {
        let at = usize::try_from(i * 8).unwrap_or(0);
        pdpt[at..at + 8].copy_from_slice(&((PD_ADDR + i * 0x1000) | table).to_le_bytes());
    }
    write(mem, PDPT_ADDR, &pdpt, "PDPT")?;

    for pd_index in 0..PD_COUNT {
        let pd: Vec<u8> = (0..512u64)
            .flat_map(|j| ((((pd_index << 9) | j) << 21) | table | PTE_PS).to_le_bytes())
            .collect();
        write(mem, PD_ADDR + pd_index * 0x1000, &pd, "page directory")?;
    }
    Ok(())
}
