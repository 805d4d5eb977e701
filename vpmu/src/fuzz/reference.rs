//! A reference page walker, written independently of [`crate::paging`] from SDM vol. 3A
//! chapter 4 as one table-driven loop: each paging mode is a list of levels (index bits, entry
//! size, which levels may map a page, reserved bits). It models the same documented
//! simplifications as the real walker: no accessed/dirty updates, no U/S, SMAP or protection
//! keys, PAE PDPTEs read from memory, MAXPHYADDR clamped to 32..=52, 1 GiB pages available.

use crate::mem::GuestMemory;
use crate::paging::{CR0_PG, CR0_WP, CR4_LA57, CR4_PAE, CR4_PSE, EFER_LMA, EFER_LME, EFER_NXE};
use crate::state::PagingRegs;

/// A successful reference translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefTranslation {
    /// Guest-physical address.
    pub gpa: u64,
    /// Size of the mapping page.
    pub page_size: u64,
    /// Every entry on the walk had R/W set (always true without paging).
    pub writable: bool,
}

/// Why the reference walk failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefError {
    /// Not canonical (IA-32e).
    NonCanonical,
    /// Above 4 GiB without IA-32e paging.
    TooWide,
    /// Entry at this level not present.
    NotPresent(u8),
    /// Entry at this level has a reserved bit set.
    Reserved(u8),
    /// A paging-structure entry is not in RAM.
    TableNotRam,
    /// Supervisor write to a read-only mapping with CR0.WP.
    ReadOnly,
}

/// Mask of bits `lo..=hi` (empty when `lo > hi`).
fn mask(lo: u32, hi: u32) -> u64 {
    (lo..=hi.min(63)).fold(0, |m, b| m | 1u64 << b)
}

fn read_entry(mem: &dyn GuestMemory, gpa: u64, size: usize) -> Option<u64> {
    let mut b = [0u8; 8];
    mem.read_phys(gpa, &mut b[..size]).ok()?;
    Some(u64::from_le_bytes(b))
}

/// One level of a walk.
struct Level {
    /// Level number reported in errors (1 = PTE).
    number: u8,
    /// Lowest linear-address bit of this level's index.
    shift: u32,
    /// Index width in bits.
    index_bits: u32,
    /// Reserved bits when the entry references a table (or maps a 4 KiB page at level 1).
    rsvd: u64,
    /// Reserved bits when PS is set and the level maps a large page; `None`: PS is not a page.
    large_rsvd: Option<u64>,
    /// This level has no R/W bit (PAE PDPTE).
    no_rw: bool,
}

/// Translates `la` as the processor would with `regs` (see the module doc for the model).
pub fn reference_translate(
    mem: &dyn GuestMemory,
    regs: &PagingRegs,
    maxphyaddr: u8,
    la: u64,
    write: bool,
) -> Result<RefTranslation, RefError> {
    let m = u32::from(maxphyaddr.clamp(32, 52));
    let nx = if regs.efer & EFER_NXE == 0 {
        1u64 << 63
    } else {
        0
    };
    let ps = 1u64 << 7;
    let paging = regs.cr0 & CR0_PG != 0;
    let pae = regs.cr4 & CR4_PAE != 0;
    let long = regs.efer & (EFER_LMA | EFER_LME) != 0;
    if !paging {
        if la >> 32 != 0 {
            return Err(RefError::TooWide);
        }
        return Ok(RefTranslation {
            gpa: la,
            page_size: 4096,
            writable: true,
        });
    }
    let (levels, entry_size, root): (Vec<Level>, usize, u64) = if pae && long {
        let n: u8 = if regs.cr4 & CR4_LA57 != 0 { 5 } else { 4 };
        let width = 12 + 9 * u32::from(n);
        // Bits 63:width-1 must all equal bit width-1.
        let top = la >> (width - 1);
        if top != 0 && top != u64::MAX >> (width - 1) {
            return Err(RefError::NonCanonical);
        }
        let high = mask(m, 51) | nx;
        let levels = (1..=n)
            .rev()
            .map(|number| Level {
                number,
                shift: 12 + 9 * u32::from(number - 1),
                index_bits: 9,
                rsvd: if number >= 4 { high | ps } else { high },
                large_rsvd: match number {
                    3 => Some(high | mask(13, 29)),
                    2 => Some(high | mask(13, 20)),
                    _ => None,
                },
                no_rw: false,
            })
            .collect();
        (levels, 8, regs.cr3 & mask(12, m - 1))
    } else if pae {
        if la >> 32 != 0 {
            return Err(RefError::TooWide);
        }
        let high = mask(m, 62);
        let levels = vec![
            Level {
                number: 3,
                shift: 30,
                index_bits: 2,
                rsvd: high | 1 << 63 | mask(1, 2) | mask(5, 8),
                large_rsvd: None,
                no_rw: true,
            },
            Level {
                number: 2,
                shift: 21,
                index_bits: 9,
                rsvd: high | nx,
                large_rsvd: Some(high | nx | mask(13, 20)),
                no_rw: false,
            },
            Level {
                number: 1,
                shift: 12,
                index_bits: 9,
                rsvd: high | nx,
                large_rsvd: None,
                no_rw: false,
            },
        ];
        (levels, 8, regs.cr3 & mask(5, 31))
    } else {
        if la >> 32 != 0 {
            return Err(RefError::TooWide);
        }
        // PSE-36: PDE bits 13.. carry physical bits 32..; those MAXPHYADDR (at most 40) does
        // not allow, up to bit 21, are reserved.
        let hi_bits = m.min(40) - 32;
        let pse = regs.cr4 & CR4_PSE != 0;
        let levels = vec![
            Level {
                number: 2,
                shift: 22,
                index_bits: 10,
                rsvd: 0,
                large_rsvd: pse.then(|| mask(13 + hi_bits, 21)),
                no_rw: false,
            },
            Level {
                number: 1,
                shift: 12,
                index_bits: 10,
                rsvd: 0,
                large_rsvd: None,
                no_rw: false,
            },
        ];
        (levels, 4, regs.cr3 & mask(12, 31))
    };

    let frame = if entry_size == 4 {
        mask(12, 31)
    } else {
        mask(12, m - 1)
    };
    let mut table = root;
    let mut writable = true;
    for lv in &levels {
        let idx = (la >> lv.shift) & mask(0, lv.index_bits - 1);
        let at = table + idx * entry_size as u64;
        let e = read_entry(mem, at, entry_size).ok_or(RefError::TableNotRam)?;
        if e & 1 == 0 {
            return Err(RefError::NotPresent(lv.number));
        }
        let large = lv.number > 1 && e & ps != 0 && lv.large_rsvd.is_some();
        let rsvd = if large {
            lv.large_rsvd.unwrap_or(0)
        } else {
            lv.rsvd
        };
        if e & rsvd != 0 {
            return Err(RefError::Reserved(lv.number));
        }
        if !lv.no_rw {
            writable &= e & 2 != 0;
        }
        if large || lv.number == 1 {
            let size = 1u64 << lv.shift;
            let base = if entry_size == 4 && large {
                // 4 MiB page: bits 31:22, PSE-36 bits 39:32 from PDE bits 20:13.
                let hi = hi_bits_of(m);
                let high = if hi == 0 {
                    0
                } else {
                    ((e >> 13) & mask(0, hi - 1)) << 32
                };
                (e & mask(22, 31)) | high
            } else {
                e & frame & !(size - 1)
            };
            if write && !writable && regs.cr0 & CR0_WP != 0 {
                return Err(RefError::ReadOnly);
            }
            return Ok(RefTranslation {
                gpa: base | (la & (size - 1)),
                page_size: size,
                writable,
            });
        }
        table = e & frame;
    }
    // Every mode's last level is level 1, which returns above.
    Err(RefError::NotPresent(1))
}

/// PSE-36 physical bits above 31 for MAXPHYADDR `m` (0..=8).
fn hi_bits_of(m: u32) -> u32 {
    m.min(40) - 32
}
