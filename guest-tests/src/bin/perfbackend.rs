//! The host-counter backend seen from a guest (run with `--pmu-backend perf`, on `skylake` for
//! legacy format-3 PEBS on PMC0 and on `icelake-server` for adaptive PEBS on fixed counter 1).
//!
//! On a host without a hardware PMU the backend counts unhalted core cycles as the vCPU
//! thread's task clock scaled to the model's TSC rate, and learns of an overflow through a
//! signal that interrupts KVM_RUN; the PEBS record then carries the guest state at that exit,
//! not at the overflow. These tests check the sampling rate against the guest TSC, that the
//! record IPs land in the sampled CPL3 loop, that counting mode is monotonic, that an event the
//! host cannot back stays at 0, and they measure the skid.
//!
//! Time on the host is CPU time of the vCPU thread; the guest TSC is wall time. The two agree
//! only while the thread runs, so the rate checks subtract the time KVM's steal-time record says
//! the vCPU waited for a host CPU (see [`steal`]), when the host offers it.

#![no_std]
#![no_main]

#[path = "perfbackend/steal.rs"]
mod steal;

use core::arch::global_asm;

use guest_tests::msr_index::{
    FIXED_CTRL_ADAPTIVE_SHIFT, FIXED_CTRL_OS, FIXED_CTRL_USR, IA32_DS_AREA, IA32_FIXED_CTR_CTRL,
    IA32_FIXED_CTR0, IA32_PEBS_ENABLE, IA32_PERF_GLOBAL_CTRL, IA32_PERF_GLOBAL_OVF_CTRL,
    IA32_PERF_GLOBAL_STATUS, IA32_PERFEVTSEL0, IA32_PMC0, MSR_PEBS_DATA_CFG,
};
use guest_tests::pebs::layout::{self, Fmt, adaptive, legacy};
use guest_tests::pebs::{ds_index, ds_setup, fill, rd64, set_reset};
use guest_tests::test::TestResult;
use guest_tests::{cpu, ensure, ensure_eq, entry, lapic, msr, pmi, println, user};

/// EVTSEL: unhalted core cycles (3CH umask 00H), USR, OS, EN.
const CYCLES_USR_OS: u64 = 0x3C | 1 << 16 | 1 << 17 | 1 << 22;
/// EVTSEL: instructions retired (C0H), USR, OS, EN: not time-based, refused by the clock.
const INST_USR_OS: u64 = 0xC0 | 1 << 16 | 1 << 17 | 1 << 22;
/// Counter width of both presets.
const WIDTH_MASK: u64 = (1 << 48) - 1;
/// Fixed counter 1 (unhalted core cycles) in FIXED_CTR_CTRL: its 4-bit field.
const FIXED1_SHIFT: u32 = 4;
/// IA32_FIXED_CTR1 (unhalted core cycles).
const IA32_FIXED_CTR1: u32 = IA32_FIXED_CTR0 + 1;
/// Status / enable bit of fixed counter 1.
const FIXED1_BIT: u64 = 1 << 33;
/// Sampling run length in PEBS periods (1 ms each).
const SAMPLE_PERIODS: u64 = 200;
/// Pattern the PEBS buffer is filled with, to see how far the VMM wrote.
const FILL: u8 = 0xA5;

/// Buffer pages: room for 490 format-3 records, far more than a run writes (200 expected,
/// 270 at +35 %), so the buffer never fills and no threshold PMI is needed.
const BUF_PAGES: usize = 24;
const BUF_LEN: usize = BUF_PAGES * 4096;

#[repr(C, align(4096))]
struct Pages<const N: usize>([u8; N]);

static mut DS_AREA: Pages<4096> = Pages([0; 4096]);
static mut PEBS_BUF: Pages<BUF_LEN> = Pages([0; BUF_LEN]);

fn ds_la() -> u64 {
    (&raw mut DS_AREA) as u64
}

fn buf_la() -> u64 {
    (&raw mut PEBS_BUF) as u64
}

// The sampled CPL3 loop. RDI points at a [`SpinArgs`]: it spins until the TSC passes
// `ticks` after entry, and logs (TSC, steal ns) whenever the steal-time record changes (entry 0
// is the start), so the host's descheduling of the vCPU can be placed in time. Every
// instruction between `perfbackend_spin` and `perfbackend_spin_end` belongs to it, so a record
// whose IP is in that range was taken while the loop ran.
global_asm!(
    ".pushsection .text.perfbackend_spin, \"ax\"",
    ".global perfbackend_spin",
    ".global perfbackend_spin_end",
    "perfbackend_spin:",
    "mov r9, [rdi + 8]",   // steal ns pointer
    "mov r10, [rdi + 16]", // log
    "xor ecx, ecx",        // log length
    "rdtsc",
    "shl rdx, 32",
    "or rax, rdx",
    "mov rsi, [rdi]",
    "add rsi, rax", // deadline
    "mov r8, [r9]",
    "jmp 3f",
    "2:",
    "rdtsc",
    "shl rdx, 32",
    "or rax, rdx",
    "mov rdx, [r9]",
    "cmp rdx, r8",
    "jne 4f",
    "5:",
    "cmp rax, rsi",
    "jb 2b",
    "mov [rdi + 32], rcx",
    "ret",
    "4:",
    "mov r8, rdx",
    "3:",
    "cmp rcx, [rdi + 24]",
    "jae 5b",
    "lea rdx, [rcx + rcx]",
    "mov [r10 + rdx * 8], rax",
    "mov [r10 + rdx * 8 + 8], r8",
    "inc rcx",
    "jmp 5b",
    "perfbackend_spin_end:",
    ".popsection",
);

/// What the CPL3 loop reads and writes (offsets fixed by the assembly).
#[repr(C)]
struct SpinArgs {
    ticks: u64,
    steal_ns: u64,
    log: u64,
    log_cap: u64,
    log_len: u64,
}

/// Steal-time changes the loop can log.
const LOG_CAP: usize = 2048;
/// (TSC, steal ns) pairs.
static mut STEAL_LOG: [[u64; 2]; LOG_CAP] = [[0; 2]; LOG_CAP];
static mut SPIN_ARGS: SpinArgs = SpinArgs {
    ticks: 0,
    steal_ns: 0,
    log: 0,
    log_cap: 0,
    log_len: 0,
};

unsafe extern "C" {
    static perfbackend_spin: u8;
    static perfbackend_spin_end: u8;
}

/// `[start, end)` of the sampled loop.
fn spin_range() -> (u64, u64) {
    (
        (&raw const perfbackend_spin) as u64,
        (&raw const perfbackend_spin_end) as u64,
    )
}

/// Runs the loop at CPL3 for `ticks` TSC ticks; returns the steal log it wrote.
fn spin_user(ticks: u64) -> Result<&'static [[u64; 2]], guest_tests::test::Msg> {
    let args = &raw mut SPIN_ARGS;
    // SAFETY: nothing else uses the static while the loop is not running.
    unsafe {
        args.write(SpinArgs {
            ticks,
            steal_ns: steal::ns_ptr(),
            log: (&raw mut STEAL_LOG) as u64,
            log_cap: LOG_CAP as u64,
            log_len: 0,
        })
    };
    if let Err(f) = user::run_user_at(spin_range().0, args as u64) {
        guest_tests::fail!("the CPL3 loop faulted: #{} at {:#x}", f.vector, f.rip);
    }
    // SAFETY: the loop has returned; it wrote `log_len <= LOG_CAP` entries.
    unsafe {
        let len = usize::try_from((&raw const (*args).log_len).read_volatile())
            .unwrap_or(0)
            .min(LOG_CAP);
        Ok(core::slice::from_raw_parts(
            (&raw const STEAL_LOG).cast::<[u64; 2]>(),
            len,
        ))
    }
}

/// The preset this run boots, as its PEBS format tells.
#[derive(Clone, Copy)]
struct Preset {
    fmt: Fmt,
    /// The model's TSC rate (resources/cpu-models/*.toml): the perf backend scales the task
    /// clock to it.
    model_tsc_hz: u64,
}

fn preset() -> Result<Preset, guest_tests::test::Msg> {
    match layout::detect() {
        Some(Fmt::F3) => Ok(Preset {
            fmt: Fmt::F3,
            model_tsc_hz: 2_100_000_000,
        }),
        Some(Fmt::F4) => Ok(Preset {
            fmt: Fmt::F4,
            model_tsc_hz: 2_000_000_000,
        }),
        _ => Err(guest_tests::test::Msg::from_fmt(format_args!(
            "run on --cpu-model skylake or icelake-server"
        ))),
    }
}

#[unsafe(no_mangle)]
extern "C" fn guest_main(cpu: u64, mem_size: u64) -> ! {
    entry::init(cpu, mem_size);
    // No PMI is expected: keep LVTPC masked so a stray one cannot hit a test.
    lapic::set_lvtpc(pmi::lvtpc_fixed() | lapic::LVT_MASKED);
    steal::init();
    guest_tests::test::run_all(
        "perfbackend",
        guest_tests::tests![
            tsc_rate_report,
            counting_monotonic,
            pebs_sampling_rate,
            unsupported_event,
        ],
    )
}

/// Everything off, overflow status clear.
fn disarm(p: Preset) {
    // SAFETY: PMU MSRs only.
    unsafe {
        msr::wrmsr(IA32_PERF_GLOBAL_CTRL, 0);
        msr::wrmsr(IA32_PEBS_ENABLE, 0);
        msr::wrmsr(IA32_PERFEVTSEL0, 0);
        msr::wrmsr(IA32_FIXED_CTR_CTRL, 0);
        if p.fmt == Fmt::F4 {
            msr::wrmsr(MSR_PEBS_DATA_CFG, 0);
        }
        msr::wrmsr(IA32_PMC0, 0);
        let st = msr::rdmsr(IA32_PERF_GLOBAL_STATUS);
        msr::wrmsr(IA32_PERF_GLOBAL_OVF_CTRL, st);
    }
}

/// `a * b / c` without overflow (c > 0).
fn muldiv(a: u64, b: u64, c: u64) -> u64 {
    u64::try_from(u128::from(a) * u128::from(b) / u128::from(c.max(1))).unwrap_or(u64::MAX)
}

/// Guest TSC ticks the vCPU spent running during `[t0, t1]`: the interval less the steal time
/// the host recorded meanwhile (`steal0`, `steal1` in ns), converted at `tsc_hz`.
fn running_ticks(t0: u64, t1: u64, steal0: u64, steal1: u64, tsc_hz: u64) -> u64 {
    let stolen = muldiv(steal1.saturating_sub(steal0), tsc_hz, 1_000_000_000);
    (t1 - t0).saturating_sub(stolen)
}

/// Counter cycles per guest TSC tick, in parts per thousand.
fn permille(count: u64, ticks: u64) -> u64 {
    muldiv(count, 1000, ticks)
}

/// Prints the guest TSC rate (from kvmclock, when offered) and the model's: the backend counts
/// cycles at the model's rate, the guest TSC ticks at the host's unless KVM scales it.
fn tsc_rate_report() -> TestResult {
    let p = preset()?;
    match steal::tsc_hz() {
        Some(hz) => println!(
            "  tsc: guest {} kHz, model {} kHz, steal time {}",
            hz / 1000,
            p.model_tsc_hz / 1000,
            if steal::available() { "on" } else { "off" }
        ),
        None => println!("  tsc: no kvmclock; model {} kHz", p.model_tsc_hz / 1000),
    }
    Ok(())
}

/// The guest TSC rate the checks assume: kvmclock's, else the model's.
fn guest_tsc_hz(p: Preset) -> u64 {
    steal::tsc_hz().unwrap_or(p.model_tsc_hz)
}

/// Counting mode: PMC0 counts core cycles with no PMI and no PEBS; RDMSRs at CPL0 between
/// CPL3 spins see a strictly increasing value whose increments follow the guest TSC.
fn counting_monotonic() -> TestResult {
    let p = preset()?;
    disarm(p);
    // SAFETY: PMU MSRs only.
    unsafe {
        msr::wrmsr(IA32_PERFEVTSEL0, CYCLES_USR_OS);
        msr::wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
    }
    let tsc_hz = guest_tsc_hz(p);
    let slice = tsc_hz / 500; // 2 ms of CPL3 spinning per step
    let mut prev = msr::rdmsr(IA32_PMC0);
    // Back-to-back reads at CPL0: every read collects the host count, which only grows.
    for _ in 0..8 {
        let v = msr::rdmsr(IA32_PMC0);
        ensure!(v > prev, "CPL0 reads not increasing: {prev} then {v}");
        prev = v;
    }
    let (c0, t0, s0) = (msr::rdmsr(IA32_PMC0), cpu::rdtsc(), steal::ns());
    prev = c0;
    for i in 0..20 {
        spin_user(slice)?;
        let v = msr::rdmsr(IA32_PMC0);
        ensure!(v > prev, "step {i}: {prev} then {v}");
        prev = v;
    }
    let (c1, t1, s1) = (prev, cpu::rdtsc(), steal::ns());
    disarm(p);
    let counted = c1 - c0;
    let ran = running_ticks(t0, t1, s0, s1, tsc_hz);
    // Cycles at the model's rate for every ns the thread ran, against TSC ticks at the guest's.
    // The VMM counts core cycles at the guest TSC rate (the model's where KVM can scale the
    // TSC, else the host's), so expected counts follow the TSC the guest measures.
    let expect = ran;
    let pm = permille(counted, expect.max(1));
    println!(
        "  counting: {counted} cycles over {} TSC ticks ({ran} running): {pm} permille of expected",
        t1 - t0
    );
    // The host clock counts VMM exit handling too and the steal record is only as fresh as the
    // last vCPU load, so a loaded host blurs the agreement: 25 % either way.
    ensure!(
        (750..=1250).contains(&pm),
        "counted {counted}, expected {expect} (+-25 %)"
    );
    Ok(())
}

/// Where the sampling counter sits and how its records look.
#[derive(Clone, Copy)]
struct Sampler {
    /// Record size.
    size: u64,
    /// Offset of the (trap-like) IP, of the TSC, of the applicable-counters field.
    ip: u64,
    tsc: u64,
    applicable: u64,
    /// Status bit of the counter.
    bit: u64,
}

fn sampler(p: Preset) -> Sampler {
    match p.fmt {
        Fmt::F4 => Sampler {
            size: adaptive::BASIC as u64,
            ip: adaptive::IP as u64,
            tsc: adaptive::TSC as u64,
            applicable: adaptive::APPLICABLE as u64,
            bit: FIXED1_BIT,
        },
        _ => Sampler {
            size: p.fmt.record_size(0) as u64,
            ip: legacy::IP as u64,
            tsc: legacy::TSC as u64,
            applicable: legacy::STATUS as u64,
            bit: 1,
        },
    }
}

/// Arms the PEBS counter to wrap every `period` cycles (skylake: PMC0; icelake-server: fixed
/// counter 1 with adaptive records) and enables it with the last WRMSR.
fn arm(p: Preset, s: Sampler, period: u64) {
    let start = (1u64 << 48) - period;
    fill(buf_la(), BUF_LEN, FILL);
    let cap = BUF_LEN as u64 / s.size;
    let max = buf_la() + cap * s.size;
    // Threshold at the absolute maximum: the buffer never fills in a run, so no PMI.
    ds_setup(ds_la(), buf_la(), buf_la(), max, max);
    // SAFETY: PMU MSRs only; the DS area is a mapped, writable static.
    unsafe {
        msr::wrmsr(IA32_DS_AREA, ds_la());
        if p.fmt == Fmt::F4 {
            set_reset(ds_la(), p.fmt.fixed_reset_slot(1), start);
            msr::wrmsr(IA32_FIXED_CTR1, start);
            msr::wrmsr(
                IA32_FIXED_CTR_CTRL,
                (FIXED_CTRL_OS | FIXED_CTRL_USR) << FIXED1_SHIFT
                    | 1 << (FIXED_CTRL_ADAPTIVE_SHIFT + FIXED1_SHIFT),
            );
            msr::wrmsr(IA32_PEBS_ENABLE, FIXED1_BIT);
            msr::wrmsr(IA32_PERF_GLOBAL_CTRL, FIXED1_BIT);
        } else {
            set_reset(ds_la(), 0, start);
            // IA32_PMC0 sign-extends bit 31, which -period has set.
            msr::wrmsr(IA32_PMC0, start & 0xFFFF_FFFF);
            msr::wrmsr(IA32_PERFEVTSEL0, CYCLES_USR_OS);
            msr::wrmsr(IA32_PEBS_ENABLE, 1);
            msr::wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
        }
    }
}

fn counter_value(p: Preset) -> u64 {
    if p.fmt == Fmt::F4 {
        msr::rdmsr(IA32_FIXED_CTR1)
    } else {
        msr::rdmsr(IA32_PMC0)
    }
}

/// Most records a run may have (the buffer holds more).
const MAX_RECORDS: usize = 400;

/// PEBS on unhalted core cycles, one record per ms of vCPU time, over a 200 ms CPL3 loop.
fn pebs_sampling_rate() -> TestResult {
    let p = preset()?;
    let s = sampler(p);
    let tsc_hz = guest_tsc_hz(p);
    // 1 ms of counted cycles at the model's rate (2.1 M on skylake).
    let period = p.model_tsc_hz / 1000;
    disarm(p);
    arm(p, s, period);
    let (t_en, s_en) = (cpu::rdtsc(), steal::ns());
    let spun = spin_user(SAMPLE_PERIODS * tsc_hz / 1000);
    // SAFETY: PMU MSRs only.
    unsafe { msr::wrmsr(IA32_PERF_GLOBAL_CTRL, 0) };
    let (t_dis, s_dis) = (cpu::rdtsc(), steal::ns());
    let left = counter_value(p);
    disarm(p);
    let log = spun?;

    let used = ds_index(ds_la()) - buf_la();
    ensure!(
        used.is_multiple_of(s.size),
        "PEBS Index advanced by {used:#x}, not a multiple of {:#x}",
        s.size
    );
    let n = usize::try_from(used / s.size).unwrap_or(usize::MAX);
    ensure!(n > 0, "no PEBS records in {} TSC ticks", t_dis - t_en);
    ensure!(n <= MAX_RECORDS, "{n} records, more than {MAX_RECORDS}");
    // The VMM wrote exactly n records of this size: the bytes after them are untouched.
    ensure!(
        rd64(buf_la() + used) == u64::from_ne_bytes([FILL; 8]),
        "bytes written past record {n} (record size is not {:#x})",
        s.size
    );

    // Every wrap wrote a record: what the counter holds now is less than one period past the
    // reload value, so counted = n * period + (left - reload).
    let since_reload = left.wrapping_sub((1u64 << 48) - period) & WIDTH_MASK;
    ensure!(
        since_reload < period,
        "counter {left:#x} is {since_reload} past its reload: a wrap wrote no record"
    );
    let counted = n as u64 * period + since_reload;

    let (lo, hi) = spin_range();
    let mut inside = 0usize;
    let mut tscs = [0u64; MAX_RECORDS];
    let mut prev_tsc = t_en;
    for (k, t) in tscs.iter_mut().enumerate().take(n) {
        let rec = buf_la() + k as u64 * s.size;
        if p.fmt == Fmt::F4 {
            let fmt_size = rd64(rec + adaptive::FORMAT_SIZE as u64);
            ensure_eq!(fmt_size, s.size << 48, "adaptive record format/size");
        }
        ensure_eq!(rd64(rec + s.applicable), s.bit, "applicable counters");
        let ip = rd64(rec + s.ip);
        if (lo..hi).contains(&ip) {
            inside += 1;
        } else {
            println!("  record {k}: IP {ip:#x} outside the loop");
        }
        *t = rd64(rec + s.tsc);
        ensure!(
            *t >= prev_tsc && *t <= t_dis,
            "record {k}: TSC {} not in [{prev_tsc}, {t_dis}]",
            *t
        );
        prev_tsc = *t;
    }
    // The loop is all the run does apart from a few µs of CPL0 entry/exit, but a signal that
    // lands there (or in a host exit around it) records that IP: 90 % must be in the loop.
    ensure!(
        inside * 10 >= n * 9,
        "only {inside} of {n} record IPs inside the loop"
    );

    let elapsed = t_dis - t_en;
    let ran = running_ticks(t_en, t_dis, s_en, s_dis, tsc_hz);
    // Records expected from the time the vCPU ran: one per `period` model cycles.
    let expect = ran / period;
    println!(
        "  sampling: {n} records ({inside} in the loop), {counted} cycles counted, {elapsed} TSC ticks ({ran} running), {expect} records expected"
    );
    // Tolerance 35 %: the host clock is the vCPU thread's CPU time, which includes VMM exit
    // handling (every overflow is an exit plus a record write) and CPL0 emulation, and the
    // steal-time correction is only as fresh as the last vCPU load.
    ensure!(
        n as u64 * 100 >= expect * 65 && n as u64 * 100 <= expect * 135 + 100,
        "{n} records, expected {expect} +-35 %"
    );

    let clock = RunClock {
        t_en,
        s_en,
        log,
        tsc_hz,
    };
    report_skid(&tscs[..n], &clock, period)
}

/// The vCPU's running time during a sampling run, from the loop's steal log.
struct RunClock {
    /// TSC and steal ns at enable.
    t_en: u64,
    s_en: u64,
    /// (TSC, steal ns) at the loop's start and at each change.
    log: &'static [[u64; 2]],
    tsc_hz: u64,
}

impl RunClock {
    /// The TSC before which the vCPU was never descheduled since enable: the first log entry
    /// with more steal than at enable (KVM publishes steal at the entry after the wait).
    fn undisturbed_until(&self) -> u64 {
        self.log
            .iter()
            .find(|&&[_, s]| s != self.s_en)
            .map_or(u64::MAX, |&[t, _]| t)
    }
}

/// Skid: the guest TSC in a record minus the TSC at which the counter crossed zero. Crossing
/// k is `k * period` counted cycles after enable; while the vCPU thread is not descheduled the
/// counter runs with the TSC (at the model's rate), so crossing k is `k * period_ticks` after
/// enable. Only records before the first steal-time change are used: after it, where the
/// crossing lies depends on when the host ran the thread, which the steal record tells only
/// to the nearest reschedule. Prints `skid: median N cycles (M us) over K records`, or
/// `skid: not measured` when the host descheduled the vCPU before the first record.
fn report_skid(tscs: &[u64], clock: &RunClock, period_ticks: u64) -> TestResult {
    let until = clock.undisturbed_until();
    let mut skids = [0i64; MAX_RECORDS];
    let mut n = 0;
    for (k, &t) in tscs.iter().enumerate() {
        if t >= until {
            break;
        }
        let crossing = clock.t_en + (k as u64 + 1) * period_ticks;
        skids[n] =
            i64::try_from(t).unwrap_or(i64::MAX) - i64::try_from(crossing).unwrap_or(i64::MAX);
        n += 1;
    }
    if n == 0 {
        println!(
            "  skid: not measured (the host descheduled the vCPU before the first record; {} steal changes)",
            clock.log.len().saturating_sub(1)
        );
        return Ok(());
    }
    let skids = &mut skids[..n];
    skids.sort_unstable();
    let median = skids[n / 2];
    let us_x10 = median * 10_000_000 / i64::try_from(clock.tsc_hz).unwrap_or(i64::MAX);
    println!(
        "  skid: median {median} cycles ({}.{} us) over {n} records; min {} max {}",
        us_x10 / 10,
        (us_x10 % 10).abs(),
        skids[0],
        skids[n - 1],
    );
    Ok(())
}

/// Instructions retired cannot be backed by the host clock: the VMM refuses the event (one
/// message on stderr, checked by the harness) and the counter stays 0.
fn unsupported_event() -> TestResult {
    let p = preset()?;
    disarm(p);
    // SAFETY: PMU MSRs only.
    unsafe {
        msr::wrmsr(IA32_PMC0, 0);
        msr::wrmsr(IA32_PERFEVTSEL0, INST_USR_OS);
        msr::wrmsr(IA32_PERF_GLOBAL_CTRL, 1);
    }
    let slice = guest_tsc_hz(p) / 1000;
    spin_user(slice)?;
    let a = msr::rdmsr(IA32_PMC0);
    // Reprogramming the same event must not print the message again.
    // SAFETY: PMU MSRs only.
    unsafe { msr::wrmsr(IA32_PMC0, 0) };
    spin_user(slice)?;
    let b = msr::rdmsr(IA32_PMC0);
    disarm(p);
    ensure_eq!(a, 0, "instructions retired after 1 ms");
    ensure_eq!(b, 0, "instructions retired after reprogramming");
    Ok(())
}
