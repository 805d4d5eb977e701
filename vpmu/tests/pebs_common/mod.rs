//! Shared helpers for the PEBS integration tests: guest page-table builders over VecMemory and
//! CPU models per PEBS format.

#![allow(dead_code, reason = "each test file uses a different subset")]

use vpmu::mem::{GuestMemory, VecMemory};
use vpmu::model::{CpuModel, PebsFormat};
use vpmu::paging::{CR0_PG, CR0_WP, CR4_LA57, CR4_PAE, CR4_PSE, EFER_LMA, EFER_LME, EFER_NXE};
use vpmu::state::PagingRegs;

/// Present + writable.
pub const PW: u64 = 0b11;
/// Page-size bit.
pub const PS: u64 = 1 << 7;

pub const SIZE_4K: u64 = 0x1000;
pub const SIZE_2M: u64 = 0x20_0000;
pub const SIZE_1G: u64 = 0x4000_0000;

/// Guest RAM plus a bump allocator for page-table pages.
pub struct Guest {
    pub mem: VecMemory,
    next_table: u64,
}

impl Guest {
    /// `size` bytes of RAM; page tables are allocated from `tables_at` upward.
    pub fn new(size: usize, tables_at: u64) -> Self {
        Self {
            mem: VecMemory::new(size),
            next_table: tables_at,
        }
    }

    /// A zeroed 4 KiB page for a paging structure.
    pub fn alloc(&mut self) -> u64 {
        let p = self.next_table;
        self.next_table += SIZE_4K;
        self.mem.write_phys(p, &[0u8; 4096]).unwrap();
        p
    }

    fn entry_or_new(&mut self, table: u64, idx: u64) -> u64 {
        let gpa = table + idx * 8;
        let e = self.mem.read_u64(gpa).unwrap();
        if e & 1 != 0 {
            return e & 0x000F_FFFF_FFFF_F000;
        }
        let t = self.alloc();
        self.mem.write_u64(gpa, t | PW).unwrap();
        t
    }

    /// IA-32e paging (4 or 5 levels): maps `la` to `gpa` with a page of `size`, entry flags
    /// `flags` on the leaf (PS added for large pages). Returns the leaf entry's address.
    pub fn map_ia32e(
        &mut self,
        root: u64,
        levels: u8,
        la: u64,
        gpa: u64,
        size: u64,
        flags: u64,
    ) -> u64 {
        let leaf_level = match size {
            SIZE_4K => 1,
            SIZE_2M => 2,
            SIZE_1G => 3,
            _ => panic!("bad size"),
        };
        let mut table = root;
        for level in (leaf_level + 1..=levels).rev() {
            let idx = (la >> (12 + 9 * (u32::from(level) - 1))) & 0x1FF;
            table = self.entry_or_new(table, idx);
        }
        let idx = (la >> (12 + 9 * (u32::from(leaf_level) - 1))) & 0x1FF;
        let ps = if leaf_level > 1 { PS } else { 0 };
        let at = table + idx * 8;
        self.mem.write_u64(at, gpa | flags | ps).unwrap();
        at
    }

    /// Address of the entry for `la` at `level` (walking existing entries).
    pub fn entry_addr_ia32e(&self, root: u64, levels: u8, la: u64, level: u8) -> u64 {
        let mut table = root;
        for l in (level + 1..=levels).rev() {
            let idx = (la >> (12 + 9 * (u32::from(l) - 1))) & 0x1FF;
            table = self.mem.read_u64(table + idx * 8).unwrap() & 0x000F_FFFF_FFFF_F000;
        }
        table + ((la >> (12 + 9 * (u32::from(level) - 1))) & 0x1FF) * 8
    }

    /// PAE paging: `pdpt` is the 32-byte-aligned PDPT (CR3). 4 KiB or 2 MiB pages.
    pub fn map_pae(&mut self, pdpt: u64, la: u64, gpa: u64, size: u64, flags: u64) -> u64 {
        let pdpte_at = pdpt + ((la >> 30) & 3) * 8;
        let mut pd = self.mem.read_u64(pdpte_at).unwrap();
        if pd & 1 == 0 {
            let t = self.alloc();
            // PAE PDPTEs have no R/W bit (reserved).
            self.mem.write_u64(pdpte_at, t | 1).unwrap();
            pd = t;
        }
        let pd = pd & 0x000F_FFFF_FFFF_F000;
        let idx = (la >> 21) & 0x1FF;
        if size == SIZE_2M {
            let at = pd + idx * 8;
            self.mem.write_u64(at, gpa | flags | PS).unwrap();
            return at;
        }
        let pt = self.entry_or_new(pd, idx);
        let at = pt + ((la >> 12) & 0x1FF) * 8;
        self.mem.write_u64(at, gpa | flags).unwrap();
        at
    }

    fn read_u32(&self, gpa: u64) -> u64 {
        let mut b = [0u8; 4];
        self.mem.read_phys(gpa, &mut b).unwrap();
        u64::from(u32::from_le_bytes(b))
    }

    fn write_u32(&mut self, gpa: u64, v: u64) {
        self.mem
            .write_phys(gpa, &u32::try_from(v).unwrap().to_le_bytes())
            .unwrap();
    }

    /// 32-bit paging: 4 KiB pages, or a 4 MiB page with `pse4m` (raw PDE value given).
    pub fn map_32(&mut self, pd: u64, la: u64, gpa: u64, flags: u64) -> u64 {
        let pde_at = pd + ((la >> 22) & 0x3FF) * 4;
        let mut pt = self.read_u32(pde_at);
        if pt & 1 == 0 {
            let t = self.alloc();
            self.write_u32(pde_at, t | PW);
            pt = t;
        }
        let at = (pt & 0xFFFF_F000) + ((la >> 12) & 0x3FF) * 4;
        self.write_u32(at, gpa | flags);
        at
    }

    /// 32-bit paging: writes a raw 4 MiB PDE for `la`.
    pub fn map_32_4m(&mut self, pd: u64, la: u64, pde: u64) -> u64 {
        let at = pd + ((la >> 22) & 0x3FF) * 4;
        self.write_u32(at, pde | PS);
        at
    }
}

pub fn regs_ia32e(cr3: u64, la57: bool) -> PagingRegs {
    PagingRegs {
        cr0: CR0_PG | CR0_WP | 1,
        cr3,
        cr4: CR4_PAE | if la57 { CR4_LA57 } else { 0 },
        efer: EFER_LME | EFER_LMA | EFER_NXE,
    }
}

pub fn regs_pae(cr3: u64) -> PagingRegs {
    PagingRegs {
        cr0: CR0_PG | CR0_WP | 1,
        cr3,
        cr4: CR4_PAE,
        efer: 0,
    }
}

pub fn regs_32(cr3: u64, pse: bool) -> PagingRegs {
    PagingRegs {
        cr0: CR0_PG | CR0_WP | 1,
        cr3,
        cr4: if pse { CR4_PSE } else { 0 },
        efer: 0,
    }
}

/// The preset of `format`'s generation, with trap-like records forced on (NetBurst's preset is
/// fault-like) and, except on NetBurst, at least 4 GP and 3 fixed counters.
pub fn model(format: PebsFormat) -> CpuModel {
    let name = match format {
        PebsFormat::Netburst => "netburst",
        PebsFormat::Fmt0 => "core2",
        PebsFormat::Fmt1 => "nehalem",
        PebsFormat::Fmt2 => "haswell",
        PebsFormat::None | PebsFormat::Fmt3 => "skylake",
        PebsFormat::Fmt4 => "icelake-server",
        PebsFormat::Fmt5 => "sapphire-rapids",
    };
    let mut m = CpuModel::preset(name).unwrap();
    m.pebs_format = format;
    m.pebs_trap = true;
    if format != PebsFormat::Netburst {
        m.num_gp = m.num_gp.max(4);
        m.num_fixed = m.num_fixed.max(3);
    }
    m
}

pub const ALL_FORMATS: [PebsFormat; 7] = [
    PebsFormat::Netburst,
    PebsFormat::Fmt0,
    PebsFormat::Fmt1,
    PebsFormat::Fmt2,
    PebsFormat::Fmt3,
    PebsFormat::Fmt4,
    PebsFormat::Fmt5,
];

/// Deterministic pseudo-random numbers (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}
