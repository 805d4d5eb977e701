//! Host perf attributes for guest counters: which host event backs a guest counter, with what
//! privilege filters, sample period and scale. Pure functions over [`CounterProgram`], so the
//! hardware path is unit-tested on hosts without a PMU (like the development host).
//!
//! Hardware mode follows KVM's own mapping (arch/x86/kvm/pmu.c): the guest's event select
//! becomes a raw host event (`exclude_host = 1`, `exclude_user = !USR`, `exclude_kernel =
//! !OS`). `exclude_host` on a task that is not a vCPU counts nothing, because the host PMU
//! only enables such events across VM entry (Intel: the perf-guest-switch MSR lists; AMD: the
//! GuestOnly bit). On a vCPU thread it counts guest mode only, and the CPL filters then apply
//! to the guest's CPL, which is the SDM's meaning of USR/OS.
//!
//! Clock mode (no host PMU): only the time-based events exist. Unhalted core and reference
//! cycles become the thread's task clock, with kernel time included (KVM_RUN is kernel time),
//! scaled from nanoseconds to guest TSC ticks. Limits, documented rather than hidden: the
//! clock cannot see the guest CPL, so a USR-only or OS-only cycles counter counts all vCPU
//! time; it includes the VMM's exit handling on the vCPU thread; and the kernel arms its
//! hrtimer for at least 10 µs, so overflows closer than that arrive late.

use thiserror::Error;
use vpmu::counter::{CounterId, CounterProgram, Event};
use vpmu::msr::{
    EVTSEL_CMASK_MASK, EVTSEL_CMASK_SHIFT, EVTSEL_EDGE, EVTSEL_EVENT_MASK, EVTSEL_INV,
    EVTSEL_UMASK_MASK, EVTSEL_UMASK_SHIFT,
};

/// Nanoseconds per second: the task clock counts nanoseconds.
pub const NS_PER_SEC: u64 = 1_000_000_000;

/// `PERF_COUNT_HW_*` numbers (include/uapi/linux/perf_event.h), used for fixed and NetBurst
/// counters whose selector has no portable raw encoding.
pub mod hw {
    /// PERF_COUNT_HW_CPU_CYCLES.
    pub const CPU_CYCLES: u64 = 0;
    /// PERF_COUNT_HW_INSTRUCTIONS.
    pub const INSTRUCTIONS: u64 = 1;
    /// PERF_COUNT_HW_BRANCH_INSTRUCTIONS.
    pub const BRANCH_INSTRUCTIONS: u64 = 4;
    /// PERF_COUNT_HW_BRANCH_MISSES.
    pub const BRANCH_MISSES: u64 = 5;
    /// PERF_COUNT_HW_REF_CPU_CYCLES.
    pub const REF_CPU_CYCLES: u64 = 9;
}

/// What the host can count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostEvents {
    /// The host has a hardware PMU: guest events map to host hardware events.
    Hardware,
    /// No host PMU: time-based guest events map to the task clock; others are refused.
    Clock,
}

/// The host event kind (`perf_event_attr.type` and `.config`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostKind {
    /// `PERF_TYPE_RAW` with this config (the IA32_PERFEVTSELx layout on x86).
    Raw(u64),
    /// `PERF_TYPE_HARDWARE` with this `PERF_COUNT_HW_*` config.
    Hardware(u64),
    /// `PERF_TYPE_SOFTWARE`, `PERF_COUNT_SW_TASK_CLOCK` (nanoseconds on this thread).
    TaskClock,
}

/// Host units to guest events: `guest = host * num / den`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scale {
    /// Numerator (>= 1).
    pub num: u64,
    /// Denominator (>= 1).
    pub den: u64,
}

impl Scale {
    /// One host event is one guest event.
    pub const ONE: Scale = Scale { num: 1, den: 1 };

    /// Task-clock nanoseconds to ticks of a `tsc_hz` TSC (0 is taken as 1 Hz).
    pub fn tsc(tsc_hz: u64) -> Scale {
        Scale {
            num: tsc_hz.max(1),
            den: NS_PER_SEC,
        }
    }

    /// Host units that make at least `guest` guest events (>= 1): the sample period for a
    /// guest counter `guest` events from overflow, rounded up so the signal never comes early.
    pub fn host_units_for(self, guest: u64) -> u64 {
        let num = u128::from(self.num.max(1));
        let units = (u128::from(guest.max(1)) * u128::from(self.den)).div_ceil(num);
        // The kernel rejects periods with bit 63 set; such a distance never overflows anyway.
        u64::try_from(units)
            .unwrap_or(u64::MAX)
            .clamp(1, i64::MAX.unsigned_abs())
    }

    /// Converts `host` new host units, carrying the fraction of a guest event in `rem`
    /// (always `< den`) so that repeated conversions lose nothing.
    pub fn to_guest(self, host: u64, rem: &mut u64) -> u64 {
        let den = self.den.max(1);
        let total = u128::from(host) * u128::from(self.num) + u128::from(*rem);
        // `total % den < den <= u64::MAX`.
        *rem = u64::try_from(total % u128::from(den)).unwrap_or(0);
        u64::try_from(total / u128::from(den)).unwrap_or(u64::MAX)
    }
}

/// Everything that decides the host event of one guest counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostAttr {
    /// Type and config.
    pub kind: HostKind,
    /// `perf_event_attr.exclude_user`.
    pub exclude_user: bool,
    /// `perf_event_attr.exclude_kernel`.
    pub exclude_kernel: bool,
    /// `perf_event_attr.exclude_host` (count guest mode only).
    pub exclude_host: bool,
    /// Host units between overflow signals; 0 = counting only, no signal (the guest counter
    /// neither interrupts nor feeds PEBS, so its overflow can wait for the next exit).
    pub sample_period: u64,
    /// Host units to guest events.
    pub scale: Scale,
}

impl HostAttr {
    /// `other` can reuse this attribute's host event, at most changing its period with
    /// PERF_EVENT_IOC_PERIOD (which the kernel refuses on a counting-only event).
    pub fn same_event(&self, other: &HostAttr) -> bool {
        self.kind == other.kind
            && self.exclude_user == other.exclude_user
            && self.exclude_kernel == other.exclude_kernel
            && self.exclude_host == other.exclude_host
            && self.scale == other.scale
            && (self.sample_period == 0) == (other.sample_period == 0)
    }
}

/// Why a guest counter has no host event.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum AttrError {
    /// Clock mode and an event that is not time-based.
    #[error(
        "{event} cannot be counted: this host has no hardware PMU, and the perf backend backs only {CLOCK_EVENTS} with the host task clock; use `--pmu-backend precise` to count it exactly"
    )]
    NotTimeBased {
        /// The event, described.
        event: String,
    },
    /// Clock mode and a cycles counter with edge detect (it counts halt-to-run transitions,
    /// which the clock cannot see).
    #[error(
        "{event} with edge detect cannot be counted: this host has no hardware PMU, and the perf backend backs only {CLOCK_EVENTS} (without edge detect) with the host task clock; use `--pmu-backend precise` to count it exactly"
    )]
    EdgeOnClock {
        /// The event, described.
        event: String,
    },
    /// Hardware mode and a NetBurst event with no generic host equivalent.
    #[error(
        "{event} on a NetBurst counter has no host equivalent (the perf backend maps NetBurst counters to instructions, cycles, branches and branch misses only); use `--pmu-backend precise` to count it exactly"
    )]
    NoHostEquivalent {
        /// The event, described.
        event: String,
    },
}

/// The events clock mode backs, as the refusal names them.
pub const CLOCK_EVENTS: &str = "unhalted core cycles and unhalted reference cycles (event 3CH umask 00H/01H, fixed counters 1 and 2)";

/// Human name of an event for messages.
pub fn describe_event(event: &Event) -> String {
    match event {
        Event::InstructionsRetired => "instructions retired".into(),
        Event::BranchesRetired { umask } => {
            format!("branch instructions retired (event C4H umask {umask:02X}H)")
        }
        Event::BranchMisses => "mispredicted branches retired (event C5H)".into(),
        Event::LoadsRetired => "loads retired".into(),
        Event::StoresRetired => "stores retired".into(),
        Event::CoreCycles => "unhalted core cycles".into(),
        Event::RefCycles => "unhalted reference cycles".into(),
        Event::Other { event, umask } => format!("event {event:02X}H umask {umask:02X}H"),
        Event::Netburst { escr, event, mask } => {
            format!("NetBurst event {event:#x} mask {mask:#x} (ESCR {escr:#x})")
        }
    }
}

/// The host event for `p`, or `None` when the counter counts at no privilege level (it
/// needs no host event at all). `scale` converts the host event's units (clock mode:
/// [`Scale::tsc`]).
pub fn host_attr(
    events: HostEvents,
    tsc_hz: u64,
    p: &CounterProgram,
) -> Result<Option<HostAttr>, AttrError> {
    if !p.usr && !p.os {
        return Ok(None);
    }
    let attr = match events {
        HostEvents::Hardware => hardware_attr(p)?,
        HostEvents::Clock => clock_attr(tsc_hz, p)?,
    };
    Ok(Some(attr))
}

/// A counter that must tell the VMM when it overflows: it raises a PMI or feeds PEBS.
fn wants_signal(p: &CounterProgram) -> bool {
    p.pmi || p.pebs
}

/// Hardware mode: KVM's mapping. GP counters pass the guest's event select (event, umask,
/// edge, inv, cmask) as a raw host event. AnyThread is dropped as KVM does: a per-thread host
/// event cannot count the sibling thread for one vCPU. This assumes the guest CPU model's
/// event encodings match the host's, which holds for the architectural events (SDM Table
/// 18-1) on every Intel host. Fixed and NetBurst counters use the generic hardware events.
fn hardware_attr(p: &CounterProgram) -> Result<HostAttr, AttrError> {
    let kind = match p.id {
        CounterId::Gp(_) => HostKind::Raw(raw_config(p)),
        CounterId::Fixed(_) | CounterId::Netburst(_) => generic_kind(p)?,
    };
    Ok(HostAttr {
        kind,
        exclude_user: !p.usr,
        exclude_kernel: !p.os,
        exclude_host: true,
        sample_period: if wants_signal(p) {
            Scale::ONE.host_units_for(p.distance)
        } else {
            0
        },
        scale: Scale::ONE,
    })
}

/// The raw x86 config of a GP counter: IA32_PERFEVTSELx bits 7:0, 15:8, 18, 23, 31:24. The
/// kernel sets USR/OS from the exclude bits and INT/EN itself.
pub fn raw_config(p: &CounterProgram) -> u64 {
    let event = p.raw & EVTSEL_EVENT_MASK;
    let umask = p.raw & (EVTSEL_UMASK_MASK << EVTSEL_UMASK_SHIFT);
    let mut config = event | umask;
    if p.edge {
        config |= EVTSEL_EDGE;
    }
    if p.inv {
        config |= EVTSEL_INV;
    }
    config | ((u64::from(p.cmask) & EVTSEL_CMASK_MASK) << EVTSEL_CMASK_SHIFT)
}

/// Generic hardware events for counters without a raw host encoding.
fn generic_kind(p: &CounterProgram) -> Result<HostKind, AttrError> {
    let config = match p.event {
        Event::InstructionsRetired => hw::INSTRUCTIONS,
        Event::CoreCycles => hw::CPU_CYCLES,
        Event::RefCycles => hw::REF_CPU_CYCLES,
        Event::BranchesRetired { umask: 0 } => hw::BRANCH_INSTRUCTIONS,
        Event::BranchMisses => hw::BRANCH_MISSES,
        // Fixed counter 3 (TOPDOWN.SLOTS): the same event on a GP counter.
        Event::Other { event, umask } if matches!(p.id, CounterId::Fixed(_)) => {
            return Ok(HostKind::Raw(
                u64::from(event) | (u64::from(umask) << EVTSEL_UMASK_SHIFT),
            ));
        }
        other => {
            return Err(AttrError::NoHostEquivalent {
                event: describe_event(&other),
            });
        }
    };
    Ok(HostKind::Hardware(config))
}

/// Clock mode: cycles counters become the task clock in guest TSC ticks. INV and CMASK are
/// not evaluated: every unhalted cycle is one event, so only the CMASK=16 INV alias of
/// INST_RETIRED (decoded as cycles) changes anything, and it is already cycles.
fn clock_attr(tsc_hz: u64, p: &CounterProgram) -> Result<HostAttr, AttrError> {
    match p.event {
        Event::CoreCycles | Event::RefCycles if p.edge => Err(AttrError::EdgeOnClock {
            event: describe_event(&p.event),
        }),
        Event::CoreCycles | Event::RefCycles => {
            let scale = Scale::tsc(tsc_hz);
            Ok(HostAttr {
                kind: HostKind::TaskClock,
                exclude_user: false,
                exclude_kernel: false,
                exclude_host: false,
                sample_period: if wants_signal(p) {
                    scale.host_units_for(p.distance)
                } else {
                    0
                },
                scale,
            })
        }
        other => Err(AttrError::NotTimeBased {
            event: describe_event(&other),
        }),
    }
}

/// `hz` as "2.1 GHz" (three decimals at most, trailing zeros dropped).
pub fn format_ghz(hz: u64) -> String {
    let mhz = hz / 1_000_000;
    let frac = format!("{:03}", mhz % 1000);
    let frac = frac.trim_end_matches('0');
    if frac.is_empty() {
        format!("{} GHz", mhz / 1000)
    } else {
        format!("{}.{frac} GHz", mhz / 1000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TSC: u64 = 2_100_000_000;

    fn prog(id: CounterId, event: Event, raw: u64) -> CounterProgram {
        CounterProgram {
            id,
            event,
            raw,
            usr: true,
            os: true,
            edge: false,
            inv: false,
            cmask: 0,
            any: false,
            pebs: false,
            pmi: true,
            distance: 1000,
        }
    }

    #[test]
    fn hardware_gp_passes_the_guest_selector() {
        // INST_RETIRED.ANY_P, USR only, INT|EN|ANY|EDGE|INV|CMASK=2 set in the guest selector.
        let mut p = prog(
            CounterId::Gp(1),
            Event::InstructionsRetired,
            0x02F7_00C0 | 0x0100,
        );
        p.os = false;
        p.edge = true;
        p.inv = true;
        p.cmask = 2;
        p.any = true;
        p.distance = 12_345;
        let a = host_attr(HostEvents::Hardware, TSC, &p).unwrap().unwrap();
        // Event, umask, edge, inv, cmask; not USR/OS/INT/EN/ANY.
        assert_eq!(a.kind, HostKind::Raw(0x0284_01C0));
        assert!(!a.exclude_user);
        assert!(a.exclude_kernel);
        assert!(a.exclude_host);
        assert_eq!(a.sample_period, 12_345);
        assert_eq!(a.scale, Scale::ONE);
    }

    #[test]
    fn hardware_fixed_and_netburst_use_generic_events() {
        let cases = [
            (
                CounterId::Fixed(0),
                Event::InstructionsRetired,
                HostKind::Hardware(hw::INSTRUCTIONS),
            ),
            (
                CounterId::Fixed(1),
                Event::CoreCycles,
                HostKind::Hardware(hw::CPU_CYCLES),
            ),
            (
                CounterId::Fixed(2),
                Event::RefCycles,
                HostKind::Hardware(hw::REF_CPU_CYCLES),
            ),
            (
                CounterId::Fixed(3),
                Event::Other {
                    event: 0xA4,
                    umask: 1,
                },
                HostKind::Raw(0x01A4),
            ),
            (
                CounterId::Netburst(12),
                Event::BranchMisses,
                HostKind::Hardware(hw::BRANCH_MISSES),
            ),
        ];
        for (id, event, kind) in cases {
            let mut p = prog(id, event, 0);
            p.usr = false;
            let a = host_attr(HostEvents::Hardware, TSC, &p).unwrap().unwrap();
            assert_eq!(a.kind, kind, "{id:?}");
            assert!(a.exclude_user && !a.exclude_kernel && a.exclude_host);
        }
        let p = prog(
            CounterId::Netburst(0),
            Event::Netburst {
                escr: 0x3B8,
                event: 2,
                mask: 1,
            },
            0,
        );
        let e = host_attr(HostEvents::Hardware, TSC, &p).unwrap_err();
        assert!(e.to_string().contains("--pmu-backend precise"), "{e}");
    }

    #[test]
    fn no_signal_without_pmi_or_pebs() {
        let mut p = prog(CounterId::Gp(0), Event::CoreCycles, 0x3C);
        p.pmi = false;
        let a = host_attr(HostEvents::Hardware, TSC, &p).unwrap().unwrap();
        assert_eq!(a.sample_period, 0);
        p.pebs = true;
        let b = host_attr(HostEvents::Hardware, TSC, &p).unwrap().unwrap();
        assert_eq!(b.sample_period, 1000);
        assert!(
            !a.same_event(&b),
            "counting-only cannot become sampling by ioctl"
        );
        p.distance = 7;
        let c = host_attr(HostEvents::Hardware, TSC, &p).unwrap().unwrap();
        assert!(b.same_event(&c));
        assert_eq!(c.sample_period, 7);
    }

    #[test]
    fn counter_enabled_nowhere_needs_no_event() {
        let mut p = prog(CounterId::Gp(0), Event::InstructionsRetired, 0xC0);
        p.usr = false;
        p.os = false;
        assert_eq!(host_attr(HostEvents::Hardware, TSC, &p), Ok(None));
        assert_eq!(host_attr(HostEvents::Clock, TSC, &p), Ok(None));
    }

    #[test]
    fn clock_backs_cycles_in_tsc_ticks() {
        for (id, event) in [
            (CounterId::Fixed(1), Event::CoreCycles),
            (CounterId::Fixed(2), Event::RefCycles),
            (CounterId::Gp(3), Event::CoreCycles),
        ] {
            let mut p = prog(id, event, 0);
            p.usr = false;
            p.distance = 2_100_000; // 1 ms at 2.1 GHz
            let a = host_attr(HostEvents::Clock, TSC, &p).unwrap().unwrap();
            assert_eq!(a.kind, HostKind::TaskClock);
            assert!(!a.exclude_user && !a.exclude_kernel && !a.exclude_host);
            assert_eq!(a.sample_period, 1_000_000);
        }
        // Rounded up: one guest tick is one nanosecond of host time.
        let mut p = prog(CounterId::Fixed(1), Event::CoreCycles, 0);
        p.distance = 1;
        assert_eq!(
            host_attr(HostEvents::Clock, TSC, &p)
                .unwrap()
                .unwrap()
                .sample_period,
            1
        );
        p.distance = 2_100_001;
        assert_eq!(
            host_attr(HostEvents::Clock, TSC, &p)
                .unwrap()
                .unwrap()
                .sample_period,
            1_000_001
        );
    }

    #[test]
    fn clock_refuses_other_events_with_one_message() {
        for event in [
            Event::InstructionsRetired,
            Event::BranchMisses,
            Event::LoadsRetired,
            Event::Other {
                event: 0x2E,
                umask: 0x41,
            },
        ] {
            let e = host_attr(HostEvents::Clock, TSC, &prog(CounterId::Gp(0), event, 0))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("unhalted core cycles and unhalted reference cycles"),
                "{e}"
            );
            assert!(e.contains("fixed counters 1 and 2"), "{e}");
            assert!(e.contains("`--pmu-backend precise`"), "{e}");
        }
        let mut p = prog(CounterId::Gp(0), Event::CoreCycles, 0);
        p.edge = true;
        let e = host_attr(HostEvents::Clock, TSC, &p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("edge detect") && e.contains("--pmu-backend precise"),
            "{e}"
        );
    }

    #[test]
    fn scale_carries_fractions() {
        let s = Scale::tsc(TSC);
        let mut rem = 0;
        // 10 reads of 1 ns each: 2.1 ticks each, 21 in total, none lost to rounding.
        let total: u64 = (0..10).map(|_| s.to_guest(1, &mut rem)).sum();
        assert_eq!(total, 21);
        assert_eq!(rem, 0);
        assert_eq!(s.to_guest(1_000_000_000, &mut rem), TSC);
        assert_eq!(Scale::ONE.to_guest(u64::MAX, &mut rem), u64::MAX);
        // Huge distances saturate at the kernel's largest period.
        assert_eq!(
            Scale { num: 1, den: 4 }.host_units_for(u64::MAX),
            i64::MAX.unsigned_abs()
        );
    }

    #[test]
    fn ghz() {
        assert_eq!(format_ghz(2_100_000_000), "2.1 GHz");
        assert_eq!(format_ghz(3_000_000_000), "3 GHz");
        assert_eq!(format_ghz(2_592_000_000), "2.592 GHz");
    }
}
