//! Runtime for the no_std guest programs the `vmm` integration tests boot.
//!
//! Boot contract (vmm `boot/`): 64-bit long mode, CPL0, identity-mapped 0-4 GiB, RDI = vCPU index,
//! RSI = RAM size. [`entry`] picks a stack per vCPU and calls the bin's `guest_main`; the bin calls
//! [`entry::init`] (APs park there) and then [`test::run_all`].
//!
//! CPL0 code is instruction-emulated on the development host (a few M instructions/s), so the
//! runtime keeps CPL0 work small; long workloads go to CPL3 through [`user::run_user`].

#![no_std]

pub mod context;
pub mod cpu;
pub mod entry;
pub mod exit;
pub mod fault;
pub mod gdt;
pub mod idt;
pub mod lapic;
pub mod msr;
pub mod pebs;
pub mod pmi;
pub mod pmu;
pub mod port;
pub mod racy;
pub mod serial;
pub mod test;
pub mod user;

/// MSR numbers and bit fields, shared with the host-side `vpmu` crate (pure constants, so the
/// no_std guest includes the same file instead of repeating numbers).
#[path = "../../vpmu/src/msr.rs"]
#[allow(dead_code, missing_docs)]
pub mod msr_index;

use core::panic::PanicInfo;

/// Exit code for a broken run (panic, unexpected exception outside a test): the vmm reports
/// status 127, as kvm-unit-tests' abort() does.
pub const EXIT_ABORT: u32 = 63;

#[panic_handler]
fn panic(info: &PanicInfo<'_>) -> ! {
    println!("PANIC in {}: {}", test::current_name(), info);
    exit::exit(EXIT_ABORT)
}
