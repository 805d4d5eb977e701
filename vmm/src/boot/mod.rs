//! Guest loaders: turn a kernel file into guest memory contents and an initial vCPU state.
//!
//! Three kinds of kernel are accepted, told apart by [`detect`]:
//!
//! * **64-bit ELF guest programs** ([`KernelFormat::Elf64`], the `guest-tests` crate) — see
//!   [`elf64`] for the entry contract those programs rely on.
//! * **Multiboot v1 kernels** ([`KernelFormat::Multiboot`]: ELF32 images with a multiboot header,
//!   the kvm-unit-tests "flat" tests) — see [`multiboot`].
//! * **Linux** ([`KernelFormat::BzImage`] and [`KernelFormat::PvhVmlinux`]) through linux-loader —
//!   see [`linux`].
//!
//! Guest RAM starts at GPA 0. Above 3 GiB it is split so that [3 GiB, 4 GiB) stays free for the
//! LAPIC/IOAPIC MMIO ([`guest_ram_ranges`]). Every boot structure the VMM writes lives below
//! [`layout::BOOT_AREA_END`] (64 KiB); kernels may not load there.

pub mod elf;
pub mod elf64;
pub mod layout;
pub mod linux;
pub mod multiboot;
pub mod paging;
pub mod vcpu;

use std::path::{Path, PathBuf};

use vm_memory::GuestMemoryMmap;

pub use layout::guest_ram_ranges;
pub use vcpu::setup_vcpu;

/// The kernel formats this VMM boots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFormat {
    /// 64-bit ELF guest program (no PVH note): entered in 64-bit mode on every vCPU.
    Elf64,
    /// ELF32 image carrying a multiboot v1 header: entered in 32-bit protected mode on the BSP.
    Multiboot,
    /// Linux bzImage: entered at its 64-bit entry point with `boot_params`.
    BzImage,
    /// Linux ELF vmlinux with a `XEN_ELFNOTE_PHYS32_ENTRY` note: entered through PVH.
    PvhVmlinux,
}

impl std::fmt::Display for KernelFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KernelFormat::Elf64 => "64-bit ELF guest program",
            KernelFormat::Multiboot => "multiboot v1 ELF32 kernel",
            KernelFormat::BzImage => "Linux bzImage",
            KernelFormat::PvhVmlinux => "Linux PVH vmlinux",
        })
    }
}

/// What to boot and with how much of a machine.
#[derive(Clone, Debug)]
pub struct BootConfig<'a> {
    /// Kernel image file.
    pub kernel: &'a Path,
    /// Initial ramdisk (Linux formats only).
    pub initrd: Option<&'a Path>,
    /// User command line (Linux: kernel command line; multiboot: arguments after the program
    /// name; ELF64 guest programs: a NUL-terminated string whose address is passed in RDX).
    pub cmdline: &'a str,
    /// Guest RAM size in bytes (the `--mem` option), laid out by [`guest_ram_ranges`].
    pub mem_size: u64,
    /// Number of vCPUs.
    pub vcpus: u8,
}

/// Result of [`load`]: everything [`setup_vcpu`] needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootInfo {
    /// Detected kernel format.
    pub format: KernelFormat,
    /// Guest-physical entry point of the BSP (for [`KernelFormat::Elf64`]: of every vCPU).
    pub entry: u64,
    /// Guest RAM size in bytes, as given in [`BootConfig::mem_size`].
    pub mem_size: u64,
    /// Address of the boot data handed to the BSP: the command line (Elf64, RDX), the MBI
    /// (multiboot, EBX), `hvm_start_info` (PVH, EBX) or `boot_params` (bzImage, RSI).
    pub boot_data: u64,
    /// First byte above the loaded kernel image (including its bss).
    pub kernel_end: u64,
    /// Guest-physical address and size of the initrd, if one was loaded.
    pub initrd: Option<(u64, u64)>,
}

/// Why a kernel could not be loaded or a vCPU could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The kernel file could not be read.
    #[error("cannot read kernel file {path}: {source}; check the --kernel path")]
    KernelRead {
        /// Path as given.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// The initrd file could not be read.
    #[error("cannot read initrd file {path}: {source}; check the --initrd path")]
    InitrdRead {
        /// Path as given.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// The kernel is in none of the accepted formats.
    #[error(
        "unrecognised kernel format ({0}); accepted: 64-bit ELF (guest program or Linux PVH \
         vmlinux), 32-bit ELF with a multiboot v1 header, Linux bzImage"
    )]
    UnknownFormat(&'static str),
    /// The ELF file is structurally broken.
    #[error("malformed ELF kernel: {0}; rebuild the kernel or pass a different file")]
    BadElf(String),
    /// The multiboot header checksum is wrong.
    #[error("multiboot header at file offset {offset:#x} has a bad checksum; the image is corrupt")]
    BadMultibootChecksum {
        /// File offset of the header.
        offset: usize,
    },
    /// The multiboot header requires a feature this loader lacks.
    #[error(
        "multiboot header flags {0:#x} require features this VMM lacks (only bits 0 and 1 of \
         the required bits 0-15 are supported, e.g. no video mode); rebuild without them"
    )]
    MultibootFlags(u32),
    /// A segment overlaps the low boot-structure area.
    #[error(
        "kernel segment [{start:#x}, {end:#x}) overlaps the VMM boot structures below {limit:#x}; \
         link the kernel above {limit:#x}"
    )]
    SegmentInBootArea {
        /// Segment start (GPA).
        start: u64,
        /// Segment end (GPA, exclusive).
        end: u64,
        /// End of the reserved area.
        limit: u64,
    },
    /// A segment falls into the MMIO hole between 3 GiB and 4 GiB.
    #[error(
        "kernel segment [{start:#x}, {end:#x}) lies in the MMIO hole [0xc0000000, 0x100000000); \
         link the kernel below 3 GiB"
    )]
    SegmentInHole {
        /// Segment start (GPA).
        start: u64,
        /// Segment end (GPA, exclusive).
        end: u64,
    },
    /// The kernel does not fit into guest RAM.
    #[error(
        "kernel needs RAM up to {end:#x} but --mem is {mem_size} bytes; use --mem of at least \
         {needed_mib} MiB"
    )]
    KernelTooBig {
        /// First byte above the kernel image.
        end: u64,
        /// Configured RAM size.
        mem_size: u64,
        /// Smallest `--mem` (MiB) that holds the kernel.
        needed_mib: u64,
    },
    /// The entry point is not inside a loaded segment.
    #[error("kernel entry point {0:#x} is outside every loaded segment; the image is corrupt")]
    EntryOutsideImage(u64),
    /// The initrd does not fit between the kernel and the end of RAM.
    #[error(
        "initrd of {size} bytes does not fit in guest RAM between {low:#x} and {high:#x}; \
         increase --mem or use a smaller initrd"
    )]
    InitrdTooBig {
        /// Initrd size in bytes.
        size: u64,
        /// Lowest usable address (end of the kernel).
        low: u64,
        /// Highest usable address (exclusive).
        high: u64,
    },
    /// The format does not take an initrd.
    #[error("--initrd is only used by Linux kernels, not by a {0}; remove --initrd")]
    InitrdUnsupported(KernelFormat),
    /// The command line is too long for the boot protocol.
    #[error(
        "command line is {len} bytes but the {format} accepts at most {max}; shorten --cmdline"
    )]
    CmdlineTooLong {
        /// Bytes given (including anything the VMM appends).
        len: usize,
        /// Maximum accepted.
        max: usize,
        /// Kernel format.
        format: KernelFormat,
    },
    /// The command line contains a NUL byte.
    #[error("command line contains a NUL byte; remove it from --cmdline")]
    CmdlineNul,
    /// The bzImage cannot be entered in 64-bit mode.
    #[error("bzImage {0}; use a 64-bit x86 kernel with boot protocol 2.12 or newer")]
    BzImageUnsupported(&'static str),
    /// A PVH-looking vmlinux has no usable PVH entry.
    #[error(
        "vmlinux has no usable PVH entry note ({0}); build it with CONFIG_PVH=y or use a bzImage"
    )]
    NoPvhEntry(String),
    /// linux-loader refused the kernel.
    #[error("linux-loader could not load the kernel: {0}")]
    LinuxLoader(#[from] linux_loader::loader::Error),
    /// linux-loader could not write boot parameters.
    #[error("linux-loader could not write boot parameters: {0}")]
    Configurator(#[from] linux_loader::configurator::Error),
    /// The RAM size is unusable.
    #[error("--mem of {0} bytes is too small or not a multiple of 4 KiB; use at least 2 MiB")]
    BadMemSize(u64),
    /// Too many vCPUs for the boot protocol.
    #[error("{0} vCPUs requested; use between 1 and 255")]
    BadVcpuCount(u8),
    /// A guest memory access failed (the address is outside guest RAM).
    #[error("cannot write {len} bytes of {what} at guest address {addr:#x}: {source}")]
    GuestMemory {
        /// What was being written.
        what: &'static str,
        /// Guest-physical address.
        addr: u64,
        /// Length.
        len: usize,
        /// vm-memory error.
        source: vm_memory::GuestMemoryError,
    },
    /// A KVM ioctl failed while preparing a vCPU.
    #[error("KVM {what} failed on vCPU {index}: {source}")]
    Kvm {
        /// Which ioctl.
        what: &'static str,
        /// vCPU index.
        index: u8,
        /// errno.
        source: kvm_ioctls::Error,
    },
}

/// Identify the kernel format from the file contents.
///
/// An ELF64 with a PVH note is [`KernelFormat::PvhVmlinux`], without one [`KernelFormat::Elf64`];
/// an ELF32 with a valid multiboot v1 header is [`KernelFormat::Multiboot`]; "HdrS" at 0x202 is
/// [`KernelFormat::BzImage`].
pub fn detect(bytes: &[u8]) -> Result<KernelFormat, BootError> {
    if bytes.starts_with(&elf::ELF_MAGIC) {
        return match bytes.get(elf::EI_CLASS) {
            Some(&elf::ELFCLASS64) => {
                let image = elf::ElfImage::parse(bytes, elf::ELFCLASS64)?;
                if image.pvh_entry(bytes)?.is_some() {
                    Ok(KernelFormat::PvhVmlinux)
                } else {
                    Ok(KernelFormat::Elf64)
                }
            }
            Some(&elf::ELFCLASS32) => {
                if multiboot::find_header(bytes)?.is_some() {
                    Ok(KernelFormat::Multiboot)
                } else {
                    Err(BootError::UnknownFormat(
                        "32-bit ELF without a multiboot v1 header in its first 8 KiB",
                    ))
                }
            }
            _ => Err(BootError::UnknownFormat("ELF of unknown class")),
        };
    }
    if linux::is_bzimage(bytes) {
        return Ok(KernelFormat::BzImage);
    }
    Err(BootError::UnknownFormat(
        "neither an ELF magic nor a bzImage \"HdrS\" signature",
    ))
}

/// Read the kernel (and initrd), write it and its boot structures into guest memory.
///
/// `mem` must have been created from [`guest_ram_ranges`]`(cfg.mem_size)`.
pub fn load(mem: &GuestMemoryMmap<()>, cfg: &BootConfig) -> Result<BootInfo, BootError> {
    layout::check_mem_size(cfg.mem_size)?;
    if cfg.vcpus == 0 {
        return Err(BootError::BadVcpuCount(cfg.vcpus));
    }
    let bytes = std::fs::read(cfg.kernel).map_err(|source| BootError::KernelRead {
        path: cfg.kernel.to_path_buf(),
        source,
    })?;
    let format = detect(&bytes)?;
    let initrd = match cfg.initrd {
        None => None,
        Some(_) if !matches!(format, KernelFormat::BzImage | KernelFormat::PvhVmlinux) => {
            return Err(BootError::InitrdUnsupported(format));
        }
        Some(path) => Some(std::fs::read(path).map_err(|source| BootError::InitrdRead {
            path: path.to_path_buf(),
            source,
        })?),
    };
    match format {
        KernelFormat::Elf64 => elf64::load(mem, &bytes, cfg),
        KernelFormat::Multiboot => multiboot::load(mem, &bytes, cfg),
        KernelFormat::BzImage => linux::load_bzimage(mem, &bytes, initrd.as_deref(), cfg),
        KernelFormat::PvhVmlinux => linux::load_pvh(mem, &bytes, initrd.as_deref(), cfg),
    }
}

#[cfg(test)]
mod tests;
