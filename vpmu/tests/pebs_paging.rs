//! Guest page walker and LinearMemory over page tables built in VecMemory.

mod pebs_common;

use pebs_common::*;
use vpmu::mem::{GuestMemory, VecMemory};
use vpmu::paging::{Access, LinearMemory, PageWalker, PagingError};

const RAM: usize = 0x80_0000; // 8 MiB

#[test]
fn four_level_4k_2m_1g() {
    let mut g = Guest::new(RAM, 0x10_0000);
    let root = g.alloc();
    let la4k = 0xFFFF_8000_1234_5000;
    let la2m = 0x0000_7F00_0040_0000;
    let la1g = 0xFFFF_FF80_4000_0000;
    g.map_ia32e(root, 4, la4k, 0x3000, SIZE_4K, PW);
    g.map_ia32e(root, 4, la2m, 0x20_0000, SIZE_2M, PW);
    g.map_ia32e(root, 4, la1g, 0x4000_0000, SIZE_1G, PW);
    let w = PageWalker::new(regs_ia32e(root, false));
    let t = w.translate(&g.mem, la4k + 0x123, Access::Read).unwrap();
    assert_eq!((t.gpa, t.page_size, t.writable), (0x3123, SIZE_4K, true));
    let t = w.translate(&g.mem, la2m + 0x1_2345, Access::Write).unwrap();
    assert_eq!((t.gpa, t.page_size), (0x21_2345, SIZE_2M));
    let t = w
        .translate(&g.mem, la1g + 0x3FFF_FFFF, Access::Read)
        .unwrap();
    assert_eq!((t.gpa, t.page_size), (0x7FFF_FFFF, SIZE_1G));

    // Data goes where the tables say.
    let mut lm = LinearMemory::new(&mut g.mem, w);
    lm.write_u64(la4k + 8, 0xDEAD_BEEF).unwrap();
    assert_eq!(lm.read_u64(la4k + 8).unwrap(), 0xDEAD_BEEF);
    assert_eq!(g.mem.read_u64(0x3008).unwrap(), 0xDEAD_BEEF);
}

#[test]
fn five_level() {
    let mut g = Guest::new(RAM, 0x10_0000);
    let root = g.alloc();
    // Bit 56 clear, bits 55:48 non-zero: canonical only with 57-bit linear addresses.
    let la = 0x00AB_CDEF_1234_5000;
    g.map_ia32e(root, 5, la, 0x5000, SIZE_4K, PW);
    let la_hi = 0xFF80_0000_0000_0000; // top half, canonical under LA57
    g.map_ia32e(root, 5, la_hi, 0x20_0000, SIZE_2M, PW);
    let w5 = PageWalker::new(regs_ia32e(root, true));
    assert_eq!(
        w5.translate(&g.mem, la + 7, Access::Read).unwrap().gpa,
        0x5007
    );
    assert_eq!(
        w5.translate(&g.mem, la_hi + 9, Access::Read).unwrap().gpa,
        0x20_0009
    );
    let w4 = PageWalker::new(regs_ia32e(root, false));
    assert_eq!(
        w4.translate(&g.mem, la, Access::Read),
        Err(PagingError::NonCanonical { la })
    );
    // Non-canonical under LA57 too: bit 56 clear but bit 57 set.
    let bad = 0x0200_0000_0000_0000;
    assert_eq!(
        w5.translate(&g.mem, bad, Access::Read),
        Err(PagingError::NonCanonical { la: bad })
    );
    // Not present at level 5.
    let other = 0x0080_0000_0000_0000;
    assert_eq!(
        w5.translate(&g.mem, other, Access::Read),
        Err(PagingError::NotPresent {
            la: other,
            level: 5
        })
    );
}

#[test]
fn non_canonical_four_level() {
    let mut g = Guest::new(RAM, 0x10_0000);
    let root = g.alloc();
    let w = PageWalker::new(regs_ia32e(root, false));
    for la in [
        0x0000_8000_0000_0000u64,
        0xFFFF_7FFF_FFFF_FFFF,
        0x8000_0000_0000_0000,
    ] {
        assert_eq!(
            w.translate(&g.mem, la, Access::Read),
            Err(PagingError::NonCanonical { la })
        );
    }
}

#[test]
fn not_present_at_each_level_four_level() {
    let mut g = Guest::new(RAM, 0x10_0000);
    let root = g.alloc();
    let la = 0xFFFF_8000_0020_1000;
    g.map_ia32e(root, 4, la, 0x3000, SIZE_4K, PW);
    let w = PageWalker::new(regs_ia32e(root, false));
    assert!(w.translate(&g.mem, la, Access::Read).is_ok());
    for level in 1..=4u8 {
        let at = g.entry_addr_ia32e(root, 4, la, level);
        let saved = g.mem.read_u64(at).unwrap();
        g.mem.write_u64(at, saved & !1).unwrap();
        assert_eq!(
            w.translate(&g.mem, la, Access::Read),
            Err(PagingError::NotPresent { la, level }),
            "level {level}"
        );
        g.mem.write_u64(at, saved).unwrap();
    }
}

#[test]
fn reserved_bits() {
    let mut g = Guest::new(RAM, 0x10_0000);
    let root = g.alloc();
    let la = 0x4000_0000;
    let la2m = 0x8000_0000;
    g.map_ia32e(root, 4, la, 0x3000, SIZE_4K, PW);
    let pde2m = g.map_ia32e(root, 4, la2m, 0x40_0000, SIZE_2M, PW);
    let mut w = PageWalker::new(regs_ia32e(root, false));
    // PS in a PML4E is reserved.
    let pml4e = g.entry_addr_ia32e(root, 4, la, 4);
    let v = g.mem.read_u64(pml4e).unwrap();
    g.mem.write_u64(pml4e, v | PS).unwrap();
    assert!(matches!(
        w.translate(&g.mem, la, Access::Read),
        Err(PagingError::ReservedBit { level: 4, .. })
    ));
    g.mem.write_u64(pml4e, v).unwrap();
    // Bit 13 of a 2 MiB PDE is reserved.
    let v = g.mem.read_u64(pde2m).unwrap();
    g.mem.write_u64(pde2m, v | (1 << 13)).unwrap();
    assert!(matches!(
        w.translate(&g.mem, la2m, Access::Read),
        Err(PagingError::ReservedBit { level: 2, .. })
    ));
    g.mem.write_u64(pde2m, v).unwrap();
    // Address bits above MAXPHYADDR are reserved.
    let pte = g.entry_addr_ia32e(root, 4, la, 1);
    let v = g.mem.read_u64(pte).unwrap();
    g.mem.write_u64(pte, v | (1 << 45)).unwrap();
    assert!(
        w.translate(&g.mem, la, Access::Read).is_ok(),
        "52-bit MAXPHYADDR"
    );
    w.maxphyaddr = 40;
    assert!(matches!(
        w.translate(&g.mem, la, Access::Read),
        Err(PagingError::ReservedBit { level: 1, .. })
    ));
    g.mem.write_u64(pte, v).unwrap();
    // XD is reserved without EFER.NXE.
    g.mem.write_u64(pte, v | (1 << 63)).unwrap();
    assert!(w.translate(&g.mem, la, Access::Read).is_ok());
    w.regs.efer &= !vpmu::paging::EFER_NXE;
    assert!(matches!(
        w.translate(&g.mem, la, Access::Read),
        Err(PagingError::ReservedBit { level: 1, .. })
    ));
}

#[test]
fn table_outside_ram_and_read_only() {
    let mut g = Guest::new(RAM, 0x10_0000);
    let root = g.alloc();
    let la = 0x4000_0000;
    let pte = g.map_ia32e(root, 4, la, 0x3000, SIZE_4K, 1); // present, read-only
    let w = PageWalker::new(regs_ia32e(root, false));
    assert!(w.translate(&g.mem, la, Access::Read).is_ok());
    assert_eq!(
        w.translate(&g.mem, la, Access::Write),
        Err(PagingError::ReadOnly { la })
    );
    // Without CR0.WP supervisor writes ignore R/W.
    let mut nowp = w;
    nowp.regs.cr0 &= !vpmu::paging::CR0_WP;
    assert!(nowp.translate(&g.mem, la, Access::Write).is_ok());
    g.mem.write_u64(pte, 0x3000 | PW).unwrap();
    // CR3 beyond RAM.
    let far = PageWalker::new(regs_ia32e(0x1_0000_0000, false));
    assert!(matches!(
        far.translate(&g.mem, la, Access::Read),
        Err(PagingError::TableNotRam { .. })
    ));
    // A leaf mapping outside RAM (MMIO): translation works, access fails cleanly.
    g.mem.write_u64(pte, 0xFEE0_0000 | PW).unwrap();
    assert_eq!(
        w.translate(&g.mem, la, Access::Read).unwrap().gpa,
        0xFEE0_0000
    );
    let mut lm = LinearMemory::new(&mut g.mem, w);
    assert!(matches!(
        lm.write_u64(la, 1),
        Err(PagingError::NotRam { .. })
    ));
}

#[test]
fn pae_paging() {
    let mut g = Guest::new(RAM, 0x10_0000);
    let pdpt = g.alloc() + 0x20; // 32-byte aligned, not page aligned
    g.map_pae(pdpt, 0xC000_1000, 0x7000, SIZE_4K, PW);
    g.map_pae(pdpt, 0x4060_0000, 0x60_0000, SIZE_2M, PW);
    let w = PageWalker::new(regs_pae(pdpt));
    assert_eq!(
        w.translate(&g.mem, 0xC000_1ABC, Access::Read).unwrap().gpa,
        0x7ABC
    );
    let t = w.translate(&g.mem, 0x4061_2345, Access::Write).unwrap();
    assert_eq!((t.gpa, t.page_size), (0x61_2345, SIZE_2M));
    assert_eq!(
        w.translate(&g.mem, 0x1_0000_0000, Access::Read),
        Err(PagingError::AddressTooWide { la: 0x1_0000_0000 })
    );
    // Not present at each level.
    assert_eq!(
        w.translate(&g.mem, 0x0000_1000, Access::Read),
        Err(PagingError::NotPresent {
            la: 0x1000,
            level: 3
        })
    );
    assert_eq!(
        w.translate(&g.mem, 0xC020_0000, Access::Read),
        Err(PagingError::NotPresent {
            la: 0xC020_0000,
            level: 2
        })
    );
    assert_eq!(
        w.translate(&g.mem, 0xC000_2000, Access::Read),
        Err(PagingError::NotPresent {
            la: 0xC000_2000,
            level: 1
        })
    );
    // PDPTE reserved bit (R/W is reserved in PAE PDPTEs).
    let at = pdpt + 3 * 8;
    let v = g.mem.read_u64(at).unwrap();
    g.mem.write_u64(at, v | 2).unwrap();
    assert!(matches!(
        w.translate(&g.mem, 0xC000_1000, Access::Read),
        Err(PagingError::ReservedBit { level: 3, .. })
    ));
}

#[test]
fn thirty_two_bit_paging_with_pse() {
    let mut g = Guest::new(RAM, 0x10_0000);
    let pd = g.alloc();
    g.map_32(pd, 0x0804_8000, 0x9000, PW);
    g.map_32_4m(pd, 0xC040_0000, 0x0040_0000 | PW);
    // PSE-36: PDE bits 16:13 = physical bits 35:32.
    g.map_32_4m(pd, 0xD000_0000, 0x0080_0000 | (0x3 << 13) | PW);
    let w = PageWalker::new(regs_32(pd, true));
    assert_eq!(
        w.translate(&g.mem, 0x0804_8010, Access::Read).unwrap().gpa,
        0x9010
    );
    let t = w.translate(&g.mem, 0xC052_3456, Access::Read).unwrap();
    assert_eq!((t.gpa, t.page_size), (0x52_3456, 0x40_0000));
    assert_eq!(
        w.translate(&g.mem, 0xD000_0004, Access::Read).unwrap().gpa,
        0x3_0080_0004
    );
    // PSE-36 bits beyond MAXPHYADDR (36 here) and bit 21 are reserved.
    let mut w36 = w;
    w36.maxphyaddr = 36;
    g.map_32_4m(pd, 0xD040_0000, 0x00C0_0000 | (0x10 << 13) | PW);
    assert!(matches!(
        w36.translate(&g.mem, 0xD040_0000, Access::Read),
        Err(PagingError::ReservedBit { level: 2, .. })
    ));
    assert!(w.translate(&g.mem, 0xD040_0000, Access::Read).is_ok());
    // Not present at both levels.
    assert_eq!(
        w.translate(&g.mem, 0x4000_0000, Access::Read),
        Err(PagingError::NotPresent {
            la: 0x4000_0000,
            level: 2
        })
    );
    assert_eq!(
        w.translate(&g.mem, 0x0804_9000, Access::Read),
        Err(PagingError::NotPresent {
            la: 0x0804_9000,
            level: 1
        })
    );
    // Without CR4.PSE the PS bit is ignored: the PDE points to a page table.
    let nopse = PageWalker::new(regs_32(pd, false));
    let t = nopse.translate(&g.mem, 0xC040_0000, Access::Read);
    assert!(!matches!(t, Ok(t) if t.page_size == 0x40_0000));
}

#[test]
fn paging_disabled_identity() {
    let mut mem = VecMemory::new(0x4000);
    let w = PageWalker::new(vpmu::state::PagingRegs::default());
    let mut lm = LinearMemory::new(&mut mem, w);
    lm.write_u64(0x1FFC, 0x1122_3344_5566_7788).unwrap();
    assert_eq!(mem.read_u64(0x1FFC).unwrap(), 0x1122_3344_5566_7788);
}

#[test]
fn range_crossing_page_lands_in_two_noncontiguous_pages() {
    let mut g = Guest::new(RAM, 0x10_0000);
    let root = g.alloc();
    let la = 0xFFFF_C900_0000_0000;
    g.map_ia32e(root, 4, la, 0x5000, SIZE_4K, PW);
    g.map_ia32e(root, 4, la + SIZE_4K, 0x2000, SIZE_4K, PW); // lower physical page
    let w = PageWalker::new(regs_ia32e(root, false));
    let data: Vec<u8> = (0..0xC8u8).collect();
    let start = la + SIZE_4K - 0x30;
    let mut lm = LinearMemory::new(&mut g.mem, w);
    lm.write(start, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    lm.read(start, &mut back).unwrap();
    assert_eq!(back, data);
    assert_eq!(&g.mem.bytes[0x5FD0..0x6000], &data[..0x30]);
    assert_eq!(&g.mem.bytes[0x2000..0x2000 + 0x98], &data[0x30..]);
    // Nothing spilled into the physically adjacent page.
    assert!(g.mem.bytes[0x6000..0x6100].iter().all(|&b| b == 0));
}

#[test]
fn failed_write_is_not_partial() {
    let mut g = Guest::new(RAM, 0x10_0000);
    let root = g.alloc();
    let la = 0x7000_0000;
    g.map_ia32e(root, 4, la, 0x5000, SIZE_4K, PW);
    // Second page not present; a third case maps it outside RAM.
    let w = PageWalker::new(regs_ia32e(root, false));
    let before = g.mem.clone();
    let mut lm = LinearMemory::new(&mut g.mem, w);
    let r = lm.write(la + SIZE_4K - 8, &[0xAA; 16]);
    assert_eq!(
        r,
        Err(PagingError::NotPresent {
            la: la + SIZE_4K,
            level: 1
        })
    );
    assert_eq!(g.mem, before);
    g.map_ia32e(root, 4, la + SIZE_4K, 0x4000_0000, SIZE_4K, PW); // beyond 8 MiB of RAM
    let before = g.mem.clone();
    let mut lm = LinearMemory::new(&mut g.mem, w);
    assert!(matches!(
        lm.write(la + SIZE_4K - 8, &[0xAA; 16]),
        Err(PagingError::NotRam { .. })
    ));
    assert_eq!(g.mem, before);
}
