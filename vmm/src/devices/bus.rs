//! Port-I/O and MMIO dispatch: COM1, the test-exit port, fw_cfg, the PIC mask ports. Anything
//! else is logged once per address and ignored (reads return all ones, as an empty ISA bus).

use std::collections::HashSet;
use std::io::Write;

use super::fw_cfg::FwCfg;
use super::serial::{COM1_BASE, COM1_LEN, Uart};

/// QEMU isa-debug-exit port: a write of V ends the run with status (V << 1) | 1.
pub const EXIT_PORT: u16 = 0xf4;
/// fw_cfg selector port.
pub const FW_CFG_SELECTOR: u16 = 0x510;
/// fw_cfg data port.
pub const FW_CFG_DATA: u16 = 0x511;
/// 8259 master/slave data (mask) ports; the in-kernel PIC normally takes these, but a guest may
/// reach us when KVM hands them out.
const PIC_MASK_PORTS: [u16; 2] = [0x21, 0xa1];
/// Bochs/QEMU shutdown string port, reached by kvm-unit-tests only if 0xf4 did not stop the VM.
const BOCHS_SHUTDOWN_PORT: u16 = 0x8900;

/// What the vCPU loop must do after a port write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOutcome {
    /// Keep running.
    Continue,
    /// The guest asked to stop with this exit-port value.
    Exit(u32),
}

/// The devices behind port I/O and MMIO exits.
pub struct Bus {
    /// COM1.
    pub uart: Uart,
    /// fw_cfg (legacy I/O).
    pub fw_cfg: FwCfg,
    logged: HashSet<(char, u64)>,
}

impl Bus {
    /// A bus with the given devices.
    pub fn new(uart: Uart, fw_cfg: FwCfg) -> Self {
        Self {
            uart,
            fw_cfg,
            logged: HashSet::new(),
        }
    }

    fn log_once(&mut self, kind: char, addr: u64, what: &str) {
        if self.logged.insert((kind, addr)) {
            eprintln!("vmm: guest {what} at {addr:#x} ignored (no device there; logged once)");
        }
    }

    /// Guest IN from `port`.
    pub fn pio_read(&mut self, port: u16, data: &mut [u8]) {
        match port {
            p if (COM1_BASE..COM1_BASE + COM1_LEN).contains(&p) => {
                let v = self.uart.read(offset8(p - COM1_BASE));
                data.fill(0);
                data[0] = v;
            }
            FW_CFG_SELECTOR | FW_CFG_DATA => self.fw_cfg.io_read(port, data),
            p if PIC_MASK_PORTS.contains(&p) => data.fill(0xff),
            _ => {
                data.fill(0xff);
                self.log_once('i', port.into(), "port read");
            }
        }
    }

    /// Guest OUT to `port`.
    pub fn pio_write(&mut self, port: u16, data: &[u8]) -> IoOutcome {
        match port {
            EXIT_PORT => {
                let mut v = [0u8; 4];
                let n = data.len().min(4);
                v[..n].copy_from_slice(&data[..n]);
                return IoOutcome::Exit(u32::from_le_bytes(v));
            }
            p if (COM1_BASE..COM1_BASE + COM1_LEN).contains(&p) => {
                if let Some(&b) = data.first() {
                    if let Err(e) = self.uart.write(offset8(p - COM1_BASE), b) {
                        self.log_once('e', p.into(), &format!("serial write failed ({e:?})"));
                    }
                }
            }
            FW_CFG_SELECTOR | FW_CFG_DATA => self.fw_cfg.io_write(port, data),
            p if PIC_MASK_PORTS.contains(&p) || p == BOCHS_SHUTDOWN_PORT => {}
            _ => self.log_once('o', port.into(), "port write"),
        }
        IoOutcome::Continue
    }

    /// Guest MMIO read outside RAM and the in-kernel devices.
    pub fn mmio_read(&mut self, addr: u64, data: &mut [u8]) {
        data.fill(0xff);
        self.log_once('r', addr, "MMIO read");
    }

    /// Guest MMIO write outside RAM and the in-kernel devices.
    pub fn mmio_write(&mut self, addr: u64, _data: &[u8]) {
        self.log_once('w', addr, "MMIO write");
    }

    /// Flushes the console sink.
    pub fn flush(&mut self) {
        let _ = self.uart.writer_mut().flush();
    }
}

fn offset8(off: u16) -> u8 {
    // COM1 offsets are 0..8 by construction of the match arm.
    u8::try_from(off).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::super::serial::{Sink, new_uart};
    use super::*;
    use vmm_sys_util::eventfd::EventFd;

    fn bus() -> Bus {
        let uart = new_uart(EventFd::new(0).unwrap(), Sink::Buffer(Vec::new()));
        Bus::new(uart, FwCfg::new(2, 64 << 20))
    }

    fn console(b: &Bus) -> String {
        match b.uart.writer() {
            Sink::Buffer(v) => String::from_utf8_lossy(v).into_owned(),
            _ => unreachable!(),
        }
    }

    #[test]
    fn serial_output_and_line_status() {
        let mut b = bus();
        for c in b"hi\n" {
            assert_eq!(b.pio_write(0x3f8, &[*c]), IoOutcome::Continue);
        }
        assert_eq!(console(&b), "hi\n");
        let mut lsr = [0u8];
        b.pio_read(0x3fd, &mut lsr);
        assert_ne!(lsr[0] & 0x20, 0, "THRE must read 1 or guests spin");
        // LCR read-modify-write returns what was written.
        b.pio_write(0x3fb, &[0x03]);
        let mut lcr = [0u8];
        b.pio_read(0x3fb, &mut lcr);
        assert_eq!(lcr[0], 0x03);
    }

    #[test]
    fn exit_port_widths() {
        let mut b = bus();
        assert_eq!(
            b.pio_write(EXIT_PORT, &7u32.to_le_bytes()),
            IoOutcome::Exit(7)
        );
        assert_eq!(b.pio_write(EXIT_PORT, &[1]), IoOutcome::Exit(1));
        assert_eq!(
            b.pio_write(EXIT_PORT, &0x102u16.to_le_bytes()),
            IoOutcome::Exit(0x102)
        );
    }

    #[test]
    fn fw_cfg_cpu_count_through_ports() {
        let mut b = bus();
        b.pio_write(FW_CFG_SELECTOR, &5u16.to_le_bytes());
        let (mut lo, mut hi) = ([0u8], [0u8]);
        b.pio_read(FW_CFG_DATA, &mut lo);
        b.pio_read(FW_CFG_DATA, &mut hi);
        assert_eq!(u16::from_le_bytes([lo[0], hi[0]]), 2);
    }

    #[test]
    fn unknown_ports_read_all_ones_and_are_logged_once() {
        let mut b = bus();
        let mut d = [0u8; 2];
        b.pio_read(0x1234, &mut d);
        assert_eq!(d, [0xff, 0xff]);
        b.pio_read(0x1234, &mut d);
        assert_eq!(b.logged.len(), 1);
        assert_eq!(b.pio_write(0x1234, &[0]), IoOutcome::Continue);
        assert_eq!(b.logged.len(), 2);
    }
}
