//! Guest page walker: linear -> guest-physical translation through the guest's own page tables
//! (SDM vol. 3A ch. 4), and a [`LinearMemory`] view that reads and writes linear ranges page by
//! page.
//!
//! IA32_DS_AREA and every DS buffer field hold *linear* addresses (SDM 17.4.9), so every DS/PEBS
//! access goes through here. Covered: paging disabled (linear = physical, 32-bit), 32-bit paging
//! with CR4.PSE 4 MiB pages (PSE-36 high bits), PAE paging, 4-level and 5-level (CR4.LA57)
//! IA-32e paging with 2 MiB and 1 GiB pages; present, reserved-bit and canonicality checks; write
//! protection for supervisor writes when CR0.WP is set.
//!
//! Deliberate simplifications (the DS save area lives in supervisor, non-paged, writable memory):
//! accessed/dirty bits are not set, U/S, SMAP and protection keys are not checked, and PAE
//! PDPTEs are read from memory at each walk instead of from the PDPTE registers loaded at the
//! last CR3 write.

use thiserror::Error;

use crate::mem::GuestMemory;
use crate::state::PagingRegs;

/// CR0.WP: supervisor writes honour read-only pages.
pub const CR0_WP: u64 = 1 << 16;
/// CR0.PG: paging enabled.
pub const CR0_PG: u64 = 1 << 31;
/// CR4.PSE: 4 MiB pages under 32-bit paging.
pub const CR4_PSE: u64 = 1 << 4;
/// CR4.PAE: PAE (or IA-32e) paging.
pub const CR4_PAE: u64 = 1 << 5;
/// CR4.LA57: 5-level paging in IA-32e mode.
pub const CR4_LA57: u64 = 1 << 12;
/// IA32_EFER.LME: IA-32e mode enable.
pub const EFER_LME: u64 = 1 << 8;
/// IA32_EFER.LMA: IA-32e mode active.
pub const EFER_LMA: u64 = 1 << 10;
/// IA32_EFER.NXE: execute-disable bit usable (else bit 63 of PAE/IA-32e entries is reserved).
pub const EFER_NXE: u64 = 1 << 11;

/// Paging-structure entry: present.
pub const PTE_P: u64 = 1 << 0;
/// Paging-structure entry: writable.
pub const PTE_RW: u64 = 1 << 1;
/// Paging-structure entry: page size (maps a large page at PDPTE/PDE level).
pub const PTE_PS: u64 = 1 << 7;
/// Paging-structure entry: execute disable (IA-32e and PAE).
pub const PTE_XD: u64 = 1 << 63;

/// Size of the smallest page; linear ranges are split at multiples of it.
pub const PAGE_SIZE: u64 = 4096;
/// [`PAGE_SIZE`] as a buffer length.
const PAGE_BYTES: usize = 4096;
/// MAXPHYADDR assumed when the caller has no better value (the architectural maximum).
pub const DEFAULT_MAXPHYADDR: u8 = 52;

const PAGE_OFFSET_MASK: u64 = PAGE_SIZE - 1;
const SIZE_2M: u64 = 1 << 21;
const SIZE_4M: u64 = 1 << 22;
const SIZE_1G: u64 = 1 << 30;
/// Bits 20:13 of a large-page PDE/PDPTE hold reserved bits (2 MiB) or PSE-36 high address bits.
const LARGE_PAGE_LOW_RSVD_2M: u64 = 0x001F_E000;
/// Bits 29:13 of a 1 GiB PDPTE are reserved.
const LARGE_PAGE_LOW_RSVD_1G: u64 = 0x3FFF_E000;
/// PAE PDPTE reserved bits 2:1 and 8:5 (SDM Table 4-8).
const PAE_PDPTE_RSVD_LOW: u64 = 0x1E6;
/// CR3 bits 31:5: PAE page-directory-pointer-table address.
const PAE_CR3_MASK: u64 = 0xFFFF_FFE0;
/// 32-bit paging: bits 31:12 of CR3, a PDE or a PTE are a frame address.
const FRAME_MASK_32: u64 = 0xFFFF_F000;
/// 32-bit paging: bits 31:22 of a 4 MiB PDE.
const FRAME_MASK_4M: u64 = 0xFFC0_0000;
/// 32-bit paging, PSE-36: PDE bits 20:13 carry physical-address bits 39:32.
const PSE36_SHIFT: u32 = 13;
const LINEAR_32_MAX: u64 = 0xFFFF_FFFF;

/// How linear addresses translate (SDM 4.1.1, Table 4-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagingMode {
    /// CR0.PG = 0: linear = physical, 32-bit addresses.
    Disabled,
    /// CR0.PG = 1, CR4.PAE = 0.
    Bits32,
    /// CR0.PG = 1, CR4.PAE = 1, IA32_EFER.LMA = 0.
    Pae,
    /// IA-32e mode, CR4.LA57 = 0.
    Level4,
    /// IA-32e mode, CR4.LA57 = 1.
    Level5,
}

impl PagingMode {
    /// The mode the control registers select. EFER.LMA is authoritative; LME with PG is accepted
    /// too because some state snapshots are taken before LMA is reflected.
    pub fn from_regs(regs: &PagingRegs) -> Self {
        if regs.cr0 & CR0_PG == 0 {
            return PagingMode::Disabled;
        }
        let long = regs.efer & EFER_LMA != 0 || regs.efer & EFER_LME != 0;
        match (regs.cr4 & CR4_PAE != 0, long) {
            (false, _) => PagingMode::Bits32,
            (true, false) => PagingMode::Pae,
            (true, true) if regs.cr4 & CR4_LA57 != 0 => PagingMode::Level5,
            (true, true) => PagingMode::Level4,
        }
    }

    /// IA-32e mode (64-bit registers are architecturally visible).
    pub fn is_ia32e(self) -> bool {
        matches!(self, PagingMode::Level4 | PagingMode::Level5)
    }
}

/// Kind of access, for the write-protection check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Supervisor read.
    Read,
    /// Supervisor write (the PEBS assist, index updates).
    Write,
}

/// Why a linear address could not be translated or accessed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum PagingError {
    /// Not canonical for the current paging mode.
    #[error("linear address {la:#x} is not canonical")]
    NonCanonical {
        /// The linear address.
        la: u64,
    },
    /// Above 4 GiB while the processor uses 32-bit linear addresses.
    #[error("linear address {la:#x} does not fit the 32-bit linear address space")]
    AddressTooWide {
        /// The linear address.
        la: u64,
    },
    /// The range `la..la+len` wraps around the top of the address space.
    #[error("linear range {la:#x}+{len:#x} wraps around")]
    RangeWraps {
        /// First byte.
        la: u64,
        /// Length.
        len: usize,
    },
    /// A paging-structure entry on the walk is not present.
    #[error("linear address {la:#x}: level-{level} paging entry not present")]
    NotPresent {
        /// The linear address.
        la: u64,
        /// Paging level of the entry (1 = PTE ... 5 = PML5E; PAE PDPTE = 3).
        level: u8,
    },
    /// A paging-structure entry on the walk has a reserved bit set.
    #[error("linear address {la:#x}: level-{level} paging entry {entry:#x} has reserved bits set")]
    ReservedBit {
        /// The linear address.
        la: u64,
        /// Paging level of the entry.
        level: u8,
        /// The entry.
        entry: u64,
    },
    /// A paging structure lies outside guest RAM.
    #[error("linear address {la:#x}: paging structure at {gpa:#x} is not guest RAM")]
    TableNotRam {
        /// The linear address.
        la: u64,
        /// Guest-physical address of the entry.
        gpa: u64,
    },
    /// The final physical address is not guest RAM (MMIO, hole, past the end).
    #[error("linear address {la:#x} maps to {gpa:#x}, which is not guest RAM")]
    NotRam {
        /// The linear address.
        la: u64,
        /// Guest-physical address.
        gpa: u64,
    },
    /// Supervisor write to a read-only page with CR0.WP set.
    #[error("linear address {la:#x} is read-only")]
    ReadOnly {
        /// The linear address.
        la: u64,
    },
}

/// A successful translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Translation {
    /// Guest-physical address of the byte.
    pub gpa: u64,
    /// Size of the page that maps it (4 KiB, 2 MiB, 4 MiB or 1 GiB).
    pub page_size: u64,
    /// Every level allows writes.
    pub writable: bool,
}

/// The page walker: the paging registers and the guest's MAXPHYADDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageWalker {
    /// CR0, CR3, CR4, EFER of the guest.
    pub regs: PagingRegs,
    /// Physical-address width (CPUID.80000008H:EAX[7:0]); bits above it are reserved in entries.
    pub maxphyaddr: u8,
}

fn bits(lo: u32, hi_inclusive: u32) -> u64 {
    if lo > hi_inclusive || lo > 63 {
        return 0;
    }
    let hi = hi_inclusive.min(63);
    let width = hi - lo + 1;
    let ones = if width == 64 {
        u64::MAX
    } else {
        (1u64 << width) - 1
    };
    ones << lo
}

fn read_u32(mem: &dyn GuestMemory, gpa: u64) -> Option<u64> {
    let mut b = [0u8; 4];
    mem.read_phys(gpa, &mut b).ok()?;
    Some(u64::from(u32::from_le_bytes(b)))
}

impl PageWalker {
    /// A walker with the default MAXPHYADDR.
    pub fn new(regs: PagingRegs) -> Self {
        Self {
            regs,
            maxphyaddr: DEFAULT_MAXPHYADDR,
        }
    }

    /// The paging mode of the registers.
    pub fn mode(&self) -> PagingMode {
        PagingMode::from_regs(&self.regs)
    }

    fn maxphy(&self) -> u32 {
        u32::from(self.maxphyaddr.clamp(32, 52))
    }

    /// Mask of the address bits of an entry (bits MAXPHYADDR-1:12).
    fn frame_mask(&self) -> u64 {
        bits(12, self.maxphy() - 1)
    }

    /// Translates one linear address.
    pub fn translate(
        &self,
        mem: &dyn GuestMemory,
        la: u64,
        access: Access,
    ) -> Result<Translation, PagingError> {
        let t = match self.mode() {
            PagingMode::Disabled => {
                if la > LINEAR_32_MAX {
                    return Err(PagingError::AddressTooWide { la });
                }
                Translation {
                    gpa: la,
                    page_size: PAGE_SIZE,
                    writable: true,
                }
            }
            PagingMode::Bits32 => self.walk_32(mem, la)?,
            PagingMode::Pae => self.walk_pae(mem, la)?,
            PagingMode::Level4 => self.walk_ia32e(mem, la, 4)?,
            PagingMode::Level5 => self.walk_ia32e(mem, la, 5)?,
        };
        if access == Access::Write && !t.writable && self.regs.cr0 & CR0_WP != 0 {
            return Err(PagingError::ReadOnly { la });
        }
        Ok(t)
    }

    /// IA-32e paging (SDM 4.5): 4 or 5 levels of 512 8-byte entries.
    fn walk_ia32e(
        &self,
        mem: &dyn GuestMemory,
        la: u64,
        levels: u8,
    ) -> Result<Translation, PagingError> {
        let width: u32 = if levels == 5 { 57 } else { 48 };
        let shift = 64 - width;
        // Canonical: bits 63:width-1 all equal (sign extension of the top implemented bit).
        #[allow(
            clippy::cast_possible_wrap,
            clippy::cast_sign_loss,
            reason = "sign extension"
        )]
        let canonical = (((la << shift) as i64) >> shift) as u64;
        if canonical != la {
            return Err(PagingError::NonCanonical { la });
        }
        let frame = self.frame_mask();
        let nx_rsvd = if self.regs.efer & EFER_NXE == 0 {
            PTE_XD
        } else {
            0
        };
        let high_rsvd = bits(self.maxphy(), 51) | nx_rsvd;
        let mut table = self.regs.cr3 & frame;
        let mut writable = true;
        for level in (1..=levels).rev() {
            let idx = (la >> (12 + 9 * u32::from(level - 1))) & 0x1FF;
            let gpa = table + idx * 8;
            let entry = mem
                .read_u64(gpa)
                .map_err(|_| PagingError::TableNotRam { la, gpa })?;
            if entry & PTE_P == 0 {
                return Err(PagingError::NotPresent { la, level });
            }
            let ps = entry & PTE_PS != 0;
            let rsvd = match level {
                5 | 4 => high_rsvd | PTE_PS,
                3 if ps => high_rsvd | LARGE_PAGE_LOW_RSVD_1G,
                2 if ps => high_rsvd | LARGE_PAGE_LOW_RSVD_2M,
                _ => high_rsvd,
            };
            if entry & rsvd != 0 {
                return Err(PagingError::ReservedBit { la, level, entry });
            }
            writable &= entry & PTE_RW != 0;
            let page_size = match level {
                3 if ps => SIZE_1G,
                2 if ps => SIZE_2M,
                1 => PAGE_SIZE,
                _ => {
                    table = entry & frame;
                    continue;
                }
            };
            let base = entry & frame & !(page_size - 1);
            return Ok(Translation {
                gpa: base | (la & (page_size - 1)),
                page_size,
                writable,
            });
        }
        // levels >= 1 always reaches level 1 above, which returns.
        Err(PagingError::NotPresent { la, level: 1 })
    }

    /// PAE paging (SDM 4.4): 4 PDPTEs, then 512-entry directories and tables.
    fn walk_pae(&self, mem: &dyn GuestMemory, la: u64) -> Result<Translation, PagingError> {
        if la > LINEAR_32_MAX {
            return Err(PagingError::AddressTooWide { la });
        }
        let frame = self.frame_mask();
        let high_rsvd = bits(self.maxphy(), 62);
        let nx_rsvd = if self.regs.efer & EFER_NXE == 0 {
            PTE_XD
        } else {
            0
        };
        let gpa = (self.regs.cr3 & PAE_CR3_MASK) + ((la >> 30) & 3) * 8;
        let pdpte = mem
            .read_u64(gpa)
            .map_err(|_| PagingError::TableNotRam { la, gpa })?;
        if pdpte & PTE_P == 0 {
            return Err(PagingError::NotPresent { la, level: 3 });
        }
        if pdpte & (high_rsvd | PTE_XD | PAE_PDPTE_RSVD_LOW) != 0 {
            return Err(PagingError::ReservedBit {
                la,
                level: 3,
                entry: pdpte,
            });
        }
        let gpa = (pdpte & frame) + ((la >> 21) & 0x1FF) * 8;
        let pde = mem
            .read_u64(gpa)
            .map_err(|_| PagingError::TableNotRam { la, gpa })?;
        if pde & PTE_P == 0 {
            return Err(PagingError::NotPresent { la, level: 2 });
        }
        let ps = pde & PTE_PS != 0;
        let rsvd = high_rsvd | nx_rsvd | if ps { LARGE_PAGE_LOW_RSVD_2M } else { 0 };
        if pde & rsvd != 0 {
            return Err(PagingError::ReservedBit {
                la,
                level: 2,
                entry: pde,
            });
        }
        if ps {
            let base = pde & frame & !(SIZE_2M - 1);
            return Ok(Translation {
                gpa: base | (la & (SIZE_2M - 1)),
                page_size: SIZE_2M,
                writable: pde & PTE_RW != 0,
            });
        }
        let gpa = (pde & frame) + ((la >> 12) & 0x1FF) * 8;
        let pte = mem
            .read_u64(gpa)
            .map_err(|_| PagingError::TableNotRam { la, gpa })?;
        if pte & PTE_P == 0 {
            return Err(PagingError::NotPresent { la, level: 1 });
        }
        if pte & (high_rsvd | nx_rsvd) != 0 {
            return Err(PagingError::ReservedBit {
                la,
                level: 1,
                entry: pte,
            });
        }
        Ok(Translation {
            gpa: (pte & frame) | (la & PAGE_OFFSET_MASK),
            page_size: PAGE_SIZE,
            writable: pde & pte & PTE_RW != 0,
        })
    }

    /// 32-bit paging (SDM 4.3): 1024-entry directory and tables of 4-byte entries; with CR4.PSE a
    /// PDE with PS maps a 4 MiB page whose bits 20:13 give physical bits 39:32 (PSE-36).
    fn walk_32(&self, mem: &dyn GuestMemory, la: u64) -> Result<Translation, PagingError> {
        if la > LINEAR_32_MAX {
            return Err(PagingError::AddressTooWide { la });
        }
        let gpa = (self.regs.cr3 & FRAME_MASK_32) + ((la >> 22) & 0x3FF) * 4;
        let pde = read_u32(mem, gpa).ok_or(PagingError::TableNotRam { la, gpa })?;
        if pde & PTE_P == 0 {
            return Err(PagingError::NotPresent { la, level: 2 });
        }
        if pde & PTE_PS != 0 && self.regs.cr4 & CR4_PSE != 0 {
            // Physical bits above 31 that MAXPHYADDR allows (at most 8, PSE-36 up to 40 bits);
            // the PDE bits beyond them, up to bit 21, are reserved.
            let high = self.maxphy().min(40) - 32;
            let rsvd = bits(PSE36_SHIFT + high, 21);
            if pde & rsvd != 0 {
                return Err(PagingError::ReservedBit {
                    la,
                    level: 2,
                    entry: pde,
                });
            }
            let hi = ((pde >> PSE36_SHIFT) & bits(0, high.saturating_sub(1))) << 32;
            let gpa = hi | (pde & FRAME_MASK_4M) | (la & (SIZE_4M - 1));
            let gpa = if high == 0 { gpa & LINEAR_32_MAX } else { gpa };
            return Ok(Translation {
                gpa,
                page_size: SIZE_4M,
                writable: pde & PTE_RW != 0,
            });
        }
        let gpa = (pde & FRAME_MASK_32) + ((la >> 12) & 0x3FF) * 4;
        let pte = read_u32(mem, gpa).ok_or(PagingError::TableNotRam { la, gpa })?;
        if pte & PTE_P == 0 {
            return Err(PagingError::NotPresent { la, level: 1 });
        }
        Ok(Translation {
            gpa: (pte & FRAME_MASK_32) | (la & PAGE_OFFSET_MASK),
            page_size: PAGE_SIZE,
            writable: pde & pte & PTE_RW != 0,
        })
    }

    /// Splits `la..la+len` at 4 KiB boundaries and translates each piece:
    /// `(gpa, offset in the range, length)`.
    fn pieces(
        &self,
        mem: &dyn GuestMemory,
        la: u64,
        len: usize,
        access: Access,
    ) -> Result<Vec<(u64, usize, usize)>, PagingError> {
        let wrap = PagingError::RangeWraps { la, len };
        let len64 = u64::try_from(len).map_err(|_| wrap)?;
        if len64 > 0 {
            la.checked_add(len64 - 1).ok_or(wrap)?;
        }
        let mut out = Vec::new();
        let mut done: u64 = 0;
        while done < len64 {
            let cur = la + done;
            let in_page = PAGE_SIZE - (cur & PAGE_OFFSET_MASK);
            let n = in_page.min(len64 - done);
            let t = self.translate(mem, cur, access)?;
            let off = usize::try_from(done).map_err(|_| wrap)?;
            let n_us = usize::try_from(n).map_err(|_| wrap)?;
            out.push((t.gpa, off, n_us));
            done += n;
        }
        Ok(out)
    }

    /// Reads `buf.len()` bytes at linear address `la`.
    pub fn read(&self, mem: &dyn GuestMemory, la: u64, buf: &mut [u8]) -> Result<(), PagingError> {
        for (gpa, off, n) in self.pieces(mem, la, buf.len(), Access::Read)? {
            mem.read_phys(gpa, &mut buf[off..off + n])
                .map_err(|_| PagingError::NotRam {
                    la: la.wrapping_add(off as u64),
                    gpa,
                })?;
        }
        Ok(())
    }

    /// Checks that `la..la+len` translates for writing and lies entirely in guest RAM; returns
    /// the physical pieces. Nothing is written.
    fn probe_write(
        &self,
        mem: &dyn GuestMemory,
        la: u64,
        len: usize,
    ) -> Result<Vec<(u64, usize, usize)>, PagingError> {
        let pieces = self.pieces(mem, la, len, Access::Write)?;
        let mut scratch = [0u8; PAGE_BYTES];
        for &(gpa, off, n) in &pieces {
            mem.read_phys(gpa, &mut scratch[..n])
                .map_err(|_| PagingError::NotRam {
                    la: la.wrapping_add(off as u64),
                    gpa,
                })?;
        }
        Ok(pieces)
    }

    /// Writes `data` at linear address `la`. Every page is translated and checked to be RAM
    /// before the first byte is written, so a failure leaves memory untouched.
    pub fn write(
        &self,
        mem: &mut dyn GuestMemory,
        la: u64,
        data: &[u8],
    ) -> Result<(), PagingError> {
        let pieces = self.probe_write(mem, la, data.len())?;
        for (gpa, off, n) in pieces {
            mem.write_phys(gpa, &data[off..off + n])
                .map_err(|_| PagingError::NotRam {
                    la: la.wrapping_add(off as u64),
                    gpa,
                })?;
        }
        Ok(())
    }
}

/// Guest memory seen through the guest's page tables.
pub struct LinearMemory<'a> {
    mem: &'a mut dyn GuestMemory,
    walker: PageWalker,
}

impl<'a> LinearMemory<'a> {
    /// A linear view of `mem` under `walker`'s paging registers.
    pub fn new(mem: &'a mut dyn GuestMemory, walker: PageWalker) -> Self {
        Self { mem, walker }
    }

    /// The walker in use.
    pub fn walker(&self) -> &PageWalker {
        &self.walker
    }

    /// Translates one linear address.
    pub fn translate(&self, la: u64, access: Access) -> Result<Translation, PagingError> {
        self.walker.translate(&*self.mem, la, access)
    }

    /// Reads `buf.len()` bytes at `la`.
    pub fn read(&self, la: u64, buf: &mut [u8]) -> Result<(), PagingError> {
        self.walker.read(&*self.mem, la, buf)
    }

    /// Writes `data` at `la`, all or nothing as far as translation and RAM checks go.
    pub fn write(&mut self, la: u64, data: &[u8]) -> Result<(), PagingError> {
        self.walker.write(&mut *self.mem, la, data)
    }

    /// Checks that `la..la+len` is writable guest RAM without writing.
    pub fn check_writable(&self, la: u64, len: usize) -> Result<(), PagingError> {
        self.walker.probe_write(&*self.mem, la, len).map(|_| ())
    }

    /// Reads a little-endian u64 at `la`.
    pub fn read_u64(&self, la: u64) -> Result<u64, PagingError> {
        let mut b = [0u8; 8];
        self.read(la, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// Writes a little-endian u64 at `la`.
    pub fn write_u64(&mut self, la: u64, value: u64) -> Result<(), PagingError> {
        self.write(la, &value.to_le_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::VecMemory;

    #[test]
    fn bits_helper() {
        assert_eq!(bits(0, 63), u64::MAX);
        assert_eq!(bits(13, 20), 0x1F_E000);
        assert_eq!(bits(52, 51), 0);
    }

    #[test]
    fn mode_selection() {
        let mut r = PagingRegs::default();
        assert_eq!(PagingMode::from_regs(&r), PagingMode::Disabled);
        r.cr0 = CR0_PG;
        assert_eq!(PagingMode::from_regs(&r), PagingMode::Bits32);
        r.cr4 = CR4_PAE;
        assert_eq!(PagingMode::from_regs(&r), PagingMode::Pae);
        r.efer = EFER_LMA;
        assert_eq!(PagingMode::from_regs(&r), PagingMode::Level4);
        r.cr4 |= CR4_LA57;
        assert_eq!(PagingMode::from_regs(&r), PagingMode::Level5);
    }

    #[test]
    fn disabled_is_identity_and_32_bit() {
        let mem = VecMemory::new(0x2000);
        let w = PageWalker::new(PagingRegs::default());
        assert_eq!(w.translate(&mem, 0x1234, Access::Read).unwrap().gpa, 0x1234);
        assert_eq!(
            w.translate(&mem, 1 << 32, Access::Read),
            Err(PagingError::AddressTooWide { la: 1 << 32 })
        );
        let mut buf = [0u8; 8];
        assert_eq!(
            w.read(&mem, 0x1FFC, &mut buf),
            Err(PagingError::NotRam {
                la: 0x2000,
                gpa: 0x2000
            })
        );
    }

    #[test]
    fn range_wrap_rejected() {
        let mut mem = VecMemory::new(0x1000);
        let w = PageWalker::new(PagingRegs::default());
        assert_eq!(
            w.write(&mut mem, u64::MAX - 2, &[0; 8]),
            Err(PagingError::RangeWraps {
                la: u64::MAX - 2,
                len: 8
            })
        );
    }
}
