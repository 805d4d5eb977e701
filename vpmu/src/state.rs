//! The guest CPU state the vPMU needs at an overflow: registers for PEBS records, the paging
//! controls for the DS-area page walk, CPL for USR/OS filtering, and the TSC.

use serde::{Deserialize, Serialize};

/// General-purpose registers, RIP and RFLAGS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)]
pub struct Gprs {
    pub rax: u64,
    pub rbx: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rbp: u64,
    pub rsp: u64,
    pub r8: u64,
    pub r9: u64,
    pub r10: u64,
    pub r11: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
    pub rip: u64,
    pub rflags: u64,
}

/// The control registers that decide how a linear address translates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PagingRegs {
    /// CR0 (PG, WP, PE).
    pub cr0: u64,
    /// CR3 (page-table root).
    pub cr3: u64,
    /// CR4 (PAE, PSE, LA57, PCIDE).
    pub cr4: u64,
    /// IA32_EFER (LME, LMA).
    pub efer: u64,
}

/// Guest state at a moment of interest (an overflow, a trap).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestState {
    /// Registers after the instruction that caused the event (trap-like PEBS IP = `gprs.rip`).
    pub gprs: Gprs,
    /// Paging controls.
    pub paging: PagingRegs,
    /// Current privilege level (0-3).
    pub cpl: u8,
    /// Guest TSC.
    pub tsc: u64,
    /// XMM0-XMM15 (for the adaptive PEBS XMM group).
    pub xmm: [u128; 16],
}

/// What the counting backend knows about the instruction that caused an overflow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventInfo {
    /// Linear address of the instruction that caused the event (PEBS eventing IP).
    pub eventing_ip: u64,
    /// Data linear address for memory events.
    pub data_addr: Option<u64>,
    /// Data source encoding (PEBS DSE / meminfo) for memory events.
    pub data_source: u64,
    /// Load latency in core cycles for memory events (deterministic model).
    pub latency: u64,
}

/// One last-branch record (LBR stack entry or the adaptive PEBS LBR group).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LbrEntry {
    /// Branch source linear address (MSR_LASTBRANCH_x_FROM_IP payload).
    pub from: u64,
    /// Branch target linear address.
    pub to: u64,
    /// MSR_LBR_INFO_x payload (mispredict, cycle count) where the format has it.
    pub info: u64,
}
