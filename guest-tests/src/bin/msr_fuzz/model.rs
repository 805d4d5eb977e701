//! The fuzzer's model of every PMU MSR of a preset, written for the guest from the SDM (vol. 3B
//! ch. 17-18, vol. 4 tables 2-2 and 2-43) and the per-preset facts of `guest_tests::pmu::expect`
//! and `guest_tests::pebs::layout`: which indices exist, which bits a WRMSR accepts, what RDMSR
//! returns afterwards, and which counters may be counting.
//!
//! Counting is modelled as an interval: a counter that may count has a known lower bound and a
//! slack (the most it can have counted since); a read inside the interval is accepted and
//! becomes the new exact value. Overflows are never provoked (see [`Model::write_is_risky`]),
//! so IA32_PERF_GLOBAL_STATUS changes only through OVF_CTRL / STATUS_SET and is exact.
//! Freeze (CTR_Frz) is treated as "may count": the model never relies on it stopping counters.
//!
//! NetBurst is reduced to: the 18 counters, 18 CCCRs and the ESCRs of a family 0FH model 3+
//! part, MSR_PEBS_ENABLE, MSR_PEBS_MATRIX_VERT, MSR_DEBUGCTLA, MISC_ENABLE, DS_AREA; a counter
//! may count while its CCCR enable bit is set (the ESCR's CPL bits are not modelled).

use guest_tests::msr_index::*;
use guest_tests::pebs::layout::{Fmt, PebsPreset};
use guest_tests::pmu::expect::{MISC_PMU_MASK, Preset, ones};

/// Model slots for counters: GP n at n, fixed i at [`FIXED_SLOT`] + i, NetBurst k at k.
pub const SLOTS: usize = 24;
const FIXED_SLOT: usize = 8;
/// Highest MSR index the model tracks (+1).
pub const MAX_MSR: usize = 0x1000;
/// A counter that may count must stay this far below its wrap: no run counts 2^34 events, so
/// no overflow (and no PEBS record, GLOBAL_STATUS bit or PMI) is ever provoked.
const SAFE_DIST: u64 = 1 << 34;
/// Events a counting counter may add between two MSR operations of the fuzzer (instructions
/// or cycles of the fuzzer's own code, a FAIL line included).
pub const SLACK_PER_OP: u64 = 1 << 20;
/// NetBurst counter width (SDM 18.15.2).
const NB_WIDTH: u32 = 40;
/// DEBUGCTL bit 13 (ENABLE_UNCORE_PMI) is model specific and not in any preset's documented
/// set; the generator never sets it so the model need not decide.
pub const DEBUGCTL_UNDECIDED: u64 = 1 << 13;

/// What the model says an MSR is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// No such MSR: RDMSR and WRMSR #GP.
    Absent,
    /// A plain register: WRMSR #GP if a bit outside `mask` is set, else stores the value.
    Rw(u64),
    /// IA32_PMCn: any value; bits 31:0 sign-extended to the counter width (SDM 18.2.6).
    LegacyPmc(usize),
    /// A counter written at full width (IA32_A_PMCn, IA32_FIXED_CTRi, NetBurst counters).
    Counter(usize, u64),
    /// IA32_PERF_GLOBAL_STATUS: read-only (WRMSR #GP).
    Status,
    /// IA32_PERF_GLOBAL_OVF_CTRL: clears the written bits of `mask`; reads 0.
    OvfCtrl(u64),
    /// IA32_PERF_GLOBAL_STATUS_SET: sets the written bits of `mask`; reads 0.
    StatusSet(u64),
    /// IA32_PERF_GLOBAL_INUSE: read-only, derived from the selectors.
    Inuse,
    /// Read-only constant (IA32_PERF_CAPABILITIES).
    ReadOnly(u64),
    /// IA32_MISC_ENABLE: the PMU bits are read-only.
    MiscEnable,
    /// IA32_DS_AREA: any canonical address.
    DsArea,
    /// LBR FROM/TO/INFO: any value; changes while DEBUGCTL.LBR records.
    LbrEntry,
    /// MSR_LASTBRANCH_TOS: bits below the depth; changes while recording.
    LbrTos(u64),
}

/// Outcome of a WRMSR the model predicts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WrOutcome {
    /// Accepted.
    Ok,
    /// #GP.
    Gp,
    /// Either is acceptable (read-only MISC_ENABLE bits: ignored or #GP); the value must not
    /// change.
    Either,
}

/// Expected RDMSR result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RdExpect {
    /// #GP.
    Gp,
    /// Exactly this value.
    Exact(u64),
    /// A counter that may have counted: `lo..=lo + slack`, within `width`.
    Range(u64, u64),
    /// Unknown (an LBR entry after recording): any value, adopted.
    Any,
}

/// The model state.
pub struct Model {
    /// Architectural preset facts.
    pub p: &'static Preset,
    /// PEBS preset facts (format, load latency, LBR depth).
    pub pb: &'static PebsPreset,
    /// The backend counts (precise); false with `--pmu-backend off`.
    pub counts: bool,
    reg: [u64; MAX_MSR],
    lbr_gen: [u32; MAX_MSR],
    epoch: u32,
    ctr: [u64; SLOTS],
    slack: [u64; SLOTS],
    status: u64,
    misc: u64,
}

/// Saved state for undoing a modelled write.
pub struct Undo {
    msr: usize,
    reg: u64,
    lbr_gen: u32,
    ctr: Option<(usize, u64, u64)>,
    status: u64,
}

/// Bits 31:0 sign-extended.
pub fn sext32(v: u64) -> u64 {
    let low = v & ones(32);
    if low >> 31 == 1 { low | !ones(32) } else { low }
}

/// Canonical for 48-bit linear addresses (SDM 3.3.7.1).
pub fn canonical(v: u64) -> bool {
    let top = v >> 47;
    top == 0 || top == ones(17)
}

/// The ESCRs of a 64-bit family 0FH model 3+ Pentium 4 (vol. 4 table 2-43): no IQ_ESCR0/1.
fn nb_escr(i: u32) -> bool {
    (0x3A0..=0x3B9).contains(&i)
        || (0x3BC..=0x3BE).contains(&i)
        || (0x3C0..=0x3C5).contains(&i)
        || (0x3C8..=0x3CD).contains(&i)
        || i == 0x3E0
        || i == 0x3E1
}

fn slot(i: u32, base: u32, n: u32) -> Option<usize> {
    let off = i.checked_sub(base)?;
    if off < n {
        usize::try_from(off).ok()
    } else {
        None
    }
}

impl Model {
    /// The reset state (SDM: everything 0, GLOBAL_CTRL = the GP enable bits; MISC_ENABLE as
    /// read at start).
    pub const fn new(p: &'static Preset, pb: &'static PebsPreset) -> Self {
        Self {
            p,
            pb,
            counts: true,
            reg: [0; MAX_MSR],
            lbr_gen: [0; MAX_MSR],
            epoch: 0,
            ctr: [0; SLOTS],
            slack: [0; SLOTS],
            status: 0,
            misc: 0,
        }
    }

    /// Start from the reset state with `misc` as IA32_MISC_ENABLE.
    pub fn reset(&mut self, p: &'static Preset, pb: &'static PebsPreset, counts: bool, misc: u64) {
        *self = Self::new(p, pb);
        self.counts = counts;
        self.misc = misc;
        // LBR contents at reset are not architectural: the first read of each entry adopts it.
        self.epoch = 1;
        if !p.netburst && p.version() >= 2 {
            self.reg[IA32_PERF_GLOBAL_CTRL as usize] = ones(p.num_gp());
        }
    }

    fn lbr_format(&self) -> u64 {
        self.p.perf_caps.map_or(0, |c| c & PERF_CAP_LBR_FMT_MASK)
    }

    /// IA32_PEBS_ENABLE writable bits (SDM 18.4.4.1 Core: PMC0 only; 18.7.1.1 / vol. 4
    /// MSR_PEBS_ENABLE Nehalem-Skylake: PMC0-3 plus load latency at 35:32; 18.9.2 baseline:
    /// every GP counter and fixed counters from bit 32; NetBurst: replay-tagging metric bits,
    /// Enable PEBS (24), UOP_TAG (25)).
    fn pebs_enable_mask(&self) -> u64 {
        let p = self.p;
        match self.pb.fmt {
            Fmt::Netburst => {
                NETBURST_PEBS_METRIC_MASK | NETBURST_PEBS_ENABLE_BIT | NETBURST_PEBS_UOP_TAG
            }
            Fmt::F0 => 1,
            _ if p.baseline => ones(p.num_gp()) | p.fixed_bits() << 32,
            _ if self.pb.ld_lat => ones(p.num_gp()) | ones(p.num_gp().min(4)) << 32,
            _ => ones(p.num_gp()),
        }
    }

    /// IA32_DEBUGCTL writable bits (SDM 17.4.1; NetBurst MSR_DEBUGCTLA, SDM 17.12.x).
    fn debugctl_mask(&self) -> u64 {
        let p = self.p;
        if p.netburst {
            return 0x7F;
        }
        let mut m = DEBUGCTL_LBR
            | DEBUGCTL_BTF
            | DEBUGCTL_TR
            | DEBUGCTL_BTS
            | DEBUGCTL_BTINT
            | DEBUGCTL_BTS_OFF_OS
            | DEBUGCTL_BTS_OFF_USR;
        if p.version() >= 2 {
            m |= DEBUGCTL_FREEZE_LBRS_ON_PMI | DEBUGCTL_FREEZE_PERFMON_ON_PMI;
        }
        if p.smm_freeze() {
            m |= DEBUGCTL_FREEZE_WHILE_SMM;
        }
        if p.tsx {
            m |= DEBUGCTL_RTM_DEBUG;
        }
        m
    }

    /// What `msr` is on this preset.
    pub fn kind(&self, msr: u32) -> Kind {
        let p = self.p;
        let depth = self.pb.lbr_depth;
        match msr {
            IA32_DEBUGCTL => return Kind::Rw(self.debugctl_mask()),
            IA32_MISC_ENABLE => return Kind::MiscEnable,
            IA32_DS_AREA if p.ds => return Kind::DsArea,
            IA32_PEBS_ENABLE => return Kind::Rw(self.pebs_enable_mask()),
            _ => {}
        }
        if p.netburst {
            if let Some(k) = slot(msr, MSR_BPU_COUNTER0, NETBURST_NUM_COUNTERS) {
                return Kind::Counter(k, ones(NB_WIDTH));
            }
            if slot(msr, MSR_BPU_CCCR0, NETBURST_NUM_COUNTERS).is_some() {
                return Kind::Rw(CCCR_WRITABLE);
            }
            if nb_escr(msr) {
                return Kind::Rw(ESCR_WRITABLE);
            }
            if msr == NETBURST_PEBS_MATRIX_VERT {
                return Kind::Rw(NETBURST_MATRIX_VERT_MASK);
            }
            return Kind::Absent;
        }
        // LBRs (SDM 17.5-17.13; vol. 4: Core 2 at 40H/60H, Nehalem layout at 680H/6C0H, LBR_INFO
        // at DC0H with LBR format 5).
        if depth > 0 {
            let (from, to) = if self.pb.fmt == Fmt::F0 {
                (CORE2_LASTBRANCH_0_FROM_IP, CORE2_LASTBRANCH_0_TO_IP)
            } else {
                (MSR_LASTBRANCH_0_FROM_IP, MSR_LASTBRANCH_0_TO_IP)
            };
            if slot(msr, from, depth).is_some() || slot(msr, to, depth).is_some() {
                return Kind::LbrEntry;
            }
            if slot(msr, MSR_LBR_INFO_0, depth).is_some() && self.lbr_format() == 5 {
                return Kind::LbrEntry;
            }
            if msr == MSR_LASTBRANCH_TOS {
                return Kind::LbrTos(u64::from(depth) - 1);
            }
            if msr == MSR_LBR_SELECT && self.pb.fmt != Fmt::F0 {
                let cs = if self.lbr_format() >= 4 {
                    LBR_SELECT_EN_CALLSTACK
                } else {
                    0
                };
                return Kind::Rw(LBR_SELECT_FILTER_MASK | cs);
            }
        }
        let n = p.num_gp();
        let gw = ones(p.gp_width());
        if let Some(k) = slot(msr, IA32_PMC0, n) {
            return Kind::LegacyPmc(k);
        }
        if let Some(k) = slot(msr, IA32_A_PMC0, n) {
            return if p.fw_write() {
                Kind::Counter(k, gw)
            } else {
                Kind::Absent
            };
        }
        if let Some(k) = slot(msr, IA32_PERFEVTSEL0, n) {
            return Kind::Rw(p.evtsel_writable(u32::try_from(k).unwrap_or(0)));
        }
        if let Some(i) = slot(msr, IA32_FIXED_CTR0, 8) {
            return if p.has_fixed(u32::try_from(i).unwrap_or(31)) {
                Kind::Counter(FIXED_SLOT + i, ones(p.fixed_width()))
            } else {
                Kind::Absent
            };
        }
        let v = p.version();
        match msr {
            IA32_FIXED_CTR_CTRL if v >= 2 => Kind::Rw(p.fixed_ctrl_writable()),
            IA32_PERF_GLOBAL_STATUS if v >= 2 => Kind::Status,
            IA32_PERF_GLOBAL_CTRL if v >= 2 => Kind::Rw(p.counter_bits()),
            IA32_PERF_GLOBAL_OVF_CTRL if v >= 2 => Kind::OvfCtrl(p.status_reset_writable()),
            IA32_PERF_GLOBAL_STATUS_SET if v >= 4 => Kind::StatusSet(p.status_set_writable()),
            IA32_PERF_GLOBAL_INUSE if v >= 4 => Kind::Inuse,
            IA32_PERF_CAPABILITIES => p.perf_caps.map_or(Kind::Absent, Kind::ReadOnly),
            // MSR_PEBS_DATA_CFG (SDM 18.9.2.3): groups 3:0, LBR entries 31:24.
            MSR_PEBS_DATA_CFG if p.baseline => Kind::Rw(0xF | 0xFF << 24),
            // MSR_PEBS_LD_LAT (vol. 4): threshold 15:0.
            MSR_PEBS_LD_LAT_THRESHOLD if self.pb.ld_lat => Kind::Rw(ones(16)),
            // MSR_PEBS_FRONTEND from Skylake (PEBS format 3+).
            MSR_PEBS_FRONTEND if matches!(self.pb.fmt, Fmt::F3 | Fmt::F4 | Fmt::F5) => {
                Kind::Rw(PEBS_FRONTEND_MASK)
            }
            _ => Kind::Absent,
        }
    }

    /// Writable bits of `msr` for value generation (0 when nothing is writable).
    pub fn writable(&self, msr: u32) -> u64 {
        match self.kind(msr) {
            Kind::Rw(m)
            | Kind::Counter(_, m)
            | Kind::OvfCtrl(m)
            | Kind::StatusSet(m)
            | Kind::LbrTos(m) => m,
            Kind::LegacyPmc(_) | Kind::LbrEntry => u64::MAX,
            Kind::DsArea => ones(47),
            Kind::MiscEnable => MISC_PMU_MASK,
            Kind::Absent | Kind::Status | Kind::Inuse | Kind::ReadOnly(_) => 0,
        }
    }

    fn width_of(&self, slot: usize) -> u64 {
        if self.p.netburst {
            ones(NB_WIDTH)
        } else if slot >= FIXED_SLOT {
            ones(self.p.fixed_width())
        } else {
            ones(self.p.gp_width())
        }
    }

    /// Counter `slot` may count at CPL0: EVTSELn.EN and OS with GLOBAL_CTRL bit n (fixed: the
    /// OS enable with GLOBAL_CTRL bit 32+i); NetBurst: CCCR enable. CTR_Frz is ignored.
    pub fn may_count(&self, slot: usize) -> bool {
        if !self.counts {
            return false;
        }
        let p = self.p;
        if p.netburst {
            return u32::try_from(slot).is_ok_and(|k| k < NETBURST_NUM_COUNTERS)
                && self.reg[(MSR_BPU_CCCR0 as usize) + slot] & CCCR_ENABLE != 0;
        }
        let global = self.reg[IA32_PERF_GLOBAL_CTRL as usize];
        if slot < FIXED_SLOT {
            let Ok(n) = u32::try_from(slot) else {
                return false;
            };
            if n >= p.num_gp() {
                return false;
            }
            let e = self.reg[(IA32_PERFEVTSEL0 + n) as usize];
            e & EVTSEL_EN != 0 && e & EVTSEL_OS != 0 && (p.version() < 2 || global >> n & 1 == 1)
        } else {
            let Ok(i) = u32::try_from(slot - FIXED_SLOT) else {
                return false;
            };
            p.has_fixed(i)
                && self.reg[IA32_FIXED_CTR_CTRL as usize] >> (4 * i) & FIXED_CTRL_OS != 0
                && global >> (32 + i) & 1 == 1
        }
    }

    fn slots(&self) -> core::ops::Range<usize> {
        0..SLOTS
    }

    /// After an MSR operation: counters that may count may have advanced.
    pub fn tick(&mut self) {
        for s in self.slots() {
            if self.may_count(s) {
                self.slack[s] = self.slack[s].saturating_add(SLACK_PER_OP);
            }
        }
        if self.reg[IA32_DEBUGCTL as usize] & DEBUGCTL_LBR != 0 {
            // Recording (with the precise backend) may change every entry and the TOS.
            self.epoch = self.epoch.wrapping_add(1);
        }
    }

    /// IA32_PERF_GLOBAL_INUSE (SDM 18.2.4.3): EVTSELn[7:0] != 0, fixed enable field != 0,
    /// bit 63 if any INT, fixed PMI or PEBS_ENABLE PMC bit is set.
    fn inuse(&self) -> u64 {
        let p = self.p;
        let mut v = 0;
        let mut pmi = self.reg[IA32_PEBS_ENABLE as usize] & ones(p.num_gp()) != 0;
        for n in 0..p.num_gp() {
            let e = self.reg[(IA32_PERFEVTSEL0 + n) as usize];
            if e & EVTSEL_EVENT_MASK != 0 {
                v |= 1 << n;
            }
            pmi |= e & EVTSEL_INT != 0;
        }
        let fc = self.reg[IA32_FIXED_CTR_CTRL as usize];
        for i in (0..4).filter(|&i| p.has_fixed(i)) {
            let f = fc >> (4 * i);
            if f & FIXED_CTRL_EN_MASK != 0 {
                v |= 1 << (32 + i);
            }
            pmi |= f & FIXED_CTRL_PMI != 0;
        }
        if pmi {
            v |= GLOBAL_INUSE_PMI;
        }
        v
    }

    /// What RDMSR of `msr` must give.
    pub fn expect_read(&self, msr: u32) -> RdExpect {
        let i = msr as usize;
        match self.kind(msr) {
            Kind::Absent => RdExpect::Gp,
            Kind::Rw(_) | Kind::DsArea => RdExpect::Exact(self.reg[i]),
            Kind::LegacyPmc(s) | Kind::Counter(s, _) => {
                if self.slack[s] == 0 {
                    RdExpect::Exact(self.ctr[s])
                } else {
                    RdExpect::Range(self.ctr[s], self.slack[s])
                }
            }
            Kind::Status => RdExpect::Exact(self.status),
            Kind::OvfCtrl(_) | Kind::StatusSet(_) => RdExpect::Exact(0),
            Kind::Inuse => RdExpect::Exact(self.inuse()),
            Kind::ReadOnly(v) => RdExpect::Exact(v),
            Kind::MiscEnable => RdExpect::Exact(self.misc),
            Kind::LbrEntry | Kind::LbrTos(_) => {
                if self.lbr_gen[i] == self.epoch {
                    RdExpect::Exact(self.reg[i])
                } else {
                    RdExpect::Any
                }
            }
        }
    }

    /// Check a successful read against `e`; on success adopt the value. Returns the expected
    /// value text on a mismatch.
    pub fn accept_read(&mut self, msr: u32, got: u64) -> Result<(), RdExpect> {
        let e = self.expect_read(msr);
        let ok = match e {
            RdExpect::Gp => false,
            RdExpect::Exact(v) => got == v,
            RdExpect::Range(lo, slack) => {
                let s = match self.kind(msr) {
                    Kind::LegacyPmc(s) | Kind::Counter(s, _) => s,
                    _ => 0,
                };
                got >= lo && got - lo <= slack && got & !self.width_of(s) == 0
            }
            RdExpect::Any => match self.kind(msr) {
                Kind::LbrTos(m) => got & !m == 0,
                _ => true,
            },
        };
        if !ok {
            return Err(e);
        }
        let i = msr as usize;
        match self.kind(msr) {
            Kind::LegacyPmc(s) | Kind::Counter(s, _) => {
                self.ctr[s] = got;
                self.slack[s] = 0;
            }
            Kind::LbrEntry | Kind::LbrTos(_) => {
                self.reg[i] = got;
                self.lbr_gen[i] = self.epoch;
            }
            _ => {}
        }
        Ok(())
    }

    /// The outcome of WRMSR(`msr`, `v`) and, if accepted, the model updated (undo kept).
    pub fn apply_write(&mut self, msr: u32, v: u64) -> (WrOutcome, Undo) {
        let i = msr as usize;
        let mut undo = Undo {
            msr: i,
            reg: self.reg[i],
            lbr_gen: self.lbr_gen[i],
            ctr: None,
            status: self.status,
        };
        let fits = |m: u64| v & !m == 0;
        let out = match self.kind(msr) {
            Kind::Absent | Kind::Status | Kind::Inuse | Kind::ReadOnly(_) => WrOutcome::Gp,
            Kind::Rw(m) if fits(m) => {
                self.reg[i] = v;
                WrOutcome::Ok
            }
            Kind::LegacyPmc(s) => {
                undo.ctr = Some((s, self.ctr[s], self.slack[s]));
                self.ctr[s] = sext32(v) & self.width_of(s);
                self.slack[s] = 0;
                WrOutcome::Ok
            }
            Kind::Counter(s, m) if fits(m) => {
                undo.ctr = Some((s, self.ctr[s], self.slack[s]));
                self.ctr[s] = v;
                self.slack[s] = 0;
                WrOutcome::Ok
            }
            Kind::OvfCtrl(m) if fits(m) => {
                self.status &= !v;
                WrOutcome::Ok
            }
            Kind::StatusSet(m) if fits(m) => {
                self.status |= v;
                WrOutcome::Ok
            }
            // Only the PMU bits are ever flipped (the generator keeps the others).
            Kind::MiscEnable => WrOutcome::Either,
            Kind::DsArea if canonical(v) => {
                self.reg[i] = v;
                WrOutcome::Ok
            }
            Kind::LbrEntry => {
                self.reg[i] = v;
                self.lbr_gen[i] = self.epoch;
                WrOutcome::Ok
            }
            Kind::LbrTos(m) if fits(m) => {
                self.reg[i] = v;
                self.lbr_gen[i] = self.epoch;
                WrOutcome::Ok
            }
            _ => WrOutcome::Gp,
        };
        (out, undo)
    }

    /// Revert a write the fuzzer decided not to perform.
    pub fn undo(&mut self, u: Undo) {
        self.reg[u.msr] = u.reg;
        self.lbr_gen[u.msr] = u.lbr_gen;
        if let Some((s, c, sl)) = u.ctr {
            self.ctr[s] = c;
            self.slack[s] = sl;
        }
        self.status = u.status;
    }

    /// Whether the state after a write (compared with `before`, the counting set before it)
    /// lets a counter whose counting or value the write changed run into its wrap, or turns
    /// on BTS stores (TR and BTS both set: records through an arbitrary DS area).
    pub fn write_is_risky(&self, before: u32, undo: &Undo) -> bool {
        let (tr, bts) = if self.p.netburst {
            (NETBURST_DEBUGCTLA_TR, NETBURST_DEBUGCTLA_BTS)
        } else {
            (DEBUGCTL_TR, DEBUGCTL_BTS)
        };
        let dbg = self.reg[IA32_DEBUGCTL as usize];
        if dbg & tr != 0 && dbg & bts != 0 {
            return true;
        }
        // NetBurst FORCE_OVF overflows on every increment.
        if self.p.netburst {
            for k in 0..NETBURST_NUM_COUNTERS as usize {
                let c = self.reg[MSR_BPU_CCCR0 as usize + k];
                if c & CCCR_ENABLE != 0 && c & CCCR_FORCE_OVF != 0 {
                    return true;
                }
            }
        }
        let changed = undo.ctr.map(|(s, _, _)| s);
        self.slots().any(|s| {
            let now = self.may_count(s);
            let started = now && (before >> s & 1 == 0 || changed == Some(s));
            started
                && self.ctr[s]
                    .saturating_add(self.slack[s])
                    .saturating_add(SAFE_DIST)
                    > self.width_of(s)
        })
    }

    /// Bitmap of the counters that may count now.
    pub fn counting_set(&self) -> u32 {
        self.slots()
            .filter(|&s| self.may_count(s))
            .fold(0, |m, s| m | 1 << s)
    }

    /// Current model value of a plain register.
    pub fn reg(&self, msr: u32) -> u64 {
        self.reg[msr as usize]
    }

    /// IA32_PERF_GLOBAL_STATUS of the model.
    pub fn status(&self) -> u64 {
        self.status
    }

    /// IA32_MISC_ENABLE of the model.
    pub fn misc(&self) -> u64 {
        self.misc
    }

    /// Set counter `msr`'s model value to an exact known count (after the counted region).
    pub fn set_counter_exact(&mut self, msr: u32, v: u64) {
        if let Kind::LegacyPmc(s) | Kind::Counter(s, _) = self.kind(msr) {
            self.ctr[s] = v;
            self.slack[s] = 0;
        }
    }

    /// After a mismatch, take the VMM's value so one bug is reported once, not on every
    /// later access.
    pub fn resync(&mut self, msr: u32, got: u64) {
        let i = msr as usize;
        match self.kind(msr) {
            Kind::LegacyPmc(_) | Kind::Counter(..) => self.set_counter_exact(msr, got),
            Kind::Rw(_) | Kind::DsArea | Kind::LbrEntry | Kind::LbrTos(_) => {
                self.reg[i] = got;
                self.lbr_gen[i] = self.epoch;
            }
            Kind::Status => self.status = got,
            Kind::MiscEnable => self.misc = got,
            Kind::Absent
            | Kind::OvfCtrl(_)
            | Kind::StatusSet(_)
            | Kind::Inuse
            | Kind::ReadOnly(_) => {}
        }
    }

    /// Record a write the counted region performed itself (known to be accepted).
    pub fn set_reg(&mut self, msr: u32, v: u64) {
        self.reg[msr as usize] = v;
    }
}
