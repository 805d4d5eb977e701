//! Adaptive PEBS records, formats 4 and 5 (SDM 18.9.2.2 "Adaptive PEBS", Ice Lake: "Basic Info",
//! "Memory Access Info", "GPRs", "XMMs" and "LBRs" groups; Linux `pebs_basic`, `pebs_meminfo`,
//! `pebs_gprs`, `pebs_xmm`, `lbr_entry`). Formats 4 and 5 share the record; they differ only in
//! where the fixed counters' reset values live in the DS area (`ds::counter_reset_slot`).
//!
//! Layout: the basic group, then in this order only the groups named in the record's
//! "Record Format" field: memory info, GPRs, XMMs, LBRs. The basic group's first quadword holds
//! the groups (MSR_PEBS_DATA_CFG as applied) in bits 47:0 and the record size in bits 63:48.

use crate::msr::{
    PEBS_DATACFG_GPRS, PEBS_DATACFG_LBR_SHIFT, PEBS_DATACFG_LBRS, PEBS_DATACFG_MEMINFO,
    PEBS_DATACFG_XMMS,
};
use crate::state::{Gprs, LbrEntry};

use super::legacy::put;
use super::record::PebsRecord;

/// Basic group: format/size, eventing IP, applicable counters, TSC.
pub const BASIC_GROUP_SIZE: usize = 32;
/// Memory-info group: data address, data source (aux), latency, TSX tuning.
pub const MEMINFO_GROUP_SIZE: usize = 32;
/// GPR group: 18 quadwords.
pub const GPR_GROUP_SIZE: usize = 144;
/// XMM group: XMM0-15, 16 bytes each.
pub const XMM_GROUP_SIZE: usize = 256;
/// One LBR entry: from, to, info.
pub const LBR_ENTRY_SIZE: usize = 24;
/// Bits 47:0 of the basic group's first quadword: the record format (groups).
pub const RECORD_FORMAT_MASK: u64 = (1 << 48) - 1;
/// The record size sits in bits 63:48 of the basic group's first quadword.
pub const RECORD_SIZE_SHIFT: u32 = 48;
/// DATA_CFG bits 31:24: LBR entries minus one.
const LBR_COUNT_MASK: u64 = 0xFF;

/// LBR entries a record with these DATA_CFG bits carries (bits 31:24 plus one; 0 without the
/// LBR group).
pub fn lbr_entries(cfg: u64) -> usize {
    if cfg & PEBS_DATACFG_LBRS == 0 {
        return 0;
    }
    // The field is 8 bits wide, so the conversion cannot fail.
    usize::try_from((cfg >> PEBS_DATACFG_LBR_SHIFT) & LBR_COUNT_MASK).unwrap_or(0) + 1
}

/// Record size for these DATA_CFG bits: 32 + 32 (meminfo) + 144 (GPRs) + 256 (XMMs) + 24 * n.
pub fn adaptive_record_size(cfg: u64) -> usize {
    let mut size = BASIC_GROUP_SIZE;
    if cfg & PEBS_DATACFG_MEMINFO != 0 {
        size += MEMINFO_GROUP_SIZE;
    }
    if cfg & PEBS_DATACFG_GPRS != 0 {
        size += GPR_GROUP_SIZE;
    }
    if cfg & PEBS_DATACFG_XMMS != 0 {
        size += XMM_GROUP_SIZE;
    }
    size + lbr_entries(cfg) * LBR_ENTRY_SIZE
}

/// Adaptive GPR-group order (differs from the legacy order): flags, ip, ax, cx, dx, bx, sp, bp,
/// si, di, r8-r15.
pub(crate) fn adaptive_gprs_to_array(g: &Gprs) -> [u64; 18] {
    [
        g.rflags, g.rip, g.rax, g.rcx, g.rdx, g.rbx, g.rsp, g.rbp, g.rsi, g.rdi, g.r8, g.r9, g.r10,
        g.r11, g.r12, g.r13, g.r14, g.r15,
    ]
}

/// Inverse of [`adaptive_gprs_to_array`].
pub(crate) fn adaptive_gprs_from_array(a: &[u64; 18]) -> Gprs {
    Gprs {
        rflags: a[0],
        rip: a[1],
        rax: a[2],
        rcx: a[3],
        rdx: a[4],
        rbx: a[5],
        rsp: a[6],
        rbp: a[7],
        rsi: a[8],
        rdi: a[9],
        r8: a[10],
        r9: a[11],
        r10: a[12],
        r11: a[13],
        r12: a[14],
        r13: a[15],
        r14: a[16],
        r15: a[17],
    }
}

/// Encodes an adaptive (format 4 or 5) record. The groups written are those of
/// `rec.record_format`; a group whose data the record lacks is written as zeros, LBR entries
/// beyond `rec.lbr` are zero, so the size always matches the format field.
pub fn encode_adaptive(rec: &PebsRecord) -> Vec<u8> {
    let cfg = rec.record_format.unwrap_or(0) & RECORD_FORMAT_MASK;
    let size = adaptive_record_size(cfg);
    let mut out = Vec::with_capacity(size);
    // `size` is at most 32+32+144+256+24*256 = 6608, so it fits the 16-bit field.
    put(&mut out, cfg | ((size as u64) << RECORD_SIZE_SHIFT));
    put(&mut out, rec.eventing_ip.unwrap_or(0));
    put(&mut out, rec.applicable.unwrap_or(0));
    put(&mut out, rec.tsc.unwrap_or(0));
    if cfg & PEBS_DATACFG_MEMINFO != 0 {
        put(&mut out, rec.data_addr.unwrap_or(0));
        put(&mut out, rec.data_source.unwrap_or(0));
        put(&mut out, rec.latency.unwrap_or(0));
        put(&mut out, rec.tsx_tuning.unwrap_or(0));
    }
    if cfg & PEBS_DATACFG_GPRS != 0 {
        for v in adaptive_gprs_to_array(&rec.gprs.unwrap_or_default()) {
            put(&mut out, v);
        }
    }
    if cfg & PEBS_DATACFG_XMMS != 0 {
        for x in rec.xmm.unwrap_or([0; 16]) {
            out.extend_from_slice(&x.to_le_bytes());
        }
    }
    let none: &[LbrEntry] = &[];
    let lbr = rec.lbr.as_deref().unwrap_or(none);
    for i in 0..lbr_entries(cfg) {
        let e = lbr.get(i).copied().unwrap_or_default();
        put(&mut out, e.from);
        put(&mut out, e.to);
        put(&mut out, e.info);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(adaptive_record_size(0), 32);
        assert_eq!(adaptive_record_size(PEBS_DATACFG_MEMINFO), 64);
        assert_eq!(adaptive_record_size(PEBS_DATACFG_GPRS), 176);
        assert_eq!(adaptive_record_size(PEBS_DATACFG_XMMS), 288);
        assert_eq!(adaptive_record_size(PEBS_DATACFG_LBRS), 32 + 24);
        let all = 0xF | (31 << PEBS_DATACFG_LBR_SHIFT);
        assert_eq!(adaptive_record_size(all), 32 + 32 + 144 + 256 + 24 * 32);
        // The LBR count is ignored without the LBR group.
        assert_eq!(adaptive_record_size(7 << PEBS_DATACFG_LBR_SHIFT), 32);
    }

    #[test]
    fn size_field_in_bits_63_48() {
        let mut r = PebsRecord::empty(crate::model::PebsFormat::Fmt4);
        r.record_format = Some(PEBS_DATACFG_GPRS);
        let b = encode_adaptive(&r);
        assert_eq!(b.len(), 176);
        assert_eq!(
            u64::from_le_bytes(b[0..8].try_into().unwrap()),
            (176 << 48) | 2
        );
    }
}
