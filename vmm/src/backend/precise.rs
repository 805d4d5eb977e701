//! The precise counting backend: exact, deterministic counts in software.
//!
//! While at least one enabled guest counter counts an event this backend supports, the vCPU
//! runs under KVM guest-debug single-step; otherwise it runs at full speed. Before each
//! instruction executes, the backend decodes it at RIP (iced-x86) and remembers it as
//! *pending*; at the next single-step exit it retires, and every counter whose event and
//! USR/OS filter match counts it. An overflow is therefore seen on exactly the instruction that
//! causes it, with the registers after it (trap-like PEBS IP), its own IP (eventing IP) and,
//! for memory events, its data linear address.
//!
//! Events and their exact definitions:
//! - instructions retired (C0H, fixed counter 0): every retired instruction; a REP string
//!   instruction retires once, as on hardware;
//! - branch instructions retired (C4H): umask 00H/04H all, 01H conditional, 02H near call,
//!   08H near return, 10H conditional not taken, 20H near taken, 40H far (the Skylake
//!   encodings, used for every architectural model); mispredicted branches (C5H) count 0;
//! - loads / stores retired (MEM_INST_RETIRED.ALL_LOADS/ALL_STORES and the older models'
//!   equivalents): instructions that read / write memory, once per instruction;
//! - unhalted core cycles and reference cycles (3CH, fixed counters 1 and 2): the cost model
//!   below, identical for both (the modelled core runs at the TSC rate).
//!
//! The cost model: an instruction costs 1 cycle, plus 1 if it loads, plus 1 if it stores,
//! plus 1 if it is a taken branch. A load's latency (PEBS load-latency records) comes from a
//! 32 KiB direct-mapped model cache of 64-byte lines: 4 cycles on a hit (data source L1),
//! 60 on a miss (data source DRAM). Both depend only on the instruction stream, so the same
//! guest run twice gives identical counts.
//!
//! A faulting instruction does not retire: when execution does not continue at the
//! instruction's fall-through or branch target, the exception frame at the new RSP tells a
//! fault (saved RIP = the instruction) from an interrupt or trap after it.
//!
//! Block stepping: where the next instructions form a straight-line run of register-only
//! instructions that cannot fault (`Insn::simple`) and interrupts are off, the run executes at
//! full speed up to a hardware breakpoint on the first instruction after it, and retires as a
//! whole (one instruction and one cycle each). A block never runs past a counter's overflow
//! point, so overflows keep their exact instruction and state.
//!
//! Limits: on hosts where guest debug cannot see CPL3 (PVM-based KVM), CPL3 instructions are
//! not counted (a warning says so once), and the CPL0 instructions that run between a return to
//! CPL3 and the next VM exit are missed too. EDGE, INV and CMASK are not evaluated (each
//! instruction is one event).

use std::collections::HashSet;

use vpmu::counter::{CounterId, CounterProgram, Event};
use vpmu::lbr::BranchType;

use super::insn::{BranchKind, Insn};

/// Cycles an instruction costs in the cost model.
pub fn cycles(insn: &Insn, taken: bool) -> u64 {
    1 + u64::from(insn.loads) + u64::from(insn.stores) + u64::from(taken)
}

/// Load latency of an L1 hit / a miss in the model cache.
pub const L1_HIT_LATENCY: u64 = 4;
/// Load latency of a miss.
pub const MISS_LATENCY: u64 = 60;
/// PEBS data-source encodings (Linux `pebs_data_source[]`): L1 hit, and local DRAM.
pub const DSE_L1_HIT: u64 = 0x1;
/// Local DRAM.
pub const DSE_DRAM: u64 = 0x3;
const CACHE_LINES: usize = 512;
const LINE_SHIFT: u32 = 6;

/// The model cache.
#[derive(Debug, Clone)]
pub struct LatencyCache {
    tags: Vec<Option<u64>>,
}

impl Default for LatencyCache {
    fn default() -> Self {
        Self {
            tags: vec![None; CACHE_LINES],
        }
    }
}

impl LatencyCache {
    /// Accesses `addr`; returns (latency, data source).
    pub fn access(&mut self, addr: u64) -> (u64, u64) {
        let line = addr >> LINE_SHIFT;
        let slot = usize::try_from(line % CACHE_LINES as u64).unwrap_or(0);
        if self.tags[slot] == Some(line) {
            (L1_HIT_LATENCY, DSE_L1_HIT)
        } else {
            self.tags[slot] = Some(line);
            (MISS_LATENCY, DSE_DRAM)
        }
    }
}

/// An instruction decoded before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    /// The instruction.
    pub insn: Insn,
    /// CPL it runs at.
    pub cpl: u8,
    /// Data linear address of its memory operand (registers before it ran).
    pub data_addr: Option<u64>,
}

/// A retired instruction and what it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retired {
    /// The instruction, as decoded.
    pub pending: Pending,
    /// Where execution continued.
    pub next_ip: u64,
    /// It was a taken branch.
    pub taken: bool,
    /// Load latency (model cache) if it loaded.
    pub latency: u64,
    /// Data source if it loaded or stored.
    pub data_source: u64,
}

/// How the instruction after `pending` was reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It retired.
    Retired,
    /// It faulted (the exception frame's RIP is the instruction itself).
    Faulted,
}

/// Classifies the step from `p` to `next_ip`; `frame` reads the two quadwords at the new RSP
/// (where an exception frame's RIP sits, with or without an error code) when needed.
pub fn outcome(p: &Pending, next_ip: u64, frame: impl FnOnce() -> Option<[u64; 2]>) -> Outcome {
    let i = &p.insn;
    let normal = next_ip == i.fallthrough()
        || match i.branch {
            BranchKind::None => false,
            // Direct branches can only go to their target; indirect ones anywhere.
            _ => i.target.is_none_or(|t| t == next_ip),
        };
    if normal {
        return Outcome::Retired;
    }
    match frame() {
        Some(q) if q.contains(&i.ip) => Outcome::Faulted,
        _ => Outcome::Retired,
    }
}

/// Statistics for the end-of-run report and the benchmark.
#[derive(Debug, Default, Clone, Copy)]
pub struct PreciseStats {
    /// Single-step exits handled.
    pub steps: u64,
    /// Instructions retired while stepping.
    pub retired: u64,
    /// Instructions that faulted while stepping.
    pub faulted: u64,
    /// RDPMCs emulated by the decoder.
    pub rdpmc: u64,
    /// Straight-line blocks run between breakpoints instead of stepped.
    pub blocks: u64,
    /// Core cycles of the cost model since the backend started (the LBR cycle timestamps).
    pub cycles: u64,
    /// Taken branches handed to the LBR stack / BTS.
    pub branches: u64,
}

/// The precise backend's state for one vCPU.
#[derive(Debug, Default)]
pub struct Precise {
    programs: Vec<CounterProgram>,
    /// The instruction about to run.
    pub pending: Option<Pending>,
    cache: LatencyCache,
    warned: HashSet<String>,
    /// Statistics.
    pub stats: PreciseStats,
}

/// The LBR/BTS branch type of a taken branch, from the decoder's class and whether it was
/// direct (has a decoded target).
pub fn branch_type(insn: &Insn) -> Option<BranchType> {
    let direct = insn.target.is_some();
    Some(match insn.branch {
        BranchKind::None => return None,
        BranchKind::Conditional => BranchType::Conditional,
        BranchKind::Jump if direct => BranchType::NearRelJmp,
        BranchKind::Jump => BranchType::NearIndJmp,
        BranchKind::NearCall if direct => BranchType::NearRelCall,
        BranchKind::NearCall => BranchType::NearIndCall,
        BranchKind::NearReturn => BranchType::NearRet,
        BranchKind::Far => BranchType::Far,
    })
}

/// Whether `event` advances on a simple (register-only, non-branch) instruction: those are the
/// counters a straight-line block must not run past.
pub fn counts_simple(event: &Event) -> bool {
    matches!(
        event,
        Event::InstructionsRetired | Event::CoreCycles | Event::RefCycles
    )
}

/// Whether the precise backend can count `event`.
pub fn supports(event: &Event) -> bool {
    matches!(
        event,
        Event::InstructionsRetired
            | Event::BranchesRetired { .. }
            | Event::BranchMisses
            | Event::LoadsRetired
            | Event::StoresRetired
            | Event::CoreCycles
            | Event::RefCycles
    )
}

const BR_CONDITIONAL: u8 = 0x01;
const BR_NEAR_CALL: u8 = 0x02;
const BR_ALL_PEBS: u8 = 0x04;
const BR_NEAR_RETURN: u8 = 0x08;
const BR_NOT_TAKEN: u8 = 0x10;
const BR_NEAR_TAKEN: u8 = 0x20;
const BR_FAR: u8 = 0x40;

/// Whether a branch of `kind` (taken or not) is counted by BR_INST_RETIRED with `umask`.
pub fn branch_matches(umask: u8, kind: BranchKind, taken: bool) -> bool {
    if kind == BranchKind::None {
        return false;
    }
    if umask == 0 || umask & BR_ALL_PEBS != 0 {
        return true;
    }
    let near = kind != BranchKind::Far;
    (umask & BR_CONDITIONAL != 0 && kind == BranchKind::Conditional)
        || (umask & BR_NEAR_CALL != 0 && kind == BranchKind::NearCall)
        || (umask & BR_NEAR_RETURN != 0 && kind == BranchKind::NearReturn)
        || (umask & BR_NOT_TAKEN != 0 && kind == BranchKind::Conditional && !taken)
        || (umask & BR_NEAR_TAKEN != 0 && near && taken)
        || (umask & BR_FAR != 0 && !near)
}

impl Precise {
    /// Replaces what is counted; returns one warning per newly seen unsupported event.
    pub fn set_programs(&mut self, programs: Vec<CounterProgram>) -> Vec<String> {
        let mut warnings = Vec::new();
        for p in &programs {
            if !supports(&p.event) {
                let name = format!("{:?}", p.event);
                if self.warned.insert(name.clone()) {
                    warnings.push(format!(
                        "the precise backend cannot count {name} (counter {:?}); it stays at 0",
                        p.id
                    ));
                }
            }
        }
        self.programs = programs;
        warnings
    }

    /// Whether any counter needs single-stepping.
    pub fn wants_stepping(&self) -> bool {
        self.programs
            .iter()
            .any(|p| supports(&p.event) && (p.usr || p.os))
    }

    /// Completes `p` as retired at `next_ip` (updates the model cache).
    pub fn retire(&mut self, p: Pending, next_ip: u64) -> Retired {
        let taken = p.insn.taken(next_ip);
        let (latency, data_source) = match p.data_addr {
            Some(a) if p.insn.loads => self.cache.access(a),
            Some(a) if p.insn.stores => {
                let _ = self.cache.access(a);
                (0, 0)
            }
            _ => (0, 0),
        };
        self.stats.retired += 1;
        self.stats.cycles += cycles(&p.insn, taken);
        Retired {
            pending: p,
            next_ip,
            taken,
            latency,
            data_source,
        }
    }

    /// Events each counter counts for `n` retired simple instructions at `cpl` (a block): one
    /// instruction and one cycle each; nothing else.
    pub fn block_deltas(&mut self, n: u64, cpl: u8) -> Vec<(CounterId, u64)> {
        self.stats.retired += n;
        self.stats.cycles += n;
        self.programs
            .iter()
            .filter(|p| p.counts_at(cpl) && counts_simple(&p.event))
            .map(|p| (p.id, n))
            .collect()
    }

    /// Events each counter counts for one retired instruction.
    pub fn deltas(&self, r: &Retired) -> Vec<(CounterId, u64)> {
        let i = &r.pending.insn;
        self.programs
            .iter()
            .filter(|p| p.counts_at(r.pending.cpl))
            .filter_map(|p| {
                let n = match p.event {
                    Event::InstructionsRetired => 1,
                    Event::BranchesRetired { umask } => {
                        u64::from(branch_matches(umask, i.branch, r.taken))
                    }
                    Event::LoadsRetired => u64::from(i.loads),
                    Event::StoresRetired => u64::from(i.stores),
                    Event::CoreCycles | Event::RefCycles => cycles(i, r.taken),
                    _ => 0,
                };
                (n > 0).then_some((p.id, n))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::insn::decode;
    use super::*;
    use vpmu::counter::CounterProgram;

    fn prog(id: CounterId, event: Event, usr: bool, os: bool) -> CounterProgram {
        CounterProgram::plain(id, event, usr, os, 1 << 40)
    }

    fn pending(bytes: &[u8], cpl: u8) -> Pending {
        let insn = decode(0x1000, bytes, 64).unwrap();
        Pending {
            insn,
            cpl,
            data_addr: Some(0x8000),
        }
    }

    #[test]
    fn counts_by_event_and_privilege() {
        let mut p = Precise::default();
        let w = p.set_programs(vec![
            prog(CounterId::Gp(0), Event::InstructionsRetired, false, true),
            prog(CounterId::Gp(1), Event::LoadsRetired, true, true),
            prog(CounterId::Gp(2), Event::StoresRetired, true, true),
            prog(CounterId::Fixed(1), Event::CoreCycles, true, true),
            prog(
                CounterId::Gp(3),
                Event::Other {
                    event: 0x2e,
                    umask: 0x41,
                },
                true,
                true,
            ),
        ]);
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("Other"));
        assert!(p.set_programs(p.programs.clone()).is_empty(), "warned once");
        assert!(p.wants_stepping());
        // mov rax, [rbx] at CPL0.
        let r = p.retire(pending(&[0x48, 0x8b, 0x03], 0), 0x1003);
        assert_eq!(
            p.deltas(&r),
            vec![
                (CounterId::Gp(0), 1),
                (CounterId::Gp(1), 1),
                (CounterId::Fixed(1), 2)
            ]
        );
        assert_eq!((r.latency, r.data_source), (MISS_LATENCY, DSE_DRAM));
        let r = p.retire(pending(&[0x48, 0x8b, 0x03], 3), 0x1003);
        // CPL3: the OS-only counter does not count; the line is now cached.
        assert_eq!(
            p.deltas(&r),
            vec![(CounterId::Gp(1), 1), (CounterId::Fixed(1), 2)]
        );
        assert_eq!((r.latency, r.data_source), (L1_HIT_LATENCY, DSE_L1_HIT));
        let r = p.retire(pending(&[0x48, 0x89, 0x03], 0), 0x1003); // store
        assert_eq!(
            p.deltas(&r),
            vec![
                (CounterId::Gp(0), 1),
                (CounterId::Gp(2), 1),
                (CounterId::Fixed(1), 2)
            ]
        );
    }

    #[test]
    fn block_counts_instructions_and_cycles_only() {
        let mut p = Precise::default();
        p.set_programs(vec![
            prog(CounterId::Gp(0), Event::InstructionsRetired, false, true),
            prog(
                CounterId::Gp(1),
                Event::BranchesRetired { umask: 0 },
                true,
                true,
            ),
            prog(CounterId::Fixed(2), Event::RefCycles, true, true),
        ]);
        assert_eq!(
            p.block_deltas(7, 0),
            vec![(CounterId::Gp(0), 7), (CounterId::Fixed(2), 7)]
        );
        assert_eq!(p.block_deltas(7, 3), vec![(CounterId::Fixed(2), 7)]);
        assert_eq!(p.stats.retired, 14);
    }

    #[test]
    fn branch_types() {
        let t = |b: &[u8]| branch_type(&decode(0x1000, b, 64).unwrap());
        assert_eq!(t(&[0x75, 0x02]), Some(BranchType::Conditional));
        assert_eq!(t(&[0xeb, 0x00]), Some(BranchType::NearRelJmp));
        assert_eq!(t(&[0xff, 0xe0]), Some(BranchType::NearIndJmp)); // jmp rax
        assert_eq!(t(&[0xe8, 0, 0, 0, 0]), Some(BranchType::NearRelCall));
        assert_eq!(t(&[0xff, 0xd0]), Some(BranchType::NearIndCall));
        assert_eq!(t(&[0xc3]), Some(BranchType::NearRet));
        assert_eq!(t(&[0x48, 0xcf]), Some(BranchType::Far));
        assert_eq!(t(&[0x90]), None);
    }

    #[test]
    fn branch_umasks() {
        use BranchKind::*;
        assert!(branch_matches(0, Jump, true));
        assert!(branch_matches(BR_CONDITIONAL, Conditional, false));
        assert!(!branch_matches(BR_CONDITIONAL, Jump, true));
        assert!(branch_matches(BR_NEAR_CALL, NearCall, true));
        assert!(branch_matches(BR_NEAR_RETURN, NearReturn, true));
        assert!(branch_matches(BR_NOT_TAKEN, Conditional, false));
        assert!(!branch_matches(BR_NOT_TAKEN, Conditional, true));
        assert!(branch_matches(BR_NEAR_TAKEN, Conditional, true));
        assert!(!branch_matches(BR_NEAR_TAKEN, Far, true));
        assert!(branch_matches(BR_FAR, Far, true));
        assert!(!branch_matches(0, None, false));
    }

    #[test]
    fn taken_branch_costs_a_cycle() {
        let mut p = Precise::default();
        p.set_programs(vec![
            prog(CounterId::Fixed(1), Event::CoreCycles, true, true),
            prog(
                CounterId::Gp(0),
                Event::BranchesRetired { umask: 0 },
                true,
                true,
            ),
        ]);
        let jne = pending(&[0x75, 0x0e], 0);
        let r = p.retire(jne, 0x1010);
        assert!(r.taken);
        assert_eq!(
            p.deltas(&r),
            vec![(CounterId::Fixed(1), 2), (CounterId::Gp(0), 1)]
        );
        let r = p.retire(jne, 0x1002);
        assert_eq!(
            p.deltas(&r),
            vec![(CounterId::Fixed(1), 1), (CounterId::Gp(0), 1)]
        );
    }

    #[test]
    fn faults_do_not_retire() {
        let mov = pending(&[0x48, 0x8b, 0x03], 0);
        assert_eq!(outcome(&mov, 0x1003, || unreachable!()), Outcome::Retired);
        // #GP with error code: frame [err, rip].
        assert_eq!(
            outcome(&mov, 0x5000, || Some([0, 0x1000])),
            Outcome::Faulted
        );
        // Interrupt after it: frame RIP is the next instruction.
        assert_eq!(
            outcome(&mov, 0x5000, || Some([0x1003, 0x8])),
            Outcome::Retired
        );
        let jne = pending(&[0x75, 0x0e], 0);
        assert_eq!(outcome(&jne, 0x1010, || unreachable!()), Outcome::Retired);
        assert_eq!(
            outcome(&jne, 0x7000, || Some([0, 0x1000])),
            Outcome::Faulted
        );
        let ret = pending(&[0xc3], 0);
        assert_eq!(outcome(&ret, 0x4242, || unreachable!()), Outcome::Retired);
    }
}
