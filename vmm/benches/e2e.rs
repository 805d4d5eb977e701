//! `make bench`'s runner: boots `guest-tests`' `bench` guest through the vmm binary several
//! times per figure, measures the raw single-step floor in a minimal VM of its own, folds in
//! the vpmu criterion results (`<target>/criterion/*/*/new/sample.json`, so run
//! `cargo bench -p vpmu --bench vpmu` first) and prints ONE table: each figure with its median
//! and spread, its floor measured in the same run, the ratio, the target and pass/miss. The
//! same data goes to `<target>/bench/results.json`.
//!
//! Guest figures are TSC ticks; the guest TSC runs at the host TSC rate (the vmm sets no TSC
//! scaling), which this runner calibrates against the monotonic clock. Environment:
//! `BENCH_GUEST` (the bench guest ELF, default guest-tests/target/x86_64-unknown-none/release/bench),
//! `BENCH_REPS` (boots per figure, default 7, at least 5).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use kvm_bindings::{
    KVM_GUESTDBG_ENABLE, KVM_GUESTDBG_SINGLESTEP, kvm_guest_debug, kvm_userspace_memory_region,
};
use kvm_ioctls::{Kvm, VcpuExit};
use serde_json::{Value, json};
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vpmu::model::PebsFormat;
use vpmu::pebs::{adaptive_record_size, legacy_record_size};

/// Median and spread of repeated measurements.
#[derive(Debug, Clone, Copy)]
struct Stat {
    median: f64,
    min: f64,
    max: f64,
    n: usize,
}

impl Stat {
    fn of(v: &[f64]) -> Option<Stat> {
        if v.is_empty() {
            return None;
        }
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let mid = s.len() / 2;
        let median = if s.len() % 2 == 1 {
            s[mid]
        } else {
            (s[mid - 1] + s[mid]) / 2.0
        };
        Some(Stat {
            median,
            min: s[0],
            max: s[s.len() - 1],
            n: s.len(),
        })
    }
    fn json(&self) -> Value {
        json!({"median": self.median, "min": self.min, "max": self.max, "n": self.n})
    }
}

/// A target on the ratio.
#[derive(Debug, Clone, Copy)]
enum Target {
    /// ratio <= x
    AtMost(f64),
    /// ratio >= x
    AtLeast(f64),
    /// the figure's own median (ns) < x
    BelowNs(f64),
}

impl Target {
    fn describe(self) -> String {
        match self {
            Target::AtMost(x) => format!("ratio <= {x:.2}"),
            Target::AtLeast(x) => format!("ratio >= {x:.2}"),
            Target::BelowNs(x) => format!("< {x:.0} ns"),
        }
    }
    fn met(self, value: f64, ratio: Option<f64>) -> Option<bool> {
        match self {
            Target::AtMost(x) => ratio.map(|r| r <= x),
            Target::AtLeast(x) => ratio.map(|r| r >= x),
            Target::BelowNs(x) => Some(value < x),
        }
    }
}

/// One table row.
struct Row {
    name: String,
    unit: &'static str,
    stat: Option<Stat>,
    floor_name: String,
    floor: Option<Stat>,
    /// Ratio of the medians (figure / floor) unless overridden.
    ratio: Option<f64>,
    target: Option<Target>,
    note: String,
}

impl Row {
    fn new(name: &str, unit: &'static str, stat: Option<Stat>) -> Row {
        Row {
            name: name.to_string(),
            unit,
            stat,
            floor_name: String::new(),
            floor: None,
            ratio: None,
            target: None,
            note: String::new(),
        }
    }
    fn floor(mut self, name: &str, floor: Option<Stat>) -> Row {
        self.floor_name = name.to_string();
        self.floor = floor;
        self.ratio = match (self.stat, floor) {
            (Some(s), Some(f)) if f.median > 0.0 => Some(s.median / f.median),
            _ => None,
        };
        self
    }
    fn target(mut self, t: Target) -> Row {
        self.target = Some(t);
        self
    }
    fn note(mut self, n: impl Into<String>) -> Row {
        self.note = n.into();
        self
    }
    fn verdict(&self) -> &'static str {
        let Some(t) = self.target else { return "" };
        match self.stat.and_then(|s| t.met(s.median, self.ratio)) {
            Some(true) => "PASS",
            Some(false) => "MISS",
            None => "ERROR",
        }
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

/// The cargo target dir this bench binary was built in (`<target>/release/deps/e2e-*`).
fn target_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.ancestors().nth(3).map(Path::to_path_buf))
        .unwrap_or_else(|| repo_root().join("target"))
}

fn rdtsc() -> u64 {
    // SAFETY: RDTSC only reads the time-stamp counter.
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Host TSC ticks per second (median of three 100 ms calibrations).
fn tsc_hz() -> f64 {
    let mut v: Vec<f64> = (0..3)
        .map(|_| {
            let (t0, c0) = (Instant::now(), rdtsc());
            std::thread::sleep(Duration::from_millis(100));
            let (t1, c1) = (Instant::now(), rdtsc());
            (c1 - c0) as f64 / (t1 - t0).as_secs_f64()
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[1]
}

// ---- Guest runs ----

/// Boots the bench guest once; returns its `BENCH name value unit` lines.
fn boot(
    guest: &Path,
    backend: &str,
    model: &str,
    cmdline: &str,
) -> Result<BTreeMap<String, f64>, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_vmm"))
        .arg("run")
        .arg("--kernel")
        .arg(guest)
        .args([
            "--timeout",
            "120",
            "--pmu-backend",
            backend,
            "--cpu-model",
            model,
        ])
        .args(["--cmdline", cmdline])
        .output()
        .map_err(|e| format!("cannot run the vmm: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    // Status 1: the guest wrote 0 to the exit port.
    if out.status.code() != Some(1) {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stdout.lines().chain(stderr.lines()).rev().take(4).collect();
        return Err(format!(
            "`{cmdline}` ({backend}): vmm {}: {}",
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        ));
    }
    let mut m = BTreeMap::new();
    for l in stdout.lines() {
        let mut w = l.split_whitespace();
        if w.next() != Some("BENCH") {
            continue;
        }
        if let (Some(k), Some(v)) = (w.next(), w.next().and_then(|v| v.parse().ok())) {
            m.insert(k.to_string(), v);
        }
    }
    Ok(m)
}

/// Values of `keys` over `reps` boots of each config, interleaved so that slow phases of a
/// shared machine hit every config alike.
struct Runs {
    values: BTreeMap<(String, String), Vec<f64>>,
    errors: Vec<String>,
}

fn run_configs(guest: &Path, configs: &[(&str, &str, &str, &str)], reps: usize) -> Runs {
    let configs: Vec<(&str, &str, &str, &str)> = configs.to_vec();
    let mut runs = Runs {
        values: BTreeMap::new(),
        errors: Vec::new(),
    };
    let mut failures: BTreeMap<&str, usize> = BTreeMap::new();
    for _ in 0..reps {
        for &(label, backend, model, cmdline) in &configs {
            // A config that failed twice is not retried: a hang costs the vmm's whole timeout.
            if failures.get(label).is_some_and(|&n| n >= 2) {
                continue;
            }
            match boot(guest, backend, model, cmdline) {
                Ok(m) => {
                    for (k, v) in m {
                        runs.values
                            .entry((label.to_string(), k))
                            .or_default()
                            .push(v);
                    }
                }
                Err(e) => {
                    *failures.entry(label).or_default() += 1;
                    eprintln!("bench: {e}");
                    runs.errors.push(e);
                }
            }
        }
    }
    runs
}

impl Runs {
    fn get(&self, label: &str, key: &str) -> &[f64] {
        self.values
            .get(&(label.to_string(), key.to_string()))
            .map_or(&[], Vec::as_slice)
    }
    fn stat(&self, label: &str, key: &str, scale: f64) -> Option<Stat> {
        let v: Vec<f64> = self.get(label, key).iter().map(|x| x * scale).collect();
        Stat::of(&v)
    }
}

// ---- The raw single-step floor ----

const MEM_SIZE: usize = 0x10000;
const PML4: u64 = 0x1000;
const PDPT: u64 = 0x2000;
const PD: u64 = 0x3000;
const CODE: u64 = 0x4000;
/// `2: dec rcx; jnz 2b; out 0xf4, al`.
const LOOP_CODE: [u8; 7] = [0x48, 0xff, 0xc9, 0x75, 0xfb, 0xe6, 0xf4];

/// What the minimal VM measured.
struct RawFloor {
    /// Single-step exits per second (each one instruction), empty handler, no decoding.
    steps_per_sec: f64,
    /// One KVM_GET_SREGS, ns.
    get_sregs_ns: f64,
    /// One KVM_GET_REGS, ns.
    get_regs_ns: f64,
}

/// A 64-bit CPL0 vCPU running `dec rcx; jnz` for `iters` iterations under
/// KVM_GUESTDBG_SINGLESTEP; the handler only re-enters.
fn raw_single_step(kvm: &Kvm, iters: u64) -> Result<RawFloor, String> {
    let e = |what: &str| {
        let what = what.to_string();
        move |err: kvm_ioctls::Error| format!("{what}: {err}")
    };
    let vm = kvm.create_vm().map_err(e("KVM_CREATE_VM"))?;
    let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), MEM_SIZE)])
        .map_err(|err| format!("guest memory: {err}"))?;
    let w = |v: u64, a: u64| {
        mem.write_obj(v, GuestAddress(a))
            .map_err(|err| format!("{err}"))
    };
    w(PDPT | 0x3, PML4)?;
    w(PD | 0x3, PDPT)?;
    w(0x83, PD)?; // 2 MiB page at 0, P | RW | PS
    mem.write_slice(&LOOP_CODE, GuestAddress(CODE))
        .map_err(|err| format!("{err}"))?;
    let host = mem
        .get_host_address(GuestAddress(0))
        .map_err(|err| format!("{err}"))?;
    let region = kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: 0,
        memory_size: MEM_SIZE as u64,
        userspace_addr: host as u64,
        flags: 0,
    };
    // SAFETY: `mem` maps MEM_SIZE bytes at `host` and outlives the VM (dropped after it).
    unsafe { vm.set_user_memory_region(region) }.map_err(e("KVM_SET_USER_MEMORY_REGION"))?;
    let mut vcpu = vm.create_vcpu(0).map_err(e("KVM_CREATE_VCPU"))?;
    let cpuid = kvm
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .map_err(e("KVM_GET_SUPPORTED_CPUID"))?;
    vcpu.set_cpuid2(&cpuid).map_err(e("KVM_SET_CPUID2"))?;
    let mut s = vcpu.get_sregs().map_err(e("KVM_GET_SREGS"))?;
    s.cr3 = PML4;
    s.cr4 = 0x20; // PAE
    s.cr0 = 0x8000_0031; // PG | NE | ET | PE
    s.efer = 0x500; // LME | LMA
    s.cs.selector = 0x08;
    s.cs.base = 0;
    s.cs.limit = 0xffff_ffff;
    s.cs.type_ = 0xb;
    s.cs.s = 1;
    s.cs.dpl = 0;
    s.cs.present = 1;
    s.cs.l = 1;
    s.cs.db = 0;
    s.cs.g = 1;
    let mut data = s.cs;
    data.selector = 0x10;
    data.type_ = 0x3;
    data.l = 0;
    data.db = 1;
    s.ss = data;
    s.ds = data;
    s.es = data;
    vcpu.set_sregs(&s).map_err(e("KVM_SET_SREGS"))?;
    let mut r = vcpu.get_regs().map_err(e("KVM_GET_REGS"))?;
    r.rip = CODE;
    r.rflags = 0x2;
    r.rsp = 0x8000;
    r.rcx = iters;
    vcpu.set_regs(&r).map_err(e("KVM_SET_REGS"))?;
    let dbg = kvm_guest_debug {
        control: KVM_GUESTDBG_ENABLE | KVM_GUESTDBG_SINGLESTEP,
        ..Default::default()
    };
    vcpu.set_guest_debug(&dbg)
        .map_err(e("KVM_SET_GUEST_DEBUG"))?;
    let mut steps = 0u64;
    let t0 = Instant::now();
    loop {
        match vcpu.run().map_err(e("KVM_RUN"))? {
            VcpuExit::Debug(_) => steps += 1,
            VcpuExit::IoOut(..) => break,
            other => return Err(format!("unexpected exit {other:?}")),
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    // The loop is 2 * iters instructions; fewer steps means stepping stopped early.
    if steps < 2 * iters - 1 {
        return Err(format!(
            "{steps} single-step exits for {} instructions",
            2 * iters
        ));
    }
    let time = |f: &dyn Fn() -> bool| {
        let n = 2000u32;
        let t0 = Instant::now();
        for _ in 0..n {
            if !f() {
                return f64::NAN;
            }
        }
        t0.elapsed().as_secs_f64() * 1e9 / f64::from(n)
    };
    Ok(RawFloor {
        steps_per_sec: steps as f64 / elapsed,
        get_sregs_ns: time(&|| vcpu.get_sregs().is_ok()),
        get_regs_ns: time(&|| vcpu.get_regs().is_ok()),
    })
}

// ---- Criterion results ----

/// Per-iteration times (ns) of each sample of a criterion benchmark.
fn criterion_samples(dir: &Path, group: &str, id: &str) -> Option<Stat> {
    let text = std::fs::read_to_string(dir.join(group).join(id).join("new/sample.json")).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    let iters = v.get("iters")?.as_array()?;
    let times = v.get("times")?.as_array()?;
    let per: Vec<f64> = iters
        .iter()
        .zip(times)
        .filter_map(|(i, t)| Some(t.as_f64()? / i.as_f64()?.max(1.0)))
        .collect();
    Stat::of(&per)
}

fn criterion_ids(dir: &Path, group: &str) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(dir.join(group))
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().join("new/sample.json").exists())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}

fn assist_size(name: &str) -> Option<usize> {
    let all = 0b1111 | 31 << 24;
    Some(match name {
        "netburst" => legacy_record_size(PebsFormat::Netburst)?,
        "fmt0" => legacy_record_size(PebsFormat::Fmt0)?,
        "fmt1" => legacy_record_size(PebsFormat::Fmt1)?,
        "fmt2" => legacy_record_size(PebsFormat::Fmt2)?,
        "fmt3" => legacy_record_size(PebsFormat::Fmt3)?,
        "fmt4" | "fmt5" => adaptive_record_size(0),
        "fmt4_all" | "fmt5_all" => adaptive_record_size(all),
        _ => return None,
    })
}

// ---- Machine ----

fn machine() -> Value {
    let uname = Command::new("uname")
        .arg("-r")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let pvm = Path::new("/sys/module/kvm_pvm").exists();
    json!({"kernel": uname, "cpu": model, "nproc": nproc, "loadavg": load, "kvm_pvm": pvm})
}

// ---- Main ----

fn main() {
    // `cargo bench` passes `--bench`; nothing else is accepted.
    let guest = std::env::var_os("BENCH_GUEST").map_or_else(
        || repo_root().join("guest-tests/target/x86_64-unknown-none/release/bench"),
        PathBuf::from,
    );
    let reps: usize = std::env::var("BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7)
        .max(5);
    if !guest.exists() {
        eprintln!(
            "bench: {} is missing: build the guests first (`make guests`)",
            guest.display()
        );
        std::process::exit(2);
    }
    let machine_before = machine();
    let hz = tsc_hz();
    let ns = 1e9 / hz;
    eprintln!(
        "bench: host TSC {:.3} GHz; {reps} boots per figure",
        hz / 1e9
    );
    let mut rows: Vec<Row> = Vec::new();
    let mut errors: Vec<String> = Vec::new();

    // Exit round trips: precise backend, counters disabled (no stepping).
    eprintln!("bench: exit round trips");
    let exits = run_configs(
        &guest,
        &[
            ("null", "precise", "skylake", "null"),
            ("wrmsr", "precise", "skylake", "wrmsr"),
            ("loop", "precise", "skylake", "loop"),
        ],
        reps,
    );
    errors.extend(exits.errors.iter().cloned());
    let null = exits.stat("null", "null_exit", ns);
    rows.push(Row::new("e2e/null_port_io_exit", "ns", null).note("OUT 0x80 at CPL0, guest RDTSC"));
    rows.push(
        Row::new("e2e/pmu_wrmsr", "ns", exits.stat("wrmsr", "pmu_wrmsr", ns))
            .floor("e2e/null_port_io_exit", null)
            .target(Target::AtMost(1.10))
            .note("WRMSR IA32_PERFEVTSEL0, EN clear"),
    );
    rows.push(
        Row::new(
            "e2e/guest_cpl0_nop",
            "ns",
            exits.stat("loop", "loop_only", ns),
        )
        .floor("e2e/null_port_io_exit", null)
        .note("one NOP of the same unrolled loop: CPL0 instruction cost inside both figures"),
    );

    // PEBS assist + PMI.
    eprintln!("bench: PEBS assist + PMI");
    let pebs = run_configs(
        &guest,
        &[("pebs", "precise", "icelake-server", "pebs")],
        reps,
    );
    errors.extend(pebs.errors.iter().cloned());
    rows.push(
        Row::new(
            "e2e/pebs_assist_pmi",
            "ns",
            pebs.stat("pebs", "pebs_pmi", ns),
        )
        .floor("e2e/null_port_io_exit", null)
        .note("fmt4 all groups, WRMSR to NMI-handler entry"),
    );

    // Precise mode vs the raw single-step floor.
    eprintln!("bench: precise mode and the raw single-step floor");
    let precise = run_configs(
        &guest,
        &[("precise", "precise", "skylake", "precise")],
        reps,
    );
    errors.extend(precise.errors.iter().cloned());
    let ips: Vec<f64> = precise
        .get("precise", "precise_insns")
        .iter()
        .zip(precise.get("precise", "precise_tsc"))
        .map(|(i, t)| i / (t / hz))
        .collect();
    let mut raw = Vec::new();
    let mut sregs = Vec::new();
    let mut regs = Vec::new();
    match Kvm::new() {
        Ok(kvm) => {
            for _ in 0..reps {
                match raw_single_step(&kvm, 10_000) {
                    Ok(f) => {
                        raw.push(f.steps_per_sec);
                        sregs.push(f.get_sregs_ns);
                        regs.push(f.get_regs_ns);
                    }
                    Err(e) => errors.push(format!("raw single-step floor: {e}")),
                }
            }
        }
        Err(e) => errors.push(format!("/dev/kvm: {e}")),
    }
    let raw_stat = Stat::of(&raw);
    rows.push(
        Row::new("floor/raw_single_step", "insn/s", raw_stat)
            .note("minimal VM, empty handler, no decode"),
    );
    rows.push(
        Row::new("e2e/precise_mode", "insn/s", Stat::of(&ips))
            .floor("floor/raw_single_step", raw_stat)
            .target(Target::AtLeast(0.90))
            .note("CPL0 dec/jnz loop counted exactly"),
    );
    rows.push(Row::new("info/KVM_GET_SREGS", "ns", Stat::of(&sregs)));
    rows.push(Row::new("info/KVM_GET_REGS", "ns", Stat::of(&regs)));

    // CPL3 workload slowdown with PEBS sampling on the perf backend.
    eprintln!("bench: CPL3 workload with PEBS sampling");
    // The guest derives the sampling period from the TSC rate it is told (its TSC is the
    // host's: the vmm sets no TSC scaling).
    let tsc_arg = format!("tsc={hz:.0}");
    let (w1k, w10k) = (
        format!("workload hz=1000 {tsc_arg}"),
        format!("workload hz=10000 {tsc_arg}"),
    );
    let work = run_configs(
        &guest,
        &[
            ("off", "off", "skylake", "workload"),
            ("1k", "perf", "skylake", &w1k),
            ("10k", "perf", "skylake", &w10k),
        ],
        reps,
    );
    errors.extend(work.errors.iter().cloned());
    let off = work.stat("off", "workload_tsc", ns / 1e6);
    rows.push(
        Row::new("e2e/workload_pmu_off", "ms", off).note("CPL3 xorshift+stores, --pmu-backend off"),
    );
    for (label, hz_req) in [("1k", 1000.0), ("10k", 10000.0)] {
        let stat = work.stat(label, "workload_tsc", ns / 1e6);
        let rate: Vec<f64> = work
            .get(label, "workload_samples")
            .iter()
            .zip(work.get(label, "workload_tsc"))
            .map(|(s, t)| s / (t / hz))
            .collect();
        let rate = Stat::of(&rate).map_or(0.0, |s| s.median);
        let mut row = Row::new(&format!("e2e/workload_pebs_{label}hz"), "ms", stat)
            .floor("e2e/workload_pmu_off", off)
            .note(format!(
                "perf backend, {rate:.0} PMIs/s for {hz_req:.0} requested"
            ));
        if label == "1k" {
            row = row.target(Target::AtMost(1.02));
        }
        rows.push(row);
    }

    // Criterion (vpmu).
    let crit = target_dir().join("criterion");
    if !crit.exists() {
        errors.push(format!(
            "{} is missing: run `cargo bench -p vpmu --bench vpmu` first",
            crit.display()
        ));
    }
    for id in criterion_ids(&crit, "msr") {
        rows.push(
            Row::new(
                &format!("msr/{id}"),
                "ns",
                criterion_samples(&crit, "msr", &id),
            )
            .floor("e2e/null_port_io_exit", null)
            .note("vpmu handler alone; ratio = share of a null exit"),
        );
    }
    for id in criterion_ids(&crit, "assist") {
        let size = assist_size(&id);
        let floor_id = size.map(|s| format!("copy_{s}_bytes")).unwrap_or_default();
        let mut row = Row::new(
            &format!("assist/{id}"),
            "ns",
            criterion_samples(&crit, "assist", &id),
        )
        .floor(
            &format!("floor/{floor_id}"),
            criterion_samples(&crit, "floor", &floor_id),
        );
        if id == "fmt4_all" {
            row = row.target(Target::BelowNs(150.0));
        }
        rows.push(row.note(size.map(|s| format!("{s}-byte record")).unwrap_or_default()));
    }
    for (id, floor) in [("cold", "floor_cold"), ("warm", "floor_warm")] {
        rows.push(
            Row::new(
                &format!("walk/{id}"),
                "ns",
                criterion_samples(&crit, "walk", id),
            )
            .floor(
                &format!("walk/{floor}"),
                criterion_samples(&crit, "walk", floor),
            )
            .note("4-level, 4 KiB; no walker cache, so cold/warm = host cache state"),
        );
    }

    let machine_after = machine();
    print_table(&rows, &machine_before, &machine_after, hz, reps);
    for e in &errors {
        println!("error: {e}");
    }
    let json_rows: Vec<Value> = rows
        .iter()
        .map(|r| {
            json!({
                "figure": r.name, "unit": r.unit, "value": r.stat.map(|s| s.json()),
                "floor": r.floor_name, "floor_value": r.floor.map(|s| s.json()),
                "ratio": r.ratio, "target": r.target.map(Target::describe),
                "verdict": r.verdict(), "note": r.note,
            })
        })
        .collect();
    let doc = json!({
        "machine": machine_before, "machine_after": machine_after, "tsc_hz": hz,
        "boots_per_figure": reps, "rows": json_rows, "errors": errors,
    });
    let dir = target_dir().join("bench");
    let path = dir.join("results.json");
    let written = std::fs::create_dir_all(&dir).and_then(|()| {
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&doc).unwrap_or_default(),
        )
    });
    match written {
        Ok(()) => println!("results: {}", path.display()),
        Err(e) => {
            eprintln!("bench: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
    if !errors.is_empty() {
        std::process::exit(1);
    }
}

fn fmt_num(v: f64) -> String {
    if v >= 1e6 {
        format!("{:.3}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.1}k", v / 1e3)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn print_table(rows: &[Row], before: &Value, after: &Value, hz: f64, reps: usize) {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "machine: {} | {} CPUs | kernel {} | PVM-based KVM: {} | host TSC {:.3} GHz | load avg {} (start) / {} (end)",
        before["cpu"].as_str().unwrap_or("?"),
        before["nproc"],
        before["kernel"].as_str().unwrap_or("?"),
        before["kvm_pvm"],
        hz / 1e9,
        before["loadavg"].as_str().unwrap_or("?"),
        after["loadavg"].as_str().unwrap_or("?"),
    );
    let _ = writeln!(
        out,
        "e2e: median over {reps} boots (each boot: median of its batches), spread = min-max over boots; criterion: median and min-max of per-sample means"
    );
    let _ = writeln!(
        out,
        "{:<30} {:>10} {:>21} {:>3}  {:<26} {:>10} {:>8}  {:<14} {:<6} note",
        "figure", "median", "spread", "n", "floor", "floor med", "ratio", "target", "result"
    );
    for r in rows {
        let (med, spread, n) = match r.stat {
            Some(s) => (
                format!("{} {}", fmt_num(s.median), r.unit),
                format!("{}-{}", fmt_num(s.min), fmt_num(s.max)),
                s.n.to_string(),
            ),
            None => ("n/a".into(), String::new(), "0".into()),
        };
        let fmed = r.floor.map(|f| fmt_num(f.median)).unwrap_or_default();
        let ratio = r.ratio.map(|x| format!("{x:.3}x")).unwrap_or_default();
        let target = r.target.map(Target::describe).unwrap_or_default();
        let _ = writeln!(
            out,
            "{:<30} {:>10} {:>21} {:>3}  {:<26} {:>10} {:>8}  {:<14} {:<6} {}",
            r.name,
            med,
            spread,
            n,
            r.floor_name,
            fmed,
            ratio,
            target,
            r.verdict(),
            r.note
        );
    }
    print!("{out}");
}
