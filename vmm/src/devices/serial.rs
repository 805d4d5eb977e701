//! The 16550 UART at 0x3f8 (vm-superio), its interrupt line and its output sink.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

/// First I/O port of COM1.
pub const COM1_BASE: u16 = 0x3f8;
/// Number of COM1 registers.
pub const COM1_LEN: u16 = 8;
/// Legacy IRQ of COM1.
pub const COM1_IRQ: u32 = 4;

/// Raises the UART's interrupt line through an irqfd.
#[derive(Debug)]
pub struct IrqTrigger(pub EventFd);

impl Trigger for IrqTrigger {
    type E = io::Error;
    fn trigger(&self) -> io::Result<()> {
        self.0.write(1)
    }
}

/// Where guest console bytes go. Stdout is flushed at every newline so a test harness sees
/// output as it happens.
pub enum Sink {
    /// Process stdout.
    Stdout(io::Stdout),
    /// A file.
    File(File),
    /// Captured in memory (tests).
    #[cfg(test)]
    Buffer(Vec<u8>),
}

impl Sink {
    /// A sink for `--serial PATH`.
    pub fn file(path: &Path) -> io::Result<Self> {
        File::create(path).map(Sink::File)
    }
}

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sink::Stdout(s) => {
                let n = s.write(buf)?;
                if buf[..n].contains(&b'\n') {
                    s.flush()?;
                }
                Ok(n)
            }
            Sink::File(f) => f.write(buf),
            #[cfg(test)]
            Sink::Buffer(v) => v.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Sink::Stdout(s) => s.flush(),
            Sink::File(f) => f.flush(),
            #[cfg(test)]
            Sink::Buffer(_) => Ok(()),
        }
    }
}

/// COM1.
pub type Uart = Serial<IrqTrigger, NoEvents, Sink>;

/// Creates COM1 writing to `sink` and signalling `irq`.
pub fn new_uart(irq: EventFd, sink: Sink) -> Uart {
    Serial::new(IrqTrigger(irq), sink)
}
