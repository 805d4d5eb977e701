//! Expected faults: an exception table (like Linux's `__ex_table`) maps the address of an
//! instruction that may fault to a resume address. The trap handler looks the faulting RIP up,
//! records the fault, puts `FAULT_FLAG | vector` in R11 and resumes there.
//!
//! Entries are emitted next to the instruction with [`extable!`]; the linker script collects the
//! `.rt_extable` section between `__rt_extable_start` and `__rt_extable_end`.

use crate::idt::TrapFrame;
use crate::racy::Racy;
use core::arch::asm;

/// Set in R11 by the fixup path; the low byte is the vector.
pub const FAULT_FLAG: u64 = 1 << 63;

/// Vector of #UD.
pub const VEC_UD: u8 = 6;
/// Vector of #GP.
pub const VEC_GP: u8 = 13;
/// Vector of #PF.
pub const VEC_PF: u8 = 14;
/// Vector of #DE.
pub const VEC_DE: u8 = 0;

/// An exception as the handler saw it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Fault {
    /// Exception vector.
    pub vector: u8,
    /// Error code (0 for vectors without one).
    pub error: u64,
    /// RIP pushed by the CPU (the instruction for faults, the next one for traps).
    pub rip: u64,
    /// CS pushed by the CPU.
    pub cs: u64,
}

/// One exception-table entry: `insn` is the RIP the CPU pushes (the instruction's own address for
/// faults, the address after it for traps such as int3), `fixup` where to resume.
#[repr(C)]
#[derive(Clone, Copy)]
struct Entry {
    insn: u64,
    fixup: u64,
}

/// Emit an exception-table entry (assembly text) for asm!: `extable!("2b", "3b")`.
#[macro_export]
macro_rules! extable {
    ($insn:literal, $fixup:literal) => {
        concat!(
            ".pushsection .rt_extable, \"a\"\n.balign 8\n.quad ",
            $insn,
            "\n.quad ",
            $fixup,
            "\n.popsection"
        )
    };
}

static LAST: Racy<Option<Fault>> = Racy::new(None);

unsafe extern "C" {
    static __rt_extable_start: u8;
    static __rt_extable_end: u8;
}

fn table() -> &'static [Entry] {
    let start = (&raw const __rt_extable_start).cast::<Entry>();
    let end = (&raw const __rt_extable_end).cast::<Entry>();
    let len = (end as usize - start as usize) / core::mem::size_of::<Entry>();
    // SAFETY: the linker script places only 8-aligned 16-byte entries between the two symbols.
    unsafe { core::slice::from_raw_parts(start, len) }
}

/// The last fault fixed up through the exception table (cleared by [`take_last`]).
pub fn take_last() -> Option<Fault> {
    let f = LAST.get();
    LAST.set(None);
    f
}

/// Trap-handler hook: if the faulting RIP has a table entry (CPL0 only), record the fault,
/// redirect to the fixup and return true.
pub(crate) fn fixup(frame: &mut TrapFrame, fault: Fault) -> bool {
    if frame.cs & 3 != 0 {
        return false;
    }
    let Some(e) = table().iter().find(|e| e.insn == frame.rip) else {
        return false;
    };
    LAST.set(Some(fault));
    frame.rip = e.fixup;
    frame.r11 = FAULT_FLAG | u64::from(fault.vector);
    true
}

/// Turn an R11 status from a fixed-up sequence into `Err(vector)`.
pub fn status_to_result(status: u64) -> Result<(), u8> {
    if status & FAULT_FLAG != 0 {
        Err(status.to_le_bytes()[0])
    } else {
        Ok(())
    }
}

/// Execute `ud2` under an exception-table entry. Returns the address of the ud2 and the fault
/// (None if no #UD arrived, which would be a bug).
pub fn probe_ud2() -> (u64, Option<Fault>) {
    let addr: u64;
    let status: u64;
    take_last();
    // SAFETY: ud2 only raises #UD; the extable entry resumes at 3: with R11 set.
    unsafe {
        asm!(
            "lea {a}, [rip + 2f]",
            "2: ud2",
            "3:",
            crate::extable!("2b", "3b"),
            a = out(reg) addr, inout("r11") 0u64 => status,
            options(nostack),
        )
    }
    (addr, status_to_result(status).err().and(take_last()))
}
