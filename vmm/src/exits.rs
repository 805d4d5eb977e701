//! vCPU exit handling as a pure function of the exit and the device/MSR state, so every exit
//! kind is unit-tested with synthetic exits and no KVM.

use std::sync::Mutex;

use kvm_bindings::kvm_debug_exit_arch;
use kvm_ioctls::VcpuExit;

use crate::devices::bus::{Bus, IoOutcome};

/// The MSR side of the VMM as the exit handler sees it (the vPMU in production, a map in tests).
pub trait MsrHandler {
    /// Guest RDMSR of a trapped MSR: `None` injects #GP.
    fn rdmsr(&mut self, index: u32) -> Option<u64>;
    /// Guest WRMSR of a trapped MSR: `false` injects #GP.
    fn wrmsr(&mut self, index: u32, value: u64) -> bool;
}

/// Why a vCPU stopped for good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopReason {
    /// The guest wrote this value to the exit port.
    GuestExit(u32),
    /// Triple fault (KVM_EXIT_SHUTDOWN).
    TripleFault,
    /// KVM could not run or emulate the guest.
    InternalError,
    /// VM entry failed with this hardware reason.
    FailEntry(u64),
    /// A system event (reset/shutdown/crash) of this type.
    SystemEvent(u32),
    /// An exit this VMM does not handle.
    Unhandled(String),
}

/// What the vCPU loop does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitAction {
    /// Re-enter the guest.
    Continue,
    /// A PMU MSR was trapped: the loop re-synchronises the counting backend and the #GP
    /// breakpoint before re-entry.
    PmuTrap,
    /// KVM_RUN returned EINTR (a host counter overflow signal or a kick).
    Interrupted,
    /// A guest-debug exit (single-step or breakpoint) for the counting backend.
    Debug(DebugExit),
    /// Stop this vCPU (and the VM).
    Stop(StopReason),
}

/// The fields of a debug exit that matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DebugExit {
    /// Exception vector (1 = #DB, 3 = #BP).
    pub exception: u32,
    /// Guest RIP at the exit.
    pub pc: u64,
    /// DR6 (BS = single step, B0-B3 = breakpoint hits).
    pub dr6: u64,
}

impl From<kvm_debug_exit_arch> for DebugExit {
    fn from(d: kvm_debug_exit_arch) -> Self {
        Self {
            exception: d.exception,
            pc: d.pc,
            dr6: d.dr6,
        }
    }
}

/// Handles one exit. `bus` is shared by all vCPUs; `msrs` belongs to this vCPU.
pub fn handle_exit(exit: VcpuExit<'_>, bus: &Mutex<Bus>, msrs: &mut dyn MsrHandler) -> ExitAction {
    let lock = || {
        bus.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    };
    match exit {
        VcpuExit::IoOut(port, data) => match lock().pio_write(port, data) {
            IoOutcome::Continue => ExitAction::Continue,
            IoOutcome::Exit(v) => ExitAction::Stop(StopReason::GuestExit(v)),
        },
        VcpuExit::IoIn(port, data) => {
            lock().pio_read(port, data);
            ExitAction::Continue
        }
        VcpuExit::MmioRead(addr, data) => {
            lock().mmio_read(addr, data);
            ExitAction::Continue
        }
        VcpuExit::MmioWrite(addr, data) => {
            lock().mmio_write(addr, data);
            ExitAction::Continue
        }
        VcpuExit::X86Rdmsr(e) => {
            match msrs.rdmsr(e.index) {
                Some(v) => {
                    *e.data = v;
                    *e.error = 0;
                }
                None => *e.error = 1,
            }
            ExitAction::PmuTrap
        }
        VcpuExit::X86Wrmsr(e) => {
            *e.error = u8::from(!msrs.wrmsr(e.index, e.data));
            ExitAction::PmuTrap
        }
        VcpuExit::Debug(d) => ExitAction::Debug(d.into()),
        // With the in-kernel irqchip HLT does not exit; without one a halted guest is done.
        VcpuExit::Hlt => ExitAction::Stop(StopReason::Unhandled("HLT with interrupts off".into())),
        VcpuExit::Shutdown => ExitAction::Stop(StopReason::TripleFault),
        VcpuExit::InternalError => ExitAction::Stop(StopReason::InternalError),
        VcpuExit::FailEntry(reason, _cpu) => ExitAction::Stop(StopReason::FailEntry(reason)),
        VcpuExit::SystemEvent(kind, _) => ExitAction::Stop(StopReason::SystemEvent(kind)),
        VcpuExit::Intr | VcpuExit::IrqWindowOpen | VcpuExit::IoapicEoi(_) => ExitAction::Continue,
        other => ExitAction::Stop(StopReason::Unhandled(format!("{other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use kvm_ioctls::{MsrExitReason, ReadMsrExit, WriteMsrExit};
    use vmm_sys_util::eventfd::EventFd;

    use super::*;
    use crate::devices::fw_cfg::FwCfg;
    use crate::devices::serial::{Sink, new_uart};

    #[derive(Default)]
    struct MapMsrs(HashMap<u32, u64>);
    impl MsrHandler for MapMsrs {
        fn rdmsr(&mut self, index: u32) -> Option<u64> {
            self.0.get(&index).copied()
        }
        fn wrmsr(&mut self, index: u32, value: u64) -> bool {
            if index == 0x38e {
                return false; // read-only
            }
            self.0.insert(index, value);
            true
        }
    }

    fn bus() -> Mutex<Bus> {
        Mutex::new(Bus::new(
            new_uart(EventFd::new(0).unwrap(), Sink::Buffer(Vec::new())),
            FwCfg::new(1, 64 << 20),
        ))
    }

    #[test]
    fn exit_port_stops_with_value() {
        let b = bus();
        let mut m = MapMsrs::default();
        let data = 3u32.to_le_bytes();
        assert_eq!(
            handle_exit(VcpuExit::IoOut(0xf4, &data), &b, &mut m),
            ExitAction::Stop(StopReason::GuestExit(3))
        );
        assert_eq!(
            handle_exit(VcpuExit::IoOut(0x3f8, b"x"), &b, &mut m),
            ExitAction::Continue
        );
    }

    #[test]
    fn io_in_fills_data() {
        let b = bus();
        let mut m = MapMsrs::default();
        let mut d = [0u8];
        assert_eq!(
            handle_exit(VcpuExit::IoIn(0x3fd, &mut d), &b, &mut m),
            ExitAction::Continue
        );
        assert_ne!(d[0] & 0x20, 0);
    }

    #[test]
    fn rdmsr_answers_or_injects_gp() {
        let b = bus();
        let mut m = MapMsrs::default();
        m.0.insert(0x38f, 0xf);
        let (mut err, mut data) = (0xffu8, 0u64);
        let e = ReadMsrExit {
            error: &mut err,
            reason: MsrExitReason::Filter,
            index: 0x38f,
            data: &mut data,
        };
        assert_eq!(
            handle_exit(VcpuExit::X86Rdmsr(e), &b, &mut m),
            ExitAction::PmuTrap
        );
        assert_eq!((err, data), (0, 0xf));
        let e = ReadMsrExit {
            error: &mut err,
            reason: MsrExitReason::Filter,
            index: 0x999,
            data: &mut data,
        };
        handle_exit(VcpuExit::X86Rdmsr(e), &b, &mut m);
        assert_eq!(err, 1);
    }

    #[test]
    fn wrmsr_changes_pmu_or_injects_gp() {
        let b = bus();
        let mut m = MapMsrs::default();
        let mut err = 0xffu8;
        let e = WriteMsrExit {
            error: &mut err,
            reason: MsrExitReason::Filter,
            index: 0x186,
            data: 0x43_00c0,
        };
        assert_eq!(
            handle_exit(VcpuExit::X86Wrmsr(e), &b, &mut m),
            ExitAction::PmuTrap
        );
        assert_eq!(err, 0);
        assert_eq!(m.0[&0x186], 0x43_00c0);
        let e = WriteMsrExit {
            error: &mut err,
            reason: MsrExitReason::Filter,
            index: 0x38e,
            data: 1,
        };
        assert_eq!(
            handle_exit(VcpuExit::X86Wrmsr(e), &b, &mut m),
            ExitAction::PmuTrap
        );
        assert_eq!(err, 1);
    }

    #[test]
    fn fatal_exits_stop() {
        let b = bus();
        let mut m = MapMsrs::default();
        assert_eq!(
            handle_exit(VcpuExit::Shutdown, &b, &mut m),
            ExitAction::Stop(StopReason::TripleFault)
        );
        assert_eq!(
            handle_exit(VcpuExit::InternalError, &b, &mut m),
            ExitAction::Stop(StopReason::InternalError)
        );
        assert_eq!(
            handle_exit(VcpuExit::FailEntry(7, 0), &b, &mut m),
            ExitAction::Stop(StopReason::FailEntry(7))
        );
        assert!(matches!(
            handle_exit(
                VcpuExit::Hypercall(kvm_ioctls::HypercallExit {
                    nr: 0,
                    args: [0; 6],
                    ret: &mut 0,
                    longmode: 0
                }),
                &b,
                &mut m
            ),
            ExitAction::Stop(StopReason::Unhandled(_))
        ));
        let dbg = kvm_debug_exit_arch {
            exception: 1,
            pad: 0,
            pc: 0x1000,
            dr6: 0x4000,
            dr7: 0,
        };
        assert_eq!(
            handle_exit(VcpuExit::Debug(dbg), &b, &mut m),
            ExitAction::Debug(DebugExit {
                exception: 1,
                pc: 0x1000,
                dr6: 0x4000
            })
        );
    }
}
