//! The per-vCPU virtual PMU: the MSR file of a CPU model, counting, overflow status, the
//! PEBS assist call and the PMI decision (PMI *delivery* through the LVTPC is the VMM's).
//!
//! Design decisions (SDM and Linux checked):
//! - A PEBS-enabled counter's overflow sets its own IA32_PERF_GLOBAL_STATUS bit *before* the
//!   assist, so fmt1/fmt2 records carry it in their status field (SDM 18.6.2.4: "the state of
//!   IA32_PERF_GLOBAL_STATUS before the PEBS assist"; Linux's nhm drain needs exactly one
//!   PEBS bit there) and as Skylake does (Linux core.c handle_pmi_common: "the overflow status
//!   bit for the PEBS counter will be on Skylake"). Linux masks PEBS counters out of the
//!   status it processes and drains on OvfBuffer (bit 62) only. The bit requests a PMI only if
//!   the counter's INT/PMI bit is set, which Linux clears for PEBS events: the PEBS PMI comes
//!   from OvfBuffer when the assist reports the interrupt threshold reached.
//! - After an assist the counter is reloaded from its reset slot plus the events it counted
//!   after the wrap (0 when the backend reports exactly at the overflow).
//! - FREEZE_PERFMON_ON_PMI: v4+ sets CTR_Frz (bit 59) and counters stop while it is set
//!   ("streamlined freeze", SDM 18.2.4.1); v2/v3 clear IA32_PERF_GLOBAL_CTRL (SDM 17.4.7).
//!   FREEZE_LBRS_ON_PMI likewise sets LBR_Frz (v4+) or clears DEBUGCTL.LBR.
//! - IA32_PERF_GLOBAL_CTRL resets to the GP enable bits (SDM: "sets bits n-1:0"), as KVM does.
//! - Branch records ([`Vpmu::record_branch`], fed by the precise backend): the LBR stack
//!   ([`crate::lbr`]) records while DEBUGCTL.LBR is set and LBR_Frz is clear; BTS
//!   ([`crate::bts`]) stores through the DS area and requests a PMI at its threshold with BTINT.

mod regs;
mod trap;

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use regs::Reg;
pub use trap::trapped_msrs;

use crate::backend::{BackendError, CountingBackend};
use crate::bts::{self, BtsControl, BtsOutcome};
use crate::counter::{CounterId, CounterProgram, decode_evtsel, distance_to_overflow, fixed_event};
use crate::lbr::{LbrAction, LbrStack, TakenBranch};
use crate::mem::GuestMemory;
use crate::model::{CpuModel, PebsFormat, PmuArch, low_bits};
use crate::msr::*;
use crate::netburst::NetburstPmu;
use crate::pebs::{AssistRequest, DropCause, assist};
use crate::state::{EventInfo, GuestState, LbrEntry, PagingRegs};

/// Why an MSR access or RDPMC faults (#GP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum MsrError {
    /// The model has no such MSR.
    #[error("MSR {0:#x} does not exist on this CPU model")]
    NotPresent(u32),
    /// The MSR is read-only.
    #[error("MSR {0:#x} is read-only")]
    ReadOnly(u32),
    /// The value sets reserved bits.
    #[error("MSR {index:#x}: value {value:#x} sets reserved bits {reserved:#x}")]
    Reserved {
        /// MSR index.
        index: u32,
        /// Value written.
        value: u64,
        /// The offending bits.
        reserved: u64,
    },
    /// The value is not a canonical linear address.
    #[error("MSR {index:#x}: {value:#x} is not a canonical address")]
    NonCanonical {
        /// MSR index.
        index: u32,
        /// Value written.
        value: u64,
    },
    /// RDPMC with an ECX that names no counter of the model.
    #[error("RDPMC ECX {0:#x} names no counter of this CPU model")]
    BadRdpmc(u32),
}

/// One GP counter.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
struct GpCounter {
    value: u64,
    evtsel: u64,
}

/// What [`Vpmu::record_branch`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BranchOutcome {
    /// What the LBR stack did; `None` when LBRs are disabled, frozen or absent.
    pub lbr: Option<LbrAction>,
    /// The BTS store; `None` when BTS does not store this branch (controls, CPL).
    pub bts: Option<BtsOutcome>,
    /// A PMI is requested (BTS threshold with BTINT); also latched for
    /// [`Vpmu::take_pmi_request`].
    pub pmi: bool,
}

/// What [`Vpmu::handle_overflow`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OverflowOutcome {
    /// A PMI is requested (also latched for [`Vpmu::take_pmi_request`]).
    pub pmi: bool,
    /// PEBS records written.
    pub records_written: u32,
    /// Why a PEBS assist wrote nothing, per assist that dropped.
    pub dropped: Vec<DropCause>,
    /// Counters that wrapped and went through the PEBS assist (status-bit layout).
    pub pebs_counters: u64,
    /// PEBS counters whose reload plus the events they counted after the wrap passed the
    /// overflow point again (a backend that reports late, across more than one period): each
    /// such wrap is another assist, so the caller hands them to `handle_overflow` again.
    pub rewrapped: Vec<CounterId>,
}

impl OverflowOutcome {
    fn merge(&mut self, other: OverflowOutcome) {
        self.pmi |= other.pmi;
        self.records_written += other.records_written;
        self.dropped.extend(other.dropped);
        self.pebs_counters |= other.pebs_counters;
        self.rewrapped.extend(other.rewrapped);
    }
}

/// One vCPU's virtual PMU.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Vpmu {
    model: CpuModel,
    gp: Vec<GpCounter>,
    fixed: Vec<u64>,
    fixed_ctrl: u64,
    global_ctrl: u64,
    global_status: u64,
    debugctl: u64,
    misc_enable: u64,
    ds_area: u64,
    pebs_enable: u64,
    pebs_data_cfg: u64,
    pebs_ld_lat: u64,
    pebs_frontend: u64,
    pebs_matrix_vert: u64,
    lbr: LbrStack,
    netburst: NetburstPmu,
    generation: u64,
    pmi_pending: bool,
    /// The generation last given to a backend by [`Vpmu::sync_backend`]; a restored vPMU has
    /// none, so its new backend gets programmed.
    #[serde(skip)]
    programmed: Option<u64>,
}

impl Vpmu {
    /// A vPMU in its post-RESET state. `model` should have passed [`CpuModel::validate`].
    pub fn new(model: CpuModel) -> Vpmu {
        let global_ctrl = if model.pmu_version >= 2 {
            model.gp_counter_mask()
        } else {
            0
        };
        let misc_enable = MISC_ENABLE_FAST_STRING | model.misc_enable();
        Vpmu {
            gp: vec![GpCounter::default(); usize::from(model.num_gp)],
            fixed: vec![0; usize::from(MAX_FIXED_COUNTERS)],
            fixed_ctrl: 0,
            global_ctrl,
            global_status: 0,
            debugctl: 0,
            misc_enable,
            ds_area: 0,
            pebs_enable: 0,
            pebs_data_cfg: 0,
            pebs_ld_lat: 0,
            pebs_frontend: 0,
            pebs_matrix_vert: 0,
            lbr: LbrStack::new(model.lbr_depth),
            netburst: NetburstPmu::default(),
            generation: 1,
            pmi_pending: false,
            programmed: None,
            model,
        }
    }

    /// The CPU model.
    pub fn model(&self) -> &CpuModel {
        &self.model
    }

    /// Whether `index` lies in [`trapped_msrs`] for this vPMU's model.
    pub fn handles(&self, index: u32) -> bool {
        trapped_msrs(&self.model).iter().any(|r| r.contains(&index))
    }

    /// Bumped by every change of what or how the counters count (MSR writes, overflow
    /// reloads, freezes): a backend reprograms when it changes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Whether a PMI is requested and not yet taken.
    pub fn pmi_pending(&self) -> bool {
        self.pmi_pending
    }

    /// Returns whether a PMI was requested since the last call, and clears the request.
    pub fn take_pmi_request(&mut self) -> bool {
        std::mem::take(&mut self.pmi_pending)
    }

    // ---- MSR access ----

    /// RDMSR. `Err` means inject #GP.
    pub fn rdmsr(&mut self, index: u32) -> Result<u64, MsrError> {
        let reg = regs::decode(&self.model, index).ok_or(MsrError::NotPresent(index))?;
        let m = &self.model;
        let v = match reg {
            Reg::Pmc(n) | Reg::APmc(n) => self.gp[usize::from(n)].value & m.gp_mask(),
            Reg::EvtSel(n) => self.gp[usize::from(n)].evtsel,
            Reg::FixedCtr(i) => self.fixed[usize::from(i)] & m.fixed_mask(),
            Reg::FixedCtrl => self.fixed_ctrl,
            Reg::GlobalStatus => self.global_status,
            Reg::GlobalCtrl => self.global_ctrl,
            // Write-to-clear / write-to-set registers read as 0 (as KVM answers).
            Reg::GlobalOvfCtrl | Reg::GlobalStatusSet => 0,
            Reg::GlobalInuse => self.inuse(),
            Reg::PerfCapabilities => m.perf_capabilities(),
            Reg::DebugCtl => self.debugctl,
            Reg::MiscEnable => self.misc_enable,
            Reg::DsArea => self.ds_area,
            Reg::PebsEnable => self.pebs_enable,
            Reg::PebsDataCfg => self.pebs_data_cfg,
            Reg::PebsLdLat => self.pebs_ld_lat,
            Reg::PebsFrontend => self.pebs_frontend,
            Reg::PebsMatrixVert => self.pebs_matrix_vert,
            Reg::LbrSelect => self.lbr.select(),
            Reg::LbrTos => self.lbr.tos(),
            Reg::LbrFrom(n) => self.lbr.from_ip(n),
            Reg::LbrTo(n) => self.lbr.to_ip(n),
            Reg::LbrInfo(n) => self.lbr.info(n),
            Reg::NbCounter(n) => self.netburst.counters[usize::from(n)],
            Reg::NbCccr(n) => self.netburst.cccrs[usize::from(n)],
            Reg::NbEscr(msr) => self.netburst.escr(msr),
        };
        Ok(v)
    }

    /// WRMSR. `Err` means inject #GP; the state is then unchanged.
    pub fn wrmsr(&mut self, index: u32, value: u64) -> Result<(), MsrError> {
        let reg = regs::decode(&self.model, index).ok_or(MsrError::NotPresent(index))?;
        let check = |mask: u64| {
            let reserved = value & !mask;
            if reserved == 0 {
                Ok(value)
            } else {
                Err(MsrError::Reserved {
                    index,
                    value,
                    reserved,
                })
            }
        };
        let m = &self.model;
        match reg {
            Reg::Pmc(n) => {
                self.gp[usize::from(n)].value = regs::sign_extend_32(value) & m.gp_mask()
            }
            Reg::APmc(n) => self.gp[usize::from(n)].value = check(m.gp_mask())?,
            Reg::EvtSel(n) => self.gp[usize::from(n)].evtsel = check(regs::evtsel_mask(m, n))?,
            Reg::FixedCtr(i) => self.fixed[usize::from(i)] = check(m.fixed_mask())?,
            Reg::FixedCtrl => self.fixed_ctrl = check(regs::fixed_ctrl_mask(m))?,
            Reg::GlobalCtrl => self.global_ctrl = check(m.global_counter_bits())?,
            Reg::GlobalOvfCtrl => self.global_status &= !check(regs::status_reset_mask(m))?,
            Reg::GlobalStatusSet => self.global_status |= check(regs::status_set_mask(m))?,
            Reg::GlobalStatus | Reg::GlobalInuse | Reg::PerfCapabilities => {
                return Err(MsrError::ReadOnly(index));
            }
            Reg::DebugCtl => self.debugctl = check(regs::debugctl_mask(m))?,
            Reg::MiscEnable => {
                // The PMU bits are read-only and keep their value; the rest is stored.
                let ro = MISC_ENABLE_PERF_MON_AVAILABLE
                    | MISC_ENABLE_BTS_UNAVAILABLE
                    | MISC_ENABLE_PEBS_UNAVAILABLE;
                self.misc_enable = (value & !ro) | m.misc_enable();
            }
            Reg::DsArea => {
                if !regs::is_canonical(value) {
                    return Err(MsrError::NonCanonical { index, value });
                }
                self.ds_area = value;
            }
            Reg::PebsEnable => self.pebs_enable = check(regs::pebs_enable_mask(m))?,
            Reg::PebsDataCfg => self.pebs_data_cfg = check(regs::pebs_data_cfg_mask())?,
            Reg::PebsLdLat => self.pebs_ld_lat = check(PEBS_LD_LAT_MASK)?,
            Reg::PebsFrontend => self.pebs_frontend = check(PEBS_FRONTEND_MASK)?,
            Reg::PebsMatrixVert => self.pebs_matrix_vert = check(NETBURST_MATRIX_VERT_MASK)?,
            Reg::LbrSelect => self.lbr.set_select(check(regs::lbr_select_mask(m))?),
            Reg::LbrTos => self.lbr.set_tos(check(regs::lbr_tos_mask(m))?),
            // The entries take any value, as Linux's save/restore of task stacks needs; the
            // SDM documents no #GP condition for them. (Linux's LBR_FORMAT_EIP_FLAGS2 quirk
            // implies format-4 parts without TSX fault on FROM values whose bits 62:61 are not
            // sign extension; no preset is such a part.)
            Reg::LbrFrom(n) => self.lbr.set_from_ip(n, value),
            Reg::LbrTo(n) => self.lbr.set_to_ip(n, value),
            Reg::LbrInfo(n) => self.lbr.set_info(n, value),
            Reg::NbCounter(n) => {
                self.netburst.counters[usize::from(n)] =
                    check(low_bits(u32::from(NETBURST_COUNTER_WIDTH)))?;
            }
            Reg::NbCccr(n) => self.netburst.cccrs[usize::from(n)] = check(CCCR_WRITABLE)?,
            Reg::NbEscr(msr) => {
                let v = check(ESCR_WRITABLE)?;
                self.netburst.set_escr(msr, v);
            }
        }
        self.generation += 1;
        Ok(())
    }

    /// IA32_PERF_GLOBAL_INUSE (SDM 18.2.4.3): EVTSELn[7:0] != 0, fixed enable fields != 0,
    /// bit 63 if any INT, fixed PMI or PMC PEBS enable is set.
    fn inuse(&self) -> u64 {
        let mut v = 0;
        let mut pmi = self.pebs_enable & self.model.gp_counter_mask() != 0;
        for (n, c) in self.gp.iter().enumerate() {
            if c.evtsel & EVTSEL_EVENT_MASK != 0 {
                v |= 1 << n;
            }
            pmi |= c.evtsel & EVTSEL_INT != 0;
        }
        for i in (0..MAX_FIXED_COUNTERS).filter(|&i| self.model.has_fixed(i)) {
            let field = self.fixed_field(i);
            if field & FIXED_CTRL_EN_MASK != 0 {
                v |= 1 << (GLOBAL_FIXED_SHIFT + u32::from(i));
            }
            pmi |= field & FIXED_CTRL_PMI != 0;
        }
        if pmi {
            v |= GLOBAL_INUSE_PMI;
        }
        v
    }

    // ---- Counting ----

    fn fixed_field(&self, i: u8) -> u64 {
        (self.fixed_ctrl >> (FIXED_CTRL_FIELD_BITS * u32::from(i)))
            & low_bits(FIXED_CTRL_FIELD_BITS)
    }

    /// Counters are frozen by CTR_Frz (v4+).
    fn frozen(&self) -> bool {
        self.model.pmu_version >= 4 && self.global_status & GLOBAL_STATUS_CTR_FRZ != 0
    }

    fn globally_enabled(&self, id: CounterId) -> bool {
        self.model.pmu_version < 2 || self.global_ctrl >> id.status_bit() & 1 == 1
    }

    /// Whether `id`'s overflow goes through the PEBS assist.
    fn pebs_active(&self, id: CounterId) -> bool {
        match (self.model.pebs_format, id) {
            (PebsFormat::None, _) => false,
            (PebsFormat::Netburst, CounterId::Netburst(c)) => {
                c == NETBURST_IQ_COUNTER4_INDEX && self.pebs_enable & NETBURST_PEBS_ENABLE_BIT != 0
            }
            (PebsFormat::Netburst, _) => false,
            (_, CounterId::Gp(n)) => self.pebs_enable >> n & 1 == 1,
            (_, CounterId::Fixed(i)) => {
                self.model.pebs_baseline
                    && self.pebs_enable >> (GLOBAL_FIXED_SHIFT + u32::from(i)) & 1 == 1
            }
            (_, CounterId::Netburst(_)) => false,
        }
    }

    fn program_of(&self, id: CounterId) -> Option<CounterProgram> {
        let m = &self.model;
        match id {
            CounterId::Gp(n) => {
                let c = self.gp.get(usize::from(n))?;
                let e = c.evtsel;
                let (usr, os) = (e & EVTSEL_USR != 0, e & EVTSEL_OS != 0);
                if e & EVTSEL_EN == 0 || !(usr || os) || !self.globally_enabled(id) || self.frozen()
                {
                    return None;
                }
                Some(CounterProgram {
                    id,
                    event: decode_evtsel(m, e),
                    raw: e,
                    usr,
                    os,
                    edge: e & EVTSEL_EDGE != 0,
                    inv: e & EVTSEL_INV != 0,
                    cmask: crate::counter::low_byte(e >> EVTSEL_CMASK_SHIFT),
                    any: e & EVTSEL_ANY != 0,
                    pebs: self.pebs_active(id),
                    pmi: e & EVTSEL_INT != 0,
                    distance: distance_to_overflow(c.value, m.gp_width),
                })
            }
            CounterId::Fixed(i) => {
                if !m.has_fixed(i) {
                    return None;
                }
                let f = self.fixed_field(i);
                let (usr, os) = (f & FIXED_CTRL_USR != 0, f & FIXED_CTRL_OS != 0);
                if !(usr || os) || !self.globally_enabled(id) || self.frozen() {
                    return None;
                }
                Some(CounterProgram {
                    id,
                    event: fixed_event(i),
                    raw: f,
                    usr,
                    os,
                    edge: false,
                    inv: false,
                    cmask: 0,
                    any: f & FIXED_CTRL_ANY != 0,
                    pebs: self.pebs_active(id),
                    pmi: f & FIXED_CTRL_PMI != 0,
                    distance: distance_to_overflow(self.fixed[usize::from(i)], m.fixed_width),
                })
            }
            CounterId::Netburst(c) => self.netburst.program(m, c, self.pebs_active(id)),
        }
    }

    fn all_counters(&self) -> Vec<CounterId> {
        match self.model.arch {
            PmuArch::Architectural => (0..self.model.num_gp)
                .map(CounterId::Gp)
                .chain(
                    (0..MAX_FIXED_COUNTERS)
                        .filter(|&i| self.model.has_fixed(i))
                        .map(CounterId::Fixed),
                )
                .collect(),
            PmuArch::Netburst => (0..u8::try_from(NETBURST_NUM_COUNTERS).unwrap_or(0))
                .map(CounterId::Netburst)
                .collect(),
        }
    }

    /// What every counting counter counts now.
    pub fn programs(&self) -> Vec<CounterProgram> {
        self.all_counters()
            .into_iter()
            .filter_map(|id| self.program_of(id))
            .collect()
    }

    /// The current value of a counter (masked to its width), for RDPMC and tests.
    pub fn counter_value(&self, id: CounterId) -> Option<u64> {
        let m = &self.model;
        match (m.arch, id) {
            (PmuArch::Architectural, CounterId::Gp(n)) => {
                self.gp.get(usize::from(n)).map(|c| c.value & m.gp_mask())
            }
            (PmuArch::Architectural, CounterId::Fixed(i)) if m.has_fixed(i) => {
                Some(self.fixed[usize::from(i)] & m.fixed_mask())
            }
            (PmuArch::Netburst, CounterId::Netburst(c)) => {
                self.netburst.counters.get(usize::from(c)).copied()
            }
            _ => None,
        }
    }

    fn set_counter(&mut self, id: CounterId, value: u64) {
        let m = &self.model;
        match id {
            CounterId::Gp(n) => {
                if let Some(c) = self.gp.get_mut(usize::from(n)) {
                    c.value = value & m.gp_mask();
                }
            }
            CounterId::Fixed(i) => {
                if let Some(c) = self.fixed.get_mut(usize::from(i)) {
                    *c = value & m.fixed_mask();
                }
            }
            CounterId::Netburst(c) => {
                if let Some(v) = self.netburst.counters.get_mut(usize::from(c)) {
                    *v = value & low_bits(u32::from(NETBURST_COUNTER_WIDTH));
                }
            }
        }
    }

    fn width(&self, id: CounterId) -> u8 {
        match id {
            CounterId::Gp(_) => self.model.gp_width,
            CounterId::Fixed(_) => self.model.fixed_width,
            CounterId::Netburst(_) => NETBURST_COUNTER_WIDTH,
        }
    }

    /// RDPMC: ECX[30] selects the fixed counters, ECX[31] (fast read, low 32 bits) exists on
    /// NetBurst only. `Err` means #GP.
    pub fn rdpmc(&self, ecx: u32) -> Result<u64, MsrError> {
        let bad = MsrError::BadRdpmc(ecx);
        if self.model.arch == PmuArch::Netburst {
            let index = u8::try_from(ecx & !RDPMC_FAST).map_err(|_| bad)?;
            let v = self.counter_value(CounterId::Netburst(index)).ok_or(bad)?;
            return Ok(if ecx & RDPMC_FAST != 0 {
                v & low_bits(32)
            } else {
                v
            });
        }
        if ecx & RDPMC_FAST != 0 {
            return Err(bad);
        }
        let index = u8::try_from(ecx & !RDPMC_FIXED).map_err(|_| bad)?;
        let id = if ecx & RDPMC_FIXED != 0 {
            CounterId::Fixed(index)
        } else {
            CounterId::Gp(index)
        };
        self.counter_value(id).ok_or(bad)
    }

    /// Adds counted events; returns the counters that wrapped (each once). Counts for counters
    /// that are not counting (a stale backend program) are ignored.
    pub fn add_counts(&mut self, deltas: &[(CounterId, u64)]) -> Vec<CounterId> {
        let mut wrapped = Vec::new();
        for &(id, delta) in deltas {
            if delta == 0 || self.program_of(id).is_none() {
                continue;
            }
            let Some(old) = self.counter_value(id) else {
                continue;
            };
            let mask = low_bits(u32::from(self.width(id)));
            let sum = u128::from(old) + u128::from(delta);
            if sum > u128::from(mask) && !wrapped.contains(&id) {
                wrapped.push(id);
            }
            let new = u64::try_from(sum & u128::from(mask)).unwrap_or(0);
            self.set_counter(id, new);
        }
        wrapped
    }

    /// The LBR stack, newest (TOS) first, as raw MSR values: every entry of the model's depth
    /// (empty without LBRs).
    pub fn lbr_entries(&self) -> Vec<LbrEntry> {
        self.lbr.entries_newest_first()
    }

    /// The LBR stack records: DEBUGCTL.LBR set, not frozen by LBR_Frz (v4+), and the model
    /// has LBRs.
    fn lbr_recording(&self) -> bool {
        let frozen = self.model.arch == PmuArch::Architectural
            && self.model.pmu_version >= 4
            && self.global_status & GLOBAL_STATUS_LBR_FRZ != 0;
        self.model.lbr_depth > 0 && self.debugctl & DEBUGCTL_LBR != 0 && !frozen
    }

    fn bts_control(&self) -> BtsControl {
        if !self.model.ds {
            return BtsControl::default();
        }
        BtsControl::from_debugctl(self.model.arch, self.debugctl)
    }

    /// Whether [`Vpmu::record_branch`] would do anything: the LBR stack records or BTS
    /// stores. The backend may skip the call (and its cost) when this is false.
    pub fn wants_branches(&self) -> bool {
        self.lbr_recording() || self.bts_control().active()
    }

    /// One taken branch (or interrupt/exception delivery) retired, as the precise backend
    /// decoded it: pushes it on the LBR stack when LBRs record (MSR_LBR_SELECT filtering,
    /// call-stack mode), and stores a BTS record when TR and BTS are set and the CPL is not
    /// excluded, translating the DS area through `paging`. A BTS threshold PMI is latched
    /// and applies the freeze-on-PMI controls like any PMI.
    pub fn record_branch(
        &mut self,
        br: &TakenBranch,
        paging: &PagingRegs,
        mem: &mut dyn GuestMemory,
    ) -> BranchOutcome {
        let lbr = self
            .lbr_recording()
            .then(|| self.lbr.record(self.model.lbr_format, br));
        let ctl = self.bts_control();
        let bts = ctl.stores(br.cpl).then(|| {
            // The model emulates no branch predictor: every branch was predicted.
            let predicted = bts::predicted_flag_supported(&self.model);
            let rec = bts::encode_record(br.from, br.to, predicted);
            bts::store(mem, paging, self.ds_area, &rec, ctl.btint)
        });
        let pmi = bts.is_some_and(|o| o.threshold_reached);
        if pmi {
            self.pmi_pending = true;
            self.freeze_on_pmi();
            self.generation += 1;
        }
        BranchOutcome { lbr, bts, pmi }
    }

    /// Handles counters that wrapped at the moment described by `state` / `event`: sets
    /// status (CCCR OVF on NetBurst), runs the PEBS assist for PEBS-enabled counters and
    /// reloads them, sets OvfBuffer at the interrupt threshold, decides the PMI and applies
    /// the freeze-on-PMI controls.
    pub fn handle_overflow(
        &mut self,
        wrapped: &[CounterId],
        state: &GuestState,
        event: &EventInfo,
        mem: &mut dyn GuestMemory,
    ) -> OverflowOutcome {
        let mut out = OverflowOutcome::default();
        let mut applicable = 0u64;
        let mut adaptive = false;
        for &id in wrapped {
            let Some(p) = self.program_of(id).or_else(|| self.stale_program(id)) else {
                continue;
            };
            match id {
                CounterId::Netburst(c) => {
                    self.netburst.cccrs[usize::from(c)] |= CCCR_OVF;
                    if p.pebs {
                        // The assist's layout puts IQ_COUNTER4 at bit 0.
                        applicable |= 1;
                    }
                }
                _ => {
                    self.global_status |= 1 << id.status_bit();
                    if p.pebs {
                        applicable |= 1 << id.status_bit();
                        adaptive |= self.adaptive_record(id);
                    }
                }
            }
            out.pmi |= p.pmi;
        }
        if applicable != 0 {
            out.pebs_counters = applicable;
            self.run_assist(applicable, adaptive, wrapped, state, event, mem, &mut out);
        }
        if out.pmi {
            self.pmi_pending = true;
            self.freeze_on_pmi();
        }
        self.generation += 1;
        out
    }

    /// A wrapped counter's program even if it stopped counting since (its overflow still
    /// happened).
    fn stale_program(&self, id: CounterId) -> Option<CounterProgram> {
        self.counter_value(id)?;
        let pmi = match id {
            CounterId::Gp(n) => self.gp[usize::from(n)].evtsel & EVTSEL_INT != 0,
            CounterId::Fixed(i) => self.fixed_field(i) & FIXED_CTRL_PMI != 0,
            CounterId::Netburst(c) => self.netburst.cccrs[usize::from(c)] & CCCR_OVF_PMI_T0 != 0,
        };
        Some(CounterProgram {
            id,
            event: fixed_event(0),
            raw: 0,
            usr: false,
            os: false,
            edge: false,
            inv: false,
            cmask: 0,
            any: false,
            pebs: self.pebs_active(id),
            pmi,
            distance: 0,
        })
    }

    /// The counter asked for an adaptive record (EVTSEL bit 34 / FIXED_CTR_CTRL bit 32+4i).
    fn adaptive_record(&self, id: CounterId) -> bool {
        if !self.model.pebs_baseline {
            return false;
        }
        match id {
            CounterId::Gp(n) => self.gp[usize::from(n)].evtsel & EVTSEL_ADAPTIVE != 0,
            CounterId::Fixed(i) => {
                let bit = FIXED_CTRL_ADAPTIVE_SHIFT + FIXED_CTRL_FIELD_BITS * u32::from(i);
                self.fixed_ctrl >> bit & 1 == 1
            }
            CounterId::Netburst(_) => false,
        }
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "one call site, all inputs of the assist"
    )]
    fn run_assist(
        &mut self,
        applicable: u64,
        adaptive: bool,
        wrapped: &[CounterId],
        state: &GuestState,
        event: &EventInfo,
        mem: &mut dyn GuestMemory,
        out: &mut OverflowOutcome,
    ) {
        let lbr = if adaptive && self.pebs_data_cfg & PEBS_DATACFG_LBRS != 0 {
            self.lbr_entries()
        } else {
            Vec::new()
        };
        let req = AssistRequest {
            model: &self.model,
            ds_area: self.ds_area,
            data_cfg: if adaptive { self.pebs_data_cfg } else { 0 },
            applicable,
            global_status: self.global_status,
            ld_lat_threshold: self.pebs_ld_lat,
            state,
            event,
            lbr: &lbr,
        };
        let result = assist(mem, &req);
        for &(bit, reset) in &result.reloads {
            let id = if self.model.arch == PmuArch::Netburst {
                CounterId::Netburst(NETBURST_IQ_COUNTER4_INDEX)
            } else {
                match CounterId::from_status_bit(bit) {
                    Some(id) => id,
                    None => continue,
                }
            };
            if !wrapped.contains(&id) {
                continue;
            }
            // Events counted after the wrap carry over onto the reloaded value; if they reach
            // the overflow point again, that is another wrap.
            let after_wrap = self.counter_value(id).unwrap_or(0);
            let mask = low_bits(u32::from(self.width(id)));
            if u128::from(reset & mask) + u128::from(after_wrap) > u128::from(mask)
                && !out.rewrapped.contains(&id)
            {
                out.rewrapped.push(id);
            }
            self.set_counter(id, reset.wrapping_add(after_wrap));
        }
        if result.written {
            out.records_written += 1;
        }
        if result.threshold_reached {
            if self.model.arch == PmuArch::Architectural {
                self.global_status |= OVF_BUFFER;
            }
            out.pmi = true;
        }
        if let Some(cause) = result.dropped {
            out.dropped.push(cause);
        }
    }

    fn freeze_on_pmi(&mut self) {
        if self.model.arch != PmuArch::Architectural || self.model.pmu_version < 2 {
            return;
        }
        let v4 = self.model.pmu_version >= 4;
        if self.debugctl & DEBUGCTL_FREEZE_PERFMON_ON_PMI != 0 {
            if v4 {
                self.global_status |= GLOBAL_STATUS_CTR_FRZ;
            } else {
                self.global_ctrl = 0;
            }
        }
        if self.debugctl & DEBUGCTL_FREEZE_LBRS_ON_PMI != 0 {
            if v4 {
                self.global_status |= GLOBAL_STATUS_LBR_FRZ;
            } else {
                self.debugctl &= !DEBUGCTL_LBR;
            }
        }
    }

    /// Drives a backend: reprograms it if the generation changed, feeds its reports through
    /// [`Vpmu::add_counts`] and [`Vpmu::handle_overflow`], and reprograms again after
    /// overflows.
    pub fn sync_backend(
        &mut self,
        backend: &mut dyn CountingBackend,
        mem: &mut dyn GuestMemory,
    ) -> Result<OverflowOutcome, BackendError> {
        let mut total = OverflowOutcome::default();
        self.reprogram_if_needed(backend)?;
        for report in backend.collect()? {
            let wrapped = self.add_counts(&report.deltas);
            if !wrapped.is_empty() {
                total.merge(self.handle_overflow(&wrapped, &report.state, &report.event, mem));
            }
        }
        self.reprogram_if_needed(backend)?;
        Ok(total)
    }

    fn reprogram_if_needed(
        &mut self,
        backend: &mut dyn CountingBackend,
    ) -> Result<(), BackendError> {
        if self.programmed != Some(self.generation) {
            backend.program(&self.programs())?;
            self.programmed = Some(self.generation);
        }
        Ok(())
    }
}
