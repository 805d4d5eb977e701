//! Boots every guest program of `guest-tests/` through the `vmm` binary and checks its verdict.
//!
//! The guest crate is built once per test process (`cargo build --release --target
//! x86_64-unknown-none`, its own target dir `guest-tests/target`); `mbtest` is then converted to
//! ELF32 with `objcopy -O elf32-i386` (as kvm-unit-tests does for its `.flat` images), giving
//! `mbtest.elf32` next to it. Each guest runs as a separate `vmm run` process. A guest passes when
//! the vmm exits with status 1 (the guest wrote 0 to port 0xf4), its serial output ends with
//! `N passed, 0 failed` where N > 0 equals the number of `PASS ` lines, and no line starts with
//! `FAIL`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

mod common;
use common::Run;
use vpmu::model::PRESET_NAMES;

/// Target triple of the guest programs.
const GUEST_TARGET: &str = "x86_64-unknown-none";
/// The vmm's own per-run timeout (seconds); the harness kills the process a bit later.
const VMM_TIMEOUT_SECS: u64 = 120;
const KILL_AFTER: Duration = Duration::from_secs(VMM_TIMEOUT_SECS + 60);
/// Status of `vmm run` when the guest wrote 0 to the exit port ((0 << 1) | 1).
const STATUS_GUEST_PASSED: i32 = 1;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("vmm/ has a parent directory")
        .to_path_buf()
}

fn guest_dir() -> PathBuf {
    repo_root().join("guest-tests")
}

/// Directory holding the built guest binaries.
fn guest_bin_dir() -> PathBuf {
    guest_dir()
        .join("target")
        .join(GUEST_TARGET)
        .join("release")
}

/// Environment variables of an outer cargo/coverage run that must not leak into the guest
/// build: host RUSTFLAGS (e.g. -C instrument-coverage) break a no_std target, and an inherited
/// target dir or build target would move or change the output.
const SCRUBBED_ENV: &[&str] = &[
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_TARGET_DIR",
    "CARGO_BUILD_TARGET",
    "CARGO_BUILD_TARGET_DIR",
    "CARGO_LLVM_COV",
    "CARGO_LLVM_COV_TARGET_DIR",
    "LLVM_PROFILE_FILE",
];

const MISSING_TARGET_HINT: &str = "the x86_64-unknown-none target is missing: run `rustup target add x86_64-unknown-none` or `make test`";

/// True if rustc has the guest target's standard library (libcore) installed.
fn target_installed() -> bool {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let Ok(out) = Command::new(rustc)
        .args(["--print", "target-libdir", "--target", GUEST_TARGET])
        .output()
    else {
        return false;
    };
    let libdir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    out.status.success()
        && std::fs::read_dir(libdir).is_ok_and(|mut d| {
            d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("libcore-")))
        })
}

/// Build the guest crate and convert mbtest; Err carries a message for every test to report.
fn build_guests() -> Result<PathBuf, String> {
    if !target_installed() {
        return Err(MISSING_TARGET_HINT.to_string());
    }
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let dir = guest_dir();
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&dir)
        .args([
            "build",
            "--release",
            "--target",
            GUEST_TARGET,
            "--manifest-path",
        ])
        .arg(dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(dir.join("target"));
    for var in SCRUBBED_ENV {
        cmd.env_remove(var);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run cargo for guest-tests: {e}"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let hint = if stderr.contains("can't find crate for `core`") {
            MISSING_TARGET_HINT
        } else {
            "guest-tests does not build"
        };
        return Err(format!("{hint}:\n{stderr}"));
    }
    let bins = guest_bin_dir();
    to_elf32(&bins.join("mbtest"), &bins.join("mbtest.elf32"))?;
    Ok(bins)
}

/// objcopy candidates: binutils, LLVM, then the one shipped with rustup's llvm-tools.
fn objcopy_candidates() -> Vec<PathBuf> {
    let mut v = vec![PathBuf::from("objcopy"), PathBuf::from("llvm-objcopy")];
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    if let Ok(out) = Command::new(rustc).args(["--print", "sysroot"]).output() {
        let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if let Ok(dirs) = std::fs::read_dir(sysroot.join("lib/rustlib")) {
            v.extend(dirs.flatten().map(|d| d.path().join("bin/rust-objcopy")));
        }
    }
    v
}

/// ELF64 -> ELF32 (EM_386) as kvm-unit-tests does for multiboot images; debug info dropped.
fn to_elf32(input: &Path, output: &Path) -> Result<(), String> {
    let mut errors = Vec::new();
    for tool in objcopy_candidates() {
        match Command::new(&tool)
            .args(["-O", "elf32-i386", "--strip-debug"])
            .arg(input)
            .arg(output)
            .output()
        {
            Ok(o) if o.status.success() => return Ok(()),
            Ok(o) => errors.push(format!(
                "{}: {}",
                tool.display(),
                String::from_utf8_lossy(&o.stderr)
            )),
            Err(e) => errors.push(format!("{}: {e}", tool.display())),
        }
    }
    Err(format!(
        "cannot convert {} to ELF32:\n{}",
        input.display(),
        errors.join("\n")
    ))
}

/// The guest binaries directory, built once per test process.
fn guests() -> &'static Path {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BUILT.get_or_init(build_guests) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

fn run_vmm(kernel: &Path, extra: &[&str]) -> Run {
    common::run_vmm(kernel, VMM_TIMEOUT_SECS, KILL_AFTER, extra)
}

/// Check a guest's serial output: `N passed, 0 failed` (N > 0, N = number of `PASS ` lines) and
/// no `FAIL` line. Returns N.
fn check_output(stdout: &str) -> Result<usize, String> {
    let lines: Vec<&str> = stdout.lines().map(str::trim_end).collect();
    if let Some(l) = lines.iter().find(|l| l.starts_with("FAIL")) {
        return Err(format!("guest reported a failure: {l}"));
    }
    let passes = lines.iter().filter(|l| l.starts_with("PASS ")).count();
    // The summary is the guest's last word; vmm diagnostics may follow, guest results may not.
    let Some(at) = lines.iter().rposition(|l| parse_summary(l).is_some()) else {
        return Err("no `N passed, M failed` summary line".to_string());
    };
    if lines[at + 1..].iter().any(|l| l.starts_with("PASS ")) {
        return Err("PASS lines after the summary".to_string());
    }
    let (passed, failed) = parse_summary(lines[at]).unwrap_or_default();
    if failed != 0 {
        return Err(format!("summary reports {failed} failed"));
    }
    if passed == 0 {
        return Err("summary reports 0 passed".to_string());
    }
    if passed != passes {
        return Err(format!(
            "summary says {passed} passed but there are {passes} PASS lines"
        ));
    }
    Ok(passed)
}

/// Parse `N passed, M failed`.
fn parse_summary(line: &str) -> Option<(usize, usize)> {
    let (p, rest) = line.trim().split_once(" passed, ")?;
    let f = rest.strip_suffix(" failed")?;
    Some((p.parse().ok()?, f.parse().ok()?))
}

/// Boot `kernel` with `extra` arguments, assert the guest passed, and return the run.
fn boot_and_check(name: &str, kernel: &Path, extra: &[&str]) -> Run {
    let run = run_vmm(kernel, extra);
    let verdict = if run.timed_out {
        Err(format!("killed after {KILL_AFTER:?}"))
    } else if run.status != Some(STATUS_GUEST_PASSED) {
        Err(format!(
            "vmm exit status {:?}, want {STATUS_GUEST_PASSED} (guest exit code 0)",
            run.status
        ))
    } else {
        check_output(&run.stdout).map(|_| ())
    };
    if let Err(e) = verdict {
        panic!(
            "guest {name} failed after {:?}: {e}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            run.took, run.stdout, run.stderr
        );
    }
    run
}

#[test]
fn guest_smoke() {
    let bin = guests().join("smoke");
    boot_and_check("smoke", &bin, &["--vcpus", "2"]);
}

/// Exact counting with the precise backend; two runs print identical counts (determinism).
#[test]
fn guest_precise_counts_are_exact_and_deterministic() {
    let bin = guests().join("precise");
    let counts = |run: &Run| -> Vec<String> {
        run.stdout
            .lines()
            .filter(|l| l.contains("counts:") || l.contains("determinism:") || l.contains("rdpmc "))
            .map(str::to_string)
            .collect()
    };
    let args = ["--pmu-backend", "precise", "--cpu-model", "skylake"];
    let a = counts(&boot_and_check("precise", &bin, &args));
    let b = counts(&boot_and_check("precise", &bin, &args));
    assert!(a.len() >= 6, "count lines missing: {a:?}");
    assert_eq!(a, b, "two runs of the same guest counted differently");
}

/// RDPMC through the #GP-handler breakpoint when no backend single-steps.
#[test]
fn guest_rdpmc_without_stepping() {
    let bin = guests().join("precise");
    for backend in ["off", "perf"] {
        let args = ["--pmu-backend", backend, "--cmdline", "rdpmc-only"];
        boot_and_check("precise (rdpmc-only)", &bin, &args);
    }
}

#[test]
fn guest_demo() {
    let bin = guests().join("demo");
    boot_and_check("demo", &bin, &[]);
}

/// Virtual PEBS end to end on one preset (`pebs` guest: records, reloads, thresholds, buffer
/// full, page-crossing and high-memory buffers, adaptive groups and fixed counter 0).
fn pebs_guest(preset: &str) {
    let bin = guests().join("pebs");
    let args = [
        "--pmu-backend",
        "precise",
        "--cpu-model",
        preset,
        "--cmdline",
        preset,
    ];
    boot_and_check(&format!("pebs ({preset})"), &bin, &args);
}

/// The demo samples with PEBS on every preset (what `make run VMM_ARGS="--cpu-model X"` does).
#[test]
fn guest_demo_pebs_every_preset() {
    let bin = guests().join("demo");
    for &preset in PRESET_NAMES {
        let args = [
            "--pmu-backend",
            "precise",
            "--cpu-model",
            preset,
            "--dump-pebs",
        ];
        let run = boot_and_check(&format!("demo ({preset})"), &bin, &args);
        assert!(
            run.stdout.contains(" 7 records over "),
            "demo ({preset}) did not report 7 PEBS records:\n{}",
            run.stdout
        );
    }
}

#[test]
fn guest_pebs_netburst() {
    pebs_guest("netburst");
}

#[test]
fn guest_pebs_core2() {
    pebs_guest("core2");
}

#[test]
fn guest_pebs_nehalem() {
    pebs_guest("nehalem");
}

#[test]
fn guest_pebs_haswell() {
    pebs_guest("haswell");
}

#[test]
fn guest_pebs_skylake() {
    pebs_guest("skylake");
}

#[test]
fn guest_pebs_icelake_server() {
    pebs_guest("icelake-server");
}

#[test]
fn guest_pebs_sapphire_rapids() {
    pebs_guest("sapphire-rapids");
}

#[test]
fn guest_mbtest() {
    let bin = guests().join("mbtest.elf32");
    boot_and_check(
        "mbtest",
        &bin,
        &["--vcpus", "1", "--mem", "128M", "--cmdline", "arg1 arg2"],
    );
}

/// Boot `pmu_arch` on `preset` with the precise backend; the guest reads the preset name from
/// its command line to pick its expectations (CPUID, MSR rules, counts, overflow and PMI).
fn pmu_arch(preset: &str) {
    let bin = guests().join("pmu_arch");
    let args = [
        "--cpu-model",
        preset,
        "--pmu-backend",
        "precise",
        "--cmdline",
        preset,
    ];
    boot_and_check(&format!("pmu_arch({preset})"), &bin, &args);
}

#[test]
fn guest_pmu_arch_netburst() {
    pmu_arch("netburst");
}

#[test]
fn guest_pmu_arch_core2() {
    pmu_arch("core2");
}

#[test]
fn guest_pmu_arch_nehalem() {
    pmu_arch("nehalem");
}

#[test]
fn guest_pmu_arch_haswell() {
    pmu_arch("haswell");
}

#[test]
fn guest_pmu_arch_skylake() {
    pmu_arch("skylake");
}

#[test]
fn guest_pmu_arch_icelake_server() {
    pmu_arch("icelake-server");
}

#[test]
fn guest_pmu_arch_sapphire_rapids() {
    pmu_arch("sapphire-rapids");
}

/// What `vmm run` prints (once) when a guest enables LBR/BTS without the precise backend.
const NEED_PRECISE: &str = "need --pmu-backend precise";

/// Boot `branches` on `preset`: with the precise backend (LBR entries, TOS wrap-around,
/// LBR_SELECT, freeze on PMI, BTS records / threshold PMI / wrap / full buffer, adaptive PEBS
/// LBR group), then with `--pmu-backend off` (LBR MSR rules, entries stay empty) where stderr
/// must say exactly once that branch records need the precise backend.
fn branches(preset: &str) {
    let bin = guests().join("branches");
    let args = [
        "--pmu-backend",
        "precise",
        "--cpu-model",
        preset,
        "--cmdline",
        preset,
    ];
    let run = boot_and_check(&format!("branches({preset})"), &bin, &args);
    assert!(
        !run.stderr.contains(NEED_PRECISE),
        "branches({preset}): precise run warned about branch records:\n{}",
        run.stderr
    );
    let cmdline = format!("{preset} off");
    let args = [
        "--pmu-backend",
        "off",
        "--cpu-model",
        preset,
        "--cmdline",
        &cmdline,
    ];
    let run = boot_and_check(&format!("branches({preset}, off)"), &bin, &args);
    let warnings = run
        .stderr
        .lines()
        .filter(|l| l.contains(NEED_PRECISE))
        .count();
    assert_eq!(
        warnings, 1,
        "branches({preset}, off): want exactly one `{NEED_PRECISE}` line:\n{}",
        run.stderr
    );
}

#[test]
fn guest_branches_core2() {
    branches("core2");
}

#[test]
fn guest_branches_nehalem() {
    branches("nehalem");
}

#[test]
fn guest_branches_haswell() {
    branches("haswell");
}

#[test]
fn guest_branches_skylake() {
    branches("skylake");
}

#[test]
fn guest_branches_icelake_server() {
    branches("icelake-server");
}

#[test]
fn guest_branches_sapphire_rapids() {
    branches("sapphire-rapids");
}

/// Boot the `msr_fuzz` guest (seeded RDMSR/WRMSR against the guest's own MSR model, with
/// counted regions and PEBS armed in between) on `preset`.
fn msr_fuzz(preset: &str, backend: &str, guest_args: &str) -> Run {
    let bin = guests().join("msr_fuzz");
    let cmdline = format!("{preset} {guest_args}");
    let args = [
        "--cpu-model",
        preset,
        "--pmu-backend",
        backend,
        "--cmdline",
        cmdline.trim(),
    ];
    boot_and_check(&format!("msr_fuzz({preset} {guest_args})"), &bin, &args)
}

/// The MSR fuzzer with its default seed and iteration count on every preset, precise backend
/// (counted regions checked exactly).
#[test]
fn guest_msr_fuzz_every_preset() {
    for &preset in PRESET_NAMES {
        let run = msr_fuzz(preset, "precise", "");
        assert!(
            run.stdout.contains(" 0 mismatches"),
            "msr_fuzz({preset}) printed no summary:\n{}",
            run.stdout
        );
    }
}

/// A long fuzz run (20000 iterations, another seed) with the backend off, so nothing counts
/// and it stays fast: the VMM survives and every access still matches the model.
#[test]
fn guest_msr_fuzz_long_run_survives() {
    let run = msr_fuzz("skylake", "off", "seed=c0ffee iters=20000 count=none");
    assert!(
        run.stdout.contains("iters=20000: ") && run.stdout.contains(" 0 mismatches"),
        "long msr_fuzz run did not finish cleanly:\n{}",
        run.stdout
    );
}

#[test]
fn output_check_accepts_a_clean_run() {
    let out = "== s: 2 tests\nPASS a\n  info\nPASS b\n2 passed, 0 failed\nvmm: guest exit code 0\n";
    assert_eq!(check_output(out), Ok(2));
    assert_eq!(check_output(&out.replace('\n', "\r\n")), Ok(2));
}

#[test]
fn output_check_rejects_failures_and_mismatches() {
    assert!(check_output("PASS a\nFAIL b: x\n1 passed, 1 failed\n").is_err());
    assert!(check_output("PASS a\n1 passed, 1 failed\n").is_err());
    assert!(check_output("PASS a\nPASS b\n1 passed, 0 failed\n").is_err());
    assert!(check_output("0 passed, 0 failed\n").is_err());
    assert!(check_output("PASS a\n").is_err());
    assert!(check_output("1 passed, 0 failed\nPASS a\n").is_err());
}

/// The perf backend (host task clock on this host) seen from a guest, on skylake (format-3 PEBS
/// on PMC0) and icelake-server (adaptive PEBS on fixed counter 1): sampling rate, record IPs in
/// the CPL3 loop, counting monotonic, the refusal of an event the host cannot back (exactly one
/// message naming the backed events and `--pmu-backend precise`), and the skid. Measured on the
/// development host (PVM, 2 loaded cores): records match the vCPU's running time to +-2 %; the
/// skid is 100-150 us of vCPU time (signal delivery plus the exit), in a debug vmm.
#[test]
fn guest_perf_backend_sampling_counting_and_refusal() {
    let bin = guests().join("perfbackend");
    for preset in ["skylake", "icelake-server"] {
        let args = ["--pmu-backend", "perf", "--cpu-model", preset];
        let run = boot_and_check(&format!("perfbackend({preset})"), &bin, &args);
        let refusals = run
            .stderr
            .lines()
            .filter(|l| l.contains("instructions retired cannot be counted"))
            .collect::<Vec<_>>();
        assert_eq!(refusals.len(), 1, "{preset}: {}", run.stderr);
        assert!(
            refusals[0].contains("unhalted core cycles and unhalted reference cycles")
                && refusals[0].contains("`--pmu-backend precise`"),
            "{}",
            refusals[0]
        );
        let skid = run
            .stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix("skid: "))
            .unwrap_or_else(|| panic!("{preset}: no skid line\n{}", run.stdout));
        println!("perfbackend({preset}) skid: {skid}");
        // "not measured": the host descheduled the vCPU before the first record.
        if let Some(cycles) = skid
            .strip_prefix("median ")
            .and_then(|r| r.split(' ').next())
        {
            let cycles: i64 = cycles.parse().expect("skid cycles");
            // The record follows the overflow, but the guest can only estimate the crossing: it
            // reads its enable TSC after counting started (CPL0 is emulated here), and the host
            // clock counts the VMM's own exit handling as guest cycles, which moves crossings
            // earlier than the guest's running-TSC estimate (seen: -34 us under load). Allow
            // 500 us below zero; above, 5 ms at the 2.4 GHz guest TSC.
            assert!(cycles > -1_250_000, "{preset}: skid {skid}");
            assert!(cycles < 12_000_000, "{preset}: skid {skid}");
        }
    }
}

/// `vmm run --trace-msr` records every PMU trap, count, overflow and PMI; `vmm replay` re-runs
/// the trace against the vPMU without KVM, and a different CPU model diverges.
#[test]
fn trace_record_and_replay() {
    let bin = guests().join("pebs");
    let dir = std::env::temp_dir().join(format!("vmm-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let trace = dir.join("pebs.trace");
    let trace_arg = trace.to_str().expect("utf-8 temp path");
    let args = [
        "--pmu-backend",
        "precise",
        "--cpu-model",
        "skylake",
        "--cmdline",
        "skylake",
        "--trace-msr",
        trace_arg,
    ];
    boot_and_check("pebs (traced)", &bin, &args);
    let text = std::fs::read_to_string(&trace).expect("trace written");
    assert!(
        text.starts_with("# vpmu-trace v1 model=skylake vcpu=0"),
        "{text:.200}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("overflow ")),
        "no overflow line"
    );
    let replay = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_vmm"))
            .arg("replay")
            .arg(&trace)
            .args(extra)
            .output()
            .expect("run vmm replay")
    };
    let ok = replay(&[]);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).contains("overflow"));
    let bad = replay(&["--cpu-model", "haswell"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("diverged"));
    let _ = std::fs::remove_dir_all(&dir);
}
