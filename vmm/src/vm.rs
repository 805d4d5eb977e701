//! Builds the VM (memory, irqchip, PIT, MSR filter, CPUID, devices, vCPUs) and runs the main
//! event loop until the guest exits, crashes, times out or the user interrupts it.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use event_manager::{EventManager, EventOps, Events, MutEventSubscriber, SubscriberOps};
use kvm_bindings::{KVM_MAX_CPUID_ENTRIES, kvm_pit_config, kvm_userspace_memory_region};
use kvm_ioctls::{Kvm, VmFd};
use thiserror::Error;
use vm_memory::{GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::eventfd::EventFd;
use vpmu::Vpmu;
use vpmu::model::CpuModel;

use crate::backend::perf::{self, PerfBackend};
use crate::backend::probe;
use crate::boot::{self, BootConfig};
use crate::cli::{PmuBackend, RunArgs, SerialOut};
use crate::cpuid;
use crate::devices::bus::Bus;
use crate::devices::fw_cfg::FwCfg;
use crate::devices::serial::{COM1_IRQ, Sink, new_uart};
use crate::exits::StopReason;
use crate::msr_filter;
use crate::pmu::{Backend, VcpuPmu};
use crate::vcpu::{Vcpu, VcpuStop};

/// Why the VM could not be built or run.
#[derive(Debug, Error)]
pub enum VmError {
    /// /dev/kvm is missing.
    #[error(
        "/dev/kvm does not exist: load KVM (modprobe kvm_intel or kvm_amd) or run on a host with virtualization enabled"
    )]
    NoKvm,
    /// /dev/kvm is not accessible.
    #[error("no permission to open /dev/kvm: run as root or add your user to the 'kvm' group")]
    KvmPermission,
    /// Opening /dev/kvm failed otherwise.
    #[error("opening /dev/kvm failed: {0}")]
    KvmOpen(kvm_ioctls::Error),
    /// The CPU model could not be loaded.
    #[error("--cpu-model: {0}")]
    Model(#[from] vpmu::model::ModelError),
    /// A KVM call failed.
    #[error("{what} failed: {err}")]
    Kvm {
        /// Which call.
        what: &'static str,
        /// The error.
        err: kvm_ioctls::Error,
    },
    /// Guest memory could not be allocated.
    #[error("allocating {size} bytes of guest memory failed ({err}); lower --mem")]
    Memory {
        /// Requested size.
        size: u64,
        /// Why.
        err: String,
    },
    /// Loading the kernel failed.
    #[error(transparent)]
    Boot(#[from] boot::BootError),
    /// PMU MSRs could not be routed to user space.
    #[error(transparent)]
    MsrFilter(#[from] msr_filter::MsrFilterError),
    /// `--serial FILE` could not be created.
    #[error("--serial: cannot create {path}: {err}")]
    SerialFile {
        /// The path.
        path: String,
        /// Why.
        err: io::Error,
    },
    /// `--trace-msr FILE` could not be created.
    #[error("--trace-msr: cannot write {path}: {err}")]
    TraceFile {
        /// The path.
        path: String,
        /// Why.
        err: io::Error,
    },
    /// An OS resource (eventfd, epoll, thread) could not be created.
    #[error("{what} failed: {err}")]
    Os {
        /// What.
        what: &'static str,
        /// Why.
        err: io::Error,
    },
}

fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> VmError {
    move |err| VmError::Kvm { what, err }
}

/// How a run ended, for the exit status.
#[derive(Debug)]
pub enum RunEnd {
    /// A vCPU stopped.
    Stopped(VcpuStop),
    /// `--timeout` elapsed.
    TimedOut(u64),
    /// SIGINT/SIGTERM.
    Interrupted,
}

/// The TSS address KVM needs on Intel before any real-mode code (Intel practice, harmless here).
const TSS_ADDRESS: usize = 0xfffb_d000;

/// Builds the VM for `args` and runs it to the end.
pub fn run(args: &RunArgs) -> Result<RunEnd, VmError> {
    let kvm = Kvm::new().map_err(|e| match e.errno() {
        libc::ENOENT => VmError::NoKvm,
        libc::EACCES | libc::EPERM => VmError::KvmPermission,
        _ => VmError::KvmOpen(e),
    })?;
    let model = CpuModel::load(&args.cpu_model)?;
    let vm = Arc::new(kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?);
    vm.set_tss_address(TSS_ADDRESS)
        .map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
    vm.create_irq_chip()
        .map_err(kvm_err("KVM_CREATE_IRQCHIP"))?;
    vm.create_pit2(kvm_pit_config::default())
        .map_err(kvm_err("KVM_CREATE_PIT2"))?;
    disable_kvm_vpmu(&vm)?;

    boot::layout::check_mem_size(args.mem)?;
    let mem =
        GuestMemoryMmap::<()>::from_ranges(&boot::guest_ram_ranges(args.mem)).map_err(|e| {
            VmError::Memory {
                size: args.mem,
                err: e.to_string(),
            }
        })?;
    register_memory(&vm, &mem)?;

    let boot_cfg = BootConfig {
        kernel: &args.kernel,
        initrd: args.initrd.as_deref(),
        cmdline: &args.cmdline,
        mem_size: args.mem,
        vcpus: args.vcpus,
    };
    let info = boot::load(&mem, &boot_cfg)?;

    let ranges = msr_filter::deny_ranges(&vpmu::trapped_msrs(&model))?;
    msr_filter::install(&kvm, &vm, &ranges)?;

    let sink = match &args.serial {
        SerialOut::Stdout => Sink::Stdout(io::stdout()),
        SerialOut::File(p) => Sink::file(p).map_err(|err| VmError::SerialFile {
            path: p.display().to_string(),
            err,
        })?,
    };
    let irq = EventFd::new(libc::EFD_NONBLOCK).map_err(|err| VmError::Os {
        what: "eventfd",
        err,
    })?;
    vm.register_irqfd(&irq, COM1_IRQ)
        .map_err(kvm_err("KVM_IRQFD (COM1)"))?;
    let bus = Arc::new(Mutex::new(Bus::new(
        new_uart(irq, sink),
        FwCfg::new(u16::from(args.vcpus), args.mem),
    )));

    let supported = kvm
        .get_supported_cpuid(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))?;
    let mut fds = Vec::new();
    for index in 0..args.vcpus {
        let fd = vm
            .create_vcpu(u64::from(index))
            .map_err(kvm_err("KVM_CREATE_VCPU"))?;
        set_cpuid(&fd, &supported, &model, index)?;
        boot::setup_vcpu(&fd, index, &info)?;
        fds.push(fd);
    }
    let tsc_hz = guest_tsc_hz(&vm, &fds, &model);
    let (make_backend, count_cpl3) = choose_backend(&kvm, args.pmu_backend, tsc_hz);
    let stop_evt = EventFd::new(libc::EFD_NONBLOCK).map_err(|err| VmError::Os {
        what: "eventfd",
        err,
    })?;
    let (stop_tx, stop_rx) = mpsc::channel();
    let mut vcpus = Vec::new();
    let sync_regs = kvm.check_extension(kvm_ioctls::Cap::SyncRegs);
    for (index, mut fd) in (0..args.vcpus).zip(fds) {
        if sync_regs {
            fd.set_sync_valid_reg(kvm_ioctls::SyncReg::Register);
            fd.set_sync_valid_reg(kvm_ioctls::SyncReg::SystemRegister);
        }
        // SAFETY: dup() of a valid fd; the new fd is owned by the VcpuFd made from it.
        let dup = unsafe { libc::dup(fd.as_raw_fd()) };
        if dup < 0 {
            return Err(VmError::Os {
                what: "dup(vcpu fd)",
                err: io::Error::last_os_error(),
            });
        }
        // SAFETY: `dup` is a fresh fd for the same KVM vCPU; KVM allows several handles.
        let state_fd = unsafe { vm.create_vcpu_from_rawfd(dup) }.map_err(kvm_err("KVM vCPU fd"))?;
        let mut pmu = VcpuPmu::new(
            Vpmu::new(model.clone()),
            make_backend(),
            mem.clone(),
            count_cpl3,
        );
        pmu.set_state_fd(state_fd);
        if sync_regs {
            pmu.enable_sync_regs();
        }
        if let Some(path) = &args.trace_msr {
            pmu.set_trace(open_trace(path, index, &model)?);
        }
        pmu.set_block_stepping(!args.no_block_stepping);
        vcpus.push(Vcpu {
            index,
            fd,
            vm: Arc::clone(&vm),
            bus: Arc::clone(&bus),
            pmu,
            stop_tx: stop_tx.clone(),
            stop_evt: stop_evt.try_clone().map_err(|err| VmError::Os {
                what: "eventfd",
                err,
            })?,
            dump_pebs: args.dump_pebs,
        });
    }
    for v in vcpus {
        std::thread::Builder::new()
            .name(format!("vcpu{}", v.index))
            .spawn(move || v.run())
            .map_err(|err| VmError::Os {
                what: "spawning a vCPU thread",
                err,
            })?;
    }
    let end = event_loop(&bus, stop_evt, stop_rx, args.timeout)?;
    bus.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .flush();
    Ok(end)
}

/// Picks the counting backend for `choice`, says in one line which one and what it backs, and
/// returns a constructor for one per vCPU (perf events are opened later, on each vCPU thread).
fn choose_backend(
    kvm: &Kvm,
    choice: PmuBackend,
    tsc_hz: u64,
) -> (impl Fn() -> Backend + use<>, bool) {
    let events = match choice {
        PmuBackend::Perf | PmuBackend::Auto => Some(perf::detect_host_events()),
        _ => None,
    };
    let count_cpl3 = choice == PmuBackend::Precise && probe::cpl3_single_step_works(kvm);
    let line = match (choice, events) {
        (PmuBackend::Precise, _) => format!(
            "pmu backend: precise (single-step + decode; exact counts at {})",
            if count_cpl3 {
                "every CPL"
            } else {
                "CPL0 only: this host cannot single-step CPL3"
            }
        ),
        (PmuBackend::Off, _) => "pmu backend: off (PMU MSRs behave; nothing counts)".to_string(),
        (_, Some(ev)) => PerfBackend::new(ev, tsc_hz).describe(),
        (_, None) => unreachable!("perf and auto always detect host events"),
    };
    eprintln!("vmm: {line}");
    let make = move || match (choice, events) {
        (PmuBackend::Precise, _) => Backend::Precise(Box::default()),
        (_, Some(ev)) => Backend::Perf(PerfBackend::new(ev, tsc_hz)),
        _ => Backend::Off,
    };
    (make, count_cpl3)
}

/// The `--trace-msr` file of vCPU `index` (FILE for vCPU 0, FILE.N for the others).
fn open_trace(
    path: &std::path::Path,
    index: u8,
    model: &CpuModel,
) -> Result<vpmu::trace::TraceWriter<io::BufWriter<std::fs::File>>, VmError> {
    let path = if index == 0 {
        path.to_path_buf()
    } else {
        let mut p = path.as_os_str().to_owned();
        p.push(format!(".{index}"));
        p.into()
    };
    let err = |err| VmError::TraceFile {
        path: path.display().to_string(),
        err,
    };
    let file = std::fs::File::create(&path).map_err(err)?;
    vpmu::trace::TraceWriter::new(io::BufWriter::new(file), &model.name, u32::from(index))
        .map_err(err)
}

/// The rate of the guest's TSC, which the clock-backed cycle counters follow: the model's
/// frequency where KVM can scale the guest TSC (KVM_SET_TSC_KHZ), else whatever the guest TSC
/// runs at (the host's), so that guest cycles and RDTSC agree.
fn guest_tsc_hz(vm: &VmFd, fds: &[kvm_ioctls::VcpuFd], model: &CpuModel) -> u64 {
    const KVM_CAP_TSC_CONTROL: u64 = 60;
    let khz = u32::try_from(model.tsc_hz / 1000).unwrap_or(u32::MAX);
    // Without TSC scaling KVM may accept the value yet leave the guest TSC at the host rate
    // (PVM does), so only trust it where the capability says scaling exists.
    let scaled = vm.check_extension_raw(KVM_CAP_TSC_CONTROL) > 0
        && fds.iter().all(|fd| fd.set_tsc_khz(khz).is_ok());
    if scaled {
        return model.tsc_hz;
    }
    fds.first()
        .and_then(|fd| fd.get_tsc_khz().ok())
        .map_or(model.tsc_hz, |k| u64::from(k) * 1000)
}

/// Sets the guest CPUID for vCPU `index`. Some hosts (PVM-based KVM) silently clear
/// CPUID.1:EDX.DS: say so, and tell the guest through the VMM's own leaf so its tests can tell
/// a host limit from a VMM bug.
fn set_cpuid(
    fd: &kvm_ioctls::VcpuFd,
    supported: &kvm_bindings::CpuId,
    model: &CpuModel,
    index: u8,
) -> Result<(), VmError> {
    let cpuid = cpuid::for_vcpu(supported, model, index);
    fd.set_cpuid2(&cpuid).map_err(kvm_err("KVM_SET_CPUID2"))?;
    let got = fd
        .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm_err("KVM_GET_CPUID2"))?;
    let flags = if cpuid::ds_cleared(&cpuid, &got) {
        if index == 0 {
            eprintln!(
                "vmm: this host's KVM clears CPUID.1:EDX.DS (Debug Store): the guest cannot see DS \
                 (Linux needs the force-DS change in resources/linux-guest/ to use PEBS)"
            );
        }
        cpuid::VPMU_FLAG_DS_CLEARED
    } else {
        0
    };
    fd.set_cpuid2(&cpuid::with_vpmu_leaf(&cpuid, flags))
        .map_err(kvm_err("KVM_SET_CPUID2"))
}

/// Where KVM offers KVM_CAP_PMU_CAPABILITY, turn its own vPMU off so it does not compete for
/// the PMU MSRs (this host reports 0: nothing to do).
fn disable_kvm_vpmu(vm: &VmFd) -> Result<(), VmError> {
    const KVM_CAP_PMU_CAPABILITY: u32 = 225;
    const KVM_PMU_CAP_DISABLE: u64 = 1;
    if vm.check_extension_raw(u64::from(KVM_CAP_PMU_CAPABILITY)) <= 0 {
        return Ok(());
    }
    let cap = kvm_bindings::kvm_enable_cap {
        cap: KVM_CAP_PMU_CAPABILITY,
        args: [KVM_PMU_CAP_DISABLE, 0, 0, 0],
        ..Default::default()
    };
    vm.enable_cap(&cap)
        .map_err(kvm_err("disabling KVM's vPMU (KVM_CAP_PMU_CAPABILITY)"))
}

fn register_memory(vm: &VmFd, mem: &GuestMemoryMmap<()>) -> Result<(), VmError> {
    for (slot, region) in mem.iter().enumerate() {
        let host = mem
            .get_host_address(region.start_addr())
            .map_err(|e| VmError::Memory {
                size: region.len(),
                err: e.to_string(),
            })?;
        let r = kvm_userspace_memory_region {
            slot: u32::try_from(slot).unwrap_or(u32::MAX),
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
            flags: 0,
        };
        // SAFETY: the region is mapped by `mem`, which outlives the VM (both live until the
        // process exits), and the slots do not overlap.
        unsafe { vm.set_user_memory_region(r) }.map_err(kvm_err("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(())
}

/// The main thread's subscriber: guest stop reports, Ctrl-C, and host stdin for the console.
struct Controller {
    bus: Arc<Mutex<Bus>>,
    stop_evt: EventFd,
    sig_evt: EventFd,
    stop_rx: Receiver<VcpuStop>,
    end: Option<RunEnd>,
}

const TOKEN_STOP: u32 = 1;
const TOKEN_SIG: u32 = 2;
const TOKEN_STDIN: u32 = 3;

impl MutEventSubscriber for Controller {
    fn process(&mut self, events: Events, ops: &mut EventOps) {
        match events.data() {
            TOKEN_STOP => {
                let _ = self.stop_evt.read();
                if let Ok(s) = self.stop_rx.try_recv() {
                    self.end = Some(RunEnd::Stopped(s));
                }
            }
            TOKEN_SIG => {
                let _ = self.sig_evt.read();
                self.end = Some(RunEnd::Interrupted);
            }
            TOKEN_STDIN => {
                let mut buf = [0u8; 64];
                // SAFETY: reads into a stack buffer of the given length from fd 0.
                let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
                match usize::try_from(n) {
                    Ok(n) if n > 0 => {
                        let mut bus = self
                            .bus
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner);
                        let _ = bus.uart.enqueue_raw_bytes(&buf[..n]);
                    }
                    // EOF or error: stop watching stdin.
                    _ => {
                        let _ = ops.remove(Events::with_data_raw(0, TOKEN_STDIN, EventSet::IN));
                    }
                }
            }
            _ => {}
        }
    }

    fn init(&mut self, ops: &mut EventOps) {
        let _ = ops.add(Events::with_data(&self.stop_evt, TOKEN_STOP, EventSet::IN));
        let _ = ops.add(Events::with_data(&self.sig_evt, TOKEN_SIG, EventSet::IN));
        // Regular files and /dev/null cannot be polled; then the guest simply gets no input.
        let _ = ops.add(Events::with_data_raw(0, TOKEN_STDIN, EventSet::IN));
    }
}

static SIGNAL_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_terminate(_sig: libc::c_int) {
    let fd = SIGNAL_FD.load(Ordering::Relaxed);
    let one = 1u64.to_ne_bytes();
    // SAFETY: write(2) is async-signal-safe; the buffer is 8 valid bytes and fd is an eventfd
    // that lives for the whole run.
    unsafe { libc::write(fd, one.as_ptr().cast(), one.len()) };
}

fn event_loop(
    bus: &Arc<Mutex<Bus>>,
    stop_evt: EventFd,
    stop_rx: Receiver<VcpuStop>,
    timeout: u64,
) -> Result<RunEnd, VmError> {
    let os = |what| move |err| VmError::Os { what, err };
    let sig_evt = EventFd::new(libc::EFD_NONBLOCK).map_err(os("eventfd"))?;
    SIGNAL_FD.store(sig_evt.as_raw_fd(), Ordering::Relaxed);
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: installs a handler that only calls write(2) on an eventfd.
        unsafe { libc::signal(sig, on_terminate as *const () as libc::sighandler_t) };
    }
    let mut em = EventManager::<Controller>::new().map_err(|e| VmError::Os {
        what: "epoll",
        err: io::Error::other(format!("{e:?}")),
    })?;
    let id = em.add_subscriber(Controller {
        bus: Arc::clone(bus),
        stop_evt,
        sig_evt,
        stop_rx,
        end: None,
    });
    let deadline = (timeout > 0).then(|| Instant::now() + Duration::from_secs(timeout));
    loop {
        let wait_ms = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(RunEnd::TimedOut(timeout));
                }
                i32::try_from(left.as_millis().min(1000)).unwrap_or(1000)
            }
            None => 1000,
        };
        em.run_with_timeout(wait_ms).map_err(|e| VmError::Os {
            what: "epoll_wait",
            err: io::Error::other(format!("{e:?}")),
        })?;
        let ctl = em.subscriber_mut(id).map_err(|e| VmError::Os {
            what: "event manager",
            err: io::Error::other(format!("{e:?}")),
        })?;
        if let Some(end) = ctl.end.take() {
            return Ok(end);
        }
    }
}

/// Exit status for a run's end: the exit-port convention (QEMU isa-debug-exit) for guests,
/// 2 for a crashed guest, 124 for a timeout (as timeout(1)), 130 for Ctrl-C.
pub fn exit_status(end: &RunEnd) -> i32 {
    match end {
        RunEnd::Stopped(VcpuStop {
            reason: StopReason::GuestExit(v),
            ..
        }) => i32::try_from((v << 1) | 1).unwrap_or(i32::MAX),
        RunEnd::Stopped(_) => 2,
        RunEnd::TimedOut(_) => 124,
        RunEnd::Interrupted => 130,
    }
}
