//! The per-vCPU glue between trapped MSR exits, the vpmu state machine and the counting
//! backend: programs the backend when the guest reprograms its counters, single-steps for the
//! precise backend, collects host counts for the perf backend, hands overflows (with the guest
//! state) to vpmu, and emulates RDPMC — through the decoder while stepping, and through a
//! hardware breakpoint on the guest's #GP handler in every mode (see `backend::rdpmc`).

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::BufWriter;

use kvm_bindings::{kvm_regs, kvm_sregs};
use kvm_ioctls::VcpuFd;
use thiserror::Error;
use vm_memory::GuestMemoryMmap;
use vpmu::Vpmu;
use vpmu::backend::CountingBackend;
use vpmu::counter::CounterId;
use vpmu::lbr::TakenBranch;
use vpmu::msr::IA32_DS_AREA;
use vpmu::paging::PageWalker;
use vpmu::pebs::decode::read_pebs_buffer;
use vpmu::state::{EventInfo, GuestState};
use vpmu::trace::TraceWriter;

use crate::backend::debug::{DR6_B0, DR6_BS, GuestDebug};
use crate::backend::insn::{self, MAX_INSN_LEN};
use crate::backend::perf::{self, PerfBackend};
use crate::backend::precise::{Outcome, Pending, Precise, Retired, branch_type, outcome};
use crate::backend::rdpmc::{self, GpFrame, RDPMC_OPCODE};
use crate::exits::{DebugExit, MsrHandler};
use crate::guest::{self, Ram};

/// A KVM call the PMU glue needed failed.
#[derive(Debug, Error)]
pub enum PmuGlueError {
    /// A register or debug ioctl failed.
    #[error("{what} failed: {err}")]
    Kvm {
        /// Which call.
        what: &'static str,
        /// The error.
        err: kvm_ioctls::Error,
    },
    /// Reading guest state failed.
    #[error(transparent)]
    State(#[from] guest::GuestStateError),
}

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> PmuGlueError {
    move |err| PmuGlueError::Kvm { what, err }
}

/// The counting backend of one vCPU.
pub enum Backend {
    /// Single-step and decode.
    Precise(Box<Precise>),
    /// Host perf events.
    Perf(PerfBackend),
    /// Nothing counts.
    Off,
}

/// Counters for the end-of-run summary.
#[derive(Debug, Default, Clone, Copy)]
pub struct PmuStats {
    /// Trapped RDMSRs.
    pub rdmsr: u64,
    /// Trapped WRMSRs.
    pub wrmsr: u64,
    /// MSR accesses answered with #GP.
    pub gp: u64,
    /// PMIs injected.
    pub pmis_delivered: u64,
    /// PMIs not injected (LVTPC masked or the LAPIC refused).
    pub pmis_dropped: u64,
    /// Counter overflows handled.
    pub overflows: u64,
    /// PEBS records written.
    pub pebs_records: u64,
    /// PEBS assists that wrote nothing.
    pub pebs_dropped: u64,
    /// RDPMCs emulated.
    pub rdpmc: u64,
}

/// One vCPU's virtual PMU, its backend and its guest-debug state.
pub struct VcpuPmu {
    /// The state machine.
    pub vpmu: Vpmu,
    /// The backend.
    pub backend: Backend,
    /// Statistics.
    pub stats: PmuStats,
    mem: GuestMemoryMmap<()>,
    warned: HashSet<String>,
    debug: GuestDebug,
    applied: Option<GuestDebug>,
    programmed: Option<u64>,
    /// Counters that wrapped while answering an MSR read (perf backend), handled after the exit.
    deferred: Vec<CounterId>,
    /// The precise backend counts CPL3 on this host.
    count_cpl3: bool,
    /// Overflow signals already accounted for (perf backend).
    signals_seen: u64,
    /// Run straight-line blocks at full speed between breakpoints (precise backend).
    block_stepping: bool,
    /// The block running now, if any.
    block: Option<Block>,
    /// `--trace-msr`: the trace of this vCPU, and counts not yet written to it (aggregated
    /// between trace events: replay adds them in one `add_counts`, which wraps the same way).
    trace: Option<TraceWriter<BufWriter<File>>>,
    trace_counts: BTreeMap<CounterId, u64>,
    /// KVM_CAP_SYNC_REGS is on for this vCPU.
    sync_regs: bool,
    /// The registers in kvm_run are those of the current exit.
    regs_fresh: bool,
    /// A second handle on this vCPU (a dup'ed fd) so that an MSR exit, which borrows the main
    /// handle, can still read the guest state for an overflow found while answering it.
    state_fd: Option<VcpuFd>,
    /// A PMI was injected while single-stepping: the exception frame it pushed may hold the
    /// stepping TF, which the handler's IRET would restore after stepping ends (a stray #DB in
    /// the guest). Cleared in the frame at the handler's first step.
    fix_pmi_frame: bool,
}

/// A straight-line run of simple instructions executed without single-step: every instruction
/// in it retires unless execution leaves it, which only an exit we see can do.
#[derive(Debug, Clone)]
struct Block {
    /// Address of each instruction, in order; the block ends at `end`.
    ips: Vec<u64>,
    end: u64,
    cpl: u8,
}

/// Assists for one counter in one report before the rest is dropped.
const MAX_REWRAPS: u32 = 64;
/// Longest block decoded ahead.
const MAX_BLOCK: usize = 256;
/// RFLAGS.IF: with interrupts enabled a block could be left through an interrupt handler that
/// nobody counts, so blocks run only with IF = 0.
const RFLAGS_IF: u64 = 1 << 9;
/// RFLAGS.TF.
const RFLAGS_TF: u64 = 1 << 8;

impl VcpuPmu {
    /// Wraps `vpmu` with `backend`; `mem` is guest RAM.
    pub fn new(vpmu: Vpmu, backend: Backend, mem: GuestMemoryMmap<()>, count_cpl3: bool) -> Self {
        Self {
            vpmu,
            backend,
            stats: PmuStats::default(),
            mem,
            warned: HashSet::new(),
            debug: GuestDebug::default(),
            applied: None,
            programmed: None,
            deferred: Vec::new(),
            count_cpl3,
            signals_seen: 0,
            block_stepping: true,
            block: None,
            fix_pmi_frame: false,
            state_fd: None,
            sync_regs: false,
            regs_fresh: false,
            trace: None,
            trace_counts: BTreeMap::new(),
        }
    }

    /// Records every PMU MSR trap, count, overflow and PMI of this vCPU into `trace`.
    pub fn set_trace(&mut self, trace: TraceWriter<BufWriter<File>>) {
        self.trace = Some(trace);
    }

    /// Writes one trace event (after the aggregated counts that precede it); a trace write
    /// error stops tracing with one message rather than stopping the guest.
    fn trace(
        &mut self,
        f: impl FnOnce(&mut TraceWriter<BufWriter<File>>, &mut Vpmu) -> std::io::Result<()>,
    ) {
        let Some(t) = self.trace.as_mut() else { return };
        let mut r = Ok(());
        if !self.trace_counts.is_empty() {
            let deltas: Vec<_> = std::mem::take(&mut self.trace_counts).into_iter().collect();
            r = t.count(&deltas, &[]);
        }
        let r = r.and_then(|()| f(t, &mut self.vpmu));
        if let Err(e) = r {
            self.trace = None;
            self.warn_once(
                "trace",
                &format!("--trace-msr: writing the trace failed ({e}); tracing stopped"),
            );
        }
    }

    /// Adds counts to the vPMU, noting them for the trace.
    fn add_counts(&mut self, deltas: &[(CounterId, u64)]) -> Vec<CounterId> {
        let wrapped = self.vpmu.add_counts(deltas);
        if self.trace.is_some() {
            for &(id, n) in deltas {
                *self.trace_counts.entry(id).or_insert(0) += n;
            }
            if !wrapped.is_empty() {
                let deltas: Vec<_> = std::mem::take(&mut self.trace_counts).into_iter().collect();
                let w = wrapped.clone();
                self.trace(|t, _| t.count(&deltas, &w));
            }
        }
        wrapped
    }

    /// Flushes the trace (at the end of the run).
    pub fn finish_trace(&mut self) {
        self.trace(|t, _| t.flush());
    }

    /// Records a PMI the vPMU requested.
    pub fn trace_pmi(&mut self, delivered: bool) {
        self.trace(|t, _| t.pmi(delivered));
    }

    /// KVM copies the registers into kvm_run at every exit (KVM_CAP_SYNC_REGS, enabled by the
    /// VMM with `kvm_valid_regs`): reading them there saves two ioctls per single-step.
    pub fn enable_sync_regs(&mut self) {
        self.sync_regs = true;
    }

    /// Called after every KVM_RUN: the kvm_run copy is fresh after an exit, not after EINTR.
    pub fn after_run(&mut self, exited: bool) {
        self.regs_fresh = self.sync_regs && exited;
    }

    fn regs(&self, fd: &VcpuFd) -> Result<kvm_regs, PmuGlueError> {
        if self.regs_fresh {
            return Ok(fd.sync_regs().regs);
        }
        fd.get_regs().map_err(kvm("KVM_GET_REGS"))
    }

    fn sregs(&self, fd: &VcpuFd) -> Result<kvm_sregs, PmuGlueError> {
        if self.regs_fresh {
            return Ok(fd.sync_regs().sregs);
        }
        fd.get_sregs().map_err(kvm("KVM_GET_SREGS"))
    }

    fn set_regs(&mut self, fd: &VcpuFd, regs: &kvm_regs) -> Result<(), PmuGlueError> {
        // The kvm_run copy no longer matches: read through the ioctls until the next exit.
        self.regs_fresh = false;
        fd.set_regs(regs).map_err(kvm("KVM_SET_REGS"))
    }

    fn set_sregs(&mut self, fd: &VcpuFd, sregs: &kvm_sregs) -> Result<(), PmuGlueError> {
        self.regs_fresh = false;
        fd.set_sregs(sregs).map_err(kvm("KVM_SET_SREGS"))
    }

    /// Gives the glue its own handle on the vCPU (see `state_fd`).
    pub fn set_state_fd(&mut self, fd: VcpuFd) {
        self.state_fd = Some(fd);
    }

    /// perf backend, inside an MSR exit: fold in the host counts and handle any wrap *before*
    /// the access takes effect, with the program that was counting (a disabling WRMSR must not
    /// turn a PEBS overflow that already happened into a plain one).
    fn catch_up(&mut self) {
        self.collect_perf();
        if self.deferred.is_empty() {
            return;
        }
        if let Some(fd) = self.state_fd.take() {
            if let Err(e) = self.process_deferred(&fd) {
                self.warn_once(
                    "catch-up",
                    &format!("handling a host counter overflow failed: {e}"),
                );
            }
            self.state_fd = Some(fd);
        }
    }

    /// A PMI was just injected (see `fix_pmi_frame`).
    pub fn on_pmi_delivered(&mut self) {
        self.fix_pmi_frame = self.debug.stepping;
    }

    /// Turns block stepping (precise backend) on or off; on by default.
    pub fn set_block_stepping(&mut self, on: bool) {
        self.block_stepping = on;
    }

    /// Prints `msg` once per `key` for this vCPU.
    pub fn warn_once(&mut self, key: &str, msg: &str) {
        if self.warned.insert(key.to_string()) {
            eprintln!("vmm: {msg}");
        }
    }

    /// Whether the vPMU wants a PMI delivered now.
    pub fn take_pmi_request(&mut self) -> bool {
        self.vpmu.take_pmi_request()
    }

    /// One line for the end-of-run report; empty when the guest never touched the PMU.
    pub fn summary(&self) -> String {
        let s = &self.stats;
        if s.rdmsr + s.wrmsr == 0 {
            return String::new();
        }
        let mut line = format!(
            "{} rdmsr, {} wrmsr, {} #GP, {} overflows, {} PEBS records ({} dropped), {} RDPMC emulated, {} PMIs delivered, {} dropped",
            s.rdmsr,
            s.wrmsr,
            s.gp,
            s.overflows,
            s.pebs_records,
            s.pebs_dropped,
            s.rdpmc,
            s.pmis_delivered,
            s.pmis_dropped
        );
        if let Backend::Precise(p) = &self.backend {
            line += &format!(
                "; precise: {} steps, {} blocks, {} instructions retired, {} faulted",
                p.stats.steps, p.stats.blocks, p.stats.retired, p.stats.faulted
            );
        }
        line
    }

    fn walker(sregs: &kvm_sregs) -> PageWalker {
        PageWalker::new(guest::paging(sregs))
    }

    fn read_linear(&self, sregs: &kvm_sregs, la: u64, buf: &mut [u8]) -> bool {
        let ram = Ram(&self.mem);
        Self::walker(sregs).read(&ram, la, buf).is_ok()
    }

    fn read_u64s<const N: usize>(&self, sregs: &kvm_sregs, la: u64) -> Option<[u64; N]> {
        let mut b = vec![0u8; N * 8];
        if !self.read_linear(sregs, la, &mut b) {
            return None;
        }
        let mut out = [0u64; N];
        for (o, c) in out.iter_mut().zip(b.chunks_exact(8)) {
            *o = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
        }
        Some(out)
    }

    /// After any PMU MSR trap: reprogram the backend if the counters changed, re-arm the #GP
    /// breakpoint if the guest's IDT changed, and apply the guest-debug state.
    pub fn sync(&mut self, fd: &VcpuFd) -> Result<(), PmuGlueError> {
        self.finish_block(fd)?;
        self.process_deferred(fd)?;
        self.reprogram()?;
        self.update_branch_stepping(fd)?;
        let sregs = self.sregs(fd)?;
        self.debug.gp_breakpoint = self.gp_handler(&sregs);
        self.apply_debug(fd)
    }

    fn reprogram(&mut self) -> Result<(), PmuGlueError> {
        if self.programmed == Some(self.vpmu.generation()) {
            return Ok(());
        }
        self.programmed = Some(self.vpmu.generation());
        let programs = self.vpmu.programs();
        let mut warnings = Vec::new();
        match &mut self.backend {
            // Stepping follows in `update_branch_stepping`: when it starts, the instruction at
            // RIP (the WRMSR that enabled counting, after a WRMSR exit) is the first counted.
            Backend::Precise(p) => warnings = p.set_programs(programs),
            Backend::Perf(b) => {
                if let Err(e) = b.program(&programs) {
                    warnings.push(format!("{e}"));
                }
            }
            Backend::Off => {
                if !programs.is_empty() {
                    warnings.push(
                        "guest counters are enabled but --pmu-backend off counts nothing".into(),
                    );
                }
            }
        }
        for w in warnings {
            self.warn_once(&w.clone(), &w);
        }
        Ok(())
    }

    /// LBRs and BTS need every taken branch: the precise backend steps while they record even
    /// with no counter enabled; other backends leave the entries empty and say so once.
    fn update_branch_stepping(&mut self, fd: &VcpuFd) -> Result<(), PmuGlueError> {
        let branches = self.vpmu.wants_branches();
        let Backend::Precise(p) = &self.backend else {
            if branches {
                self.warn_once(
                    "branches",
                    "the guest enabled LBR/BTS branch records; they need --pmu-backend precise and stay empty here",
                );
            }
            return Ok(());
        };
        let want = p.wants_stepping() || branches;
        if want && !self.debug.stepping {
            let regs = self.regs(fd)?;
            let sregs = self.sregs(fd)?;
            let pending = self.decode_at(&regs, &sregs);
            self.set_pending(pending);
        } else if !want {
            self.set_pending(None);
        }
        self.debug.stepping = want;
        Ok(())
    }

    fn apply_debug(&mut self, fd: &VcpuFd) -> Result<(), PmuGlueError> {
        let stepped = |d: &GuestDebug| (d.stepping && d.block_end.is_none()) || d.stepping_over;
        if self.applied.as_ref().is_some_and(stepped) && !stepped(&self.debug) {
            // Leaving single-step: a TF the stepping left in RFLAGS (restored by an IRET of a
            // frame pushed while stepping) would raise #DB in the guest.
            let mut regs = self.regs(fd)?;
            if regs.rflags & RFLAGS_TF != 0 {
                regs.rflags &= !RFLAGS_TF;
                self.set_regs(fd, &regs)?;
            }
        }
        if self.applied != Some(self.debug) {
            fd.set_guest_debug(&self.debug.to_kvm())
                .map_err(kvm("KVM_SET_GUEST_DEBUG"))?;
            self.applied = Some(self.debug);
        }
        Ok(())
    }

    /// The guest's #GP handler, if its IDT has a present 64-bit gate for vector 13.
    fn gp_handler(&self, sregs: &kvm_sregs) -> Option<u64> {
        let off = rdpmc::GP_VECTOR * 16;
        if u64::from(sregs.idt.limit) < off + 15 || sregs.efer & (1 << 10) == 0 {
            return None;
        }
        let mut gate = [0u8; 16];
        if !self.read_linear(sregs, sregs.idt.base.wrapping_add(off), &mut gate) {
            return None;
        }
        rdpmc::gate_handler(&gate)
    }

    fn decode_at(&self, regs: &kvm_regs, sregs: &kvm_sregs) -> Option<Pending> {
        let mut bytes = [0u8; MAX_INSN_LEN];
        // An instruction may end before a page that does not translate: try shorter reads.
        let mut n = MAX_INSN_LEN;
        while n > 0 && !self.read_linear(sregs, regs.rip, &mut bytes[..n]) {
            n -= 1;
        }
        let bitness = if sregs.cs.l == 1 {
            64
        } else if sregs.cs.db == 1 {
            32
        } else {
            16
        };
        let insn = insn::decode(regs.rip, &bytes[..n], bitness)?;
        let reg = |r| register_value(regs, r);
        let seg = |r| match r {
            iced_x86::Register::FS => sregs.fs.base,
            iced_x86::Register::GS => sregs.gs.base,
            _ => 0,
        };
        let data_addr = insn.data_address(reg, seg);
        Some(Pending {
            insn,
            cpl: guest::cpl(sregs),
            data_addr,
        })
    }

    /// Handles a guest-debug exit.
    pub fn on_debug(&mut self, fd: &VcpuFd, d: DebugExit) -> Result<(), PmuGlueError> {
        if self.block.is_some() {
            self.finish_block(fd)?;
            if d.dr6 & DR6_BS == 0 && d.dr6 & DR6_B0 == 0 {
                // The block's own end breakpoint: nothing else happened at this exit.
                return self.apply_debug(fd);
            }
        }
        let bp_hit = d.dr6 & DR6_B0 != 0 && self.debug.gp_breakpoint == Some(d.pc);
        if d.dr6 & DR6_BS != 0 {
            if self.debug.stepping_over {
                self.debug.stepping_over = false;
            }
            if self.debug.stepping {
                self.on_step(fd)?;
            }
        }
        if bp_hit && !self.debug.stepping_over {
            self.on_gp_handler(fd)?;
        }
        let sregs = self.sregs(fd)?;
        self.debug.gp_breakpoint = self.gp_handler(&sregs);
        self.apply_debug(fd)
    }

    /// One single-step exit: retire the pending instruction, count it, handle an overflow,
    /// then decode the next one (emulating it at once if it is an RDPMC).
    fn on_step(&mut self, fd: &VcpuFd) -> Result<(), PmuGlueError> {
        let Backend::Precise(p) = &mut self.backend else {
            return Ok(());
        };
        p.stats.steps += 1;
        let pending = p.pending.take();
        let mut regs = self.regs(fd)?;
        let sregs = self.sregs(fd)?;
        if std::mem::take(&mut self.fix_pmi_frame) {
            if let Some(rip) = pending.map(|p| p.insn.ip) {
                self.clear_frame_tf(rip, &regs, &sregs);
            }
        }
        if let Some(pend) = pending {
            let frame = || self.read_u64s::<2>(&sregs, regs.rsp);
            match outcome(&pend, regs.rip, frame) {
                Outcome::Retired => {
                    let r = match &mut self.backend {
                        Backend::Precise(p) => p.retire(pend, regs.rip),
                        _ => return Ok(()),
                    };
                    self.count_retired(fd, &r, &regs, &sregs)?;
                }
                Outcome::Faulted => {
                    if let Backend::Precise(p) = &mut self.backend {
                        p.stats.faulted += 1;
                    }
                }
            }
        }
        self.advance(fd, &mut regs, &sregs)
    }

    /// Decodes what runs next at `regs.rip` as the pending instruction. An RDPMC is answered
    /// here and stepped over (it would #GP on this host); a straight-line run starts a block.
    fn advance(
        &mut self,
        fd: &VcpuFd,
        regs: &mut kvm_regs,
        sregs: &kvm_sregs,
    ) -> Result<(), PmuGlueError> {
        loop {
            let next = self.decode_at(regs, sregs);
            match next {
                Some(pend) if pend.insn.rdpmc => {
                    let ecx = (regs.rcx & 0xffff_ffff) as u32;
                    let Some(value) = self.emulate_rdpmc(ecx, pend.cpl, sregs.cr4) else {
                        self.set_pending(Some(pend));
                        break;
                    };
                    regs.rax = value & 0xffff_ffff;
                    regs.rdx = value >> 32;
                    regs.rip = pend.insn.fallthrough();
                    self.set_regs(fd, regs)?;
                    let r = match &mut self.backend {
                        Backend::Precise(p) => {
                            p.stats.rdpmc += 1;
                            p.retire(pend, regs.rip)
                        }
                        _ => return Ok(()),
                    };
                    self.count_retired(fd, &r, regs, sregs)?;
                    if !self.debug.stepping {
                        break;
                    }
                }
                other => {
                    self.set_pending(other);
                    break;
                }
            }
        }
        self.try_block(regs, sregs);
        if !self.count_cpl3 && guest::cpl(sregs) == 3 {
            self.warn_once(
                "cpl3",
                "this host's KVM cannot single-step CPL3 code: the precise backend counts CPL0 only",
            );
        }
        Ok(())
    }

    /// Starts a block at the pending instruction if it begins a straight-line run of simple
    /// instructions that cannot pass a counter's overflow point before its last instruction.
    fn try_block(&mut self, regs: &kvm_regs, sregs: &kvm_sregs) {
        let Backend::Precise(p) = &self.backend else {
            return;
        };
        let Some(pend) = p.pending else { return };
        if !self.block_stepping
            || !pend.insn.simple
            || regs.rflags & (RFLAGS_IF | RFLAGS_TF) != 0
            || self.vpmu.pmi_pending()
            || self.fix_pmi_frame
        {
            return;
        }
        // Instructions and cycles both advance by one per simple instruction; the block may end
        // exactly on an overflow (its end exit then has the exact state) but not pass it.
        let limit = self
            .vpmu
            .programs()
            .iter()
            .filter(|c| c.counts_at(pend.cpl) && crate::backend::precise::counts_simple(&c.event))
            .map(|c| c.distance)
            .min()
            .map_or(MAX_BLOCK, |d| {
                usize::try_from(d).unwrap_or(MAX_BLOCK).min(MAX_BLOCK)
            });
        let mut bytes = vec![0u8; MAX_BLOCK * 4];
        let mut n = bytes.len();
        while n > 0 && !self.read_linear(sregs, pend.insn.ip, &mut bytes[..n]) {
            n = n.saturating_sub(256);
        }
        let bitness = if sregs.cs.l == 1 { 64 } else { 32 };
        let (ips, end) = insn::straight_line(pend.insn.ip, &bytes[..n], bitness, limit);
        if ips.len() < 2 {
            return;
        }
        self.debug.block_end = Some(end);
        self.block = Some(Block {
            ips,
            end,
            cpl: pend.cpl,
        });
        self.set_pending(None);
    }

    /// Accounts for the block that ran: all of it if the vCPU stopped at its end, else the
    /// instructions before the current RIP. Then stepping resumes at the current RIP.
    fn finish_block(&mut self, fd: &VcpuFd) -> Result<(), PmuGlueError> {
        let Some(b) = self.block.take() else {
            return Ok(());
        };
        self.debug.block_end = None;
        let regs = self.regs(fd)?;
        let sregs = self.sregs(fd)?;
        let done = if regs.rip == b.end {
            b.ips.len()
        } else if let Some(k) = b.ips.iter().position(|&ip| ip == regs.rip) {
            k
        } else {
            self.warn_once(
                "block-lost",
                "the precise backend lost track of a straight-line block; counts may be short",
            );
            0
        };
        if done > 0 {
            let (deltas, last_ip) = match &mut self.backend {
                Backend::Precise(p) => {
                    p.stats.blocks += 1;
                    (p.block_deltas(done as u64, b.cpl), b.ips[done - 1])
                }
                _ => return Ok(()),
            };
            let wrapped = self.add_counts(&deltas);
            if !wrapped.is_empty() {
                let state = self.state_from(fd, &regs, &sregs)?;
                let event = EventInfo {
                    eventing_ip: last_ip,
                    ..Default::default()
                };
                self.overflow(fd, &wrapped, &state, &event)?;
            }
        }
        let mut regs = regs;
        self.advance(fd, &mut regs, &sregs)
    }

    /// Clears TF in the RFLAGS of the PMI's interrupt frame (RIP = `rip`, CS, RFLAGS, RSP, SS)
    /// near RSP: the handler's first instruction (now retired) may already have pushed.
    fn clear_frame_tf(&mut self, rip: u64, regs: &kvm_regs, sregs: &kvm_sregs) {
        const SCAN: usize = 32;
        let Some(q) = self.read_u64s::<SCAN>(sregs, regs.rsp) else {
            return;
        };
        let Some(k) =
            (0..SCAN - 2).find(|&k| q[k] == rip && q[k + 1] <= 0xffff && q[k + 2] & 2 != 0)
        else {
            return;
        };
        let rflags = q[k + 2];
        if rflags & RFLAGS_TF == 0 {
            return;
        }
        let mut ram = Ram(&self.mem);
        let la = regs.rsp.wrapping_add(8 * (k as u64 + 2));
        let _ = Self::walker(sregs).write(&mut ram, la, &(rflags & !RFLAGS_TF).to_le_bytes());
    }

    fn set_pending(&mut self, pending: Option<Pending>) {
        if let Backend::Precise(p) = &mut self.backend {
            p.pending = pending;
        }
    }

    fn count_retired(
        &mut self,
        fd: &VcpuFd,
        r: &Retired,
        regs: &kvm_regs,
        sregs: &kvm_sregs,
    ) -> Result<(), PmuGlueError> {
        if r.taken && self.vpmu.wants_branches() {
            self.record_branch(r, sregs);
        }
        let deltas = match &self.backend {
            Backend::Precise(p) => p.deltas(r),
            _ => return Ok(()),
        };
        if deltas.is_empty() {
            return Ok(());
        }
        let wrapped = self.add_counts(&deltas);
        if wrapped.is_empty() {
            return Ok(());
        }
        let state = self.state_from(fd, regs, sregs)?;
        let event = EventInfo {
            eventing_ip: r.pending.insn.ip,
            data_addr: r
                .pending
                .data_addr
                .filter(|_| r.pending.insn.loads || r.pending.insn.stores),
            data_source: r.data_source,
            latency: r.latency,
        };
        self.overflow(fd, &wrapped, &state, &event)
    }

    /// Hands a retired taken branch to the LBR stack and BTS.
    fn record_branch(&mut self, r: &Retired, sregs: &kvm_sregs) {
        let (Some(kind), Backend::Precise(p)) = (branch_type(&r.pending.insn), &mut self.backend)
        else {
            return;
        };
        p.stats.branches += 1;
        let br = TakenBranch {
            from: r.pending.insn.ip,
            to: r.next_ip,
            kind,
            cpl: r.pending.cpl,
            cycles: p.stats.cycles,
        };
        let mut ram = Ram(&self.mem);
        let out = self
            .vpmu
            .record_branch(&br, &guest::paging(sregs), &mut ram);
        if let Some(cause) = out.bts.and_then(|b| b.dropped) {
            self.warn_once(
                &format!("bts-drop-{cause:?}"),
                &format!("BTS record dropped: {cause} (logged once per cause)"),
            );
        }
    }

    fn state_from(
        &self,
        fd: &VcpuFd,
        regs: &kvm_regs,
        sregs: &kvm_sregs,
    ) -> Result<GuestState, PmuGlueError> {
        let fpu = fd.get_fpu().map_err(kvm("KVM_GET_FPU"))?;
        let mut xmm = [0u128; 16];
        for (x, b) in xmm.iter_mut().zip(fpu.xmm.iter()) {
            *x = u128::from_le_bytes(*b);
        }
        Ok(GuestState {
            gprs: guest::gprs(regs),
            paging: guest::paging(sregs),
            cpl: guest::cpl(sregs),
            tsc: guest::read_tsc(fd)?,
            xmm,
        })
    }

    fn overflow(
        &mut self,
        fd: &VcpuFd,
        wrapped: &[CounterId],
        state: &GuestState,
        event: &EventInfo,
    ) -> Result<(), PmuGlueError> {
        let mut ram = Ram(&self.mem);
        let mut out = self.vpmu.handle_overflow(wrapped, state, event, &mut ram);
        if self.trace.is_some() {
            let o = out.clone();
            self.trace(|t, v| t.overflow(wrapped, event, &o, v));
        }
        let mut handled = wrapped.len() as u64;
        // A late report (perf backend) can span several periods of a PEBS counter: one assist
        // per wrap, bounded so that a hostile reset value (-1: a wrap per event) cannot stall
        // the vCPU; the rest of such a burst is lost and counted as dropped.
        let mut rounds = 0;
        while !out.rewrapped.is_empty() {
            let again = std::mem::take(&mut out.rewrapped);
            rounds += 1;
            if rounds > MAX_REWRAPS {
                self.stats.pebs_dropped += again.len() as u64;
                self.warn_once(
                    "rewraps",
                    "a PEBS counter wrapped more than 64 times in one report; the excess records were dropped",
                );
                break;
            }
            handled += again.len() as u64;
            let mut ram = Ram(&self.mem);
            let more = self.vpmu.handle_overflow(&again, state, event, &mut ram);
            if self.trace.is_some() {
                let o = more.clone();
                self.trace(|t, v| t.overflow(&again, event, &o, v));
            }
            out.pmi |= more.pmi;
            out.records_written += more.records_written;
            out.dropped.extend(more.dropped);
            out.rewrapped = more.rewrapped;
        }
        self.stats.overflows += handled;
        self.stats.pebs_records += u64::from(out.records_written);
        self.stats.pebs_dropped += out.dropped.len() as u64;
        for cause in &out.dropped {
            let msg = format!("PEBS record dropped: {cause} (counted; logged once per cause)");
            self.warn_once(&format!("pebs-drop-{cause:?}"), &msg);
        }
        // Reloads and freezes change what counts.
        self.reprogram()?;
        self.update_branch_stepping(fd)?;
        self.apply_debug(fd)
    }

    /// Emulates RDPMC for `ecx` at `cpl`, or None where hardware raises #GP.
    fn emulate_rdpmc(&mut self, ecx: u32, cpl: u8, cr4: u64) -> Option<u64> {
        if !rdpmc::allowed(cpl, cr4) {
            return None;
        }
        self.collect_perf();
        let r = self.vpmu.rdpmc(ecx);
        self.trace(|t, _| t.rdpmc(ecx, &r));
        let v = r.ok()?;
        self.stats.rdpmc += 1;
        Some(v)
    }

    /// The breakpoint on the guest's #GP handler fired: emulate a faulting RDPMC, or let the
    /// handler run.
    fn on_gp_handler(&mut self, fd: &VcpuFd) -> Result<(), PmuGlueError> {
        let regs = self.regs(fd)?;
        let mut sregs = self.sregs(fd)?;
        let emulated = (|| {
            let q = self.read_u64s::<6>(&sregs, regs.rsp)?;
            let frame = GpFrame::parse(&q);
            let mut op = [0u8; 2];
            if !self.read_linear(&sregs, frame.rip, &mut op) || op != RDPMC_OPCODE {
                return None;
            }
            let ecx = (regs.rcx & 0xffff_ffff) as u32;
            let value = self.emulate_rdpmc(ecx, frame.cpl(), sregs.cr4)?;
            Some((frame, value))
        })();
        let Some((frame, value)) = emulated else {
            // Not ours: run the guest's handler, stepping past the breakpoint once.
            self.debug.stepping_over = true;
            return Ok(());
        };
        let new = rdpmc::resume_regs(regs, &frame, value);
        if frame.cpl() != guest::cpl(&sregs) {
            // Back to the faulting privilege level, as the handler's IRETQ would.
            let cs = self.descriptor(&sregs, frame.cs)?;
            let ss = self.descriptor(&sregs, frame.ss)?;
            sregs.cs = cs;
            sregs.ss = ss;
            self.set_sregs(fd, &sregs)?;
        }
        self.set_regs(fd, &new)
    }

    fn descriptor(
        &self,
        sregs: &kvm_sregs,
        selector: u64,
    ) -> Result<kvm_bindings::kvm_segment, PmuGlueError> {
        let sel = u16::try_from(selector & 0xffff).unwrap_or(0);
        let index = u64::from(sel >> 3) * 8;
        let desc = self
            .read_u64s::<1>(sregs, sregs.gdt.base.wrapping_add(index))
            .map(|d| d[0])
            .ok_or(PmuGlueError::Kvm {
                what: "reading the guest GDT",
                err: kvm_ioctls::Error::new(libc::EFAULT),
            })?;
        Ok(rdpmc::segment_from_descriptor(sel, desc))
    }

    /// perf backend: fold host counts into the vPMU; wrapped counters are handled after the
    /// exit (`process_deferred`) when the guest state can be read.
    fn collect_perf(&mut self) {
        let Backend::Perf(b) = &mut self.backend else {
            return;
        };
        match b.collect() {
            Ok(reports) => {
                for r in reports {
                    let w = self.add_counts(&r.deltas);
                    for id in w {
                        if !self.deferred.contains(&id) {
                            self.deferred.push(id);
                        }
                    }
                }
            }
            Err(e) => self.warn_once(
                "perf-collect",
                &format!("reading host counters failed: {e}"),
            ),
        }
    }

    fn process_deferred(&mut self, fd: &VcpuFd) -> Result<(), PmuGlueError> {
        if self.deferred.is_empty() {
            return Ok(());
        }
        let wrapped = std::mem::take(&mut self.deferred);
        let regs = self.regs(fd)?;
        let sregs = self.sregs(fd)?;
        let state = self.state_from(fd, &regs, &sregs)?;
        // The host cannot say which instruction overflowed: the state at this exit stands in
        // for it (the skid documented in backend::perf).
        let event = EventInfo {
            eventing_ip: regs.rip,
            ..Default::default()
        };
        self.overflow(fd, &wrapped, &state, &event)
    }

    /// KVM_RUN was interrupted (a host counter overflowed, or a kick): collect and handle.
    pub fn on_interrupted(&mut self, fd: &VcpuFd) -> Result<(), PmuGlueError> {
        self.signals_seen = perf::overflow_signals_on_this_thread();
        self.collect_perf();
        self.sync(fd)
    }

    /// Before re-entering the guest: an overflow signal that arrived while this thread was
    /// handling an exit interrupted nothing, so handle it now rather than one period late.
    pub fn before_run(&mut self, fd: &VcpuFd) -> Result<(), PmuGlueError> {
        if matches!(self.backend, Backend::Perf(_))
            && perf::overflow_signals_on_this_thread() != self.signals_seen
        {
            self.on_interrupted(fd)?;
        }
        Ok(())
    }
}

impl VcpuPmu {
    /// The records in the guest's PEBS buffer (base up to PEBS Index), decoded by vpmu, one
    /// per paragraph: what `vmm run --dump-pebs` prints at exit.
    pub fn dump_pebs(&mut self, fd: &VcpuFd) -> String {
        let format = self.vpmu.model().pebs_format;
        let ds = self.vpmu.rdmsr(IA32_DS_AREA).unwrap_or(0);
        if ds == 0 {
            return "no DS area programmed (IA32_DS_AREA = 0)\n".to_string();
        }
        let sregs = match self.sregs(fd) {
            Ok(s) => s,
            Err(e) => return format!("cannot read the guest's paging state: {e}\n"),
        };
        let mut ram = Ram(&self.mem);
        match read_pebs_buffer(&mut ram, Self::walker(&sregs), ds, format) {
            Ok(records) => {
                let mut out = format!(
                    "{} PEBS record(s) in the buffer of DS area {ds:#x}:\n",
                    records.len()
                );
                for (i, r) in records.iter().enumerate() {
                    out += &format!("[{i}] {r}\n");
                }
                out
            }
            Err(e) => format!("cannot decode the PEBS buffer of DS area {ds:#x}: {e}\n"),
        }
    }
}

impl MsrHandler for VcpuPmu {
    fn rdmsr(&mut self, index: u32) -> Option<u64> {
        self.stats.rdmsr += 1;
        // Counting-mode reads see the host counts up to now.
        self.catch_up();
        let r = self.vpmu.rdmsr(index);
        self.trace(|t, _| t.rdmsr(index, &r));
        self.stats.gp += u64::from(r.is_err());
        r.ok()
    }
    fn wrmsr(&mut self, index: u32, value: u64) -> bool {
        self.stats.wrmsr += 1;
        self.catch_up();
        let r = self.vpmu.wrmsr(index, value);
        self.trace(|t, _| t.wrmsr(index, value, &r));
        self.stats.gp += u64::from(r.is_err());
        r.is_ok()
    }
}

/// A 64-bit GPR's value for the decoder's address computation.
fn register_value(r: &kvm_regs, reg: iced_x86::Register) -> u64 {
    use iced_x86::Register as R;
    let full = match reg.full_register() {
        R::RAX => r.rax,
        R::RBX => r.rbx,
        R::RCX => r.rcx,
        R::RDX => r.rdx,
        R::RSI => r.rsi,
        R::RDI => r.rdi,
        R::RBP => r.rbp,
        R::RSP => r.rsp,
        R::R8 => r.r8,
        R::R9 => r.r9,
        R::R10 => r.r10,
        R::R11 => r.r11,
        R::R12 => r.r12,
        R::R13 => r.r13,
        R::R14 => r.r14,
        R::R15 => r.r15,
        R::RIP => r.rip,
        _ => 0,
    };
    match reg.size() {
        4 => full & 0xffff_ffff,
        2 => full & 0xffff,
        _ => full,
    }
}
