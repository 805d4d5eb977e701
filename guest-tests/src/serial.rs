//! 16550 UART at 0x3f8, polled: the LSR THRE bit is checked before every byte.

use crate::port::{inb, outb};
use core::fmt;

/// Base port of COM1.
pub const COM1: u16 = 0x3f8;
/// Line status register offset.
pub const LSR: u16 = 5;
/// Scratch register offset.
pub const SCR: u16 = 7;
/// LSR bit 5: transmit holding register empty.
pub const LSR_THRE: u8 = 1 << 5;

/// Bound on THRE polls per byte, so a broken UART model cannot hang the guest.
const THRE_POLLS: u32 = 10_000;

/// Send one byte.
pub fn write_byte(b: u8) {
    for _ in 0..THRE_POLLS {
        if inb(COM1 + LSR) & LSR_THRE != 0 {
            break;
        }
    }
    outb(COM1, b);
}

/// Writer for `core::fmt` output to COM1.
pub struct Serial;

impl fmt::Write for Serial {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        s.bytes().for_each(write_byte);
        Ok(())
    }
}

#[doc(hidden)]
pub fn _print(args: fmt::Arguments<'_>) {
    // Serial never fails.
    let _ = fmt::Write::write_fmt(&mut Serial, args);
}

/// Print to the serial port.
#[macro_export]
macro_rules! print {
    ($($arg:tt)*) => { $crate::serial::_print(format_args!($($arg)*)) };
}

/// Print a line to the serial port.
#[macro_export]
macro_rules! println {
    () => { $crate::serial::_print(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::serial::_print(format_args!("{}\n", format_args!($($arg)*))) };
}
