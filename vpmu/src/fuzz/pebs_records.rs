//! Fuzz target `pebs_records`: encode then decode every PEBS format and adaptive configuration.
//!
//! Input: records to build (format selector, then every field the format carries, adaptive
//! "Record Format" bits 47:0 taken raw so unknown group bits are covered too), then a tail of
//! raw bytes. Invariants: `decode_record(encode(r)) == r` with the size equal to the encoded
//! length (the format's fixed size, or the adaptive size of its groups); a buffer of several
//! records decodes to the same list; a record captured by the assist's own builder
//! ([`capture_record`]) round-trips as well; decoding the raw tail as any format never panics.

use super::Bytes;
use crate::model::{CpuModel, PebsFormat};
use crate::pebs::adaptive::{RECORD_FORMAT_MASK, adaptive_record_size, lbr_entries};
use crate::pebs::{
    AssistRequest, PebsRecord, capture_record, decode_buffer, decode_record, encode,
    legacy_record_size,
};
use crate::state::{EventInfo, Gprs, GuestState, LbrEntry, PagingRegs};

const FORMATS: [PebsFormat; 7] = [
    PebsFormat::Netburst,
    PebsFormat::Fmt0,
    PebsFormat::Fmt1,
    PebsFormat::Fmt2,
    PebsFormat::Fmt3,
    PebsFormat::Fmt4,
    PebsFormat::Fmt5,
];

fn gprs(b: &mut Bytes<'_>) -> Gprs {
    let mut v = || b.value();
    Gprs {
        rax: v(),
        rbx: v(),
        rcx: v(),
        rdx: v(),
        rsi: v(),
        rdi: v(),
        rbp: v(),
        rsp: v(),
        r8: v(),
        r9: v(),
        r10: v(),
        r11: v(),
        r12: v(),
        r13: v(),
        r14: v(),
        r15: v(),
        rip: v(),
        rflags: v(),
    }
}

fn xmm(b: &mut Bytes<'_>) -> [u128; 16] {
    let mut x = [0u128; 16];
    for r in &mut x {
        *r = u128::from(b.value()) | u128::from(b.value()) << 64;
    }
    x
}

/// A record of `format` with every field the format (and, adaptive, its groups) carries.
fn record(format: PebsFormat, b: &mut Bytes<'_>) -> PebsRecord {
    use crate::msr::{PEBS_DATACFG_GPRS, PEBS_DATACFG_MEMINFO, PEBS_DATACFG_XMMS};
    let mut r = PebsRecord::empty(format);
    match format {
        PebsFormat::None => {}
        PebsFormat::Netburst | PebsFormat::Fmt0 => r.gprs = Some(gprs(b)),
        PebsFormat::Fmt1 | PebsFormat::Fmt2 | PebsFormat::Fmt3 => {
            r.gprs = Some(gprs(b));
            if format == PebsFormat::Fmt3 {
                r.applicable = Some(b.value());
                r.tsc = Some(b.value());
            } else {
                r.global_status = Some(b.value());
            }
            r.data_addr = Some(b.value());
            r.data_source = Some(b.value());
            r.latency = Some(b.value());
            if format != PebsFormat::Fmt1 {
                r.eventing_ip = Some(b.value());
                r.tsx_tuning = Some(b.value());
            }
        }
        PebsFormat::Fmt4 | PebsFormat::Fmt5 => {
            let cfg = b.value() & RECORD_FORMAT_MASK;
            r.record_format = Some(cfg);
            r.eventing_ip = Some(b.value());
            r.applicable = Some(b.value());
            r.tsc = Some(b.value());
            if cfg & PEBS_DATACFG_MEMINFO != 0 {
                r.data_addr = Some(b.value());
                r.data_source = Some(b.value());
                r.latency = Some(b.value());
                r.tsx_tuning = Some(b.value());
            }
            if cfg & PEBS_DATACFG_GPRS != 0 {
                r.gprs = Some(gprs(b));
            }
            if cfg & PEBS_DATACFG_XMMS != 0 {
                r.xmm = Some(xmm(b));
            }
            let n = lbr_entries(cfg);
            if n > 0 {
                r.lbr = Some(
                    (0..n)
                        .map(|_| LbrEntry {
                            from: b.value(),
                            to: b.value(),
                            info: b.value(),
                        })
                        .collect(),
                );
            }
        }
    }
    r
}

fn expected_size(r: &PebsRecord) -> Option<usize> {
    if r.format.is_adaptive() {
        Some(adaptive_record_size(r.record_format.unwrap_or(0)))
    } else {
        legacy_record_size(r.format)
    }
}

fn round_trip(r: &PebsRecord) -> Vec<u8> {
    let bytes = encode(r).unwrap_or_default();
    assert_eq!(Some(bytes.len()), expected_size(r), "size of {r:?}");
    match decode_record(r.format, &bytes, 0) {
        Ok((back, size)) => {
            assert_eq!(size, bytes.len(), "decoded size of {r:?}");
            assert_eq!(&back, r, "round trip");
        }
        Err(e) => panic!("encoded {:?} record does not decode: {e}", r.format),
    }
    bytes
}

/// The model whose PEBS format is `format`.
fn model_of(format: PebsFormat) -> Option<CpuModel> {
    let presets = super::presets();
    presets
        .iter()
        .find(|m| m.pebs_format == format)
        .or_else(|| presets.last())
        .map(|m| CpuModel {
            pebs_format: format,
            ..m.clone()
        })
}

/// Runs the `pebs_records` target on `data`; panics if a round trip is not exact.
pub fn pebs_records(data: &[u8]) {
    let mut b = Bytes::new(data);
    let count = 1 + b.u8() % 4;
    let fmt = FORMATS[usize::from(b.u8()) % FORMATS.len()];
    // Records of one buffer share a format.
    let mut buffer = Vec::new();
    let mut records = Vec::new();
    for _ in 0..count {
        let r = record(fmt, &mut b);
        buffer.extend(round_trip(&r));
        records.push(r);
    }
    match decode_buffer(fmt, &buffer) {
        Ok(back) => assert_eq!(back, records, "buffer of {count} {fmt:?} records"),
        Err(e) => panic!("buffer of {fmt:?} records does not decode: {e}"),
    }

    // A record as the assist captures it, for the model of this format.
    if let Some(model) = model_of(fmt) {
        let state = GuestState {
            gprs: gprs(&mut b),
            paging: PagingRegs {
                cr0: b.value(),
                cr3: 0,
                cr4: b.value(),
                efer: b.value(),
            },
            cpl: b.u8() % 4,
            tsc: b.value(),
            xmm: xmm(&mut b),
        };
        let event = EventInfo {
            eventing_ip: b.value(),
            data_addr: (b.u8() & 1 == 1).then(|| b.value()),
            data_source: b.value(),
            latency: b.value(),
        };
        let lbr: Vec<LbrEntry> = (0..b.u8() % 40)
            .map(|_| LbrEntry {
                from: b.value(),
                to: b.value(),
                info: b.value(),
            })
            .collect();
        let req = AssistRequest {
            model: &model,
            ds_area: 0,
            data_cfg: b.value(),
            applicable: b.value(),
            global_status: b.value(),
            ld_lat_threshold: b.value(),
            state: &state,
            event: &event,
            lbr: &lbr,
        };
        round_trip(&capture_record(&req));
    }

    // Whatever is left, as a buffer of every format: errors are fine, panics are not.
    let rest = &data[data.len().min(b_pos(&b))..];
    for f in FORMATS {
        let _ = decode_buffer(f, rest);
    }
}

fn b_pos(b: &Bytes<'_>) -> usize {
    b.position()
}
