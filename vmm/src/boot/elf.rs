//! Minimal ELF32/ELF64 reader: headers, PT_LOAD segments and the Xen PVH note.
//!
//! Own parser rather than linux-loader's: linux-loader reads ELF64 only (a multiboot `.flat` is
//! ELF32) and its errors do not say which field is wrong.

use super::BootError;

/// `\x7fELF`.
pub const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
/// Index of the class byte in `e_ident`.
pub const EI_CLASS: usize = 4;
/// Index of the data-encoding byte in `e_ident`.
pub const EI_DATA: usize = 5;
/// 32-bit ELF.
pub const ELFCLASS32: u8 = 1;
/// 64-bit ELF.
pub const ELFCLASS64: u8 = 2;
/// Little-endian.
pub const ELFDATA2LSB: u8 = 1;
/// Executable file.
pub const ET_EXEC: u16 = 2;
/// Intel 80386.
pub const EM_386: u16 = 3;
/// AMD x86-64.
pub const EM_X86_64: u16 = 62;
/// Loadable segment.
pub const PT_LOAD: u32 = 1;
/// Note segment.
pub const PT_NOTE: u32 = 4;
/// Xen note carrying the 32-bit PVH entry point.
pub const XEN_ELFNOTE_PHYS32_ENTRY: u32 = 18;

/// One PT_LOAD segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// File offset of the initialised bytes.
    pub offset: u64,
    /// Guest-physical load address (`p_paddr`).
    pub paddr: u64,
    /// Bytes copied from the file.
    pub filesz: u64,
    /// Bytes occupied in memory (the rest is zeroed).
    pub memsz: u64,
}

impl Segment {
    /// First byte above the segment in memory.
    pub fn end(&self) -> u64 {
        // parse() checked that this does not overflow.
        self.paddr + self.memsz
    }
}

/// A parsed ELF executable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElfImage {
    /// Entry point (`e_entry`).
    pub entry: u64,
    /// PT_LOAD segments with a non-zero memory size, in file order.
    pub loads: Vec<Segment>,
    /// PT_NOTE segments as (file offset, size).
    pub notes: Vec<(u64, u64)>,
}

fn bad(msg: String) -> BootError {
    BootError::BadElf(msg)
}

fn field<const N: usize>(bytes: &[u8], at: u64) -> Result<[u8; N], BootError> {
    usize::try_from(at)
        .ok()
        .and_then(|at| bytes.get(at..at.checked_add(N)?))
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| {
            bad(format!(
                "field at file offset {at:#x} is past the end of the file"
            ))
        })
}

fn u16_at(bytes: &[u8], at: u64) -> Result<u16, BootError> {
    Ok(u16::from_le_bytes(field(bytes, at)?))
}

fn u32_at(bytes: &[u8], at: u64) -> Result<u32, BootError> {
    Ok(u32::from_le_bytes(field(bytes, at)?))
}

fn u64_at(bytes: &[u8], at: u64) -> Result<u64, BootError> {
    Ok(u64::from_le_bytes(field(bytes, at)?))
}

impl ElfImage {
    /// Parse an x86 executable of the given class (`ELFCLASS32` → EM_386, `ELFCLASS64` →
    /// EM_X86_64), validating every program header against the file size.
    pub fn parse(bytes: &[u8], class: u8) -> Result<Self, BootError> {
        let wide = class == ELFCLASS64;
        if !bytes.starts_with(&ELF_MAGIC) {
            return Err(bad("no ELF magic".into()));
        }
        if bytes.get(EI_CLASS) != Some(&class) {
            return Err(bad(format!(
                "ELF class is not {}-bit",
                if wide { 64 } else { 32 }
            )));
        }
        if bytes.get(EI_DATA) != Some(&ELFDATA2LSB) {
            return Err(bad("not little-endian".into()));
        }
        let e_type = u16_at(bytes, 16)?;
        if e_type != ET_EXEC {
            return Err(bad(format!(
                "e_type is {e_type}, expected ET_EXEC (2): link a static, non-PIE executable"
            )));
        }
        let machine = u16_at(bytes, 18)?;
        let want_machine = if wide { EM_X86_64 } else { EM_386 };
        if machine != want_machine {
            return Err(bad(format!(
                "e_machine is {machine}, expected {want_machine}"
            )));
        }
        let (entry, phoff, phentsize, phnum, want_phentsize) = if wide {
            (
                u64_at(bytes, 24)?,
                u64_at(bytes, 32)?,
                u16_at(bytes, 54)?,
                u16_at(bytes, 56)?,
                56,
            )
        } else {
            (
                u64::from(u32_at(bytes, 24)?),
                u64::from(u32_at(bytes, 28)?),
                u16_at(bytes, 42)?,
                u16_at(bytes, 44)?,
                32,
            )
        };
        if phentsize != want_phentsize {
            return Err(bad(format!(
                "e_phentsize is {phentsize}, expected {want_phentsize}"
            )));
        }
        let file_len = bytes.len() as u64;
        let mut image = ElfImage {
            entry,
            loads: Vec::new(),
            notes: Vec::new(),
        };
        for i in 0..u64::from(phnum) {
            let ph = phoff
                .checked_add(i * u64::from(phentsize))
                .ok_or_else(|| bad("program header offset overflows".into()))?;
            let p_type = u32_at(bytes, ph)?;
            let (offset, paddr, filesz, memsz) = if wide {
                (
                    u64_at(bytes, ph + 8)?,
                    u64_at(bytes, ph + 24)?,
                    u64_at(bytes, ph + 32)?,
                    u64_at(bytes, ph + 40)?,
                )
            } else {
                (
                    u64::from(u32_at(bytes, ph + 4)?),
                    u64::from(u32_at(bytes, ph + 12)?),
                    u64::from(u32_at(bytes, ph + 16)?),
                    u64::from(u32_at(bytes, ph + 20)?),
                )
            };
            if offset.checked_add(filesz).is_none_or(|end| end > file_len) {
                return Err(bad(format!(
                    "program header {i}: file range {offset:#x}+{filesz:#x} is past the end of \
                     the {file_len}-byte file"
                )));
            }
            match p_type {
                PT_LOAD if memsz > 0 => {
                    if filesz > memsz {
                        return Err(bad(format!(
                            "program header {i}: p_filesz {filesz:#x} > p_memsz {memsz:#x}"
                        )));
                    }
                    if paddr.checked_add(memsz).is_none() {
                        return Err(bad(format!(
                            "program header {i}: p_paddr {paddr:#x} + p_memsz overflows"
                        )));
                    }
                    image.loads.push(Segment {
                        offset,
                        paddr,
                        filesz,
                        memsz,
                    });
                }
                PT_NOTE => image.notes.push((offset, filesz)),
                _ => {}
            }
        }
        if image.loads.is_empty() {
            return Err(bad("no PT_LOAD segment".into()));
        }
        Ok(image)
    }

    /// The 32-bit PVH entry point from a `XEN_ELFNOTE_PHYS32_ENTRY` note named "Xen", if any.
    pub fn pvh_entry(&self, bytes: &[u8]) -> Result<Option<u64>, BootError> {
        for &(start, size) in &self.notes {
            let end = start + size; // parse() checked it against the file size.
            let mut at = start;
            while at + 12 <= end {
                let namesz = u64::from(u32_at(bytes, at)?);
                let descsz = u64::from(u32_at(bytes, at + 4)?);
                let n_type = u32_at(bytes, at + 8)?;
                let name_at = at + 12;
                let desc_at = name_at + namesz.next_multiple_of(4);
                let next = desc_at + descsz.next_multiple_of(4);
                if next > end {
                    return Err(bad(format!(
                        "note at file offset {at:#x} runs past its segment"
                    )));
                }
                if n_type == XEN_ELFNOTE_PHYS32_ENTRY && namesz == 4 {
                    let name: [u8; 4] = field(bytes, name_at)?;
                    if &name == b"Xen\0" {
                        if descsz < 4 {
                            return Err(BootError::NoPvhEntry(format!(
                                "XEN_ELFNOTE_PHYS32_ENTRY descriptor is {descsz} bytes, need 4"
                            )));
                        }
                        return Ok(Some(u64::from(u32_at(bytes, desc_at)?)));
                    }
                }
                at = next;
            }
        }
        Ok(None)
    }

    /// First byte above the highest segment.
    pub fn end(&self) -> u64 {
        self.loads.iter().map(Segment::end).max().unwrap_or(0)
    }

    /// Whether `addr` lies inside a loaded segment.
    pub fn contains(&self, addr: u64) -> bool {
        self.loads.iter().any(|s| addr >= s.paddr && addr < s.end())
    }

    /// The bytes of a segment that are copied from the file.
    pub fn file_bytes<'a>(&self, bytes: &'a [u8], seg: &Segment) -> &'a [u8] {
        // parse() checked offset + filesz <= bytes.len(); usize is 64-bit here.
        let start = usize::try_from(seg.offset).unwrap_or(usize::MAX);
        let len = usize::try_from(seg.filesz).unwrap_or(usize::MAX);
        bytes.get(start..start.saturating_add(len)).unwrap_or(&[])
    }
}

/// Check every segment with [`super::layout::check_segment`].
pub fn check_segments(image: &ElfImage, mem_size: u64) -> Result<(), BootError> {
    for seg in &image.loads {
        super::layout::check_segment(seg.paddr, seg.end(), mem_size)?;
    }
    Ok(())
}

/// Copy every segment into guest memory and zero the rest of its memory size.
pub fn load_segments(
    mem: &vm_memory::GuestMemoryMmap<()>,
    image: &ElfImage,
    bytes: &[u8],
) -> Result<(), BootError> {
    for seg in &image.loads {
        super::layout::write(
            mem,
            seg.paddr,
            image.file_bytes(bytes, seg),
            "kernel segment",
        )?;
        super::layout::zero(
            mem,
            seg.paddr + seg.filesz,
            seg.memsz - seg.filesz,
            "kernel bss",
        )?;
    }
    Ok(())
}
