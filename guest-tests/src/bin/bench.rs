//! End-to-end benchmark guest: times itself with RDTSC and prints `BENCH <name> <value> <unit>`
//! lines that `vmm/benches/e2e.rs` (`make bench`) collects. `--cmdline` picks the figure:
//!
//! - `null`: a null port-I/O exit round trip (OUT to unused port 0x80, which the vmm ignores).
//! - `wrmsr`: a PMU WRMSR round trip (IA32_PERFEVTSEL0 with EN clear, so nothing starts
//!   counting and the precise backend does not single-step).
//! - `loop`: the same unrolled loop with NOPs instead, for the loop's own cost (reported only).
//! - `pebs`: PEBS assist plus PMI (precise backend, icelake-server): PMC0 at -1 counting
//!   instructions with PEBS, adaptive records with every group and 32 LBR entries, interrupt
//!   threshold at one record, FREEZE_PERFMON_ON_PMI; timed from before the enabling WRMSR (which
//!   is the counted instruction that wraps the counter) to the first instruction of the NMI
//!   handler.
//! - `precise`: precise-mode speed: a CPL0 `dec/jnz` loop counted by PMC0 (instructions, OS)
//!   under the precise backend; prints the exact count and the TSC ticks it took.
//! - `workload [hz=N tsc=T]`: a CPL3 workload (xorshift and stores over 64 KiB), timed at CPL0
//!   around it. With `hz=N` the guest samples it with PEBS on core cycles (EVTSEL 3CH, USR|OS)
//!   every `T / N` cycles (T: the TSC rate in Hz, which the runner measures; core cycles run at
//!   it in every backend), one record per PMI, as a sampling driver without large PEBS does.
//!
//! Exit-based figures are the median of [`BATCHES`] batches of [`UNROLL`] operations per boot;
//! the runner repeats boots for the spread. The PMI handler is a minimal NMI stub installed in
//! the IDT (see [`install_nmi_stub`]) so that the guest's own CPL0 handler code, which this
//! development host emulates slowly, adds as little as possible to the VMM figures.

#![no_std]
#![no_main]

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicU64, Ordering};

use guest_tests::msr_index::{
    DEBUGCTL_FREEZE_PERFMON_ON_PMI, EVTSEL_ADAPTIVE, EVTSEL_EN, EVTSEL_OS, EVTSEL_USR,
    GLOBAL_STATUS_CTR_FRZ, IA32_DEBUGCTL, IA32_DS_AREA, IA32_PEBS_ENABLE, IA32_PERF_GLOBAL_CTRL,
    IA32_PERF_GLOBAL_OVF_CTRL, IA32_PERF_GLOBAL_STATUS, IA32_PERFEVTSEL0, IA32_PMC0,
    MSR_PEBS_DATA_CFG, OVF_BUFFER,
};
use guest_tests::pebs::{self, layout};
use guest_tests::{cpu, entry, exit, lapic, msr, println, user};

/// Operations per timed batch (the instruction is repeated this many times in straight-line
/// code, so the loop around it costs little).
const UNROLL: u64 = 16;
/// Timed batches per boot; the printed value is their median.
const BATCHES: usize = 31;
/// Untimed warm-up batches.
const WARMUP: usize = 3;
/// PEBS assist + PMI repetitions per boot.
const PEBS_REPS: usize = 9;
/// Iterations of the precise-mode loop (2 instructions each).
const PRECISE_ITERS: u64 = 10_000;
/// Iterations of the CPL3 workload (about half a second natively).
const WORKLOAD_ITERS: u64 = 150_000_000;
/// TSC rate assumed without `tsc=` (the skylake preset's).
const DEFAULT_TSC_HZ: u64 = 2_100_000_000;
/// Port nothing answers: the vmm logs it once and ignores it.
const NULL_PORT: u16 = 0x80;

/// Instructions retired.
const EV_INST: u64 = 0xc0;
/// Unhalted core cycles.
const EV_CYCLES: u64 = 0x3c;
/// xAPIC LVTPC, for the NMI stub.
#[allow(clippy::cast_lossless, reason = "u64::from is not const")]
const LVTPC_ADDR: u64 = lapic::LAPIC_BASE + lapic::REG_LVTPC as u64;
/// 48-bit counters on the skylake and icelake-server presets.
const WIDTH: u32 = 48;
/// PEBS_DATA_CFG: meminfo, GPRs, XMMs, LBRs with 32 entries.
const ALL_GROUPS: u64 = layout::CFG_MEMINFO
    | layout::CFG_GPRS
    | layout::CFG_XMMS
    | layout::CFG_LBRS
    | 31 << layout::CFG_LBR_SHIFT;

#[unsafe(no_mangle)]
extern "C" fn guest_main(cpu: u64, mem_size: u64) -> ! {
    entry::init(cpu, mem_size);
    let cmd = entry::cmdline();
    let figure = cmd.split_whitespace().next().unwrap_or("");
    let ok = match figure {
        "null" => exit_figure("null_exit", batch_out),
        "wrmsr" => exit_figure("pmu_wrmsr", batch_wrmsr),
        "loop" => exit_figure("loop_only", batch_nop),
        "pebs" => pebs_figure(),
        "precise" => precise_figure(),
        "workload" => workload_figure(cmd),
        _ => {
            println!(
                "bench: unknown figure {cmd:?}: give null, wrmsr, loop, pebs, precise or workload [hz=N]"
            );
            false
        }
    };
    exit::exit(if ok { 0 } else { 1 })
}

// ---- Exit round trips ----

fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Times [`BATCHES`] batches of `f` and prints the median per operation.
fn exit_figure(name: &str, f: impl Fn() -> u64) -> bool {
    for _ in 0..WARMUP {
        f();
    }
    let mut t = [0u64; BATCHES];
    for x in t.iter_mut() {
        *x = f();
    }
    let min = t.iter().copied().min().unwrap_or(0);
    let med = median(&mut t);
    println!("BENCH {name} {} tsc_per_op", med / UNROLL);
    println!("BENCH {name}_min {} tsc_per_op", min / UNROLL);
    true
}

/// Sixteen copies of `$insn`.
macro_rules! x16 {
    ($insn:literal) => {
        concat!(
            $insn, "\n", $insn, "\n", $insn, "\n", $insn, "\n", $insn, "\n", $insn, "\n", $insn,
            "\n", $insn, "\n", $insn, "\n", $insn, "\n", $insn, "\n", $insn, "\n", $insn, "\n",
            $insn, "\n", $insn, "\n", $insn, "\n"
        )
    };
}

fn batch_out() -> u64 {
    let t0 = cpu::rdtsc();
    // SAFETY: OUT to a port no device decodes; the vmm ignores it.
    unsafe {
        asm!(x16!("out dx, al"), in("dx") NULL_PORT, in("al") 0u8, options(nomem, nostack, preserves_flags))
    };
    cpu::rdtsc() - t0
}

/// EVTSEL0: instructions retired at CPL0, EN clear (bits 31:0 hold all of it).
const EVTSEL_IDLE: u32 = low32(EV_INST | EVTSEL_OS);

/// Bits 31:0 (for EAX of a WRMSR).
#[allow(
    clippy::cast_possible_truncation,
    reason = "keeps the low half on purpose"
)]
const fn low32(v: u64) -> u32 {
    v as u32
}

fn batch_wrmsr() -> u64 {
    let t0 = cpu::rdtsc();
    // SAFETY: writes a PMU MSR with a value that enables nothing.
    unsafe {
        asm!(
            x16!("wrmsr"),
            in("ecx") IA32_PERFEVTSEL0,
            in("eax") EVTSEL_IDLE,
            in("edx") 0u32,
            options(nomem, nostack, preserves_flags)
        )
    };
    cpu::rdtsc() - t0
}

fn batch_nop() -> u64 {
    let t0 = cpu::rdtsc();
    // SAFETY: NOPs.
    unsafe { asm!(x16!("nop"), options(nomem, nostack, preserves_flags)) };
    cpu::rdtsc() - t0
}

// ---- The NMI stub ----

/// TSC at the stub's first instruction (0 until the first NMI).
static NMI_TSC: AtomicU64 = AtomicU64::new(0);
/// NMIs taken.
static NMI_COUNT: AtomicU64 = AtomicU64::new(0);
/// Non-zero: the stub re-arms sampling (rewinds PEBS Index to [`REARM_BASE`] at the address
/// in [`REARM_INDEX_PTR`], clears PMC0's and OvfBuffer's status bits, unmasks LVTPC as NMI).
static REARM: AtomicU64 = AtomicU64::new(0);
static REARM_INDEX_PTR: AtomicU64 = AtomicU64::new(0);
static REARM_BASE: AtomicU64 = AtomicU64::new(0);

global_asm!(
    ".pushsection .text.bench_nmi, \"ax\"",
    ".global bench_nmi_stub",
    "bench_nmi_stub:",
    "push rax",
    "push rdx",
    "rdtsc",
    "shl rdx, 32",
    "or rax, rdx",
    "mov [rip + {tsc}], rax",
    "lock inc qword ptr [rip + {count}]",
    "cmp qword ptr [rip + {rearm}], 0",
    "je 2f",
    "push rcx",
    "mov rcx, [rip + {index_ptr}]",
    "mov rax, [rip + {base}]",
    "mov [rcx], rax",
    "mov ecx, {ovf_ctrl}",
    "mov eax, 1",
    "mov edx, {ovf_hi}",
    "wrmsr",
    "mov rcx, {lvtpc}",
    "mov dword ptr [rcx], {nmi}",
    "pop rcx",
    "2:",
    "pop rdx",
    "pop rax",
    "iretq",
    ".popsection",
    tsc = sym NMI_TSC,
    count = sym NMI_COUNT,
    rearm = sym REARM,
    index_ptr = sym REARM_INDEX_PTR,
    base = sym REARM_BASE,
    ovf_ctrl = const IA32_PERF_GLOBAL_OVF_CTRL,
    ovf_hi = const (OVF_BUFFER >> 32),
    lvtpc = const LVTPC_ADDR,
    nmi = const lapic::DELIVERY_NMI,
);

unsafe extern "C" {
    static bench_nmi_stub: u8;
}

#[repr(C, packed(2))]
struct Dtr {
    limit: u16,
    base: u64,
}

/// Points IDT vector 2 (NMI) at `bench_nmi_stub`, keeping the gate's selector and type.
fn install_nmi_stub() {
    let mut idtr = Dtr { limit: 0, base: 0 };
    // SAFETY: SIDT stores 10 bytes into `idtr`.
    unsafe { asm!("sidt [{}]", in(reg) &raw mut idtr, options(nostack)) };
    let gate = idtr.base + 2 * 16;
    let off = (&raw const bench_nmi_stub) as u64;
    // SAFETY: the runtime's IDT is a writable static of 256 16-byte gates; only the offset
    // fields of gate 2 change, and no NMI is pending while they do.
    unsafe {
        let lo = gate as *mut u64;
        let keep = lo.read_volatile() & 0x0000_ffff_ffff_0000;
        lo.write_volatile(keep | (off & 0xffff) | (off >> 16 & 0xffff) << 48);
        (gate as *mut u64).add(1).write_volatile(off >> 32);
    }
}

fn wait_nmi(before: u64) -> bool {
    cpu::spin_until(|| NMI_COUNT.load(Ordering::SeqCst) > before, 100_000)
}

// ---- PEBS assist + PMI ----

fn clear_status() {
    // SAFETY: PMU MSRs only.
    unsafe {
        let st = msr::rdmsr(IA32_PERF_GLOBAL_STATUS);
        msr::wrmsr(
            IA32_PERF_GLOBAL_OVF_CTRL,
            st | GLOBAL_STATUS_CTR_FRZ | OVF_BUFFER,
        );
    }
}

fn pebs_figure() -> bool {
    install_nmi_stub();
    let ds = pebs::ds_page();
    let base = pebs::buf_page(0);
    let size = layout::adaptive_size(ALL_GROUPS) as u64;
    lapic::set_lvtpc(lapic::DELIVERY_NMI);
    let mut t = [0u64; PEBS_REPS];
    for x in t.iter_mut() {
        pebs::ds_setup(
            ds,
            base,
            base,
            base + pebs::BUF_PAGES as u64 * 4096,
            base + 1,
        );
        pebs::set_reset(ds, 0, (1u64 << WIDTH) - 1_000_000_000);
        clear_status();
        // SAFETY: PMU MSRs only; the DS area is a mapped, writable page of the image.
        unsafe {
            msr::wrmsr(IA32_DS_AREA, ds);
            msr::wrmsr(IA32_DEBUGCTL, DEBUGCTL_FREEZE_PERFMON_ON_PMI);
            msr::wrmsr(MSR_PEBS_DATA_CFG, ALL_GROUPS);
            msr::wrmsr(IA32_PEBS_ENABLE, 1);
            msr::wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
            // PMC0 sign-extends bit 31: -1 over the full width.
            msr::wrmsr(IA32_PMC0, 0xffff_ffff);
        }
        let before = NMI_COUNT.load(Ordering::SeqCst);
        let t0 = cpu::rdtsc();
        // SAFETY: enables PMC0; the WRMSR itself is the instruction that wraps it.
        unsafe {
            msr::wrmsr(
                IA32_PERFEVTSEL0,
                EV_INST | EVTSEL_OS | EVTSEL_EN | EVTSEL_ADAPTIVE,
            )
        };
        let got = wait_nmi(before);
        // SAFETY: PMU MSRs only.
        unsafe {
            msr::wrmsr(IA32_PERFEVTSEL0, 0);
            msr::wrmsr(IA32_PEBS_ENABLE, 0);
        }
        let index = pebs::ds_index(ds);
        clear_status();
        lapic::set_lvtpc(lapic::DELIVERY_NMI);
        if !got {
            println!("bench pebs: no PMI after the overflow");
            return false;
        }
        if index != base + size {
            println!("bench pebs: PEBS Index {index:#x}, want one {size}-byte record at {base:#x}");
            return false;
        }
        *x = NMI_TSC.load(Ordering::SeqCst).wrapping_sub(t0);
    }
    let min = t.iter().copied().min().unwrap_or(0);
    println!("BENCH pebs_pmi {} tsc", median(&mut t));
    println!("BENCH pebs_pmi_min {min} tsc");
    println!("BENCH pebs_record_bytes {size} bytes");
    true
}

// ---- Precise-mode speed ----

fn precise_figure() -> bool {
    // SAFETY: PMU MSRs only.
    unsafe {
        msr::wrmsr(IA32_PERFEVTSEL0, 0);
        msr::wrmsr(IA32_PMC0, 0);
        msr::wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
    }
    let (t0, t1): (u64, u64);
    // SAFETY: only PMC0's EVTSEL is written; RCX and R8-R10 are scratch.
    unsafe {
        asm!(
            "rdtsc",
            "shl rdx, 32",
            "or rax, rdx",
            "mov r9, rax",
            "mov ecx, {evtsel:e}",
            "mov eax, {on:e}",
            "xor edx, edx",
            "wrmsr",                  // counted: enables
            "2: dec r8",
            "jnz 2b",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",                  // disables: not counted
            "rdtsc",
            "shl rdx, 32",
            "or rax, rdx",
            "mov r10, rax",
            evtsel = in(reg) IA32_PERFEVTSEL0,
            on = in(reg) low32(EV_INST | EVTSEL_OS | EVTSEL_EN),
            inout("r8") PRECISE_ITERS => _,
            out("r9") t0,
            out("r10") t1,
            out("rax") _, out("rcx") _, out("rdx") _,
            options(nostack),
        );
    }
    let counted = msr::rdmsr(IA32_PMC0);
    // wrmsr + ITERS x (dec, jnz) + xor + xor.
    let want = 1 + 2 * PRECISE_ITERS + 2;
    if counted != want {
        println!(
            "bench precise: counted {counted} instructions, want {want} (is the backend precise?)"
        );
        return false;
    }
    println!("BENCH precise_insns {counted} insns");
    println!("BENCH precise_tsc {} tsc", t1 - t0);
    true
}

// ---- CPL3 workload ----

#[repr(C, align(64))]
struct Arena([u64; 8192]);

static mut ARENA: Arena = Arena([0; 8192]);

/// The CPL3 workload: an xorshift generator storing into a 64 KiB arena.
extern "C" fn workload(iters: u64) -> u64 {
    let arena = (&raw mut ARENA).cast::<u64>();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..iters {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // SAFETY: the index is masked into the arena, which nothing else touches meanwhile.
        unsafe {
            arena
                .add(usize::try_from(x & 8191).unwrap_or(0))
                .write_volatile(i)
        };
    }
    x
}

/// The value of `key=` on the command line.
fn arg(cmd: &str, key: &str) -> Option<u64> {
    cmd.split_whitespace()
        .filter_map(|w| w.split_once('='))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
}

fn workload_figure(cmd: &str) -> bool {
    let hz = arg(cmd, "hz");
    let tsc = arg(cmd, "tsc").unwrap_or(DEFAULT_TSC_HZ);
    if let Some(hz) = hz {
        if hz == 0 {
            println!("bench workload: hz=0");
            return false;
        }
        arm_sampling(tsc / hz);
    }
    let t0 = cpu::rdtsc();
    let r = user::run_user(workload, WORKLOAD_ITERS);
    let t1 = cpu::rdtsc();
    // SAFETY: PMU MSRs only.
    unsafe { msr::wrmsr(IA32_PERFEVTSEL0, 0) };
    REARM.store(0, Ordering::SeqCst);
    if r.is_err() {
        println!("bench workload: the CPL3 workload faulted: {r:?}");
        return false;
    }
    let samples = NMI_COUNT.load(Ordering::SeqCst);
    if hz.is_some() && samples == 0 {
        println!("bench workload: sampling armed but no PMI arrived");
        return false;
    }
    println!("BENCH workload_tsc {} tsc", t1 - t0);
    println!("BENCH workload_samples {samples} pmis");
    true
}

/// PEBS on PMC0 counting core cycles at any CPL, reloaded to `-period` by each assist, one
/// record per PMI; the NMI stub re-arms.
fn arm_sampling(period: u64) {
    install_nmi_stub();
    let ds = pebs::ds_page();
    let base = pebs::buf_page(0);
    let start = (1u64 << WIDTH) - period;
    pebs::ds_setup(
        ds,
        base,
        base,
        base + pebs::BUF_PAGES as u64 * 4096,
        base + 1,
    );
    pebs::set_reset(ds, 0, start);
    REARM_INDEX_PTR.store(ds + pebs::ds::PEBS_INDEX, Ordering::SeqCst);
    REARM_BASE.store(base, Ordering::SeqCst);
    REARM.store(1, Ordering::SeqCst);
    lapic::set_lvtpc(lapic::DELIVERY_NMI);
    clear_status();
    // SAFETY: PMU MSRs only; the DS area is a mapped, writable page of the image.
    unsafe {
        msr::wrmsr(IA32_DS_AREA, ds);
        msr::wrmsr(IA32_PEBS_ENABLE, 1);
        msr::wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
        // Full-width value through PMC0's sign extension needs bit 31 set; write it in two
        // steps: the periods used here (>= 210 000) are below 2^31, so -period has bit 31 set.
        msr::wrmsr(IA32_PMC0, start & 0xffff_ffff);
        msr::wrmsr(
            IA32_PERFEVTSEL0,
            EV_CYCLES | EVTSEL_USR | EVTSEL_OS | EVTSEL_EN,
        );
    }
}
