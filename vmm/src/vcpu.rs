//! One vCPU thread: KVM_RUN, exit dispatch, PMU bookkeeping and PMI delivery.

use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};

use kvm_ioctls::{VcpuFd, VmFd};
use vmm_sys_util::eventfd::EventFd;

use crate::devices::bus::Bus;
use crate::exits::{ExitAction, StopReason, handle_exit};
use crate::pmi::{self, PmiResult};
use crate::pmu::VcpuPmu;

/// What a vCPU thread reports when it stops.
#[derive(Debug)]
pub struct VcpuStop {
    /// Which vCPU.
    pub index: u8,
    /// Why.
    pub reason: StopReason,
    /// Register dump for crashes (empty for a clean guest exit).
    pub registers: String,
    /// PMU counters of this vCPU (PMIs delivered/dropped, MSR traps).
    pub pmu_summary: String,
    /// The guest's PEBS records decoded (with `--dump-pebs`).
    pub pebs_dump: Option<String>,
}

/// A vCPU and everything its thread owns.
pub struct Vcpu {
    /// Index (0 = BSP); also the APIC ID.
    pub index: u8,
    /// The KVM vCPU.
    pub fd: VcpuFd,
    /// The VM (for MSI injection).
    pub vm: Arc<VmFd>,
    /// Shared devices.
    pub bus: Arc<Mutex<Bus>>,
    /// This vCPU's virtual PMU.
    pub pmu: VcpuPmu,
    /// Where to report the stop.
    pub stop_tx: Sender<VcpuStop>,
    /// Wakes the main loop after a stop report.
    pub stop_evt: EventFd,
    /// Decode the guest's PEBS buffer at the stop.
    pub dump_pebs: bool,
}

impl Vcpu {
    /// Runs until the guest exits or crashes, then reports on `stop_tx`.
    pub fn run(mut self) {
        let reason = self.run_loop();
        let registers = match reason {
            StopReason::GuestExit(_) => String::new(),
            _ => dump_registers(&self.fd),
        };
        let pebs_dump = self.dump_pebs.then(|| self.pmu.dump_pebs(&self.fd));
        self.pmu.finish_trace();
        let _ = self.stop_tx.send(VcpuStop {
            index: self.index,
            reason,
            registers,
            pmu_summary: self.pmu.summary(),
            pebs_dump,
        });
        let _ = self.stop_evt.write(1);
    }

    fn run_loop(&mut self) -> StopReason {
        if let Err(e) = self.pmu.sync(&self.fd) {
            return StopReason::Unhandled(format!("setting up the vPMU failed: {e}"));
        }
        loop {
            if let Err(e) = self.pmu.before_run(&self.fd) {
                return StopReason::Unhandled(format!("vPMU: {e}"));
            }
            self.deliver_pending_pmi();
            let run = self.fd.run();
            self.pmu.after_run(run.is_ok());
            let action = match run {
                Ok(exit) => handle_exit(exit, &self.bus, &mut self.pmu),
                Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                    self.fd.set_kvm_immediate_exit(0);
                    ExitAction::Interrupted
                }
                Err(e) => return StopReason::Unhandled(format!("KVM_RUN failed: {e}")),
            };
            let done = match action {
                ExitAction::Continue => Ok(()),
                ExitAction::PmuTrap => self.pmu.sync(&self.fd),
                ExitAction::Interrupted => self.pmu.on_interrupted(&self.fd),
                ExitAction::Debug(d) => self.pmu.on_debug(&self.fd, d),
                ExitAction::Stop(r) => return r,
            };
            if let Err(e) = done {
                return StopReason::Unhandled(format!("vPMU: {e}"));
            }
            self.deliver_pending_pmi();
        }
    }

    /// At most one PMI per exit, as the vPMU requests it.
    fn deliver_pending_pmi(&mut self) {
        if !self.pmu.take_pmi_request() {
            return;
        }
        match pmi::deliver(&self.vm, &self.fd) {
            Ok(PmiResult::Delivered(_)) => {
                self.pmu.stats.pmis_delivered += 1;
                self.pmu.on_pmi_delivered();
                self.pmu.trace_pmi(true);
            }
            Ok(PmiResult::Dropped(_)) => {
                self.pmu.stats.pmis_dropped += 1;
                self.pmu.trace_pmi(false);
            }
            Err(e) => {
                self.pmu.stats.pmis_dropped += 1;
                self.pmu.trace_pmi(false);
                self.pmu
                    .warn_once("pmi-error", &format!("PMI delivery failed: {e}"));
            }
        }
    }
}

/// Formats the guest's registers for a crash report.
pub fn dump_registers(fd: &VcpuFd) -> String {
    let mut s = String::new();
    if let Ok(r) = fd.get_regs() {
        s += &format!(
            "  rip={:#018x} rflags={:#010x} rsp={:#018x} rbp={:#018x}\n  rax={:#018x} rbx={:#018x} rcx={:#018x} rdx={:#018x}\n  rsi={:#018x} rdi={:#018x} r8={:#018x} r9={:#018x}\n  r10={:#018x} r11={:#018x} r12={:#018x} r13={:#018x}\n  r14={:#018x} r15={:#018x}\n",
            r.rip,
            r.rflags,
            r.rsp,
            r.rbp,
            r.rax,
            r.rbx,
            r.rcx,
            r.rdx,
            r.rsi,
            r.rdi,
            r.r8,
            r.r9,
            r.r10,
            r.r11,
            r.r12,
            r.r13,
            r.r14,
            r.r15
        );
    }
    if let Ok(sr) = fd.get_sregs() {
        s += &format!(
            "  cs={:#06x} (l={} dpl={}) ss={:#06x} cr0={:#x} cr2={:#x} cr3={:#x} cr4={:#x} efer={:#x}\n  idt={:#x}/{:#x} gdt={:#x}/{:#x}\n",
            sr.cs.selector,
            sr.cs.l,
            sr.cs.dpl,
            sr.ss.selector,
            sr.cr0,
            sr.cr2,
            sr.cr3,
            sr.cr4,
            sr.efer,
            sr.idt.base,
            sr.idt.limit,
            sr.gdt.base,
            sr.gdt.limit
        );
    }
    s
}
