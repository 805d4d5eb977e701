//! KVM's paravirtual clock and steal-time records (Documentation/virt/kvm/x86/msr.rst), read
//! only to interpret the perf backend's counts: kvmclock gives the guest TSC rate
//! (`tsc_to_system_mul` / `tsc_shift`, as Linux's `pvclock_tsc_khz` reads them), steal time the
//! nanoseconds the vCPU waited for a host CPU. Both are optional: without them the checks use
//! the model's TSC rate and assume no steal.

use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use guest_tests::{cpu, msr};

/// CPUID leaf with the "KVMKVMKVM" signature.
const KVM_CPUID_SIGNATURE: u32 = 0x4000_0000;
/// CPUID leaf with the paravirtual feature bits in EAX.
const KVM_CPUID_FEATURES: u32 = 0x4000_0001;
/// KVM_FEATURE_CLOCKSOURCE2: MSR_KVM_SYSTEM_TIME_NEW exists.
const FEATURE_CLOCKSOURCE2: u32 = 1 << 3;
/// KVM_FEATURE_STEAL_TIME: MSR_KVM_STEAL_TIME exists.
const FEATURE_STEAL_TIME: u32 = 1 << 5;
/// MSR_KVM_SYSTEM_TIME_NEW: GPA of a `pvclock_vcpu_time_info` | enable.
const MSR_KVM_SYSTEM_TIME_NEW: u32 = 0x4b56_4d01;
/// MSR_KVM_STEAL_TIME: 64-byte aligned GPA of a `kvm_steal_time` | enable.
const MSR_KVM_STEAL_TIME: u32 = 0x4b56_4d03;
/// Enable bit of both MSRs.
const MSR_ENABLED: u64 = 1;

/// `struct pvclock_vcpu_time_info`.
#[repr(C, align(64))]
struct TimeInfo {
    version: u32,
    pad0: u32,
    tsc_timestamp: u64,
    system_time: u64,
    tsc_to_system_mul: u32,
    tsc_shift: i8,
    flags: u8,
    pad: [u8; 2],
}

/// `struct kvm_steal_time` (64 bytes).
#[repr(C, align(64))]
struct StealTime {
    steal: u64,
    version: u32,
    flags: u32,
    rest: [u32; 12],
}

static mut CLOCK: TimeInfo = TimeInfo {
    version: 0,
    pad0: 0,
    tsc_timestamp: 0,
    system_time: 0,
    tsc_to_system_mul: 0,
    tsc_shift: 0,
    flags: 0,
    pad: [0; 2],
};
static mut STEAL: StealTime = StealTime {
    steal: 0,
    version: 0,
    flags: 0,
    rest: [0; 12],
};
static TSC_HZ: AtomicU64 = AtomicU64::new(0);
static STEAL_ON: AtomicBool = AtomicBool::new(false);

/// Enables kvmclock (long enough to read the TSC rate) and steal time, where KVM offers them.
pub fn init() {
    let sig = cpu::cpuid(KVM_CPUID_SIGNATURE, 0);
    let kvm = [sig.ebx, sig.ecx, sig.edx] == [0x4b4d_564b, 0x564b_4d56, 0x4d];
    if !kvm || sig.eax < KVM_CPUID_FEATURES {
        return;
    }
    let features = cpu::cpuid(KVM_CPUID_FEATURES, 0).eax;
    if features & FEATURE_CLOCKSOURCE2 != 0 {
        let gpa = (&raw mut CLOCK) as u64;
        // SAFETY: kvmclock writes a 32-byte record into a static of this guest; a refusal is
        // fixed up.
        if unsafe { msr::wrmsr_safe(MSR_KVM_SYSTEM_TIME_NEW, gpa | MSR_ENABLED) }.is_ok() {
            TSC_HZ.store(read_tsc_hz(), Ordering::SeqCst);
            // SAFETY: turning kvmclock off again stops the host's writes.
            let _ = unsafe { msr::wrmsr_safe(MSR_KVM_SYSTEM_TIME_NEW, 0) };
        }
    }
    if features & FEATURE_STEAL_TIME != 0 {
        let gpa = (&raw mut STEAL) as u64;
        // SAFETY: KVM writes the 64-byte steal record into a static of this guest.
        let ok = unsafe { msr::wrmsr_safe(MSR_KVM_STEAL_TIME, gpa | MSR_ENABLED) }.is_ok();
        STEAL_ON.store(ok, Ordering::SeqCst);
    }
}

/// The TSC rate kvmclock publishes: `10^9 * 2^32 / mul`, shifted by `-tsc_shift`.
fn read_tsc_hz() -> u64 {
    let p = &raw const CLOCK;
    // SAFETY: the host wrote the record before the WRMSR returned; volatile reads of a static.
    let (mul, shift) = unsafe {
        (
            (&raw const (*p).tsc_to_system_mul).read_volatile(),
            (&raw const (*p).tsc_shift).read_volatile(),
        )
    };
    if mul == 0 {
        return 0;
    }
    let hz = (1_000_000_000u128 << 32) / u128::from(mul);
    let hz = if shift < 0 {
        hz << shift.unsigned_abs()
    } else {
        hz >> shift.unsigned_abs()
    };
    u64::try_from(hz).unwrap_or(0)
}

/// The guest TSC rate, if kvmclock told it.
pub fn tsc_hz() -> Option<u64> {
    Some(TSC_HZ.load(Ordering::SeqCst)).filter(|&h| h != 0)
}

/// Whether steal time is on.
pub fn available() -> bool {
    STEAL_ON.load(Ordering::SeqCst)
}

/// Nanoseconds stolen so far (0 without steal time). The version is odd while KVM updates.
pub fn ns() -> u64 {
    if !available() {
        return 0;
    }
    let p = &raw const STEAL;
    loop {
        // SAFETY: volatile reads of a static the host updates between guest entries.
        let (v0, steal, v1) = unsafe {
            let v0 = (&raw const (*p).version).read_volatile();
            let steal = (&raw const (*p).steal).read_volatile();
            let v1 = (&raw const (*p).version).read_volatile();
            (v0, steal, v1)
        };
        if v0 == v1 && v0 % 2 == 0 {
            return steal;
        }
    }
}

/// Address of the steal counter (stays 0 without steal time), for the CPL3 loop to poll.
pub fn ns_ptr() -> u64 {
    (&raw const STEAL) as u64
}
