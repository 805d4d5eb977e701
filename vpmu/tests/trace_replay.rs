//! MSR-trap traces: line round trip, replay of a hand-written trace, divergence reporting, and
//! a trace recorded through `TraceWriter` while PEBS records are written to guest memory.

use vpmu::Vpmu;
use vpmu::counter::CounterId;
use vpmu::fuzz::FuzzGuest;
use vpmu::fuzz::seeds::SKYLAKE_TRACE;
use vpmu::mem::GuestMemory;
use vpmu::model::CpuModel;
use vpmu::msr::*;
use vpmu::state::{EventInfo, GuestState};
use vpmu::trace::{
    Divergence, OverflowEvent, TraceError, TraceEvent, TraceWriter, parse_trace, replay,
    replay_text,
};

#[test]
fn every_event_kind_round_trips_through_its_line() {
    let events = vec![
        TraceEvent::Rdmsr {
            index: 0x38F,
            result: Some(0xF),
        },
        TraceEvent::Rdmsr {
            index: 0x999,
            result: None,
        },
        TraceEvent::Wrmsr {
            index: 0x186,
            value: 0x43_00C0,
            ok: true,
        },
        TraceEvent::Wrmsr {
            index: 0x38E,
            value: 1,
            ok: false,
        },
        TraceEvent::Rdpmc {
            ecx: 0x4000_0001,
            result: Some(u64::MAX >> 16),
        },
        TraceEvent::Rdpmc {
            ecx: 7,
            result: None,
        },
        TraceEvent::Count {
            deltas: vec![(CounterId::Gp(0), 100), (CounterId::Fixed(1), 5)],
            wrapped: vec![CounterId::Fixed(1)],
        },
        TraceEvent::Count {
            deltas: vec![],
            wrapped: vec![],
        },
        TraceEvent::Overflow(OverflowEvent {
            counters: vec![CounterId::Gp(0), CounterId::Netburst(16)],
            rip: 0x40_1000,
            pmi: true,
            records: 1,
            pebs: 1,
            status: Some(1 << 62 | 1),
            values: vec![(CounterId::Gp(0), 0xFFFF_FFF0)],
            dropped: vec!["buffer-full".to_string()],
        }),
        TraceEvent::Overflow(OverflowEvent {
            counters: vec![],
            rip: 0,
            pmi: false,
            records: 0,
            pebs: 0,
            status: None,
            values: vec![],
            dropped: vec![],
        }),
        TraceEvent::Pmi { delivered: true },
        TraceEvent::Pmi { delivered: false },
    ];
    for e in events {
        let line = e.to_string();
        assert_eq!(line.parse::<TraceEvent>(), Ok(e), "{line}");
    }
    for bad in [
        "rdmsr",
        "rdmsr 0x10 -> maybe",
        "wrmsr 0x10 0x1 -> yes",
        "count gp0 -> wrapped -",
        "count gpx:1 -> wrapped -",
        "overflow gp0 rip=0x1 -> pmi=2 records=0 pebs=0 status=- values=- dropped=-",
        "pmi maybe",
        "jump 0x10",
    ] {
        assert!(bad.parse::<TraceEvent>().is_err(), "{bad} accepted");
    }
}

#[test]
fn hand_written_trace_replays() {
    let stats = replay_text(SKYLAKE_TRACE, None).unwrap();
    assert_eq!(stats.events, 14);
    assert_eq!((stats.wrmsr, stats.overflows, stats.pmis), (5, 1, 1));
    // Comments and blank lines are skipped; line numbers still count them.
    let text = SKYLAKE_TRACE.replacen("rdmsr 0x38f", "\n# note\nrdmsr 0x38f", 1);
    let t = parse_trace(&text).unwrap();
    assert_eq!(t.events[0].line, 4);
    assert_eq!(t.header.model, "skylake");
}

#[test]
fn tampered_trace_reports_the_first_divergent_line() {
    // Line 5 claims PMC0 reads back without sign extension.
    let text = SKYLAKE_TRACE.replace("rdmsr 0xc1 -> 0xfffffffffff0", "rdmsr 0xc1 -> 0xfffffff0");
    match replay_text(&text, None) {
        Err(TraceError::Divergence(Divergence {
            line,
            expected,
            got,
            ..
        })) => {
            assert_eq!(line, 5);
            assert_eq!(expected, "0xfffffff0");
            assert_eq!(got, "0xfffffffffff0");
        }
        other => panic!("expected a divergence, got {other:?}"),
    }
    // A refused write recorded as accepted (line 6).
    let text = SKYLAKE_TRACE.replace("wrmsr 0x38e 0x1 -> #GP", "wrmsr 0x38e 0x1 -> ok");
    let e = replay_text(&text, None).unwrap_err();
    assert!(
        matches!(e, TraceError::Divergence(Divergence { line: 6, .. })),
        "{e}"
    );
    // Replaying against another model diverges where the models differ: Core 2 has two GP
    // counters, so GLOBAL_CTRL reads 0x3.
    let core2 = CpuModel::preset("core2").unwrap();
    let e = replay_text(SKYLAKE_TRACE, Some(core2)).unwrap_err();
    assert!(
        matches!(e, TraceError::Divergence(Divergence { line: 2, .. })),
        "{e}"
    );
    // A PMI the vPMU never requested.
    let text = SKYLAKE_TRACE.replace("rdmsr 0x38e -> 0x1", "pmi delivered\nrdmsr 0x38e -> 0x1");
    let e = replay_text(&text, None).unwrap_err();
    assert!(
        matches!(e, TraceError::Divergence(Divergence { line: 11, .. })),
        "{e}"
    );
    assert!(matches!(
        replay_text("rdmsr 0x10 -> 0x0\n", None),
        Err(TraceError::NoHeader)
    ));
    assert!(matches!(
        replay_text("# vpmu-trace v1 model=k6 vcpu=0\n", None),
        Err(TraceError::Model(_))
    ));
    assert!(matches!(
        replay_text(
            "# vpmu-trace v1 model=skylake vcpu=0\nrdmsr x -> 0x1\n",
            None
        ),
        Err(TraceError::Syntax { line: 2, .. })
    ));
}

/// Records a trace the way the VMM does, with PEBS records written into guest memory (and one
/// buffer-full drop), then replays it without that memory.
#[test]
fn recorded_pebs_trace_replays() {
    let ds = vpmu::fuzz::seeds::DS_PHYS_FOR_TESTS;
    for name in ["skylake", "icelake-server", "netburst"] {
        let model = CpuModel::preset(name).unwrap();
        let netburst = name == "netburst";
        let mut vpmu = Vpmu::new(model.clone());
        let mut guest = FuzzGuest::new();
        guest.paging = FuzzGuest::mode_regs(3);
        let width = if netburst {
            40
        } else {
            u32::from(model.gp_width)
        };
        let mask = (1u64 << width) - 1;
        // Reset slot 0: 0x10000 events to the next wrap; a buffer of 0x800 bytes, threshold half way.
        guest.mem.inner.write_u64(ds + 0x40, mask - 0xFFFF).unwrap();
        guest.mem.inner.write_u64(ds + 0x30, 0xD800).unwrap();
        guest.mem.inner.write_u64(ds + 0x38, 0xD400).unwrap();
        let mut w = TraceWriter::new(Vec::new(), name, 0).unwrap();
        let wr = |v: &mut Vpmu, w: &mut TraceWriter<Vec<u8>>, i: u32, x: u64| {
            let r = v.wrmsr(i, x);
            w.wrmsr(i, x, &r).unwrap();
        };
        wr(&mut vpmu, &mut w, IA32_DS_AREA, ds);
        let id = if netburst {
            wr(
                &mut vpmu,
                &mut w,
                IA32_PEBS_ENABLE,
                NETBURST_PEBS_ENABLE_BIT,
            );
            wr(
                &mut vpmu,
                &mut w,
                MSR_CRU_ESCR0,
                2 << 25 | 1 << 9 | ESCR_T0_OS,
            );
            wr(
                &mut vpmu,
                &mut w,
                MSR_IQ_CCCR4,
                CCCR_ENABLE | 4 << 13 | 3 << 16 | CCCR_OVF_PMI_T0,
            );
            CounterId::Netburst(NETBURST_IQ_COUNTER4_INDEX)
        } else {
            wr(&mut vpmu, &mut w, IA32_PEBS_ENABLE, 1);
            wr(
                &mut vpmu,
                &mut w,
                IA32_PERFEVTSEL0,
                EVTSEL_EN | EVTSEL_OS | 0xC0,
            );
            CounterId::Gp(0)
        };
        let mut records = 0;
        for round in 0..70u64 {
            let delta = 0x1_0000 + round;
            let deltas = [(id, if round == 0 { mask + 1 } else { delta })];
            let wrapped = vpmu.add_counts(&deltas);
            w.count(&deltas, &wrapped).unwrap();
            if !wrapped.is_empty() {
                let event = EventInfo {
                    eventing_ip: 0x40_1000 + round,
                    ..EventInfo::default()
                };
                let state = GuestState {
                    paging: guest.paging,
                    ..GuestState::default()
                };
                let out = vpmu.handle_overflow(&wrapped, &state, &event, &mut guest.mem);
                records += out.records_written;
                w.overflow(&wrapped, &event, &out, &mut vpmu).unwrap();
            }
            if vpmu.take_pmi_request() {
                w.pmi(true).unwrap();
            }
            let r = vpmu.rdmsr(IA32_PEBS_ENABLE);
            w.rdmsr(IA32_PEBS_ENABLE, &r).unwrap();
        }
        let text = String::from_utf8(w.into_inner()).unwrap();
        assert!(records >= 10, "{name}: only {records} records");
        assert!(
            text.contains("buffer-full"),
            "{name}: the buffer never filled"
        );
        let stats = replay_text(&text, None).unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
        assert_eq!(stats.overflows, 70, "{name}");
        // Tampering with what does not depend on guest memory is caught (reload values and the
        // threshold are reproduced from the trace by construction, so they cannot be).
        let trace = parse_trace(&text).unwrap();
        let mut events = trace.events.clone();
        let k = events
            .iter()
            .position(|l| matches!(l.event, TraceEvent::Overflow(_)))
            .unwrap();
        if let TraceEvent::Overflow(o) = &mut events[k].event {
            o.pebs ^= 2;
        }
        let d = replay(model, &events).unwrap_err();
        assert_eq!(d.line, events[k].line, "{name}");
    }
}
