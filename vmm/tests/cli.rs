//! Bad input from the user: one clear line naming the problem and the fix, exit status 1, no
//! panic, for every mistake a newcomer is likely to make.

use std::process::{Command, Output};

fn vmm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vmm"))
        .args(args)
        .output()
        .expect("run the vmm binary")
}

fn assert_user_error(args: &[&str], needles: &[&str]) {
    let out = vmm(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: {err:?} lacks {n:?}");
    }
}

#[test]
fn missing_kernel_file() {
    assert_user_error(
        &["run", "--kernel", "/nonexistent/kernel"],
        &["/nonexistent/kernel", "--kernel"],
    );
}

#[test]
fn unrecognised_kernel_format() {
    let path = std::env::temp_dir().join(format!("vmm-garbage-{}", std::process::id()));
    std::fs::write(&path, vec![0x5au8; 4096]).expect("write temp file");
    let p = path.to_str().expect("utf-8 temp path");
    assert_user_error(&["run", "--kernel", p], &["ELF", "multiboot", "bzImage"]);
    let _ = std::fs::remove_file(&path);
}

#[test]
fn memory_sizes_that_do_not_fit() {
    assert_user_error(
        &["run", "--kernel", "k", "--mem", "1M"],
        &["--mem", "too small"],
    );
    assert_user_error(
        &["run", "--kernel", "k", "--mem", "12Q"],
        &["--mem", "256M"],
    );
    assert_user_error(
        &["run", "--kernel", "k", "--mem", "100G"],
        &["--mem", "too large"],
    );
}

#[test]
fn bad_cpu_model_names_the_presets() {
    assert_user_error(
        &["run", "--kernel", "/dev/null", "--cpu-model", "pentium-pro"],
        &["--cpu-model", "skylake", "icelake-server"],
    );
}

#[test]
fn bad_vcpu_count() {
    assert_user_error(
        &["run", "--kernel", "/dev/null", "--vcpus", "0"],
        &["--vcpus"],
    );
}

#[test]
fn replay_of_a_missing_trace() {
    assert_user_error(&["replay", "/nonexistent/trace"], &["/nonexistent/trace"]);
}

#[test]
fn help_explains_the_commands() {
    let out = vmm(&["run", "--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--kernel",
        "--cpu-model",
        "--pmu-backend",
        "--timeout",
        "--trace-msr",
        "--dump-pebs",
    ] {
        assert!(text.contains(flag), "help lacks {flag}");
    }
}
