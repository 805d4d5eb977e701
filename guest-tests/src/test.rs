//! Test registry and runner.
//!
//! A test is `fn() -> TestResult`. [`run_all`] runs each one under a saved context: if it raises
//! an exception nothing expected, the trap handler resumes the runner, which reports
//! `FAIL <test>: unexpected exception #<vec> err=<e> at <rip>`. Each test prints `PASS <name>` or
//! `FAIL <name>: <reason>`; the run ends with `N passed, M failed` and exit code 0 or 1.

use crate::context::{JmpCtx, RetPair, resume, rt_ctx_call};
use crate::fault::Fault;
use crate::idt::TrapFrame;
use crate::racy::Racy;
use crate::{exit, println, user};
use core::fmt;

/// Failure message: a fixed buffer (no allocator), truncated at [`Msg::CAPACITY`] bytes.
#[derive(Clone, Copy)]
pub struct Msg {
    buf: [u8; Msg::CAPACITY],
    len: usize,
}

impl Msg {
    /// Bytes kept of a message.
    pub const CAPACITY: usize = 200;

    /// Format a message.
    pub fn from_fmt(args: fmt::Arguments<'_>) -> Self {
        let mut m = Self {
            buf: [0; Self::CAPACITY],
            len: 0,
        };
        // Truncation is the only "error" and is intended.
        let _ = fmt::Write::write_fmt(&mut m, args);
        m
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        match core::str::from_utf8(&self.buf[..self.len]) {
            Ok(s) => s,
            // Truncation may split a UTF-8 sequence; keep the valid prefix.
            Err(e) => core::str::from_utf8(&self.buf[..e.valid_up_to()]).unwrap_or(""),
        }
    }
}

impl fmt::Write for Msg {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let n = s.len().min(Self::CAPACITY - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

impl fmt::Display for Msg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for Msg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// Result of one test.
pub type TestResult = Result<(), Msg>;

/// A registered test.
#[derive(Clone, Copy)]
pub struct Test {
    /// Name printed in PASS/FAIL lines.
    pub name: &'static str,
    /// The test body.
    pub run: fn() -> TestResult,
}

/// Build a `&[Test]` from test function names: `tests![a, b]`.
#[macro_export]
macro_rules! tests {
    ($($f:ident),* $(,)?) => {
        &[$($crate::test::Test { name: stringify!($f), run: $f }),*]
    };
}

/// Return `Err(Msg)` with a formatted message.
#[macro_export]
macro_rules! fail {
    ($($arg:tt)*) => {
        return Err($crate::test::Msg::from_fmt(format_args!($($arg)*)))
    };
}

/// Fail the test unless `cond` holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            $crate::fail!($($arg)*);
        }
    };
}

/// Fail the test unless `left == right` (values printed in hex).
#[macro_export]
macro_rules! ensure_eq {
    ($left:expr, $right:expr) => {
        $crate::ensure_eq!($left, $right, stringify!($left))
    };
    ($left:expr, $right:expr, $what:expr) => {
        match (&$left, &$right) {
            (l, r) => {
                if l != r {
                    $crate::fail!("{}: got {:#x?}, expected {:#x?}", $what, l, r);
                }
            }
        }
    };
}

static CURRENT: Racy<&'static str> = Racy::new("<boot>");
static RECOVERY_ACTIVE: Racy<bool> = Racy::new(false);
static RECOVERY: Racy<JmpCtx> = Racy::new(JmpCtx::ZERO);
static UNEXPECTED: Racy<Option<Fault>> = Racy::new(None);

/// Name of the running test (for the panic handler).
pub fn current_name() -> &'static str {
    CURRENT.get()
}

struct Slot {
    run: fn() -> TestResult,
    out: Option<TestResult>,
}

extern "C" fn shim(arg: *mut ()) {
    // SAFETY: `run_one` passes a pointer to its live `Slot`.
    let slot = unsafe { &mut *arg.cast::<Slot>() };
    slot.out = Some((slot.run)());
}

enum Outcome {
    Done(TestResult),
    Exception(Fault),
}

fn run_one(t: &Test) -> Outcome {
    let mut slot = Slot {
        run: t.run,
        out: None,
    };
    UNEXPECTED.set(None);
    RECOVERY_ACTIVE.set(true);
    // SAFETY: RECOVERY is a static; `shim` gets a pointer to `slot`, which outlives the call.
    let r = unsafe { rt_ctx_call(RECOVERY.as_ptr(), shim, (&raw mut slot).cast()) };
    RECOVERY_ACTIVE.set(false);
    match (r.a, UNEXPECTED.get(), slot.out) {
        (0, _, Some(res)) => Outcome::Done(res),
        (_, Some(f), _) => Outcome::Exception(f),
        _ => Outcome::Done(Err(Msg::from_fmt(format_args!(
            "test aborted without a result"
        )))),
    }
}

/// Trap-handler hook for an exception nothing expected: abandon the running test.
pub(crate) fn recover(frame: &mut TrapFrame, fault: Fault) -> bool {
    if !RECOVERY_ACTIVE.get() {
        return false;
    }
    RECOVERY_ACTIVE.set(false);
    user::reset();
    UNEXPECTED.set(Some(fault));
    resume(frame, &RECOVERY.get(), RetPair { a: 1, b: 0 });
    true
}

/// Run every test, print the summary line and exit (0 if all passed, else 1).
pub fn run_all(suite: &str, tests: &[Test]) -> ! {
    println!("== {}: {} tests", suite, tests.len());
    let (mut passed, mut failed) = (0u32, 0u32);
    for t in tests {
        CURRENT.set(t.name);
        match run_one(t) {
            Outcome::Done(Ok(())) => {
                passed += 1;
                println!("PASS {}", t.name);
            }
            Outcome::Done(Err(m)) => {
                failed += 1;
                println!("FAIL {}: {}", t.name, m);
            }
            Outcome::Exception(f) => {
                failed += 1;
                println!(
                    "FAIL {}: unexpected exception #{} err={:#x} at {:#x}",
                    t.name, f.vector, f.error, f.rip
                );
            }
        }
    }
    CURRENT.set("<summary>");
    println!("{passed} passed, {failed} failed");
    exit::exit(u32::from(failed != 0))
}
