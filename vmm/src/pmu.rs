//! The per-vCPU glue between trapped MSR exits, the vpmu state machine and the counting backend.

use std::collections::HashSet;

use vpmu::Vpmu;

use crate::exits::MsrHandler;

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
}

/// One vCPU's virtual PMU with its statistics.
pub struct VcpuPmu {
    /// The state machine.
    pub vpmu: Vpmu,
    /// Statistics.
    pub stats: PmuStats,
    warned: HashSet<&'static str>,
}

impl VcpuPmu {
    /// Wraps `vpmu`.
    pub fn new(vpmu: Vpmu) -> Self {
        Self {
            vpmu,
            stats: PmuStats::default(),
            warned: HashSet::new(),
        }
    }

    /// Prints `msg` once per `key` for this vCPU.
    pub fn warn_once(&mut self, key: &'static str, msg: &str) {
        if self.warned.insert(key) {
            eprintln!("vmm: {msg}");
        }
    }

    /// Re-synchronises the counting backend after a PMU MSR write.
    pub fn reprogram(&mut self) {}

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
        format!(
            "{} rdmsr, {} wrmsr, {} #GP, {} PMIs delivered, {} dropped",
            s.rdmsr, s.wrmsr, s.gp, s.pmis_delivered, s.pmis_dropped
        )
    }
}

impl MsrHandler for VcpuPmu {
    fn rdmsr(&mut self, index: u32) -> Option<u64> {
        self.stats.rdmsr += 1;
        let r = self.vpmu.rdmsr(index).ok();
        self.stats.gp += u64::from(r.is_none());
        r
    }
    fn wrmsr(&mut self, index: u32, value: u64) -> bool {
        self.stats.wrmsr += 1;
        let ok = self.vpmu.wrmsr(index, value).is_ok();
        self.stats.gp += u64::from(!ok);
        ok
    }
}
