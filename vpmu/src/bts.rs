//! Branch Trace Store (SDM 17.4.5, 17.4.9, 17.4.9.3-17.4.9.4): 24-byte records of taken
//! branches written at BTS Index in the DS save area, through the guest's page tables like the
//! PEBS assist ([`crate::paging`], [`crate::ds`]).
//!
//! Controls (IA32_DEBUGCTL bits 6-10; NetBurst MSR_DEBUGCTLA bits 2-6), SDM Table 17-5
//! "CPL-Qualified Branch Trace Store Encodings":
//! - TR = 0: no branch trace messages at all.
//! - TR = 1, BTS = 0: messages go out on the system bus only. Nothing a guest can observe, so
//!   nothing is emulated.
//! - TR = 1, BTS = 1: records are stored, except at CPL 0 with BTS_OFF_OS and at CPL > 0 with
//!   BTS_OFF_USR (both set: nothing stored).
//! - BTINT = 0: the buffer is circular: when a record no longer fits before BTS Absolute
//!   Maximum, BTS Index goes back to BTS Buffer Base (the wrap is done before the write, so
//!   BTS Index never passes the absolute maximum).
//! - BTINT = 1: a PMI is requested when BTS Index reaches BTS Interrupt Threshold after a
//!   write (the same `>=` test as the PEBS threshold). Once the buffer is full, records are
//!   dropped until software drains it (Linux's `bts_update` treats Index >= Absolute Maximum
//!   as lost data). The BTS interrupt goes through the LVT performance-counter entry and sets
//!   no IA32_PERF_GLOBAL_STATUS bit; Linux's `intel_pmu_handle_irq` drains BTS on every PMI.
//!   The SDM note that clearing BTINT alone does not prevent the interrupt (software must
//!   also put the threshold past the absolute maximum, which Linux does) is not reproduced:
//!   with BTINT clear no PMI is requested.
//!
//! The BTS Interrupt Threshold is not validated against the absolute maximum: Linux sets it to
//! Absolute Maximum + one record in snapshot mode to avoid interrupts.
//!
//! Hostile DS contents never panic and never write outside guest RAM or outside
//! `[BTS Buffer Base, BTS Absolute Maximum)`; they yield a [`BtsDropCause`].

use std::fmt;

use crate::ds::{self, DsArea, DsError};
use crate::mem::GuestMemory;
use crate::model::{CpuModel, LbrLayout, PmuArch};
use crate::msr::*;
use crate::paging::{LinearMemory, PageWalker, PagingError};
use crate::state::PagingRegs;

/// Size of one 64-bit BTS record: from, to, flags (SDM Figure 17-9).
pub const BTS_RECORD_SIZE: usize = 24;
/// [`BTS_RECORD_SIZE`] as an address increment.
const RECORD_BYTES: u64 = 24;
/// Bit 4 of the third quadword: the branch was predicted.
pub const BTS_FLAG_PREDICTED: u64 = 1 << 4;

/// The BTS controls of IA32_DEBUGCTL (MSR_DEBUGCTLA on NetBurst).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BtsControl {
    /// TR: branch trace messages.
    pub tr: bool,
    /// BTS: store the messages in the BTS buffer.
    pub bts: bool,
    /// BTINT: interrupt at the threshold instead of a circular buffer.
    pub btint: bool,
    /// BTS_OFF_OS: no records at CPL 0.
    pub off_os: bool,
    /// BTS_OFF_USR: no records at CPL > 0.
    pub off_usr: bool,
}

impl BtsControl {
    /// Decodes the DEBUGCTL value of a model of architecture `arch`.
    pub fn from_debugctl(arch: PmuArch, debugctl: u64) -> BtsControl {
        let bit = |b: u64| debugctl & b != 0;
        match arch {
            PmuArch::Architectural => BtsControl {
                tr: bit(DEBUGCTL_TR),
                bts: bit(DEBUGCTL_BTS),
                btint: bit(DEBUGCTL_BTINT),
                off_os: bit(DEBUGCTL_BTS_OFF_OS),
                off_usr: bit(DEBUGCTL_BTS_OFF_USR),
            },
            PmuArch::Netburst => BtsControl {
                tr: bit(NETBURST_DEBUGCTLA_TR),
                bts: bit(NETBURST_DEBUGCTLA_BTS),
                btint: bit(NETBURST_DEBUGCTLA_BTINT),
                off_os: bit(NETBURST_DEBUGCTLA_BTS_OFF_OS),
                off_usr: bit(NETBURST_DEBUGCTLA_BTS_OFF_USR),
            },
        }
    }

    /// Whether records are stored at all (TR and BTS, not both CPL classes off).
    pub fn active(&self) -> bool {
        self.tr && self.bts && !(self.off_os && self.off_usr)
    }

    /// Whether a branch at `cpl` is stored.
    pub fn stores(&self, cpl: u8) -> bool {
        let off = if cpl == 0 { self.off_os } else { self.off_usr };
        self.tr && self.bts && !off
    }
}

/// Whether the model's BTS records carry the "branch predicted" flag: not on the Intel Core
/// and Atom microarchitectures (SDM 17.4.9.1 note), i.e. the models with the 0x40/0x60 LBR
/// layout.
pub fn predicted_flag_supported(model: &CpuModel) -> bool {
    model.lbr_layout != LbrLayout::Core2
}

/// Why no BTS record was written. Every cause is distinct so the caller can count and log
/// each once (the same classes as the PEBS assist's drop causes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BtsDropCause {
    /// IA32_DS_AREA (or a field address) is non-canonical, too wide or wraps.
    DsAreaNonCanonical,
    /// The DS area is not mapped.
    DsAreaNotPresent,
    /// A paging entry mapping the DS area has reserved bits set.
    DsAreaReservedBit,
    /// The DS area or its page tables are not guest RAM.
    DsAreaNotRam,
    /// BTS Index cannot be written (read-only mapping with CR0.WP).
    DsAreaReadOnly,
    /// BTS Buffer Base > BTS Absolute Maximum.
    BaseAboveMaximum,
    /// BTS Index < BTS Buffer Base.
    IndexBelowBase,
    /// BTS Index > BTS Absolute Maximum.
    IndexPastMaximum,
    /// BTINT set and the record does not fit before the absolute maximum.
    BufferFull,
    /// Circular mode and not even one record fits between base and absolute maximum (SDM:
    /// "the results of BTS is undefined"; nothing is written).
    BufferTooSmall,
    /// The record's range is non-canonical or too wide.
    BufferNonCanonical,
    /// The record's range is not mapped.
    BufferNotPresent,
    /// A paging entry mapping the record's range has reserved bits set.
    BufferReservedBit,
    /// The record's range or its page tables are not guest RAM.
    BufferNotRam,
    /// The record's range is read-only with CR0.WP set.
    BufferReadOnly,
}

impl BtsDropCause {
    /// Short stable name for logs and counters.
    pub fn name(self) -> &'static str {
        match self {
            BtsDropCause::DsAreaNonCanonical => "bts-ds-area-non-canonical",
            BtsDropCause::DsAreaNotPresent => "bts-ds-area-not-present",
            BtsDropCause::DsAreaReservedBit => "bts-ds-area-reserved-bit",
            BtsDropCause::DsAreaNotRam => "bts-ds-area-not-ram",
            BtsDropCause::DsAreaReadOnly => "bts-ds-area-read-only",
            BtsDropCause::BaseAboveMaximum => "bts-base-above-maximum",
            BtsDropCause::IndexBelowBase => "bts-index-below-base",
            BtsDropCause::IndexPastMaximum => "bts-index-past-maximum",
            BtsDropCause::BufferFull => "bts-buffer-full",
            BtsDropCause::BufferTooSmall => "bts-buffer-too-small",
            BtsDropCause::BufferNonCanonical => "bts-buffer-non-canonical",
            BtsDropCause::BufferNotPresent => "bts-buffer-not-present",
            BtsDropCause::BufferReservedBit => "bts-buffer-reserved-bit",
            BtsDropCause::BufferNotRam => "bts-buffer-not-ram",
            BtsDropCause::BufferReadOnly => "bts-buffer-read-only",
        }
    }

    fn ds_area(e: PagingError) -> Self {
        match e {
            PagingError::NonCanonical { .. }
            | PagingError::AddressTooWide { .. }
            | PagingError::RangeWraps { .. } => BtsDropCause::DsAreaNonCanonical,
            PagingError::NotPresent { .. } => BtsDropCause::DsAreaNotPresent,
            PagingError::ReservedBit { .. } => BtsDropCause::DsAreaReservedBit,
            PagingError::TableNotRam { .. } | PagingError::NotRam { .. } => {
                BtsDropCause::DsAreaNotRam
            }
            PagingError::ReadOnly { .. } => BtsDropCause::DsAreaReadOnly,
        }
    }

    fn buffer(e: PagingError) -> Self {
        match e {
            PagingError::NonCanonical { .. }
            | PagingError::AddressTooWide { .. }
            | PagingError::RangeWraps { .. } => BtsDropCause::BufferNonCanonical,
            PagingError::NotPresent { .. } => BtsDropCause::BufferNotPresent,
            PagingError::ReservedBit { .. } => BtsDropCause::BufferReservedBit,
            PagingError::TableNotRam { .. } | PagingError::NotRam { .. } => {
                BtsDropCause::BufferNotRam
            }
            PagingError::ReadOnly { .. } => BtsDropCause::BufferReadOnly,
        }
    }

    fn from_ds(e: DsError) -> Self {
        match e {
            DsError::Field { source, .. } => BtsDropCause::ds_area(source),
            DsError::AddressOverflow { .. } | DsError::ResetSlot { .. } => {
                BtsDropCause::DsAreaNonCanonical
            }
            DsError::BaseAboveMaximum { .. } => BtsDropCause::BaseAboveMaximum,
            DsError::IndexBelowBase { .. } => BtsDropCause::IndexBelowBase,
            DsError::IndexPastMaximum { .. } | DsError::ThresholdPastMaximum { .. } => {
                BtsDropCause::IndexPastMaximum
            }
        }
    }
}

impl fmt::Display for BtsDropCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one BTS store did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BtsOutcome {
    /// A record was written and BTS Index advanced.
    pub written: bool,
    /// The circular buffer wrapped to its base before this record.
    pub wrapped: bool,
    /// BTINT is set and BTS Index reached the interrupt threshold: request a PMI.
    pub threshold_reached: bool,
    /// Why nothing was written.
    pub dropped: Option<BtsDropCause>,
}

/// The 24 bytes of one record: from, to, flags (bit 4 = predicted).
pub fn encode_record(from: u64, to: u64, predicted: bool) -> [u8; BTS_RECORD_SIZE] {
    let mut r = [0u8; BTS_RECORD_SIZE];
    let flags = if predicted { BTS_FLAG_PREDICTED } else { 0 };
    for (chunk, v) in r.chunks_exact_mut(8).zip([from, to, flags]) {
        chunk.copy_from_slice(&v.to_le_bytes());
    }
    r
}

fn dropped(cause: BtsDropCause) -> BtsOutcome {
    BtsOutcome {
        dropped: Some(cause),
        ..BtsOutcome::default()
    }
}

/// Stores one BTS record for the DS area at `ds_area` (guest linear), translating through
/// `paging`. Order: read the DS fields, validate the BTS window, pick the slot (wrap or drop
/// when full), check the record range and the index field translate writable into RAM, then
/// write the record and the new index. A failure before the writes leaves memory untouched.
pub fn store(
    mem: &mut dyn GuestMemory,
    paging: &PagingRegs,
    ds_area: u64,
    record: &[u8; BTS_RECORD_SIZE],
    btint: bool,
) -> BtsOutcome {
    let mut lm = LinearMemory::new(mem, PageWalker::new(*paging));
    let area = match DsArea::read(&lm, ds_area) {
        Ok(a) => a,
        Err(e) => return dropped(BtsDropCause::from_ds(e)),
    };
    let mut b = area.bts;
    if b.base > b.abs_max {
        return dropped(BtsDropCause::BaseAboveMaximum);
    }
    if b.index < b.base {
        return dropped(BtsDropCause::IndexBelowBase);
    }
    if b.index > b.abs_max {
        return dropped(BtsDropCause::IndexPastMaximum);
    }
    let mut wrapped = false;
    if !b.fits(RECORD_BYTES) {
        if btint {
            return dropped(BtsDropCause::BufferFull);
        }
        b.index = b.base;
        wrapped = true;
        if !b.fits(RECORD_BYTES) {
            return dropped(BtsDropCause::BufferTooSmall);
        }
    }
    if let Err(e) = lm.check_writable(b.index, BTS_RECORD_SIZE) {
        return dropped(BtsDropCause::buffer(e));
    }
    if let Err(e) = ds::check_field_writable(&lm, ds_area, ds::DS_BTS_INDEX) {
        return dropped(BtsDropCause::from_ds(e));
    }
    if let Err(e) = lm.write(b.index, record) {
        return dropped(BtsDropCause::buffer(e));
    }
    // `fits` checked index + 24 <= abs_max, so this cannot overflow.
    let new_index = b.index + RECORD_BYTES;
    if let Err(e) = ds::write_bts_index(&mut lm, ds_area, new_index) {
        return dropped(BtsDropCause::from_ds(e));
    }
    BtsOutcome {
        written: true,
        wrapped,
        threshold_reached: btint && new_index >= b.threshold,
        dropped: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ds::{DS_BTS_ABSOLUTE_MAXIMUM, DS_BTS_INDEX, DS_BTS_INTERRUPT_THRESHOLD};
    use crate::mem::VecMemory;

    const DS: u64 = 0x1000;
    const BUF: u64 = 0x2000;

    fn setup(index: u64, max: u64, threshold: u64) -> VecMemory {
        let mut m = VecMemory::new(0x4000);
        m.write_u64(DS, BUF).unwrap();
        m.write_u64(DS + DS_BTS_INDEX, index).unwrap();
        m.write_u64(DS + DS_BTS_ABSOLUTE_MAXIMUM, max).unwrap();
        m.write_u64(DS + DS_BTS_INTERRUPT_THRESHOLD, threshold)
            .unwrap();
        m
    }

    fn index(m: &VecMemory) -> u64 {
        let mut b = [0u8; 8];
        m.read_phys(DS + DS_BTS_INDEX, &mut b).unwrap();
        u64::from_le_bytes(b)
    }

    #[test]
    fn controls_follow_the_sdm_table() {
        let c = BtsControl::from_debugctl(PmuArch::Architectural, DEBUGCTL_TR | DEBUGCTL_BTS);
        assert!(c.active() && c.stores(0) && c.stores(3));
        let c = BtsControl::from_debugctl(PmuArch::Architectural, DEBUGCTL_BTS);
        assert!(!c.active() && !c.stores(0), "BTS without TR stores nothing");
        let c = BtsControl::from_debugctl(
            PmuArch::Architectural,
            DEBUGCTL_TR | DEBUGCTL_BTS | DEBUGCTL_BTS_OFF_OS,
        );
        assert!(!c.stores(0) && c.stores(1));
        let c = BtsControl::from_debugctl(
            PmuArch::Architectural,
            DEBUGCTL_TR | DEBUGCTL_BTS | DEBUGCTL_BTS_OFF_OS | DEBUGCTL_BTS_OFF_USR,
        );
        assert!(!c.active());
        let c = BtsControl::from_debugctl(
            PmuArch::Netburst,
            NETBURST_DEBUGCTLA_TR | NETBURST_DEBUGCTLA_BTS | NETBURST_DEBUGCTLA_BTS_OFF_USR,
        );
        assert!(c.stores(0) && !c.stores(3));
    }

    #[test]
    fn record_layout() {
        let r = encode_record(0x1122, 0x3344, true);
        assert_eq!(u64::from_le_bytes(r[0..8].try_into().unwrap()), 0x1122);
        assert_eq!(u64::from_le_bytes(r[8..16].try_into().unwrap()), 0x3344);
        assert_eq!(u64::from_le_bytes(r[16..24].try_into().unwrap()), 0x10);
        assert_eq!(&encode_record(1, 2, false)[16..], &[0u8; 8]);
    }

    #[test]
    fn circular_wrap_and_interrupt_mode() {
        let rec = encode_record(0xA, 0xB, true);
        let paging = PagingRegs::default();
        // Room for two records.
        let mut m = setup(BUF, BUF + 48, u64::MAX);
        for _ in 0..2 {
            assert!(store(&mut m, &paging, DS, &rec, false).written);
        }
        assert_eq!(index(&m), BUF + 48);
        let o = store(&mut m, &paging, DS, &rec, false);
        assert!(o.written && o.wrapped && !o.threshold_reached);
        assert_eq!(index(&m), BUF + 24);
        // BTINT: threshold at the second record, then full.
        let mut m = setup(BUF, BUF + 48, BUF + 48);
        assert!(!store(&mut m, &paging, DS, &rec, true).threshold_reached);
        assert!(store(&mut m, &paging, DS, &rec, true).threshold_reached);
        let o = store(&mut m, &paging, DS, &rec, true);
        assert_eq!(o.dropped, Some(BtsDropCause::BufferFull));
        assert_eq!(index(&m), BUF + 48);
        // A buffer smaller than one record.
        let mut m = setup(BUF, BUF + 23, u64::MAX);
        let o = store(&mut m, &paging, DS, &rec, false);
        assert_eq!(o.dropped, Some(BtsDropCause::BufferTooSmall));
    }

    #[test]
    fn bad_windows_write_nothing() {
        let rec = encode_record(0xA, 0xB, true);
        let paging = PagingRegs::default();
        let cases = [
            (BUF - 8, BUF + 48, BtsDropCause::IndexBelowBase),
            (BUF + 56, BUF + 48, BtsDropCause::IndexPastMaximum),
        ];
        for (idx, max, cause) in cases {
            let mut m = setup(idx, max, u64::MAX);
            let before = m.clone();
            assert_eq!(store(&mut m, &paging, DS, &rec, false).dropped, Some(cause));
            assert!(m == before, "{cause}: memory changed");
        }
        let mut m = setup(BUF, BUF - 24, u64::MAX);
        assert_eq!(
            store(&mut m, &paging, DS, &rec, false).dropped,
            Some(BtsDropCause::BaseAboveMaximum)
        );
        // Buffer past the end of RAM.
        let mut m = setup(BUF, BUF + 48, u64::MAX);
        m.write_u64(DS, 0x3FF0).unwrap();
        m.write_u64(DS + DS_BTS_INDEX, 0x3FF0).unwrap();
        m.write_u64(DS + DS_BTS_ABSOLUTE_MAXIMUM, 0x5000).unwrap();
        let before = m.clone();
        assert_eq!(
            store(&mut m, &paging, DS, &rec, false).dropped,
            Some(BtsDropCause::BufferNotRam)
        );
        assert!(m == before);
        // DS area past the end of RAM.
        let mut m = VecMemory::new(0x4000);
        assert_eq!(
            store(&mut m, &paging, 0x3FF8, &rec, false).dropped,
            Some(BtsDropCause::DsAreaNotRam)
        );
    }
}
