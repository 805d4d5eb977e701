//! Guest physical memory as the vPMU sees it: the only way vpmu touches guest RAM.

use thiserror::Error;

/// Why a guest-physical access failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum MemError {
    /// The range is not (entirely) guest RAM: unbacked, MMIO or past the end.
    #[error("guest-physical range {gpa:#x}+{len:#x} is not guest RAM")]
    NotRam {
        /// First byte of the access.
        gpa: u64,
        /// Length of the access.
        len: usize,
    },
}

/// Guest-physical memory. Implemented by the VMM over its mmap'ed RAM and by tests and fuzzers
/// over a plain byte vector. An access must lie entirely inside RAM or fail without effect.
pub trait GuestMemory {
    /// Reads `buf.len()` bytes at `gpa`.
    fn read_phys(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError>;
    /// Writes `data` at `gpa`.
    fn write_phys(&mut self, gpa: u64, data: &[u8]) -> Result<(), MemError>;

    /// Reads a little-endian u64 at `gpa`.
    fn read_u64(&self, gpa: u64) -> Result<u64, MemError> {
        let mut b = [0u8; 8];
        self.read_phys(gpa, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
    /// Writes a little-endian u64 at `gpa`.
    fn write_u64(&mut self, gpa: u64, value: u64) -> Result<(), MemError> {
        self.write_phys(gpa, &value.to_le_bytes())
    }
}

/// Guest RAM from physical address 0 held in a vector: for unit tests, fuzzing and replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VecMemory {
    /// The bytes; physical address `i` is `bytes[i]`.
    pub bytes: Vec<u8>,
}

impl VecMemory {
    /// `size` bytes of zeroed RAM.
    pub fn new(size: usize) -> Self {
        Self {
            bytes: vec![0; size],
        }
    }

    fn range(&self, gpa: u64, len: usize) -> Result<std::ops::Range<usize>, MemError> {
        let err = MemError::NotRam { gpa, len };
        let start = usize::try_from(gpa).map_err(|_| err)?;
        let end = start.checked_add(len).ok_or(err)?;
        if end > self.bytes.len() {
            return Err(err);
        }
        Ok(start..end)
    }
}

impl GuestMemory for VecMemory {
    fn read_phys(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemError> {
        let r = self.range(gpa, buf.len())?;
        buf.copy_from_slice(&self.bytes[r]);
        Ok(())
    }
    fn write_phys(&mut self, gpa: u64, data: &[u8]) -> Result<(), MemError> {
        let r = self.range(gpa, data.len())?;
        self.bytes[r].copy_from_slice(data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vec_memory_bounds() {
        let mut m = VecMemory::new(16);
        m.write_u64(8, 0x1122_3344_5566_7788).unwrap();
        assert_eq!(m.read_u64(8).unwrap(), 0x1122_3344_5566_7788);
        assert_eq!(m.write_u64(9, 0), Err(MemError::NotRam { gpa: 9, len: 8 }));
        assert!(m.read_u64(u64::MAX).is_err());
    }
}
