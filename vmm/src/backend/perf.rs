//! The host-counter ("perf") counting backend: each enabled guest counter becomes a host perf
//! event on the vCPU thread (attributes: [`super::perf_attr`]).
//!
//! Threading: events observe the thread that calls [`CountingBackend::program`], so the
//! backend lives on its vCPU thread and is reprogrammed there between runs. A counter that
//! raises a PMI or feeds PEBS gets a sample period equal to its distance to overflow; the
//! overflow is a signal ([`overflow_signal`]) routed to that thread with `F_SETOWN_EX`
//! (`F_OWNER_TID`), `F_SETSIG` and `O_ASYNC`. The handler does nothing: the signal's only job
//! is to make `KVM_RUN` return `EINTR`, after which the VMM collects the counts, reads the
//! guest state and hands both to the vPMU, which decides the overflow (status, PEBS record,
//! PMI) from the counts, not from the signal.
//!
//! Skid: a report carries the guest state at the exit that follows the overflow, not at the
//! overflowing event. The distance between the two is the signal delivery latency: the host
//! takes the overflow interrupt (or, for the task clock, the hrtimer), queues irq work that
//! sends the signal, and the vCPU leaves guest mode at the next host interrupt-return check,
//! so the guest runs on for that long (microseconds; the hrtimer behind the task clock is
//! never armed for less than 10 µs). PEBS records written from such a report therefore have
//! the IP and registers of a later instruction, like PEBS without PDIR on early hardware but
//! larger; the precise backend has no skid. The overflow that arrives while the thread is in
//! the VMM rather than in `KVM_RUN` interrupts nothing: [`overflow_signals_on_this_thread`]
//! lets the run loop notice it.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use libc::{c_int, c_void, pid_t, siginfo_t};
use perf_event::events::{Hardware, Raw, Software};
use perf_event::{Builder, Counter};
use thiserror::Error;
use vmm_sys_util::signal::register_signal_handler;
use vpmu::backend::{BackendError, CountReport, CountingBackend};
use vpmu::counter::{CounterId, CounterProgram};

pub use super::perf_attr::HostEvents;
use super::perf_attr::{HostAttr, HostKind, format_ghz, host_attr};

/// Shortest host period after a reload. The clock counts the VMM's own overflow handling as
/// guest time; without a floor, handling that takes longer than the guest's period (a loaded
/// host, a debug build) would re-arm the event for "now" after every overflow and starve the
/// guest in a signal storm. The floor (in host units: ns for the clock) lets the guest run at
/// least this long between overflows, like the host kernel's own sample-rate throttling.
const MIN_PERIOD: u64 = 50_000;

/// fcntl(2) commands missing from libc 0.2 (include/uapi/asm-generic/fcntl.h).
const F_SETSIG: c_int = 10;
/// Set the owner as a thread/process/group (`struct f_owner_ex`).
const F_SETOWN_EX: c_int = 15;
/// `f_owner_ex.type`: a single thread.
const F_OWNER_TID: c_int = 0;

/// `struct f_owner_ex`.
#[repr(C)]
struct FOwnerEx {
    type_: c_int,
    pid: pid_t,
}

/// Why a host perf operation failed.
#[derive(Debug, Error)]
pub enum PerfError {
    /// perf_event_open failed.
    #[error("cannot open a host perf event for {id:?} ({attr:?}): {source}")]
    Open {
        /// The guest counter.
        id: CounterId,
        /// What was asked of the host.
        attr: HostAttr,
        /// The kernel's answer.
        source: io::Error,
    },
    /// An fcntl that routes the overflow signal failed.
    #[error("cannot route overflow signals of {id:?} to the vCPU thread ({step}): {source}")]
    Route {
        /// The guest counter.
        id: CounterId,
        /// Which fcntl.
        step: &'static str,
        /// The kernel's answer.
        source: io::Error,
    },
    /// PERF_EVENT_IOC_ENABLE failed.
    #[error("cannot enable the host perf event of {id:?}: {source}")]
    Enable {
        /// The guest counter.
        id: CounterId,
        /// The kernel's answer.
        source: io::Error,
    },
    /// PERF_EVENT_IOC_PERIOD failed.
    #[error("cannot set the sample period of {id:?} to {period}: {source}")]
    Period {
        /// The guest counter.
        id: CounterId,
        /// The period asked for.
        period: u64,
        /// The kernel's answer.
        source: io::Error,
    },
    /// Reading a count failed.
    #[error("cannot read the host perf event of {id:?}: {source}")]
    Read {
        /// The guest counter.
        id: CounterId,
        /// The kernel's answer.
        source: io::Error,
    },
    /// Reprogrammed from a thread other than the one its events observe.
    #[error(
        "the host perf events observe thread {owner}, but the backend was reprogrammed on thread {caller}"
    )]
    WrongThread {
        /// The observed (vCPU) thread.
        owner: pid_t,
        /// The calling thread.
        caller: pid_t,
    },
    /// sigaction failed.
    #[error("cannot install the overflow signal handler: {0}")]
    Handler(vmm_sys_util::errno::Error),
}

/// The signal that reports a host event's overflow to the vCPU thread: SIGIO, a standard
/// signal, so that pending instances coalesce. A real-time signal queues one instance per
/// overflow; a vCPU that cannot take them fast enough exhausts RLIMIT_SIGPENDING for the whole
/// user, after which the kernel falls back to plain SIGIO anyway (fs/fcntl.c
/// `send_sigio_to_task`). The handler only interrupts KVM_RUN; counts come from the counters.
pub fn overflow_signal() -> c_int {
    libc::SIGIO
}

thread_local! {
    /// Overflow signals delivered to this thread. Const-initialised with no destructor, so
    /// touching it from the signal handler allocates nothing and cannot fail.
    static OVERFLOW_SIGNALS: AtomicU64 = const { AtomicU64::new(0) };
}

/// Overflow signals this thread has received so far. A run loop that snapshots it before
/// `KVM_RUN` can tell an overflow that arrived while it was outside the guest.
pub fn overflow_signals_on_this_thread() -> u64 {
    OVERFLOW_SIGNALS.with(|n| n.load(Ordering::Relaxed))
}

extern "C" fn on_overflow_signal(_: c_int, _: *mut siginfo_t, _: *mut c_void) {
    // Only interrupts KVM_RUN (and counts, for the run loop and the tests).
    OVERFLOW_SIGNALS.with(|n| n.fetch_add(1, Ordering::Relaxed));
}

/// Installs the (process-wide) overflow signal handler once. Without it an overflow signal
/// would kill the process (the default action of real-time signals), so the backend calls
/// this before it arms any sampling event.
pub fn install_overflow_handler() -> Result<(), PerfError> {
    static INSTALLED: OnceLock<Result<(), vmm_sys_util::errno::Error>> = OnceLock::new();
    (*INSTALLED.get_or_init(|| register_signal_handler(overflow_signal(), on_overflow_signal)))
        .map_err(PerfError::Handler)
}

/// Whether the host has a hardware PMU usable for guest counting: it does iff it opens a
/// guest-only (`exclude_host`) instructions event on this thread. On the development host
/// this fails with ENOENT (sysfs `event_source` has no `cpu` PMU). The open, rather than the
/// sysfs check, is the test because it also catches a PMU perf cannot use for guest counting.
pub fn detect_host_events() -> HostEvents {
    let opened = Builder::new(Hardware::INSTRUCTIONS)
        .observe_self()
        .any_cpu()
        .exclude_host(true)
        .build();
    match opened {
        Ok(_) => HostEvents::Hardware,
        Err(_) => HostEvents::Clock,
    }
}

/// The calling thread's id.
fn gettid() -> pid_t {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::gettid() }
}

/// A `Builder` for `attr`, observing the calling thread on any CPU. Pure: nothing is opened.
fn builder(attr: &HostAttr) -> Builder<'static> {
    let mut b = match attr.kind {
        HostKind::Raw(config) => Builder::new(Raw::new(config)),
        HostKind::Hardware(config) => Builder::new(Hardware::from(config)),
        HostKind::TaskClock => Builder::new(Software::TASK_CLOCK),
    };
    b.observe_self()
        .any_cpu()
        .exclude_user(attr.exclude_user)
        .exclude_kernel(attr.exclude_kernel)
        .exclude_host(attr.exclude_host)
        // As KVM does: a guest counter must not be multiplexed away.
        .pinned(true);
    if attr.sample_period > 0 {
        b.sample_period(attr.sample_period);
    }
    b
}

/// One programmed guest counter's host event.
#[derive(Debug)]
struct HostCounter {
    attr: HostAttr,
    counter: Counter,
    /// Host count already reported (or dropped at a reprogramming).
    base: u64,
    /// Fraction of a guest event carried between reads (`< attr.scale.den`).
    rem: u64,
}

impl HostCounter {
    /// Opens, routes the overflow signal to `tid`, and enables.
    fn open(id: CounterId, attr: HostAttr, tid: pid_t) -> Result<HostCounter, PerfError> {
        let mut counter =
            builder(&attr)
                .build()
                .map_err(|source| PerfError::Open { id, attr, source })?;
        if attr.sample_period > 0 {
            install_overflow_handler()?;
            route_signal(id, counter.as_raw_fd(), tid)?;
        }
        counter
            .enable()
            .map_err(|source| PerfError::Enable { id, source })?;
        Ok(HostCounter {
            attr,
            counter,
            base: 0,
            rem: 0,
        })
    }

    fn read(&mut self, id: CounterId) -> Result<u64, PerfError> {
        self.counter
            .read()
            .map_err(|source| PerfError::Read { id, source })
    }

    /// PERF_EVENT_IOC_PERIOD. The kernel reads the period through a pointer; perf-event-open-sys2's
    /// `ioctls::PERIOD` passes it by value, so the ioctl is issued here.
    fn set_period(&mut self, id: CounterId, period: u64) -> Result<(), PerfError> {
        let request = libc::c_ulong::from(perf_event_open_sys::bindings::PERIOD);
        // SAFETY: the fd is a perf event this struct owns; the argument points to a live u64.
        let r = unsafe { libc::ioctl(self.counter.as_raw_fd(), request, &period as *const u64) };
        if r < 0 {
            return Err(PerfError::Period {
                id,
                period,
                source: io::Error::last_os_error(),
            });
        }
        self.attr.sample_period = period;
        Ok(())
    }
}

/// fcntl(fd, cmd, arg) with an integer or pointer argument.
fn fcntl_checked<A>(
    id: CounterId,
    step: &'static str,
    fd: c_int,
    cmd: c_int,
    arg: A,
) -> Result<c_int, PerfError> {
    // SAFETY: fcntl on a descriptor we own; `arg` is an int or a pointer to a live struct,
    // as `cmd` expects.
    let r = unsafe { libc::fcntl(fd, cmd, arg) };
    if r < 0 {
        return Err(PerfError::Route {
            id,
            step,
            source: io::Error::last_os_error(),
        });
    }
    Ok(r)
}

/// Sends the event's overflow signal to thread `tid` only.
fn route_signal(id: CounterId, fd: c_int, tid: pid_t) -> Result<(), PerfError> {
    let owner = FOwnerEx {
        type_: F_OWNER_TID,
        pid: tid,
    };
    fcntl_checked(
        id,
        "F_SETOWN_EX",
        fd,
        F_SETOWN_EX,
        &owner as *const FOwnerEx,
    )?;
    fcntl_checked(id, "F_SETSIG", fd, F_SETSIG, overflow_signal())?;
    let flags = fcntl_checked(id, "F_GETFL", fd, libc::F_GETFL, 0)?;
    fcntl_checked(id, "F_SETFL", fd, libc::F_SETFL, flags | libc::O_ASYNC)?;
    Ok(())
}

/// Guest counters on host perf events of the vCPU thread.
#[derive(Debug)]
pub struct PerfBackend {
    events: HostEvents,
    tsc_hz: u64,
    counters: BTreeMap<CounterId, HostCounter>,
    /// The thread the open events observe: the backend may be created anywhere, but its
    /// events are opened by `program` on the vCPU thread.
    owner: Option<pid_t>,
}

impl PerfBackend {
    /// A backend with nothing programmed. `tsc_hz` is the guest TSC frequency, the rate of
    /// core and reference cycles in clock mode.
    pub fn new(events: HostEvents, tsc_hz: u64) -> Self {
        PerfBackend {
            events,
            tsc_hz,
            counters: BTreeMap::new(),
            owner: None,
        }
    }

    /// The one line `vmm run` prints about this backend.
    pub fn describe(&self) -> String {
        match self.events {
            HostEvents::Clock => format!(
                "pmu backend: perf (host clock: task-clock scaled to the guest TSC at {}; backs core cycles, reference cycles)",
                format_ghz(self.tsc_hz)
            ),
            HostEvents::Hardware => concat!(
                "pmu backend: perf (host PMU: the guest's event selects as guest-only host ",
                "events; backs every event the host PMU counts)"
            )
            .to_string(),
        }
    }

    fn reprogram(&mut self, programs: &[CounterProgram]) -> Result<(), BackendError> {
        let tid = gettid();
        if let Some(owner) = self
            .owner
            .filter(|o| *o != tid && !self.counters.is_empty())
        {
            let Some(first) = programs.first() else {
                // Stopping everything is thread-independent: the fds just close.
                self.counters.clear();
                return Ok(());
            };
            let why = PerfError::WrongThread { owner, caller: tid }.to_string();
            return Err(BackendError::Program { id: first.id, why });
        }
        // A counter the host cannot back stays at 0 (the caller reports the first refusal
        // once); the others are programmed as asked, as a guest that enables an unsupported
        // event next to a supported one expects (Linux's Nehalem errata workaround does).
        let mut wanted = BTreeMap::new();
        let mut refused = None;
        for p in programs {
            match host_attr(self.events, self.tsc_hz, p) {
                Ok(Some(attr)) => {
                    wanted.insert(p.id, attr);
                }
                Ok(None) => {}
                Err(e) => {
                    refused.get_or_insert(BackendError::Program {
                        id: p.id,
                        why: e.to_string(),
                    });
                }
            }
        }
        let mut old = std::mem::take(&mut self.counters);
        self.owner = Some(tid);
        for (id, attr) in wanted {
            let fail = |e: PerfError| BackendError::Program {
                id,
                why: e.to_string(),
            };
            let counter = match old.remove(&id) {
                Some(mut c) if c.attr.same_event(&attr) => {
                    // The caller collected at this exit; what the host counted since is this
                    // exit's handling, which the clock counts as guest time (module comment of
                    // `perf_attr`). It stays unreported, so the next collect adds it to the new
                    // value: dropping it lost the whole overflow handling (tens to hundreds of
                    // µs per PEBS record) and made sampled counters run ~10 % slow. The signal
                    // must then come that much sooner, and always from now: the host restarts
                    // its period at the ioctl, so it is set even when unchanged.
                    if attr.sample_period > 0 {
                        let pending = c.read(id).map_err(fail)?.saturating_sub(c.base);
                        let period = attr
                            .sample_period
                            .saturating_sub(pending)
                            .max(MIN_PERIOD.min(attr.sample_period));
                        c.set_period(id, period).map_err(fail)?;
                    }
                    c
                }
                _ => HostCounter::open(id, attr, tid).map_err(fail)?,
            };
            self.counters.insert(id, counter);
        }
        // Counters left in `old` stop counting here (their fds close).
        refused.map_or(Ok(()), Err)
    }

    #[cfg(test)]
    fn fd_of(&self, id: CounterId) -> Option<c_int> {
        self.counters.get(&id).map(|c| c.counter.as_raw_fd())
    }
}

/// Each report's `state` and `event` are left at their defaults: this backend sees only
/// counts. The caller (the vCPU run loop) fills in the guest state it read at the exit where
/// it collected, which is the state at the overflow plus the skid described in the module
/// comment. `program` must run on the vCPU thread, right after a `collect`, whenever a
/// counter's configuration or distance changed; otherwise the next overflow signal comes one
/// old period later.
impl CountingBackend for PerfBackend {
    fn program(&mut self, programs: &[CounterProgram]) -> Result<(), BackendError> {
        self.reprogram(programs)
    }

    /// At most one report with every counter that advanced since the previous collect, in
    /// guest events (clock mode: task-clock nanoseconds times the guest TSC rate, the
    /// fraction carried to the next read).
    fn collect(&mut self) -> Result<Vec<CountReport>, BackendError> {
        let mut deltas = Vec::new();
        for (&id, c) in &mut self.counters {
            let now = c
                .read(id)
                .map_err(|e| BackendError::Collect(e.to_string()))?;
            let host = now.saturating_sub(c.base);
            c.base = now;
            let guest = c.attr.scale.to_guest(host, &mut c.rem);
            if guest > 0 {
                deltas.push((id, guest));
            }
        }
        if deltas.is_empty() {
            return Ok(Vec::new());
        }
        Ok(vec![CountReport {
            deltas,
            state: Default::default(),
            event: Default::default(),
        }])
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use vpmu::counter::Event;

    use super::super::perf_attr::{NS_PER_SEC, Scale};
    use super::*;

    const TSC: u64 = 2_100_000_000;

    fn cycles(id: CounterId, distance: u64, pmi: bool) -> CounterProgram {
        CounterProgram {
            id,
            event: Event::CoreCycles,
            raw: 0x3C,
            usr: true,
            os: true,
            edge: false,
            inv: false,
            cmask: 0,
            any: false,
            pebs: false,
            pmi,
            distance,
        }
    }

    /// This thread's CPU time.
    fn thread_cpu_time() -> Duration {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid timespec to fill.
        let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        assert_eq!(r, 0);
        Duration::new(ts.tv_sec.unsigned_abs(), u32::try_from(ts.tv_nsec).unwrap())
    }

    /// Spins until this thread has used `d` of CPU time (robust to a loaded machine).
    fn burn(d: Duration) {
        let end = thread_cpu_time() + d;
        let mut x = 0u64;
        while thread_cpu_time() < end {
            for i in 0..1000 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
        }
    }

    fn total(reports: &[CountReport], id: CounterId) -> u64 {
        reports
            .iter()
            .flat_map(|r| &r.deltas)
            .filter(|(i, _)| *i == id)
            .map(|(_, n)| n)
            .sum()
    }

    #[test]
    fn clock_counting_is_monotonic_and_agrees_with_task_clock() {
        let id = CounterId::Fixed(1);
        let mut reference = Builder::new(Software::TASK_CLOCK)
            .observe_self()
            .any_cpu()
            .include_kernel()
            .build()
            .unwrap();
        let mut b = PerfBackend::new(HostEvents::Clock, TSC);
        reference.enable().unwrap();
        b.program(&[cycles(id, 1 << 47, true)]).unwrap();
        let signals = overflow_signals_on_this_thread();
        let mut sum = 0;
        let mut seen = Vec::new();
        for _ in 0..3 {
            burn(Duration::from_millis(20));
            let r = b.collect().unwrap();
            assert_eq!(r.len(), 1);
            let d = total(&r, id);
            assert!(d > 0, "counter did not advance");
            sum += d;
            seen.push(sum);
        }
        let ns = reference.read().unwrap();
        let expect = Scale::tsc(TSC).to_guest(ns, &mut 0);
        assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
        // The 60 ms burned, in 2.1 GHz ticks, less the last read's sub-tick lag (1 %).
        assert!(
            sum >= 60 * TSC / 1000 * 99 / 100,
            "{sum} (task-clock {ns} ns)"
        );
        let diff = expect.abs_diff(sum);
        assert!(
            diff * 20 < expect,
            "backend {sum} vs task-clock {expect} ({ns} ns)"
        );
        assert_eq!(
            overflow_signals_on_this_thread(),
            signals,
            "no overflow at 2^47 cycles"
        );
    }

    #[test]
    fn overflow_signal_arrives_on_this_thread_and_follows_the_period() {
        let id = CounterId::Gp(0);
        let mut b = PerfBackend::new(HostEvents::Clock, TSC);
        b.program(&[cycles(id, 1 << 47, true)]).unwrap();
        let fd = b.fd_of(id);
        let before = overflow_signals_on_this_thread();
        burn(Duration::from_millis(10));
        assert_eq!(overflow_signals_on_this_thread(), before);

        // 1 ms of guest cycles: only the period changes, through PERF_EVENT_IOC_PERIOD.
        b.collect().unwrap();
        b.program(&[cycles(id, TSC / 1000, true)]).unwrap();
        assert_eq!(b.fd_of(id), fd, "same host event, new period");
        burn(Duration::from_millis(30));
        let got = overflow_signals_on_this_thread() - before;
        assert!(
            (10..=40).contains(&got),
            "{got} signals in 30 ms at a 1 ms period"
        );

        // No PMI: counting only, no signals (a new host event: sampling cannot be switched off).
        b.program(&[cycles(id, TSC / 1000, false)]).unwrap();
        let quiet = overflow_signals_on_this_thread();
        burn(Duration::from_millis(10));
        assert_eq!(overflow_signals_on_this_thread(), quiet);

        // Nothing programmed: the events are closed.
        b.program(&[cycles(id, TSC / 1000, true)]).unwrap();
        b.program(&[]).unwrap();
        assert_eq!(b.fd_of(id), None);
        let closed = overflow_signals_on_this_thread();
        burn(Duration::from_millis(10));
        assert_eq!(overflow_signals_on_this_thread(), closed);
        assert!(b.collect().unwrap().is_empty());
    }

    #[test]
    fn reprogramming_keeps_the_counts_since_the_last_collect() {
        let id = CounterId::Gp(0);
        let mut b = PerfBackend::new(HostEvents::Clock, TSC);
        b.program(&[cycles(id, 1 << 40, true)]).unwrap();
        b.collect().unwrap();
        // Exit handling between a collect and the reprogramming it causes is guest time.
        burn(Duration::from_millis(10));
        b.program(&[cycles(id, 1 << 39, true)]).unwrap();
        let got = total(&b.collect().unwrap(), id);
        assert!(got >= 10 * TSC / 1000, "{got} ticks after 10 ms");
    }

    #[test]
    fn clock_refuses_other_events_and_backs_the_rest() {
        let mut b = PerfBackend::new(HostEvents::Clock, TSC);
        let fixed1 = CounterId::Fixed(1);
        b.program(&[cycles(fixed1, 1 << 40, false)]).unwrap();
        let mut insn = cycles(CounterId::Gp(0), 1 << 40, true);
        insn.event = Event::InstructionsRetired;
        insn.raw = 0xC0;
        let e = b
            .program(&[cycles(fixed1, 1 << 40, false), insn])
            .unwrap_err();
        let BackendError::Program { id, why } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(*id, CounterId::Gp(0));
        assert!(why.contains("instructions retired"), "{why}");
        assert!(
            why.contains("unhalted core cycles and unhalted reference cycles"),
            "{why}"
        );
        assert!(why.contains("`--pmu-backend precise`"), "{why}");
        assert!(b.fd_of(fixed1).is_some() && b.fd_of(CounterId::Gp(0)).is_none());
        burn(Duration::from_millis(2));
        assert!(total(&b.collect().unwrap(), fixed1) > 0);
        // A supported counter enabled after the refused one is backed too.
        let gp1 = CounterId::Gp(1);
        assert!(b.program(&[insn, cycles(gp1, 1 << 40, false)]).is_err());
        assert!(b.fd_of(gp1).is_some() && b.fd_of(fixed1).is_none());
    }

    #[test]
    fn events_stay_on_the_thread_that_programmed_them() {
        let mut b = PerfBackend::new(HostEvents::Clock, TSC);
        let p = cycles(CounterId::Fixed(1), 1 << 40, false);
        b.program(&[p]).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| {
                let e = b.program(&[p]).unwrap_err().to_string();
                assert!(e.contains("reprogrammed on thread"), "{e}");
                b.program(&[]).unwrap();
                // Nothing open any more: this thread may take the backend over.
                b.program(&[p]).unwrap();
            });
        });
        assert!(b.program(&[p]).is_err());
    }

    #[test]
    fn counter_enabled_at_no_level_has_no_host_event() {
        let mut b = PerfBackend::new(HostEvents::Clock, TSC);
        let mut p = cycles(CounterId::Gp(2), 1000, true);
        p.usr = false;
        p.os = false;
        b.program(&[p]).unwrap();
        assert_eq!(b.fd_of(p.id), None);
        burn(Duration::from_millis(1));
        assert!(b.collect().unwrap().is_empty());
    }

    #[test]
    fn hardware_builder_sets_kvms_attributes() {
        let mut p = cycles(CounterId::Gp(1), 5000, true);
        p.raw = 0x4301C4;
        p.os = false;
        let attr = host_attr(HostEvents::Hardware, TSC, &p).unwrap().unwrap();
        let b = builder(&attr);
        let a = b.attrs();
        assert_eq!(a.type_, perf_event_open_sys::bindings::PERF_TYPE_RAW);
        assert_eq!(a.config, 0x01C4);
        assert_eq!(a.exclude_host(), 1);
        assert_eq!(a.exclude_user(), 0);
        assert_eq!(a.exclude_kernel(), 1);
        assert_eq!(a.exclude_guest(), 0);
        assert_eq!(a.pinned(), 1);
        assert_eq!(a.freq(), 0);
        assert_eq!(a.sample_period, 5000);

        let mut f = cycles(CounterId::Fixed(0), 7, false);
        f.event = Event::InstructionsRetired;
        let attr = host_attr(HostEvents::Hardware, TSC, &f).unwrap().unwrap();
        let b = builder(&attr);
        assert_eq!(
            b.attrs().type_,
            perf_event_open_sys::bindings::PERF_TYPE_HARDWARE
        );
        assert_eq!(
            b.attrs().config,
            u64::from(perf_event_open_sys::bindings::PERF_COUNT_HW_INSTRUCTIONS)
        );
        assert_eq!(b.attrs().sample_period, 0, "no PMI: counting only");
    }

    #[test]
    fn clock_builder_includes_kernel_time() {
        let p = cycles(CounterId::Fixed(1), TSC, true);
        let attr = host_attr(HostEvents::Clock, TSC, &p).unwrap().unwrap();
        let b = builder(&attr);
        let a = b.attrs();
        assert_eq!(a.type_, perf_event_open_sys::bindings::PERF_TYPE_SOFTWARE);
        assert_eq!(
            a.config,
            u64::from(perf_event_open_sys::bindings::PERF_COUNT_SW_TASK_CLOCK)
        );
        assert_eq!(a.exclude_kernel(), 0, "KVM_RUN is kernel time");
        assert_eq!(a.exclude_host(), 0);
        assert_eq!(a.sample_period, NS_PER_SEC);
    }

    #[test]
    fn detection_matches_the_host() {
        let sysfs_cpu = std::path::Path::new("/sys/bus/event_source/devices/cpu").exists()
            || std::path::Path::new("/sys/bus/event_source/devices/cpu_core").exists();
        if !sysfs_cpu {
            assert_eq!(detect_host_events(), HostEvents::Clock);
        }
        let hw = PerfBackend::new(HostEvents::Hardware, TSC).describe();
        let expect = if detect_host_events() == HostEvents::Hardware {
            hw
        } else {
            PerfBackend::new(HostEvents::Clock, TSC).describe()
        };
        assert_eq!(
            PerfBackend::new(detect_host_events(), TSC).describe(),
            expect
        );
    }

    #[test]
    fn describe_is_one_line() {
        let clock = PerfBackend::new(HostEvents::Clock, TSC).describe();
        assert_eq!(
            clock,
            "pmu backend: perf (host clock: task-clock scaled to the guest TSC at 2.1 GHz; backs core cycles, reference cycles)"
        );
        let hw = PerfBackend::new(HostEvents::Hardware, TSC).describe();
        assert!(hw.starts_with("pmu backend: perf (host PMU") && !hw.contains('\n'));
    }
}
