//! MSR-trap traces: a line format recording what the vPMU was asked and answered, a writer the
//! VMM feeds from its vCPU loop (`vmm run --trace-msr FILE`), and [`replay`], which re-executes
//! a trace against a fresh [`Vpmu`] without KVM and reports the first divergence. A trace is
//! also a seed for the `msr_traps` fuzz target.
//!
//! # Format (v1)
//!
//! One event per line; numbers are hex with `0x` (decimal accepted when reading); counters are
//! `gpN`, `fixedN` or `nbN` (NetBurst); lists are comma-separated, `-` when empty. Blank lines
//! and other lines starting with `#` are ignored.
//!
//! ```text
//! # vpmu-trace v1 model=skylake vcpu=0
//! rdmsr 0x38f -> 0xf                        RDMSR and its value
//! rdmsr 0x999 -> #GP                        RDMSR answered with #GP
//! wrmsr 0x186 0x4300c0 -> ok                WRMSR accepted
//! wrmsr 0x38e 0x1 -> #GP                    WRMSR refused
//! rdpmc 0x40000000 -> 0x12                  RDPMC (ECX) and its value, or #GP
//! count gp0:0x10,fixed1:0x5 -> wrapped gp0  Vpmu::add_counts and the counters that wrapped
//! overflow gp0 rip=0x401000 -> pmi=1 records=1 pebs=0x1 status=0x1 values=gp0:0xfff0 dropped=-
//! pmi delivered                             a requested PMI was injected (or `dropped`)
//! ```
//!
//! `overflow` is one [`Vpmu::handle_overflow`] call: the wrapped counters and the eventing IP,
//! then its outcome (PMI requested, records written, PEBS counters, drop causes) and the state
//! it left: IA32_PERF_GLOBAL_STATUS (`-` where the model has none) and the wrapped counters'
//! values. `pmi` lines are written only when [`Vpmu::take_pmi_request`] returned true.
//!
//! # What replay reproduces
//!
//! Everything but guest memory is re-executed exactly. Guest memory is not in the trace, so at
//! an overflow with PEBS counters replay builds a small synthetic guest whose DS area (mapped at
//! the vPMU's IA32_DS_AREA under 4-level paging) has reset slots chosen to produce the recorded
//! reload values, and tries the memory situations the outcome can come from (record written
//! below or at the interrupt threshold; buffer full; DS area unreadable), keeping the first
//! that reproduces the recorded outcome and state. The record bytes, the exact drop cause and
//! the eventing IP are therefore not checked.

use std::fmt;
use std::io::{self, Write};
use std::str::FromStr;

use thiserror::Error;

use crate::counter::CounterId;
use crate::ds;
use crate::mem::{GuestMemory, VecMemory};
use crate::model::{CpuModel, ModelError, PmuArch, low_bits};
use crate::msr::{IA32_PERF_GLOBAL_STATUS, NETBURST_COUNTER_WIDTH};
use crate::paging::{CR0_PG, CR4_PAE, EFER_LMA, EFER_LME};
use crate::pmu::{MsrError, OverflowOutcome, Vpmu};
use crate::state::{EventInfo, GuestState, PagingRegs};

/// First words of a trace's header line.
pub const TRACE_MAGIC: &str = "# vpmu-trace v1";

/// Why a trace could not be read or replayed.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TraceError {
    /// The first line is not a `# vpmu-trace v1` header.
    #[error("line 1: not a vpmu trace (expected '{TRACE_MAGIC} model=NAME vcpu=N')")]
    NoHeader,
    /// A line did not parse.
    #[error("line {line}: {why}: '{text}'")]
    Syntax {
        /// 1-based line number.
        line: usize,
        /// The line.
        text: String,
        /// What is wrong.
        why: String,
    },
    /// The header names a model that cannot be loaded.
    #[error("trace model: {0}")]
    Model(String),
    /// Replay diverged.
    #[error("{0}")]
    Divergence(#[from] Divergence),
}

impl From<ModelError> for TraceError {
    fn from(e: ModelError) -> Self {
        TraceError::Model(e.to_string())
    }
}

/// The header line's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceHeader {
    /// CPU model name (a preset or a model file path).
    pub model: String,
    /// vCPU index.
    pub vcpu: u32,
}

impl fmt::Display for TraceHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{TRACE_MAGIC} model={} vcpu={}", self.model, self.vcpu)
    }
}

/// The outcome and resulting state of one [`Vpmu::handle_overflow`] call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverflowEvent {
    /// Counters passed as wrapped.
    pub counters: Vec<CounterId>,
    /// Eventing IP reported by the backend (informational).
    pub rip: u64,
    /// A PMI was requested.
    pub pmi: bool,
    /// PEBS records written.
    pub records: u32,
    /// [`OverflowOutcome::pebs_counters`].
    pub pebs: u64,
    /// IA32_PERF_GLOBAL_STATUS afterwards; `None` where the model has none.
    pub status: Option<u64>,
    /// Each wrapped counter's value afterwards.
    pub values: Vec<(CounterId, u64)>,
    /// Drop-cause names (informational).
    pub dropped: Vec<String>,
}

impl OverflowEvent {
    /// Captures the outcome of `handle_overflow(counters, ..)` and the state it left in `vpmu`.
    pub fn capture(
        counters: &[CounterId],
        event: &EventInfo,
        outcome: &OverflowOutcome,
        vpmu: &mut Vpmu,
    ) -> Self {
        let status = vpmu.rdmsr(IA32_PERF_GLOBAL_STATUS).ok();
        let values = counters
            .iter()
            .filter_map(|&id| vpmu.counter_value(id).map(|v| (id, v)))
            .collect();
        OverflowEvent {
            counters: counters.to_vec(),
            rip: event.eventing_ip,
            pmi: outcome.pmi,
            records: outcome.records_written,
            pebs: outcome.pebs_counters,
            status,
            values,
            dropped: outcome
                .dropped
                .iter()
                .map(|c| c.name().to_string())
                .collect(),
        }
    }
}

/// One traced event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceEvent {
    /// RDMSR; `None` = #GP.
    Rdmsr {
        /// MSR index.
        index: u32,
        /// Value returned.
        result: Option<u64>,
    },
    /// WRMSR.
    Wrmsr {
        /// MSR index.
        index: u32,
        /// Value written.
        value: u64,
        /// Accepted (else #GP).
        ok: bool,
    },
    /// RDPMC; `None` = #GP.
    Rdpmc {
        /// ECX.
        ecx: u32,
        /// Value returned.
        result: Option<u64>,
    },
    /// [`Vpmu::add_counts`].
    Count {
        /// Deltas passed.
        deltas: Vec<(CounterId, u64)>,
        /// Counters reported as wrapped.
        wrapped: Vec<CounterId>,
    },
    /// [`Vpmu::handle_overflow`].
    Overflow(OverflowEvent),
    /// A PMI the vPMU requested was injected (`true`) or dropped by the LAPIC.
    Pmi {
        /// Delivered.
        delivered: bool,
    },
}

fn counter_name(id: CounterId) -> String {
    match id {
        CounterId::Gp(n) => format!("gp{n}"),
        CounterId::Fixed(i) => format!("fixed{i}"),
        CounterId::Netburst(c) => format!("nb{c}"),
    }
}

fn list<T>(items: &[T], f: impl Fn(&T) -> String) -> String {
    if items.is_empty() {
        "-".to_string()
    } else {
        items.iter().map(f).collect::<Vec<_>>().join(",")
    }
}

fn opt_hex(v: Option<u64>) -> String {
    v.map_or_else(|| "#GP".to_string(), |v| format!("{v:#x}"))
}

impl fmt::Display for TraceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceEvent::Rdmsr { index, result } => {
                write!(f, "rdmsr {index:#x} -> {}", opt_hex(*result))
            }
            TraceEvent::Wrmsr { index, value, ok } => write!(
                f,
                "wrmsr {index:#x} {value:#x} -> {}",
                if *ok { "ok" } else { "#GP" }
            ),
            TraceEvent::Rdpmc { ecx, result } => {
                write!(f, "rdpmc {ecx:#x} -> {}", opt_hex(*result))
            }
            TraceEvent::Count { deltas, wrapped } => write!(
                f,
                "count {} -> wrapped {}",
                list(deltas, |(id, d)| format!("{}:{d:#x}", counter_name(*id))),
                list(wrapped, |id| counter_name(*id))
            ),
            TraceEvent::Overflow(o) => write!(
                f,
                "overflow {} rip={:#x} -> pmi={} records={} pebs={:#x} status={} values={} dropped={}",
                list(&o.counters, |id| counter_name(*id)),
                o.rip,
                u8::from(o.pmi),
                o.records,
                o.pebs,
                o.status
                    .map_or_else(|| "-".to_string(), |s| format!("{s:#x}")),
                list(&o.values, |(id, v)| format!("{}:{v:#x}", counter_name(*id))),
                list(&o.dropped, Clone::clone)
            ),
            TraceEvent::Pmi { delivered } => write!(
                f,
                "pmi {}",
                if *delivered { "delivered" } else { "dropped" }
            ),
        }
    }
}

fn num(s: &str) -> Result<u64, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("bad number '{s}'"))
}

fn num32(s: &str) -> Result<u32, String> {
    u32::try_from(num(s)?).map_err(|_| format!("'{s}' does not fit 32 bits"))
}

fn counter(s: &str) -> Result<CounterId, String> {
    let idx = |rest: &str| rest.parse::<u8>().map_err(|_| format!("bad counter '{s}'"));
    if let Some(r) = s.strip_prefix("gp") {
        Ok(CounterId::Gp(idx(r)?))
    } else if let Some(r) = s.strip_prefix("fixed") {
        Ok(CounterId::Fixed(idx(r)?))
    } else if let Some(r) = s.strip_prefix("nb") {
        Ok(CounterId::Netburst(idx(r)?))
    } else {
        Err(format!("bad counter '{s}'"))
    }
}

fn parse_list<T>(s: &str, f: impl Fn(&str) -> Result<T, String>) -> Result<Vec<T>, String> {
    if s == "-" {
        return Ok(Vec::new());
    }
    s.split(',').map(f).collect()
}

fn pair(s: &str) -> Result<(CounterId, u64), String> {
    let (c, v) = s
        .split_once(':')
        .ok_or_else(|| format!("expected COUNTER:VALUE, got '{s}'"))?;
    Ok((counter(c)?, num(v)?))
}

fn gp_or(s: &str) -> Result<Option<u64>, String> {
    if s == "#GP" {
        Ok(None)
    } else {
        num(s).map(Some)
    }
}

/// `key=value` field of an overflow line.
fn field<'a>(tokens: &[&'a str], key: &str) -> Result<&'a str, String> {
    tokens
        .iter()
        .find_map(|t| t.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
        .ok_or_else(|| format!("missing {key}="))
}

impl FromStr for TraceEvent {
    type Err = String;

    fn from_str(line: &str) -> Result<Self, String> {
        let (lhs, rhs) = match line.split_once("->") {
            Some((l, r)) => (l.trim(), r.trim()),
            None => (line.trim(), ""),
        };
        let l: Vec<&str> = lhs.split_whitespace().collect();
        let r: Vec<&str> = rhs.split_whitespace().collect();
        let arity = |n: usize, m: usize| {
            if l.len() == n && r.len() == m {
                Ok(())
            } else {
                Err("wrong number of fields".to_string())
            }
        };
        match l.first().copied() {
            Some("rdmsr") => {
                arity(2, 1)?;
                Ok(TraceEvent::Rdmsr {
                    index: num32(l[1])?,
                    result: gp_or(r[0])?,
                })
            }
            Some("wrmsr") => {
                arity(3, 1)?;
                let ok = match r[0] {
                    "ok" => true,
                    "#GP" => false,
                    other => return Err(format!("expected ok or #GP, got '{other}'")),
                };
                Ok(TraceEvent::Wrmsr {
                    index: num32(l[1])?,
                    value: num(l[2])?,
                    ok,
                })
            }
            Some("rdpmc") => {
                arity(2, 1)?;
                Ok(TraceEvent::Rdpmc {
                    ecx: num32(l[1])?,
                    result: gp_or(r[0])?,
                })
            }
            Some("count") => {
                arity(2, 2)?;
                if r[0] != "wrapped" {
                    return Err("expected '-> wrapped LIST'".to_string());
                }
                Ok(TraceEvent::Count {
                    deltas: parse_list(l[1], pair)?,
                    wrapped: parse_list(r[1], counter)?,
                })
            }
            Some("overflow") => {
                if l.len() != 3 || r.len() != 6 {
                    return Err("wrong number of fields".to_string());
                }
                let status = field(&r, "status")?;
                Ok(TraceEvent::Overflow(OverflowEvent {
                    counters: parse_list(l[1], counter)?,
                    rip: num(field(&l, "rip")?)?,
                    pmi: match field(&r, "pmi")? {
                        "0" => false,
                        "1" => true,
                        other => return Err(format!("pmi must be 0 or 1, got '{other}'")),
                    },
                    records: u32::try_from(num(field(&r, "records")?)?)
                        .map_err(|_| "records does not fit 32 bits".to_string())?,
                    pebs: num(field(&r, "pebs")?)?,
                    status: if status == "-" {
                        None
                    } else {
                        Some(num(status)?)
                    },
                    values: parse_list(field(&r, "values")?, pair)?,
                    dropped: parse_list(field(&r, "dropped")?, |s| Ok(s.to_string()))?,
                }))
            }
            Some("pmi") => {
                arity(2, 0)?;
                match l[1] {
                    "delivered" => Ok(TraceEvent::Pmi { delivered: true }),
                    "dropped" => Ok(TraceEvent::Pmi { delivered: false }),
                    other => Err(format!("expected delivered or dropped, got '{other}'")),
                }
            }
            _ => Err("unknown event".to_string()),
        }
    }
}

/// One event with its 1-based line number in the trace file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceLine {
    /// Line number.
    pub line: usize,
    /// The event.
    pub event: TraceEvent,
}

/// A parsed trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// The header.
    pub header: TraceHeader,
    /// The events in order.
    pub events: Vec<TraceLine>,
}

/// Whether `bytes` starts like a trace (the fuzz target's test for text input).
pub fn is_trace(bytes: &[u8]) -> bool {
    bytes.starts_with(TRACE_MAGIC.as_bytes())
}

fn parse_header(line: &str) -> Result<TraceHeader, TraceError> {
    let rest = line.strip_prefix(TRACE_MAGIC).ok_or(TraceError::NoHeader)?;
    let tokens: Vec<&str> = rest.split_whitespace().collect();
    let syntax = |why: String| TraceError::Syntax {
        line: 1,
        text: line.to_string(),
        why,
    };
    let model = field(&tokens, "model").map_err(syntax)?;
    let vcpu = field(&tokens, "vcpu").and_then(num32).map_err(syntax)?;
    Ok(TraceHeader {
        model: model.to_string(),
        vcpu,
    })
}

/// Parses a whole trace.
pub fn parse_trace(text: &str) -> Result<Trace, TraceError> {
    let mut lines = text.lines().enumerate();
    let header = parse_header(lines.next().map_or("", |(_, l)| l))?;
    let mut events = Vec::new();
    for (i, l) in lines {
        let t = l.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        let event = t.parse().map_err(|why| TraceError::Syntax {
            line: i + 1,
            text: t.to_string(),
            why,
        })?;
        events.push(TraceLine { line: i + 1, event });
    }
    Ok(Trace { header, events })
}

/// Writes a trace: the header at creation, then one line per call. The VMM holds one per vCPU.
#[derive(Debug)]
pub struct TraceWriter<W: Write> {
    out: W,
}

impl<W: Write> TraceWriter<W> {
    /// Starts a trace for `model` (its name) on vCPU `vcpu`; writes the header.
    pub fn new(mut out: W, model: &str, vcpu: u32) -> io::Result<Self> {
        let header = TraceHeader {
            model: model.to_string(),
            vcpu,
        };
        writeln!(out, "{header}")?;
        Ok(Self { out })
    }

    /// Writes one event.
    pub fn event(&mut self, e: &TraceEvent) -> io::Result<()> {
        writeln!(self.out, "{e}")
    }

    /// A trapped RDMSR and what [`Vpmu::rdmsr`] answered.
    pub fn rdmsr(&mut self, index: u32, result: &Result<u64, MsrError>) -> io::Result<()> {
        self.event(&TraceEvent::Rdmsr {
            index,
            result: result.as_ref().ok().copied(),
        })
    }

    /// A trapped WRMSR and what [`Vpmu::wrmsr`] answered.
    pub fn wrmsr(
        &mut self,
        index: u32,
        value: u64,
        result: &Result<(), MsrError>,
    ) -> io::Result<()> {
        self.event(&TraceEvent::Wrmsr {
            index,
            value,
            ok: result.is_ok(),
        })
    }

    /// An emulated RDPMC and what [`Vpmu::rdpmc`] answered.
    pub fn rdpmc(&mut self, ecx: u32, result: &Result<u64, MsrError>) -> io::Result<()> {
        self.event(&TraceEvent::Rdpmc {
            ecx,
            result: result.as_ref().ok().copied(),
        })
    }

    /// A [`Vpmu::add_counts`] call and its result.
    pub fn count(&mut self, deltas: &[(CounterId, u64)], wrapped: &[CounterId]) -> io::Result<()> {
        self.event(&TraceEvent::Count {
            deltas: deltas.to_vec(),
            wrapped: wrapped.to_vec(),
        })
    }

    /// A [`Vpmu::handle_overflow`] call, written right after it returned `outcome`.
    pub fn overflow(
        &mut self,
        wrapped: &[CounterId],
        event: &EventInfo,
        outcome: &OverflowOutcome,
        vpmu: &mut Vpmu,
    ) -> io::Result<()> {
        self.event(&TraceEvent::Overflow(OverflowEvent::capture(
            wrapped, event, outcome, vpmu,
        )))
    }

    /// A PMI the vPMU requested, delivered or dropped.
    pub fn pmi(&mut self, delivered: bool) -> io::Result<()> {
        self.event(&TraceEvent::Pmi { delivered })
    }

    /// Flushes the sink.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }

    /// The sink.
    pub fn into_inner(self) -> W {
        self.out
    }
}

/// What a successful replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayStats {
    /// Events replayed.
    pub events: usize,
    /// RDMSRs.
    pub rdmsr: usize,
    /// WRMSRs.
    pub wrmsr: usize,
    /// RDPMCs.
    pub rdpmc: usize,
    /// add_counts calls.
    pub counts: usize,
    /// handle_overflow calls.
    pub overflows: usize,
    /// PMIs.
    pub pmis: usize,
}

impl fmt::Display for ReplayStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} events: {} rdmsr, {} wrmsr, {} rdpmc, {} count, {} overflow, {} pmi",
            self.events, self.rdmsr, self.wrmsr, self.rdpmc, self.counts, self.overflows, self.pmis
        )
    }
}

/// The first event whose re-execution did not match the trace.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("line {line}: replay diverged at '{event}': trace says {expected}, vpmu gives {got}")]
pub struct Divergence {
    /// 1-based line number in the trace.
    pub line: usize,
    /// The event as traced.
    pub event: String,
    /// The traced result.
    pub expected: String,
    /// The replayed result.
    pub got: String,
}

/// Guest physical layout of the synthetic replay guest.
const SYN_RAM: usize = 0x2_0000;
const SYN_DS_PHYS: u64 = 0x1_0000;
const SYN_BUF_PHYS: u64 = 0x1_2000;
const SYN_BUF_BYTES: u64 = 0x2000;

/// The PEBS window of a synthetic guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Window {
    /// DS area not mapped: the assist drops before reading anything.
    Unmapped,
    /// Base = index = max: the record does not fit, the counters are still reloaded.
    Full,
    /// Room for a record; the threshold is reached by it or not.
    Room {
        /// Threshold at the base (reached by any record).
        threshold_reached: bool,
    },
}

/// A tiny 4-level page-table builder over `mem`, tables allocated from 0x1000 upward.
struct Tables<'a> {
    mem: &'a mut VecMemory,
    next: u64,
}

impl Tables<'_> {
    const ROOT: u64 = 0x1000;

    fn map(&mut self, la: u64, gpa: u64) {
        let mut table = Self::ROOT;
        for level in (2..=4u32).rev() {
            let at = table + ((la >> (12 + 9 * (level - 1))) & 0x1FF) * 8;
            let e = self.mem.read_u64(at).unwrap_or(0);
            table = if e & 1 != 0 {
                e & !0xFFF
            } else {
                self.next += 0x1000;
                let _ = self.mem.write_u64(at, self.next | 3);
                self.next
            };
        }
        let _ = self
            .mem
            .write_u64(table + ((la >> 12) & 0x1FF) * 8, gpa | 3);
    }
}

/// A synthetic guest for an overflow at DS area `ds` (linear) with the given reset slots.
fn synthetic_guest(ds: u64, window: Window, resets: &[(u32, u64)]) -> (VecMemory, GuestState) {
    let mut mem = VecMemory::new(SYN_RAM);
    let paging = PagingRegs {
        cr0: CR0_PG | 1,
        cr3: Tables::ROOT,
        cr4: CR4_PAE,
        efer: EFER_LME | EFER_LMA,
    };
    let state = GuestState {
        paging,
        ..GuestState::default()
    };
    if window == Window::Unmapped {
        return (mem, state);
    }
    let page = ds & !0xFFF;
    // The buffer goes 16 KiB above the DS pages, or below where that leaves the canonical
    // lower half or wraps.
    let above = page.checked_add(0x4000).filter(|&b| {
        b.checked_add(SYN_BUF_BYTES)
            .is_some_and(|e| e <= 0x8000_0000_0000 || b >= 0xFFFF_8000_0000_0000)
    });
    let buf = above.unwrap_or_else(|| page.wrapping_sub(0x4000));
    {
        let mut t = Tables {
            mem: &mut mem,
            next: Tables::ROOT,
        };
        t.map(page, SYN_DS_PHYS);
        t.map(page.wrapping_add(0x1000), SYN_DS_PHYS + 0x1000);
        t.map(buf, SYN_BUF_PHYS);
        t.map(buf.wrapping_add(0x1000), SYN_BUF_PHYS + 0x1000);
    }
    let (max, threshold) = match window {
        Window::Full => (buf, buf),
        Window::Room { threshold_reached } => {
            let max = buf + SYN_BUF_BYTES;
            (max, if threshold_reached { buf } else { max })
        }
        Window::Unmapped => (0, 0),
    };
    let ds_phys = SYN_DS_PHYS + (ds & 0xFFF);
    for (off, v) in [
        (ds::DS_PEBS_BUFFER_BASE, buf),
        (ds::DS_PEBS_INDEX, buf),
        (ds::DS_PEBS_ABSOLUTE_MAXIMUM, max),
        (ds::DS_PEBS_INTERRUPT_THRESHOLD, threshold),
    ] {
        let _ = mem.write_u64(ds_phys + off, v);
    }
    for &(slot, v) in resets {
        let _ = mem.write_u64(ds_phys + ds::DS_PEBS_COUNTER_RESET + 8 * u64::from(slot), v);
    }
    (mem, state)
}

fn width(vpmu: &Vpmu, id: CounterId) -> u32 {
    u32::from(match id {
        CounterId::Gp(_) => vpmu.model().gp_width,
        CounterId::Fixed(_) => vpmu.model().fixed_width,
        CounterId::Netburst(_) => NETBURST_COUNTER_WIDTH,
    })
}

/// Re-executes one overflow; returns the replayed event (same shape as the traced one).
fn replay_overflow(vpmu: &mut Vpmu, o: &OverflowEvent) -> OverflowEvent {
    let model = vpmu.model().clone();
    let netburst = model.arch == PmuArch::Netburst;
    // Reset slot values that reproduce the traced post-overflow values: the assist reloads
    // `reset + events counted after the wrap`.
    let ds_area = vpmu.rdmsr(crate::msr::IA32_DS_AREA).unwrap_or(0);
    let resets: Vec<(u32, u64)> = o
        .values
        .iter()
        .filter_map(|&(id, after)| {
            let bit = if netburst { 0 } else { id.status_bit() };
            if o.pebs >> bit & 1 == 0 {
                return None;
            }
            let slot = ds::counter_reset_slot(model.pebs_format, bit)?;
            let now = vpmu.counter_value(id)?;
            Some((slot, after.wrapping_sub(now) & low_bits(width(vpmu, id))))
        })
        .collect();
    let windows: &[Window] = if o.pebs == 0 {
        &[Window::Unmapped]
    } else if o.records > 0 {
        &[
            Window::Room {
                threshold_reached: false,
            },
            Window::Room {
                threshold_reached: true,
            },
        ]
    } else {
        &[Window::Full, Window::Unmapped]
    };
    let event = EventInfo {
        eventing_ip: o.rip,
        ..EventInfo::default()
    };
    let mut first = None;
    for &w in windows {
        let mut trial = vpmu.clone();
        let (mut mem, state) = synthetic_guest(ds_area, w, &resets);
        let out = trial.handle_overflow(&o.counters, &state, &event, &mut mem);
        let got = OverflowEvent::capture(&o.counters, &event, &out, &mut trial);
        let same = OverflowEvent {
            dropped: o.dropped.clone(),
            ..got.clone()
        } == *o;
        if same || first.is_none() {
            first = Some((trial, got));
        }
        if same {
            break;
        }
    }
    match first {
        Some((trial, got)) => {
            *vpmu = trial;
            got
        }
        None => o.clone(),
    }
}

/// Re-executes `events` against a fresh [`Vpmu`] of `model` and stops at the first event whose
/// result differs from the trace. See the module doc for what guest memory replay assumes.
pub fn replay(model: CpuModel, events: &[TraceLine]) -> Result<ReplayStats, Divergence> {
    let mut vpmu = Vpmu::new(model);
    let mut stats = ReplayStats::default();
    for TraceLine { line, event } in events {
        let got = match event {
            TraceEvent::Rdmsr { index, .. } => {
                stats.rdmsr += 1;
                TraceEvent::Rdmsr {
                    index: *index,
                    result: vpmu.rdmsr(*index).ok(),
                }
            }
            TraceEvent::Wrmsr { index, value, .. } => {
                stats.wrmsr += 1;
                TraceEvent::Wrmsr {
                    index: *index,
                    value: *value,
                    ok: vpmu.wrmsr(*index, *value).is_ok(),
                }
            }
            TraceEvent::Rdpmc { ecx, .. } => {
                stats.rdpmc += 1;
                TraceEvent::Rdpmc {
                    ecx: *ecx,
                    result: vpmu.rdpmc(*ecx).ok(),
                }
            }
            TraceEvent::Count { deltas, .. } => {
                stats.counts += 1;
                TraceEvent::Count {
                    deltas: deltas.clone(),
                    wrapped: vpmu.add_counts(deltas),
                }
            }
            TraceEvent::Overflow(o) => {
                stats.overflows += 1;
                let mut got = replay_overflow(&mut vpmu, o);
                got.dropped.clone_from(&o.dropped);
                TraceEvent::Overflow(got)
            }
            TraceEvent::Pmi { delivered } => {
                stats.pmis += 1;
                if !vpmu.take_pmi_request() {
                    return Err(Divergence {
                        line: *line,
                        event: event.to_string(),
                        expected: "a pending PMI request".to_string(),
                        got: "none".to_string(),
                    });
                }
                TraceEvent::Pmi {
                    delivered: *delivered,
                }
            }
        };
        if got != *event {
            return Err(Divergence {
                line: *line,
                event: event.to_string(),
                expected: result_part(event),
                got: result_part(&got),
            });
        }
        stats.events += 1;
    }
    Ok(stats)
}

/// The text after `->` of an event's line.
fn result_part(e: &TraceEvent) -> String {
    let s = e.to_string();
    s.split_once("-> ")
        .map_or(s.clone(), |(_, r)| r.to_string())
}

/// Parses `text` and replays it against `model`, or the header's model when `None`.
pub fn replay_text(text: &str, model: Option<CpuModel>) -> Result<ReplayStats, TraceError> {
    let trace = parse_trace(text)?;
    let model = match model {
        Some(m) => m,
        None => CpuModel::load(&trace.header.model)?,
    };
    Ok(replay(model, &trace.events)?)
}
