//! The DS save area's buffer-management fields (SDM 17.4.9.1 "64 Bit Format of the DS Save
//! Area", Figure 17-8; Linux `struct debug_store` in arch/x86/include/asm/intel_ds.h).
//!
//! IA32_DS_AREA and every field hold linear addresses; all access goes through
//! [`LinearMemory`]. The fields are re-read from guest memory at every use because the guest
//! rewrites them at any time (Linux resets PEBS Index on every drain, in and outside PMIs).
//! Only the 64-bit (DTES64) layout is implemented: every model this project emulates has
//! DTES64, and SDM 17.4.9 notes the 64-bit format applies in all operating modes there.

use thiserror::Error;

use crate::model::PebsFormat;
use crate::msr::GLOBAL_FIXED_SHIFT;
use crate::paging::{LinearMemory, PagingError};

/// BTS Buffer Base.
pub const DS_BTS_BUFFER_BASE: u64 = 0x00;
/// BTS Index.
pub const DS_BTS_INDEX: u64 = 0x08;
/// BTS Absolute Maximum.
pub const DS_BTS_ABSOLUTE_MAXIMUM: u64 = 0x10;
/// BTS Interrupt Threshold.
pub const DS_BTS_INTERRUPT_THRESHOLD: u64 = 0x18;
/// PEBS Buffer Base.
pub const DS_PEBS_BUFFER_BASE: u64 = 0x20;
/// PEBS Index.
pub const DS_PEBS_INDEX: u64 = 0x28;
/// PEBS Absolute Maximum.
pub const DS_PEBS_ABSOLUTE_MAXIMUM: u64 = 0x30;
/// PEBS Interrupt Threshold.
pub const DS_PEBS_INTERRUPT_THRESHOLD: u64 = 0x38;
/// First PEBS counter-reset slot; slot s is at `DS_PEBS_COUNTER_RESET + 8 * s`.
pub const DS_PEBS_COUNTER_RESET: u64 = 0x40;
/// Bytes of the buffer-management fields before the reset slots.
pub const DS_MANAGEMENT_SIZE: usize = 0x40;
/// Reset slot of fixed counter 0 before PEBS format 5 (Linux: `MAX_PEBS_EVENTS_FMT4`).
pub const DS_FIXED_RESET_SLOT_FMT4: u32 = 8;
/// Reset slot of fixed counter 0 from PEBS format 5 (Linux: `INTEL_PMC_IDX_FIXED`).
pub const DS_FIXED_RESET_SLOT_FMT5: u32 = 32;

/// Why a DS field could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum DsError {
    /// A DS management field could not be read or written.
    #[error("DS area field at {la:#x}: {source}")]
    Field {
        /// Linear address of the field.
        la: u64,
        /// The translation or RAM failure.
        source: PagingError,
    },
    /// A counter-reset slot could not be read.
    #[error("DS counter-reset slot {slot}: {source}")]
    ResetSlot {
        /// Slot number.
        slot: u32,
        /// The translation or RAM failure.
        source: PagingError,
    },
    /// `IA32_DS_AREA + offset` overflows 64 bits.
    #[error("DS area {ds:#x} + {offset:#x} overflows")]
    AddressOverflow {
        /// IA32_DS_AREA.
        ds: u64,
        /// Field offset.
        offset: u64,
    },
    /// Buffer base above its absolute maximum.
    #[error("buffer base {base:#x} is above absolute maximum {max:#x}")]
    BaseAboveMaximum {
        /// Buffer base.
        base: u64,
        /// Absolute maximum.
        max: u64,
    },
    /// Index below the buffer base.
    #[error("buffer index {index:#x} is below base {base:#x}")]
    IndexBelowBase {
        /// Index.
        index: u64,
        /// Base.
        base: u64,
    },
    /// Index beyond the absolute maximum.
    #[error("buffer index {index:#x} is past absolute maximum {max:#x}")]
    IndexPastMaximum {
        /// Index.
        index: u64,
        /// Absolute maximum.
        max: u64,
    },
    /// Interrupt threshold beyond the absolute maximum.
    #[error("interrupt threshold {threshold:#x} is past absolute maximum {max:#x}")]
    ThresholdPastMaximum {
        /// Threshold.
        threshold: u64,
        /// Absolute maximum.
        max: u64,
    },
}

/// One buffer's four management fields (BTS or PEBS).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DsBuffer {
    /// Linear address of the first byte of the buffer.
    pub base: u64,
    /// Linear address of the next record.
    pub index: u64,
    /// Linear address one past the last usable byte.
    pub abs_max: u64,
    /// Index value at or beyond which the processor raises the interrupt.
    pub threshold: u64,
}

impl DsBuffer {
    /// Checks that the fields describe a sane window: base <= index <= max, threshold <= max.
    pub fn validate(&self) -> Result<(), DsError> {
        let max = self.abs_max;
        if self.base > max {
            return Err(DsError::BaseAboveMaximum {
                base: self.base,
                max,
            });
        }
        if self.index < self.base {
            return Err(DsError::IndexBelowBase {
                index: self.index,
                base: self.base,
            });
        }
        if self.index > max {
            return Err(DsError::IndexPastMaximum {
                index: self.index,
                max,
            });
        }
        if self.threshold > max {
            return Err(DsError::ThresholdPastMaximum {
                threshold: self.threshold,
                max,
            });
        }
        Ok(())
    }

    /// Whether a record of `size` bytes fits at the index: `index + size <= abs_max`.
    pub fn fits(&self, size: u64) -> bool {
        self.index
            .checked_add(size)
            .is_some_and(|end| end <= self.abs_max)
    }
}

/// The buffer-management area: BTS and PEBS fields.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DsArea {
    /// Linear address of the area (IA32_DS_AREA).
    pub address: u64,
    /// BTS buffer fields.
    pub bts: DsBuffer,
    /// PEBS buffer fields.
    pub pebs: DsBuffer,
}

/// Linear address of the field at `offset` in the DS area at `ds`.
pub fn field_address(ds: u64, offset: u64) -> Result<u64, DsError> {
    ds.checked_add(offset)
        .ok_or(DsError::AddressOverflow { ds, offset })
}

fn le_u64(bytes: &[u8; DS_MANAGEMENT_SIZE], offset: u64) -> u64 {
    let mut b = [0u8; 8];
    // Offsets are the constants above, all < DS_MANAGEMENT_SIZE - 7.
    let start = usize::try_from(offset)
        .unwrap_or(0)
        .min(DS_MANAGEMENT_SIZE - 8);
    b.copy_from_slice(&bytes[start..start + 8]);
    u64::from_le_bytes(b)
}

impl DsArea {
    /// Reads the eight management fields at `ds` (one linear read, page by page).
    pub fn read(lm: &LinearMemory<'_>, ds: u64) -> Result<Self, DsError> {
        field_address(ds, DS_MANAGEMENT_SIZE as u64 - 1)?;
        let mut raw = [0u8; DS_MANAGEMENT_SIZE];
        lm.read(ds, &mut raw)
            .map_err(|source| DsError::Field { la: ds, source })?;
        let buf = |b, i, m, t| DsBuffer {
            base: le_u64(&raw, b),
            index: le_u64(&raw, i),
            abs_max: le_u64(&raw, m),
            threshold: le_u64(&raw, t),
        };
        Ok(Self {
            address: ds,
            bts: buf(
                DS_BTS_BUFFER_BASE,
                DS_BTS_INDEX,
                DS_BTS_ABSOLUTE_MAXIMUM,
                DS_BTS_INTERRUPT_THRESHOLD,
            ),
            pebs: buf(
                DS_PEBS_BUFFER_BASE,
                DS_PEBS_INDEX,
                DS_PEBS_ABSOLUTE_MAXIMUM,
                DS_PEBS_INTERRUPT_THRESHOLD,
            ),
        })
    }
}

fn write_field(lm: &mut LinearMemory<'_>, ds: u64, offset: u64, v: u64) -> Result<(), DsError> {
    let la = field_address(ds, offset)?;
    lm.write_u64(la, v)
        .map_err(|source| DsError::Field { la, source })
}

/// Checks that a field can be written (translates writable, is RAM) without writing it.
pub fn check_field_writable(lm: &LinearMemory<'_>, ds: u64, offset: u64) -> Result<(), DsError> {
    let la = field_address(ds, offset)?;
    lm.check_writable(la, 8)
        .map_err(|source| DsError::Field { la, source })
}

/// Writes PEBS Index.
pub fn write_pebs_index(lm: &mut LinearMemory<'_>, ds: u64, index: u64) -> Result<(), DsError> {
    write_field(lm, ds, DS_PEBS_INDEX, index)
}

/// Writes BTS Index.
pub fn write_bts_index(lm: &mut LinearMemory<'_>, ds: u64, index: u64) -> Result<(), DsError> {
    write_field(lm, ds, DS_BTS_INDEX, index)
}

/// The counter-reset slot of a counter named by its IA32_PERF_GLOBAL_STATUS bit: GP n -> slot n;
/// fixed i (bit 32+i) -> slot 8+i before format 5, 32+i from format 5 (SDM 18.9.2.4; Linux
/// `intel_pmu_pebs_enable`). NetBurst's IQ_COUNTER4 is reported as bit 0 -> slot 0.
/// `None` for bits that name no counter (63:48).
pub fn counter_reset_slot(format: PebsFormat, status_bit: u32) -> Option<u32> {
    const FIXED_BITS: u32 = 16;
    if status_bit < GLOBAL_FIXED_SHIFT {
        return Some(status_bit);
    }
    let fixed = status_bit - GLOBAL_FIXED_SHIFT;
    if fixed >= FIXED_BITS {
        return None;
    }
    let first = if format == PebsFormat::Fmt5 {
        DS_FIXED_RESET_SLOT_FMT5
    } else {
        DS_FIXED_RESET_SLOT_FMT4
    };
    Some(first + fixed)
}

/// Reads counter-reset slot `slot`.
pub fn read_counter_reset(lm: &LinearMemory<'_>, ds: u64, slot: u32) -> Result<u64, DsError> {
    let offset = DS_PEBS_COUNTER_RESET + 8 * u64::from(slot);
    let la = field_address(ds, offset)?;
    lm.read_u64(la)
        .map_err(|source| DsError::ResetSlot { slot, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::{GuestMemory, VecMemory};
    use crate::paging::PageWalker;
    use crate::state::PagingRegs;

    #[test]
    fn reset_slots() {
        assert_eq!(counter_reset_slot(PebsFormat::Fmt3, 2), Some(2));
        assert_eq!(counter_reset_slot(PebsFormat::Fmt4, 33), Some(9));
        assert_eq!(counter_reset_slot(PebsFormat::Fmt5, 33), Some(33));
        assert_eq!(counter_reset_slot(PebsFormat::Fmt5, 62), None);
    }

    #[test]
    fn read_fields_and_write_index() {
        let mut mem = VecMemory::new(0x2000);
        for (i, off) in (0..8u64).map(|i| (i, i * 8)) {
            mem.write_u64(0x1000 + off, 0x100 + i).unwrap();
        }
        mem.write_u64(0x1000 + DS_PEBS_COUNTER_RESET + 8 * 9, 0xABC)
            .unwrap();
        let mut lm = LinearMemory::new(&mut mem, PageWalker::new(PagingRegs::default()));
        let ds = DsArea::read(&lm, 0x1000).unwrap();
        assert_eq!(
            ds.bts,
            DsBuffer {
                base: 0x100,
                index: 0x101,
                abs_max: 0x102,
                threshold: 0x103
            }
        );
        assert_eq!(
            ds.pebs,
            DsBuffer {
                base: 0x104,
                index: 0x105,
                abs_max: 0x106,
                threshold: 0x107
            }
        );
        assert_eq!(read_counter_reset(&lm, 0x1000, 9).unwrap(), 0xABC);
        write_pebs_index(&mut lm, 0x1000, 0x555).unwrap();
        assert_eq!(DsArea::read(&lm, 0x1000).unwrap().pebs.index, 0x555);
        assert!(matches!(
            DsArea::read(&lm, 0x1FF0),
            Err(DsError::Field { .. })
        ));
        assert!(matches!(
            DsArea::read(&lm, u64::MAX - 8),
            Err(DsError::AddressOverflow { .. })
        ));
    }

    #[test]
    fn validation() {
        let ok = DsBuffer {
            base: 0x100,
            index: 0x100,
            abs_max: 0x200,
            threshold: 0x180,
        };
        assert_eq!(ok.validate(), Ok(()));
        assert!(ok.fits(0x100) && !ok.fits(0x101));
        let b = DsBuffer { base: 0x300, ..ok };
        assert!(matches!(
            b.validate(),
            Err(DsError::BaseAboveMaximum { .. })
        ));
        let b = DsBuffer { index: 0xFF, ..ok };
        assert!(matches!(b.validate(), Err(DsError::IndexBelowBase { .. })));
        let b = DsBuffer { index: 0x201, ..ok };
        assert!(matches!(
            b.validate(),
            Err(DsError::IndexPastMaximum { .. })
        ));
        let b = DsBuffer {
            threshold: 0x201,
            ..ok
        };
        assert!(matches!(
            b.validate(),
            Err(DsError::ThresholdPastMaximum { .. })
        ));
        assert!(
            !DsBuffer {
                index: u64::MAX,
                abs_max: u64::MAX,
                ..ok
            }
            .fits(1)
        );
    }
}
