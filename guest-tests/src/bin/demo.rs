//! Guest for `make run`: prints a banner and what CPUID says about the PMU, checks that the MSRs
//! CPUID advertises are readable, then samples a small CPL0 loop (loads, stores, branches) with
//! PEBS on instructions retired (period 49, so samples walk every loop instruction; adaptive meminfo + GPR groups on formats 4/5) and
//! prints what the records say. It exits with IA32_DS_AREA still programmed and PEBS Index at the
//! end of the records, so `vmm run --dump-pebs` decodes the same buffer at exit.

#![no_std]
#![no_main]

use core::arch::asm;
use guest_tests::cpu::{self, CPUID_LEAF_PMU, CPUID1_ECX_DTES64, CPUID1_ECX_PDCM, CPUID1_EDX_DS};
use guest_tests::msr_index::{
    IA32_FIXED_CTR0, IA32_PERF_CAPABILITIES, IA32_PERF_GLOBAL_CTRL, IA32_PERFEVTSEL0, IA32_PMC0,
    PERF_CAP_PEBS_FMT_SHIFT,
};

use guest_tests::pebs::layout::{self, CFG_GPRS, CFG_MEMINFO, Fmt};
use guest_tests::pebs::{self as pb, Counter, Event};
use guest_tests::racy::Racy;
use guest_tests::test::TestResult;
use guest_tests::{ensure, ensure_eq, entry, msr, println};

/// Leaf 0xA decoded (SDM vol. 2A, CPUID leaf 0AH).
struct PmuLeaf {
    version: u32,
    gp_counters: u32,
    gp_width: u32,
    ebx_len: u32,
    fixed_counters: u32,
    fixed_width: u32,
}

fn pmu_leaf() -> Option<PmuLeaf> {
    if cpu::cpuid(0, 0).eax < CPUID_LEAF_PMU {
        return None;
    }
    let r = cpu::cpuid(CPUID_LEAF_PMU, 0);
    Some(PmuLeaf {
        version: r.eax & 0xff,
        gp_counters: r.eax >> 8 & 0xff,
        gp_width: r.eax >> 16 & 0xff,
        ebx_len: r.eax >> 24 & 0xff,
        fixed_counters: r.edx & 0x1f,
        fixed_width: r.edx >> 5 & 0xff,
    })
}

#[unsafe(no_mangle)]
extern "C" fn guest_main(cpu: u64, mem_size: u64) -> ! {
    entry::init(cpu, mem_size);
    println!("vpmu demo guest: {} MiB RAM", mem_size >> 20);
    report();
    sample();
    guest_tests::test::run_all(
        "demo",
        guest_tests::tests![pmu_leaf_consistent, pmu_msrs_readable, pebs_sampled],
    )
}

fn report() {
    let v = cpu::vendor();
    let l1 = cpu::cpuid(1, 0);
    println!(
        "cpu: {} family/model/stepping signature {:#x}",
        core::str::from_utf8(&v).unwrap_or("?"),
        l1.eax
    );
    println!(
        "cpuid.1: PDCM={} DS={} DTES64={}",
        u8::from(l1.ecx & CPUID1_ECX_PDCM != 0),
        u8::from(l1.edx & CPUID1_EDX_DS != 0),
        u8::from(l1.ecx & CPUID1_ECX_DTES64 != 0)
    );
    match pmu_leaf() {
        None => println!("cpuid.0xa: not reported (max basic leaf below 0xa)"),
        Some(p) => {
            let r = cpu::cpuid(CPUID_LEAF_PMU, 0);
            println!(
                "cpuid.0xa: version {} gp {}x{}b fixed {}x{}b events-len {} unavailable-mask {:#x}",
                p.version,
                p.gp_counters,
                p.gp_width,
                p.fixed_counters,
                p.fixed_width,
                p.ebx_len,
                r.ebx
            );
        }
    }
    if l1.ecx & CPUID1_ECX_PDCM != 0 {
        match msr::rdmsr_safe(IA32_PERF_CAPABILITIES) {
            Ok(c) => println!(
                "perf_capabilities: {c:#x} (PEBS format {})",
                c >> PERF_CAP_PEBS_FMT_SHIFT & 0xf
            ),
            Err(v) => println!("perf_capabilities: exception #{v}"),
        }
    }
}

fn pmu_leaf_consistent() -> TestResult {
    let Some(p) = pmu_leaf() else { return Ok(()) };
    if p.version == 0 {
        // No architectural PMU: SDM says the other fields are meaningless; KVM reports zeros.
        ensure!(
            p.gp_counters == 0 && p.fixed_counters == 0,
            "version 0 with counters"
        );
        return Ok(());
    }
    ensure!(
        (1..=32).contains(&p.gp_counters),
        "{} GP counters",
        p.gp_counters
    );
    ensure!(
        (32..=64).contains(&p.gp_width),
        "GP counter width {}",
        p.gp_width
    );
    ensure!(p.ebx_len <= 32, "EBX vector length {}", p.ebx_len);
    if p.version >= 2 {
        ensure!(
            p.fixed_counters <= 16,
            "{} fixed counters",
            p.fixed_counters
        );
        ensure!(
            p.fixed_counters == 0 || (32..=64).contains(&p.fixed_width),
            "fixed counter width {}",
            p.fixed_width
        );
    }
    Ok(())
}

fn pmu_msrs_readable() -> TestResult {
    let l1 = cpu::cpuid(1, 0);
    if l1.ecx & CPUID1_ECX_PDCM != 0 {
        ensure!(
            msr::rdmsr_safe(IA32_PERF_CAPABILITIES).is_ok(),
            "PDCM set but PERF_CAPABILITIES #GPs"
        );
    }
    let Some(p) = pmu_leaf() else { return Ok(()) };
    for i in 0..p.gp_counters.min(8) {
        ensure!(msr::rdmsr_safe(IA32_PMC0 + i).is_ok(), "IA32_PMC{i} #GPs");
        ensure!(
            msr::rdmsr_safe(IA32_PERFEVTSEL0 + i).is_ok(),
            "IA32_PERFEVTSEL{i} #GPs"
        );
    }
    if p.version >= 2 {
        for i in 0..p.fixed_counters.min(4) {
            ensure!(
                msr::rdmsr_safe(IA32_FIXED_CTR0 + i).is_ok(),
                "IA32_FIXED_CTR{i} #GPs"
            );
        }
        ensure!(
            msr::rdmsr_safe(IA32_PERF_GLOBAL_CTRL).is_ok(),
            "IA32_PERF_GLOBAL_CTRL #GPs"
        );
    }
    Ok(())
}

/// Loop iterations of the sampled workload.
const ITERS: u64 = 64;
/// Instructions the counter sees: the enabling WRMSR, `mov r8`, 6 per iteration, then
/// `mov ecx`, `xor eax`, `xor edx` before the (uncounted) disabling WRMSR.
const WORKLOAD_INSNS: u64 = 2 + 6 * ITERS + 3;
/// Sampling period.
const PERIOD: u64 = 49;

static mut DATA: [u64; 64] = [0; 64];
const _: () = assert!(ITERS == 64, "DATA holds one quadword per iteration");

/// (records written, the counter counted, counter value after), set by [`sample`].
static SAMPLED: Racy<Option<(u64, bool, u64, u64)>> = Racy::new(None);

/// Sample the workload with PEBS and print a summary.
fn sample() {
    let Some(fmt) = layout::detect() else {
        println!("pebs: no PEBS record format recognised");
        return;
    };
    let Some(p) = layout::preset_for(fmt) else {
        return;
    };
    let cfg = if p.baseline {
        CFG_MEMINFO | CFG_GPRS
    } else {
        0
    };
    let size = fmt.record_size(cfg);
    let (ds, base) = (pb::ds_page(), pb::buf_page(0));
    let max = base + (4 * 4096 / size * size) as u64;
    let args = pb::arm(
        p,
        ds,
        Counter::Gp0,
        Event::Instructions,
        PERIOD,
        p.baseline,
        0,
    );
    // Threshold = absolute maximum: the records stay in the buffer, no PMI.
    pb::ds_setup(ds, base, base, max, max);
    pb::set_reset(ds, 0, pb::minus(p, PERIOD));
    if p.baseline {
        // SAFETY: PMU MSR only.
        unsafe { msr::wrmsr(guest_tests::msr_index::MSR_PEBS_DATA_CFG, cfg) };
    }
    #[allow(
        clippy::cast_possible_truncation,
        reason = "splitting into EDX:EAX halves"
    )]
    let (lo, hi) = (args.en_val as u32, (args.en_val >> 32) as u32);
    // SAFETY: only the PMU MSRs of `args` and the DATA array are written.
    unsafe {
        asm!(
            "wrmsr",
            "mov r8, {iters}",
            "2:",
            "mov rax, [r9]",
            "add rax, r8",
            "mov [r9], rax",
            "add r9, 8",
            "dec r8",
            "jnz 2b",
            "mov ecx, {dis:e}",
            "xor eax, eax",
            "xor edx, edx",
            "wrmsr",
            iters = const ITERS,
            dis = in(reg) u32::try_from(args.dis_msr).unwrap_or(0),
            inout("ecx") u32::try_from(args.en_msr).unwrap_or(0) => _,
            inout("eax") lo => _,
            inout("edx") hi => _,
            inout("r9") (&raw mut DATA) as u64 => _,
            out("r8") _,
            options(nostack),
        );
    }
    let counter = pb::counter_value(p, Counter::Gp0);
    let start = pb::minus(p, PERIOD);
    pb::disarm(p);
    let index = pb::ds_index(ds);
    let n = (index - base) / size as u64;
    // Without a backend that counts instructions retired (e.g. `--pmu-backend perf` on a host
    // without a PMU) the counter stays put and nothing is sampled.
    SAMPLED.set(Some((n, counter != start, counter, start)));
    if counter == start {
        println!("pebs: instructions retired did not count (use --pmu-backend precise)");
    }
    println!(
        "pebs: {fmt:?} records of {size} bytes, period {PERIOD}: {n} records over {WORKLOAD_INSNS} instructions"
    );
    for i in 0..n.min(4) {
        let rec = base + i * size as u64;
        let ip = pb::rd64(rec + 8);
        match fmt {
            Fmt::F2 | Fmt::F3 => println!(
                "  record {i}: ip {ip:#x} eventing ip {:#x} r8 {:#x}",
                pb::rd64(rec + 0xB0),
                pb::rd64(rec + 0x50)
            ),
            Fmt::F4 | Fmt::F5 => println!(
                "  record {i}: eventing ip {ip:#x} data address {:#x}",
                pb::rd64(rec + 0x20)
            ),
            _ => println!("  record {i}: ip {ip:#x} r8 {:#x}", pb::rd64(rec + 0x50)),
        }
    }
    println!("pebs: IA32_DS_AREA left at {ds:#x} (run with --dump-pebs to decode the buffer)");
}

/// The sampled run wrote one record per PERIOD instructions and left the counter at its reset
/// value plus the instructions after the last record; without counting, no record at all.
fn pebs_sampled() -> TestResult {
    let Some((n, counted, counter, start)) = SAMPLED.get() else {
        guest_tests::fail!("no PEBS sample taken");
    };
    if !counted {
        ensure_eq!(n, 0, "PEBS records without counting");
        return Ok(());
    }
    ensure_eq!(n, WORKLOAD_INSNS / PERIOD, "PEBS records");
    ensure_eq!(
        counter,
        start + WORKLOAD_INSNS % PERIOD,
        "counter after the workload"
    );
    Ok(())
}
