//! xAPIC access through its MMIO page at 0xFEE00000 (identity-mapped by the boot page tables).

use crate::idt::VEC_SPURIOUS;

/// Physical (= virtual) base of the xAPIC registers.
pub const LAPIC_BASE: u64 = 0xfee0_0000;
/// APIC ID register.
pub const REG_ID: u32 = 0x20;
/// Version register.
pub const REG_VERSION: u32 = 0x30;
/// End-of-interrupt register.
pub const REG_EOI: u32 = 0xb0;
/// Spurious-interrupt vector register.
pub const REG_SVR: u32 = 0xf0;
/// Interrupt command register, low half (writing it sends the IPI).
pub const REG_ICR_LO: u32 = 0x300;
/// Interrupt command register, high half (destination in bits 31:24).
pub const REG_ICR_HI: u32 = 0x310;
/// LVT performance-monitoring counter entry.
pub const REG_LVTPC: u32 = 0x340;
/// SVR bit 8: APIC software enable.
pub const SVR_ENABLE: u32 = 1 << 8;
/// LVT mask bit.
pub const LVT_MASKED: u32 = 1 << 16;
/// LVT / ICR delivery mode NMI (bits 10:8 = 100b).
pub const DELIVERY_NMI: u32 = 4 << 8;
/// ICR level bit: assert.
pub const ICR_ASSERT: u32 = 1 << 14;
/// ICR delivery-status bit (send pending).
pub const ICR_BUSY: u32 = 1 << 12;

/// Read a 32-bit xAPIC register.
pub fn read(reg: u32) -> u32 {
    // SAFETY: the xAPIC page is identity-mapped; registers are aligned 32-bit MMIO.
    unsafe { ((LAPIC_BASE + u64::from(reg)) as *const u32).read_volatile() }
}

/// Write a 32-bit xAPIC register.
pub fn write(reg: u32, val: u32) {
    // SAFETY: as in `read`.
    unsafe { ((LAPIC_BASE + u64::from(reg)) as *mut u32).write_volatile(val) }
}

/// This CPU's APIC ID (bits 31:24 of the ID register).
pub fn id() -> u32 {
    read(REG_ID) >> 24
}

/// Software-enable the APIC with the runtime's spurious vector (needed for any delivery).
pub fn enable() {
    write(REG_SVR, SVR_ENABLE | u32::from(VEC_SPURIOUS));
}

/// Signal end of interrupt.
pub fn eoi() {
    write(REG_EOI, 0);
}

/// Current LVTPC.
pub fn lvtpc() -> u32 {
    read(REG_LVTPC)
}

/// Program LVTPC (vector | delivery mode | mask).
pub fn set_lvtpc(val: u32) {
    write(REG_LVTPC, val);
}

/// Send an IPI to the APIC with ID `dest` (ICR low = `lo`) and wait until it has been sent.
pub fn send_ipi(dest: u32, lo: u32) {
    write(REG_ICR_HI, dest << 24);
    write(REG_ICR_LO, lo);
    for _ in 0..10_000 {
        if read(REG_ICR_LO) & ICR_BUSY == 0 {
            break;
        }
    }
}
