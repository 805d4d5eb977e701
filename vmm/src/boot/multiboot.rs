//! Multiboot v1 loader for ELF32 kernels such as kvm-unit-tests' x86 `.flat` tests
//! (see docs: multiboot-boot.md §1–§9).
//!
//! The ELF32 PT_LOAD segments are loaded by `p_paddr` (the multiboot header's address fields are
//! not used). The multiboot information (MBI), the command line "<kernel file name> <cmdline>"
//! and one module holding the environment ("NR_CPUS=<n>\nMEMSIZE=<MiB>\n") go to low memory
//! (0x1000–0x6fff), out of page 0 (kvm-unit-tests writes its AP trampoline there) and out of
//! the range the guest's page allocator hands out. MBI flags: MEM, CMDLINE, MODS,
//! BOOT_LOADER_NAME; no memory map (bit 6 clear), so the guest never needs fw_cfg key 0x11.
//!
//! The BSP enters in 32-bit flat protected mode, paging off, IF = 0, with EAX = 0x2BADB002 and
//! EBX = MBI; APs stay in KVM's reset state waiting for INIT/SIPI.

use vm_memory::GuestMemoryMmap;

use super::elf::{ELFCLASS32, ElfImage, check_segments, load_segments};
use super::layout::{EBDA_START, ram_end_below_4g, write, write_cmdline};
use super::paging::{GDT_PROTECTED32, write_gdt};
use super::{BootConfig, BootError, BootInfo, KernelFormat};

/// Header magic in the image.
pub const HEADER_MAGIC: u32 = 0x1BAD_B002;
/// Magic the loader passes in EAX.
pub const BOOTLOADER_MAGIC: u32 = 0x2BAD_B002;
/// The header must start within this many bytes of the file.
pub const HEADER_SEARCH: usize = 8192;

/// MBI address.
pub const MBI_ADDR: u64 = 0x1000;
/// Size of the MBI written (multiboot 0.6.96 layout, up to the framebuffer fields).
pub const MBI_SIZE: usize = 120;
/// Module list (one entry of 16 bytes).
pub const MODS_ADDR: u64 = 0x1100;
/// Module string ("environ").
pub const MOD_STRING_ADDR: u64 = 0x1180;
/// Boot loader name.
pub const LOADER_NAME_ADDR: u64 = 0x11C0;
/// Command line.
pub const CMDLINE_ADDR: u64 = 0x2000;
/// Room for the command line including its NUL.
pub const CMDLINE_MAX: usize = 0x1000;
/// Environment module.
pub const ENV_ADDR: u64 = 0x3000;
/// Largest environment kvm-unit-tests accepts.
pub const ENV_MAX: usize = 0x4000;

/// MBI flag: mem_lower/mem_upper valid.
pub const MBI_FLAG_MEM: u32 = 1 << 0;
/// MBI flag: cmdline valid.
pub const MBI_FLAG_CMDLINE: u32 = 1 << 2;
/// MBI flag: mods_count/mods_addr valid.
pub const MBI_FLAG_MODS: u32 = 1 << 3;
/// MBI flag: boot_loader_name valid.
pub const MBI_FLAG_LOADER_NAME: u32 = 1 << 9;

/// Header flag bits 0–15 are requirements; this loader honours 0 (modules page aligned) and
/// 1 (memory information). Bit 2 (video mode) and the undefined ones must make it refuse.
const SUPPORTED_REQUIRED_FLAGS: u32 = 0b11;

/// Find a multiboot v1 header (magic + valid checksum, 4-byte aligned, within the first 8 KiB).
/// Returns its file offset.
pub fn find_header(bytes: &[u8]) -> Result<Option<usize>, BootError> {
    let mut bad_checksum = None;
    let limit = bytes.len().min(HEADER_SEARCH);
    for offset in (0..limit).step_by(4) {
        let word = |i: usize| -> Option<u32> {
            let at = offset + 4 * i;
            Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
        };
        if word(0) != Some(HEADER_MAGIC) {
            continue;
        }
        let (Some(flags), Some(checksum)) = (word(1), word(2)) else {
            continue;
        };
        if HEADER_MAGIC.wrapping_add(flags).wrapping_add(checksum) == 0 {
            return Ok(Some(offset));
        }
        bad_checksum.get_or_insert(offset);
    }
    match bad_checksum {
        Some(offset) => Err(BootError::BadMultibootChecksum { offset }),
        None => Ok(None),
    }
}

/// The environment module text.
pub fn environment(cfg: &BootConfig) -> String {
    format!("NR_CPUS={}\nMEMSIZE={}\n", cfg.vcpus, cfg.mem_size >> 20)
}

/// The multiboot command line: argv[0] is the kernel's file name (tests count arguments from 1).
pub fn command_line(cfg: &BootConfig) -> String {
    let name = cfg
        .kernel
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "kernel".to_owned());
    if cfg.cmdline.is_empty() {
        name
    } else {
        format!("{name} {}", cfg.cmdline)
    }
}

fn put(buf: &mut [u8], at: usize, value: u32) {
    buf[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

/// Low-memory addresses are below 64 KiB: always fit in the MBI's u32 fields.
fn addr32(addr: u64) -> u32 {
    u32::try_from(addr).unwrap_or(u32::MAX)
}

/// Load an ELF32 multiboot kernel and write the MBI, command line and environment module.
pub fn load(
    mem: &GuestMemoryMmap<()>,
    bytes: &[u8],
    cfg: &BootConfig,
) -> Result<BootInfo, BootError> {
    let header = find_header(bytes)?.ok_or(BootError::UnknownFormat(
        "32-bit ELF without a multiboot v1 header in its first 8 KiB",
    ))?;
    let flags = bytes
        .get(header + 4..header + 8)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .unwrap_or(0);
    if flags & 0xFFFF & !SUPPORTED_REQUIRED_FLAGS != 0 {
        return Err(BootError::MultibootFlags(flags));
    }
    let image = ElfImage::parse(bytes, ELFCLASS32)?;
    if !image.contains(image.entry) {
        return Err(BootError::EntryOutsideImage(image.entry));
    }
    check_segments(&image, cfg.mem_size)?;
    load_segments(mem, &image, bytes)?;
    write_gdt(mem, &GDT_PROTECTED32)?;

    let cmdline = command_line(cfg);
    write_cmdline(
        mem,
        CMDLINE_ADDR,
        &cmdline,
        CMDLINE_MAX - 1,
        KernelFormat::Multiboot,
    )?;
    let env = environment(cfg);
    // NR_CPUS ≤ 255 and MEMSIZE ≤ 2^44 keep this far below ENV_MAX.
    let env_len = env.len().min(ENV_MAX);
    write(
        mem,
        ENV_ADDR,
        &env.as_bytes()[..env_len],
        "multiboot environment",
    )?;
    write(
        mem,
        MOD_STRING_ADDR,
        b"environ\0",
        "multiboot module string",
    )?;
    write(mem, LOADER_NAME_ADDR, b"vmm\0", "multiboot loader name")?;

    let mut module = [0u8; 16];
    put(&mut module, 0, addr32(ENV_ADDR));
    put(&mut module, 4, addr32(ENV_ADDR + env_len as u64));
    put(&mut module, 8, addr32(MOD_STRING_ADDR));
    write(mem, MODS_ADDR, &module, "multiboot module list")?;

    let mut mbi = [0u8; MBI_SIZE];
    put(
        &mut mbi,
        0,
        MBI_FLAG_MEM | MBI_FLAG_CMDLINE | MBI_FLAG_MODS | MBI_FLAG_LOADER_NAME,
    );
    put(&mut mbi, 4, addr32(EBDA_START / 1024));
    // The multiboot spec defines mem_upper as KiB above 1 MiB, but kvm-unit-tests
    // (lib/x86/setup.c) uses mem_upper * 1024 as the end of RAM; we serve the latter, so
    // the page allocator gets all RAM below 4 GiB.
    put(&mut mbi, 8, addr32(ram_end_below_4g(cfg.mem_size) / 1024));
    put(&mut mbi, 16, addr32(CMDLINE_ADDR));
    put(&mut mbi, 20, 1);
    put(&mut mbi, 24, addr32(MODS_ADDR));
    put(&mut mbi, 64, addr32(LOADER_NAME_ADDR));
    write(mem, MBI_ADDR, &mbi, "multiboot information")?;

    Ok(BootInfo {
        format: KernelFormat::Multiboot,
        entry: image.entry,
        mem_size: cfg.mem_size,
        boot_data: MBI_ADDR,
        kernel_end: image.end(),
        initrd: None,
    })
}
