//! Running a workload at CPL3 (natively on this host, unlike CPL0 code, which is emulated).
//!
//! [`run_user`] IRETQs to the function at CPL3 (IF=1, IOPL=0) on a dedicated user stack whose
//! return address is a `ud2`. The #UD from CPL3 makes the trap handler resume the saved kernel
//! context with the user's RAX as the result; any other exception at CPL3 ends the run with
//! `Err(fault)`.

use crate::context::{JmpCtx, RetPair, resume, rt_enter_user, rt_user_exit};
use crate::fault::{Fault, VEC_UD};
use crate::idt::{TrapFrame, is_ud2_at};
use crate::racy::Racy;

const USER_STACK_SIZE: usize = 64 * 1024;

#[repr(C, align(16))]
struct Stack([u8; USER_STACK_SIZE]);

static USER_STACK: Racy<Stack> = Racy::new(Stack([0; USER_STACK_SIZE]));
static ACTIVE: Racy<bool> = Racy::new(false);
static CTX: Racy<JmpCtx> = Racy::new(JmpCtx::ZERO);
static FAULT: Racy<Option<Fault>> = Racy::new(None);

/// Status values carried in RDX from the handler to `run_user_at`.
const STATUS_OK: u64 = 0;
const STATUS_FAULT: u64 = 1;

/// Run `f(arg)` at CPL3; `Ok(rax)` when it returns (or executes `ud2`), `Err` on any other
/// exception at CPL3.
pub fn run_user(f: extern "C" fn(u64) -> u64, arg: u64) -> Result<u64, Fault> {
    run_user_at(f as usize as u64, arg)
}

/// Run the code at `entry` at CPL3 with RDI = `arg` until it executes `ud2` (or returns, which
/// lands on a `ud2`); the result is the RAX it had then.
pub fn run_user_at(entry: u64, arg: u64) -> Result<u64, Fault> {
    let top = USER_STACK.as_ptr() as u64 + USER_STACK_SIZE as u64;
    // At function entry RSP is 8 mod 16, pointing at the return address.
    let rsp = top - 8;
    // SAFETY: `rsp` is inside the user stack, 8-aligned; nothing else uses the stack now.
    unsafe { (rsp as *mut u64).write((&raw const rt_user_exit) as u64) };
    FAULT.set(None);
    ACTIVE.set(true);
    // SAFETY: CTX is a static the handler reads only while ACTIVE; entry/rsp are mapped with U/S.
    let r = unsafe { rt_enter_user(CTX.as_ptr(), entry, rsp, arg) };
    ACTIVE.set(false);
    match (r.b, FAULT.get()) {
        (STATUS_OK, _) => Ok(r.a),
        (_, Some(f)) => Err(f),
        (_, None) => Err(Fault::default()),
    }
}

/// Trap-handler hook for exceptions at CPL3: ends the user run if one is active.
pub(crate) fn on_user_exception(frame: &mut TrapFrame, fault: Fault) -> bool {
    if !ACTIVE.get() {
        return false;
    }
    ACTIVE.set(false);
    let ret = if fault.vector == VEC_UD && is_ud2_at(frame.rip) {
        RetPair {
            a: frame.rax,
            b: STATUS_OK,
        }
    } else {
        FAULT.set(Some(fault));
        RetPair {
            a: 0,
            b: STATUS_FAULT,
        }
    };
    resume(frame, &CTX.get(), ret);
    true
}

/// Forget an interrupted user run (after a test was aborted by an unexpected exception).
pub(crate) fn reset() {
    ACTIVE.set(false);
}
