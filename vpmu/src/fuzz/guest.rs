//! The in-memory guest of the fuzz targets: RAM whose every vPMU write is recorded, page tables
//! for every paging mode, a DS area and a PEBS buffer that the input may move anywhere.

use crate::mem::{GuestMemory, MemError, VecMemory};
use crate::paging::{CR0_PG, CR0_WP, CR4_LA57, CR4_PAE, CR4_PSE, EFER_LMA, EFER_LME, EFER_NXE};
use crate::state::PagingRegs;

/// Every write made through a [`RecordingMemory`]: (guest-physical address, length).
pub type WriteLog = Vec<(u64, usize)>;

/// Guest RAM that records every write the vPMU makes through the [`GuestMemory`] trait.
#[derive(Debug, Clone)]
pub struct RecordingMemory {
    /// The RAM; writes made directly here (the guest's own stores) are not recorded.
    pub inner: VecMemory,
    /// Writes attempted through the trait, in order, whether or not they succeeded.
    pub writes: WriteLog,
}

impl RecordingMemory {
    /// `size` bytes of zeroed RAM.
    pub fn new(size: usize) -> Self {
        Self {
            inner: VecMemory::new(size),
            writes: Vec::new(),
        }
    }

    /// RAM size in bytes.
    pub fn size(&self) -> u64 {
        self.inner.bytes.len() as u64
    }
}

impl GuestMemory for RecordingMemory {
    fn read_phys(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        self.inner.read_phys(gpa, buf)
    }
    fn write_phys(&mut self, gpa: u64, data: &[u8]) -> Result<(), MemError> {
        self.writes.push((gpa, data.len()));
        self.inner.write_phys(gpa, data)
    }
}

/// RAM size of the fuzz guest (64 pages).
pub const RAM_SIZE: usize = 0x4_0000;
/// 5-level root (PML5).
pub const PML5: u64 = 0x1000;
/// 4-level root (PML4).
pub const PML4: u64 = 0x2000;
const PDPT: u64 = 0x3000;
const PD: u64 = 0x4000;
const PT: u64 = 0x5000;
/// 32-bit paging directory.
pub const PD32: u64 = 0x6000;
const PT32: u64 = 0x7000;
/// PAE page-directory-pointer table.
pub const PAE_PDPT: u64 = 0x8000;
const PAE_PD: u64 = 0x9000;
const PAE_PT: u64 = 0xA000;
/// Default DS area (identity mapped in every mode).
pub const DS_AREA: u64 = 0xC000;
/// Default PEBS buffer base.
pub const PEBS_BASE: u64 = 0xD000;
/// Default PEBS absolute maximum.
pub const PEBS_MAX: u64 = 0x2_0000;
/// Default PEBS interrupt threshold.
pub const PEBS_THRESHOLD: u64 = 0x1_F000;
/// The last page of RAM is mapped read-only.
pub const READ_ONLY_PAGE: u64 = 0x3_F000;
/// Kernel-half alias of the identity map under 4-level paging (PML4 slot 256).
pub const KERNEL_ALIAS: u64 = 0xFFFF_8000_0000_0000;

const P: u64 = 1;
const RW: u64 = 2;
const PS: u64 = 1 << 7;
const PAGES: u64 = (RAM_SIZE as u64) / 0x1000;

/// The fuzz guest: recorded RAM with page tables for every mode and a valid DS area.
#[derive(Debug, Clone)]
pub struct FuzzGuest {
    /// Guest RAM.
    pub mem: RecordingMemory,
    /// The paging registers the guest runs with now.
    pub paging: PagingRegs,
}

impl Default for FuzzGuest {
    fn default() -> Self {
        Self::new()
    }
}

impl FuzzGuest {
    /// The guest with identity maps of RAM in every paging mode (the last page read-only), the
    /// 4-level map also at [`KERNEL_ALIAS`], 2 MiB / 4 MiB large-page entries past the first
    /// directory slot, and the DS area set up with a PEBS window. Paging starts disabled.
    pub fn new() -> Self {
        let mut g = Self {
            mem: RecordingMemory::new(RAM_SIZE),
            paging: PagingRegs::default(),
        };
        let m = &mut g.mem.inner;
        let leaf = |page: u64| {
            (page * 0x1000)
                | P
                | if page * 0x1000 == READ_ONLY_PAGE {
                    0
                } else {
                    RW
                }
        };
        // IA-32e.
        let mut w = |gpa: u64, v: u64| m.write_u64(gpa, v).unwrap_or(());
        w(PML5, PML4 | P | RW);
        w(PML4, PDPT | P | RW);
        w(PML4 + 256 * 8, PDPT | P | RW);
        w(PDPT, PD | P | RW);
        w(PD, PT | P | RW);
        w(PD + 8, P | RW | PS);
        // PAE.
        w(PAE_PDPT, PAE_PD | P);
        w(PAE_PD, PAE_PT | P | RW);
        w(PAE_PD + 8, P | RW | PS);
        for page in 0..PAGES {
            w(PT + page * 8, leaf(page));
            w(PAE_PT + page * 8, leaf(page));
        }
        // 32-bit.
        let mut w32 = |gpa: u64, v: u64| {
            let v = u32::try_from(v).unwrap_or(0);
            m.write_phys(gpa, &v.to_le_bytes()).unwrap_or(());
        };
        w32(PD32, PT32 | P | RW);
        w32(PD32 + 4, P | RW | PS);
        for page in 0..PAGES {
            w32(PT32 + page * 4, leaf(page));
        }
        g.set_pebs_window(DS_AREA, PEBS_BASE, PEBS_BASE, PEBS_MAX, PEBS_THRESHOLD);
        g
    }

    /// Writes the PEBS management fields of the DS area at physical `ds` (guest store).
    pub fn set_pebs_window(&mut self, ds: u64, base: u64, index: u64, max: u64, threshold: u64) {
        for (off, v) in [(0x20, base), (0x28, index), (0x30, max), (0x38, threshold)] {
            self.mem.inner.write_u64(ds + off, v).unwrap_or(());
        }
    }

    /// Paging registers of mode `mode % 5`: disabled, 32-bit (PSE), PAE, 4-level, 5-level.
    pub fn mode_regs(mode: u8) -> PagingRegs {
        let on = CR0_PG | CR0_WP | 1;
        match mode % 5 {
            0 => PagingRegs::default(),
            1 => PagingRegs {
                cr0: on,
                cr3: PD32,
                cr4: CR4_PSE,
                efer: 0,
            },
            2 => PagingRegs {
                cr0: on,
                cr3: PAE_PDPT,
                cr4: CR4_PAE,
                efer: EFER_NXE,
            },
            3 => PagingRegs {
                cr0: on,
                cr3: PML4,
                cr4: CR4_PAE,
                efer: EFER_LME | EFER_LMA | EFER_NXE,
            },
            _ => PagingRegs {
                cr0: on,
                cr3: PML5,
                cr4: CR4_PAE | CR4_LA57,
                efer: EFER_LME | EFER_LMA | EFER_NXE,
            },
        }
    }
}
