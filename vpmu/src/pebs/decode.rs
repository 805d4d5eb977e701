//! PEBS record decoders for every format: parse the bytes between PEBS Buffer Base and PEBS
//! Index into records. Used by tests, the fuzzer round trip and the demo's human-readable
//! output. Never panics on arbitrary input.

use thiserror::Error;

use crate::ds::{DsArea, DsError};
use crate::mem::GuestMemory;
use crate::model::PebsFormat;
use crate::msr::{PEBS_DATACFG_GPRS, PEBS_DATACFG_MEMINFO, PEBS_DATACFG_XMMS};
use crate::paging::{LinearMemory, PageWalker, PagingError};
use crate::state::LbrEntry;

use super::adaptive::{
    BASIC_GROUP_SIZE, RECORD_FORMAT_MASK, RECORD_SIZE_SHIFT, adaptive_gprs_from_array,
    adaptive_record_size, lbr_entries,
};
use super::legacy::{legacy_gprs_from_array, legacy_record_size};
use super::record::PebsRecord;

/// Why bytes did not decode as PEBS records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The model has no PEBS record format.
    #[error("the model has no PEBS record format")]
    NoFormat,
    /// The buffer ends inside a record.
    #[error("record at offset {offset:#x} needs {need:#x} bytes, only {have:#x} left")]
    Truncated {
        /// Offset of the record in the buffer.
        offset: usize,
        /// Bytes the record needs.
        need: usize,
        /// Bytes left.
        have: usize,
    },
    /// The DS area could not be read or its PEBS fields are inconsistent.
    #[error("DS area: {0}")]
    Ds(#[from] DsError),
    /// The bytes between PEBS Buffer Base and PEBS Index could not be read.
    #[error("PEBS buffer: {0}")]
    Buffer(PagingError),
    /// PEBS Index - PEBS Buffer Base exceeds [`MAX_DRAIN_BYTES`].
    #[error("PEBS buffer holds {len:#x} bytes, more than the {MAX_DRAIN_BYTES:#x} read at once")]
    TooLarge {
        /// Index minus base.
        len: u64,
    },
    /// An adaptive record's size field (bits 63:48) is smaller than its groups need.
    #[error(
        "adaptive record at offset {offset:#x}: size field {size:#x} < {need:#x} its groups need"
    )]
    AdaptiveSizeTooSmall {
        /// Offset of the record in the buffer.
        offset: usize,
        /// The size field.
        size: usize,
        /// Size the record format's groups need.
        need: usize,
    },
}

/// Largest buffer [`read_pebs_buffer`] reads (Linux uses 64 KiB; a hostile index must not make
/// the host allocate gigabytes).
pub const MAX_DRAIN_BYTES: u64 = 16 << 20;

/// Little-endian quadword reader over one record.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    /// The caller has checked the record length, so reads past the end cannot happen; they
    /// return 0 rather than panic all the same.
    fn u64(&mut self) -> u64 {
        let v = self
            .bytes
            .get(self.pos..self.pos + 8)
            .and_then(|s| <[u8; 8]>::try_from(s).ok())
            .map_or(0, u64::from_le_bytes);
        self.pos += 8;
        v
    }
    fn u128(&mut self) -> u128 {
        let lo = self.u64();
        let hi = self.u64();
        u128::from(lo) | (u128::from(hi) << 64)
    }
    fn array18(&mut self) -> [u64; 18] {
        let mut a = [0u64; 18];
        for v in &mut a {
            *v = self.u64();
        }
        a
    }
}

fn decode_legacy(format: PebsFormat, rec: &[u8]) -> PebsRecord {
    let mut c = Cursor { bytes: rec, pos: 0 };
    let mut r = PebsRecord::empty(format);
    r.gprs = Some(legacy_gprs_from_array(&c.array18()));
    if matches!(format, PebsFormat::Netburst | PebsFormat::Fmt0) {
        return r;
    }
    let status = c.u64();
    if format == PebsFormat::Fmt3 {
        r.applicable = Some(status);
    } else {
        r.global_status = Some(status);
    }
    r.data_addr = Some(c.u64());
    r.data_source = Some(c.u64());
    r.latency = Some(c.u64());
    if format == PebsFormat::Fmt1 {
        return r;
    }
    r.eventing_ip = Some(c.u64());
    r.tsx_tuning = Some(c.u64());
    if format == PebsFormat::Fmt3 {
        r.tsc = Some(c.u64());
    }
    r
}

fn decode_adaptive(
    format: PebsFormat,
    bytes: &[u8],
    offset: usize,
) -> Result<(PebsRecord, usize), DecodeError> {
    let rest = &bytes[offset..];
    if rest.len() < BASIC_GROUP_SIZE {
        return Err(DecodeError::Truncated {
            offset,
            need: BASIC_GROUP_SIZE,
            have: rest.len(),
        });
    }
    let mut c = Cursor {
        bytes: rest,
        pos: 0,
    };
    let head = c.u64();
    let cfg = head & RECORD_FORMAT_MASK;
    let size = usize::from(u16::try_from(head >> RECORD_SIZE_SHIFT).unwrap_or(u16::MAX));
    let need = adaptive_record_size(cfg);
    if size < need {
        return Err(DecodeError::AdaptiveSizeTooSmall { offset, size, need });
    }
    if rest.len() < size {
        return Err(DecodeError::Truncated {
            offset,
            need: size,
            have: rest.len(),
        });
    }
    let mut r = PebsRecord::empty(format);
    r.record_format = Some(cfg);
    r.eventing_ip = Some(c.u64());
    r.applicable = Some(c.u64());
    r.tsc = Some(c.u64());
    if cfg & PEBS_DATACFG_MEMINFO != 0 {
        r.data_addr = Some(c.u64());
        r.data_source = Some(c.u64());
        r.latency = Some(c.u64());
        r.tsx_tuning = Some(c.u64());
    }
    if cfg & PEBS_DATACFG_GPRS != 0 {
        r.gprs = Some(adaptive_gprs_from_array(&c.array18()));
    }
    if cfg & PEBS_DATACFG_XMMS != 0 {
        let mut x = [0u128; 16];
        for v in &mut x {
            *v = c.u128();
        }
        r.xmm = Some(x);
    }
    let n = lbr_entries(cfg);
    if n > 0 {
        let lbr = (0..n)
            .map(|_| LbrEntry {
                from: c.u64(),
                to: c.u64(),
                info: c.u64(),
            })
            .collect();
        r.lbr = Some(lbr);
    }
    // A size larger than the known groups need (future groups) is skipped over, as the size
    // field is authoritative for where the next record starts.
    Ok((r, size))
}

/// Decodes the record at `offset` in `bytes`; returns it and its size.
pub fn decode_record(
    format: PebsFormat,
    bytes: &[u8],
    offset: usize,
) -> Result<(PebsRecord, usize), DecodeError> {
    if offset > bytes.len() {
        return Err(DecodeError::Truncated {
            offset,
            need: 1,
            have: 0,
        });
    }
    if format.is_adaptive() {
        return decode_adaptive(format, bytes, offset);
    }
    let size = legacy_record_size(format).ok_or(DecodeError::NoFormat)?;
    let rest = &bytes[offset..];
    if rest.len() < size {
        return Err(DecodeError::Truncated {
            offset,
            need: size,
            have: rest.len(),
        });
    }
    Ok((decode_legacy(format, &rest[..size]), size))
}

/// Decodes a whole buffer (PEBS Buffer Base up to PEBS Index) of `format` records.
pub fn decode_buffer(format: PebsFormat, bytes: &[u8]) -> Result<Vec<PebsRecord>, DecodeError> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < bytes.len() {
        let (r, size) = decode_record(format, bytes, offset)?;
        out.push(r);
        // Every record size is at least 32 bytes, so this terminates.
        offset += size;
    }
    Ok(out)
}

/// Reads and decodes the records a guest's PEBS buffer holds (Buffer Base up to Index), through
/// the guest's page tables: what a guest's drain would see. For demos, tests and debugging.
pub fn read_pebs_buffer(
    mem: &mut dyn GuestMemory,
    walker: PageWalker,
    ds_area: u64,
    format: PebsFormat,
) -> Result<Vec<PebsRecord>, DecodeError> {
    let lm = LinearMemory::new(mem, walker);
    let pebs = DsArea::read(&lm, ds_area)?.pebs;
    pebs.validate()?;
    let len = pebs.index - pebs.base;
    if len > MAX_DRAIN_BYTES {
        return Err(DecodeError::TooLarge { len });
    }
    let mut bytes = vec![0u8; usize::try_from(len).map_err(|_| DecodeError::TooLarge { len })?];
    lm.read(pebs.base, &mut bytes)
        .map_err(DecodeError::Buffer)?;
    decode_buffer(format, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_does_not_panic() {
        for f in [
            PebsFormat::Netburst,
            PebsFormat::Fmt0,
            PebsFormat::Fmt1,
            PebsFormat::Fmt2,
            PebsFormat::Fmt3,
            PebsFormat::Fmt4,
            PebsFormat::Fmt5,
        ] {
            for len in [0usize, 1, 31, 32, 0x90, 0xC8, 500] {
                let bytes: Vec<u8> = (0..len)
                    .map(|i| u8::try_from((i * 37 + 11) % 256).unwrap())
                    .collect();
                let _ = decode_buffer(f, &bytes);
            }
        }
        assert_eq!(
            decode_buffer(PebsFormat::None, &[0; 8]),
            Err(DecodeError::NoFormat)
        );
        assert_eq!(
            decode_record(PebsFormat::Fmt0, &[0; 8], 9).map(|_| ()),
            Err(DecodeError::Truncated {
                offset: 9,
                need: 1,
                have: 0
            })
        );
    }

    #[test]
    fn adaptive_size_smaller_than_groups_is_rejected() {
        let mut b = vec![0u8; 64];
        // GPR group announced, size field 32.
        b[..8].copy_from_slice(&((32u64 << 48) | PEBS_DATACFG_GPRS).to_le_bytes());
        assert_eq!(
            decode_buffer(PebsFormat::Fmt4, &b),
            Err(DecodeError::AdaptiveSizeTooSmall {
                offset: 0,
                size: 32,
                need: 176
            })
        );
        // Zero size field: rejected rather than looping.
        assert!(decode_buffer(PebsFormat::Fmt4, &[0u8; 32]).is_err());
    }
}
