//! Port I/O.

use core::arch::asm;

/// 8-bit OUT.
pub fn outb(port: u16, val: u8) {
    // SAFETY: port writes have no memory effects visible to Rust; the guest owns every device.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") val, options(nomem, nostack, preserves_flags))
    }
}

/// 16-bit OUT.
pub fn outw(port: u16, val: u16) {
    // SAFETY: as in `outb`.
    unsafe {
        asm!("out dx, ax", in("dx") port, in("ax") val, options(nomem, nostack, preserves_flags))
    }
}

/// 32-bit OUT.
pub fn outl(port: u16, val: u32) {
    // SAFETY: as in `outb`.
    unsafe {
        asm!("out dx, eax", in("dx") port, in("eax") val, options(nomem, nostack, preserves_flags))
    }
}

/// 8-bit IN.
pub fn inb(port: u16) -> u8 {
    let v: u8;
    // SAFETY: as in `outb`.
    unsafe {
        asm!("in al, dx", in("dx") port, out("al") v, options(nomem, nostack, preserves_flags))
    }
    v
}
