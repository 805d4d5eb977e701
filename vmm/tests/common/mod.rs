//! Running the `vmm` binary from integration tests: one process per guest, both pipes drained
//! on threads so a chatty guest cannot block, killed if it outlives its deadline.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Output of one `vmm run`.
pub struct Run {
    /// Exit status (None if killed by a signal).
    pub status: Option<i32>,
    /// Guest console and VMM stdout.
    pub stdout: String,
    /// VMM diagnostics.
    pub stderr: String,
    /// The harness killed it after `kill_after`.
    pub timed_out: bool,
    /// Wall time.
    pub took: Duration,
}

/// `vmm run --kernel KERNEL --timeout TIMEOUT_SECS ARGS...`, killed after `kill_after`.
pub fn run_vmm(kernel: &Path, timeout_secs: u64, kill_after: Duration, args: &[&str]) -> Run {
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_vmm"))
        .arg("run")
        .arg("--kernel")
        .arg(kernel)
        .args(["--timeout", &timeout_secs.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the vmm binary");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            // A read error just truncates the captured output.
            let _ = r.read_to_end(&mut buf);
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout is piped")));
    let err = drain(Box::new(child.stderr.take().expect("stderr is piped")));
    let mut timed_out = false;
    let status = loop {
        match child.try_wait().expect("wait for the vmm") {
            Some(s) => break s,
            None if start.elapsed() > kill_after => {
                timed_out = true;
                // The process may have exited in between; wait() below reaps it either way.
                let _ = child.kill();
                break child.wait().expect("reap the vmm");
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    Run {
        status: status.code(),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        timed_out,
        took: start.elapsed(),
    }
}
