//! Fuzz target `page_walk`: [`PageWalker`] against the reference walker of
//! [`super::reference`] over page tables the input writes.
//!
//! Input: paging registers (mode selector plus raw CR3/CR4/EFER bits), MAXPHYADDR, then a list
//! of paging-structure entries to write into a 16-page RAM (each either pointing at a page of
//! RAM with chosen flags, or raw), then linear addresses to translate for read and for write.
//! Invariants: the two walkers agree on every translation (physical address, page size,
//! writability) and on the kind and level of every failure; [`PageWalker::read`] of 8 bytes
//! succeeds exactly when both bytes' pages translate into RAM.

use super::Bytes;
use super::reference::{RefError, reference_translate};
use crate::mem::{GuestMemory, VecMemory};
use crate::paging::{
    Access, CR0_PG, CR0_WP, CR4_LA57, CR4_PAE, CR4_PSE, EFER_LMA, EFER_NXE, PageWalker, PagingError,
};
use crate::state::PagingRegs;

const RAM_PAGES: u64 = 16;

fn classify(e: PagingError) -> RefError {
    match e {
        PagingError::NonCanonical { .. } => RefError::NonCanonical,
        PagingError::AddressTooWide { .. } => RefError::TooWide,
        PagingError::NotPresent { level, .. } => RefError::NotPresent(level),
        PagingError::ReservedBit { level, .. } => RefError::Reserved(level),
        PagingError::TableNotRam { .. } => RefError::TableNotRam,
        PagingError::ReadOnly { .. } => RefError::ReadOnly,
        // Single-address translation never yields these.
        PagingError::RangeWraps { .. } | PagingError::NotRam { .. } => RefError::TableNotRam,
    }
}

/// An entry value: a RAM page with flags, a large-page frame, or raw bits.
fn entry(b: &mut Bytes<'_>) -> u64 {
    let flags = u64::from(b.u16()) & 0xFFF;
    match b.u8() % 4 {
        0 | 1 => (u64::from(b.u8()) % RAM_PAGES) << 12 | flags,
        2 => (u64::from(b.u8()) << 21) | flags | (u64::from(b.u8() & 1) << 63),
        _ => b.u64(),
    }
}

/// A linear address: low (likely mapped), with a chosen top, or raw.
fn linear(b: &mut Bytes<'_>) -> u64 {
    match b.u8() % 4 {
        0 => u64::from(b.u32()) & 0x3F_FFFF,
        1 => 0xFFFF_8000_0000_0000 | u64::from(b.u32()),
        2 => u64::from(b.u32()),
        _ => b.u64(),
    }
}

/// Runs the `page_walk` target on `data`; panics if the walkers disagree.
pub fn page_walk(data: &[u8]) {
    let mut b = Bytes::new(data);
    let mode = b.u8();
    let cr3 = (u64::from(b.u8()) % RAM_PAGES) << 12 | u64::from(b.u16() & 0xFE0);
    let mut regs = PagingRegs {
        cr0: if mode & 1 != 0 { CR0_PG | 1 } else { 1 },
        cr3,
        cr4: 0,
        efer: 0,
    };
    if mode & 2 != 0 {
        regs.cr4 |= CR4_PAE;
    }
    if mode & 4 != 0 {
        regs.efer |= EFER_LMA;
    }
    if mode & 8 != 0 {
        regs.cr4 |= CR4_LA57;
    }
    if mode & 16 != 0 {
        regs.cr4 |= CR4_PSE;
    }
    if mode & 32 != 0 {
        regs.efer |= EFER_NXE;
    }
    if mode & 64 != 0 {
        regs.cr0 |= CR0_WP;
    }
    let maxphyaddr = b.u8() % 64;
    let mut mem = VecMemory::new(usize::try_from(RAM_PAGES << 12).unwrap_or(0));
    let entries = b.u8() % 48;
    for _ in 0..entries {
        let page = u64::from(b.u8()) % RAM_PAGES;
        let slot = u64::from(b.u16()) % 512;
        let v = entry(&mut b);
        let narrow = b.u8() & 1 == 0;
        if regs.cr4 & CR4_PAE == 0 && narrow {
            let at = (page << 12) | ((slot % 1024) * 4);
            let v32 = u32::try_from(v & 0xFFFF_FFFF).unwrap_or(0);
            let _ = mem.write_phys(at, &v32.to_le_bytes());
        } else {
            let _ = mem.write_u64((page << 12) | (slot * 8), v);
        }
    }
    let walker = PageWalker { regs, maxphyaddr };
    while !b.is_empty() {
        let la = linear(&mut b);
        for (access, write) in [(Access::Read, false), (Access::Write, true)] {
            let got = walker.translate(&mem, la, access);
            let want = reference_translate(&mem, &regs, maxphyaddr, la, write);
            match (got, want) {
                (Ok(g), Ok(w)) => assert!(
                    g.gpa == w.gpa && g.page_size == w.page_size && g.writable == w.writable,
                    "la {la:#x} regs {regs:x?} maxphy {maxphyaddr}: walker {g:x?}, reference {w:x?}"
                ),
                (Err(g), Err(w)) => assert_eq!(
                    classify(g),
                    w,
                    "la {la:#x} regs {regs:x?} maxphy {maxphyaddr}: walker {g}, reference {w:?}"
                ),
                (g, w) => panic!(
                    "la {la:#x} regs {regs:x?} maxphy {maxphyaddr}: walker {g:x?}, reference {w:x?}"
                ),
            }
        }
        // A read crossing into the next page succeeds iff both pieces translate into RAM.
        let at = la | 0xFFC;
        let mut buf = [0u8; 8];
        let got = walker.read(&mem, at, &mut buf).is_ok();
        let in_ram = |la: u64| {
            reference_translate(&mem, &regs, maxphyaddr, la, false)
                .is_ok_and(|t| t.gpa.checked_add(4).is_some_and(|e| e <= RAM_PAGES << 12))
        };
        let want = at.checked_add(7).is_some() && in_ram(at) && in_ram(at + 4);
        assert_eq!(got, want, "8-byte read at {at:#x} regs {regs:x?}");
    }
}
