//! Tests of the loaders on synthetic images, and of the vCPU state on a real KVM vCPU.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use kvm_bindings::{KVM_MAX_CPUID_ENTRIES, KVM_MP_STATE_RUNNABLE, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd, VmFd};
use linux_loader::loader::bootparam::boot_params;
use linux_loader::loader::elf::start_info::{
    XEN_HVM_START_MAGIC_VALUE, hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info,
};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use super::layout::{self, E820_RAM, E820_RESERVED};
use super::*;

const MIB: u64 = 1 << 20;

// ---------- helpers ----------

fn guest_mem(mem_size: u64) -> GuestMemoryMmap<()> {
    GuestMemoryMmap::from_ranges(&guest_ram_ranges(mem_size)).expect("guest memory")
}

fn read(mem: &GuestMemoryMmap<()>, addr: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    mem.read_slice(&mut buf, GuestAddress(addr)).expect("read");
    buf
}

fn read_u32(mem: &GuestMemoryMmap<()>, addr: u64) -> u32 {
    mem.read_obj(GuestAddress(addr)).expect("read u32")
}

fn read_u64(mem: &GuestMemoryMmap<()>, addr: u64) -> u64 {
    mem.read_obj(GuestAddress(addr)).expect("read u64")
}

fn c_string(mem: &GuestMemoryMmap<()>, addr: u64) -> String {
    let bytes = read(mem, addr, 4096);
    let end = bytes.iter().position(|&b| b == 0).expect("NUL");
    String::from_utf8(bytes[..end].to_vec()).expect("utf8")
}

/// A temporary file removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, bytes: &[u8]) -> Self {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "vmm-boot-test-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join(name);
        std::fs::write(&path, bytes).expect("temp file");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(dir) = self.0.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn config<'a>(kernel: &'a TempFile, cmdline: &'a str, mem_size: u64) -> BootConfig<'a> {
    BootConfig {
        kernel: &kernel.0,
        initrd: None,
        cmdline,
        mem_size,
        vcpus: 1,
    }
}

/// A PT_LOAD (paddr, file bytes, memsz) or a PT_NOTE (bytes).
enum Ph {
    Load(u64, Vec<u8>, u64),
    Note(Vec<u8>),
}

fn push_u16(v: &mut Vec<u8>, x: u16) {
    v.extend_from_slice(&x.to_le_bytes());
}
fn push_u32(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_le_bytes());
}
fn push_u64(v: &mut Vec<u8>, x: u64) {
    v.extend_from_slice(&x.to_le_bytes());
}

/// Build a little-endian x86 ET_EXEC of the given class.
fn build_elf(wide: bool, entry: u64, phs: &[Ph]) -> Vec<u8> {
    let (ehsize, phentsize) = if wide { (64usize, 56usize) } else { (52, 32) };
    let mut data_off = (ehsize + phs.len() * phentsize).next_multiple_of(16);
    let mut out = vec![0x7f, b'E', b'L', b'F', if wide { 2 } else { 1 }, 1, 1];
    out.resize(16, 0);
    push_u16(&mut out, 2); // ET_EXEC
    push_u16(&mut out, if wide { 62 } else { 3 });
    push_u32(&mut out, 1);
    if wide {
        push_u64(&mut out, entry);
        push_u64(&mut out, ehsize as u64);
        push_u64(&mut out, 0);
    } else {
        push_u32(&mut out, u32::try_from(entry).unwrap());
        push_u32(&mut out, u32::try_from(ehsize).unwrap());
        push_u32(&mut out, 0);
    }
    push_u32(&mut out, 0); // e_flags
    push_u16(&mut out, u16::try_from(ehsize).unwrap());
    push_u16(&mut out, u16::try_from(phentsize).unwrap());
    push_u16(&mut out, u16::try_from(phs.len()).unwrap());
    push_u16(&mut out, 0);
    push_u16(&mut out, 0);
    push_u16(&mut out, 0);
    assert_eq!(out.len(), ehsize);
    let mut blobs = Vec::new();
    for ph in phs {
        let (p_type, paddr, bytes, memsz) = match ph {
            Ph::Load(paddr, bytes, memsz) => (1u32, *paddr, bytes, *memsz),
            Ph::Note(bytes) => (4u32, 0, bytes, bytes.len() as u64),
        };
        let filesz = bytes.len() as u64;
        if wide {
            push_u32(&mut out, p_type);
            push_u32(&mut out, 7);
            push_u64(&mut out, data_off as u64);
            push_u64(&mut out, paddr);
            push_u64(&mut out, paddr);
            push_u64(&mut out, filesz);
            push_u64(&mut out, memsz);
            push_u64(&mut out, 0x1000);
        } else {
            let n = |v: u64| u32::try_from(v).unwrap();
            push_u32(&mut out, p_type);
            push_u32(&mut out, n(data_off as u64));
            push_u32(&mut out, n(paddr));
            push_u32(&mut out, n(paddr));
            push_u32(&mut out, n(filesz));
            push_u32(&mut out, n(memsz));
            push_u32(&mut out, 7);
            push_u32(&mut out, 0x1000);
        }
        blobs.push((data_off, bytes.clone()));
        data_off = (data_off + bytes.len()).next_multiple_of(16);
    }
    for (off, bytes) in blobs {
        out.resize(off, 0);
        out.extend_from_slice(&bytes);
    }
    out
}

fn xen_pvh_note(entry: u32) -> Vec<u8> {
    let mut note = Vec::new();
    // An unrelated note first, to exercise the walk.
    push_u32(&mut note, 4);
    push_u32(&mut note, 4);
    push_u32(&mut note, 3);
    note.extend_from_slice(b"GNU\0");
    push_u32(&mut note, 0xdead_beef);
    push_u32(&mut note, 4);
    push_u32(&mut note, 4);
    push_u32(&mut note, 18);
    note.extend_from_slice(b"Xen\0");
    push_u32(&mut note, entry);
    note
}

fn multiboot_header(flags: u32) -> Vec<u8> {
    let mut h = Vec::new();
    push_u32(&mut h, multiboot::HEADER_MAGIC);
    push_u32(&mut h, flags);
    push_u32(
        &mut h,
        0u32.wrapping_sub(multiboot::HEADER_MAGIC.wrapping_add(flags)),
    );
    h
}

/// A flat-style ELF32: text with the multiboot header first, then data + bss.
fn build_multiboot(text_at: u64, text: &[u8], data_at: u64, bss: u64, flags: u32) -> Vec<u8> {
    let mut seg = multiboot_header(flags);
    let entry = text_at + seg.len() as u64;
    seg.extend_from_slice(text);
    build_elf(
        false,
        entry,
        &[
            Ph::Load(text_at, seg.clone(), seg.len() as u64),
            Ph::Load(data_at, vec![0x5a; 16], 16 + bss),
        ],
    )
}

/// Minimal bzImage: 1 setup sector after the boot sector, then `payload`.
fn build_bzimage(version: u16, xloadflags: u16, payload: &[u8]) -> Vec<u8> {
    let mut img = vec![0u8; 2 * 512];
    img[0x1f1] = 1; // setup_sects
    img[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
    img[0x202..0x206].copy_from_slice(b"HdrS");
    img[0x206..0x208].copy_from_slice(&version.to_le_bytes());
    img[0x211] = 1; // LOADED_HIGH
    img[0x214..0x218].copy_from_slice(&0x10_0000u32.to_le_bytes());
    img[0x22c..0x230].copy_from_slice(&0x7fff_ffffu32.to_le_bytes());
    img[0x236..0x238].copy_from_slice(&xloadflags.to_le_bytes());
    img[0x238..0x23c].copy_from_slice(&2047u32.to_le_bytes());
    img[0x260..0x264].copy_from_slice(&0x2_0000u32.to_le_bytes()); // init_size
    img.extend_from_slice(payload);
    img
}

// ---------- detection ----------

#[test]
fn detect_formats() {
    let seg = vec![Ph::Load(0x10_0000, vec![0x90; 32], 32)];
    assert_eq!(
        detect(&build_elf(true, 0x10_0000, &seg)).unwrap(),
        KernelFormat::Elf64
    );
    let pvh = build_elf(
        true,
        0x10_0000,
        &[
            Ph::Note(xen_pvh_note(0x10_0000)),
            Ph::Load(0x10_0000, vec![0x90; 32], 32),
        ],
    );
    assert_eq!(detect(&pvh).unwrap(), KernelFormat::PvhVmlinux);
    let mb = build_multiboot(0x40_0000, &[0xf4], 0x40_1000, 0, 0);
    assert_eq!(detect(&mb).unwrap(), KernelFormat::Multiboot);
    let bz = build_bzimage(0x020f, 1, &[0u8; 64]);
    assert_eq!(detect(&bz).unwrap(), KernelFormat::BzImage);
}

#[test]
fn detect_rejects_garbage_with_the_accepted_formats() {
    for bytes in [&b""[..], b"garbage, not a kernel", &[0u8; 4096]] {
        let err = detect(bytes).unwrap_err();
        assert!(matches!(err, BootError::UnknownFormat(_)), "{err}");
        let msg = err.to_string();
        assert!(msg.contains("64-bit ELF") && msg.contains("multiboot") && msg.contains("bzImage"));
    }
    // ELF32 without a multiboot header.
    let plain32 = build_elf(false, 0x40_0000, &[Ph::Load(0x40_0000, vec![0xf4], 1)]);
    assert!(matches!(detect(&plain32), Err(BootError::UnknownFormat(_))));
    // ELF64 for another machine.
    let mut arm = build_elf(true, 0x10_0000, &[Ph::Load(0x10_0000, vec![0], 1)]);
    arm[18] = 183;
    assert!(matches!(detect(&arm), Err(BootError::BadElf(_))));
}

#[test]
fn detect_bad_multiboot_checksum() {
    let mut mb = build_multiboot(0x40_0000, &[0xf4], 0x40_1000, 0, 0);
    let at = mb
        .windows(4)
        .position(|w| w == multiboot::HEADER_MAGIC.to_le_bytes())
        .unwrap();
    mb[at + 8] ^= 1;
    assert!(matches!(
        detect(&mb),
        Err(BootError::BadMultibootChecksum { offset }) if offset == at
    ));
}

#[test]
fn truncated_program_headers_are_refused() {
    let elf = build_elf(true, 0x10_0000, &[Ph::Load(0x10_0000, vec![1; 64], 64)]);
    let err = detect(&elf[..elf.len() - 8]).unwrap_err();
    assert!(matches!(err, BootError::BadElf(_)), "{err}");
}

// ---------- layout ----------

#[test]
fn ram_ranges_split_above_3g() {
    assert_eq!(
        guest_ram_ranges(128 * MIB),
        vec![(GuestAddress(0), usize::try_from(128 * MIB).unwrap())]
    );
    assert_eq!(
        guest_ram_ranges(0xC000_0000),
        vec![(GuestAddress(0), 0xC000_0000)]
    );
    assert_eq!(
        guest_ram_ranges(4 << 30),
        vec![
            (GuestAddress(0), 0xC000_0000),
            (GuestAddress(0x1_0000_0000), 1 << 30)
        ]
    );
}

#[test]
fn memory_map_layout() {
    assert_eq!(
        layout::memory_map(128 * MIB),
        vec![
            (0, 0x9_fc00, E820_RAM),
            (0x9_fc00, 0x6_0400, E820_RESERVED),
            (0x10_0000, 127 * MIB, E820_RAM),
        ]
    );
    let big = layout::memory_map(5 << 30);
    assert_eq!(big.len(), 4);
    assert_eq!(big[2], (0x10_0000, 0xC000_0000 - 0x10_0000, E820_RAM));
    assert_eq!(big[3], (0x1_0000_0000, 2 << 30, E820_RAM));
}

#[test]
fn initrd_placement() {
    // Highest 4 KiB-aligned spot below the end of RAM.
    assert_eq!(
        layout::place_initrd(0x1800, 0x20_0000, u64::MAX, 64 * MIB).unwrap(),
        64 * MIB - 0x2000
    );
    // Capped by the protocol limit.
    assert_eq!(
        layout::place_initrd(0x1000, 0x20_0000, 0x80_0000, 64 * MIB).unwrap(),
        0x7F_F000
    );
    assert!(matches!(
        layout::place_initrd(63 * MIB, 0x20_0000, u64::MAX, 64 * MIB),
        Err(BootError::InitrdTooBig { .. })
    ));
}

#[test]
fn bad_mem_size_is_refused() {
    assert!(matches!(
        layout::check_mem_size(MIB),
        Err(BootError::BadMemSize(_))
    ));
    assert!(matches!(
        layout::check_mem_size(64 * MIB + 1),
        Err(BootError::BadMemSize(_))
    ));
    assert!(layout::check_mem_size(64 * MIB).is_ok());
}

// ---------- ELF64 guest programs ----------

#[test]
fn elf64_loads_segments_zeroes_bss_and_writes_tables() {
    let text: Vec<u8> = (0..0x200u32).map(|i| (i % 251) as u8).collect();
    let elf = build_elf(
        true,
        0x10_0010,
        &[
            Ph::Load(0x10_0000, text.clone(), 0x200),
            Ph::Load(0x10_1000, vec![0x77; 0x10], 0x3000),
        ],
    );
    let file = TempFile::new("guest.elf", &elf);
    let mem = guest_mem(64 * MIB);
    // Dirty the bss so zeroing is observable.
    mem.write_slice(&[0xff; 0x3000], GuestAddress(0x10_1000))
        .unwrap();
    let info = load(&mem, &config(&file, "scenario=7", 64 * MIB)).unwrap();
    assert_eq!(
        info,
        BootInfo {
            format: KernelFormat::Elf64,
            entry: 0x10_0010,
            mem_size: 64 * MIB,
            boot_data: 0xf000,
            kernel_end: 0x10_4000,
            initrd: None,
        }
    );
    assert_eq!(read(&mem, 0x10_0000, 0x200), text);
    assert_eq!(read(&mem, 0x10_1000, 0x10), vec![0x77; 0x10]);
    assert!(read(&mem, 0x10_1010, 0x2ff0).iter().all(|&b| b == 0));
    assert_eq!(c_string(&mem, 0xf000), "scenario=7");

    // GDT at 0x500.
    let gdt: Vec<u64> = (0..5).map(|i| read_u64(&mem, 0x500 + 8 * i)).collect();
    assert_eq!(
        gdt,
        [
            0,
            0x00af_9b00_0000_ffff,
            0x00cf_9300_0000_ffff,
            0x00cf_f300_0000_ffff,
            0x00af_fb00_0000_ffff
        ]
    );
    // PML4 → PDPT → 4 PDs, all P|RW|US, 2 MiB pages identity-mapping 0–4 GiB.
    assert_eq!(read_u64(&mem, 0x9000), 0xa000 | 0x7);
    assert_eq!(read_u64(&mem, 0x9008), 0);
    for i in 0..4 {
        assert_eq!(read_u64(&mem, 0xa000 + 8 * i), (0xb000 + 0x1000 * i) | 0x7);
    }
    assert_eq!(read_u64(&mem, 0xa020), 0);
    assert_eq!(read_u64(&mem, 0xb000), 0x87);
    assert_eq!(read_u64(&mem, 0xb008), 0x20_0000 | 0x87);
    assert_eq!(read_u64(&mem, 0xeff8), 0xffe0_0000 | 0x87);
    // FEE00000 (LAPIC) is mapped: PD 3, entry 0x1f7.
    assert_eq!(read_u64(&mem, 0xe000 + 0x1f7 * 8), 0xfee0_0000 | 0x87);
}

#[test]
fn elf64_refusals() {
    let mem = guest_mem(16 * MIB);
    let low = TempFile::new(
        "low.elf",
        &build_elf(true, 0x8000, &[Ph::Load(0x8000, vec![0x90; 16], 16)]),
    );
    let err = load(&mem, &config(&low, "", 16 * MIB)).unwrap_err();
    assert!(
        matches!(err, BootError::SegmentInBootArea { start: 0x8000, .. }),
        "{err}"
    );

    let big = TempFile::new(
        "big.elf",
        &build_elf(
            true,
            0x10_0000,
            &[Ph::Load(0x10_0000, vec![0x90; 16], 20 * MIB)],
        ),
    );
    let err = load(&mem, &config(&big, "", 16 * MIB)).unwrap_err();
    assert!(
        matches!(err, BootError::KernelTooBig { needed_mib: 21, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("at least 21 MiB"));

    let hole = TempFile::new(
        "hole.elf",
        &build_elf(
            true,
            0xC000_0000,
            &[Ph::Load(0xC000_0000, vec![0x90; 16], 16)],
        ),
    );
    assert!(matches!(
        detect(&std::fs::read(&hole.0).unwrap()),
        Ok(KernelFormat::Elf64)
    ));
    assert!(matches!(
        load(&mem, &config(&hole, "", 16 * MIB)),
        Err(BootError::SegmentInHole { .. })
    ));

    let stray = TempFile::new(
        "stray.elf",
        &build_elf(true, 0x20_0000, &[Ph::Load(0x10_0000, vec![0x90; 16], 16)]),
    );
    assert!(matches!(
        load(&mem, &config(&stray, "", 16 * MIB)),
        Err(BootError::EntryOutsideImage(0x20_0000))
    ));

    let vmlinux = TempFile::new(
        "vmlinux",
        &build_elf(
            true,
            0xffff_ffff_8100_0000,
            &[Ph::Load(0x100_0000, vec![0x90; 16], 16)],
        ),
    );
    let err = load(&mem, &config(&vmlinux, "", 16 * MIB)).unwrap_err();
    assert!(matches!(err, BootError::NoPvhEntry(_)), "{err}");
    assert!(err.to_string().contains("CONFIG_PVH"));

    let ok = TempFile::new(
        "ok.elf",
        &build_elf(true, 0x10_0000, &[Ph::Load(0x10_0000, vec![0x90; 16], 16)]),
    );
    let initrd = TempFile::new("initrd", b"x");
    let mut cfg = config(&ok, "", 16 * MIB);
    cfg.initrd = Some(&initrd.0);
    assert!(matches!(
        load(&mem, &cfg),
        Err(BootError::InitrdUnsupported(KernelFormat::Elf64))
    ));

    let long = "x".repeat(4096);
    assert!(matches!(
        load(&mem, &config(&ok, &long, 16 * MIB)),
        Err(BootError::CmdlineTooLong { max: 4095, .. })
    ));
}

#[test]
fn unreadable_kernel_names_the_path() {
    let mem = guest_mem(16 * MIB);
    let path = std::path::Path::new("/nonexistent/vmm-test-kernel");
    let cfg = BootConfig {
        kernel: path,
        initrd: None,
        cmdline: "",
        mem_size: 16 * MIB,
        vcpus: 1,
    };
    let err = load(&mem, &cfg).unwrap_err();
    assert!(matches!(err, BootError::KernelRead { .. }));
    let msg = err.to_string();
    assert!(
        msg.contains("/nonexistent/vmm-test-kernel") && msg.contains("No such file"),
        "{msg}"
    );
}

// ---------- multiboot ----------

#[test]
fn multiboot_loads_segments_and_writes_mbi() {
    let mb = build_multiboot(0x40_0000, &[0xf4; 8], 0x40_2000, 0x10_0000, 0);
    let file = TempFile::new("pmu.flat", &mb);
    let mem = guest_mem(128 * MIB);
    mem.write_slice(&[0xee; 64], GuestAddress(0x40_2010))
        .unwrap();
    let info = load(&mem, &config(&file, "0x186 1", 128 * MIB)).unwrap();
    assert_eq!(info.format, KernelFormat::Multiboot);
    assert_eq!(info.entry, 0x40_000c);
    assert_eq!(info.boot_data, 0x1000);
    assert_eq!(info.kernel_end, 0x40_2010 + 0x10_0000);

    assert_eq!(read(&mem, 0x40_0000, 12), multiboot_header(0));
    assert_eq!(read(&mem, 0x40_000c, 8), vec![0xf4; 8]);
    assert_eq!(read(&mem, 0x40_2000, 16), vec![0x5a; 16]);
    assert!(read(&mem, 0x40_2010, 64).iter().all(|&b| b == 0));

    let mbi = 0x1000;
    assert_eq!(read_u32(&mem, mbi), 0x20d); // MEM | CMDLINE | MODS | LOADER_NAME
    assert_eq!(read_u32(&mem, mbi + 4), 639);
    assert_eq!(u64::from(read_u32(&mem, mbi + 8)) * 1024, 128 * MIB);
    let cmdline = read_u32(&mem, mbi + 16);
    assert_eq!(cmdline, 0x2000);
    assert_eq!(c_string(&mem, cmdline.into()), "pmu.flat 0x186 1");
    assert_eq!(read_u32(&mem, mbi + 20), 1);
    let mods = u64::from(read_u32(&mem, mbi + 24));
    assert_eq!(mods, 0x1100);
    let (start, end) = (read_u32(&mem, mods), read_u32(&mem, mods + 4));
    assert_eq!(
        read(&mem, start.into(), (end - start) as usize),
        b"NR_CPUS=1\nMEMSIZE=128\n"
    );
    assert_eq!(c_string(&mem, read_u32(&mem, mods + 8).into()), "environ");
    assert_eq!(c_string(&mem, read_u32(&mem, mbi + 64).into()), "vmm");
    // No memory map: flag bit 6 clear, fields zero.
    assert_eq!(read_u32(&mem, mbi) & (1 << 6), 0);
    assert_eq!(read_u32(&mem, mbi + 44), 0);
    // Every boot structure is outside page 0 and below the kernel.
    assert!(mbi >= 0x1000 && end < 0x1_0000);
}

#[test]
fn multiboot_without_args_and_with_big_ram() {
    let mb = build_multiboot(0x40_0000, &[0xf4], 0x40_1000, 0, 0);
    let file = TempFile::new("msr.flat", &mb);
    let size = 4u64 << 30;
    let mem = guest_mem(size);
    let mut cfg = config(&file, "", size);
    cfg.vcpus = 4;
    load(&mem, &cfg).unwrap();
    assert_eq!(c_string(&mem, 0x2000), "msr.flat");
    // mem_upper stops at the MMIO hole.
    assert_eq!(u64::from(read_u32(&mem, 0x1008)) * 1024, 0xC000_0000);
    assert_eq!(read(&mem, 0x3000, 24), b"NR_CPUS=4\nMEMSIZE=4096\n\0");
}

#[test]
fn multiboot_refusals() {
    let mem = guest_mem(32 * MIB);
    let low = TempFile::new(
        "low.flat",
        &build_multiboot(0x1000, &[0xf4], 0x40_0000, 0, 0),
    );
    assert!(matches!(
        load(&mem, &config(&low, "", 32 * MIB)),
        Err(BootError::SegmentInBootArea { start: 0x1000, .. })
    ));
    let big = TempFile::new(
        "big.flat",
        &build_multiboot(0x40_0000, &[0xf4], 0x40_1000, 40 * MIB, 0),
    );
    let err = load(&mem, &config(&big, "", 32 * MIB)).unwrap_err();
    assert!(
        matches!(err, BootError::KernelTooBig { needed_mib: 45, .. }),
        "{err}"
    );
    let video = TempFile::new(
        "video.flat",
        &build_multiboot(0x40_0000, &[0xf4], 0x40_1000, 0, 1 << 2),
    );
    assert!(matches!(
        load(&mem, &config(&video, "", 32 * MIB)),
        Err(BootError::MultibootFlags(4))
    ));
    // Bits 0 and 1 (page-aligned modules, memory info) and optional bits are fine.
    let ok = TempFile::new(
        "ok.flat",
        &build_multiboot(0x40_0000, &[0xf4], 0x40_1000, 0, 0x3 | (1 << 16)),
    );
    assert!(load(&mem, &config(&ok, "", 32 * MIB)).is_ok());
    let initrd = TempFile::new("env", b"NR_CPUS=1\n");
    let mut cfg = config(&ok, "", 32 * MIB);
    cfg.initrd = Some(&initrd.0);
    assert!(matches!(
        load(&mem, &cfg),
        Err(BootError::InitrdUnsupported(KernelFormat::Multiboot))
    ));
}

// ---------- Linux ----------

#[test]
fn pvh_start_info_memmap_cmdline_and_initrd() {
    let elf = build_elf(
        true,
        0xffff_ffff_8100_0000,
        &[
            Ph::Note(xen_pvh_note(0x100_0040)),
            Ph::Load(0x100_0000, vec![0xcc; 0x100], 0x2000),
        ],
    );
    let kernel = TempFile::new("vmlinux", &elf);
    let initrd_bytes: Vec<u8> = (0..0x1234u32)
        .map(|i| u8::try_from(i * 7 % 256).unwrap())
        .collect();
    let initrd = TempFile::new("initrd.img", &initrd_bytes);
    let mem = guest_mem(64 * MIB);
    let mut cfg = config(&kernel, "root=/dev/vda quiet", 64 * MIB);
    cfg.initrd = Some(&initrd.0);
    let info = load(&mem, &cfg).unwrap();
    assert_eq!(info.format, KernelFormat::PvhVmlinux);
    assert_eq!(info.entry, 0x100_0040);
    assert_eq!(info.boot_data, 0x6000);
    assert_eq!(read(&mem, 0x100_0000, 0x100), vec![0xcc; 0x100]);

    let si: hvm_start_info = mem.read_obj(GuestAddress(0x6000)).unwrap();
    assert_eq!(si.magic, XEN_HVM_START_MAGIC_VALUE);
    assert_eq!(si.version, 1);
    assert_eq!(si.nr_modules, 1);
    assert_eq!(si.modlist_paddr, 0x6100);
    assert_eq!(si.cmdline_paddr, 0xf000);
    assert_eq!(si.memmap_paddr, 0x6200);
    assert_eq!(si.memmap_entries, 3);
    assert_eq!(
        c_string(&mem, si.cmdline_paddr),
        "root=/dev/vda quiet console=ttyS0"
    );
    let expected = layout::memory_map(64 * MIB);
    for (i, &(addr, size, kind)) in expected.iter().enumerate() {
        let e: hvm_memmap_table_entry = mem
            .read_obj(GuestAddress(si.memmap_paddr + 24 * i as u64))
            .unwrap();
        assert_eq!((e.addr, e.size, e.type_), (addr, size, kind));
    }
    let module: hvm_modlist_entry = mem.read_obj(GuestAddress(si.modlist_paddr)).unwrap();
    assert_eq!(module.size, initrd_bytes.len() as u64);
    assert_eq!(module.paddr % 4096, 0);
    assert!(module.paddr + module.size <= 64 * MIB && module.paddr >= 0x100_2000);
    assert_eq!(64 * MIB - module.paddr, 0x2000); // as high as possible
    assert_eq!(read(&mem, module.paddr, initrd_bytes.len()), initrd_bytes);
    assert_eq!(info.initrd, Some((module.paddr, module.size)));
    // 32-bit GDT.
    assert_eq!(read_u64(&mem, 0x508), 0x00cf_9b00_0000_ffff);
}

#[test]
fn pvh_keeps_an_explicit_console() {
    let elf = build_elf(
        true,
        0x100_0000,
        &[
            Ph::Note(xen_pvh_note(0x100_0000)),
            Ph::Load(0x100_0000, vec![0xcc; 0x10], 0x10),
        ],
    );
    let kernel = TempFile::new("vmlinux", &elf);
    let mem = guest_mem(64 * MIB);
    load(&mem, &config(&kernel, "console=hvc0", 64 * MIB)).unwrap();
    assert_eq!(c_string(&mem, 0xf000), "console=hvc0");
    let si: hvm_start_info = mem.read_obj(GuestAddress(0x6000)).unwrap();
    assert_eq!((si.nr_modules, si.modlist_paddr), (0, 0));
    let too_long = "a".repeat(2048);
    assert!(matches!(
        load(&mem, &config(&kernel, &too_long, 64 * MIB)),
        Err(BootError::CmdlineTooLong { max: 2047, .. })
    ));
}

#[test]
fn bzimage_boot_params() {
    let payload: Vec<u8> = (0..0x3000u32).map(|i| (i % 253) as u8).collect();
    let kernel = TempFile::new("bzImage", &build_bzimage(0x020f, 1, &payload));
    let initrd = TempFile::new("initrd.img", &[0x42; 0x2800]);
    let mem = guest_mem(128 * MIB);
    let mut cfg = config(&kernel, "", 128 * MIB);
    cfg.initrd = Some(&initrd.0);
    let info = load(&mem, &cfg).unwrap();
    assert_eq!(info.format, KernelFormat::BzImage);
    assert_eq!(info.entry, 0x10_0200);
    assert_eq!(info.boot_data, 0x7000);
    assert_eq!(read(&mem, 0x10_0000, payload.len()), payload);

    let bp: boot_params = mem.read_obj(GuestAddress(0x7000)).unwrap();
    let hdr = bp.hdr;
    assert_eq!({ hdr.header }, 0x5372_6448);
    assert_eq!({ hdr.boot_flag }, 0xaa55);
    assert_eq!({ hdr.type_of_loader }, 0xff);
    assert_eq!({ hdr.cmd_line_ptr }, 0xf000);
    assert_eq!({ hdr.code32_start }, 0x10_0000);
    assert_eq!(c_string(&mem, 0xf000), "console=ttyS0");
    let (rd, rd_size) = ({ hdr.ramdisk_image }, { hdr.ramdisk_size });
    assert_eq!(rd_size, 0x2800);
    assert_eq!(u64::from(rd), 128 * MIB - 0x3000);
    assert_eq!(read(&mem, rd.into(), 0x2800), vec![0x42; 0x2800]);
    assert_eq!(info.initrd, Some((u64::from(rd), 0x2800)));

    let expected = layout::memory_map(128 * MIB);
    assert_eq!(usize::from(bp.e820_entries), expected.len());
    let table = bp.e820_table;
    for (e, &(addr, size, kind)) in table.iter().zip(&expected) {
        assert_eq!(({ e.addr }, { e.size }, { e.r#type }), (addr, size, kind));
    }
    // Linux boot GDT: __BOOT_CS 0x10 code64, __BOOT_DS 0x18 data; identity tables.
    assert_eq!(read_u64(&mem, 0x510), 0x00af_9b00_0000_ffff);
    assert_eq!(read_u64(&mem, 0x518), 0x00cf_9300_0000_ffff);
    assert_eq!(read_u64(&mem, 0x9000), 0xa007);
}

#[test]
fn bzimage_refusals() {
    let mem = guest_mem(16 * MIB);
    let old = TempFile::new("old", &build_bzimage(0x0206, 0, &[0; 512]));
    assert!(matches!(
        load(&mem, &config(&old, "", 16 * MIB)),
        Err(BootError::BzImageUnsupported(_))
    ));
    let no64 = TempFile::new("no64", &build_bzimage(0x020f, 0, &[0; 512]));
    assert!(matches!(
        load(&mem, &config(&no64, "", 16 * MIB)),
        Err(BootError::BzImageUnsupported(_))
    ));
    let ok = TempFile::new("ok", &build_bzimage(0x020f, 1, &[0; 512]));
    let long = "b".repeat(2048);
    assert!(matches!(
        load(&mem, &config(&ok, &long, 16 * MIB)),
        Err(BootError::CmdlineTooLong { max: 2047, .. })
    ));
    let initrd = TempFile::new("initrd", &vec![0u8; usize::try_from(15 * MIB).unwrap()]);
    let mut cfg = config(&ok, "", 16 * MIB);
    cfg.initrd = Some(&initrd.0);
    assert!(matches!(
        load(&mem, &cfg),
        Err(BootError::InitrdTooBig { .. })
    ));
    let missing = std::path::Path::new("/nonexistent/initrd");
    cfg.initrd = Some(missing);
    let err = load(&mem, &cfg).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/initrd"), "{err}");
}

// ---------- vCPU state on real KVM ----------

fn kvm_vm() -> (Kvm, VmFd) {
    let kvm = Kvm::new().expect("/dev/kvm");
    let vm = kvm.create_vm().expect("create_vm");
    (kvm, vm)
}

fn vcpu_with_cpuid(kvm: &Kvm, vm: &VmFd, id: u64) -> VcpuFd {
    let vcpu = vm.create_vcpu(id).expect("create_vcpu");
    let cpuid = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .expect("cpuid");
    vcpu.set_cpuid2(&cpuid).expect("set_cpuid2");
    vcpu
}

fn map_memory(vm: &VmFd, mem: &GuestMemoryMmap<()>) {
    for (slot, region) in mem.iter().enumerate() {
        let host = mem.get_host_address(region.start_addr()).unwrap();
        let region = kvm_userspace_memory_region {
            slot: u32::try_from(slot).unwrap(),
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
            flags: 0,
        };
        // SAFETY: the mapping belongs to `mem`, which outlives the VM in every test.
        unsafe { vm.set_user_memory_region(region) }.expect("memory region");
    }
}

/// Run until the next port-I/O exit and return (port, 32-bit value written).
fn next_out(vcpu: &mut VcpuFd) -> (u16, u32) {
    match vcpu.run().expect("KVM_RUN") {
        VcpuExit::IoOut(port, data) => {
            let mut v = [0u8; 4];
            v[..data.len()].copy_from_slice(data);
            (port, u32::from_le_bytes(v))
        }
        other => panic!("unexpected exit {other:?}"),
    }
}

#[test]
fn elf64_vcpu_state_and_execution() {
    // mov rax, rsi; out 0xf4, eax; movzx eax, byte [rdx]; out 0xf4, eax;
    // mov rax, rdi; out 0xf4, eax; hlt
    let code = [
        0x48, 0x89, 0xf0, 0xe7, 0xf4, 0x0f, 0xb6, 0x02, 0xe7, 0xf4, 0x48, 0x89, 0xf8, 0xe7, 0xf4,
        0xf4,
    ];
    let elf = build_elf(
        true,
        0x10_0000,
        &[Ph::Load(0x10_0000, code.to_vec(), 0x1000)],
    );
    let file = TempFile::new("guest.elf", &elf);
    let mem_size = 32 * MIB;
    let mem = guest_mem(mem_size);
    let info = load(&mem, &config(&file, "Z", mem_size)).unwrap();

    let (kvm, vm) = kvm_vm();
    map_memory(&vm, &mem);
    let mut bsp = vcpu_with_cpuid(&kvm, &vm, 0);
    // Dirty the x87/SSE control state so the checks below see setup_vcpu's writes.
    let fpu = kvm_bindings::kvm_fpu {
        fcw: 0x27f,
        ..Default::default()
    };
    bsp.set_fpu(&fpu).unwrap();
    let mut xsave = bsp.get_xsave().unwrap();
    xsave.region[6] = 0x1f00;
    xsave.region[128] |= 2; // XSTATE_BV.SSE, else KVM ignores MXCSR
    // SAFETY: the image KVM_GET_XSAVE returned; the test enables no dynamic XSTATE features.
    unsafe { bsp.set_xsave(&xsave) }.unwrap();
    assert_eq!(bsp.get_xsave().unwrap().region[6], 0x1f00);
    setup_vcpu(&bsp, 0, &info).unwrap();
    let sregs = bsp.get_sregs().unwrap();
    assert_eq!(sregs.cr0, 0x8000_0033);
    assert_eq!(sregs.cr3, 0x9000);
    assert_eq!(sregs.cr4 & 0x620, 0x620);
    assert_eq!(sregs.efer & 0x500, 0x500);
    assert_eq!((sregs.cs.selector, sregs.cs.l, sregs.cs.db), (0x08, 1, 0));
    assert_eq!((sregs.ds.selector, sregs.ss.selector), (0x10, 0x10));
    assert_eq!((sregs.gdt.base, sregs.gdt.limit), (0x500, 39));
    assert_eq!((sregs.idt.base, sregs.idt.limit), (0, 0));
    let regs = bsp.get_regs().unwrap();
    assert_eq!(
        (
            regs.rip,
            regs.rdi,
            regs.rsi,
            regs.rdx,
            regs.rsp,
            regs.rflags
        ),
        (0x10_0000, 0, mem_size, 0xf000, 0, 2)
    );
    assert_eq!(bsp.get_fpu().unwrap().fcw, 0x37f);
    // MXCSR (KVM_GET_FPU does not report it): FXSAVE bytes 24..28.
    assert_eq!(bsp.get_xsave().unwrap().region[6], 0x1f80);

    let ap = vcpu_with_cpuid(&kvm, &vm, 1);
    setup_vcpu(&ap, 1, &info).unwrap();
    assert_eq!(ap.get_regs().unwrap().rdi, 1);
    assert_eq!(ap.get_sregs().unwrap().cr0, 0x8000_0033);
    assert_eq!(ap.get_mp_state().unwrap().mp_state, KVM_MP_STATE_RUNNABLE);

    // The BSP really runs 64-bit code through the page tables.
    assert_eq!(next_out(&mut bsp), (0xf4, 32 << 20));
    assert_eq!(next_out(&mut bsp), (0xf4, u32::from(b'Z')));
    assert_eq!(next_out(&mut bsp), (0xf4, 0));
}

#[test]
fn multiboot_vcpu_state_and_execution() {
    // mov ecx, eax; mov eax, [ebx + 8] (MBI mem_upper); out 0xf4, eax; mov eax, ecx;
    // out 0xf4, eax; hlt
    let code = [
        0x89, 0xc1, 0x8b, 0x43, 0x08, 0xe7, 0xf4, 0x89, 0xc8, 0xe7, 0xf4, 0xf4,
    ];
    let mb = build_multiboot(0x40_0000, &code, 0x40_1000, 0, 0);
    let file = TempFile::new("t.flat", &mb);
    let mem_size = 64 * MIB;
    let mem = guest_mem(mem_size);
    let info = load(&mem, &config(&file, "", mem_size)).unwrap();

    let (kvm, vm) = kvm_vm();
    map_memory(&vm, &mem);
    let mut bsp = vcpu_with_cpuid(&kvm, &vm, 0);
    setup_vcpu(&bsp, 0, &info).unwrap();
    let sregs = bsp.get_sregs().unwrap();
    assert_eq!(sregs.cr0 & 0x8000_0001, 1, "PE set, PG clear");
    assert_eq!(sregs.efer & 0x500, 0);
    assert_eq!((sregs.cs.selector, sregs.cs.l, sregs.cs.db), (0x08, 0, 1));
    assert_eq!((sregs.cs.base, sregs.cs.limit), (0, 0xffff_ffff));
    assert_eq!((sregs.ss.selector, sregs.ss.db), (0x10, 1));
    let regs = bsp.get_regs().unwrap();
    assert_eq!(regs.rip, info.entry);
    assert_eq!(regs.rax, 0x2bad_b002);
    assert_eq!(regs.rbx, 0x1000);
    assert_eq!(regs.rflags & (1 << 9), 0, "IF clear");

    // APs keep KVM's reset state.
    let ap = vcpu_with_cpuid(&kvm, &vm, 1);
    let before = (
        ap.get_regs().unwrap().rip,
        ap.get_sregs().unwrap().cs.selector,
    );
    setup_vcpu(&ap, 1, &info).unwrap();
    assert_eq!(
        (
            ap.get_regs().unwrap().rip,
            ap.get_sregs().unwrap().cs.selector
        ),
        before
    );
    assert_eq!(before, (0xfff0, 0xf000));

    assert_eq!(next_out(&mut bsp), (0xf4, 64 * 1024));
    assert_eq!(next_out(&mut bsp), (0xf4, 0x2bad_b002));
}

#[test]
fn linux_vcpu_state() {
    let (kvm, vm) = kvm_vm();
    let bz = BootInfo {
        format: KernelFormat::BzImage,
        entry: 0x10_0200,
        mem_size: 128 * MIB,
        boot_data: 0x7000,
        kernel_end: 0x20_0000,
        initrd: None,
    };
    let bsp = vcpu_with_cpuid(&kvm, &vm, 0);
    setup_vcpu(&bsp, 0, &bz).unwrap();
    let sregs = bsp.get_sregs().unwrap();
    assert_eq!((sregs.cr0, sregs.cr3), (0x8000_0033, 0x9000));
    assert_eq!(sregs.efer & 0x500, 0x500);
    assert_eq!((sregs.cs.selector, sregs.cs.l), (0x10, 1));
    assert_eq!((sregs.ds.selector, sregs.ss.selector), (0x18, 0x18));
    assert_eq!(sregs.gdt.limit, 31);
    let regs = bsp.get_regs().unwrap();
    assert_eq!((regs.rip, regs.rsi, regs.rflags), (0x10_0200, 0x7000, 2));

    let pvh = BootInfo {
        format: KernelFormat::PvhVmlinux,
        entry: 0x100_0040,
        boot_data: 0x6000,
        ..bz
    };
    let (kvm2, vm2) = kvm_vm();
    let bsp = vcpu_with_cpuid(&kvm2, &vm2, 0);
    setup_vcpu(&bsp, 0, &pvh).unwrap();
    let sregs = bsp.get_sregs().unwrap();
    assert_eq!(sregs.cr0 & 0x8000_0001, 1);
    assert_eq!(sregs.efer & 0x500, 0);
    assert_eq!((sregs.cs.selector, sregs.cs.db, sregs.cs.l), (0x08, 1, 0));
    assert_eq!(
        (sregs.tr.selector, sregs.tr.limit, sregs.tr.type_),
        (0x18, 0x67, 0xb)
    );
    let regs = bsp.get_regs().unwrap();
    assert_eq!((regs.rip, regs.rbx), (0x100_0040, 0x6000));
    // APs wait for INIT/SIPI.
    let ap = vcpu_with_cpuid(&kvm2, &vm2, 1);
    setup_vcpu(&ap, 1, &pvh).unwrap();
    assert_eq!(ap.get_regs().unwrap().rip, 0xfff0);
}
