//! Placeholder guest for `make run`: prints a banner and what CPUID says about the PMU, checks
//! that the MSRs CPUID advertises are readable, and exits. It will later sample with PEBS.

#![no_std]
#![no_main]

use guest_tests::cpu::{self, CPUID_LEAF_PMU, CPUID1_ECX_DTES64, CPUID1_ECX_PDCM, CPUID1_EDX_DS};
use guest_tests::msr_index::{
    IA32_FIXED_CTR0, IA32_PERF_CAPABILITIES, IA32_PERF_GLOBAL_CTRL, IA32_PERFEVTSEL0, IA32_PMC0,
    PERF_CAP_PEBS_FMT_SHIFT,
};
use guest_tests::test::TestResult;
use guest_tests::{ensure, entry, msr, println};

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
    guest_tests::test::run_all(
        "demo",
        guest_tests::tests![pmu_leaf_consistent, pmu_msrs_readable],
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
