//! Fixed-size PEBS record layouts: NetBurst (64-bit), formats 0-3. One encoder per format, each
//! with its SDM source. Decoding of the same layouts is in `decode.rs`, sharing the field lists
//! here so the two cannot drift apart.

use crate::model::PebsFormat;
use crate::state::Gprs;

use super::record::PebsRecord;

/// NetBurst 64-bit PEBS record (SDM Figure 17-10; 18.15.7): RFLAGS, RIP, RAX-R15.
pub const NETBURST_RECORD_SIZE: usize = 0x90;
/// Format 0, Core (SDM 18.6.2.4 / Figure 17-10; Linux `pebs_record_core`).
pub const FMT0_RECORD_SIZE: usize = 0x90;
/// Format 1, Nehalem (SDM Table 18-23; Linux `pebs_record_nhm`).
pub const FMT1_RECORD_SIZE: usize = 0xB0;
/// Format 2, Haswell (SDM 18.11.2, Table 18-44 "PEBS Record Format for 4th Generation Intel Core
/// Processor Family"; Linux `pebs_record_hsw`).
pub const FMT2_RECORD_SIZE: usize = 0xC0;
/// Format 3, Skylake (SDM 18.13.1.1, Table 18-55 "PEBS Record Format for 6th Generation Intel
/// Core Processor Family"; Linux `pebs_record_skl`).
pub const FMT3_RECORD_SIZE: usize = 0xC8;

/// Size of a fixed-size record, `None` for adaptive formats (size depends on the groups) and
/// for no PEBS.
pub fn legacy_record_size(format: PebsFormat) -> Option<usize> {
    match format {
        PebsFormat::Netburst => Some(NETBURST_RECORD_SIZE),
        PebsFormat::Fmt0 => Some(FMT0_RECORD_SIZE),
        PebsFormat::Fmt1 => Some(FMT1_RECORD_SIZE),
        PebsFormat::Fmt2 => Some(FMT2_RECORD_SIZE),
        PebsFormat::Fmt3 => Some(FMT3_RECORD_SIZE),
        PebsFormat::None | PebsFormat::Fmt4 | PebsFormat::Fmt5 => None,
    }
}

/// Legacy register order (offsets 0x00-0x88): flags, ip, ax, bx, cx, dx, si, di, bp, sp,
/// r8-r15.
pub(crate) fn legacy_gprs_to_array(g: &Gprs) -> [u64; 18] {
    [
        g.rflags, g.rip, g.rax, g.rbx, g.rcx, g.rdx, g.rsi, g.rdi, g.rbp, g.rsp, g.r8, g.r9, g.r10,
        g.r11, g.r12, g.r13, g.r14, g.r15,
    ]
}

/// Inverse of [`legacy_gprs_to_array`].
pub(crate) fn legacy_gprs_from_array(a: &[u64; 18]) -> Gprs {
    Gprs {
        rflags: a[0],
        rip: a[1],
        rax: a[2],
        rbx: a[3],
        rcx: a[4],
        rdx: a[5],
        rsi: a[6],
        rdi: a[7],
        rbp: a[8],
        rsp: a[9],
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

pub(crate) fn put(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_gprs(out: &mut Vec<u8>, rec: &PebsRecord) {
    for v in legacy_gprs_to_array(&rec.gprs.unwrap_or_default()) {
        put(out, v);
    }
}

/// Offsets 0x90-0xAF of formats 1-3: status or applicable counters, data linear address, data
/// source encoding, latency.
fn put_nhm_tail(out: &mut Vec<u8>, status: Option<u64>, rec: &PebsRecord) {
    put(out, status.unwrap_or(0));
    put(out, rec.data_addr.unwrap_or(0));
    put(out, rec.data_source.unwrap_or(0));
    put(out, rec.latency.unwrap_or(0));
}

/// NetBurst: the 64-bit PEBS record of SDM Figure 17-10 (DTES64), identical in layout to
/// format 0: RFLAGS, RIP, RAX, RBX, RCX, RDX, RSI, RDI, RBP, RSP, R8-R15.
pub fn encode_netburst(rec: &PebsRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(NETBURST_RECORD_SIZE);
    put_gprs(&mut out, rec);
    out
}

/// Format 0 (Core): SDM Figure 17-10, 0x90 bytes of RFLAGS, RIP, RAX-R15.
pub fn encode_fmt0(rec: &PebsRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(FMT0_RECORD_SIZE);
    put_gprs(&mut out, rec);
    out
}

/// Format 1 (Nehalem): SDM Table 18-23; 0x90 IA32_PERF_GLOBAL_STATUS, 0x98 data linear address,
/// 0xA0 data source encoding, 0xA8 latency.
pub fn encode_fmt1(rec: &PebsRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(FMT1_RECORD_SIZE);
    put_gprs(&mut out, rec);
    put_nhm_tail(&mut out, rec.global_status, rec);
    out
}

/// Format 2 (Haswell): format 1 plus 0xB0 eventing IP, 0xB8 TX abort information.
pub fn encode_fmt2(rec: &PebsRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(FMT2_RECORD_SIZE);
    put_gprs(&mut out, rec);
    put_nhm_tail(&mut out, rec.global_status, rec);
    put(&mut out, rec.eventing_ip.unwrap_or(0));
    put(&mut out, rec.tsx_tuning.unwrap_or(0));
    out
}

/// Format 3 (Skylake): format 2 with 0x90 holding the applicable counters instead of the global
/// status, plus 0xC0 TSC.
pub fn encode_fmt3(rec: &PebsRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(FMT3_RECORD_SIZE);
    put_gprs(&mut out, rec);
    put_nhm_tail(&mut out, rec.applicable, rec);
    put(&mut out, rec.eventing_ip.unwrap_or(0));
    put(&mut out, rec.tsx_tuning.unwrap_or(0));
    put(&mut out, rec.tsc.unwrap_or(0));
    out
}
