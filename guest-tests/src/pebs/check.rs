//! Expected PEBS behaviour of one window ([`simulate`]) and the field-by-field record check
//! ([`check_record`]), both from the SDM rules: a record on the instruction where the counter
//! wraps, the counter reloaded from its reset slot, a record written only if it fits before the
//! absolute maximum, the threshold interrupt when PEBS Index reaches the interrupt threshold.

use super::layout::{self, PebsPreset, adaptive, legacy};
use super::window::{self, WindowArgs};
use super::{Counter, rd64, status_bit};
use crate::test::{Msg, TestResult};

/// How a window is set up.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Events until the first wrap.
    pub period: u64,
    /// Events until each later wrap (the reset slot holds `2^width - reset`).
    pub reset: u64,
    /// Records that fit between PEBS Index and the absolute maximum.
    pub capacity: usize,
    /// Records after which PEBS Index reaches the interrupt threshold.
    pub threshold: usize,
    /// Counting stops at the threshold PMI (DEBUGCTL.FREEZE_PERFMON_ON_PMI, LVTPC unmasked).
    pub freeze: bool,
}

/// What the window must produce.
#[derive(Clone, Copy, Debug)]
pub struct Sim {
    /// Counted instruction (1-based) of each record.
    pub recs: [usize; 64],
    /// Records written.
    pub n: usize,
    /// Assists (wraps), including those that wrote nothing.
    pub wraps: usize,
    /// Counted instruction whose record first reached the threshold.
    pub threshold_at: Option<usize>,
    /// Events left until the next wrap when counting stopped.
    pub left: u64,
}

/// Simulate one window of [`window::COUNTED`] counted instructions.
pub fn simulate(plan: &Plan) -> Sim {
    let mut s = Sim {
        recs: [0; 64],
        n: 0,
        wraps: 0,
        threshold_at: None,
        left: plan.period,
    };
    for k in 1..=window::COUNTED {
        s.left -= 1;
        if s.left > 0 {
            continue;
        }
        s.wraps += 1;
        s.left = plan.reset;
        if s.n >= plan.capacity || s.n >= s.recs.len() {
            continue;
        }
        s.recs[s.n] = k;
        s.n += 1;
        if s.n >= plan.threshold && s.threshold_at.is_none() {
            s.threshold_at = Some(k);
            if plan.freeze {
                break;
            }
        }
    }
    s
}

/// Memory fields a record must carry.
#[derive(Clone, Copy, Debug, Default)]
pub struct Mem {
    /// Data linear address.
    pub dla: u64,
    /// Data source.
    pub dse: u64,
    /// Latency.
    pub lat: u64,
}

/// Everything [`check_record`] compares against.
#[derive(Clone, Copy, Debug)]
pub struct Expect<'a> {
    /// The preset.
    pub p: &'a PebsPreset,
    /// The sampling counter.
    pub ctr: Counter,
    /// The window's arguments.
    pub args: &'a WindowArgs,
    /// What the window's load read.
    pub load_value: u64,
    /// RSP in the window.
    pub rsp: u64,
    /// DATA_CFG as applied (adaptive formats; 0 for a basic record).
    pub cfg: u64,
    /// Format 1/2 status field.
    pub status: u64,
    /// TSC before and after the window.
    pub tsc: (u64, u64),
    /// Memory fields.
    pub mem: Mem,
    /// LBR entries (from, to, info), newest first; entries past the slice must be zero.
    pub lbr: &'a [(u64, u64, u64)],
}

fn field(rec: u64, off: usize) -> u64 {
    rd64(rec + off as u64)
}

fn cmp(what: &str, k: usize, got: u64, want: u64) -> TestResult {
    if got != want {
        return Err(Msg::from_fmt(format_args!(
            "record on insn {k}: {what} = {got:#x}, expected {want:#x}"
        )));
    }
    Ok(())
}

/// The size a record of this preset / cfg must have.
pub fn size(e: &Expect<'_>) -> usize {
    e.p.fmt.record_size(e.cfg)
}

/// Check the record at linear address `rec`, written on counted instruction `k`.
pub fn check_record(rec: u64, k: usize, e: &Expect<'_>) -> TestResult {
    let g = window::regs_after(k, e.args, e.load_value, e.rsp);
    let trap_ip = window::ip(k + 1);
    let ev_ip = window::ip(k);
    let ip = if e.p.trap { trap_ip } else { ev_ip };
    let fmt = e.p.fmt;
    let (t0, t1) = e.tsc;
    if !fmt.adaptive() {
        let regs = [
            g.rax, g.rbx, g.rcx, g.rdx, g.rsi, g.rdi, g.rbp, g.rsp, g.r[0], g.r[1], g.r[2], g.r[3],
            g.r[4], g.r[5], g.r[6], g.r[7],
        ];
        const NAMES: [&str; 16] = [
            "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11",
            "r12", "r13", "r14", "r15",
        ];
        cmp("rflags", k, field(rec, legacy::FLAGS), g.rflags)?;
        cmp("ip", k, field(rec, legacy::IP), ip)?;
        for (i, (&want, name)) in regs.iter().zip(NAMES).enumerate() {
            cmp(name, k, field(rec, legacy::GPRS + 8 * i), want)?;
        }
        if fmt.has_status() {
            cmp("global status", k, field(rec, legacy::STATUS), e.status)?;
        }
        if fmt.has_applicable_legacy() {
            cmp(
                "applicable",
                k,
                field(rec, legacy::STATUS),
                status_bit(e.ctr),
            )?;
        }
        if fmt.has_mem_legacy() {
            cmp("dla", k, field(rec, legacy::DLA), e.mem.dla)?;
            cmp("dse", k, field(rec, legacy::DSE), e.mem.dse)?;
            cmp("latency", k, field(rec, legacy::LAT), e.mem.lat)?;
        }
        if fmt.has_real_ip_legacy() {
            cmp("eventing ip", k, field(rec, legacy::REAL_IP), ev_ip)?;
            cmp("tsx tuning", k, field(rec, legacy::TSX), 0)?;
        }
        if fmt.has_tsc_legacy() {
            let tsc = field(rec, legacy::TSC);
            if !(t0..=t1).contains(&tsc) {
                crate::fail!("record on insn {k}: tsc {tsc:#x} outside [{t0:#x}, {t1:#x}]");
            }
        }
        return Ok(());
    }
    let cfg = e.cfg;
    let want_fs = cfg | (layout::adaptive_size(cfg) as u64) << 48;
    cmp("format/size", k, field(rec, adaptive::FORMAT_SIZE), want_fs)?;
    cmp("eventing ip", k, field(rec, adaptive::IP), ev_ip)?;
    cmp(
        "applicable",
        k,
        field(rec, adaptive::APPLICABLE),
        status_bit(e.ctr),
    )?;
    let tsc = field(rec, adaptive::TSC);
    if !(t0..=t1).contains(&tsc) {
        crate::fail!("record on insn {k}: tsc {tsc:#x} outside [{t0:#x}, {t1:#x}]");
    }
    let [mem, gprs, xmms, lbrs] = layout::adaptive_groups(cfg);
    if let Some(o) = mem {
        cmp("meminfo dla", k, field(rec, o), e.mem.dla)?;
        cmp("meminfo dse", k, field(rec, o + 8), e.mem.dse)?;
        cmp("meminfo latency", k, field(rec, o + 16), e.mem.lat)?;
        cmp("meminfo tsx", k, field(rec, o + 24), 0)?;
    }
    if let Some(o) = gprs {
        let regs = [
            g.rflags, trap_ip, g.rax, g.rcx, g.rdx, g.rbx, g.rsp, g.rbp, g.rsi, g.rdi, g.r[0],
            g.r[1], g.r[2], g.r[3], g.r[4], g.r[5], g.r[6], g.r[7],
        ];
        const NAMES: [&str; 18] = [
            "gpr rflags",
            "gpr ip",
            "gpr rax",
            "gpr rcx",
            "gpr rdx",
            "gpr rbx",
            "gpr rsp",
            "gpr rbp",
            "gpr rsi",
            "gpr rdi",
            "gpr r8",
            "gpr r9",
            "gpr r10",
            "gpr r11",
            "gpr r12",
            "gpr r13",
            "gpr r14",
            "gpr r15",
        ];
        for (i, (&want, name)) in regs.iter().zip(NAMES).enumerate() {
            cmp(name, k, field(rec, o + 8 * i), want)?;
        }
    }
    if let Some(o) = xmms {
        for i in 0..16 {
            let x = window::xmm_value(i);
            #[allow(clippy::cast_possible_truncation, reason = "splitting a u128")]
            let (lo, hi) = (x as u64, (x >> 64) as u64);
            cmp("xmm lo", k, field(rec, o + 16 * i), lo)?;
            cmp("xmm hi", k, field(rec, o + 16 * i + 8), hi)?;
        }
    }
    if let Some(o) = lbrs {
        for i in 0..layout::lbr_entries(cfg) {
            let (f, t, inf) = e.lbr.get(i).copied().unwrap_or((0, 0, 0));
            let at = o + i * adaptive::LBR_ENTRY;
            cmp("lbr from", k, field(rec, at), f)?;
            cmp("lbr to", k, field(rec, at + 8), t)?;
            cmp("lbr info", k, field(rec, at + 16), inf)?;
        }
    }
    Ok(())
}
