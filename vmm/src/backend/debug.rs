//! The vCPU's KVM guest-debug state, shared by the precise backend (single-step) and the RDPMC
//! intercept (a hardware breakpoint on the guest's #GP handler).

use kvm_bindings::{
    KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_SINGLESTEP, KVM_GUESTDBG_USE_HW_BP, kvm_guest_debug,
};

/// DR6.B0: breakpoint 0 hit.
pub const DR6_B0: u64 = 1 << 0;
/// DR6.BS: single step.
pub const DR6_BS: u64 = 1 << 14;
/// DR7.L0: enable breakpoint 0 (R/W0 = 00 execute, LEN0 = 00).
const DR7_L0: u64 = 1 << 0;
/// DR7.L1: enable breakpoint 1 (execute).
const DR7_L1: u64 = 1 << 2;

/// What guest debug should do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GuestDebug {
    /// Single-step every instruction (precise counting).
    pub stepping: bool,
    /// Address of the guest's #GP handler to break on.
    pub gp_breakpoint: Option<u64>,
    /// Step one instruction with the breakpoint disarmed, to get past it (a hardware
    /// breakpoint re-fires on every resume at its address).
    pub stepping_over: bool,
    /// End of a straight-line block run at full speed instead of stepped (DR1); while set,
    /// single-step is off.
    pub block_end: Option<u64>,
}

impl GuestDebug {
    /// The KVM_SET_GUEST_DEBUG argument.
    pub fn to_kvm(self) -> kvm_guest_debug {
        let mut d = kvm_guest_debug::default();
        let bp = self.gp_breakpoint.filter(|_| !self.stepping_over);
        let step = (self.stepping && self.block_end.is_none()) || self.stepping_over;
        if !step && bp.is_none() && self.block_end.is_none() {
            return d;
        }
        d.control = KVM_GUESTDBG_ENABLE;
        if step {
            d.control |= KVM_GUESTDBG_SINGLESTEP;
        }
        if let Some(addr) = bp {
            d.control |= KVM_GUESTDBG_USE_HW_BP;
            d.arch.debugreg[0] = addr;
            d.arch.debugreg[7] |= DR7_L0;
        }
        if let Some(addr) = self.block_end {
            d.control |= KVM_GUESTDBG_USE_HW_BP;
            d.arch.debugreg[1] = addr;
            d.arch.debugreg[7] |= DR7_L1;
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kvm_encoding() {
        assert_eq!(GuestDebug::default().to_kvm().control, 0);
        let s = GuestDebug {
            stepping: true,
            ..Default::default()
        }
        .to_kvm();
        assert_eq!(s.control, KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP);
        let b = GuestDebug {
            gp_breakpoint: Some(0x1234),
            ..Default::default()
        }
        .to_kvm();
        assert_eq!(b.control, KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_USE_HW_BP);
        assert_eq!((b.arch.debugreg[0], b.arch.debugreg[7]), (0x1234, 1));
        let over = GuestDebug {
            gp_breakpoint: Some(0x1234),
            stepping_over: true,
            ..Default::default()
        };
        assert_eq!(
            over.to_kvm().control,
            KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP
        );
        let block = GuestDebug {
            stepping: true,
            gp_breakpoint: Some(0x1234),
            block_end: Some(0x5678),
            ..Default::default()
        }
        .to_kvm();
        assert_eq!(block.control, KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_USE_HW_BP);
        assert_eq!(block.arch.debugreg[..2], [0x1234, 0x5678]);
        assert_eq!(block.arch.debugreg[7], 0b101);
    }
}
