//! Linux loaders: bzImage (64-bit boot protocol) and PVH vmlinux, through linux-loader.
//!
//! Console: the command line is the user's `--cmdline`; if it contains no `console=`, the VMM
//! appends ` console=ttyS0` so the kernel talks to the emulated 16550 at 0x3f8.
//!
//! * **bzImage**: linux-loader's `BzImage` loads the protected-mode kernel at `code32_start`
//!   (1 MiB). `boot_params` (zero page at 0x7000) carries the setup header, the e820 map
//!   ([`super::layout::memory_map`]), the command line (0xf000) and the initrd, placed as high as
//!   possible below the end of low RAM and `initrd_addr_max`, 4 KiB aligned. The BSP enters the
//!   64-bit entry point (`code32_start + 0x200`) in long mode with RSI = 0x7000, the identity
//!   page tables of [`super::paging`] and a GDT with `__BOOT_CS` = 0x10, `__BOOT_DS` = 0x18 as
//!   Documentation/arch/x86/boot.rst asks.
//! * **PVH vmlinux**: linux-loader's `Elf` loads the PT_LOAD segments by physical address and
//!   reports the `XEN_ELFNOTE_PHYS32_ENTRY` note. `hvm_start_info` (0x6000), its module list
//!   (0x6100, the initrd) and memory map (0x6200) follow the Xen PVH ABI; the BSP enters in
//!   32-bit flat protected mode, paging off, with EBX = 0x6000.
//!
//! APs stay in KVM's reset state: Linux starts them with INIT/SIPI.

use std::io::Cursor;

use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::pvh::PvhBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use linux_loader::loader::elf::start_info::{
    XEN_HVM_START_MAGIC_VALUE, hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use linux_loader::loader::{BzImage, Elf, KernelLoader, PvhBootCapability};
use vm_memory::{ByteValued, GuestAddress, GuestMemoryMmap};

use super::elf::{ELFCLASS64, ElfImage, check_segments};
use super::layout::{
    CMDLINE_ADDR, CMDLINE_MAX, HIGH_RAM_START, check_segment, memory_map, place_initrd,
    ram_end_below_4g, write, write_cmdline, zero,
};
use super::paging::{GDT_LINUX64, GDT_PROTECTED32, write_gdt, write_identity_page_tables};
use super::{BootConfig, BootError, BootInfo, KernelFormat};

/// `boot_params` (zero page).
pub const ZERO_PAGE_ADDR: u64 = 0x7000;
/// `hvm_start_info`.
pub const PVH_START_INFO_ADDR: u64 = 0x6000;
/// PVH module list (one entry: the initrd).
pub const PVH_MODLIST_ADDR: u64 = 0x6100;
/// PVH memory map.
pub const PVH_MEMMAP_ADDR: u64 = 0x6200;

/// File offset of the setup header in a bzImage.
const SETUP_HEADER_OFFSET: usize = 0x1F1;
/// "HdrS".
const HDRS_MAGIC: &[u8; 4] = b"HdrS";
/// Offset of the 64-bit entry from the protected-mode kernel start.
const STARTUP_64_OFFSET: u64 = 0x200;
/// setup_header.loadflags: the protected-mode kernel is loaded at 1 MiB.
const LOADED_HIGH: u8 = 1 << 0;
/// setup_header.xloadflags: the kernel has the 64-bit entry at +0x200.
const XLF_KERNEL_64: u16 = 1 << 0;
/// setup_header.type_of_loader: "undefined" boot loader.
const LOADER_TYPE_UNDEFINED: u8 = 0xFF;
/// x86 COMMAND_LINE_SIZE (2048) without the NUL; PVH has no header announcing a limit.
const PVH_CMDLINE_MAX: usize = 2047;
/// initrd_addr_max for protocols before 2.03.
const DEFAULT_INITRD_ADDR_MAX: u64 = 0x37FF_FFFF;

/// Whether `bytes` carries a bzImage setup header ("HdrS" at 0x202).
pub fn is_bzimage(bytes: &[u8]) -> bool {
    bytes.get(0x202..0x206) == Some(HDRS_MAGIC.as_slice())
}

/// The kernel command line: the user's, plus ` console=ttyS0` unless a console is named.
pub fn kernel_cmdline(user: &str) -> String {
    let user = user.trim();
    if user.contains("console=") {
        user.to_owned()
    } else if user.is_empty() {
        "console=ttyS0".to_owned()
    } else {
        format!("{user} console=ttyS0")
    }
}

fn read_setup_header(bytes: &[u8]) -> Result<setup_header, BootError> {
    let mut hdr = setup_header::default();
    let len = hdr.as_slice().len();
    let src = bytes
        .get(SETUP_HEADER_OFFSET..SETUP_HEADER_OFFSET + len)
        .ok_or(BootError::BzImageUnsupported(
            "is truncated inside its setup header",
        ))?;
    hdr.as_mut_slice().copy_from_slice(src);
    Ok(hdr)
}

fn load_initrd(
    mem: &GuestMemoryMmap<()>,
    initrd: Option<&[u8]>,
    kernel_end: u64,
    limit: u64,
    mem_size: u64,
) -> Result<Option<(u64, u64)>, BootError> {
    let Some(initrd) = initrd else {
        return Ok(None);
    };
    let size = initrd.len() as u64;
    let addr = place_initrd(size, kernel_end, limit, mem_size)?;
    write(mem, addr, initrd, "initrd")?;
    Ok(Some((addr, size)))
}

/// Values are below 4 GiB by construction (low RAM, zero page, command line).
fn low32(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

/// Load a bzImage, its initrd and `boot_params` for the 64-bit boot protocol.
pub fn load_bzimage(
    mem: &GuestMemoryMmap<()>,
    bytes: &[u8],
    initrd: Option<&[u8]>,
    cfg: &BootConfig,
) -> Result<BootInfo, BootError> {
    let hdr = read_setup_header(bytes)?;
    let version = hdr.version;
    if version < 0x020C {
        return Err(BootError::BzImageUnsupported(
            "uses a boot protocol older than 2.12 (no xloadflags)",
        ));
    }
    if hdr.xloadflags & XLF_KERNEL_64 == 0 {
        return Err(BootError::BzImageUnsupported(
            "has no 64-bit entry point (XLF_KERNEL_64 clear)",
        ));
    }
    if hdr.loadflags & LOADED_HIGH == 0 {
        return Err(BootError::BzImageUnsupported("is not loaded high (zImage)"));
    }
    let code32_start = u64::from(hdr.code32_start);
    if code32_start < HIGH_RAM_START {
        return Err(BootError::BzImageUnsupported(
            "has code32_start below 1 MiB",
        ));
    }
    let setup_sects = match hdr.setup_sects {
        0 => 4,
        n => u64::from(n),
    };
    let payload = (bytes.len() as u64)
        .checked_sub((setup_sects + 1) * 512)
        .ok_or(BootError::BzImageUnsupported(
            "is shorter than its setup sectors",
        ))?;
    // The kernel decompresses in place and needs init_size bytes from its load address.
    let kernel_end = code32_start + payload.max(u64::from(hdr.init_size));
    check_segment(code32_start, kernel_end, cfg.mem_size)?;

    let loaded = BzImage::load(
        mem,
        None,
        &mut Cursor::new(bytes),
        Some(GuestAddress(HIGH_RAM_START)),
    )?;
    let mut header = loaded.setup_header.unwrap_or(hdr);

    let cmdline = kernel_cmdline(cfg.cmdline);
    let max = usize::try_from(header.cmdline_size)
        .unwrap_or(usize::MAX)
        .min(CMDLINE_MAX - 1);
    write_cmdline(mem, CMDLINE_ADDR, &cmdline, max, KernelFormat::BzImage)?;

    let initrd_addr_max = match header.initrd_addr_max {
        0 => DEFAULT_INITRD_ADDR_MAX,
        n => u64::from(n),
    };
    let initrd = load_initrd(mem, initrd, kernel_end, initrd_addr_max + 1, cfg.mem_size)?;

    header.type_of_loader = LOADER_TYPE_UNDEFINED;
    header.cmd_line_ptr = low32(CMDLINE_ADDR);
    if let Some((addr, size)) = initrd {
        header.ramdisk_image = low32(addr);
        header.ramdisk_size = low32(size);
    }

    let zeroes = [0u8; std::mem::size_of::<boot_params>()];
    let mut params = *boot_params::from_slice(&zeroes)
        .ok_or(BootError::BzImageUnsupported("boot_params layout mismatch"))?;
    params.hdr = header;
    let map = memory_map(cfg.mem_size);
    let mut table = params.e820_table;
    for (slot, &(addr, size, kind)) in table.iter_mut().zip(&map) {
        *slot = boot_e820_entry {
            addr,
            size,
            r#type: kind,
        };
    }
    params.e820_table = table;
    params.e820_entries = u8::try_from(map.len()).unwrap_or(u8::MAX);
    LinuxBootConfigurator::write_bootparams(
        &BootParams::new(&params, GuestAddress(ZERO_PAGE_ADDR)),
        mem,
    )?;

    write_gdt(mem, &GDT_LINUX64)?;
    write_identity_page_tables(mem)?;
    Ok(BootInfo {
        format: KernelFormat::BzImage,
        entry: loaded.kernel_load.0 + STARTUP_64_OFFSET,
        mem_size: cfg.mem_size,
        boot_data: ZERO_PAGE_ADDR,
        kernel_end,
        initrd,
    })
}

/// Load a PVH vmlinux, its initrd and `hvm_start_info`.
pub fn load_pvh(
    mem: &GuestMemoryMmap<()>,
    bytes: &[u8],
    initrd: Option<&[u8]>,
    cfg: &BootConfig,
) -> Result<BootInfo, BootError> {
    let image = ElfImage::parse(bytes, ELFCLASS64)?;
    check_segments(&image, cfg.mem_size)?;
    let loaded = Elf::load(
        mem,
        None,
        &mut Cursor::new(bytes),
        Some(GuestAddress(HIGH_RAM_START)),
    )?;
    let entry = match loaded.pvh_boot_cap {
        PvhBootCapability::PvhEntryPresent(addr) => addr.0,
        other => return Err(BootError::NoPvhEntry(other.to_string())),
    };
    if !image.contains(entry) {
        return Err(BootError::EntryOutsideImage(entry));
    }
    // linux-loader copies p_filesz only; do not rely on fresh RAM for the bss.
    for seg in &image.loads {
        zero(
            mem,
            seg.paddr + seg.filesz,
            seg.memsz - seg.filesz,
            "kernel bss",
        )?;
    }
    let kernel_end = image.end();

    let cmdline = kernel_cmdline(cfg.cmdline);
    write_cmdline(
        mem,
        CMDLINE_ADDR,
        &cmdline,
        PVH_CMDLINE_MAX,
        KernelFormat::PvhVmlinux,
    )?;
    let initrd = load_initrd(
        mem,
        initrd,
        kernel_end,
        ram_end_below_4g(cfg.mem_size),
        cfg.mem_size,
    )?;

    let memmap: Vec<hvm_memmap_table_entry> = memory_map(cfg.mem_size)
        .into_iter()
        .map(|(addr, size, type_)| hvm_memmap_table_entry {
            addr,
            size,
            type_,
            reserved: 0,
        })
        .collect();
    let start_info = hvm_start_info {
        magic: XEN_HVM_START_MAGIC_VALUE,
        version: 1,
        flags: 0,
        nr_modules: u32::from(initrd.is_some()),
        modlist_paddr: if initrd.is_some() {
            PVH_MODLIST_ADDR
        } else {
            0
        },
        cmdline_paddr: CMDLINE_ADDR,
        rsdp_paddr: 0,
        memmap_paddr: PVH_MEMMAP_ADDR,
        memmap_entries: u32::try_from(memmap.len()).unwrap_or(u32::MAX),
        reserved: 0,
    };
    let mut params = BootParams::new(&start_info, GuestAddress(PVH_START_INFO_ADDR));
    params.set_sections(&memmap, GuestAddress(PVH_MEMMAP_ADDR));
    if let Some((paddr, size)) = initrd {
        let module = hvm_modlist_entry {
            paddr,
            size,
            cmdline_paddr: 0,
            reserved: 0,
        };
        params.set_modules(&[module], GuestAddress(PVH_MODLIST_ADDR));
    }
    PvhBootConfigurator::write_bootparams(&params, mem)?;
    write_gdt(mem, &GDT_PROTECTED32)?;

    Ok(BootInfo {
        format: KernelFormat::PvhVmlinux,
        entry,
        mem_size: cfg.mem_size,
        boot_data: PVH_START_INFO_ADDR,
        kernel_end,
        initrd,
    })
}
