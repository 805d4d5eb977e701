//! Fuzz target `msr_traps`: a sequence of vPMU operations against the in-memory
//! [`FuzzGuest`], with invariants checked after every operation.
//!
//! # Input
//!
//! A `vpmu-trace` text ([`crate::trace`]) is replayed as operations (its recorded results are
//! not compared: that is `vmm replay`'s job). Any other input is binary: one byte picks the
//! model preset, then each operation is an opcode byte and its operands ([`Bytes`] reads zeros
//! past the end): RDMSR, WRMSR (index from the model's PMU MSRs, any trapped index or raw; value
//! raw or masked to the reference's writable bits), RDPMC, counter progress (deltas raw or
//! relative to the distance to the wrap, followed by `handle_overflow` as `sync_backend` does),
//! a direct `handle_overflow`, a paging change (every mode, or a raw CR3), a guest store into
//! the DS area, the page tables or anywhere in RAM, and taking the PMI request.
//!
//! # Invariants
//!
//! - No panic, whatever the input.
//! - Guest memory: every write the vPMU makes lies in guest RAM; an overflow that writes no
//!   PEBS record writes nothing; one that writes a record writes only the physical bytes of
//!   `[old PEBS Index, new PEBS Index)` and of the PEBS Index field, as the reference walker
//!   translates them before the assist, with `Base <= old Index < new Index <= Absolute
//!   Maximum` (the index never passes the maximum by our write).
//! - WRMSR: for the MSR classes the reference models (PMCx, A_PMCx, PERFEVTSELx, fixed
//!   counters, FIXED_CTR_CTRL, GLOBAL_CTRL, GLOBAL_OVF_CTRL, GLOBAL_STATUS(_SET), PEBS_ENABLE,
//!   PEBS_DATA_CFG, DS_AREA) acceptance matches the reference's writable mask and a refused
//!   write reports exactly the reserved bits; any refused write leaves every readable MSR, the
//!   counting programs and the generation unchanged; after an accepted write RDMSR returns the
//!   reference's value (the written value for plain registers; sign extension for PMCx; 0 for
//!   the write-to-clear/set registers; the read-only bits kept for MISC_ENABLE).
//! - Counting: `add_counts` adds each delta to exactly the counters the reference considers
//!   counting (enabled, USR or OS, globally enabled, not frozen by CTR_Frz), modulo the width,
//!   and reports as wrapped exactly those whose sum passed the width, each once; `programs()`
//!   lists exactly those counters. RDPMC and RDMSR of a counter agree with `counter_value`.
//! - GLOBAL_STATUS (architectural v2+) equals a reference status that starts at 0 and changes
//!   only by: OVF_CTRL clears the written bits; STATUS_SET sets them; `handle_overflow` sets the
//!   bit of every wrapped counter of the model (PEBS or not, counting or not), OvfBuffer (62)
//!   when a record reaches the interrupt threshold, and on a PMI CTR_Frz (59) / LBR_Frz (58) on
//!   v4+ when DEBUGCTL asks for the freeze. On v2/v3 a freezing PMI clears GLOBAL_CTRL (and
//!   DEBUGCTL.LBR for FREEZE_LBRS_ON_PMI).
//! - `handle_overflow`: requests a PMI exactly when a wrapped counter has its INT/PMI bit or the
//!   record reached the threshold; `pebs_counters` is exactly the wrapped counters with PEBS
//!   enabled; one assist either writes one record or reports one drop cause;
//!   `take_pmi_request` returns whether a PMI was requested since the last call.

use std::ops::Range;
use std::sync::OnceLock;

use super::Bytes;
use super::guest::{DS_AREA, FuzzGuest, KERNEL_ALIAS, PEBS_BASE, PEBS_MAX, RAM_SIZE};
use super::reference::reference_translate;
use crate::counter::{CounterId, CounterProgram};
use crate::mem::GuestMemory;
use crate::model::{CpuModel, PebsFormat, PmuArch, low_bits};
use crate::msr::*;
use crate::pmu::{MsrError, Vpmu, trapped_msrs};
use crate::state::{EventInfo, GuestState, PagingRegs};
use crate::trace::{TraceEvent, is_trace, parse_trace};

/// How much a counter advances.
#[derive(Debug, Clone, Copy)]
enum Delta {
    Raw(u64),
    /// The distance to the wrap plus this (may be negative): hits the boundary.
    ToWrap(i8),
}

/// One operation of the sequence.
#[derive(Debug, Clone)]
enum Op {
    Rdmsr(u32),
    Wrmsr(u32, u64),
    Rdpmc(u32),
    Count {
        deltas: Vec<(CounterId, Delta)>,
        then_overflow: bool,
    },
    Overflow(Vec<CounterId>),
    Paging(PagingRegs),
    GuestWrite {
        gpa: u64,
        value: u64,
    },
    TakePmi,
}

/// The MSRs the binary decoder picks from most often.
fn key_msrs(m: &CpuModel) -> Vec<u32> {
    let mut v = vec![
        IA32_FIXED_CTR_CTRL,
        IA32_PERF_GLOBAL_STATUS,
        IA32_PERF_GLOBAL_CTRL,
        IA32_PERF_GLOBAL_OVF_CTRL,
        IA32_PERF_GLOBAL_STATUS_SET,
        IA32_PERF_GLOBAL_INUSE,
        IA32_PERF_CAPABILITIES,
        IA32_DEBUGCTL,
        IA32_MISC_ENABLE,
        IA32_DS_AREA,
        IA32_PEBS_ENABLE,
        MSR_PEBS_DATA_CFG,
        MSR_PEBS_LD_LAT_THRESHOLD,
        MSR_PEBS_FRONTEND,
        MSR_LBR_SELECT,
        MSR_LASTBRANCH_TOS,
    ];
    for n in 0..u32::from(MAX_GP_COUNTERS) {
        v.extend([IA32_PMC0 + n, IA32_A_PMC0 + n, IA32_PERFEVTSEL0 + n]);
    }
    for i in 0..u32::from(MAX_FIXED_COUNTERS) {
        v.push(IA32_FIXED_CTR0 + i);
    }
    if m.arch == PmuArch::Netburst {
        v.extend([MSR_IQ_COUNTER4, MSR_IQ_CCCR4, MSR_CRU_ESCR0, MSR_CRU_ESCR2]);
        v.extend((0..NETBURST_NUM_COUNTERS).map(|c| MSR_BPU_CCCR0 + c));
    }
    v
}

/// Every index the VMM routes to the vPMU for `m`.
fn trapped_indices(m: &CpuModel) -> Vec<u32> {
    static CACHE: OnceLock<Vec<(String, Vec<u32>)>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| {
        super::presets()
            .iter()
            .map(|p| {
                (
                    p.name.clone(),
                    trapped_msrs(p).into_iter().flatten().collect(),
                )
            })
            .collect()
    });
    match cache.iter().find(|(n, _)| *n == m.name) {
        Some((_, v)) => v.clone(),
        None => trapped_msrs(m).into_iter().flatten().collect(),
    }
}

fn counters_of(m: &CpuModel) -> Vec<CounterId> {
    match m.arch {
        PmuArch::Netburst => (0..u8::try_from(NETBURST_NUM_COUNTERS).unwrap_or(0))
            .map(CounterId::Netburst)
            .collect(),
        PmuArch::Architectural => (0..m.num_gp)
            .map(CounterId::Gp)
            .chain((0..MAX_FIXED_COUNTERS).map(CounterId::Fixed))
            .collect(),
    }
}

struct Decoder<'a> {
    b: Bytes<'a>,
    keys: Vec<u32>,
    trapped: Vec<u32>,
    counters: Vec<CounterId>,
    model: CpuModel,
}

impl Decoder<'_> {
    fn msr(&mut self) -> u32 {
        match self.b.u8() {
            0..=199 => self.keys[self.b.below(self.keys.len())],
            200..=249 => self.trapped[self.b.below(self.trapped.len())],
            _ => self.b.u32(),
        }
    }

    fn counter(&mut self) -> CounterId {
        if self.b.u8() == 0xFF {
            // Sometimes a counter the model does not have.
            return CounterId::Fixed(self.b.u8() % 8);
        }
        self.counters[self.b.below(self.counters.len())]
    }

    fn value_for(&mut self, index: u32) -> u64 {
        let v = self.b.value();
        match self.b.u8() % 4 {
            0 => v,
            _ => reference_mask(&self.model, index).map_or(v, |m| v & m),
        }
    }

    fn guest_value(&mut self) -> u64 {
        match self.b.u8() % 6 {
            0 => PEBS_BASE + 8 * u64::from(self.b.u16() % 0x2000),
            1 => PEBS_MAX - u64::from(self.b.u16() % 0x1000),
            2 => KERNEL_ALIAS + u64::from(self.b.u32()) % RAM_SIZE as u64,
            3 => u64::from(self.b.u32()) % RAM_SIZE as u64,
            _ => self.b.value(),
        }
    }

    fn op(&mut self) -> Op {
        match self.b.u8() % 9 {
            0 => Op::Rdmsr(self.msr()),
            1 | 2 => {
                let i = self.msr();
                let v = self.value_for(i);
                Op::Wrmsr(i, v)
            }
            3 => {
                let ecx = match self.b.u8() % 3 {
                    0 => u32::from(self.b.u8() % 20),
                    1 => RDPMC_FIXED | u32::from(self.b.u8() % 5),
                    _ => self.b.u32(),
                };
                Op::Rdpmc(ecx)
            }
            4 | 5 => {
                let n = 1 + self.b.u8() % 3;
                let deltas = (0..n)
                    .map(|_| {
                        let id = self.counter();
                        let d = if self.b.u8() & 1 == 0 {
                            Delta::Raw(self.b.value())
                        } else {
                            Delta::ToWrap(i8::from_le_bytes([self.b.u8()]) % 4)
                        };
                        (id, d)
                    })
                    .collect();
                Op::Count {
                    deltas,
                    then_overflow: true,
                }
            }
            6 => Op::Overflow((0..1 + self.b.u8() % 3).map(|_| self.counter()).collect()),
            7 => {
                let sel = self.b.u8();
                let mut regs = FuzzGuest::mode_regs(sel);
                if sel >= 0xF0 {
                    regs.cr3 = u64::from(self.b.u32());
                }
                Op::Paging(regs)
            }
            _ => {
                let gpa = match self.b.u8() % 4 {
                    0 | 1 => DS_AREA + 8 * u64::from(self.b.u8() % 48),
                    2 => u64::from(self.b.u16() & !7) % 0xB000,
                    _ => u64::from(self.b.u32()) % RAM_SIZE as u64,
                };
                if self.b.u8() % 8 == 0 {
                    Op::TakePmi
                } else {
                    Op::GuestWrite {
                        gpa,
                        value: self.guest_value(),
                    }
                }
            }
        }
    }
}

/// Decodes `data` into a model and operations.
fn decode(data: &[u8]) -> (CpuModel, Vec<Op>) {
    if is_trace(data) {
        if let Some(r) = decode_trace(data) {
            return r;
        }
    }
    let mut b = Bytes::new(data);
    let presets = super::presets();
    let Some(model) = presets
        .get(usize::from(b.u8()) % presets.len().max(1))
        .cloned()
    else {
        return (fallback_model(), Vec::new());
    };
    let mut d = Decoder {
        b,
        keys: key_msrs(&model),
        trapped: trapped_indices(&model),
        counters: counters_of(&model),
        model: model.clone(),
    };
    let mut ops = Vec::new();
    while !d.b.is_empty() && ops.len() < 512 {
        ops.push(d.op());
    }
    (model, ops)
}

fn fallback_model() -> CpuModel {
    // Presets are compiled in and validated by tests; this cannot fail.
    CpuModel::preset("skylake").unwrap_or_else(|e| panic!("skylake preset: {e}"))
}

/// A trace's events as operations (results are not compared here).
fn decode_trace(data: &[u8]) -> Option<(CpuModel, Vec<Op>)> {
    let text = std::str::from_utf8(data).ok()?;
    let trace = parse_trace(text).ok()?;
    let model = super::presets()
        .iter()
        .find(|m| m.name == trace.header.model)?
        .clone();
    let ops = trace
        .events
        .into_iter()
        .map(|l| match l.event {
            TraceEvent::Rdmsr { index, .. } => Op::Rdmsr(index),
            TraceEvent::Wrmsr { index, value, .. } => Op::Wrmsr(index, value),
            TraceEvent::Rdpmc { ecx, .. } => Op::Rdpmc(ecx),
            TraceEvent::Count { deltas, .. } => Op::Count {
                deltas: deltas
                    .into_iter()
                    .map(|(c, d)| (c, Delta::Raw(d)))
                    .collect(),
                then_overflow: false,
            },
            TraceEvent::Overflow(o) => Op::Overflow(o.counters),
            TraceEvent::Pmi { .. } => Op::TakePmi,
        })
        .collect();
    Some((model, ops))
}

// ---- The reference model (SDM vol. 3B ch. 18 and vol. 4, written independently of pmu/) ----

fn counter_bits(m: &CpuModel) -> u64 {
    let fixed = (0..MAX_FIXED_COUNTERS)
        .filter(|&i| m.has_fixed(i))
        .fold(0u64, |a, i| a | 1 << i);
    low_bits(u32::from(m.num_gp)) | fixed << 32
}

fn any_thread(m: &CpuModel) -> bool {
    m.pmu_version >= 3 && !m.anythread_deprecated
}

fn slot_of(index: u32, base: u32, n: u8) -> Option<u8> {
    let off = index.checked_sub(base)?;
    u8::try_from(off).ok().filter(|&o| o < n)
}

/// Writable bits of the MSR classes the reference models; `None` for the others.
fn reference_mask(m: &CpuModel, index: u32) -> Option<u64> {
    if m.arch != PmuArch::Architectural {
        return None;
    }
    let v = m.pmu_version;
    let frz = 0xF << 58;
    if let Some(n) = slot_of(index, IA32_PERFEVTSEL0, m.num_gp) {
        let mut mask = 0xFFFF_FFFF & !(1 << 21);
        if any_thread(m) {
            mask |= 1 << 21;
        }
        if m.tsx {
            mask |= 1 << 32;
            if n == 2 {
                mask |= 1 << 33;
            }
        }
        if m.pebs_baseline {
            mask |= 1 << 34;
        }
        return Some(mask);
    }
    if slot_of(index, IA32_PMC0, m.num_gp).is_some() {
        return Some(u64::MAX);
    }
    if m.fw_write && slot_of(index, IA32_A_PMC0, m.num_gp).is_some() {
        return Some(low_bits(u32::from(m.gp_width)));
    }
    if let Some(i) = slot_of(index, IA32_FIXED_CTR0, MAX_FIXED_COUNTERS) {
        return m.has_fixed(i).then(|| low_bits(u32::from(m.fixed_width)));
    }
    match index {
        IA32_FIXED_CTR_CTRL if v >= 2 => Some(
            (0..MAX_FIXED_COUNTERS)
                .filter(|&i| m.has_fixed(i))
                .fold(0, |a, i| {
                    let field = 0b1011 | if any_thread(m) { 0b0100 } else { 0 };
                    let adaptive = if m.pebs_baseline {
                        1 << (32 + 4 * i)
                    } else {
                        0
                    };
                    a | field << (4 * i) | adaptive
                }),
        ),
        IA32_PERF_GLOBAL_CTRL if v >= 2 => Some(counter_bits(m)),
        IA32_PERF_GLOBAL_OVF_CTRL if v >= 2 => {
            Some(counter_bits(m) | 3 << 62 | if v >= 4 { frz } else { 0 })
        }
        IA32_PERF_GLOBAL_STATUS_SET if v >= 4 => Some(counter_bits(m) | 1 << 62 | frz),
        IA32_PERF_GLOBAL_STATUS if v >= 2 => Some(0),
        IA32_PEBS_ENABLE => match m.pebs_format {
            PebsFormat::None | PebsFormat::Netburst => None,
            PebsFormat::Fmt0 => Some(1),
            _ => {
                let gp = low_bits(u32::from(m.num_gp));
                if m.pebs_baseline {
                    Some(gp | (counter_bits(m) & !0xFFFF_FFFF))
                } else if m.pebs_load_latency {
                    Some(gp | low_bits(u32::from(m.num_gp.min(4))) << 32)
                } else {
                    Some(gp)
                }
            }
        },
        MSR_PEBS_DATA_CFG if m.pebs_format.is_adaptive() => Some(0xF | 0xFF << 24),
        _ => None,
    }
}

/// What RDMSR returns right after `value` was accepted at `index` (`None`: not modelled).
fn reference_read_back(m: &CpuModel, index: u32, value: u64) -> Option<u64> {
    let arch = m.arch == PmuArch::Architectural;
    if arch && slot_of(index, IA32_PMC0, m.num_gp).is_some() {
        // Legacy PMCx writes sign-extend bit 31 (SDM 18.2.6), then the counter width applies.
        let low = value & 0xFFFF_FFFF;
        let ext = if low >> 31 == 1 {
            low | !0xFFFF_FFFF
        } else {
            low
        };
        return Some(ext & low_bits(u32::from(m.gp_width)));
    }
    match index {
        IA32_PERF_GLOBAL_OVF_CTRL | IA32_PERF_GLOBAL_STATUS_SET if arch => Some(0),
        // Read-only availability bits keep the model's values.
        IA32_MISC_ENABLE => Some((value & !(1 << 7 | 1 << 11 | 1 << 12)) | m.misc_enable()),
        IA32_DS_AREA => Some(value),
        _ => Some(value),
    }
}

fn canonical48(v: u64) -> bool {
    let top = v >> 47;
    top == 0 || top == (1 << 17) - 1
}

/// State the reference tracks across operations.
struct Reference {
    status: u64,
    pmi: bool,
}

/// Everything observable about a vPMU through its MSR interface.
fn snapshot(
    v: &mut Vpmu,
    indices: &[u32],
) -> (Vec<Result<u64, MsrError>>, Vec<CounterProgram>, u64) {
    let msrs = indices.iter().map(|&i| v.rdmsr(i)).collect();
    (msrs, v.programs(), v.generation())
}

fn rd(v: &mut Vpmu, index: u32) -> u64 {
    v.rdmsr(index).unwrap_or(0)
}

/// The counters the reference considers counting, from the architectural MSRs.
fn reference_counting(v: &mut Vpmu) -> Vec<CounterId> {
    let m = v.model().clone();
    if m.arch == PmuArch::Netburst {
        return v.programs().iter().map(|p| p.id).collect();
    }
    let ctrl = if m.pmu_version >= 2 {
        rd(v, IA32_PERF_GLOBAL_CTRL)
    } else {
        u64::MAX
    };
    let frozen = m.pmu_version >= 4 && rd(v, IA32_PERF_GLOBAL_STATUS) & GLOBAL_STATUS_CTR_FRZ != 0;
    if frozen {
        return Vec::new();
    }
    let mut out = Vec::new();
    for n in 0..m.num_gp {
        let e = rd(v, IA32_PERFEVTSEL0 + u32::from(n));
        if e & EVTSEL_EN != 0 && e & (EVTSEL_USR | EVTSEL_OS) != 0 && ctrl >> n & 1 == 1 {
            out.push(CounterId::Gp(n));
        }
    }
    let fc = if m.pmu_version >= 2 {
        rd(v, IA32_FIXED_CTR_CTRL)
    } else {
        0
    };
    for i in (0..MAX_FIXED_COUNTERS).filter(|&i| m.has_fixed(i)) {
        if fc >> (4 * i) & 3 != 0 && ctrl >> (32 + i) & 1 == 1 {
            out.push(CounterId::Fixed(i));
        }
    }
    out
}

fn width_mask(m: &CpuModel, id: CounterId) -> u64 {
    low_bits(u32::from(match id {
        CounterId::Gp(_) => m.gp_width,
        CounterId::Fixed(_) => m.fixed_width,
        CounterId::Netburst(_) => NETBURST_COUNTER_WIDTH,
    }))
}

/// Physical ranges of the linear range `la..la+len` under `regs` (reference walker); `None`
/// if any byte does not translate for writing.
fn phys_ranges(g: &FuzzGuest, la: u64, len: u64) -> Option<Vec<Range<u64>>> {
    let mut out = Vec::new();
    let mut done = 0;
    while done < len {
        let cur = la.checked_add(done)?;
        let n = (0x1000 - (cur & 0xFFF)).min(len - done);
        let t = reference_translate(&g.mem, &g.paging, 52, cur, true).ok()?;
        out.push(t.gpa..t.gpa + n);
        done += n;
    }
    Some(out)
}

fn read_linear_u64(g: &FuzzGuest, la: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    let mut done = 0usize;
    for r in phys_ranges(g, la, 8)? {
        let n = usize::try_from(r.end - r.start).ok()?;
        g.mem.read_phys(r.start, &mut b[done..done + n]).ok()?;
        done += n;
    }
    Some(u64::from_le_bytes(b))
}

fn read_phys_u64(g: &FuzzGuest, ranges: &[Range<u64>]) -> Option<u64> {
    let mut b = [0u8; 8];
    let mut done = 0usize;
    for r in ranges {
        let n = usize::try_from(r.end - r.start).ok()?;
        g.mem.read_phys(r.start, &mut b[done..done + n]).ok()?;
        done += n;
    }
    Some(u64::from_le_bytes(b))
}

fn covered(w: &(u64, usize), allowed: &[Range<u64>]) -> bool {
    let (start, len) = (w.0, w.1 as u64);
    // Every byte of the write lies in some allowed range.
    (start..start + len).all(|a| allowed.iter().any(|r| r.contains(&a)))
}

struct Harness {
    vpmu: Vpmu,
    guest: FuzzGuest,
    r: Reference,
    indices: Vec<u32>,
    rip: u64,
}

impl Harness {
    fn model(&self) -> CpuModel {
        self.vpmu.model().clone()
    }

    fn wrmsr(&mut self, index: u32, value: u64) {
        let m = self.model();
        let before = self.vpmu.clone();
        let res = self.vpmu.wrmsr(index, value);
        let mask = reference_mask(&m, index);
        if let Some(mask) = mask {
            let accept = if index == IA32_DS_AREA {
                canonical48(value)
            } else if index == IA32_PERF_GLOBAL_STATUS {
                // Read-only (SDM: writes #GP; software clears it through OVF_CTRL).
                false
            } else {
                value & !mask == 0
            };
            assert_eq!(
                res.is_ok(),
                accept,
                "{}: wrmsr {index:#x} {value:#x} gave {res:?}, reference mask {mask:#x}",
                m.name
            );
            if let Err(MsrError::Reserved { reserved, .. }) = res {
                assert_eq!(reserved, value & !mask, "reserved bits of {index:#x}");
            }
        }
        if index == IA32_DS_AREA && m.ds {
            assert_eq!(
                res.is_ok(),
                canonical48(value),
                "DS_AREA {value:#x}: {res:?}"
            );
        }
        match res {
            Err(e) => {
                let mut b = before;
                let was = snapshot(&mut b, &self.indices);
                let now = snapshot(&mut self.vpmu, &self.indices);
                assert!(
                    was == now,
                    "refused wrmsr {index:#x} {value:#x} ({e}) changed state"
                );
                if let MsrError::NotPresent(_) = e {
                    assert!(
                        self.vpmu.rdmsr(index).is_err(),
                        "{index:#x} readable, not writable"
                    );
                }
            }
            Ok(()) => {
                let got = self.vpmu.rdmsr(index);
                let want = reference_read_back(&m, index, value);
                assert_eq!(
                    got.ok(),
                    want,
                    "{}: rdmsr {index:#x} after accepted wrmsr {value:#x}",
                    m.name
                );
                if m.arch == PmuArch::Architectural {
                    match index {
                        IA32_PERF_GLOBAL_OVF_CTRL => self.r.status &= !value,
                        IA32_PERF_GLOBAL_STATUS_SET => self.r.status |= value,
                        _ => {}
                    }
                }
            }
        }
    }

    fn count(&mut self, deltas: &[(CounterId, Delta)], then_overflow: bool) {
        let m = self.model();
        let counting = reference_counting(&mut self.vpmu);
        let mut values: Vec<(CounterId, Option<u64>)> = counters_of(&m)
            .into_iter()
            .map(|id| (id, self.vpmu.counter_value(id)))
            .collect();
        let resolved: Vec<(CounterId, u64)> = deltas
            .iter()
            .map(|&(id, d)| {
                let v = match d {
                    Delta::Raw(v) => v,
                    Delta::ToWrap(k) => {
                        let cur = self.vpmu.counter_value(id).unwrap_or(0);
                        let dist = width_mask(&m, id) - cur + 1;
                        dist.wrapping_add_signed(i64::from(k))
                    }
                };
                (id, v)
            })
            .collect();
        let mut want_wrapped = Vec::new();
        for &(id, d) in &resolved {
            if d == 0 || !counting.contains(&id) {
                continue;
            }
            let mask = width_mask(&m, id);
            if let Some((_, Some(old))) = values.iter_mut().find(|(c, _)| *c == id) {
                let sum = u128::from(*old) + u128::from(d);
                if sum > u128::from(mask) && !want_wrapped.contains(&id) {
                    want_wrapped.push(id);
                }
                *old = u64::try_from(sum & u128::from(mask)).unwrap_or(0);
            }
        }
        let wrapped = self.vpmu.add_counts(&resolved);
        assert_eq!(
            wrapped, want_wrapped,
            "{}: add_counts {resolved:x?}",
            m.name
        );
        for (id, v) in values {
            assert_eq!(
                self.vpmu.counter_value(id),
                v,
                "{}: {id:?} after add_counts",
                m.name
            );
        }
        if then_overflow && !wrapped.is_empty() {
            self.overflow(&wrapped);
        }
    }

    fn overflow(&mut self, ids: &[CounterId]) {
        let m = self.model();
        let arch = m.arch == PmuArch::Architectural;
        let debugctl = rd(&mut self.vpmu, IA32_DEBUGCTL);
        let pebs_enable = self.vpmu.rdmsr(IA32_PEBS_ENABLE).unwrap_or(0);
        let ds = self.vpmu.rdmsr(IA32_DS_AREA).unwrap_or(0);
        // The PEBS window and the index field's physical bytes, before the assist.
        let field = |off: u64| ds.checked_add(off);
        let window = (|| {
            let base = read_linear_u64(&self.guest, field(0x20)?)?;
            let index = read_linear_u64(&self.guest, field(0x28)?)?;
            let max = read_linear_u64(&self.guest, field(0x30)?)?;
            let threshold = read_linear_u64(&self.guest, field(0x38)?)?;
            let index_field = phys_ranges(&self.guest, field(0x28)?, 8)?;
            Some((base, index, max, threshold, index_field))
        })();
        // Expected PMI from the counters' INT / PMI bits, and the PEBS counters.
        let mut int = false;
        let mut want_pebs = 0u64;
        let mut valid = Vec::new();
        for &id in ids {
            if self.vpmu.counter_value(id).is_none() || valid.contains(&id) {
                continue;
            }
            valid.push(id);
            match id {
                CounterId::Gp(n) => {
                    int |= rd(&mut self.vpmu, IA32_PERFEVTSEL0 + u32::from(n)) & EVTSEL_INT != 0;
                    if m.pebs_format != PebsFormat::None && pebs_enable >> n & 1 == 1 {
                        want_pebs |= 1 << n;
                    }
                }
                CounterId::Fixed(i) => {
                    int |= rd(&mut self.vpmu, IA32_FIXED_CTR_CTRL) >> (4 * i) & 8 != 0;
                    if m.pebs_baseline && pebs_enable >> (32 + i) & 1 == 1 {
                        want_pebs |= 1 << (32 + i);
                    }
                }
                CounterId::Netburst(c) => {
                    let cccr = rd(&mut self.vpmu, MSR_BPU_CCCR0 + u32::from(c));
                    int |= cccr & CCCR_OVF_PMI_T0 != 0;
                    if c == NETBURST_IQ_COUNTER4_INDEX
                        && m.pebs_format == PebsFormat::Netburst
                        && pebs_enable & NETBURST_PEBS_ENABLE_BIT != 0
                    {
                        want_pebs |= 1;
                    }
                }
            }
        }
        let state = GuestState {
            paging: self.guest.paging,
            cpl: u8::try_from(self.rip % 4).unwrap_or(0),
            tsc: self.rip.wrapping_mul(3),
            ..GuestState::default()
        };
        let event = EventInfo {
            eventing_ip: self.rip,
            data_addr: (self.rip & 1 == 1).then_some(self.rip ^ 0x5555),
            data_source: self.rip >> 3,
            latency: self.rip % 1000,
        };
        self.rip = self
            .rip
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        self.guest.mem.writes.clear();
        let out = self
            .vpmu
            .handle_overflow(ids, &state, &event, &mut self.guest.mem);
        let writes = std::mem::take(&mut self.guest.mem.writes);
        let ram = RAM_SIZE as u64;
        for w in &writes {
            assert!(w.0 + w.1 as u64 <= ram, "write {w:x?} outside guest RAM");
        }
        assert_eq!(
            out.pebs_counters, want_pebs,
            "{}: pebs counters of {ids:?}",
            m.name
        );
        let assists = u32::from(want_pebs != 0);
        assert_eq!(
            out.records_written + u32::try_from(out.dropped.len()).unwrap_or(u32::MAX),
            assists,
            "one assist, one record or one drop cause: {out:?}"
        );
        let mut reached = false;
        if out.records_written == 0 {
            assert!(writes.is_empty(), "no record, yet writes {writes:x?}");
        } else {
            let Some((base, index, max, threshold, index_field)) = window else {
                panic!("record written though the DS area does not translate: {out:?}");
            };
            let new_index = read_phys_u64(&self.guest, &index_field).unwrap_or(0);
            assert!(
                base <= index && index < new_index && new_index <= max,
                "PEBS index {index:#x} -> {new_index:#x} outside base {base:#x} max {max:#x}"
            );
            let mut allowed =
                phys_ranges(&self.guest, index, new_index - index).unwrap_or_default();
            allowed.extend(index_field.iter().cloned());
            for w in &writes {
                assert!(
                    covered(w, &allowed),
                    "write {w:x?} outside the record [{index:#x}, {new_index:#x}) and the index field"
                );
            }
            reached = new_index >= threshold;
        }
        assert_eq!(out.pmi, int || reached, "{}: PMI decision {out:?}", m.name);
        self.r.pmi |= out.pmi;
        if arch && m.pmu_version >= 2 {
            for id in &valid {
                self.r.status |= 1 << id.status_bit();
            }
            if reached {
                self.r.status |= OVF_BUFFER;
            }
            if out.pmi {
                let perfmon = debugctl & DEBUGCTL_FREEZE_PERFMON_ON_PMI != 0;
                let lbrs = debugctl & DEBUGCTL_FREEZE_LBRS_ON_PMI != 0;
                if m.pmu_version >= 4 {
                    if perfmon {
                        self.r.status |= GLOBAL_STATUS_CTR_FRZ;
                    }
                    if lbrs {
                        self.r.status |= GLOBAL_STATUS_LBR_FRZ;
                    }
                } else {
                    if perfmon {
                        assert_eq!(rd(&mut self.vpmu, IA32_PERF_GLOBAL_CTRL), 0, "v2/3 freeze");
                    }
                    if lbrs {
                        assert_eq!(
                            rd(&mut self.vpmu, IA32_DEBUGCTL) & DEBUGCTL_LBR,
                            0,
                            "v2/3 LBR freeze"
                        );
                    }
                }
            }
        }
    }

    fn check_global(&mut self) {
        let m = self.model();
        if m.arch == PmuArch::Architectural && m.pmu_version >= 2 {
            let got = rd(&mut self.vpmu, IA32_PERF_GLOBAL_STATUS);
            assert_eq!(
                got, self.r.status,
                "{}: GLOBAL_STATUS {got:#x}, reference {:#x}",
                m.name, self.r.status
            );
        }
        let mut want = reference_counting(&mut self.vpmu);
        let mut got: Vec<CounterId> = self.vpmu.programs().iter().map(|p| p.id).collect();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{}: counting counters", m.name);
        if m.arch == PmuArch::Architectural {
            for n in 0..m.num_gp {
                let v = self.vpmu.counter_value(CounterId::Gp(n));
                assert_eq!(self.vpmu.rdpmc(u32::from(n)).ok(), v, "rdpmc {n}");
                assert_eq!(self.vpmu.rdmsr(IA32_PMC0 + u32::from(n)).ok(), v, "PMC{n}");
            }
            for i in (0..MAX_FIXED_COUNTERS).filter(|&i| m.has_fixed(i)) {
                let v = self.vpmu.counter_value(CounterId::Fixed(i));
                assert_eq!(
                    self.vpmu.rdpmc(RDPMC_FIXED | u32::from(i)).ok(),
                    v,
                    "rdpmc fixed {i}"
                );
                assert_eq!(
                    self.vpmu.rdmsr(IA32_FIXED_CTR0 + u32::from(i)).ok(),
                    v,
                    "FIXED{i}"
                );
            }
        }
    }

    fn run(&mut self, op: &Op) {
        match op {
            Op::Rdmsr(i) => {
                let r = self.vpmu.rdmsr(*i);
                if let Err(e) = r {
                    assert!(
                        matches!(e, MsrError::NotPresent(x) if x == *i),
                        "rdmsr {i:#x}: {e}"
                    );
                }
            }
            Op::Wrmsr(i, v) => self.wrmsr(*i, *v),
            Op::Rdpmc(ecx) => {
                let _ = self.vpmu.rdpmc(*ecx);
            }
            Op::Count {
                deltas,
                then_overflow,
            } => self.count(deltas, *then_overflow),
            Op::Overflow(ids) => self.overflow(ids),
            Op::Paging(regs) => self.guest.paging = *regs,
            Op::GuestWrite { gpa, value } => {
                let _ = self.guest.mem.inner.write_u64(*gpa, *value);
            }
            Op::TakePmi => {
                let got = self.vpmu.take_pmi_request();
                assert_eq!(got, self.r.pmi, "PMI request latch");
                self.r.pmi = false;
            }
        }
        self.check_global();
    }
}

/// Runs the `msr_traps` target on `data`; panics if an invariant (see the module doc) fails.
pub fn msr_traps(data: &[u8]) {
    let (model, ops) = decode(data);
    // The model's own MSRs: the others stay #GP whatever happens.
    let mut probe = Vpmu::new(model.clone());
    let indices = trapped_indices(&model)
        .into_iter()
        .filter(|&i| probe.rdmsr(i).is_ok())
        .collect();
    let mut h = Harness {
        vpmu: Vpmu::new(model),
        guest: FuzzGuest::new(),
        r: Reference {
            status: 0,
            pmi: false,
        },
        indices,
        rip: 0x40_1000,
    };
    // The DS area starts at the guest's default, as a driver would set it.
    h.wrmsr(IA32_DS_AREA, DS_AREA);
    h.check_global();
    for op in &ops {
        h.run(op);
    }
}
