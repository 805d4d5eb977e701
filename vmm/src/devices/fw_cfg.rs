//! QEMU fw_cfg, legacy port-I/O interface only (no DMA, no file directory).
//!
//! Selector: 16-bit write to port 0x510; it also rewinds the data offset. Data: byte reads from
//! port 0x511, little-endian, auto-incrementing. Unknown keys and reads past an item's end give
//! 0, as QEMU does. Items (docs/specs/fw_cfg.rst in QEMU; kvm-unit-tests `lib/x86/fwcfg.h`):
//!
//! | Key | Item | Bytes |
//! |---|---|---|
//! | 0x00 | signature "QEMU" | 4 |
//! | 0x01 | interface ID: bit 0 = traditional (port) interface, no DMA (bit 1 clear) | 4 |
//! | 0x03 | RAM size | 8 |
//! | 0x05 | number of CPUs | 2 |
//! | 0x11 | maximum RAM (kvm-unit-tests "FW_CFG_MAX_RAM") = RAM size | 8 |

/// Selector port (16-bit writes).
pub const FW_CFG_SELECTOR_PORT: u16 = 0x510;
/// Data port (8-bit reads).
pub const FW_CFG_DATA_PORT: u16 = 0x511;

/// Key: signature.
pub const FW_CFG_SIGNATURE: u16 = 0x00;
/// Key: interface ID.
pub const FW_CFG_ID: u16 = 0x01;
/// Key: RAM size in bytes.
pub const FW_CFG_RAM_SIZE: u16 = 0x03;
/// Key: CPU count.
pub const FW_CFG_NB_CPUS: u16 = 0x05;
/// Key: maximum RAM (kvm-unit-tests' meaning; QEMU uses 0x11 for kernel data).
pub const FW_CFG_MAX_RAM: u16 = 0x11;

/// `FW_CFG_ID` bit 0: the traditional port interface is present.
const FW_CFG_VERSION_TRADITIONAL: u32 = 1 << 0;

/// Longest item (RAM sizes).
const MAX_ITEM: usize = 8;

/// The fw_cfg device state.
#[derive(Clone, Debug)]
pub struct FwCfg {
    vcpus: u16,
    ram_size: u64,
    selector: u16,
    offset: usize,
}

impl FwCfg {
    /// A device reporting `vcpus` CPUs and `ram_size` bytes of RAM; key 0 selected.
    pub fn new(vcpus: u16, ram_size: u64) -> Self {
        FwCfg {
            vcpus,
            ram_size,
            selector: FW_CFG_SIGNATURE,
            offset: 0,
        }
    }

    /// Bytes of the item `key` (length, buffer); length 0 for unknown keys.
    fn item(&self, key: u16) -> (usize, [u8; MAX_ITEM]) {
        let mut buf = [0u8; MAX_ITEM];
        let mut put = |bytes: &[u8]| {
            buf[..bytes.len()].copy_from_slice(bytes);
            bytes.len()
        };
        let len = match key {
            FW_CFG_SIGNATURE => put(b"QEMU"),
            FW_CFG_ID => put(&FW_CFG_VERSION_TRADITIONAL.to_le_bytes()),
            FW_CFG_RAM_SIZE | FW_CFG_MAX_RAM => put(&self.ram_size.to_le_bytes()),
            FW_CFG_NB_CPUS => put(&self.vcpus.to_le_bytes()),
            _ => 0,
        };
        (len, buf)
    }

    /// Select an item and rewind to its first byte.
    pub fn write_selector(&mut self, value: u16) {
        self.selector = value;
        self.offset = 0;
    }

    /// Next byte of the selected item (0 past its end or for unknown keys).
    pub fn read_data(&mut self) -> u8 {
        let (len, buf) = self.item(self.selector);
        let byte = if self.offset < len {
            buf[self.offset]
        } else {
            0
        };
        // Saturate: a guest reading forever must not overflow the offset.
        self.offset = self.offset.saturating_add(1);
        byte
    }

    /// Port-I/O read. The data port yields one item byte per byte of the access; anything else
    /// (selector port, other ports) reads as 0.
    pub fn io_read(&mut self, port: u16, data: &mut [u8]) {
        if port == FW_CFG_DATA_PORT {
            for byte in data.iter_mut() {
                *byte = self.read_data();
            }
        } else {
            data.fill(0);
        }
    }

    /// Port-I/O write. The selector port takes a little-endian 16-bit key (an 8-bit write
    /// selects a key below 0x100); data-port writes are ignored, as in QEMU 2.4+.
    pub fn io_write(&mut self, port: u16, data: &[u8]) {
        if port != FW_CFG_SELECTOR_PORT {
            return;
        }
        let value = match data {
            [] => return,
            [lo] => u16::from(*lo),
            [lo, hi, ..] => u16::from_le_bytes([*lo, *hi]),
        };
        self.write_selector(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_item(dev: &mut FwCfg, key: u16, len: usize) -> Vec<u8> {
        dev.io_write(FW_CFG_SELECTOR_PORT, &key.to_le_bytes());
        (0..len)
            .map(|_| {
                let mut b = [0xAAu8];
                dev.io_read(FW_CFG_DATA_PORT, &mut b);
                b[0]
            })
            .collect()
    }

    #[test]
    fn signature_id_and_sizes() {
        let mut dev = FwCfg::new(3, 0x1_2345_6000);
        assert_eq!(read_item(&mut dev, FW_CFG_SIGNATURE, 4), b"QEMU");
        assert_eq!(read_item(&mut dev, FW_CFG_ID, 4), [1, 0, 0, 0]);
        assert_eq!(
            read_item(&mut dev, FW_CFG_RAM_SIZE, 8),
            0x1_2345_6000u64.to_le_bytes()
        );
        assert_eq!(read_item(&mut dev, FW_CFG_NB_CPUS, 2), [3, 0]);
        assert_eq!(
            read_item(&mut dev, FW_CFG_MAX_RAM, 8),
            0x1_2345_6000u64.to_le_bytes()
        );
    }

    #[test]
    fn past_end_and_unknown_keys_read_zero() {
        let mut dev = FwCfg::new(1, 128 << 20);
        assert_eq!(read_item(&mut dev, FW_CFG_NB_CPUS, 5), [1, 0, 0, 0, 0]);
        assert_eq!(read_item(&mut dev, 0x19, 4), [0; 4]);
        assert_eq!(read_item(&mut dev, 0x8005, 2), [0; 2]);
    }

    #[test]
    fn selector_write_rewinds() {
        let mut dev = FwCfg::new(2, 64 << 20);
        dev.write_selector(FW_CFG_SIGNATURE);
        assert_eq!(dev.read_data(), b'Q');
        assert_eq!(dev.read_data(), b'E');
        dev.write_selector(FW_CFG_SIGNATURE);
        assert_eq!(dev.read_data(), b'Q');
        dev.write_selector(FW_CFG_NB_CPUS);
        assert_eq!(dev.read_data(), 2);
    }

    #[test]
    fn wide_data_read_and_byte_selector_write() {
        let mut dev = FwCfg::new(4, 64 << 20);
        dev.io_write(FW_CFG_SELECTOR_PORT, &[0x05]);
        let mut word = [0xFFu8; 2];
        dev.io_read(FW_CFG_DATA_PORT, &mut word);
        assert_eq!(word, [4, 0]);
        let mut sel = [0xFFu8; 2];
        dev.io_read(FW_CFG_SELECTOR_PORT, &mut sel);
        assert_eq!(sel, [0, 0]);
        // Writes to the data port and empty writes change nothing.
        dev.write_selector(FW_CFG_SIGNATURE);
        dev.io_write(FW_CFG_DATA_PORT, &[0x05, 0]);
        dev.io_write(FW_CFG_SELECTOR_PORT, &[]);
        assert_eq!(dev.read_data(), b'Q');
    }

    #[test]
    fn offset_saturates() {
        let mut dev = FwCfg::new(1, 0);
        dev.write_selector(FW_CFG_SIGNATURE);
        dev.offset = usize::MAX;
        assert_eq!(dev.read_data(), 0);
        assert_eq!(dev.offset, usize::MAX);
    }
}
