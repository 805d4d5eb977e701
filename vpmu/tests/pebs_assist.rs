//! The PEBS assist against a DS area and a PEBS buffer mapped through 4-level page tables.

mod pebs_common;

use pebs_common::*;
use vpmu::ds::{self, DS_PEBS_COUNTER_RESET};
use vpmu::mem::{GuestMemory, VecMemory};
use vpmu::model::{CpuModel, PebsFormat};
use vpmu::msr::{PEBS_DATACFG_GPRS, PEBS_DATACFG_LBR_SHIFT, PEBS_DATACFG_LBRS};
use vpmu::paging::{LinearMemory, PageWalker};
use vpmu::pebs::{
    AssistOutcome, AssistRequest, DecodeError, DropCause, PebsRecord, assist, decode_buffer,
    read_pebs_buffer,
};
use vpmu::state::{EventInfo, Gprs, GuestState, LbrEntry};

const RAM: usize = 0x40_0000;
const DS_LA: u64 = 0xFFFF_FE00_0000_0000;
const DS_PA: u64 = 0x8000;
const BUF_LA: u64 = 0xFFFF_FE00_0001_0000;
/// Buffer pages, deliberately non-contiguous and out of order.
const BUF_PA: [u64; 4] = [0x20_000, 0x12_000, 0x30_000, 0x14_000];
const BUF_LEN: u64 = 4 * SIZE_4K;

struct Env {
    g: Guest,
    state: GuestState,
}

impl Env {
    fn new() -> Self {
        let mut g = Guest::new(RAM, 0x10_0000);
        let root = g.alloc();
        g.map_ia32e(root, 4, DS_LA, DS_PA, SIZE_4K, PW);
        for (i, pa) in BUF_PA.iter().enumerate() {
            g.map_ia32e(root, 4, BUF_LA + i as u64 * SIZE_4K, *pa, SIZE_4K, PW);
        }
        let mut state = GuestState {
            paging: regs_ia32e(root, false),
            tsc: 123_456,
            ..Default::default()
        };
        state.gprs = Gprs {
            rip: 0xFFFF_FFFF_8100_0010,
            rax: 0xAA,
            rflags: 0x246,
            ..Gprs::default()
        };
        let mut e = Self { g, state };
        e.set_ds(BUF_LA, BUF_LA, BUF_LA + BUF_LEN, BUF_LA + BUF_LEN);
        e
    }

    fn set_ds(&mut self, base: u64, index: u64, max: u64, threshold: u64) {
        for (off, v) in [(0x20, base), (0x28, index), (0x30, max), (0x38, threshold)] {
            self.g.mem.write_u64(DS_PA + off, v).unwrap();
        }
    }

    fn set_reset(&mut self, slot: u64, v: u64) {
        self.g
            .mem
            .write_u64(DS_PA + DS_PEBS_COUNTER_RESET + 8 * slot, v)
            .unwrap();
    }

    fn pebs_index(&self) -> u64 {
        self.g.mem.read_u64(DS_PA + 0x28).unwrap()
    }

    fn run(&mut self, m: &CpuModel, ds_area: u64, applicable: u64, data_cfg: u64) -> AssistOutcome {
        let event = EventInfo {
            eventing_ip: 0xFFFF_FFFF_8100_000C,
            data_addr: Some(0x7000),
            data_source: 3,
            latency: 40,
        };
        let lbr = [LbrEntry {
            from: 1,
            to: 2,
            info: 3,
        }; 4];
        let req = AssistRequest {
            model: m,
            ds_area,
            data_cfg,
            applicable,
            global_status: 1 << 7,
            ld_lat_threshold: 10,
            state: &self.state,
            event: &event,
            lbr: &lbr,
        };
        assist(&mut self.g.mem, &req)
    }

    /// The records between base and the current index, read as a guest drain would.
    fn records(&mut self, format: PebsFormat) -> Vec<PebsRecord> {
        let w = PageWalker::new(self.state.paging);
        read_pebs_buffer(&mut self.g.mem, w, DS_LA, format).unwrap()
    }
}

#[test]
fn writes_at_index_and_advances_for_every_format() {
    for f in ALL_FORMATS {
        let mut e = Env::new();
        let m = model(f);
        let bit = if f == PebsFormat::Netburst { 0 } else { 1 };
        let out = e.run(&m, DS_LA, 1 << bit, PEBS_DATACFG_GPRS);
        assert!(out.written && out.dropped.is_none(), "{f:?}: {out:?}");
        let recs = e.records(f);
        assert_eq!(recs.len(), 1);
        let r = &recs[0];
        assert_eq!(r.format, f);
        // Trap-like: the IP after the instruction; registers after it.
        assert_eq!(r.ip(), Some(0xFFFF_FFFF_8100_0010), "{f:?}");
        assert_eq!(r.gprs.unwrap().rax, 0xAA);
        if matches!(
            f,
            PebsFormat::Fmt2 | PebsFormat::Fmt3 | PebsFormat::Fmt4 | PebsFormat::Fmt5
        ) {
            assert_eq!(r.eventing_ip, Some(0xFFFF_FFFF_8100_000C));
        }
        if matches!(f, PebsFormat::Fmt3 | PebsFormat::Fmt4 | PebsFormat::Fmt5) {
            assert_eq!(r.tsc, Some(123_456));
            assert_eq!(r.applicable, Some(1 << bit));
        }
        if matches!(f, PebsFormat::Fmt1 | PebsFormat::Fmt2) {
            assert_eq!(r.global_status, Some((1 << 7) | (1 << bit)));
            assert_eq!(
                (r.data_addr, r.data_source, r.latency),
                (Some(0x7000), Some(3), Some(40))
            );
        }
        // A second assist appends.
        let first = e.pebs_index();
        assert!(e.run(&m, DS_LA, 1 << bit, PEBS_DATACFG_GPRS).written);
        assert_eq!(e.pebs_index() - first, first - BUF_LA);
        assert_eq!(e.records(f).len(), 2);
    }
}

#[test]
fn fault_like_ip_when_not_trap() {
    let mut e = Env::new();
    let mut m = model(PebsFormat::Fmt1);
    m.pebs_trap = false;
    assert!(e.run(&m, DS_LA, 1, 0).written);
    assert_eq!(
        e.records(PebsFormat::Fmt1)[0].ip(),
        Some(0xFFFF_FFFF_8100_000C)
    );
}

#[test]
fn latency_only_above_threshold() {
    let mut e = Env::new();
    let m = model(PebsFormat::Fmt3);
    let event = EventInfo {
        eventing_ip: 1,
        data_addr: Some(0x7000),
        data_source: 3,
        latency: 10,
    };
    let req = AssistRequest {
        model: &m,
        ds_area: DS_LA,
        data_cfg: 0,
        applicable: 1,
        global_status: 0,
        ld_lat_threshold: 10,
        state: &e.state,
        event: &event,
        lbr: &[],
    };
    let state = e.state;
    let req = AssistRequest {
        state: &state,
        ..req
    };
    assert!(assist(&mut e.g.mem, &req).written);
    assert_eq!(e.records(PebsFormat::Fmt3)[0].latency, Some(0));
}

#[test]
fn reloads_from_the_right_slots() {
    for (f, fixed_slot) in [
        (PebsFormat::Fmt3, 9u64),
        (PebsFormat::Fmt4, 9),
        (PebsFormat::Fmt5, 33),
    ] {
        let mut e = Env::new();
        e.set_reset(2, 0xFFFF_FFF0_0000);
        e.set_reset(9, 0x9999);
        e.set_reset(33, 0x3333);
        e.set_reset(fixed_slot, 0xF1F1);
        let m = model(f);
        let out = e.run(&m, DS_LA, (1 << 2) | (1 << 33), 0);
        assert!(out.written);
        assert_eq!(
            out.reloads,
            vec![(2, 0xFFFF_FFF0_0000), (33, 0xF1F1)],
            "{f:?}"
        );
    }
    // NetBurst IQ_COUNTER4 reloads from slot 0.
    let mut e = Env::new();
    e.set_reset(0, 0x77);
    let out = e.run(&model(PebsFormat::Netburst), DS_LA, 1, 0);
    assert_eq!(out.reloads, vec![(0, 0x77)]);
}

#[test]
fn threshold_one_record_and_many_records() {
    let m = model(PebsFormat::Fmt3);
    let mut e = Env::new();
    e.set_ds(BUF_LA, BUF_LA, BUF_LA + BUF_LEN, BUF_LA + 0xC8);
    let out = e.run(&m, DS_LA, 1, 0);
    assert!(out.written && out.threshold_reached);

    let mut e = Env::new();
    e.set_ds(BUF_LA, BUF_LA, BUF_LA + BUF_LEN, BUF_LA + 3 * 0xC8);
    for i in 1..=5 {
        let out = e.run(&m, DS_LA, 1, 0);
        assert!(out.written);
        assert_eq!(out.threshold_reached, i >= 3, "record {i}");
    }
}

#[test]
fn buffer_full_writes_nothing_and_signals_nothing() {
    let m = model(PebsFormat::Fmt3);
    let mut e = Env::new();
    e.set_reset(0, 0x42);
    // Room for one record only (max - index = 0xC8 + 0xC7).
    e.set_ds(BUF_LA, BUF_LA, BUF_LA + 0xC8 + 0xC7, BUF_LA);
    assert!(e.run(&m, DS_LA, 1, 0).written);
    let before = e.g.mem.clone();
    let out = e.run(&m, DS_LA, 1, 0);
    assert_eq!(out.dropped, Some(DropCause::BufferFull));
    assert!(!out.written && !out.threshold_reached);
    assert_eq!(out.reloads, vec![(0, 0x42)], "the counter still reloads");
    assert!(e.g.mem == before);
    // Index exactly at the maximum.
    e.set_ds(BUF_LA, BUF_LA + 0x100, BUF_LA + 0x100, BUF_LA);
    let before = e.g.mem.clone();
    assert_eq!(e.run(&m, DS_LA, 1, 0).dropped, Some(DropCause::BufferFull));
    assert!(e.g.mem == before);
}

#[test]
fn multi_counter_record_names_them_all() {
    for f in [PebsFormat::Fmt3, PebsFormat::Fmt4] {
        let mut e = Env::new();
        let m = model(f);
        let app = 0b1011 | (1 << 32) | (1 << 34);
        let out = e.run(&m, DS_LA, app, 0);
        assert!(out.written);
        assert_eq!(out.reloads.len(), 5);
        let recs = e.records(f);
        assert_eq!(recs.len(), 1, "one record for all counters");
        assert_eq!(recs[0].applicable, Some(app));
    }
    // Bits naming no counter of the model are ignored; none left -> dropped.
    let mut e = Env::new();
    let m = model(PebsFormat::Fmt3);
    let out = e.run(&m, DS_LA, 1 << 62, 0);
    assert_eq!(out.dropped, Some(DropCause::NoApplicableCounter));
}

#[test]
fn adaptive_lbr_group_from_request() {
    let mut e = Env::new();
    let m = model(PebsFormat::Fmt5);
    let cfg = PEBS_DATACFG_LBRS | (5 << PEBS_DATACFG_LBR_SHIFT);
    assert!(e.run(&m, DS_LA, 1, cfg).written);
    let r = &e.records(PebsFormat::Fmt5)[0];
    let l = r.lbr.as_ref().unwrap();
    assert_eq!(l.len(), 6);
    assert_eq!(
        l[3],
        LbrEntry {
            from: 1,
            to: 2,
            info: 3
        }
    );
    assert_eq!(l[4], LbrEntry::default(), "only 4 LBRs available");
    assert_eq!(e.pebs_index() - BUF_LA, 32 + 6 * 24);
}

/// Bytes that differ between two memories.
fn diff(a: &VecMemory, b: &VecMemory) -> Vec<usize> {
    a.bytes
        .iter()
        .zip(&b.bytes)
        .enumerate()
        .filter(|(_, (x, y))| x != y)
        .map(|(i, _)| i)
        .collect()
}

#[test]
fn misaligned_index_and_page_crossing_record() {
    let m = model(PebsFormat::Fmt3);
    let mut e = Env::new();
    // Index 3 bytes past base and 0x40 before the end of the first page: the record crosses
    // into the second, physically unrelated page.
    let index = BUF_LA + SIZE_4K - 0x40 + 3;
    e.set_ds(BUF_LA, index, BUF_LA + BUF_LEN, BUF_LA + BUF_LEN);
    let before = e.g.mem.clone();
    let out = e.run(&m, DS_LA, 1, 0);
    assert!(out.written);
    let changed = diff(&before, &e.g.mem);
    let first = usize::try_from(BUF_PA[0]).unwrap();
    let second = usize::try_from(BUF_PA[1]).unwrap();
    let ds_index = usize::try_from(DS_PA + 0x28).unwrap();
    for &i in &changed {
        let ok = (first + 0xFC3..first + 0x1000).contains(&i)
            || (second..second + 0xC8 - 0x3D).contains(&i)
            || (ds_index..ds_index + 8).contains(&i);
        assert!(ok, "byte {i:#x} written outside the record and the index");
    }
    assert_eq!(e.pebs_index(), index + 0xC8);
    // The record reads back from the two pieces.
    let mut raw = vec![0u8; 0xC8];
    raw[..0x3D].copy_from_slice(&e.g.mem.bytes[first + 0xFC3..first + 0x1000]);
    raw[0x3D..].copy_from_slice(&e.g.mem.bytes[second..second + 0xC8 - 0x3D]);
    let recs = decode_buffer(PebsFormat::Fmt3, &raw).unwrap();
    assert_eq!(recs[0].ip(), Some(0xFFFF_FFFF_8100_0010));
}

fn expect_drop(e: &mut Env, m: &CpuModel, ds_area: u64, cause: DropCause) {
    let before = e.g.mem.clone();
    let out = e.run(m, ds_area, 1, 0);
    assert_eq!(out.dropped, Some(cause), "{out:?}");
    assert!(!out.written && !out.threshold_reached);
    assert!(e.g.mem == before, "{cause:?}: memory changed");
}

#[test]
fn hostile_ds_area_and_buffer() {
    let m = model(PebsFormat::Fmt3);
    let mut e = Env::new();
    expect_drop(
        &mut e,
        &m,
        0x0000_8000_0000_0000,
        DropCause::DsAreaNonCanonical,
    );
    expect_drop(&mut e, &m, DS_LA + 0x10_0000, DropCause::DsAreaNotPresent);
    expect_drop(&mut e, &m, u64::MAX - 0x10, DropCause::DsAreaNonCanonical);

    // DS area mapped to MMIO / beyond RAM.
    let root = e.state.paging.cr3;
    let mmio_la = 0xFFFF_FE00_0100_0000;
    e.g.map_ia32e(root, 4, mmio_la, 0xFEE0_0000, SIZE_4K, PW);
    expect_drop(&mut e, &m, mmio_la, DropCause::DsAreaNotRam);
    // DS area straddling into an unmapped page.
    expect_drop(
        &mut e,
        &m,
        DS_LA + SIZE_4K - 0x20,
        DropCause::DsAreaNotPresent,
    );
    // Reserved bit on the way to the DS area.
    let pte = e.g.entry_addr_ia32e(root, 4, DS_LA, 2);
    let v = e.g.mem.read_u64(pte).unwrap();
    e.g.mem.write_u64(pte, v | PS | (1 << 14)).unwrap();
    expect_drop(&mut e, &m, DS_LA, DropCause::DsAreaReservedBit);
    e.g.mem.write_u64(pte, v).unwrap();
    // DS area read-only: the index cannot be updated, so nothing is written.
    let ds_pte = e.g.entry_addr_ia32e(root, 4, DS_LA, 1);
    let v = e.g.mem.read_u64(ds_pte).unwrap();
    e.g.mem.write_u64(ds_pte, v & !2).unwrap();
    expect_drop(&mut e, &m, DS_LA, DropCause::DsAreaReadOnly);
    e.g.mem.write_u64(ds_pte, v).unwrap();

    // Window checks.
    let end = BUF_LA + BUF_LEN;
    e.set_ds(end + 8, end + 8, end, end);
    expect_drop(&mut e, &m, DS_LA, DropCause::BaseAboveMaximum);
    e.set_ds(BUF_LA, BUF_LA - 8, end, end);
    expect_drop(&mut e, &m, DS_LA, DropCause::IndexBelowBase);
    e.set_ds(BUF_LA, end + 8, end, end);
    expect_drop(&mut e, &m, DS_LA, DropCause::IndexPastMaximum);
    e.set_ds(BUF_LA, BUF_LA, end, end + 1);
    expect_drop(&mut e, &m, DS_LA, DropCause::ThresholdPastMaximum);

    // Buffer pointing at unmapped, non-canonical and non-RAM memory.
    let un = 0xFFFF_FE00_0200_0000;
    e.set_ds(un, un, un + BUF_LEN, un + BUF_LEN);
    expect_drop(&mut e, &m, DS_LA, DropCause::BufferNotPresent);
    let nc = 0x0000_8000_0000_0000;
    e.set_ds(nc, nc, nc + BUF_LEN, nc + BUF_LEN);
    expect_drop(&mut e, &m, DS_LA, DropCause::BufferNonCanonical);
    e.set_ds(mmio_la, mmio_la, mmio_la + 0x1000, mmio_la + 0x1000);
    expect_drop(&mut e, &m, DS_LA, DropCause::BufferNotRam);
    // Buffer whose last page is missing: a record crossing into it is not half-written.
    e.set_ds(BUF_LA, end - 0x10, end + 0x1000, end);
    expect_drop(&mut e, &m, DS_LA, DropCause::BufferNotPresent);
    // Buffer read-only.
    let bpte = e.g.entry_addr_ia32e(root, 4, BUF_LA, 1);
    let v = e.g.mem.read_u64(bpte).unwrap();
    e.g.mem.write_u64(bpte, v & !2).unwrap();
    e.set_ds(BUF_LA, BUF_LA, end, end);
    expect_drop(&mut e, &m, DS_LA, DropCause::BufferReadOnly);
    e.g.mem.write_u64(bpte, v).unwrap();

    // Reset slot on an unmapped page (fmt5 fixed slot 32+i lies at DS+0x148).
    let m5 = model(PebsFormat::Fmt5);
    let near_end = DS_LA + SIZE_4K - 0x100;
    let ds_pa_end = DS_PA + SIZE_4K - 0x100;
    for (off, v) in [(0x20, BUF_LA), (0x28, BUF_LA), (0x30, end), (0x38, end)] {
        e.g.mem.write_u64(ds_pa_end + off, v).unwrap();
    }
    let before = e.g.mem.clone();
    let out = e.run(&m5, near_end, 1 << 33, 0);
    assert_eq!(out.dropped, Some(DropCause::ResetSlotUnreadable));
    assert!(out.reloads.is_empty() && e.g.mem == before);

    // No PEBS at all.
    expect_drop(
        &mut e,
        &model(PebsFormat::None),
        DS_LA,
        DropCause::NoPebsFormat,
    );
}

#[test]
fn ds_fields_are_reread_every_assist() {
    let m = model(PebsFormat::Fmt2);
    let mut e = Env::new();
    assert!(e.run(&m, DS_LA, 1, 0).written);
    // The guest drains and resets the index: the next record lands at base again.
    e.set_ds(BUF_LA, BUF_LA, BUF_LA + BUF_LEN, BUF_LA + BUF_LEN);
    assert!(e.run(&m, DS_LA, 1, 0).written);
    assert_eq!(e.pebs_index(), BUF_LA + 0xC0);
    // Reading through the ds module sees the same.
    let lm = LinearMemory::new(&mut e.g.mem, PageWalker::new(e.state.paging));
    assert_eq!(
        ds::DsArea::read(&lm, DS_LA).unwrap().pebs.index,
        BUF_LA + 0xC0
    );
    // A hostile index does not make the reader allocate without bound.
    let huge = BUF_LA + (64 << 20);
    e.set_ds(BUF_LA, huge, huge, huge);
    let w = PageWalker::new(e.state.paging);
    assert_eq!(
        read_pebs_buffer(&mut e.g.mem, w, DS_LA, PebsFormat::Fmt2),
        Err(DecodeError::TooLarge { len: 64 << 20 })
    );
}

#[test]
fn thirty_two_bit_guest_records_truncated_registers() {
    // Paging off: DS and buffer at physical addresses, registers recorded as 32-bit values.
    let mut mem = VecMemory::new(0x10000);
    for (off, v) in [
        (0x20, 0x2000u64),
        (0x28, 0x2000),
        (0x30, 0x3000),
        (0x38, 0x3000),
    ] {
        mem.write_u64(0x1000 + off, v).unwrap();
    }
    let m = model(PebsFormat::Fmt1);
    let state = GuestState {
        gprs: Gprs {
            rax: 0x1_2345_6789,
            r8: 5,
            rip: 0x1000,
            ..Gprs::default()
        },
        ..Default::default()
    };
    let event = EventInfo::default();
    let req = AssistRequest {
        model: &m,
        ds_area: 0x1000,
        data_cfg: 0,
        applicable: 1,
        global_status: 0,
        ld_lat_threshold: 0,
        state: &state,
        event: &event,
        lbr: &[],
    };
    assert!(assist(&mut mem, &req).written);
    let recs = decode_buffer(PebsFormat::Fmt1, &mem.bytes[0x2000..0x20B0]).unwrap();
    let g = recs[0].gprs.unwrap();
    assert_eq!((g.rax, g.r8, g.rip), (0x2345_6789, 0, 0x1000));
}
