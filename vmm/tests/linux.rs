//! Boots the guest Linux kernel of `resources/linux-guest/` (built by `make linux-guest`) on
//! every preset CPU model whose PEBS format Linux supports, and checks that Linux's own perf
//! driver found the format and that its built-in vPMU self-test passed.
//!
//! The kernel is `target/linux-guest/vmlinux` (or `$VMM_LINUX_KERNEL`); when it is absent each
//! test prints a SKIP line and returns, so `cargo test --workspace` stays usable without a
//! kernel build. `$VMM_LINUX_MODELS` picks the models: `all` or a comma-separated list of
//! presets; unset means skylake only, which is what `make test` runs (each boot takes 30-40 s
//! on an idle host). `make linux-test` builds the kernel and runs all of them.
//!
//! Per model the test runs `vmm run --pmu-backend perf` (cycles map onto the host task clock;
//! the precise backend single-steps and is far too slow for a booting kernel) with the command
//! line of `resources/linux-guest/cmdline` plus `vpmu_selftest.fmt=N`, N taken from the
//! model's TOML. It passes when:
//! * the vmm exits with status 1 (the guest wrote 0 to port 0xf4),
//! * the kernel's `Performance Events:` line names the format and the model's event table
//!   (Linux 6.12 prints `PEBS fmt4+-baseline` for formats 4, 5 and 6 alike; the self-test's
//!   `pebs_format` check compares the exact number),
//! * the self-test printed `N passed, 0 failed` with N equal to its `PASS` lines and no `FAIL`,
//! * no kernel warning, oops or perf-driver complaint appeared.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

mod common;
use common::Run;

use vpmu::model::{CpuModel, PebsFormat};

/// The vmm's own timeout (seconds): boot ~10 s plus two workload modes, with a wide margin for
/// a loaded host.
const VMM_TIMEOUT_SECS: u64 = 300;
const KILL_AFTER: Duration = Duration::from_secs(VMM_TIMEOUT_SECS + 60);
/// Status of `vmm run` when the guest wrote 0 to the exit port ((0 << 1) | 1).
const STATUS_GUEST_PASSED: i32 = 1;
/// Guest console lines that fail a run whatever the self-test says.
const BAD_LINES: &[&str] = &[
    "WARNING:",
    "BUG:",
    "Oops",
    "Kernel panic",
    "irq loop stuck",
    "Uhhuh. NMI received",
    "PMU not available due to virtualization",
    "PEBS disabled",
];

/// One guest at a time: each vCPU needs a whole host core for its CPL0 emulation, and the
/// self-test's workload is timed with the TSC, so parallel boots would starve each other.
static ONE_GUEST: Mutex<()> = Mutex::new(());

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("vmm/ has a parent directory")
        .to_path_buf()
}

/// Model boots `make test` runs when `VMM_LINUX_MODELS` is unset.
const DEFAULT_MODELS: &str = "skylake";

/// Whether `$VMM_LINUX_MODELS` (or the default) selects `model`.
fn selected(model: &str) -> bool {
    let list = std::env::var("VMM_LINUX_MODELS").unwrap_or_else(|_| DEFAULT_MODELS.to_string());
    list.trim() == "all" || list.split(',').any(|m| m.trim() == model)
}

fn kernel_path() -> PathBuf {
    std::env::var_os("VMM_LINUX_KERNEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/linux-guest/vmlinux"))
}

/// The shared guest command line: non-comment lines of resources/linux-guest/cmdline.
fn base_cmdline() -> String {
    let path = repo_root().join("resources/linux-guest/cmdline");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect::<Vec<_>>()
        .join(" ")
}

/// PEBS format number and trap-like flag of a preset, from its TOML (the model the VMM will
/// present).
fn pebs_format(model: &str) -> (u8, bool) {
    let m = CpuModel::preset(model).unwrap_or_else(|e| panic!("preset {model}: {e}"));
    let fmt = match m.pebs_format {
        PebsFormat::Fmt0 => 0,
        PebsFormat::Fmt1 => 1,
        PebsFormat::Fmt2 => 2,
        PebsFormat::Fmt3 => 3,
        PebsFormat::Fmt4 => 4,
        PebsFormat::Fmt5 => 5,
        other => panic!("preset {model} has {other:?}, which Linux's PEBS driver does not know"),
    };
    (fmt, m.pebs_trap)
}

/// What 6.12's `intel_ds_init` prints for a format: `+` for trap-like records, and formats
/// 4-6 share one `pr_cont` (the presets with those formats all have the baseline record).
fn printed_format(fmt: u8, trap: bool) -> String {
    let kind = if trap { '+' } else { '-' };
    if fmt >= 4 {
        format!("PEBS fmt4{kind}-baseline")
    } else {
        format!("PEBS fmt{fmt}{kind}")
    }
}

/// Strip the `[    1.234567] ` printk time stamp.
fn strip_time(line: &str) -> &str {
    let l = line.trim_end_matches('\r').trim_end();
    if let Some(rest) = l.strip_prefix('[')
        && let Some((stamp, text)) = rest.split_once("] ")
        && stamp.trim().parse::<f64>().is_ok()
    {
        return text;
    }
    l
}

/// Parse `N passed, M failed`.
fn parse_summary(line: &str) -> Option<(usize, usize)> {
    let (p, rest) = line.trim().split_once(" passed, ")?;
    let f = rest.strip_suffix(" failed")?;
    Some((p.parse().ok()?, f.parse().ok()?))
}

/// Checks one boot's console output; returns the number of passed checks.
fn check_console(out: &str, fmt: u8, trap: bool, events: &str) -> Result<usize, String> {
    let lines: Vec<&str> = out.lines().map(strip_time).collect();
    let perf_line = lines
        .iter()
        .find(|l| l.starts_with("Performance Events:"))
        .ok_or("no `Performance Events:` line: the perf driver did not initialise")?;
    let want = printed_format(fmt, trap);
    if !perf_line.contains(&format!("{want}, ")) || !perf_line.contains(events) {
        return Err(format!(
            "`{perf_line}` does not name `{want}` and `{events}`"
        ));
    }
    if let Some(l) = lines
        .iter()
        .find(|l| BAD_LINES.iter().any(|b| l.contains(b)))
    {
        return Err(format!("kernel complained: {l}"));
    }
    if let Some(l) = lines.iter().find(|l| l.starts_with("FAIL")) {
        return Err(format!("self-test failure: {l}"));
    }
    let passes = lines.iter().filter(|l| l.starts_with("PASS ")).count();
    let Some(at) = lines.iter().rposition(|l| parse_summary(l).is_some()) else {
        return Err("no `N passed, M failed` line: the self-test did not finish".to_string());
    };
    let (passed, failed) = parse_summary(lines[at]).unwrap_or_default();
    if failed != 0 || passed == 0 || passed != passes {
        return Err(format!("summary `{}` with {passes} PASS lines", lines[at]));
    }
    Ok(passed)
}

fn run_vmm(kernel: &Path, model: &str, cmdline: &str) -> Run {
    let args = [
        "--cpu-model",
        model,
        "--pmu-backend",
        "perf",
        "--mem",
        "256M",
        "--cmdline",
        cmdline,
    ];
    common::run_vmm(kernel, VMM_TIMEOUT_SECS, KILL_AFTER, &args)
}

/// Boot the kernel on `model` and require Linux's PEBS driver and self-test to pass.
fn boot_model(model: &str, events: &str) {
    if !selected(model) {
        println!(
            "SKIP linux guest on {model}: not in VMM_LINUX_MODELS (default {DEFAULT_MODELS}; `make linux-test` runs all)"
        );
        return;
    }
    let kernel = kernel_path();
    if !kernel.is_file() {
        println!(
            "SKIP linux guest on {model}: {} is not built (run `make linux-guest`, or `make linux-test` for the whole matrix)",
            kernel.display()
        );
        return;
    }
    let (fmt, trap) = pebs_format(model);
    let cmdline = format!("{} vpmu_selftest.fmt={fmt}", base_cmdline());
    // A panic in another test poisons the lock without leaving anything half-done.
    let guard = ONE_GUEST.lock().unwrap_or_else(|e| e.into_inner());
    let run = run_vmm(&kernel, model, &cmdline);
    drop(guard);
    let verdict = if run.timed_out {
        Err(format!("killed after {KILL_AFTER:?}"))
    } else {
        check_console(&run.stdout, fmt, trap, events).and_then(|n| {
            if run.status == Some(STATUS_GUEST_PASSED) {
                Ok(n)
            } else {
                Err(format!(
                    "vmm exit status {:?}, want {STATUS_GUEST_PASSED} (guest exit code 0)",
                    run.status
                ))
            }
        })
    };
    match verdict {
        Ok(n) => println!(
            "linux guest on {model} (fmt{fmt}): {n} checks passed in {:.1} s",
            run.took.as_secs_f64()
        ),
        Err(e) => panic!(
            "linux guest on {model} (fmt{fmt}) failed: {e}\n(vmm exit status {:?} after {:.1} s)\n--- console ---\n{}\n--- vmm stderr ---\n{}",
            run.status,
            run.took.as_secs_f64(),
            run.stdout,
            run.stderr
        ),
    }
}

#[test]
fn linux_core2() {
    boot_model("core2", "Core2 events");
}

#[test]
fn linux_nehalem() {
    boot_model("nehalem", "Nehalem events");
}

#[test]
fn linux_haswell() {
    boot_model("haswell", "Haswell events");
}

#[test]
fn linux_skylake() {
    boot_model("skylake", "Skylake events");
}

#[test]
fn linux_icelake_server() {
    boot_model("icelake-server", "Icelake events");
}

#[test]
fn linux_sapphire_rapids() {
    boot_model("sapphire-rapids", "Sapphire Rapids events");
}

const GOOD: &str = "\
[    0.051234] Performance Events: PEBS fmt3+, Skylake events, 32-deep LBR, full-width counters, Intel PMU driver.
[    8.000000] PASS pebs_format: driver found fmt3, want fmt3
[    8.100000] vpmu_selftest: pmi: count 1
[    8.200000] PASS pmi_samples: 40 samples, want >= 20
[    8.300000] 2 passed, 0 failed
";

#[test]
fn console_check_accepts_a_clean_run() {
    assert_eq!(check_console(GOOD, 3, true, "Skylake events"), Ok(2));
    assert_eq!(
        check_console(&GOOD.replace('\n', "\r\n"), 3, true, "Skylake events"),
        Ok(2)
    );
}

#[test]
fn console_check_rejects_bad_runs() {
    // Wrong format or model table.
    assert!(check_console(GOOD, 2, true, "Skylake events").is_err());
    assert!(check_console(GOOD, 3, true, "Haswell events").is_err());
    // PEBS missing from the perf line (X86_FEATURE_PEBS not set).
    let no_pebs = GOOD.replace("PEBS fmt3+, ", "");
    assert!(check_console(&no_pebs, 3, true, "Skylake events").is_err());
    // A failure, a count mismatch, no summary, a kernel warning.
    let fail = GOOD.replace("PASS pmi_samples", "FAIL pmi_samples");
    assert!(check_console(&fail, 3, true, "Skylake events").is_err());
    let short = GOOD.replace("2 passed", "3 passed");
    assert!(check_console(&short, 3, true, "Skylake events").is_err());
    let unfinished = GOOD.replace("2 passed, 0 failed", "");
    assert!(check_console(&unfinished, 3, true, "Skylake events").is_err());
    let warn = format!("{GOOD}[    9.0] WARNING: CPU: 0 PID: 1 at arch/x86/events/intel/ds.c\n");
    assert!(check_console(&warn, 3, true, "Skylake events").is_err());
}

#[test]
fn formats_4_to_6_print_as_fmt4() {
    assert_eq!(printed_format(0, true), "PEBS fmt0+");
    assert_eq!(printed_format(3, false), "PEBS fmt3-");
    assert_eq!(printed_format(5, true), "PEBS fmt4+-baseline");
    assert_eq!(
        strip_time("[    8.300000] 2 passed, 0 failed\r"),
        "2 passed, 0 failed"
    );
    assert_eq!(strip_time("no stamp"), "no stamp");
}
