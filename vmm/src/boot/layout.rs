//! Guest-physical memory layout: RAM ranges, the low boot-structure area, placement checks and
//! checked writes.
//!
//! Boot structures (all below [`BOOT_AREA_END`]):
//!
//! | GPA | Contents | Formats |
//! |---|---|---|
//! | 0x0500 | GDT ([`crate::boot::paging`]) | all |
//! | 0x1000 | multiboot info (MBI), module list at 0x1100, module string at 0x1180 | multiboot |
//! | 0x2000 | multiboot command line (≤ 4 KiB) | multiboot |
//! | 0x3000–0x6fff | multiboot environment module (≤ 16 KiB) | multiboot |
//! | 0x6000 | `hvm_start_info`, module list at 0x6100, memory map at 0x6200 | PVH |
//! | 0x7000 | `boot_params` (zero page) | bzImage |
//! | 0x9000–0xefff | PML4, PDPT, 4 PDs (identity map of 0–4 GiB, 2 MiB pages) | ELF64, bzImage |
//! | 0xf000 | command line (≤ 4 KiB) | ELF64, bzImage, PVH |

use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::BootError;

/// End (exclusive) of the area reserved for VMM boot structures; no kernel segment may load
/// below it.
pub const BOOT_AREA_END: u64 = 0x1_0000;
/// Start of the LAPIC/IOAPIC MMIO hole when RAM exceeds it.
pub const MMIO_HOLE_START: u64 = 0xC000_0000;
/// End of the MMIO hole: RAM above 3 GiB continues here.
pub const MMIO_HOLE_END: u64 = 0x1_0000_0000;
/// Start of the extended BIOS data area: conventional RAM ends here.
pub const EBDA_START: u64 = 0x9_FC00;
/// First byte of RAM above the legacy VGA/BIOS hole.
pub const HIGH_RAM_START: u64 = 0x10_0000;
/// Command line for ELF64 guest programs and Linux.
pub const CMDLINE_ADDR: u64 = 0xF000;
/// Room for [`CMDLINE_ADDR`] including the terminating NUL.
pub const CMDLINE_MAX: usize = 0x1000;
/// Smallest accepted `--mem`.
pub const MIN_MEM_SIZE: u64 = 2 << 20;

/// e820 / PVH memory type: usable RAM.
pub const E820_RAM: u32 = 1;
/// e820 / PVH memory type: reserved.
pub const E820_RESERVED: u32 = 2;

const PAGE_SIZE: u64 = 0x1000;

/// RAM regions for a guest of `mem_size` bytes: one region from GPA 0, or, above 3 GiB,
/// [0, 3 GiB) and [4 GiB, 4 GiB + rest) so the LAPIC/IOAPIC MMIO hole is not RAM.
pub fn guest_ram_ranges(mem_size: u64) -> Vec<(GuestAddress, usize)> {
    // usize is 64 bits on the only supported host (x86_64), so these conversions are lossless.
    let to_usize = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
    if mem_size <= MMIO_HOLE_START {
        vec![(GuestAddress(0), to_usize(mem_size))]
    } else {
        vec![
            (GuestAddress(0), to_usize(MMIO_HOLE_START)),
            (
                GuestAddress(MMIO_HOLE_END),
                to_usize(mem_size - MMIO_HOLE_START),
            ),
        ]
    }
}

/// Refuse RAM sizes the layout cannot hold.
pub fn check_mem_size(mem_size: u64) -> Result<(), BootError> {
    if mem_size < MIN_MEM_SIZE || mem_size & (PAGE_SIZE - 1) != 0 {
        return Err(BootError::BadMemSize(mem_size));
    }
    Ok(())
}

/// End (exclusive) of RAM below 4 GiB.
pub fn ram_end_below_4g(mem_size: u64) -> u64 {
    mem_size.min(MMIO_HOLE_START)
}

/// End (exclusive) of all RAM.
pub fn ram_end(mem_size: u64) -> u64 {
    if mem_size <= MMIO_HOLE_START {
        mem_size
    } else {
        MMIO_HOLE_END + (mem_size - MMIO_HOLE_START)
    }
}

/// Smallest `mem_size` whose RAM reaches `end` (a GPA outside the hole), in MiB, rounded up.
fn needed_mib(end: u64) -> u64 {
    let size = if end <= MMIO_HOLE_START {
        end
    } else {
        end.saturating_sub(MMIO_HOLE_END - MMIO_HOLE_START)
    };
    size.div_ceil(1 << 20)
}

/// Check that a kernel segment [start, end) lies in RAM, outside the boot area and the hole.
pub fn check_segment(start: u64, end: u64, mem_size: u64) -> Result<(), BootError> {
    if start < BOOT_AREA_END {
        return Err(BootError::SegmentInBootArea {
            start,
            end,
            limit: BOOT_AREA_END,
        });
    }
    if start < MMIO_HOLE_END && end > MMIO_HOLE_START {
        return Err(BootError::SegmentInHole { start, end });
    }
    if end > ram_end(mem_size) {
        return Err(BootError::KernelTooBig {
            end,
            mem_size,
            needed_mib: needed_mib(end),
        });
    }
    Ok(())
}

/// Memory map shared by bzImage (e820) and PVH (memmap): (address, size, type).
///
/// RAM below the EBDA, the EBDA/VGA/BIOS hole reserved, RAM from 1 MiB to the end of low RAM
/// and, for more than 3 GiB, RAM from 4 GiB. The MMIO hole is left out (a gap means MMIO).
pub fn memory_map(mem_size: u64) -> Vec<(u64, u64, u32)> {
    let mut map = vec![
        (0, EBDA_START, E820_RAM),
        (EBDA_START, HIGH_RAM_START - EBDA_START, E820_RESERVED),
        (
            HIGH_RAM_START,
            ram_end_below_4g(mem_size) - HIGH_RAM_START,
            E820_RAM,
        ),
    ];
    if mem_size > MMIO_HOLE_START {
        map.push((MMIO_HOLE_END, mem_size - MMIO_HOLE_START, E820_RAM));
    }
    map
}

/// Place an initrd of `size` bytes as high as possible below `min(end of low RAM, limit)`,
/// 4 KiB aligned, above `kernel_end`. Returns its address.
pub fn place_initrd(
    size: u64,
    kernel_end: u64,
    limit: u64,
    mem_size: u64,
) -> Result<u64, BootError> {
    let low = kernel_end.next_multiple_of(PAGE_SIZE);
    let high = ram_end_below_4g(mem_size).min(limit);
    let too_big = BootError::InitrdTooBig { size, low, high };
    let addr = high.checked_sub(size).ok_or(too_big)? & !(PAGE_SIZE - 1);
    if addr < low {
        return Err(BootError::InitrdTooBig { size, low, high });
    }
    Ok(addr)
}

/// Write `bytes` at `addr`, naming `what` on failure.
pub fn write(
    mem: &GuestMemoryMmap<()>,
    addr: u64,
    bytes: &[u8],
    what: &'static str,
) -> Result<(), BootError> {
    mem.write_slice(bytes, GuestAddress(addr))
        .map_err(|source| BootError::GuestMemory {
            what,
            addr,
            len: bytes.len(),
            source,
        })
}

/// Zero `len` bytes at `addr` (bss: guest RAM may be reused, so do not rely on fresh pages).
pub fn zero(
    mem: &GuestMemoryMmap<()>,
    addr: u64,
    len: u64,
    what: &'static str,
) -> Result<(), BootError> {
    const CHUNK: usize = 64 * 1024;
    let zeros = [0u8; CHUNK];
    let mut done = 0u64;
    while done < len {
        let n = usize::try_from((len - done).min(CHUNK as u64)).unwrap_or(CHUNK);
        write(mem, addr + done, &zeros[..n], what)?;
        done += n as u64;
    }
    Ok(())
}

/// Write a NUL-terminated command line at `addr`, refusing more than `max` bytes of
/// text (the protocol's limit, excluding the NUL) for `format`.
pub fn write_cmdline(
    mem: &GuestMemoryMmap<()>,
    addr: u64,
    text: &str,
    max: usize,
    format: super::KernelFormat,
) -> Result<(), BootError> {
    if text.as_bytes().contains(&0) {
        return Err(BootError::CmdlineNul);
    }
    if text.len() > max {
        return Err(BootError::CmdlineTooLong {
            len: text.len(),
            max,
            format,
        });
    }
    let mut bytes = Vec::with_capacity(text.len() + 1);
    bytes.extend_from_slice(text.as_bytes());
    bytes.push(0);
    write(mem, addr, &bytes, "command line")
}
