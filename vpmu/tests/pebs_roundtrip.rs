//! Encode -> decode round trips for every PEBS format, exact record sizes, and field offsets
//! checked against Linux's structs (ds.c / perf_event.h).

mod pebs_common;

use pebs_common::*;
use vpmu::model::PebsFormat;
use vpmu::msr::{
    PEBS_DATACFG_GPRS, PEBS_DATACFG_LBR_SHIFT, PEBS_DATACFG_LBRS, PEBS_DATACFG_MEMINFO,
    PEBS_DATACFG_XMMS,
};
use vpmu::paging::{CR0_PG, CR4_PAE, EFER_LMA};
use vpmu::pebs::{
    AssistRequest, PebsRecord, adaptive_record_size, capture_record, decode_buffer, decode_record,
    encode,
};
use vpmu::state::{EventInfo, Gprs, GuestState, LbrEntry, PagingRegs};

fn random_state(rng: &mut Rng) -> GuestState {
    let mut n = || rng.next();
    let gprs = Gprs {
        rax: n(),
        rbx: n(),
        rcx: n(),
        rdx: n(),
        rsi: n(),
        rdi: n(),
        rbp: n(),
        rsp: n(),
        r8: n(),
        r9: n(),
        r10: n(),
        r11: n(),
        r12: n(),
        r13: n(),
        r14: n(),
        r15: n(),
        rip: n(),
        rflags: n(),
    };
    let mut xmm = [0u128; 16];
    for x in &mut xmm {
        *x = u128::from(n()) | (u128::from(n()) << 64);
    }
    GuestState {
        gprs,
        paging: PagingRegs {
            cr0: CR0_PG,
            cr3: 0,
            cr4: CR4_PAE,
            efer: EFER_LMA,
        },
        cpl: 0,
        tsc: n(),
        xmm,
    }
}

fn random_lbr(rng: &mut Rng, n: usize) -> Vec<LbrEntry> {
    (0..n)
        .map(|_| LbrEntry {
            from: rng.next(),
            to: rng.next(),
            info: rng.next(),
        })
        .collect()
}

fn captured(format: PebsFormat, data_cfg: u64, rng: &mut Rng, lbr_len: usize) -> PebsRecord {
    let m = model(format);
    let state = random_state(rng);
    let event = EventInfo {
        eventing_ip: rng.next(),
        data_addr: Some(rng.next()),
        data_source: rng.next(),
        latency: 500,
    };
    let lbr = random_lbr(rng, lbr_len);
    let req = AssistRequest {
        model: &m,
        ds_area: 0,
        data_cfg,
        applicable: 0b101,
        global_status: 1 << 1,
        ld_lat_threshold: 3,
        state: &state,
        event: &event,
        lbr: &lbr,
    };
    capture_record(&req)
}

fn round_trip(rec: &PebsRecord) -> Vec<u8> {
    let bytes = encode(rec).unwrap();
    let (back, size) = decode_record(rec.format, &bytes, 0).unwrap();
    assert_eq!(size, bytes.len());
    assert_eq!(&back, rec, "round trip of {:?}", rec.format);
    bytes
}

#[test]
fn legacy_sizes_and_round_trip() {
    let mut rng = Rng(0x1234_5678_9ABC_DEF1);
    for (format, size) in [
        (PebsFormat::Netburst, 0x90),
        (PebsFormat::Fmt0, 0x90),
        (PebsFormat::Fmt1, 0xB0),
        (PebsFormat::Fmt2, 0xC0),
        (PebsFormat::Fmt3, 0xC8),
    ] {
        for _ in 0..20 {
            let rec = captured(format, 0, &mut rng, 0);
            let bytes = round_trip(&rec);
            assert_eq!(bytes.len(), size, "{format:?}");
        }
    }
}

#[test]
fn adaptive_all_group_combinations() {
    let mut rng = Rng(0xFEED_FACE_0000_0001);
    for format in [PebsFormat::Fmt4, PebsFormat::Fmt5] {
        for groups in 0..16u64 {
            let lbr_counts: Vec<u64> = if groups & PEBS_DATACFG_LBRS != 0 {
                (1..=32).collect()
            } else {
                vec![1]
            };
            for n in lbr_counts {
                let cfg = groups | ((n - 1) << PEBS_DATACFG_LBR_SHIFT);
                // Fewer LBRs available than asked for: zero-filled entries.
                let avail = usize::try_from(n)
                    .unwrap()
                    .saturating_sub(usize::from(n % 3 == 0));
                let rec = captured(format, cfg, &mut rng, avail);
                let bytes = round_trip(&rec);
                let mut expect = 32;
                if groups & PEBS_DATACFG_MEMINFO != 0 {
                    expect += 32;
                }
                if groups & PEBS_DATACFG_GPRS != 0 {
                    expect += 144;
                }
                if groups & PEBS_DATACFG_XMMS != 0 {
                    expect += 256;
                }
                if groups & PEBS_DATACFG_LBRS != 0 {
                    expect += 24 * usize::try_from(n).unwrap();
                }
                assert_eq!(bytes.len(), expect, "cfg {cfg:#x}");
                assert_eq!(adaptive_record_size(cfg), expect);
                let head = u64::from_le_bytes(bytes[..8].try_into().unwrap());
                assert_eq!(head >> 48, expect as u64);
                assert_eq!(head & 0xFFFF_FFFF_FFFF, cfg);
                assert_eq!(
                    rec.lbr.as_ref().map(Vec::len),
                    (groups & 8 != 0).then_some(usize::try_from(n).unwrap())
                );
            }
        }
    }
}

#[test]
fn mixed_size_adaptive_buffer_decodes_by_size_field() {
    let mut rng = Rng(99);
    let cfgs = [
        0,
        PEBS_DATACFG_GPRS,
        0xF | (4 << PEBS_DATACFG_LBR_SHIFT),
        PEBS_DATACFG_MEMINFO,
    ];
    let recs: Vec<PebsRecord> = cfgs
        .iter()
        .map(|&c| captured(PebsFormat::Fmt4, c, &mut rng, 8))
        .collect();
    let buf: Vec<u8> = recs.iter().flat_map(|r| encode(r).unwrap()).collect();
    assert_eq!(decode_buffer(PebsFormat::Fmt4, &buf).unwrap(), recs);
    // A truncated tail is an error, not a panic.
    assert!(decode_buffer(PebsFormat::Fmt4, &buf[..buf.len() - 1]).is_err());
}

fn lo(x: u128) -> u64 {
    u64::try_from(x & u128::from(u64::MAX)).unwrap()
}

fn q(bytes: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(bytes[off..off + 8].try_into().unwrap())
}

#[test]
fn legacy_field_offsets_match_linux_structs() {
    let mut rng = Rng(7);
    let rec = captured(PebsFormat::Fmt3, 0, &mut rng, 0);
    let g = rec.gprs.unwrap();
    let b = encode(&rec).unwrap();
    // pebs_record_core: flags, ip, ax, bx, cx, dx, si, di, bp, sp, r8..r15.
    let expect = [
        g.rflags, g.rip, g.rax, g.rbx, g.rcx, g.rdx, g.rsi, g.rdi, g.rbp, g.rsp, g.r8, g.r9, g.r10,
        g.r11, g.r12, g.r13, g.r14, g.r15,
    ];
    for (i, v) in expect.iter().enumerate() {
        assert_eq!(q(&b, i * 8), *v, "quadword {i}");
    }
    // pebs_record_skl: status 0x90, dla 0x98, dse 0xA0, lat 0xA8, real_ip 0xB0, tsx 0xB8, tsc 0xC0.
    assert_eq!(q(&b, 0x90), 0b101);
    assert_eq!(q(&b, 0x98), rec.data_addr.unwrap());
    assert_eq!(q(&b, 0xA0), rec.data_source.unwrap());
    assert_eq!(q(&b, 0xA8), 500);
    assert_eq!(q(&b, 0xB0), rec.eventing_ip.unwrap());
    assert_eq!(q(&b, 0xC0), rec.tsc.unwrap());
    // Format 1/2: GLOBAL_STATUS before the assist, with the applicable counters.
    let rec = captured(PebsFormat::Fmt2, 0, &mut rng, 0);
    let b = encode(&rec).unwrap();
    assert_eq!(q(&b, 0x90), 0b111);
    assert_eq!(q(&b, 0xB0), rec.eventing_ip.unwrap());
}

#[test]
fn adaptive_field_offsets_match_linux_structs() {
    let mut rng = Rng(8);
    let cfg = 0xF | (1 << PEBS_DATACFG_LBR_SHIFT);
    let rec = captured(PebsFormat::Fmt4, cfg, &mut rng, 2);
    let g = rec.gprs.unwrap();
    let b = encode(&rec).unwrap();
    // pebs_basic: format_size, ip, applicable_counters, tsc.
    assert_eq!(q(&b, 8), rec.eventing_ip.unwrap());
    assert_eq!(q(&b, 16), 0b101);
    assert_eq!(q(&b, 24), rec.tsc.unwrap());
    // pebs_meminfo at 32: address, aux, latency, tsx_tuning.
    assert_eq!(q(&b, 32), rec.data_addr.unwrap());
    assert_eq!(q(&b, 40), rec.data_source.unwrap());
    assert_eq!(q(&b, 48), 500);
    // pebs_gprs at 64: flags, ip, ax, cx, dx, bx, sp, bp, si, di, r8..r15.
    let expect = [
        g.rflags, g.rip, g.rax, g.rcx, g.rdx, g.rbx, g.rsp, g.rbp, g.rsi, g.rdi, g.r8, g.r9, g.r10,
        g.r11, g.r12, g.r13, g.r14, g.r15,
    ];
    for (i, v) in expect.iter().enumerate() {
        assert_eq!(q(&b, 64 + i * 8), *v, "gpr quadword {i}");
    }
    // pebs_xmm at 208: xmm0 low, xmm0 high, ...
    let x = rec.xmm.unwrap();
    assert_eq!(q(&b, 208), lo(x[0]));
    assert_eq!(q(&b, 216), lo(x[0] >> 64));
    assert_eq!(q(&b, 208 + 15 * 16 + 8), lo(x[15] >> 64));
    // lbr_entry at 464: from, to, info; 2 entries.
    let l = rec.lbr.as_ref().unwrap();
    assert_eq!(
        (q(&b, 464), q(&b, 472), q(&b, 480)),
        (l[0].from, l[0].to, l[0].info)
    );
    assert_eq!(q(&b, 488), l[1].from);
    assert_eq!(b.len(), 464 + 48);
}

#[test]
fn display_is_readable() {
    let mut rng = Rng(5);
    for f in ALL_FORMATS {
        let rec = captured(f, 0xF, &mut rng, 1);
        let s = rec.to_string();
        assert!(s.starts_with("PEBS "), "{s}");
        assert!(s.contains("rflags="), "{f:?}: {s}");
    }
}
