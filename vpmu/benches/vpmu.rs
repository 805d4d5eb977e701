//! Host-side speed of the vPMU state machine (criterion; `make bench` runs it and folds the
//! results into one table with the end-to-end figures, see vmm/benches/e2e.rs).
//!
//! Groups, each with the floor it is compared against:
//! - `msr/rdmsr_<class>`, `msr/wrmsr_<class>`: one [`Vpmu::rdmsr`] / [`Vpmu::wrmsr`] per PMU
//!   MSR class (successful accesses only: the setup asserts each write is accepted). Floor (in
//!   the runner): the end-to-end null port-I/O exit, the cost every trapped MSR pays anyway.
//! - `assist/<fmt>`: one PEBS assist ([`assist`]: DS-area walk and reads, record capture and
//!   encoding, writability checks, record and PEBS Index writes) through 4-level, 4 KiB-page
//!   guest page tables, per record format with the basic record, and `fmt4_all` / `fmt5_all`
//!   with every adaptive group (meminfo, GPRs, XMMs, 32 LBR entries). Each iteration also
//!   stores PEBS Index back to the buffer base (one 8-byte physical write) so the buffer never
//!   fills. Floor: `floor/copy_<n>_bytes`, a plain `write_phys` of the record's size.
//! - `walk/cold`, `walk/warm`: one 4-level translation of a 4 KiB-mapped address. The walker
//!   keeps no paging-structure cache or TLB, so "cold" and "warm" differ only in the host
//!   caches: cold flushes the four paging-entry cache lines (CLFLUSH) before each timed walk
//!   and builds a fresh walker; warm repeats the same walk with everything cached. Floors:
//!   `walk/floor_cold` and `walk/floor_warm`, the four dependent entry reads a walk cannot
//!   avoid, without any checks, in the same cache state. Cold walks are timed one at a time
//!   with RDTSC (LFENCE-ordered), so both cold figures include the same ~10 ns timing cost.

#[path = "../tests/pebs_common/mod.rs"]
mod pebs_common;

use std::hint::black_box;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use vpmu::Vpmu;
use vpmu::ds::{
    DS_PEBS_ABSOLUTE_MAXIMUM, DS_PEBS_BUFFER_BASE, DS_PEBS_COUNTER_RESET, DS_PEBS_INDEX,
    DS_PEBS_INTERRUPT_THRESHOLD,
};
use vpmu::mem::GuestMemory;
use vpmu::model::{CpuModel, PebsFormat};
use vpmu::msr::*;
use vpmu::paging::{Access, PageWalker};
use vpmu::pebs::{AssistRequest, assist};
use vpmu::state::{EventInfo, Gprs, GuestState, LbrEntry, PagingRegs};

use pebs_common::{Guest, PW, SIZE_4K, model, regs_ia32e};

/// Guest RAM of the benchmark guests.
const RAM: usize = 16 << 20;
/// Page tables are allocated from here up.
const TABLES_AT: u64 = 0x10_0000;
/// DS save area: linear (kernel direct map, as Linux places it) and physical.
const DS_LA: u64 = 0xffff_8880_0040_0000;
const DS_GPA: u64 = 0x40_0000;
/// PEBS buffer: linear and physical, [`BUF_PAGES`] 4 KiB pages.
const BUF_LA: u64 = 0xffff_8880_0050_0000;
const BUF_GPA: u64 = 0x50_0000;
const BUF_PAGES: u64 = 4;
/// Address translated by the walk benchmarks.
const WALK_LA: u64 = 0x7f12_3456_7000;
const WALK_GPA: u64 = 0x60_0000;

fn criterion_config() -> Criterion {
    // Short runs keep `make bench` within its budget; command-line flags still override.
    Criterion::default()
        .measurement_time(Duration::from_millis(1000))
        .warm_up_time(Duration::from_millis(400))
        .sample_size(40)
        .configure_from_args()
}

// ---- MSR handlers ----

/// One MSR class: a representative register, the value written, and which accesses exist.
struct MsrCase {
    class: &'static str,
    index: u32,
    write: Option<u64>,
    read: bool,
}

const fn case(class: &'static str, index: u32, write: Option<u64>, read: bool) -> MsrCase {
    MsrCase {
        class,
        index,
        write,
        read,
    }
}

/// EVTSEL: instructions retired, OS, not enabled (what a driver writes before enabling).
const EVTSEL_VALUE: u64 = 0xc0 | EVTSEL_OS;

/// The architectural classes on the icelake-server preset (PMU v5, PEBS fmt4, 32 LBRs).
fn arch_cases() -> Vec<MsrCase> {
    vec![
        case("evtsel", IA32_PERFEVTSEL0, Some(EVTSEL_VALUE), true),
        case("pmc", IA32_PMC0, Some(0xffff_fff0), true),
        case("a_pmc", IA32_A_PMC0, Some(0x1234_5678), true),
        case("fixed_ctr", IA32_FIXED_CTR0, Some(0x1234_5678), true),
        case("fixed_ctrl", IA32_FIXED_CTR_CTRL, Some(0), true),
        case("global_ctrl", IA32_PERF_GLOBAL_CTRL, Some(0xf), true),
        case("global_status", IA32_PERF_GLOBAL_STATUS, None, true),
        case("global_ovf_ctrl", IA32_PERF_GLOBAL_OVF_CTRL, Some(1), true),
        case(
            "global_status_set",
            IA32_PERF_GLOBAL_STATUS_SET,
            Some(1),
            true,
        ),
        case("global_inuse", IA32_PERF_GLOBAL_INUSE, None, true),
        case("perf_capabilities", IA32_PERF_CAPABILITIES, None, true),
        case("debugctl", IA32_DEBUGCTL, Some(DEBUGCTL_LBR), true),
        case(
            "misc_enable",
            IA32_MISC_ENABLE,
            Some(MISC_ENABLE_FAST_STRING),
            true,
        ),
        case("ds_area", IA32_DS_AREA, Some(DS_LA), true),
        case("pebs_enable", IA32_PEBS_ENABLE, Some(1), true),
        case(
            "pebs_data_cfg",
            MSR_PEBS_DATA_CFG,
            Some(PEBS_DATACFG_GPRS),
            true,
        ),
        case("pebs_ld_lat", MSR_PEBS_LD_LAT_THRESHOLD, Some(3), true),
        case("pebs_frontend", MSR_PEBS_FRONTEND, Some(0), true),
        case("lbr_select", MSR_LBR_SELECT, Some(0), true),
        case("lbr_tos", MSR_LASTBRANCH_TOS, Some(3), true),
        case(
            "lbr_from",
            MSR_LASTBRANCH_0_FROM_IP,
            Some(0xffff_ffff_8100_0000),
            true,
        ),
        case(
            "lbr_to",
            MSR_LASTBRANCH_0_TO_IP,
            Some(0xffff_ffff_8100_0040),
            true,
        ),
        case("lbr_info", MSR_LBR_INFO_0, Some(0), true),
    ]
}

/// The NetBurst classes on the netburst preset.
fn netburst_cases() -> Vec<MsrCase> {
    vec![
        case("nb_counter", MSR_IQ_COUNTER4, Some(0x12_3456), true),
        case("nb_cccr", MSR_IQ_CCCR4, Some(0), true),
        case("nb_escr", MSR_CRU_ESCR0, Some(0), true),
    ]
}

fn bench_msr_cases(c: &mut Criterion, preset: &str, cases: &[MsrCase]) {
    let mut g = c.benchmark_group("msr");
    for m in cases {
        let mut vpmu = Vpmu::new(CpuModel::preset(preset).expect("preset exists"));
        if m.read {
            vpmu.rdmsr(m.index)
                .unwrap_or_else(|e| panic!("{preset} rdmsr {}: {e}", m.class));
            g.bench_function(format!("rdmsr_{}", m.class), |b| {
                b.iter(|| black_box(vpmu.rdmsr(black_box(m.index))))
            });
        }
        if let Some(v) = m.write {
            vpmu.wrmsr(m.index, v)
                .unwrap_or_else(|e| panic!("{preset} wrmsr {}: {e}", m.class));
            g.bench_function(format!("wrmsr_{}", m.class), |b| {
                b.iter(|| black_box(vpmu.wrmsr(black_box(m.index), black_box(v))))
            });
        }
    }
    g.finish();
}

fn bench_msr(c: &mut Criterion) {
    bench_msr_cases(c, "icelake-server", &arch_cases());
    bench_msr_cases(c, "netburst", &netburst_cases());
}

// ---- PEBS assist ----

/// A guest with 4-level page tables mapping the DS area and the PEBS buffer with 4 KiB pages.
fn pebs_guest() -> (Guest, PagingRegs) {
    let mut g = Guest::new(RAM, TABLES_AT);
    let root = g.alloc();
    g.map_ia32e(root, 4, DS_LA, DS_GPA, SIZE_4K, PW);
    for p in 0..BUF_PAGES {
        g.map_ia32e(
            root,
            4,
            BUF_LA + p * SIZE_4K,
            BUF_GPA + p * SIZE_4K,
            SIZE_4K,
            PW,
        );
    }
    (g, regs_ia32e(root, false))
}

fn ds_setup(g: &mut Guest) {
    let m = &mut g.mem;
    let fields = [
        (DS_PEBS_BUFFER_BASE, BUF_LA),
        (DS_PEBS_INDEX, BUF_LA),
        (DS_PEBS_ABSOLUTE_MAXIMUM, BUF_LA + BUF_PAGES * SIZE_4K),
        // Threshold at one record, as a sampling driver without large PEBS sets it.
        (DS_PEBS_INTERRUPT_THRESHOLD, BUF_LA + 1),
        (DS_PEBS_COUNTER_RESET, (1u64 << 48) - 1000),
    ];
    for (off, v) in fields {
        m.write_u64(DS_GPA + off, v).expect("DS area is RAM");
    }
}

fn guest_state(paging: PagingRegs) -> GuestState {
    let mut xmm = [0u128; 16];
    for (i, x) in xmm.iter_mut().enumerate() {
        *x = u128::from(u8::try_from(i).unwrap_or(0)) * 0x0101_0101_0101_0101_0101_0101_0101_0101;
    }
    GuestState {
        gprs: Gprs {
            rax: 1,
            rbx: 2,
            rcx: 3,
            rdx: 4,
            rsi: 5,
            rdi: 6,
            rbp: 7,
            rsp: 0xffff_c900_0000_8000,
            r8: 8,
            r15: 15,
            rip: 0xffff_ffff_8100_1234,
            rflags: 0x246,
            ..Gprs::default()
        },
        paging,
        cpl: 0,
        tsc: 0x1234_5678_9abc,
        xmm,
    }
}

/// DATA_CFG with every adaptive group and 32 LBR entries.
const ALL_GROUPS: u64 = PEBS_DATACFG_MEMINFO
    | PEBS_DATACFG_GPRS
    | PEBS_DATACFG_XMMS
    | PEBS_DATACFG_LBRS
    | 31 << PEBS_DATACFG_LBR_SHIFT;

fn fmt_name(f: PebsFormat) -> &'static str {
    match f {
        PebsFormat::None => "none",
        PebsFormat::Netburst => "netburst",
        PebsFormat::Fmt0 => "fmt0",
        PebsFormat::Fmt1 => "fmt1",
        PebsFormat::Fmt2 => "fmt2",
        PebsFormat::Fmt3 => "fmt3",
        PebsFormat::Fmt4 => "fmt4",
        PebsFormat::Fmt5 => "fmt5",
    }
}

fn bench_assist(c: &mut Criterion) {
    let mut cases: Vec<(String, PebsFormat, u64)> = pebs_common::ALL_FORMATS
        .iter()
        .map(|&f| (fmt_name(f).to_string(), f, 0))
        .collect();
    cases.push(("fmt4_all".into(), PebsFormat::Fmt4, ALL_GROUPS));
    cases.push(("fmt5_all".into(), PebsFormat::Fmt5, ALL_GROUPS));
    let lbr: Vec<LbrEntry> = (0..32u64)
        .map(|i| LbrEntry {
            from: 0xffff_ffff_8100_0000 + i * 0x40,
            to: 0xffff_ffff_8100_0020 + i * 0x40,
            info: i,
        })
        .collect();
    let event = EventInfo {
        eventing_ip: 0xffff_ffff_8100_1230,
        data_addr: Some(0xffff_8880_0012_3450),
        data_source: 1,
        latency: 60,
    };
    let mut sizes = Vec::new();
    let mut g = c.benchmark_group("assist");
    for (name, format, data_cfg) in &cases {
        let model = model(*format);
        let (mut guest, paging) = pebs_guest();
        ds_setup(&mut guest);
        let state = guest_state(paging);
        let req = AssistRequest {
            model: &model,
            ds_area: DS_LA,
            data_cfg: *data_cfg,
            applicable: 1,
            global_status: 1,
            ld_lat_threshold: 3,
            state: &state,
            event: &event,
            lbr: &lbr,
        };
        let mem = &mut guest.mem;
        // One checked assist first: the benchmark measures the path that writes a record.
        let out = assist(mem, &req);
        assert!(
            out.written && out.threshold_reached,
            "{name}: assist wrote nothing: {out:?}"
        );
        let size = mem.read_u64(DS_GPA + DS_PEBS_INDEX).expect("RAM") - BUF_LA;
        println!("assist/{name}: record of {size} bytes");
        sizes.push(size);
        g.bench_function(name.as_str(), |b| {
            b.iter(|| {
                // Rewind PEBS Index so every assist finds room (one 8-byte store).
                let _ = mem.write_u64(DS_GPA + DS_PEBS_INDEX, BUF_LA);
                black_box(assist(mem, black_box(&req)))
            })
        });
    }
    g.finish();

    sizes.sort_unstable();
    sizes.dedup();
    let mut g = c.benchmark_group("floor");
    let mut guest = Guest::new(RAM, TABLES_AT);
    for size in sizes {
        let bytes = vec![0x5au8; usize::try_from(size).expect("record size fits usize")];
        let mem = &mut guest.mem;
        g.bench_function(format!("copy_{size}_bytes"), |b| {
            b.iter(|| black_box(mem.write_phys(black_box(BUF_GPA), black_box(&bytes))))
        });
    }
    g.finish();
}

// ---- Page walk ----

/// TSC ticks per second, measured once against the monotonic clock.
fn tsc_hz() -> f64 {
    static HZ: OnceLock<f64> = OnceLock::new();
    *HZ.get_or_init(|| {
        let (t0, c0) = (Instant::now(), rdtsc());
        std::thread::sleep(Duration::from_millis(50));
        let (t1, c1) = (Instant::now(), rdtsc());
        (c1 - c0) as f64 / (t1 - t0).as_secs_f64()
    })
}

fn rdtsc() -> u64 {
    // SAFETY: LFENCE and RDTSC only order execution and read the time-stamp counter.
    unsafe {
        core::arch::x86_64::_mm_lfence();
        let t = core::arch::x86_64::_rdtsc();
        core::arch::x86_64::_mm_lfence();
        t
    }
}

fn ticks_to_duration(ticks: u64) -> Duration {
    Duration::from_secs_f64(ticks as f64 / tsc_hz())
}

/// Evicts the cache lines holding `gpas` (8-byte entries) of `bytes` from every cache level.
fn flush(bytes: &[u8], gpas: &[u64]) {
    for &gpa in gpas {
        let Some(p) = usize::try_from(gpa).ok().and_then(|i| bytes.get(i)) else {
            continue;
        };
        // SAFETY: `p` points into `bytes`; CLFLUSH only writes back and invalidates the line.
        unsafe { core::arch::x86_64::_mm_clflush(std::ptr::from_ref(p)) };
    }
    // SAFETY: MFENCE orders the flushes before the timed region.
    unsafe { core::arch::x86_64::_mm_mfence() };
}

/// The minimal 4-level walk: four dependent entry reads, no checks (the floor).
fn raw_walk(mem: &dyn GuestMemory, cr3: u64, la: u64) -> u64 {
    const FRAME: u64 = 0x000f_ffff_ffff_f000;
    let mut table = cr3 & FRAME;
    for level in (1..=4u32).rev() {
        let idx = (la >> (12 + 9 * (level - 1))) & 0x1ff;
        table = mem.read_u64(table + idx * 8).unwrap_or(0) & FRAME;
    }
    table | (la & 0xfff)
}

fn bench_walk(c: &mut Criterion) {
    let mut g = Guest::new(RAM, TABLES_AT);
    let root = g.alloc();
    g.map_ia32e(root, 4, WALK_LA, WALK_GPA, SIZE_4K, PW);
    let regs = regs_ia32e(root, false);
    let entries: Vec<u64> = (1..=4)
        .map(|level| g.entry_addr_ia32e(root, 4, WALK_LA, level))
        .collect();
    let mem = &g.mem;
    let t = PageWalker::new(regs)
        .translate(mem, WALK_LA, Access::Write)
        .expect("mapped");
    assert_eq!(t.gpa, WALK_GPA);
    assert_eq!(raw_walk(mem, root, WALK_LA), WALK_GPA);
    let _ = tsc_hz();

    let mut grp = c.benchmark_group("walk");
    grp.bench_function("cold", |b| {
        b.iter_custom(|iters| {
            let mut ticks = 0;
            for _ in 0..iters {
                flush(&mem.bytes, &entries);
                let t0 = rdtsc();
                let w = PageWalker::new(black_box(regs));
                black_box(w.translate(mem, black_box(WALK_LA), Access::Write).ok());
                ticks += rdtsc() - t0;
            }
            ticks_to_duration(ticks)
        })
    });
    grp.bench_function("floor_cold", |b| {
        b.iter_custom(|iters| {
            let mut ticks = 0;
            for _ in 0..iters {
                flush(&mem.bytes, &entries);
                let t0 = rdtsc();
                black_box(raw_walk(mem, black_box(root), black_box(WALK_LA)));
                ticks += rdtsc() - t0;
            }
            ticks_to_duration(ticks)
        })
    });
    let walker = PageWalker::new(regs);
    grp.bench_function("warm", |b| {
        b.iter(|| {
            black_box(
                walker
                    .translate(mem, black_box(WALK_LA), Access::Write)
                    .ok(),
            )
        })
    });
    grp.bench_function("floor_warm", |b| {
        b.iter(|| black_box(raw_walk(mem, black_box(root), black_box(WALK_LA))))
    });
    grp.finish();
}

criterion_group! {
    name = benches;
    config = criterion_config();
    targets = bench_msr, bench_assist, bench_walk
}
criterion_main!(benches);
