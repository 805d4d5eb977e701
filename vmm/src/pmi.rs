//! PMI delivery through the guest's LVT performance-counter entry in KVM's in-kernel LAPIC.
//!
//! x2APIC MSRs cannot be filtered on KVM, so LVTPC lives in KVM's LAPIC page: read it with
//! KVM_GET_LAPIC, deliver by its delivery mode, then set LVTPC.mask as hardware does (SDM
//! 10.5.1; Linux unmasks it in its PMI handler).

use kvm_bindings::{kvm_lapic_state, kvm_msi};
use kvm_ioctls::{VcpuFd, VmFd};
use thiserror::Error;

/// Offset of the APIC ID register in the LAPIC page.
pub const APIC_ID: usize = 0x20;
/// Offset of LVT Performance Monitoring Counters register.
pub const APIC_LVTPC: usize = 0x340;
/// LVT mask bit.
pub const LVT_MASKED: u32 = 1 << 16;
const LVT_DELIVERY_MODE_SHIFT: u32 = 8;
const DELIVERY_FIXED: u32 = 0b000;
const DELIVERY_NMI: u32 = 0b100;
/// MSI address for the local APIC of `apic_id`.
const MSI_ADDRESS_BASE: u32 = 0xfee0_0000;

/// A PMI could not be delivered because a KVM call failed.
#[derive(Debug, Error)]
pub enum PmiError {
    /// KVM_GET_LAPIC failed.
    #[error("reading the LAPIC (KVM_GET_LAPIC) failed: {0}")]
    GetLapic(kvm_ioctls::Error),
    /// KVM_SET_LAPIC failed.
    #[error("writing LVTPC back (KVM_SET_LAPIC) failed: {0}")]
    SetLapic(kvm_ioctls::Error),
    /// KVM_SIGNAL_MSI failed.
    #[error("injecting the PMI vector (KVM_SIGNAL_MSI) failed: {0}")]
    SignalMsi(kvm_ioctls::Error),
    /// KVM_NMI failed.
    #[error("injecting the PMI as NMI (KVM_NMI) failed: {0}")]
    Nmi(kvm_ioctls::Error),
}

/// How LVTPC says a PMI is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmiRoute {
    /// LVTPC.mask is set: the overflow stays in GLOBAL_STATUS, nothing is delivered.
    Masked,
    /// Fixed delivery of this vector.
    Fixed(u8),
    /// NMI delivery (what Linux programs).
    Nmi,
    /// SMI, INIT, ExtINT or a reserved mode: not delivered.
    Unsupported(u32),
}

/// What happened to one PMI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PmiResult {
    /// Injected and LVTPC masked.
    Delivered(PmiRoute),
    /// Not injected, for this reason.
    Dropped(PmiRoute),
}

/// Decodes LVTPC.
pub fn route(lvtpc: u32) -> PmiRoute {
    if lvtpc & LVT_MASKED != 0 {
        return PmiRoute::Masked;
    }
    match (lvtpc >> LVT_DELIVERY_MODE_SHIFT) & 0b111 {
        DELIVERY_FIXED => PmiRoute::Fixed((lvtpc & 0xff) as u8),
        DELIVERY_NMI => PmiRoute::Nmi,
        m => PmiRoute::Unsupported(m),
    }
}

/// Reads a 32-bit LAPIC register.
pub fn lapic_reg(state: &kvm_lapic_state, offset: usize) -> u32 {
    let b = |i: usize| state.regs[offset + i].to_le_bytes()[0];
    u32::from_le_bytes([b(0), b(1), b(2), b(3)])
}

/// Writes a 32-bit LAPIC register.
pub fn set_lapic_reg(state: &mut kvm_lapic_state, offset: usize, value: u32) {
    for (i, byte) in value.to_le_bytes().iter().enumerate() {
        state.regs[offset + i] = i8::from_le_bytes([*byte]);
    }
}

/// MSI message that targets `apic_id` with a fixed-mode `vector`.
pub fn fixed_msi(apic_id: u32, vector: u8) -> kvm_msi {
    kvm_msi {
        address_lo: MSI_ADDRESS_BASE | ((apic_id & 0xff) << 12),
        data: u32::from(vector) | (DELIVERY_FIXED << LVT_DELIVERY_MODE_SHIFT),
        ..Default::default()
    }
}

/// Delivers one PMI to `vcpu` (called on the vCPU's own thread while it is stopped).
///
/// LVTPC.mask is set *before* the interrupt is sent: KVM_SET_LAPIC rewrites the whole LAPIC
/// page, so writing it after KVM_SIGNAL_MSI would erase the IRR bit the MSI just set.
pub fn deliver(vm: &VmFd, vcpu: &VcpuFd) -> Result<PmiResult, PmiError> {
    let mut lapic = vcpu.get_lapic().map_err(PmiError::GetLapic)?;
    let lvtpc = lapic_reg(&lapic, APIC_LVTPC);
    let r = route(lvtpc);
    if matches!(r, PmiRoute::Masked | PmiRoute::Unsupported(_)) {
        return Ok(PmiResult::Dropped(r));
    }
    let apic_id = lapic_reg(&lapic, APIC_ID) >> 24;
    set_lapic_reg(&mut lapic, APIC_LVTPC, lvtpc | LVT_MASKED);
    vcpu.set_lapic(&lapic).map_err(PmiError::SetLapic)?;
    let delivered = match r {
        // Ok(0) means the LAPIC blocked it (e.g. software-disabled): a dropped PMI.
        PmiRoute::Fixed(vector) => {
            vm.signal_msi(fixed_msi(apic_id, vector))
                .map_err(PmiError::SignalMsi)?
                > 0
        }
        _ => {
            vcpu.nmi().map_err(PmiError::Nmi)?;
            true
        }
    };
    if delivered {
        return Ok(PmiResult::Delivered(r));
    }
    // Nothing was sent: leave LVTPC as the guest programmed it.
    let mut lapic = vcpu.get_lapic().map_err(PmiError::GetLapic)?;
    set_lapic_reg(&mut lapic, APIC_LVTPC, lvtpc);
    vcpu.set_lapic(&lapic).map_err(PmiError::SetLapic)?;
    Ok(PmiResult::Dropped(r))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lvtpc_routes() {
        assert_eq!(route(0x10000), PmiRoute::Masked);
        assert_eq!(route(0x400), PmiRoute::Nmi);
        assert_eq!(route(0xfe), PmiRoute::Fixed(0xfe));
        assert_eq!(route(0x10400), PmiRoute::Masked);
        assert_eq!(route(0x200), PmiRoute::Unsupported(0b010));
        assert_eq!(route(0x700), PmiRoute::Unsupported(0b111));
    }

    #[test]
    fn lapic_register_access() {
        let mut s = kvm_lapic_state::default();
        set_lapic_reg(&mut s, APIC_LVTPC, 0x1_04fe);
        assert_eq!(lapic_reg(&s, APIC_LVTPC), 0x1_04fe);
        assert_eq!(lapic_reg(&s, APIC_ID), 0);
    }

    #[test]
    fn msi_targets_apic() {
        let m = fixed_msi(3, 0xee);
        assert_eq!(m.address_lo, 0xfee0_3000);
        assert_eq!(m.data, 0xee);
    }
}
