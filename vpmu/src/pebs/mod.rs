//! The software PEBS assist: what the processor does when a PEBS-enabled counter overflows
//! (SDM 17.4.9, 18.4.4, 18.6.2.4, 18.9, 18.15.7): write one record at PEBS Index if it fits,
//! advance the index, reload the counters from their reset slots and report whether the
//! interrupt threshold was reached.
//!
//! The DS area and the buffer are guest *linear* addresses, translated through the guest's page
//! tables at every assist ([`crate::paging`]); the DS fields are re-read every time
//! ([`crate::ds`]). Bad guest input never panics and never writes outside guest RAM or outside
//! `[PEBS Buffer Base, PEBS Absolute Maximum)`; it yields a [`DropCause`].

pub mod adaptive;
pub mod decode;
pub mod legacy;
pub mod record;

use std::fmt;

use crate::ds::{self, DsArea, DsError};
use crate::mem::GuestMemory;
use crate::model::{CpuModel, PebsFormat, PmuArch};
use crate::paging::{LinearMemory, PageWalker, PagingError, PagingMode};
use crate::state::{EventInfo, Gprs, GuestState, LbrEntry};

pub use adaptive::{adaptive_record_size, encode_adaptive, lbr_entries};
pub use decode::{DecodeError, decode_buffer, decode_record, read_pebs_buffer};
pub use legacy::{
    encode_fmt0, encode_fmt1, encode_fmt2, encode_fmt3, encode_netburst, legacy_record_size,
};
pub use record::PebsRecord;

/// Everything the assist needs, gathered by the PMU state machine at a PEBS counter overflow.
#[derive(Debug, Clone, Copy)]
pub struct AssistRequest<'a> {
    /// The CPU model (record format, trap-like IPs, counter counts).
    pub model: &'a CpuModel,
    /// IA32_DS_AREA (guest linear address).
    pub ds_area: u64,
    /// MSR_PEBS_DATA_CFG as it applies to this record (adaptive formats). Per SDM 18.9.2.2 the
    /// groups are written only if a triggering counter has its Adaptive_Record bit set
    /// (PERFEVTSELx bit 34 / FIXED_CTR_CTRL bit 32+4i); pass 0 otherwise for a basic-only record.
    pub data_cfg: u64,
    /// Overflowed PEBS counters, IA32_PERF_GLOBAL_STATUS bit layout: GP n -> bit n, fixed i ->
    /// bit 32+i (NetBurst IQ_COUNTER4 -> bit 0).
    pub applicable: u64,
    /// IA32_PERF_GLOBAL_STATUS before the assist.
    pub global_status: u64,
    /// MSR_PEBS_LD_LAT_THRESHOLD.
    pub ld_lat_threshold: u64,
    /// Registers after the causing instruction, paging registers, CPL, TSC, XMM.
    pub state: &'a GuestState,
    /// Eventing IP, data address/source/latency.
    pub event: &'a EventInfo,
    /// LBR stack, newest first; may be empty.
    pub lbr: &'a [LbrEntry],
}

/// Why the assist wrote no record. Every cause is distinct so the caller can count and log
/// each once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DropCause {
    /// The model has no PEBS.
    NoPebsFormat,
    /// `applicable` names no counter of the model.
    NoApplicableCounter,
    /// IA32_DS_AREA (or a field address) is non-canonical, too wide for the paging mode, or
    /// wraps.
    DsAreaNonCanonical,
    /// The DS area is not mapped (a paging entry is not present).
    DsAreaNotPresent,
    /// A paging entry mapping the DS area has reserved bits set.
    DsAreaReservedBit,
    /// The DS area or its page tables are not guest RAM (MMIO, hole, past the end).
    DsAreaNotRam,
    /// PEBS Index cannot be written (read-only mapping with CR0.WP).
    DsAreaReadOnly,
    /// A counter-reset slot could not be read.
    ResetSlotUnreadable,
    /// PEBS Buffer Base > PEBS Absolute Maximum.
    BaseAboveMaximum,
    /// PEBS Index < PEBS Buffer Base.
    IndexBelowBase,
    /// PEBS Index > PEBS Absolute Maximum.
    IndexPastMaximum,
    /// PEBS Interrupt Threshold > PEBS Absolute Maximum.
    ThresholdPastMaximum,
    /// The record does not fit before the absolute maximum: the buffer is full (hardware drops
    /// silently: no record, no signal).
    BufferFull,
    /// The record's linear range at PEBS Index is non-canonical or too wide.
    BufferNonCanonical,
    /// The record's range is not mapped.
    BufferNotPresent,
    /// A paging entry mapping the record's range has reserved bits set.
    BufferReservedBit,
    /// The record's range or its page tables are not guest RAM.
    BufferNotRam,
    /// The record's range is mapped read-only with CR0.WP set.
    BufferReadOnly,
}

impl DropCause {
    /// Short stable name for logs and counters.
    pub fn name(self) -> &'static str {
        match self {
            DropCause::NoPebsFormat => "no-pebs-format",
            DropCause::NoApplicableCounter => "no-applicable-counter",
            DropCause::DsAreaNonCanonical => "ds-area-non-canonical",
            DropCause::DsAreaNotPresent => "ds-area-not-present",
            DropCause::DsAreaReservedBit => "ds-area-reserved-bit",
            DropCause::DsAreaNotRam => "ds-area-not-ram",
            DropCause::DsAreaReadOnly => "ds-area-read-only",
            DropCause::ResetSlotUnreadable => "reset-slot-unreadable",
            DropCause::BaseAboveMaximum => "base-above-maximum",
            DropCause::IndexBelowBase => "index-below-base",
            DropCause::IndexPastMaximum => "index-past-maximum",
            DropCause::ThresholdPastMaximum => "threshold-past-maximum",
            DropCause::BufferFull => "buffer-full",
            DropCause::BufferNonCanonical => "buffer-non-canonical",
            DropCause::BufferNotPresent => "buffer-not-present",
            DropCause::BufferReservedBit => "buffer-reserved-bit",
            DropCause::BufferNotRam => "buffer-not-ram",
            DropCause::BufferReadOnly => "buffer-read-only",
        }
    }

    /// Whether this is the architectural "buffer full" case rather than bad guest state.
    pub fn is_buffer_full(self) -> bool {
        self == DropCause::BufferFull
    }

    /// The DS-area cause for a paging failure.
    fn ds_area(e: PagingError) -> Self {
        match e {
            PagingError::NonCanonical { .. }
            | PagingError::AddressTooWide { .. }
            | PagingError::RangeWraps { .. } => DropCause::DsAreaNonCanonical,
            PagingError::NotPresent { .. } => DropCause::DsAreaNotPresent,
            PagingError::ReservedBit { .. } => DropCause::DsAreaReservedBit,
            PagingError::TableNotRam { .. } | PagingError::NotRam { .. } => DropCause::DsAreaNotRam,
            PagingError::ReadOnly { .. } => DropCause::DsAreaReadOnly,
        }
    }

    /// The buffer cause for a paging failure.
    fn buffer(e: PagingError) -> Self {
        match e {
            PagingError::NonCanonical { .. }
            | PagingError::AddressTooWide { .. }
            | PagingError::RangeWraps { .. } => DropCause::BufferNonCanonical,
            PagingError::NotPresent { .. } => DropCause::BufferNotPresent,
            PagingError::ReservedBit { .. } => DropCause::BufferReservedBit,
            PagingError::TableNotRam { .. } | PagingError::NotRam { .. } => DropCause::BufferNotRam,
            PagingError::ReadOnly { .. } => DropCause::BufferReadOnly,
        }
    }

    fn from_ds(e: DsError) -> Self {
        match e {
            DsError::Field { source, .. } => DropCause::ds_area(source),
            DsError::ResetSlot { .. } => DropCause::ResetSlotUnreadable,
            DsError::AddressOverflow { .. } => DropCause::DsAreaNonCanonical,
            DsError::BaseAboveMaximum { .. } => DropCause::BaseAboveMaximum,
            DsError::IndexBelowBase { .. } => DropCause::IndexBelowBase,
            DsError::IndexPastMaximum { .. } => DropCause::IndexPastMaximum,
            DsError::ThresholdPastMaximum { .. } => DropCause::ThresholdPastMaximum,
        }
    }
}

impl fmt::Display for DropCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the assist did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssistOutcome {
    /// A record was written at PEBS Index and the index advanced.
    pub written: bool,
    /// (GLOBAL_STATUS bit of each applicable counter, value of its counter-reset slot). Filled
    /// whenever the DS area and the slots are readable, also when the buffer is full (the
    /// counter is reset by the assist whether or not a record fits). The caller masks to width.
    pub reloads: Vec<(u32, u64)>,
    /// PEBS Index >= PEBS Interrupt Threshold after the write: the caller sets OvfBuffer
    /// (GLOBAL_STATUS bit 62) and requests a PMI. Never set when nothing was written.
    pub threshold_reached: bool,
    /// Why nothing was written.
    pub dropped: Option<DropCause>,
}

/// The counter bits of `model` in IA32_PERF_GLOBAL_STATUS layout.
fn counter_mask(model: &CpuModel) -> u64 {
    if model.arch == PmuArch::Netburst || model.pebs_format == PebsFormat::Netburst {
        return 1;
    }
    model.global_counter_bits()
}

/// Registers as the record stores them: outside IA-32e mode 32-bit values with bits 63:32
/// zeroed and R8-R15 zero (SDM 18.6.2.4 / Table 18-23 notes).
fn recorded_gprs(state: &GuestState, ip: u64) -> Gprs {
    let mut g = Gprs {
        rip: ip,
        ..state.gprs
    };
    if PagingMode::from_regs(&state.paging).is_ia32e() {
        return g;
    }
    let low = |v: u64| v & u64::from(u32::MAX);
    g = Gprs {
        rax: low(g.rax),
        rbx: low(g.rbx),
        rcx: low(g.rcx),
        rdx: low(g.rdx),
        rsi: low(g.rsi),
        rdi: low(g.rdi),
        rbp: low(g.rbp),
        rsp: low(g.rsp),
        rip: low(g.rip),
        rflags: low(g.rflags),
        ..Gprs::default()
    };
    g
}

/// Builds the record the assist writes for `req` (without writing it).
///
/// - IP field: trap-like (`state.gprs.rip`, the instruction after) when the model reports
///   IA32_PERF_CAPABILITIES[6] (SDM 18.6.2.4: "the RIP reported in the PEBS record will point to
///   the instruction after (+1) the instruction that causes the PEBS assist"; Core 2 and later
///   report it); otherwise fault-like, the eventing IP. Registers are always those after the
///   instruction.
/// - Format 1/2 offset 0x90: IA32_PERF_GLOBAL_STATUS before the assist, which on hardware
///   already has the overflowing counters' bits set, hence `global_status | applicable`. Linux
///   (`intel_pmu_drain_pebs_nhm`) masks it with the PEBS-enabled counters and drops records
///   naming more than one of them as collisions; that is the hardware behaviour format 3 fixed.
/// - Format 3 offset 0x90 and the adaptive basic group: the applicable counters only.
/// - Latency: the load latency for memory events whose latency exceeds
///   MSR_PEBS_LD_LAT_THRESHOLD (the load-latency facility only tags loads above it); 0 otherwise.
/// - TSX tuning: 0 (no transactional execution is emulated).
pub fn capture_record(req: &AssistRequest<'_>) -> PebsRecord {
    let format = req.model.pebs_format;
    let state = req.state;
    let ev = req.event;
    let applicable = req.applicable & counter_mask(req.model);
    let ip = if req.model.pebs_trap {
        state.gprs.rip
    } else {
        ev.eventing_ip
    };
    let gprs = recorded_gprs(state, ip);
    let latency = if ev.data_addr.is_some() && ev.latency > req.ld_lat_threshold {
        ev.latency
    } else {
        0
    };
    let mut r = PebsRecord::empty(format);
    match format {
        PebsFormat::None => {}
        PebsFormat::Netburst | PebsFormat::Fmt0 => r.gprs = Some(gprs),
        PebsFormat::Fmt1 | PebsFormat::Fmt2 | PebsFormat::Fmt3 => {
            r.gprs = Some(gprs);
            if format == PebsFormat::Fmt3 {
                r.applicable = Some(applicable);
                r.tsc = Some(state.tsc);
            } else {
                r.global_status = Some(req.global_status | applicable);
            }
            r.data_addr = Some(ev.data_addr.unwrap_or(0));
            r.data_source = Some(ev.data_source);
            r.latency = Some(latency);
            if format != PebsFormat::Fmt1 {
                r.eventing_ip = Some(ev.eventing_ip);
                r.tsx_tuning = Some(0);
            }
        }
        PebsFormat::Fmt4 | PebsFormat::Fmt5 => {
            use crate::msr::{PEBS_DATACFG_GPRS, PEBS_DATACFG_MEMINFO, PEBS_DATACFG_XMMS};
            let cfg = req.data_cfg & adaptive::RECORD_FORMAT_MASK;
            r.record_format = Some(cfg);
            r.eventing_ip = Some(ev.eventing_ip);
            r.applicable = Some(applicable);
            r.tsc = Some(state.tsc);
            if cfg & PEBS_DATACFG_MEMINFO != 0 {
                r.data_addr = Some(ev.data_addr.unwrap_or(0));
                r.data_source = Some(ev.data_source);
                r.latency = Some(latency);
                r.tsx_tuning = Some(0);
            }
            if cfg & PEBS_DATACFG_GPRS != 0 {
                r.gprs = Some(gprs);
            }
            if cfg & PEBS_DATACFG_XMMS != 0 {
                r.xmm = Some(state.xmm);
            }
            let n = lbr_entries(cfg);
            if n > 0 {
                let mut l: Vec<LbrEntry> = req.lbr.iter().take(n).copied().collect();
                l.resize(n, LbrEntry::default());
                r.lbr = Some(l);
            }
        }
    }
    r
}

/// Encodes `rec` in its format; `None` for [`PebsFormat::None`].
pub fn encode(rec: &PebsRecord) -> Option<Vec<u8>> {
    Some(match rec.format {
        PebsFormat::None => return None,
        PebsFormat::Netburst => encode_netburst(rec),
        PebsFormat::Fmt0 => encode_fmt0(rec),
        PebsFormat::Fmt1 => encode_fmt1(rec),
        PebsFormat::Fmt2 => encode_fmt2(rec),
        PebsFormat::Fmt3 => encode_fmt3(rec),
        PebsFormat::Fmt4 | PebsFormat::Fmt5 => encode_adaptive(rec),
    })
}

fn dropped(cause: DropCause, reloads: Vec<(u32, u64)>) -> AssistOutcome {
    AssistOutcome {
        written: false,
        reloads,
        threshold_reached: false,
        dropped: Some(cause),
    }
}

/// Performs one PEBS assist. See the module documentation.
///
/// Order: read the DS fields and the reset slots, validate the PEBS window, build the record,
/// check it fits (`index + size <= absolute maximum`), check the whole record range and the
/// index field translate writable into RAM, then write the record and the new index. A failure
/// before the writes leaves guest memory untouched.
pub fn assist(mem: &mut dyn GuestMemory, req: &AssistRequest<'_>) -> AssistOutcome {
    let format = req.model.pebs_format;
    if format == PebsFormat::None {
        return dropped(DropCause::NoPebsFormat, Vec::new());
    }
    let applicable = req.applicable & counter_mask(req.model);
    if applicable == 0 {
        return dropped(DropCause::NoApplicableCounter, Vec::new());
    }
    let mut lm = LinearMemory::new(mem, PageWalker::new(req.state.paging));
    let area = match DsArea::read(&lm, req.ds_area) {
        Ok(a) => a,
        Err(e) => return dropped(DropCause::from_ds(e), Vec::new()),
    };

    let mut reloads = Vec::new();
    for bit in (0..64u32).filter(|b| applicable & (1u64 << b) != 0) {
        let Some(slot) = ds::counter_reset_slot(format, bit) else {
            continue;
        };
        match ds::read_counter_reset(&lm, req.ds_area, slot) {
            Ok(v) => reloads.push((bit, v)),
            Err(e) => return dropped(DropCause::from_ds(e), Vec::new()),
        }
    }

    let pebs = area.pebs;
    if let Err(e) = pebs.validate() {
        return dropped(DropCause::from_ds(e), reloads);
    }
    let rec = capture_record(req);
    let Some(bytes) = encode(&rec) else {
        return dropped(DropCause::NoPebsFormat, reloads);
    };
    // Record sizes are at most a few KiB.
    let size = bytes.len() as u64;
    if !pebs.fits(size) {
        return dropped(DropCause::BufferFull, reloads);
    }
    if let Err(e) = lm.check_writable(pebs.index, bytes.len()) {
        return dropped(DropCause::buffer(e), reloads);
    }
    if let Err(e) = ds::check_field_writable(&lm, req.ds_area, ds::DS_PEBS_INDEX) {
        return dropped(DropCause::from_ds(e), reloads);
    }
    if let Err(e) = lm.write(pebs.index, &bytes) {
        return dropped(DropCause::buffer(e), reloads);
    }
    let new_index = pebs.index + size;
    if let Err(e) = ds::write_pebs_index(&mut lm, req.ds_area, new_index) {
        // Unreachable after the writability check above; report it rather than panic.
        return dropped(DropCause::from_ds(e), reloads);
    }
    AssistOutcome {
        written: true,
        reloads,
        threshold_reached: new_index >= pebs.threshold,
        dropped: None,
    }
}
